"""mlfs.megatron.import_checkpoint (issue 19, item 3): a Megatron-LM checkpoint in the
legacy per-rank format, written here with torch.save exactly as Megatron lays it out
(latest_checkpointed_iteration.txt, iter_NNNNNNN/mp_rank_TT_PPP/model_optim_rng.pt,
each a dict of "model" (or "model0", "model1", ... with virtual pipeline stages),
"args", "iteration", "checkpoint_version", "optimizer", "opt_param_scheduler",
"rng_state"), tp 2 pp 2, grouped-query attention, random bf16 weights, imported into
mounts of other layouts (tp 1 pp 1, tp 4 pp 2, tp 4 pp 1, tp 1 pp 2). Every partition
of every rank is checked against NumPy slices (test_store.tp_slice) of full tensors
the test generated itself before cutting them into Megatron's shards: the interleaved
QKV per query group, Megatron's padded vocabulary, SwiGLU's [gate_r; up_r] per rank,
stage-local layer numbers."""
import argparse
import enum
import io
import json
import os
import random

import numpy as np
import pytest
import torch

from conftest import run_mlfs
from test_store import check_layout, expand, snapshot

import mlfs
import mlfs.megatron

L, HIDDEN, HEADS, KV, FFN, VOCAB, SEQ = 4, 64, 8, 4, 96, 100, 32
D = HIDDEN // HEADS
ITERATION = 1234


class AttnBackend(enum.Enum):
    """Stands for Megatron's enums in "args": a class the loader does not know."""
    auto = 5


class Evil:
    """A pickle that would run a command when loaded without an allowlist."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def bits(t):
    """A bf16 tensor as the <u2 array mlfs stores (and np.load reads)."""
    return t.contiguous().view(torch.int16).numpy().view("<u2")


def schema_for(kind):
    args = ["--layers", L, "--hidden", HIDDEN, "--heads", HEADS, "--kv-heads", KV,
            "--ffn", FFN, "--vocab", VOCAB, "--dtype", "bfloat16"]
    if kind == "llama":
        args += ["--tied"]
    else:
        args += ["--seq", SEQ]
    return json.loads(run_mlfs("schema", kind, *args).stdout)


class Model:
    """A model's full tensors, generated as the truth: `schema` {schema name: bf16
    tensor} in the schema's layout, and `megatron` {(name, kind): full tensor as
    Megatron holds it unsplit} with how Megatron splits it over TP."""

    def __init__(self, kind, tp_src, seed):
        g = torch.Generator().manual_seed(seed)
        self.kind = kind

        def rnd(*shape):
            return torch.randn(*shape, generator=g).to(torch.bfloat16)
        gpt = kind == "megatron-gpt"
        vp = -(-VOCAB // (128 * tp_src)) * 128 * tp_src  # Megatron's padded vocabulary
        self.schema, self.megatron = {}, {}
        emb = rnd(vp, HIDDEN)  # padding rows random too: Megatron trains them
        self.put("embedding/word_embeddings/weight", emb[:VOCAB], "embedding.word_embeddings.weight",
                 emb, "vocab")
        if gpt:
            pos = rnd(SEQ, HIDDEN)
            self.put("embedding/position_embeddings/weight", pos,
                     "embedding.position_embeddings.weight", pos, "rep")
        for i in range(L):
            pre = f"layers/{i}/"
            names = ["weight", "bias"] if gpt else ["weight"]
            for n in names:
                x = rnd(HIDDEN)
                self.put(pre + "input_layernorm/" + n, x, (i, "input_layernorm." + n), x, "rep")
            per = HEADS // KV * D
            q, k, v = rnd(HEADS * D, HIDDEN), rnd(KV * D, HIDDEN), rnd(KV * D, HIDDEN)
            inter = torch.cat([torch.cat([q[j * per:(j + 1) * per], k[j * D:(j + 1) * D],
                                          v[j * D:(j + 1) * D]]) for j in range(KV)])
            self.put(pre + "self_attention/query_key_value/weight",
                     inter if gpt else torch.cat([q, k, v]),
                     (i, "self_attention.linear_qkv.weight"), inter, "col")
            if gpt:
                b = rnd(inter.shape[0])
                self.put(pre + "self_attention/query_key_value/bias", b,
                         (i, "self_attention.linear_qkv.bias"), b, "col")
            w = rnd(HIDDEN, HEADS * D)
            self.put(pre + "self_attention/dense/weight", w,
                     (i, "self_attention.linear_proj.weight"), w, "row")
            if gpt:
                b = rnd(HIDDEN)
                self.put(pre + "self_attention/dense/bias", b,
                         (i, "self_attention.linear_proj.bias"), b, "rep")
            for n in names:
                x = rnd(HIDDEN)
                self.put(pre + "post_attention_layernorm/" + n, x,
                         (i, "pre_mlp_layernorm." + n), x, "rep")
            if gpt:
                w, b = rnd(FFN, HIDDEN), rnd(FFN)
                self.put(pre + "mlp/dense_h_to_4h/weight", w, (i, "mlp.linear_fc1.weight"), w,
                         "col")
                self.put(pre + "mlp/dense_h_to_4h/bias", b, (i, "mlp.linear_fc1.bias"), b, "col")
            else:
                gate, up = rnd(FFN, HIDDEN), rnd(FFN, HIDDEN)
                self.put(pre + "mlp/dense_h_to_4h/weight", torch.cat([gate, up]),
                         (i, "mlp.linear_fc1.weight"), (gate, up), "swiglu")
            w = rnd(HIDDEN, FFN)
            self.put(pre + "mlp/dense_4h_to_h/weight", w, (i, "mlp.linear_fc2.weight"), w, "row")
            if gpt:
                b = rnd(HIDDEN)
                self.put(pre + "mlp/dense_4h_to_h/bias", b, (i, "mlp.linear_fc2.bias"), b, "rep")
        for n in (["weight", "bias"] if gpt else ["weight"]):
            x = rnd(HIDDEN)
            self.put("final_layernorm/" + n, x, "decoder.final_layernorm." + n, x, "rep")
        if gpt:
            out = rnd(vp, HIDDEN)
            self.put("output_layer/weight", out[:VOCAB], "output_layer.weight", out, "vocab")
        else:  # tied: the last stage holds a copy of the embedding (pp > 1)
            self.megatron[("output_layer.weight", "vocab")] = emb

    def put(self, name, full, mkey, mfull, split):
        self.schema[name] = full
        self.megatron[(mkey, split)] = mfull


def shard(full, split, tp, t):
    """Megatron's TP rank t's part of a full tensor."""
    if split == "rep":
        return full.clone()
    if split == "row":
        return full.chunk(tp, 1)[t].clone()
    if split == "swiglu":
        gate, up = full
        return torch.cat([gate.chunk(tp)[t], up.chunk(tp)[t]])
    return full.chunk(tp, 0)[t].clone()  # col, vocab (padded)


def stage_dicts(model, tp, pp, vpp, spec):
    """{(t, p): [state dict of each model chunk]} as Megatron's ranks hold them: layer
    numbers local to the chunk; the embedding on the first stage, the final norm and
    output layer on the last. Chunk v of stage p holds global chunk v * pp + p."""
    nchunks = pp * vpp
    per = L // nchunks
    out = {}
    for t in range(tp):
        for p in range(pp):
            chunks = []
            for v in range(vpp):
                c = v * pp + p
                sd = {}
                for (key, split), full in model.megatron.items():
                    if isinstance(key, tuple):
                        i, rest = key
                        if not c * per <= i < (c + 1) * per:
                            continue
                        if spec == "te":
                            rest = {"input_layernorm.weight":
                                    "self_attention.linear_qkv.layer_norm_weight",
                                    "input_layernorm.bias":
                                    "self_attention.linear_qkv.layer_norm_bias",
                                    "pre_mlp_layernorm.weight":
                                    "mlp.linear_fc1.layer_norm_weight",
                                    "pre_mlp_layernorm.bias":
                                    "mlp.linear_fc1.layer_norm_bias"}.get(rest, rest)
                        name = f"decoder.layers.{i - c * per}.{rest}"
                    else:
                        name = key
                        first = key.startswith("embedding.")
                        if first and c != 0 or not first and c != nchunks - 1:
                            continue
                    sd[name] = shard(full, split, tp, t)
                if spec == "te":  # Transformer Engine's extra state: no weights
                    for i in range(per):
                        sd[f"decoder.layers.{i}.self_attention.linear_qkv._extra_state"] = \
                            io.BytesIO(b"fp8 meta")
                        sd[f"decoder.layers.{i}.self_attention.core_attention._extra_state"] = None
                if spec == "legacy":
                    sd = legacy(sd)
                chunks.append(sd)
            out[(t, p)] = chunks
    return out


def legacy(sd):
    """Megatron-Core names as legacy Megatron-LM's nested "language_model" dict."""
    ren = {"linear_qkv": "query_key_value", "linear_proj": "dense",
           "pre_mlp_layernorm": "post_attention_layernorm", "linear_fc1": "dense_h_to_4h",
           "linear_fc2": "dense_4h_to_h"}
    lm = {}
    for k, v in sd.items():
        if k.startswith("decoder.layers."):
            rest = k[len("decoder."):]
            for a, b in ren.items():
                rest = rest.replace(a, b)
            lm.setdefault("encoder", {})[rest] = v
        elif k.startswith("decoder.final_layernorm."):
            lm.setdefault("encoder", {})[k[len("decoder."):]] = v
        elif k.startswith("embedding."):
            _, mod, w = k.split(".")
            lm.setdefault("embedding", {}).setdefault(mod, {})[w] = v
        else:
            lm.setdefault("output_layer", {})["weight"] = v
    return {"language_model": lm}


def write_checkpoint(root, model, tp, pp, vpp=1, spec="local", extra_args=None):
    """A Megatron save directory, as megatron/training/checkpointing.py writes it."""
    it_dir = root / f"iter_{ITERATION:07d}"
    gpt = model.kind == "megatron-gpt"
    args = argparse.Namespace(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None, num_layers=L,
        hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=KV,
        group_query_attention=True, ffn_hidden_size=FFN, kv_channels=D,
        padded_vocab_size=model.megatron[("embedding.word_embeddings.weight", "vocab")].shape[0],
        make_vocab_size_divisible_by=128, seq_length=SEQ, max_position_embeddings=SEQ,
        params_dtype=torch.bfloat16, bf16=True, swiglu=not gpt,
        untie_embeddings_and_output_weights=gpt, normalization="LayerNorm" if gpt else "RMSNorm",
        position_embedding_type="learned_absolute" if gpt else "rope",
        attention_backend=AttnBackend.auto, iteration=ITERATION, **(extra_args or {}))
    for (t, p), chunks in stage_dicts(model, tp, pp, vpp, spec).items():
        d = it_dir / (f"mp_rank_{t:02d}" if pp == 1 else f"mp_rank_{t:02d}_{p:03d}")
        d.mkdir(parents=True)
        ck = {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION,
              "num_floating_point_operations_so_far": 1.5e15}
        if vpp == 1:
            ck["model"] = chunks[0]
        else:
            for v, sd in enumerate(chunks):
                ck[f"model{v}"] = sd
        ck["optimizer"] = optimizer(chunks)
        ck["opt_param_scheduler"] = {"max_lr": 1e-4, "num_steps": ITERATION * 8}
        ck["rng_state"] = [{"random_rng_state": random.getstate(),
                            "np_rng_state": np.random.get_state(),
                            "torch_rng_state": torch.get_rng_state(),
                            "cuda_rng_state": torch.get_rng_state(),
                            "rng_tracker_states": {"model-parallel-rng": torch.get_rng_state()}}]
        torch.save(ck, d / "model_optim_rng.pt")
    (root / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))
    return root


def optimizer(chunks):
    """Megatron's non-distributed optimizer of a rank holding @chunks: its parameters,
    in the state dict's order, in two param groups (weight decay, then none: biases and
    1-D tensors), Adam's moments zero and one (test_megatron_optim.py tests real ones)."""
    def flat(tree, pre=""):
        for k, v in tree.items():
            if isinstance(v, dict):
                yield from flat(v, f"{pre}{k}.")
            elif isinstance(v, torch.Tensor):
                yield pre + k, v
    params = [kv for sd in chunks for kv in flat(sd)]
    groups = [[x for k, x in params if not (k.endswith(".bias") or x.dim() == 1)],
              [x for k, x in params if k.endswith(".bias") or x.dim() == 1]]
    state, param_groups, i = {}, [], 0
    for wd, xs in zip((1.0, 0.0), groups):
        param_groups.append({"lr": 1e-4, "wd_mult": wd, "params": list(range(i, i + len(xs)))})
        for x in xs:
            state[i] = {"exp_avg": torch.zeros(x.shape), "exp_avg_sq": torch.ones(x.shape)}
            i += 1
    return {"optimizer": {"state": state, "param_groups": param_groups},
            "fp32_from_fp16_params": [[x.float() for x in xs] for xs in groups]}


def full_of(schema, model):
    """{(state, name): NumPy array} of every non-tied tensor: the model's weights, and
    the optimizer's states as optimizer() writes them (exp_avg zero, exp_avg_sq one)."""
    full = {}
    for state in schema["states"]:
        for name, spec, _ in expand(schema):
            if "tied" in spec:
                continue
            if state == "model":
                full[(state, name)] = bits(model.schema[name])
            else:
                fill = np.ones if state == "optim/exp_avg_sq" else np.zeros
                full[(state, name)] = fill(spec["shape"], np.float32)
    return full


CASES = [  # schema, Megatron's names, its tp pp vpp, the mount's tp pp dp
    ("megatron-gpt", "local", (2, 2, 1), (1, 1, 1)),
    ("megatron-gpt", "local", (2, 2, 1), (4, 2, 1)),
    ("llama", "te", (2, 2, 2), (4, 1, 2)),
    ("megatron-gpt", "legacy", (2, 1, 1), (1, 2, 2)),
]


@pytest.mark.parametrize("kind,spec,src,dst", CASES,
                         ids=[f"{k}-{s}-tp{a[0]}pp{a[1]}vpp{a[2]}-to-tp{b[0]}pp{b[1]}dp{b[2]}"
                              for k, s, a, b in CASES])
def test_import_into_another_layout(mount, tmp_path, kind, spec, src, dst):
    schema = schema_for(kind)
    model = Model(kind, src[0], seed=sum(src) * 10 + sum(dst))
    ckpt = write_checkpoint(tmp_path / "ckpt", model, *src, spec=spec)
    mnt = mlfs.Mount(mount.path)
    cfg = {"version": 1, "tp": dst[0], "pp": dst[1], "dp": dst[2], "nodes": ["n0"]}
    mnt.set_up(schema, cfg)
    got = mlfs.megatron.import_checkpoint(mnt, ckpt, tmpdir=tmp_path)
    assert got == {"iteration": ITERATION, "tp": src[0], "pp": src[1], "vpp": src[2],
                   "layers": L, "tensors": len(full_of(schema, model)) // len(schema["states"]),
                   "step": ITERATION, "optimizer": "local",
                   "states": ["model", "optim/exp_avg", "optim/exp_avg_sq"]}
    check_layout(mount, schema, cfg, full_of(schema, model), step=ITERATION)
    emb = mnt.rank(0).load("model", "embedding/word_embeddings/weight")
    assert emb.dtype == torch.bfloat16  # bf16 stayed bf16
    assert [p for p in os.listdir(tmp_path) if p.startswith("mlfs-megatron-")] == []


def test_loads_without_running_the_pickle(mount, tmp_path):
    """weights_only=True (the default) runs no code of the checkpoint: an object whose
    pickle calls os.system, in "args", stays an inert placeholder, and the import
    works; an iteration picked by hand and step= are honoured."""
    schema = schema_for("megatron-gpt")
    model = Model("megatron-gpt", 2, seed=3)
    flag = tmp_path / "ran"
    ckpt = write_checkpoint(tmp_path / "ckpt", model, 2, 1, extra_args={"hook": Evil(flag)})
    (ckpt / "latest_checkpointed_iteration.txt").write_text("999")  # ignored: iteration=
    ck = mlfs.megatron.load_rank_file(str(ckpt / f"iter_{ITERATION:07d}" / "mp_rank_01" /
                                          "model_optim_rng.pt"))
    assert isinstance(ck["args"].hook, mlfs.megatron.Opaque)
    assert ck["args"].hook._name in ("posix.system", "os.system")
    assert isinstance(ck["args"].attention_backend, mlfs.megatron.Opaque)
    assert ck["args"].params_dtype is torch.bfloat16 and ck["iteration"] == ITERATION
    assert not flag.exists()
    mnt = mlfs.Mount(mount.path)
    cfg = {"version": 1, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]}
    mnt.set_up(schema, cfg)
    got = mlfs.megatron.import_checkpoint(mnt, ckpt, iteration=ITERATION, step=7)
    assert got["step"] == 7 and not flag.exists()
    check_layout(mount, schema, cfg, full_of(schema, model), step=7)
    # the pickle does run with weights_only=False (plain torch.load): hence the default
    mlfs.megatron.load_rank_file(str(ckpt / f"iter_{ITERATION:07d}" / "mp_rank_00" /
                                     "model_optim_rng.pt"), weights_only=False)
    assert flag.exists()


def test_refusals_change_nothing(mount_factory, tmp_path):
    """A checkpoint that does not fit the schema (another number of layers, a missing
    rank directory, TP copies of a replicated tensor that disagree, an fp32 tensor into
    the bf16 schema) is refused naming why, and no partition changes; cast=True
    converts the fp32 tensor."""
    schema = schema_for("megatron-gpt")
    cfg = {"version": 1, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"]}
    model = Model("megatron-gpt", 2, seed=4)
    ckpt = write_checkpoint(tmp_path / "ckpt", model, 2, 2)

    deeper = mount_factory(name="deeper")
    mlfs.Mount(deeper.path).set_up(dict(schema, num_layers=8), cfg)
    with pytest.raises(mlfs.MlfsError, match="4 layers in the checkpoint, 8 in the schema"):
        mlfs.megatron.import_checkpoint(deeper.path, ckpt)

    m = mount_factory()
    mnt = mlfs.Mount(m.path)
    mnt.set_up(schema, cfg)
    before = snapshot(m)
    rank_dir = ckpt / f"iter_{ITERATION:07d}" / "mp_rank_01_001"
    os.rename(rank_dir, tmp_path / "away")
    with pytest.raises(mlfs.MlfsError, match=r"missing \['mp_rank_01_001'\]"):
        mlfs.megatron.import_checkpoint(mnt, ckpt)
    os.rename(tmp_path / "away", rank_dir)

    w = "decoder.final_layernorm.weight"  # replicated: each TP rank holds a copy
    for t in (0, 1):
        path = rank_dir.parent / f"mp_rank_{t:02d}_001" / "model_optim_rng.pt"
        ck = torch.load(path)
        ck["model"][w] = ck["model"][w].float()
        torch.save(ck, path)
        if t == 0:
            with pytest.raises(mlfs.MlfsError, match="final_layernorm/weight: replicated, "
                               "but its TP copies are .*float32.*bfloat16"):
                mlfs.megatron.import_checkpoint(mnt, ckpt)
    with pytest.raises(mlfs.MlfsError,
                       match="final_layernorm/weight is float32, the schema's bfloat16"):
        mlfs.megatron.import_checkpoint(mnt, ckpt)
    assert snapshot(m) == before
    mlfs.megatron.import_checkpoint(mnt, ckpt, cast=True)  # bf16 values in fp32: exact
    check_layout(m, schema, cfg, full_of(schema, model), step=ITERATION)
