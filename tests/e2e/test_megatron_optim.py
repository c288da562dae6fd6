"""Megatron-LM's optimizer states in, and the mount back out as Megatron's files (issue
19, item 3): checkpoints written here as Megatron-LM lays them out (the state dict in
Megatron-Core's module order, linear_proj before linear_qkv; the non-distributed
optimizer's torch state_dict indexed over its param groups with fp32_from_fp16_params;
the distributed optimizer's distrib_optim.pt, a coalesced fp32 buffer per model chunk
holding the parameters in reverse order, each at a multiple of 64 elements, the gaps
filled with NaN so that reading one would show), with random bf16 weights and random
moments and main params, imported into another layout and checked partition by
partition against NumPy slices of the full tensors the test generated. The round trip:
import -> reconfigure -> export at a third tp/pp, whose files are compared tensor by
tensor with the test's own cutting of the full tensors by Megatron's rule, ->
re-import into a fresh mount of a fourth layout, bit-exact."""
import argparse
import os

import numpy as np
import pytest
import torch

from test_megatron_import import (HIDDEN, ITERATION, KV, VOCAB, Model, bits, schema_for,
                                  stage_dicts)
from test_store import check_layout, expand, reconfigure, snapshot

import mlfs
import mlfs.megatron

ORDER = ["input_layernorm.weight", "input_layernorm.bias",
         "self_attention.linear_qkv.layer_norm_weight",
         "self_attention.linear_qkv.layer_norm_bias",
         "self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
         "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
         "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
         "mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.layer_norm_bias",
         "mlp.linear_fc1.weight", "mlp.linear_fc1.bias",
         "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"]
TOP_ORDER = ["embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
             "decoder.final_layernorm.weight", "decoder.final_layernorm.bias",
             "output_layer.weight"]
ROOTS = {"optim/exp_avg": 1, "optim/exp_avg_sq": 2, "optim/main": 3}


def module_order(key):
    """Where Megatron-Core's named_parameters puts @key (TE's fused norm belongs to its
    linear: layer_norm_weight first, as TE's LayerNormLinear registers it)."""
    if key.startswith("decoder.layers."):
        _, _, i, rest = key.split(".", 3)
        return (1, int(i), ORDER.index(rest))
    return (0 if key.startswith("embedding.") else 2, 0, TOP_ORDER.index(key))


def is_param(key, x):
    return isinstance(x, torch.Tensor) and not key.endswith("_extra_state")


def no_decay(key, x):
    return key.endswith(".bias") or x.dim() == 1


def rank_chunks(models, tp, pp, vpp, spec):
    """{root: {(t, p): [state dict per chunk, Megatron's module order]}} for the model
    and each optimizer root (its full tensors from its own Model)."""
    out = {}
    single = pp * vpp == 1  # a tied output layer on the embedding's stage has no weight
    for root, m in models.items():
        dicts = stage_dicts(m, tp, pp, vpp, spec)
        out[root] = {tp_pp: [dict(sorted(((k, x) for k, x in sd.items() if is_param(k, x) and
                                          not (single and m.kind == "llama" and
                                               k == "output_layer.weight")),
                                         key=lambda kv: module_order(kv[0])))
                             for sd in chunks] for tp_pp, chunks in dicts.items()}
    return out


def local_optimizer(states, tp_pp, decayed_first):
    """model_optim_rng.pt["optimizer"] of Float16OptimizerWithFloat16Params."""
    params = [(v, k, x) for v, sd in enumerate(states["model"][tp_pp]) for k, x in sd.items()]
    groups = [[p for p in params if not no_decay(p[1], p[2])],
              [p for p in params if no_decay(p[1], p[2])]]
    wd = [1.0, 0.0]
    if not decayed_first:  # older Megatron: groups in first-seen order
        groups, wd = groups[::-1], wd[::-1]
    state, param_groups, mains, i = {}, [], [], 0
    for g, w in zip(groups, wd):
        ids = []
        for v, k, _ in g:
            state[i] = {"exp_avg": states["optim/exp_avg"][tp_pp][v][k].float(),
                        "exp_avg_sq": states["optim/exp_avg_sq"][tp_pp][v][k].float(),
                        "step": torch.tensor(float(ITERATION))}
            ids.append(i)
            i += 1
        param_groups.append({"params": ids, "wd_mult": w, "lr_mult": 1.0, "lr": 1e-4,
                             "weight_decay": 0.1 * w, "is_expert_parallel": False})
        mains.append([states["optim/main"][tp_pp][v][k].float() for v, k, _ in g])
    return {"optimizer": {"state": state, "param_groups": param_groups},
            "grad_scaler": {"scale": 1.0}, "fp32_from_fp16_params": mains}


def distrib_optimizer(states, tp_pp):
    """distrib_optim.pt as get_parameter_state_dp_zero gathers it (one bucket)."""
    out = {"buckets_coalesced": True}
    for v, sd in enumerate(states["model"][tp_pp]):
        place, off = {}, 0
        for k, x in reversed(list(sd.items())):
            off = -(-off // 64) * 64
            place[k], off = off, off + x.numel()
        world = {}
        for key, root in (("param", "optim/main"), ("exp_avg", "optim/exp_avg"),
                          ("exp_avg_sq", "optim/exp_avg_sq")):
            buf = torch.full((off,), float("nan"))
            for k, x in sd.items():
                buf[place[k]:place[k] + x.numel()] = states[root][tp_pp][v][k].float().reshape(-1)
            world[key] = buf
        world["numel_unpadded"] = off
        out[v] = {(torch.bfloat16, torch.float32): world}
    return out


def write_checkpoint(root, kind, models, tp, pp, vpp, spec, optim, decayed_first=True,
                     extra_args=None):
    states = rank_chunks(models, tp, pp, vpp, spec)
    gpt = kind == "megatron-gpt"
    it_dir = root / f"iter_{ITERATION:07d}"
    args = argparse.Namespace(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                              untie_embeddings_and_output_weights=gpt, bf16=True,
                              use_distributed_optimizer=optim == "distributed",
                              **(extra_args or {}))
    for (t, p), chunks in states["model"].items():
        d = it_dir / (f"mp_rank_{t:02d}" if pp == 1 else f"mp_rank_{t:02d}_{p:03d}")
        d.mkdir(parents=True)
        ck = {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION}
        if vpp == 1:
            ck["model"] = chunks[0]
        else:
            ck.update({f"model{v}": sd for v, sd in enumerate(chunks)})
        if optim == "local":
            ck["optimizer"] = local_optimizer(states, (t, p), decayed_first)
        else:
            ck["optimizer"] = {"optimizer": {"state": {}, "param_groups": []}}
            torch.save(distrib_optimizer(states, (t, p)), d / "distrib_optim.pt")
        torch.save(ck, d / "model_optim_rng.pt")
    (root / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))


def schema_with_main(kind):
    schema = schema_for(kind)
    schema["states"]["optim/main"] = {"dtype": "float32"}
    return schema


def models_for(kind, tp, seed):
    return {"model": Model(kind, tp, seed),
            **{r: Model(kind, tp, seed * 10 + k) for r, k in ROOTS.items()}}


def full_of(schema, models):
    """{(state, name): NumPy array}: bf16 bits for the model, fp32 for the rest."""
    full = {}
    for name, spec, _ in expand(schema):
        if "tied" in spec:
            continue
        full[("model", name)] = bits(models["model"].schema[name])
        for r in ROOTS:
            full[(r, name)] = models[r].schema[name].float().numpy()
    return full


CASES = [  # schema, names, optimizer, src tp pp vpp, decayed group first, mount tp pp dp
    ("megatron-gpt", "local", "local", (2, 2, 1), True, (1, 1, 1)),
    ("llama", "te", "local", (2, 2, 2), False, (1, 2, 1)),
    ("llama", "te", "distributed", (2, 1, 1), True, (4, 1, 2)),
    ("megatron-gpt", "local", "distributed", (2, 2, 2), True, (4, 2, 1)),
]


@pytest.mark.parametrize("kind,spec,optim,src,first,dst", CASES,
                         ids=[f"{c[0]}-{c[2]}-tp{c[3][0]}pp{c[3][1]}vpp{c[3][2]}-to-"
                              f"tp{c[5][0]}pp{c[5][1]}dp{c[5][2]}" for c in CASES])
def test_optimizer_states_into_another_layout(mount, tmp_path, kind, spec, optim, src, first,
                                              dst):
    schema = schema_with_main(kind)
    models = models_for(kind, src[0], seed=sum(src) + sum(dst))
    write_checkpoint(tmp_path / "ckpt", kind, models, *src, spec, optim, first)
    mnt = mlfs.Mount(mount.path)
    cfg = {"version": 1, "tp": dst[0], "pp": dst[1], "dp": dst[2], "nodes": ["n0"]}
    mnt.set_up(schema, cfg)
    got = mlfs.megatron.import_checkpoint(mnt, tmp_path / "ckpt", tmpdir=tmp_path)
    assert got["optimizer"] == optim and got["step"] == ITERATION
    assert got["states"] == sorted(["model", *ROOTS])
    check_layout(mount, schema, cfg, full_of(schema, models), step=ITERATION)


def expected_rank(models, tp, pp, vpp, t, p):
    """[{(root, key): tensor} per model chunk]: Megatron's rank (t, p) of a tp/pp/vpp
    export, cut here from the full tensors by Megatron's rule (the vocabulary padded
    with zero rows; a tied output layer only where it is not on the embedding's stage)."""
    out = []
    for root, m in models.items():
        trimmed = Model.__new__(Model)
        trimmed.kind, trimmed.megatron = m.kind, {}
        for (k, split), full in m.megatron.items():
            if split == "vocab":
                rows = -(-VOCAB // (128 * tp)) * 128 * tp
                full = torch.cat([full[:VOCAB], full.new_zeros(rows - VOCAB, HIDDEN)])
            trimmed.megatron[(k, split)] = full
        for v, sd in enumerate(stage_dicts(trimmed, tp, pp, vpp, "local")[(t, p)]):
            if v == len(out):
                out.append({})
            for k, x in sd.items():
                if k == "output_layer.weight" and m.kind == "llama" and pp * vpp == 1:
                    continue
                out[v][(root, k)] = x if root == "model" else x.float()
    return out


def check_export(out, models, tp, pp, vpp):
    """The files of an export against expected_rank, tensor by tensor: names, Megatron's
    module order, the optimizer's groups (decayed, then not) and its states."""
    it_dir = out / f"iter_{ITERATION:07d}"
    assert (out / "latest_checkpointed_iteration.txt").read_text() == str(ITERATION)
    assert sorted(os.listdir(it_dir)) == sorted(
        f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "") for t in range(tp)
        for p in range(pp))
    for t in range(tp):
        for p in range(pp):
            rank = f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "")
            ck = mlfs.megatron.load_rank_file(it_dir / rank / "model_optim_rng.pt")
            want = expected_rank(models, tp, pp, vpp, t, p)
            sds = [ck["model"]] if vpp == 1 else [ck[f"model{v}"] for v in range(vpp)]
            params = []
            for sd, w in zip(sds, want):
                keys = list(sd)
                assert keys == sorted(keys, key=module_order)  # Megatron-Core's order
                assert sorted(keys) == sorted(k for r, k in w if r == "model")
                for k in keys:
                    assert sd[k].dtype == torch.bfloat16
                    assert torch.equal(sd[k], w[("model", k)]), (rank, k)
                    params.append((w, k, sd[k]))
            opt = ck["optimizer"]
            groups = opt["optimizer"]["param_groups"]
            assert [g["wd_mult"] for g in groups] == [1.0, 0.0]
            order = [x for x in params if not no_decay(x[1], x[2])] + \
                    [x for x in params if no_decay(x[1], x[2])]
            assert [i for g in groups for i in g["params"]] == list(range(len(order)))
            for i, (w, k, _) in enumerate(order):
                st = opt["optimizer"]["state"][i]
                assert torch.equal(st["exp_avg"], w[("optim/exp_avg", k)]), (rank, k)
                assert torch.equal(st["exp_avg_sq"], w[("optim/exp_avg_sq", k)]), (rank, k)
            mains = [x for g in opt["fp32_from_fp16_params"] for x in g]
            assert len(mains) == len(order)
            assert all(torch.equal(x, w[("optim/main", k)]) for x, (w, k, _) in zip(mains, order))
            args = ck["args"]
            assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (tp, pp)
            assert ck["iteration"] == ITERATION and args.num_query_groups == KV
            assert args.padded_vocab_size == -(-VOCAB // (128 * tp)) * 128 * tp


TRIPS = [  # schema, names, optimizer in, src tp pp vpp, mount, reconfigured, export, re-import
    ("megatron-gpt", "local", "local", (2, 2, 1), (1, 1, 1), (4, 2, 1), (2, 1, 1), (4, 1, 2)),
    ("llama", "te", "distributed", (2, 1, 1), (4, 1, 1), (2, 2, 1), (1, 2, 2), (2, 2, 2)),
]


@pytest.mark.parametrize("kind,spec,optim,src,a,b,c,d", TRIPS,
                         ids=[f"{t[0]}-{t[2]}" for t in TRIPS])
def test_round_trip_through_megatron_files(mount_factory, tmp_path, kind, spec, optim, src,
                                           a, b, c, d):
    """import (Megatron at src) -> mount at a -> reconfigure to b -> export at c (files
    compared with the test's own cutting) -> re-import into a fresh mount at d: every
    partition of every state bit-exact."""
    schema = schema_with_main(kind)
    models = models_for(kind, src[0], seed=11)
    write_checkpoint(tmp_path / "ckpt", kind, models, *src, spec, optim)
    full = full_of(schema, models)
    m = mount_factory(name="a")
    mnt = mlfs.Mount(m.path)
    cfg = {"version": 1, "tp": a[0], "pp": a[1], "dp": a[2], "nodes": ["n0"]}
    mnt.set_up(schema, cfg)
    mlfs.megatron.import_checkpoint(mnt, tmp_path / "ckpt", tmpdir=tmp_path)
    cfg = dict(cfg, version=2, tp=b[0], pp=b[1], dp=b[2])
    reconfigure(m, tmp_path, cfg)
    check_layout(m, schema, cfg, full, step=ITERATION)

    out = tmp_path / "export"
    got = mlfs.megatron.export_checkpoint(mnt, out, tp=c[0], pp=c[1], vpp=c[2])
    assert got["iteration"] == ITERATION and got["optimizer"] == "local"
    check_export(out, models, *c)

    m2 = mount_factory(name="b")
    mnt2 = mlfs.Mount(m2.path)
    cfg2 = {"version": 1, "tp": d[0], "pp": d[1], "dp": d[2], "nodes": ["n0"]}
    mnt2.set_up(schema, cfg2)
    back = mlfs.megatron.import_checkpoint(mnt2, out, tmpdir=tmp_path)
    assert (back["tp"], back["pp"], back["vpp"], back["optimizer"]) == (*c, "local")
    check_layout(m2, schema, cfg2, full, step=ITERATION)


def test_optimizer_refusals_change_nothing(mount, tmp_path):
    """A distributed optimizer written with --overlap-grad-reduce (buckets), and a
    non-distributed one whose parameters are not in the model's order, are refused
    naming why; no partition changes. optimizer=False imports the weights alone. An
    export to a tp that does not divide the query groups, or a pp that does not divide
    the layers, is refused before writing anything."""
    kind = "megatron-gpt"
    schema = schema_with_main(kind)
    models = models_for(kind, 2, seed=5)
    mnt = mlfs.Mount(mount.path)
    cfg = {"version": 1, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"]}
    mnt.set_up(schema, cfg)
    before = snapshot(mount)
    write_checkpoint(tmp_path / "dist", kind, models, 2, 1, 1, "local", "distributed",
                     extra_args={"overlap_grad_reduce": True})
    with pytest.raises(mlfs.MlfsError, match="--overlap-grad-reduce"):
        mlfs.megatron.import_checkpoint(mnt, tmp_path / "dist")
    write_checkpoint(tmp_path / "local", kind, models, 2, 1, 1, "local", "local")
    path = tmp_path / "local" / f"iter_{ITERATION:07d}" / "mp_rank_01" / "model_optim_rng.pt"
    ck = torch.load(path, weights_only=False)
    ck["model"] = dict(reversed(list(ck["model"].items())))  # not the module order
    torch.save(ck, path)
    with pytest.raises(mlfs.MlfsError, match="the parameter order is not the model's"):
        mlfs.megatron.import_checkpoint(mnt, tmp_path / "local")
    assert snapshot(mount) == before
    got = mlfs.megatron.import_checkpoint(mnt, tmp_path / "dist", optimizer=False)
    assert got["optimizer"] is None and got["states"] == ["model"]
    full = full_of(schema, models)
    full.update({k: np.zeros_like(v) for k, v in full.items() if k[0] != "model"})
    check_layout(mount, schema, cfg, full, step=ITERATION)
    with pytest.raises(mlfs.MlfsError, match="has 4 query groups, not a multiple of tp"):
        mlfs.megatron.export_checkpoint(mnt, tmp_path / "x", tp=8, pp=1)
    with pytest.raises(mlfs.MlfsError, match="4 layers do not divide into 3 model chunks"):
        mlfs.megatron.export_checkpoint(mnt, tmp_path / "x", tp=1, pp=3)
    assert not (tmp_path / "x").exists()
