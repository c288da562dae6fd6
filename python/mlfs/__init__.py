"""mlfs: what a training script needs from an mlfs mount.

Every rank of a job opens the mount, reads where it sits in the layout,
loads its partitions, trains, and saves them back:

    import mlfs
    mnt = mlfs.Mount("/mnt/mlfs")
    me = mnt.rank(int(os.environ["RANK"]))     # ranks/<r>/rank.json
    me.t, me.p, me.d, me.layers                # its TP, PP, DP coordinates, its layers
    step = me.load_into(model, optimizer)      # its partitions; the step saved: the next
    batch, ids = me.window(step, step + 8)     # data/<s>-<e>.npy and .ids.npy
    ...
    me.save(model, optimizer, step + 8)        # every partition, then `step`

or, tensor by tensor: me.load("model", name) (a torch tensor), me.read(...)
(the NumPy array as stored), me.save_state({"model": {...}, ...}, step).
A driver changes the layout between two runs of the workers:

    mnt.reconfigure({"tp": 4, "pp": 1, "dp": 1})  # config.json with version + 1; waits
    mnt.reconfigure({"tp": 2, "pp": 2, "dp": 1, "nodes": ["n1", "n2"]})  # many nodes:
    other.wait_version(3)                         # then each node's Mount waits for it

Refusals raise MlfsError with status.json's reason. `mlfs.torch` (PyTorch,
imported on first use) maps models and optimizers to partitions, and imports and
exports whole state dicts (import_state_dict, export_state_dict);
`mlfs.megatron.import_checkpoint` imports a Megatron-LM checkpoint (mp_rank_*);
`mlfs.testing` starts etcd and daemons on this machine for examples and tests;
`mlfs.elastic` is one node's agent that restarts its workers in each layout an
elastic job's controller commits (`python3 -m mlfs.elastic --mnt M -- cmd`).
"""
import importlib

from .client import MlfsError, Mount, Rank, read_npy

__version__ = "0.1.0"
__all__ = ["Mount", "Rank", "MlfsError", "read_npy"]  # and, importing torch: to_torch, from_torch

_LAZY = {"to_torch": "torch", "from_torch": "torch"}  # names of submodules that import torch


def __getattr__(name):
    """mlfs.torch, mlfs.testing, mlfs.megatron, mlfs.to_torch, ...: imported when first used, so that
    `import mlfs` costs no `import torch`."""
    if name in ("torch", "testing", "megatron", "elastic"):
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'mlfs' has no attribute {name!r}")
