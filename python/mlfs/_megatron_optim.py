"""Megatron-LM's optimizer states per rank, as {state root: [flat dict per model chunk]}
with the model's own keys, so that mlfs.megatron puts them together like the weights.

What Megatron-LM saves (`--ckpt-format torch`), read from its source
(NVIDIA/Megatron-LM, megatron/core/optimizer/optimizer.py,
megatron/core/optimizer/distrib_optimizer.py, megatron/core/optimizer/__init__.py,
megatron/core/distributed/distributed_data_parallel.py and param_and_grad_buffer.py):

- Non-distributed optimizer: model_optim_rng.pt["optimizer"] is
  Float16OptimizerWithFloat16Params.state_dict() (bf16/fp16 models):
  {"optimizer": torch optimizer state_dict {"state": {index: {"exp_avg",
  "exp_avg_sq", ...}}, "param_groups": [{"params": [index, ...], "wd_mult", ...}]},
  "grad_scaler": ..., "fp32_from_fp16_params": [[fp32 main copy of each 16-bit
  param of group g, in the group's order]]}; or FP32Optimizer.state_dict() (fp32
  models): the torch state_dict itself. A ChainedOptimizer of one optimizer saves that
  one's (a list of several is refused). The param groups come from
  _get_param_groups: every parameter of every model chunk in named_parameters order,
  grouped by its overrides, a bias or a 1-D tensor taking wd_mult 0 (no weight
  decay). The order of groups has changed between versions, so each saved group is
  matched by its "wd_mult" (0: the no-decay parameters, 1: the others) and its
  members are the model's parameters of that kind in the state dict's order (a
  module's state dict and named_parameters walk the modules alike).
- Distributed optimizer: distrib_optim.pt beside model_optim_rng.pt, written by
  DistributedOptimizer.save_parameter_state on DP rank 0 (get_parameter_state_dp_zero):
  {"buckets_coalesced": True, gbuf index: {(param dtype, grad dtype): {"param",
  "exp_avg", "exp_avg_sq": fp32 [numel_unpadded], "numel_unpadded": n}}}, one grad
  buffer per model chunk (per dtype); the gathered world tensor is the buffer with
  the padding between buckets removed. _ParamAndGradBuffer lays a buffer out from
  its parameters in REVERSE named_parameters order, each starting at a multiple of
  64 elements. Only a buffer of ONE bucket is read: a buffer splits into buckets
  with --overlap-grad-reduce (bucket_size) or around a shared embedding (tied
  embeddings with pp > 1), and those are refused.
"""
import os

import torch

from .client import MlfsError

DISTRIB = "distrib_optim.pt"


def _no_decay(key, t):
    """Megatron's default: biases and 1-D parameters get no weight decay."""
    return key.endswith(".bias") or t.dim() == 1


def _params(chunks, is_param):
    """[(chunk index, key, tensor)] of the model's parameters, named_parameters order."""
    return [(v, k, t) for v, flat in enumerate(chunks) for k, t in flat.items()
            if is_param(k) and isinstance(t, torch.Tensor)]


def _torch_optimizer(opt, path):
    """(torch optimizer state_dict, fp32 main copies per group or None) of @opt."""
    if isinstance(opt, list):
        if len(opt) != 1:
            raise MlfsError(f"{path}: a chained optimizer of {len(opt)} optimizers (expert "
                            "parallelism, or one per model chunk) is not supported")
        opt = opt[0]
    if not isinstance(opt, dict):
        raise MlfsError(f"{path}: \"optimizer\" is a {type(opt).__name__}, not a state dict")
    if "param_state" in opt or "param_state_sharding_type" in opt:
        raise MlfsError(f"{path}: a distributed optimizer's sharded state "
                        f"({opt.get('param_state_sharding_type')!r}) belongs to torch_dist "
                        "checkpoints, which are not supported")
    if "optimizer" in opt:
        return opt["optimizer"], opt.get("fp32_from_fp16_params", opt.get("fp32_from_fp16"))
    return opt, None


def _group_members(groups, params, path):
    """[[(chunk, key, tensor)] of each saved param group], matched by wd_mult."""
    out = []
    seen = set()
    for g, group in enumerate(groups):
        wd = group.get("wd_mult")
        if wd not in (0.0, 1.0) or group.get("is_expert_parallel") or wd in seen:
            raise MlfsError(f"{path}: param group {g} (wd_mult {wd!r}, lr_mult "
                            f"{group.get('lr_mult')!r}): only Megatron's default groups "
                            "(weight decay or not, one each, no expert parallelism) are "
                            "supported")
        seen.add(wd)
        members = [p for p in params if _no_decay(p[1], p[2]) == (wd == 0.0)]
        if len(members) != len(group["params"]):
            raise MlfsError(f"{path}: param group {g} has {len(group['params'])} parameters, "
                            f"the model's {'no-decay' if wd == 0.0 else 'decayed'} ones "
                            f"are {len(members)}")
        out.append(members)
    if sum(map(len, out)) != len(params):
        raise MlfsError(f"{path}: the optimizer's groups hold {sum(map(len, out))} parameters, "
                        f"the model has {len(params)}")
    return out


def _local(ck, chunks, keys, is_param, path):
    """{root: [flat dict per chunk]} from the non-distributed optimizer in @ck."""
    sd, mains = _torch_optimizer(ck["optimizer"], path)
    state, groups = sd.get("state"), sd.get("param_groups")
    if not isinstance(state, dict) or not isinstance(groups, list):
        raise MlfsError(f"{path}: the optimizer's state dict has no \"state\" and "
                        "\"param_groups\"")
    members = _group_members(groups, _params(chunks, is_param), path)
    out = {root: [{} for _ in chunks] for root in keys}
    for g, (group, ps) in enumerate(zip(groups, members)):
        half = 0
        for idx, (v, k, t) in zip(group["params"], ps):
            st = state.get(idx, {})
            for root, key in keys.items():
                if key == "main":
                    if t.dtype in (torch.float16, torch.bfloat16):
                        if mains is None:
                            raise MlfsError(f"{path}: {k} is {t.dtype}, but the optimizer "
                                            "keeps no fp32_from_fp16_params")
                        x = mains[g][half]
                    else:
                        x = t
                elif key in st:
                    x = st[key]
                elif st:
                    raise MlfsError(f"{path}: the optimizer's state of {k} has no {key!r} "
                                    f"(it has {sorted(st)})")
                else:
                    x = torch.zeros(t.shape, dtype=torch.float32)  # never stepped
                if not isinstance(x, torch.Tensor) or x.shape != t.shape:
                    raise MlfsError(f"{path}: the optimizer's {key} for {k} (index {idx}) is "
                                    f"{list(getattr(x, 'shape', []))}, the parameter "
                                    f"{list(t.shape)}: the parameter order is not the "
                                    "model's")
                out[root][v][k] = x
            half += t.dtype in (torch.float16, torch.bfloat16)
    return out


def _pad64(n):
    return -(-n // 64) * 64


def _distributed(dpath, chunks, keys, is_param, args, weights_only):
    """{root: [flat dict per chunk]} from distrib_optim.pt at @dpath."""
    from .megatron import load_rank_file
    st = load_rank_file(dpath, weights_only)
    if isinstance(st, list):
        if len(st) != 1:
            raise MlfsError(f"{dpath}: the states of {len(st)} chained optimizers are not "
                            "supported")
        st = st[0]
    if not isinstance(st, dict) or not st.get("buckets_coalesced"):
        raise MlfsError(f"{dpath}: not the coalesced layout (\"buckets_coalesced\": True); "
                        "the older per-bucket files are not supported")
    if getattr(args, "overlap_grad_reduce", False):
        raise MlfsError(f"{dpath}: written with --overlap-grad-reduce: its buffers may be cut "
                        "into buckets, whose layout is not supported")
    if getattr(args, "pipeline_model_parallel_size", 1) > 1 and \
            not getattr(args, "untie_embeddings_and_output_weights", True):
        raise MlfsError(f"{dpath}: tied embeddings with pp > 1 put the shared embedding in a "
                        "bucket of its own, a layout that is not supported")
    out = {root: [{} for _ in chunks] for root in keys}
    for v, flat in enumerate(chunks):
        buf = st.get(v)
        if not isinstance(buf, dict) or len(buf) != 1:
            raise MlfsError(f"{dpath}: grad buffer {v} (of model chunk {v}): "
                            f"{'missing' if buf is None else 'several dtypes'}; one buffer "
                            "of one dtype per model chunk is supported")
        (dtypes, world), = buf.items()
        ps = [(k, t) for k, t in flat.items() if is_param(k) and isinstance(t, torch.Tensor)]
        other = sorted({str(t.dtype) for _, t in ps if t.dtype != dtypes[0]})
        if other:
            raise MlfsError(f"{dpath}: buffer {v} is of {dtypes[0]}, model chunk {v} has "
                            f"parameters of {other}: one buffer per dtype is not supported")
        off, place = 0, {}
        for k, t in reversed(ps):
            off = _pad64(off)
            place[k] = off
            off += t.numel()
        if world.get("numel_unpadded") != off:
            raise MlfsError(f"{dpath}: buffer {v} holds {world.get('numel_unpadded')} "
                            f"elements, the model chunk's parameters laid out in one bucket "
                            f"{off}: another layout (buckets?), not supported")
        for root, key in keys.items():
            src = world.get("param" if key == "main" else key)
            if not isinstance(src, torch.Tensor) or src.numel() != off:
                raise MlfsError(f"{dpath}: buffer {v} has no {key!r} of {off} elements")
            for k, t in ps:
                out[root][v][k] = src[place[k]:place[k] + t.numel()].view(t.shape)
    return out


def rank_states(ck, rank_file, chunks, keys, is_param, args, weights_only=True):
    """The optimizer states of one rank: {state root: [flat dict per model chunk]} for
    @keys {root: key} ("exp_avg", "exp_avg_sq", "main"), keyed as the model's flat dicts
    @chunks (parameters where @is_param(key)), and which optimizer saved them
    ("distributed" or "local"); (None, None) when the rank saved no optimizer. From
    distrib_optim.pt beside @rank_file when it exists (loaded as load_rank_file does,
    with @weights_only), else ck["optimizer"]. MlfsError names what does not fit."""
    dpath = os.path.join(os.path.dirname(rank_file), DISTRIB)
    if os.path.isfile(dpath):
        return _distributed(dpath, chunks, keys, is_param, args, weights_only), "distributed"
    if not isinstance(ck.get("optimizer"), (dict, list)):
        return None, None
    return _local(ck, chunks, keys, is_param, rank_file), "local"
