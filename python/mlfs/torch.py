"""PyTorch on a rank's partitions: a model and its optimizer in, and saved out.

    me = mlfs.Mount("/mnt/mlfs").rank(int(os.environ["RANK"]))
    model = build_stage(me)                      # this rank's slice of the model
    opt = torch.optim.Adam(model.parameters())
    me.load_into(model, opt, names=lambda n: n.replace(".", "/"))
    ...                                          # train
    me.save(model, opt, step)                    # every partition, then `step`

What goes where, for the schema tensor `n` of a parameter `p`:
  model/n          p, in the partition's dtype (bfloat16 as its raw <u2 bits)
  optim/<key>/n    optimizer.state[q][<key>] for every state root optim/<key> of
                   the schema but optim/main (Adam: exp_avg, exp_avg_sq), where
                   q is the optimizer's tensor for p: p itself, or its fp32 main
                   copy when the optimizer keeps one
  optim/main/n     that fp32 main copy (when the schema has the root and the
                   optimizer none, p itself, so the root always holds a state)

The optimizer keeps main params when its parameters are not the model's
but one copy of each, in model.parameters() order (what mixed-precision
wrappers build: [p.detach().float() for p in model.parameters()]).

@names maps the model's parameter names to schema names: None (dots become
slashes: "layers.0.attn.qkv.weight" is "layers/0/attn/qkv/weight"), a dict
(a name it does not hold gets the default) or a callable; a name mapped to
None is not a partition (left alone). With @strict, every parameter mapped
must be a partition of the rank and every model partition of the rank a
parameter: a save that left one out would promise a step it did not save.

Whole state dicts of full tensors go in and out of the mount's current layout:
import_state_dict(mount, state_dict_or_path, names=..., state=, step=) through the
daemon's import, and export_state_dict(mount, state=, names=...) from the live view
full/<state>.safetensors (names: None, a dict, a callable, "hf" or a name map;
docs/formats.md).

This module imports torch; `import mlfs` does not import it.
"""
import collections
import errno
import json
import os
import shutil
import subprocess
import tempfile

import numpy as np
import torch

from . import _st
from .client import MlfsError, read_npy

MODEL = "model"
OPTIM = "optim/"
MAIN = "optim/main"

# True dtypes (user.mlfs.dtype) stored as another NumPy dtype.
_STORED = {"bfloat16": np.dtype("<u2"), "float8_e4m3fn": np.dtype("u1"),
           "float8_e5m2": np.dtype("u1")}


def to_torch(arr, true_dtype=None):
    """A NumPy array from a partition as a torch tensor sharing its memory
    (bfloat16 reinterpreted from its <u2 storage)."""
    if true_dtype == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    if true_dtype in _STORED:
        raise MlfsError(f"{true_dtype}: this PyTorch has no such dtype; read it with NumPy")
    return torch.from_numpy(arr)


def from_torch(t):
    """A torch tensor as the NumPy array that mlfs stores (bfloat16 as <u2)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view("<u2")
    return t.numpy()


def torch_dtype(true_dtype):
    """The torch dtype of a partition's true dtype ("bfloat16" -> torch.bfloat16)."""
    dt = getattr(torch, true_dtype, None)
    if not isinstance(dt, torch.dtype):
        raise MlfsError(f"{true_dtype}: this PyTorch has no such dtype")
    return dt


def default_name(param):
    """The schema name of a parameter by default: its dotted path with slashes."""
    return param.replace(".", "/")


def mapper(names):
    """@names (None, a dict or a callable) as a function of the parameter name."""
    if names is None:
        return default_name
    if isinstance(names, dict):
        return lambda n: names[n] if n in names else default_name(n)
    if callable(names):
        return names
    raise TypeError(f"names: a dict or a callable, not {type(names).__name__}")


def params(rank, model, names, strict):
    """[(schema name, parameter)] of @model's parameters that @names maps to a tensor;
    with @strict, checked against the rank's model partitions both ways."""
    to = mapper(names)
    pairs = [(to(n), p) for n, p in model.named_parameters()]
    pairs = [(s, p) for s, p in pairs if s is not None]
    twice = sorted(s for s, k in collections.Counter(s for s, _ in pairs).items() if k > 1)
    if twice:
        raise MlfsError(f"names= maps two parameters to each of {twice}")
    if strict:
        have, want = {s for s, _ in pairs}, set(rank.tensor_names(MODEL))
        if have - want or want - have:
            raise MlfsError(f"rank {rank.rank}: parameters that are no partition of it: "
                            f"{sorted(have - want) or 'none'}; partitions of it that no "
                            f"parameter maps to: {sorted(want - have) or 'none'} "
                            "(names= maps parameter names to schema names)")
    return pairs


def opt_params(model, optimizer, pairs):
    """({schema name: the optimizer's tensor for it, or None when the optimizer does not
    train it}, whether those are main copies rather than the parameters)."""
    ops = [q for g in optimizer.param_groups for q in g["params"]]
    ids = {id(q) for q in ops}
    mps = list(model.parameters())
    if any(id(p) in ids for p in mps):
        return {n: (p if id(p) in ids else None) for n, p in pairs}, False
    if len(ops) != len(mps) or any(q.shape != p.shape for q, p in zip(ops, mps)):
        raise MlfsError("the optimizer's parameters are neither the model's nor one main copy "
                        "of each, in model.parameters() order")
    main = {id(p): q for p, q in zip(mps, ops)}
    return {n: main[id(p)] for n, p in pairs}, True


def optim_keys(rank):
    """{state root: optimizer state key} of the schema's optim/<key> roots but optim/main."""
    return {s: s[len(OPTIM):] for s in rank.states() if s.startswith(OPTIM) and s != MAIN}


def read(rank, state, name, like):
    """Partition @state/@name as a tensor of @like's dtype and device, read into memory
    (not mapped: optimizer state outlives the open file); its shape must be @like's."""
    t = rank.load(state, name, mapped=False)
    if t.shape != like.shape:
        raise MlfsError(f"{rank.where(state, name)}: the partition is {list(t.shape)}, the "
                        f"tensor {list(like.shape)} (a model built for another layout?)")
    return t.to(dtype=like.dtype, device=like.device)


def load_into(rank, model, optimizer=None, names=None, strict=True):
    """Loads @rank's partitions into @model's parameters and, with @optimizer, its main
    params and state (every optim/<key> root; Adam's "step" count is the rank's saved
    step). Returns the saved step: the next step to train."""
    pairs = params(rank, model, names, strict)
    step = rank.saved_step()
    with torch.no_grad():
        for n, p in pairs:
            p.copy_(read(rank, MODEL, n, p))
        if optimizer is not None:
            load_optimizer(rank, model, optimizer, pairs, step)
    return step


def load_optimizer(rank, model, optimizer, pairs, step):
    opt, main = opt_params(model, optimizer, pairs)
    if main and MAIN not in rank.states():
        raise MlfsError(f"the optimizer keeps main params: the schema needs a state root {MAIN}")
    keys = optim_keys(rank)
    group = {id(q): g for g in optimizer.param_groups for q in g["params"]}
    for n, _ in pairs:
        q = opt[n]
        if q is None:
            continue
        if main:
            q.copy_(read(rank, MAIN, n, q))
        st = optimizer.state[q]
        for root, key in keys.items():
            st[key] = read(rank, root, n, q)
        if keys:  # Adam and kin: the bias correction's count, as the optimizer keeps it
            g = group[id(q)]
            on_device = g.get("capturable") or g.get("fused")
            st["step"] = torch.tensor(float(step), dtype=torch.float32,
                                      device=q.device if on_device else "cpu")


def save(rank, model, optimizer, step, names=None, strict=True, wait=None):
    """Saves @model and @optimizer into @rank's partitions (every root of the schema:
    model, optim/<key>, optim/main), each close checked, then `step` = @step. A
    refusal raises MlfsError with status.json's reason (EINVAL for a wrong shape);
    `step` is then not written. A write refused with EBUSY (a reconfiguration is
    preparing) waits up to @wait seconds (default rank.busy_wait, 60) for it to end:
    aborted, the save goes on; committed, MlfsError (ESTALE): this rank's layout is
    gone and the save is lost."""
    if step is None:
        raise TypeError("save(model, optimizer, step): the step is required")
    pairs = params(rank, model, names, strict)
    writes = {MODEL: dict(pairs)}
    if optimizer is not None:
        writes.update(optimizer_tensors(rank, model, optimizer, pairs))
    missing = [s for s in rank.states() if s not in writes]
    if missing and strict:
        raise MlfsError(f"rank {rank.rank}: no tensors for the state roots {missing} "
                        "(an optimizer, or strict=False)")
    for state, tensors in writes.items():
        for n, t in tensors.items():
            write(rank, state, n, t, wait)
    rank.mark_step(step, wait=wait)


def optimizer_tensors(rank, model, optimizer, pairs):
    """{state root: {schema name: tensor}} of the optimizer's part of a save."""
    opt, main = opt_params(model, optimizer, pairs)
    states = rank.states()
    if main and MAIN not in states:
        raise MlfsError(f"the optimizer keeps main params: the schema needs a state root {MAIN}")
    out = {}
    for root, key in optim_keys(rank).items():
        out[root] = {n: moment(optimizer, opt[n], key, p, n) for n, p in pairs}
    if MAIN in states:
        out[MAIN] = {n: (opt[n] if main else p) for n, p in pairs}
    return out


def moment(optimizer, q, key, p, name):
    """optimizer.state[q][key]; zeros before the optimizer's first step (or for a
    parameter it does not train), which is what the optimizer would start from."""
    st = optimizer.state.get(q) if q is not None else None
    if not st:
        return torch.zeros_like(p)
    if key not in st:
        raise MlfsError(f"{name}: the optimizer's state has no {key!r} (it has "
                        f"{sorted(st)}); the schema's roots are optim/<key>")
    return st[key]


def write(rank, state, name, t, wait=None):
    """One partition from tensor @t, converted to the partition's true dtype."""
    want = torch_dtype(rank.dtype(state, name))
    if t.dtype != want:
        t = t.detach().to(want)
    rank.save_tensor(state, name, t, wait=wait)


# ------------------------------------------------------------ whole state dicts

def _mount(mount):
    from .client import Mount
    return mount if isinstance(mount, Mount) else Mount(mount)


def schema_dtype(t):
    """The schema dtype name of torch tensor @t ("bfloat16" for torch.bfloat16)."""
    name = str(t.dtype).replace("torch.", "")
    if name not in _st.BY_SCHEMA:
        raise MlfsError(f"{t.dtype}: no such dtype in mlfs (it has {sorted(_st.BY_SCHEMA)})")
    return name


def _bytes(t):
    """Tensor @t's bytes as the NumPy array mlfs stores (bfloat16 as <u2, fp8 as u1)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view("<u2")
    if t.dtype in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)):
        return t.view(torch.uint8).numpy()
    return t.numpy()


def _entry(name, t):
    return (name, schema_dtype(t), tuple(t.shape), lambda: _bytes(t))


def load_file(path, weights_only=True):
    """A state dict torch.save'd at @path, on the CPU (torch.load with @weights_only)."""
    try:
        return torch.load(os.fspath(path), map_location="cpu", weights_only=weights_only)
    except Exception as e:  # pickle's refusals have no common base
        raise MlfsError(f"{path}: torch.load(weights_only={weights_only}): {e}") from e


def _is_map_file(names):
    return isinstance(names, dict) and isinstance(names.get("tensors"), dict)


def import_state_dict(mount, state_dict, names=None, state="model", step=None,
                      tmpdir=None, weights_only=True, every_node=False):
    """Imports a state dict of FULL tensors into @mount's current layout: every
    partition of @state on this node (every local rank's), all or nothing, as the saved
    state of @step (default 0), through the daemon's import (`mlfs import` of one
    safetensors file written to a temporary directory under @tmpdir, removed after).
    dtypes are kept: a tensor must have the schema's dtype (bfloat16 as
    torch.bfloat16) and shape, or the import is refused naming it; so must every
    tensor of the state be there (tied tensors excepted).

    @state_dict: {key: tensor}, or the path of a torch.save'd one (loaded with
    @weights_only). @names maps keys to schema names:
      None       dots to slashes ("layers.0.fc.weight" is "layers/0/fc/weight")
      a dict     {key: schema name}; keys it lacks get the default; None: left out
      a callable key -> schema name (None: left out)
      "hf"       Hugging Face names (`mlfs import --names hf`: Llama or GPT-2, fused
                 q/k/v and gate/up assembled by the daemon; docs/formats.md)
      {"tensors": {...}, "ignore": [...]}: a name map, as `mlfs import --map` reads it
    A key mapped to a tied tensor (output_layer/weight tied to the embedding) is left
    out if it equals its target (the tie holds it), refused otherwise. With @every_node,
    every node of a job of many nodes imports it into its own ranks (`mlfs import
    --every-node`): the file is then written under @tmpdir, which every node must read
    (shared storage), and @tmpdir is required. Returns the daemon's reply."""
    mnt = _mount(mount)
    _shared_tmpdir(every_node, tmpdir)
    if isinstance(state_dict, (str, os.PathLike)):
        state_dict = load_file(state_dict, weights_only)
    if not hasattr(state_dict, "items"):
        raise MlfsError(f"state_dict: a mapping of tensors, not {type(state_dict).__name__}")
    req = {}
    if names == "hf" or _is_map_file(names):
        entries = []
        for k, t in state_dict.items():
            if not isinstance(t, torch.Tensor):
                raise MlfsError(f"state_dict[{k!r}]: not a tensor ({type(t).__name__})")
            entries.append(_entry(k, t))
        if names == "hf":
            req["names"] = "hf"
    elif isinstance(names, str):
        raise MlfsError(f"names={names!r}: a dict, a callable, 'hf' or a name map")
    else:
        entries = _schema_entries(mnt, state, state_dict, mapper(names))
    tmp = tempfile.mkdtemp(prefix="mlfs-import-", dir=tmpdir)
    try:
        path = os.path.join(tmp, state + ".safetensors")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _st.write(path, entries)
        if _is_map_file(names):
            req["map"] = os.path.join(tmp, "names.json")
            with open(req["map"], "w") as f:
                json.dump(names, f)
        return mnt.import_from(tmp, state=state, step=step, every_node=every_node, **req)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _shared_tmpdir(every_node, tmpdir):
    """A job-wide import reads a file every node sees: the caller names where."""
    if every_node and tmpdir is None:
        raise MlfsError("every_node=True: give tmpdir, a directory every node of the job "
                        "reads (shared storage); the file to import is written there")


def _schema_entries(mnt, state, state_dict, to):
    """[safetensors entry] of @state_dict's tensors under schema names (@to maps keys),
    in the schema's order, tied tensors left out once checked against their targets."""
    by_name, src = {}, {}
    for k, t in state_dict.items():
        n = to(k)
        if n is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise MlfsError(f"state_dict[{k!r}]: not a tensor ({type(t).__name__}); "
                            "names= may map it to None")
        if n in by_name:
            raise MlfsError(f"names= maps both {src[n]!r} and {k!r} to {n!r}")
        by_name[n], src[n] = t, k
    order = {}
    for e in mnt.tensors(state):
        order[e["name"]] = len(order)
        if e.get("tied") and e["name"] in by_name:
            t, target = by_name.pop(e["name"]), by_name.get(e["tied"])
            if target is not None and not (t.dtype == target.dtype and t.shape == target.shape
                                           and torch.equal(t, target)):
                raise MlfsError(f"{src[e['name']]!r} ({e['name']}) is tied to {e['tied']} "
                                "in the schema, but differs from it")
    names = sorted(by_name, key=lambda n: (order.get(n, len(order)), n))
    return [_entry(n, by_name[n]) for n in names]


def _alloc(name, dtype, shape):
    t = torch.empty(shape, dtype=torch_dtype(dtype))
    return t, t.reshape(-1).view(torch.uint8).numpy()


def _read_state(base):
    """{name: tensor} of the safetensors state at @base (+ .safetensors, or
    .safetensors.index.json and its shards beside it), each file with one open."""
    index = base + ".safetensors.index.json"
    if os.path.exists(index):
        with open(index, "rb") as f:
            files = sorted(set(json.loads(f.read())["weight_map"].values()))
        out = {}
        for fn in files:
            out.update(_st.read(os.path.join(os.path.dirname(base), fn), _alloc))
        return out
    return _st.read(base + ".safetensors", _alloc)


def export_state_dict(mount, state="model", names=None, tmpdir=None):
    """The FULL tensors of @state on @mount as a state dict {key: tensor} (CPU, the
    schema's dtypes: bfloat16 as torch.bfloat16), read from the live view
    full/<state>.safetensors (one open per file: one version of the state; where
    that view answers EIO, because parts are on other nodes, from
    full/<state>/<tensor>.npy, one open per tensor). Tied tensors are given under
    their own key too, as the same tensor as their target (as a tied PyTorch
    model's state_dict() does).

    @names gives the keys:
      None       slashes to dots ("layers/0/fc/weight" is "layers.0.fc.weight")
      a dict     {key: schema name}, as import_state_dict takes it (inverted here);
                 schema names it lacks get the default
      a callable schema name -> key (None: left out)
      "hf" or a name map {"tensors": ...}: Hugging Face names (or the map's), fused
                 tensors split back (`mlfs export --format safetensors --names hf`,
                 which runs the mlfs binary: $MLFS, the tree's build, or the PATH)"""
    mnt = _mount(mount)
    if names == "hf" or _is_map_file(names):
        return _export_named(mnt, state, names, tmpdir)
    if isinstance(names, str):
        raise MlfsError(f"names={names!r}: a dict, a callable, 'hf' or a name map")
    if isinstance(names, dict):
        inv = {}
        for k, n in names.items():
            if n is not None:
                if n in inv:
                    raise MlfsError(f"names= maps both {inv[n]!r} and {k!r} to {n!r}")
                inv[n] = k
        to = lambda n: inv[n] if n in inv else n.replace("/", ".")  # noqa: E731
    elif names is None:
        to = lambda n: n.replace("/", ".")  # noqa: E731
    elif callable(names):
        to = names
    else:
        raise TypeError(f"names: a dict or a callable, not {type(names).__name__}")
    tensors = mnt.tensors(state)
    try:
        full = _read_state(mnt.p("full", state))
    except OSError as e:
        if e.errno not in (errno.EIO, errno.ENOENT):
            raise MlfsError(f"full/{state}.safetensors: {e.strerror}", e.errno) from e
        full = {}
        for t in tensors:
            if not t.get("tied"):
                arr = read_npy(mnt.p("full", state, t["name"] + ".npy"))
                full[t["name"]] = to_torch(arr, t["dtype"]).clone()
    out = {}
    for t in tensors:
        key = to(t["name"])
        if key is None:
            continue
        src = t["tied"] if t.get("tied") else t["name"]
        if src not in full:
            raise MlfsError(f"full/{state}: no tensor {src}")
        out[key] = full[src]
    return out


def _export_named(mnt, state, names, tmpdir):
    """export_state_dict with Hugging Face names or a name map: `mlfs export`."""
    from .testing import find_mlfs
    tmp = tempfile.mkdtemp(prefix="mlfs-export-", dir=tmpdir)
    try:
        cmd = [find_mlfs(), "export", mnt.path, "--to", os.path.join(tmp, "out"),
               "--format", "safetensors"]
        if names == "hf":
            cmd += ["--names", "hf"]
        else:
            with open(os.path.join(tmp, "names.json"), "w") as f:
                json.dump(names, f)
            cmd += ["--map", os.path.join(tmp, "names.json")]
        p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise MlfsError(f"{' '.join(cmd)}: {p.stderr.strip()}")
        return _read_state(os.path.join(tmp, "out", state))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
