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

This module imports torch; `import mlfs` does not import it.
"""
import collections

import numpy as np
import torch

from .client import MlfsError

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


def save(rank, model, optimizer, step, names=None, strict=True):
    """Saves @model and @optimizer into @rank's partitions (every root of the schema:
    model, optim/<key>, optim/main), each close checked, then `step` = @step. A
    refusal (EBUSY during a reconfiguration, EINVAL for a wrong shape) raises
    MlfsError with status.json's reason; `step` is then not written."""
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
            write(rank, state, n, t)
    rank.mark_step(step)


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


def write(rank, state, name, t):
    """One partition from tensor @t, converted to the partition's true dtype."""
    want = torch_dtype(rank.dtype(state, name))
    if t.dtype != want:
        t = t.detach().to(want)
    rank.save_tensor(state, name, t)
