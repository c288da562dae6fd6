"""The first client module, now the package python/mlfs (`import mlfs`): this
shim keeps `import mlfs_client` working for scripts that still use it."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
from mlfs import MlfsError, Mount, Rank, read_npy  # noqa: E402,F401


def __getattr__(name):
    """to_torch and from_torch, from mlfs.torch (imports PyTorch) when first used."""
    import mlfs
    return getattr(mlfs, name)


__all__ = ["Mount", "Rank", "MlfsError", "read_npy"]  # and to_torch, from_torch
