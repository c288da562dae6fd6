"""A mount's full tensors as Megatron-LM's per-rank checkpoint files (mlfs.megatron's
export_checkpoint; docs/formats.md#export-to-megatron-lm).

Each TP rank's shard is cut as Megatron-Core splits it (the inverse of
mlfs.megatron's import): column-parallel weights and biases (linear_qkv, linear_fc1)
on dim 0, row-parallel weights (linear_proj, linear_fc2) on dim 1, the vocab-parallel
embedding and output layer on dim 0 after padding the vocabulary with zero rows to a
multiple of pad_multiple (128) * tp, everything else whole on every rank. The fused
QKV goes out interleaved per query group ([G, (A/G + 2) * d, h]) so that TP rank r's
block is the contiguous rows of its G/tp groups; a SwiGLU fc1 ([gate; up] in llama's
schema) goes out as [gate_r; up_r] on each rank. Names and the order of the state dict
are Megatron-Core's (local spec): a module's parameters in the order its __init__
builds them, which is also the order of its optimizer's parameters (NVIDIA/Megatron-LM,
megatron/core/transformer/attention.py: Attention.__init__ builds linear_proj,
SelfAttention's then linear_qkv; the layer builds input_layernorm, self_attention,
pre_mlp_layernorm, mlp; the MLP linear_fc1, linear_fc2; GPTModel embedding, decoder
(layers, final_layernorm), output_layer). The optimizer's structure is
_megatron_optim.py's, with its sources.
"""
import argparse
import collections
import os

import torch

from .client import MlfsError, read_npy
from .torch import _mount, to_torch

# A layer's Megatron-Core names in module order, and the top-level ones.
LAYER_ORDER = [
    "input_layernorm.weight", "input_layernorm.bias",
    "self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
    "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
    "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
    "mlp.linear_fc1.weight", "mlp.linear_fc1.bias",
    "mlp.linear_fc2.weight", "mlp.linear_fc2.bias",
]
FIRST = ["embedding.word_embeddings.weight", "embedding.position_embeddings.weight"]
LAST = ["decoder.final_layernorm.weight", "decoder.final_layernorm.bias", "output_layer.weight"]


def _schema_names():
    """{schema name relative to layers/<i>/ or top-level: (Megatron-Core name, split)}."""
    from .megatron import LAYER, TOP
    layer = {LAYER[k][0]: (k, LAYER[k][1]) for k in LAYER_ORDER}
    top = {TOP[k][0]: (k, TOP[k][1]) for k in FIRST + LAST}
    return layer, top


def _interleave(full, e):
    """The llama schema's QKV chunks [all q; all k; all v] as Megatron's, interleaved
    per query group (mlfs.megatron._qkv_to_chunks inverted)."""
    q_rows, kv_rows = e["split"]["chunks"][0], e["split"]["chunks"][1]
    d = e["split"].get("unit", 1)
    groups = kv_rows // d
    rest = full.shape[1:]
    q = full[:q_rows].reshape(groups, q_rows // groups, *rest)
    k = full[q_rows:q_rows + kv_rows].reshape(groups, d, *rest)
    v = full[q_rows + kv_rows:].reshape(groups, d, *rest)
    return torch.cat([q, k, v], dim=1).reshape(full.shape)


def _groups(e):
    """The number of query groups of a QKV entry (its split's unit is a group's rows for
    megatron-gpt, a head's for llama's chunks)."""
    split = e["split"]
    if isinstance(split.get("chunks"), list):
        return split["chunks"][1] // split.get("unit", 1)
    return e["shape"][0] // split.get("unit", e["shape"][0])


def shard(full, kind, e, tp, t):
    """Megatron's TP rank @t's part of the full tensor @full of schema entry @e."""
    from .megatron import COL, FC1, QKV, REP, ROW, VOCAB
    split = e.get("split") or {}
    if kind == REP:
        return full.clone()
    if kind == ROW:
        return full.chunk(tp, dim=1)[t].clone() if full.dim() == 2 else full.clone()
    if kind == FC1 and split.get("chunks") == 2:
        gate, up = full.chunk(2)
        return torch.cat([gate.chunk(tp)[t], up.chunk(tp)[t]])
    if kind == QKV and isinstance(split.get("chunks"), list):
        full = _interleave(full, e)
    if kind == VOCAB:
        m = split.get("pad_multiple", 128) * tp
        rows = -(-full.shape[0] // m) * m
        full = torch.cat([full, full.new_zeros(rows - full.shape[0], *full.shape[1:])])
    assert kind in (COL, FC1, QKV, VOCAB)
    return full.chunk(tp)[t].clone()


def _check_divisible(entries, kinds, tp):
    from .megatron import FC1, QKV, REP, ROW, VOCAB
    for n, e in entries.items():
        kind = kinds[n]
        if kind in (REP, VOCAB):
            continue
        if kind == QKV and _groups(e) % tp:
            raise MlfsError(f"tp {tp}: {n} has {_groups(e)} query groups, not a multiple of tp")
        dim = 1 if kind == ROW else 0
        size = e["shape"][dim] // (2 if kind == FC1 and (e.get("split") or {}).get("chunks")
                                   == 2 else 1)
        if len(e["shape"]) > dim and size % tp:
            raise MlfsError(f"tp {tp}: {n} is {e['shape']}: dim {dim} does not divide by tp")


def _args(schema, tensors, tp, pp, vpp, it, tied):
    """The argparse.Namespace Megatron saves in "args", from the schema."""
    by = {e["name"]: e for e in tensors}
    emb = by["embedding/word_embeddings/weight"]
    m = (emb.get("split") or {}).get("pad_multiple", 128)
    qkv = by.get("layers/0/self_attention/query_key_value/weight")
    fc2 = by.get("layers/0/mlp/dense_4h_to_h/weight")
    proj = by.get("layers/0/self_attention/dense/weight")
    ns = argparse.Namespace(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        num_layers=schema["num_layers"], hidden_size=emb["shape"][1],
        padded_vocab_size=-(-emb["shape"][0] // (m * tp)) * m * tp,
        make_vocab_size_divisible_by=m, untie_embeddings_and_output_weights=not tied,
        iteration=it, ckpt_format="torch")
    if fc2 is not None:
        ns.ffn_hidden_size = fc2["shape"][1]
    if qkv is not None and proj is not None:
        ns.num_query_groups = _groups(qkv)
        d = (qkv["shape"][0] - proj["shape"][1]) // (2 * ns.num_query_groups)
        ns.kv_channels = d
        ns.num_attention_heads = proj["shape"][1] // d
        ns.group_query_attention = ns.num_query_groups != ns.num_attention_heads
    pos = by.get("embedding/position_embeddings/weight")
    if pos is not None:
        ns.max_position_embeddings = pos["shape"][0]
    return ns


def _optimizer(params, exp_avg, exp_avg_sq, main, it):
    """model_optim_rng.pt["optimizer"] as Megatron's non-distributed optimizer saves it
    (_megatron_optim.py documents the structure): two param groups, the decayed
    parameters then the others (biases, 1-D), as Megatron-Core's _get_param_groups
    orders them (the default group, no overrides, sorts first), each with the keys
    Megatron matches saved groups by on load (param_group_identifier_keys in
    megatron/core/optimizer/optimizer.py: wd_mult, lr_mult, is_expert_parallel,
    is_decoupled_lr); Adam's step count both where torch's Adam keeps it (each
    parameter's state) and where Apex's and TE's FusedAdam do (the group)."""
    from ._megatron_optim import _no_decay
    groups = [[k for k, t in params if not _no_decay(k, t)],
              [k for k, t in params if _no_decay(k, t)]]
    dtypes = {k: t.dtype for k, t in params}
    index, state, param_groups, mains = {}, {}, [], []
    for wd, keys in zip((1.0, 0.0), groups):
        ids = []
        for k in keys:
            index[k] = len(index)
            ids.append(index[k])
            state[index[k]] = {"exp_avg": exp_avg[k], "exp_avg_sq": exp_avg_sq[k],
                               "step": torch.tensor(float(it))}
        param_groups.append({"params": ids, "wd_mult": wd, "lr_mult": 1.0,
                             "is_expert_parallel": False, "is_decoupled_lr": False,
                             "step": it})
        mains.append([main[k] for k in keys if dtypes[k] in (torch.float16, torch.bfloat16)])
    sd = {"state": state, "param_groups": param_groups}
    if any(t.dtype in (torch.float16, torch.bfloat16) for _, t in params):
        return {"optimizer": sd, "fp32_from_fp16_params": mains}
    return sd


def export_checkpoint(mount, out_dir, tp, pp, vpp=1, iteration=None, optimizer=True):
    """See mlfs.megatron.export_checkpoint."""
    mnt = _mount(mount)
    schema = mnt.schema()
    L = schema["num_layers"]
    tp, pp, vpp = int(tp), int(pp), int(vpp)
    if tp < 1 or pp < 1 or vpp < 1 or L % (pp * vpp):
        raise MlfsError(f"tp {tp}, pp {pp}, vpp {vpp}: {L} layers do not divide into "
                        f"{pp * vpp} model chunks")
    roots = ["optim/exp_avg", "optim/exp_avg_sq"]
    with_optim = optimizer and all(r in schema["states"] for r in roots)
    if optimizer is True and not with_optim and any(s.startswith("optim/")
                                                    for s in schema["states"]):
        raise MlfsError(f"the schema's optimizer roots {sorted(schema['states'])} lack "
                        f"{roots}: Megatron's Adam needs both (optimizer=False leaves it out)")
    states = ["model"] + (roots + (["optim/main"] if "optim/main" in schema["states"] else [])
                          if with_optim else [])
    tensors = {s: mnt.tensors(s) for s in states}
    layer, top = _schema_names()
    names, kinds, entries, tied = {}, {}, {}, False
    for e in tensors["model"]:
        n = e["name"]
        parts = n.split("/", 2)
        if parts[0] == "layers" and len(parts) == 3 and parts[2] in layer:
            mname, kinds[n] = layer[parts[2]]
            names[n] = (int(parts[1]), mname)
        elif n in top:
            mname, kinds[n] = top[n]
            names[n] = (None, mname)
        else:
            raise MlfsError(f"{n}: no Megatron-Core name for this schema tensor")
        entries[n] = e
        if n == "output_layer/weight" and e.get("tied"):
            tied = True
    _check_divisible({n: e for n, e in entries.items() if not e.get("tied")}, kinds, tp)
    if iteration is None:
        local = mnt.ranks()
        if not local:
            raise MlfsError(f"{mnt.path}: no rank on this node to take the step from: "
                            "give iteration=")
        iteration = mnt.rank(local[0]).saved_step()
    it = int(iteration)
    args = _args(schema, tensors["model"], tp, pp, vpp, it, tied)
    by_mname = {}
    for n, (i, mname) in names.items():
        by_mname[(i, mname)] = n
    nchunks, per = pp * vpp, L // (pp * vpp)
    it_dir = os.path.join(os.fspath(out_dir), f"iter_{it:07d}")
    for p in range(pp):
        cache = {}

        def full(state, n):
            src = entries[n].get("tied") or n
            if (state, src) not in cache:
                dtype = next(e["dtype"] for e in tensors[state] if e["name"] == src)
                cache[(state, src)] = to_torch(read_npy(mnt.p("full", state, src + ".npy")),
                                               dtype)
            return cache[(state, src)]
        for t in range(tp):
            ck = {"args": args, "checkpoint_version": 3.0, "iteration": it}
            params, per_state = [], {s: {} for s in states}
            for v in range(vpp):
                c = v * pp + p
                keys = []
                if c == 0:
                    keys += [(None, k) for k in FIRST]
                for i in range(c * per, (c + 1) * per):
                    keys += [(i, k) for k in LAYER_ORDER]
                if c == nchunks - 1:
                    keys += [(None, k) for k in LAST]
                sd = collections.OrderedDict()
                for i, mname in keys:
                    n = by_mname.get((i, mname))
                    if n is None:
                        continue
                    if n == "output_layer/weight" and tied and nchunks == 1:
                        continue  # Megatron's tied output layer with one stage: no weight
                    key = mname if i is None else f"decoder.layers.{i - c * per}.{mname}"
                    for s in states:  # Megatron's moments and main params are fp32
                        x = shard(full(s, n), kinds[n], entries[n], tp, t)
                        per_state[s][(v, key)] = x if s == "model" else x.float()
                    sd[key] = per_state["model"][(v, key)]
                    params.append(((v, key), sd[key]))
                ck["model" if vpp == 1 else f"model{v}"] = sd
            if with_optim:
                pk = [(f"{v}.{k}", x) for (v, k), x in params]  # unique over chunks
                flat = {s: {f"{v}.{k}": x for (v, k), x in per_state[s].items()}
                        for s in states}
                main = flat.get("optim/main") or {k: x.float() for k, x in pk}
                ck["optimizer"] = _optimizer(pk, flat["optim/exp_avg"],
                                             flat["optim/exp_avg_sq"], main, it)
            d = os.path.join(it_dir, f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else ""))
            os.makedirs(d, exist_ok=True)
            tmp = os.path.join(d, "model_optim_rng.pt.tmp")
            torch.save(ck, tmp)
            os.replace(tmp, os.path.join(d, "model_optim_rng.pt"))
        cache.clear()
    tracker = os.path.join(os.fspath(out_dir), "latest_checkpointed_iteration.txt")
    with open(tracker, "w") as f:
        f.write(str(it))
    return {"iteration": it, "tp": tp, "pp": pp, "vpp": vpp, "dir": it_dir,
            "states": states, "optimizer": "local" if with_optim else None}
