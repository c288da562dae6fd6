"""The local cluster harness, now mlfs.testing (python/mlfs/testing.py): this
shim keeps `import local_cluster` working (tests/bench/bench_control.py), with
its first behaviour: etcd even for one node."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
from mlfs import testing  # noqa: E402
from mlfs.testing import (ETCD, MLFS, ROOT, ClusterError, LocalCluster,  # noqa: E402
                          free_port, wait_for)

__all__ = ["ETCD", "MLFS", "ROOT", "ClusterError", "LocalCluster", "free_port", "start",
           "wait_for"]


def start(nnodes, devices=2, job="demo", tmp=None, mlfs=MLFS):
    """mlfs.testing.start with one etcd whatever @nnodes."""
    return testing.start(nnodes, devices, job, tmp, mlfs, etcd=True)
