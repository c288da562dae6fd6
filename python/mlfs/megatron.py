"""Megatron-LM's per-rank checkpoints (`--ckpt-format torch`) into a mount, in any
layout, with the optimizer's states; and a mount back out as such a checkpoint.

    import mlfs, mlfs.megatron
    mnt = mlfs.Mount("/mnt/mlfs")             # schema.json (`mlfs schema megatron-gpt|llama`)
    mnt.set_up(schema, {"version": 1, "tp": 4, "pp": 1, "dp": 2, "nodes": ["n0"]})
    mlfs.megatron.import_checkpoint(mnt, "/ckpt/gpt")   # latest_checkpointed_iteration.txt
    # every rank of the mount's layout now holds its slices of the checkpoint's
    # weights and Adam moments; the ranks' step is the checkpoint's iteration
    mlfs.megatron.export_checkpoint(mnt, "/ckpt/gpt-tp2", tp=2, pp=1)

What is read (docs/formats.md#megatron-lm-checkpoints says more):

  <dir>/latest_checkpointed_iteration.txt          "N" or "release"
  <dir>/iter_000000N/mp_rank_TT/model_optim_rng.pt        pp = 1
  <dir>/iter_000000N/mp_rank_TT_PPP/model_optim_rng.pt    pp > 1
  <dir>/iter_000000N/mp_rank_TT[_PPP]/distrib_optim.pt    the distributed optimizer

each a torch.save'd dict: "model" (or "model0", "model1", ... with virtual pipeline
stages) holds the rank's state dict, "args" the run's argparse.Namespace,
"iteration" the steps trained, "optimizer" the non-distributed optimizer's state
(_megatron_optim.py: which parameter each of its indices is, and distrib_optim.pt's
layout); "rng_state" and the scheduler are not imported.
Names are Megatron-Core's (decoder.layers.<i>.self_attention.linear_qkv.weight, the
local or the Transformer Engine spec) or legacy Megatron-LM's
(language_model.encoder.layers.<i>.self_attention.query_key_value.weight), layer
numbers local to the pipeline stage (a stage's offset is the number of layers of the
stages before it, so uneven stages work). Every TP rank's shard is put back together
as Megatron splits it: column-parallel weights (QKV, fc1) and biases on dim 0,
row-parallel weights (the attention projection, fc2) on dim 1, the vocab-parallel
embedding and output layer on dim 0 then cut to the schema's vocabulary (Megatron
pads it), everything else from TP rank 0. The fused QKV is Megatron's, interleaved
per query group: kept so for `mlfs schema megatron-gpt` (its split unit is a query
group), split into [all q; all k; all v] for `mlfs schema llama` (its chunks); a
SwiGLU fc1, [gate_r; up_r] on each TP rank, becomes [gate; up] for llama's two
chunks. Adam's moments and the fp32 main params have their parameter's shard shape
and are put together the same way, into the schema's roots optim/exp_avg,
optim/exp_avg_sq and optim/main (where the schema has them). dtypes are kept (bf16
stays bf16): a tensor of another dtype than the schema's is refused unless cast=True.

The full tensors are written, one at a time, to one safetensors file per state in a
temporary directory and imported by the daemon (`mlfs import`: all or nothing, every
partition of this node's ranks, every state at once).

Loading: weights_only=True (the default) unpickles with an allowlist (tensors,
containers, argparse.Namespace, torch dtypes and sizes, NumPy arrays of the RNG
state); an object of any other class (an enum of Megatron's in "args", Transformer
Engine's extra state) becomes an inert placeholder and no code of the checkpoint
runs, so Megatron need not be installed. weights_only=False is plain torch.load: a
checkpoint you trust, with Megatron importable.
"""
import argparse
import inspect
import io
import os
import pickle
import re
import shutil
import tempfile
import zipfile

import torch

from . import _megatron_optim as _optim
from . import _st
from .client import MlfsError
from .torch import _bytes, _mount, _shared_tmpdir, schema_dtype

__all__ = ["import_checkpoint", "export_checkpoint", "load_rank_file", "find_checkpoint"]

FILE = "model_optim_rng.pt"
RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")

# How a tensor is split over TP ranks in Megatron.
REP, COL, ROW, QKV, FC1, VOCAB = "replicated", "dim 0", "dim 1", "qkv", "fc1", "vocab"

# Inside a layer: Megatron-Core's names (local spec, then Transformer Engine's fused
# layer norms), then legacy Megatron-LM's -> (schema name under layers/<i>/, split).
LAYER = {
    "input_layernorm.weight": ("input_layernorm/weight", REP),
    "input_layernorm.bias": ("input_layernorm/bias", REP),
    "self_attention.linear_qkv.layer_norm_weight": ("input_layernorm/weight", REP),
    "self_attention.linear_qkv.layer_norm_bias": ("input_layernorm/bias", REP),
    "self_attention.linear_qkv.weight": ("self_attention/query_key_value/weight", QKV),
    "self_attention.linear_qkv.bias": ("self_attention/query_key_value/bias", QKV),
    "self_attention.linear_proj.weight": ("self_attention/dense/weight", ROW),
    "self_attention.linear_proj.bias": ("self_attention/dense/bias", REP),
    "pre_mlp_layernorm.weight": ("post_attention_layernorm/weight", REP),
    "pre_mlp_layernorm.bias": ("post_attention_layernorm/bias", REP),
    "mlp.linear_fc1.layer_norm_weight": ("post_attention_layernorm/weight", REP),
    "mlp.linear_fc1.layer_norm_bias": ("post_attention_layernorm/bias", REP),
    "mlp.linear_fc1.weight": ("mlp/dense_h_to_4h/weight", FC1),
    "mlp.linear_fc1.bias": ("mlp/dense_h_to_4h/bias", FC1),
    "mlp.linear_fc2.weight": ("mlp/dense_4h_to_h/weight", ROW),
    "mlp.linear_fc2.bias": ("mlp/dense_4h_to_h/bias", REP),
    # legacy Megatron-LM (checkpoint_version >= 2: QKV interleaved per group)
    "self_attention.query_key_value.weight": ("self_attention/query_key_value/weight", QKV),
    "self_attention.query_key_value.bias": ("self_attention/query_key_value/bias", QKV),
    "self_attention.dense.weight": ("self_attention/dense/weight", ROW),
    "self_attention.dense.bias": ("self_attention/dense/bias", REP),
    "post_attention_layernorm.weight": ("post_attention_layernorm/weight", REP),
    "post_attention_layernorm.bias": ("post_attention_layernorm/bias", REP),
    "mlp.dense_h_to_4h.weight": ("mlp/dense_h_to_4h/weight", FC1),
    "mlp.dense_h_to_4h.bias": ("mlp/dense_h_to_4h/bias", FC1),
    "mlp.dense_4h_to_h.weight": ("mlp/dense_4h_to_h/weight", ROW),
    "mlp.dense_4h_to_h.bias": ("mlp/dense_4h_to_h/bias", REP),
}
LAYER_PREFIX = re.compile(r"^(?:decoder|language_model\.encoder)\.layers\.(\d+)\.(.+)$")
TOP = {
    "embedding.word_embeddings.weight": ("embedding/word_embeddings/weight", VOCAB),
    "embedding.position_embeddings.weight": ("embedding/position_embeddings/weight", REP),
    "decoder.final_layernorm.weight": ("final_layernorm/weight", REP),
    "decoder.final_layernorm.bias": ("final_layernorm/bias", REP),
    "output_layer.weight": ("output_layer/weight", VOCAB),
}
TOP.update({"language_model." + k: v for k, v in TOP.items() if not k.startswith("decoder.")})
TOP["language_model.encoder.final_layernorm.weight"] = ("final_layernorm/weight", REP)
TOP["language_model.encoder.final_layernorm.bias"] = ("final_layernorm/bias", REP)


# ------------------------------------------------------------------ loading

class Opaque:
    """An object of a class outside the allowlist, never constructed: what the
    checkpoint named (`_name`) and the arguments it gave."""
    _name = "?"

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        self.args = args

    def __setstate__(self, state):
        self.state = state

    def __repr__(self):
        return f"<{self._name}, not loaded>"


_ALLOWED = {
    ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
    ("builtins", "slice"), ("builtins", "complex"), ("builtins", "bytearray"),
    ("builtins", "range"), ("_codecs", "encode"), ("copyreg", "_reconstructor"),
    ("argparse", "Namespace"), ("torch._utils", "_rebuild_tensor"),
    ("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_parameter"),
    ("torch._utils", "_rebuild_parameter_with_state"), ("torch._tensor", "_rebuild_from_type_v2"),
    ("torch", "Size"), ("torch", "device"), ("torch", "Tensor"),
    ("torch.nn.parameter", "Parameter"), ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
}
_opaque = {}


class _Storage:
    """A storage type named by the pickle (torch.BFloat16Storage, ...): its dtype."""

    def __init__(self, dtype):
        self.dtype = dtype


class _Unpickler(pickle.Unpickler):
    """pickle's unpickler with an allowlist (see the module's doc), reading the storages
    of a torch.save zip file @zf (records under @prefix/data/)."""

    def __init__(self, f, zf, prefix):
        super().__init__(f, encoding="utf-8")
        self.zf, self.prefix, self.storages = zf, prefix, {}

    def find_class(self, module, name):
        if module == "torch" and name.endswith("Storage") and \
                isinstance(getattr(getattr(torch, name, None), "dtype", None), torch.dtype):
            return _Storage(getattr(torch, name).dtype)
        if (module, name) in _ALLOWED or module == "numpy.dtypes" or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        key = f"{module}.{name}"
        if key not in _opaque:
            _opaque[key] = type(name, (Opaque,), {"_name": key, "__module__": __name__})
        return _opaque[key]

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _Storage)):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r:.80}")
        _, kind, key, _, numel = pid
        if key not in self.storages:
            data = bytearray(self.zf.read(f"{self.prefix}/data/{key}"))
            size = torch.empty((), dtype=kind.dtype).element_size()
            if len(data) != numel * size:
                raise pickle.UnpicklingError(f"storage {key}: {len(data)} bytes for {numel} "
                                             f"elements of {kind.dtype}")
            t = (torch.frombuffer(data, dtype=kind.dtype) if data
                 else torch.empty(0, dtype=kind.dtype))
            self.storages[key] = t._typed_storage() if hasattr(t, "_typed_storage") \
                else t.storage()
        return self.storages[key]


def _restricted_load(path):
    """torch.load of a zip-format torch.save file (PyTorch 1.6 and later) through
    _Unpickler: no class outside the allowlist is constructed, no function outside it
    called."""
    if not zipfile.is_zipfile(path):
        raise MlfsError(f"{path}: not a zip-format torch.save file (PyTorch < 1.6): "
                        "load it with weights_only=False if you trust it")
    with zipfile.ZipFile(path) as zf:
        pkl = [n for n in zf.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pkl) != 1:
            raise MlfsError(f"{path}: no data.pkl record: not a torch.save file")
        prefix = pkl[0].split("/")[0]
        order = f"{prefix}/byteorder"
        if order in zf.namelist() and zf.read(order).strip() != b"little":
            raise MlfsError(f"{path}: a big-endian torch.save file")
        with zf.open(pkl[0]) as f:
            return _Unpickler(io.BytesIO(f.read()), zf, prefix).load()


def load_rank_file(path, weights_only=True):
    """One rank's model_optim_rng.pt, on the CPU (see the module's doc for
    @weights_only). weights_only=False is torch.load, memory-mapped where this PyTorch
    can (2.1 and later)."""
    path = os.fspath(path)
    try:
        if weights_only:
            return _restricted_load(path)
        kw = {"map_location": "cpu", "weights_only": False}
        if "mmap" in inspect.signature(torch.load).parameters and zipfile.is_zipfile(path):
            kw["mmap"] = True
        return torch.load(path, **kw)
    except MlfsError:
        raise
    except Exception as e:  # pickle's refusals have no common base
        raise MlfsError(f"{path}: loading it: {e}") from e


def find_checkpoint(ckpt_dir, iteration=None):
    """(the iteration directory, {(tp rank, pp rank): its model_optim_rng.pt}, tp, pp)
    of @ckpt_dir: a Megatron save directory (latest_checkpointed_iteration.txt, or
    @iteration), or an iter_NNNNNNN/ (release/) directory itself."""
    d = os.fspath(ckpt_dir)
    if iteration is not None:
        d = os.path.join(d, "release" if iteration == "release" else f"iter_{int(iteration):07d}")
    elif not any(RANK_DIR.match(n) for n in _listdir(d)):
        tracker = os.path.join(d, "latest_checkpointed_iteration.txt")
        if not os.path.isfile(tracker):
            raise MlfsError(f"{d}: neither mp_rank_* directories nor "
                            "latest_checkpointed_iteration.txt: not a Megatron checkpoint")
        with open(tracker) as f:
            text = f.read().strip()
        if text == "release":
            d = os.path.join(d, "release")
        elif text.isdigit():
            d = os.path.join(d, f"iter_{int(text):07d}")
        else:
            raise MlfsError(f"{tracker}: {text!r} is neither an iteration nor 'release'")
    files = {}
    for n in _listdir(d):
        m = RANK_DIR.match(n)
        if not m:
            continue
        if m.group(3) is not None:
            raise MlfsError(f"{d}/{n}: expert-parallel checkpoints (mp_rank_TT_PPP_EEE) "
                            "are not supported")
        key = (int(m.group(1)), int(m.group(2) or 0))
        if m.group(2) is None and any(RANK_DIR.match(x) and RANK_DIR.match(x).group(2)
                                      for x in _listdir(d)):
            raise MlfsError(f"{d}: both mp_rank_TT and mp_rank_TT_PPP directories")
        files[key] = os.path.join(d, n, FILE)
    if not files:
        raise MlfsError(f"{d}: no mp_rank_* directories")
    tp = 1 + max(t for t, _ in files)
    pp = 1 + max(p for _, p in files)
    missing = [f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "")
               for t in range(tp) for p in range(pp) if (t, p) not in files]
    if missing:
        raise MlfsError(f"{d}: missing {missing} (tp {tp}, pp {pp})")
    for f in files.values():
        if not os.path.isfile(f):
            raise MlfsError(f"{f}: no such file")
    return d, files, tp, pp


def _listdir(d):
    try:
        return sorted(os.listdir(d))
    except OSError as e:
        raise MlfsError(f"{d}: {e.strerror}") from e


def _flat(tree, prefix=""):
    """A state dict with nested dicts (legacy Megatron-LM's) flattened with dots."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _models(ck, path):
    """[flat state dict] of a rank file: "model", or "model0", "model1", ... (virtual
    pipeline stages)."""
    if not isinstance(ck, dict):
        raise MlfsError(f"{path}: not a Megatron checkpoint (a {type(ck).__name__})")
    if "model" in ck:
        return [_flat(ck["model"])]
    chunks = sorted((int(k[5:]), k) for k in ck if re.fullmatch(r"model\d+", k))
    if not chunks or [i for i, _ in chunks] != list(range(len(chunks))):
        raise MlfsError(f"{path}: no \"model\" entry (it has {sorted(ck)})")
    return [_flat(ck[k]) for _, k in chunks]


# ------------------------------------------------------------------ mapping

def _qkv_to_chunks(full, e):
    """Megatron's QKV, interleaved per query group ([G, (A/G + 2) * d, ...]), as the
    llama schema's chunks [A * d; G * d; G * d] (all q, all k, all v)."""
    q_rows, kv_rows = e["split"]["chunks"][0], e["split"]["chunks"][1]
    d = e["split"].get("unit", 1)
    groups = kv_rows // d
    per_q = q_rows // groups
    g = full.reshape(groups, per_q + 2 * d, *full.shape[1:])
    return torch.cat([g[:, :per_q].reshape(q_rows, *full.shape[1:]),
                      g[:, per_q:per_q + d].reshape(kv_rows, *full.shape[1:]),
                      g[:, per_q + d:].reshape(kv_rows, *full.shape[1:])])


def _assemble(name, kind, shards, e):
    """The full tensor @name of the schema entry @e from its TP shards (TP rank order)."""
    split = e.get("split") or {}
    chunks = split.get("chunks")
    if kind == REP:
        if any(s.shape != shards[0].shape or s.dtype != shards[0].dtype for s in shards):
            raise MlfsError(f"{name}: replicated, but its TP copies are "
                            f"{[(list(s.shape), str(s.dtype)) for s in shards]}")
        return shards[0]
    if kind == ROW:
        return torch.cat(shards, dim=1) if shards[0].dim() == 2 else torch.cat(shards)
    if kind == FC1 and chunks == 2:  # SwiGLU: each rank [gate_r; up_r]
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    full = torch.cat(shards)
    if kind == QKV and isinstance(chunks, list):
        return _qkv_to_chunks(full, e)
    if kind == VOCAB:
        return full[:e["shape"][0]]
    return full


def _stage_layers(flat):
    return sorted({int(m.group(1)) for k in flat for m in [LAYER_PREFIX.match(k)] if m})


def _gather(chunks):
    """{schema name: (kind, [TP shards], where)} from @chunks [(label, [flat dict per TP
    rank])] in global layer order; unknown names and missing shards refused."""
    out, unknown, offset = {}, [], 0
    for label, ranks in chunks:
        keys = set(ranks[0])
        for t, flat in enumerate(ranks[1:], start=1):
            if set(flat) != keys:
                raise MlfsError(f"{label}: TP rank {t} has other tensors than TP rank 0: "
                                f"{sorted(set(flat) ^ keys)[:8]}")
        layers = _stage_layers(ranks[0])
        if layers != list(range(len(layers))):
            raise MlfsError(f"{label}: layers {layers}, not 0..{len(layers) - 1}")
        for k in sorted(keys):
            if k.endswith("_extra_state"):
                continue  # Transformer Engine's FP8 metadata: no weight
            m = LAYER_PREFIX.match(k)
            if m and m.group(2) in LAYER:
                n, kind = LAYER[m.group(2)]
                n = f"layers/{offset + int(m.group(1))}/{n}"
            elif k in TOP:
                n, kind = TOP[k]
            else:
                unknown.append(f"{label}: {k}")
                continue
            shards = [flat[k] for flat in ranks]
            bad = [t for t, s in enumerate(shards) if not isinstance(s, torch.Tensor)]
            if bad:
                raise MlfsError(f"{label}: {k}: not a tensor on TP rank {bad[0]} "
                                f"({shards[bad[0]]!r})")
            if n in out:
                raise MlfsError(f"{n}: from both {out[n][2]} and {label}: {k}")
            out[n] = (kind, shards, f"{label}: {k}")
        offset += len(layers)
    if unknown:
        raise MlfsError(f"tensors with no place in the schema (qk layernorm, MoE, ... are "
                        f"not supported): {unknown[:8]}" + (" ..." if len(unknown) > 8 else ""))
    return out, offset


def _is_param(k):
    """Whether state dict key @k is a parameter mlfs maps (not _extra_state, no buffer)."""
    m = LAYER_PREFIX.match(k)
    return (m is not None and m.group(2) in LAYER) or k in TOP


def _optim_roots(mnt, optimizer):
    """{state root: Megatron's key} of the schema's optimizer roots (optim/main is the
    fp32 main copy, "main"); empty when @optimizer is False."""
    if not optimizer:
        return {}
    return {s: s[len("optim/"):] for s in mnt.schema()["states"] if s.startswith("optim/")}


def import_checkpoint(mount, ckpt_dir, iteration=None, step=None, weights_only=True,
                      cast=False, tmpdir=None, optimizer=True, every_node=False):
    """Imports the Megatron-LM checkpoint @ckpt_dir (see the module's doc) into @mount's
    current layout: every partition of this node, all or nothing, of the state "model"
    and, with @optimizer (default) when the checkpoint saved its optimizer, of the
    schema's optimizer roots (optim/exp_avg, optim/exp_avg_sq: Adam's moments;
    optim/main: the fp32 main parameters); the ranks' step becomes @step (default:
    the checkpoint's iteration). @iteration picks an iter_NNNNNNN/ directory
    ("release": release/) instead of latest_checkpointed_iteration.txt. @cast converts
    tensors of another dtype than the schema's (otherwise refused). In a job of many
    nodes, call it on every node's mount, or once with @every_node: every node imports
    its own ranks from the files written under @tmpdir, which every node must read
    (required then). Returns {"iteration", "tp", "pp", "vpp", "layers", "tensors",
    "step", "optimizer" (None, "local" or "distributed"), "states"}, and "nodes" ({id:
    "imported"}) with @every_node."""
    mnt = _mount(mount)
    _shared_tmpdir(every_node, tmpdir)
    d, files, tp, pp = find_checkpoint(ckpt_dir, iteration)
    roots = _optim_roots(mnt, optimizer)
    loaded, optim, kinds, it, args, version = {}, {}, set(), None, None, None
    for (t, p), path in sorted(files.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ck = load_rank_file(path, weights_only)
        loaded[(t, p)] = _models(ck, path)
        if args is None and isinstance(ck.get("args"), argparse.Namespace):
            args = ck["args"]
        it = ck.get("iteration", it)
        version = ck.get("checkpoint_version", version)
        if roots:
            optim[(t, p)], kind = _optim.rank_states(ck, path, loaded[(t, p)], roots,
                                                     _is_param, args, weights_only)
            kinds.add(kind)
        del ck  # the RNG and the rest go now
    if len(kinds) > 1:
        raise MlfsError(f"{d}: some ranks saved an optimizer and some did not")
    kind = kinds.pop() if kinds else None
    if isinstance(version, (int, float)) and version < 2:
        raise MlfsError(f"{d}: checkpoint_version {version}: its QKV order predates "
                        "Megatron's interleaved one; convert it with Megatron first")
    for what, got in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp)):
        want = getattr(args, what, None)
        if isinstance(want, int) and want != got:
            raise MlfsError(f"{d}: args.{what} = {want}, but the directories say {got}")
    vpp = {len(v) for v in loaded.values()}
    if len(vpp) != 1:
        raise MlfsError(f"{d}: ranks with different numbers of model chunks")
    vpp = vpp.pop()

    def chunks_of(per_rank):
        return [(f"{os.path.basename(os.path.dirname(files[(0, p)]))}"
                 + (f" model{v}" if vpp > 1 else ""), [per_rank[(t, p)][v] for t in range(tp)])
                for v in range(vpp) for p in range(pp)]
    got, nlayers = _gather(chunks_of(loaded))
    schema_layers = mnt.schema()["num_layers"]
    if nlayers != schema_layers:
        raise MlfsError(f"{d}: {nlayers} layers in the checkpoint, {schema_layers} in the schema")
    untied = bool(getattr(args, "untie_embeddings_and_output_weights", False))
    states = {"model": _entries(d, mnt.tensors("model"), got, untied, cast)}
    if kind is not None:
        for root in roots:
            per_rank = {tp_pp: o[root] for tp_pp, o in optim.items()}
            states[root] = _entries(d, mnt.tensors(root), _gather(chunks_of(per_rank))[0],
                                    untied, cast)
    if step is None:
        step = it if isinstance(it, int) else 0
    tmp = tempfile.mkdtemp(prefix="mlfs-megatron-", dir=tmpdir)
    try:
        for state, entries in states.items():
            path = os.path.join(tmp, state + ".safetensors")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                _st.write(path, entries)
            except ValueError as e:
                raise MlfsError(f"{d}: {state}: {e}") from e
        del loaded, optim
        reply = mnt.import_from(tmp, state="model" if len(states) == 1 else None, step=step,
                                every_node=every_node)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = {"iteration": it, "tp": tp, "pp": pp, "vpp": vpp, "layers": nlayers,
           "tensors": len(states["model"]), "step": step, "optimizer": kind,
           "states": sorted(states)}
    if every_node:
        out["nodes"] = reply.get("nodes", {})
    return out


def _entries(d, tensors, got, untied_ckpt, cast):
    """[safetensors entry] of one state from @got {schema name: (kind, shards, where)},
    in the schema's order (@tensors: mnt.tensors(state))."""
    got = dict(got)
    entries, missing = [], []
    for e in tensors:
        n = e["name"]
        if e.get("tied"):
            got.pop(n, None)  # a copy of its target, which the tie holds
            continue
        if n not in got:
            emb = "embedding/word_embeddings/weight"
            if n == "output_layer/weight" and emb in got and not untied_ckpt:
                got[n] = got[emb]  # a checkpoint with tied embeddings and pp = 1
            else:
                missing.append(n)
                continue
        entries.append((n, e["dtype"], tuple(e["shape"]), _producer(n, got.pop(n), e, cast)))
    if missing:
        raise MlfsError(f"{d}: no tensor for {missing[:8]}" + (" ..." if len(missing) > 8 else ""))
    if got:
        raise MlfsError(f"{d}: tensors the schema does not have: "
                        f"{sorted(w for _, _, w in got.values())[:8]}")
    return entries


def _producer(name, found, e, cast):
    kind, shards, where = found

    def produce():
        full = _assemble(name, kind, shards, e)
        if list(full.shape) != list(e["shape"]):
            raise MlfsError(f"{where}: {name} is {list(full.shape)} put together from "
                            f"{len(shards)} TP shards ({kind}), the schema's "
                            f"{list(e['shape'])}")
        if schema_dtype(full) != e["dtype"]:
            if not cast:
                raise MlfsError(f"{where}: {name} is {schema_dtype(full)}, the schema's "
                                f"{e['dtype']} (cast=True converts it)")
            full = full.to(getattr(torch, e["dtype"]))
        return _bytes(full)
    return produce


def export_checkpoint(mount, out_dir, tp, pp, vpp=1, iteration=None, optimizer=True):
    """Writes @mount's state as a Megatron-LM checkpoint for @tp, @pp (and @vpp virtual
    stages) under @out_dir: iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt, then
    latest_checkpointed_iteration.txt; NNNNNNN is @iteration (default: rank 0's saved
    step). Read from the mount's full tensors (full/<state>/<tensor>.npy, assembled
    from every node), Megatron-Core's names, each TP rank's shard cut as Megatron cuts
    it (the per-rank QKV the contiguous block of its query groups; the padded
    vocabulary's extra rows zero). With @optimizer (default) and the schema's
    optim/exp_avg and optim/exp_avg_sq, each file also holds the non-distributed
    optimizer's state (fp32 main params from optim/main where the schema has it, else
    the weights in fp32). Returns {"iteration", "tp", "pp", "vpp", "dir", "states",
    "optimizer"}. docs/formats.md#export-to-megatron-lm says what is not written."""
    from ._megatron_export import export_checkpoint as export
    return export(mount, out_dir, tp, pp, vpp, iteration, optimizer)
