"""The worked example of docs/single-node.md (examples/elastic_demo.py, run by `make demo`)
keeps working: it mounts, imports, reconfigures, checks every partition and
the dataset views through a dp change, and exits 0."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_elastic_demo():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "elastic_demo.py")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "against NumPy slices: equal" in out.stdout
    assert "96 records in 6 steps, each once" in out.stdout
    assert "unmounted; daemon exited 0" in out.stdout


def test_cluster_demo():
    """The three-node demo (examples/cluster_demo.py, run by `make demo`): etcd, three
    daemons, a node-set change committed by one transaction, a node killed and the
    job shrunk onto its DP replicas; every export equals the checkpoint."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "cluster_demo.py")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("full tensors equal the checkpoint") == 3
    assert "served from n2's DP replicas" in out.stdout
    assert "cluster demo: every check held" in out.stdout
