"""32 daemons and one etcd (issue 17, item 6): an idle job costs etcd only the lease
keep-alives (about one request per node per second) and almost no CPU, and a
reconfiguration of a tiny model across all of them commits. The figures at 4, 16,
32 and 64 daemons are tests/bench/bench_control.py's (BENCHMARKS.md)."""
import json
import os
import sys
import time

from cluster import cluster_factory, etcd  # noqa: F401

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))
from bench_control import cpu_seconds, etcd_requests  # noqa: E402

TINY = {"model": "tiny", "num_layers": 2, "states": {"model": {}},
        "tensors": [{"name": "layers/{L}/w", "dtype": "float32", "shape": [64, 64],
                     "split": {"dim": 0}}]}


def test_32_idle_daemons_cost_only_keepalives(cluster_factory):
    n = 32
    cl = cluster_factory(nnodes=n, devices=1)
    ids = [x.id for x in cl.nodes]
    v1 = {"version": 1, "tp": 1, "pp": 1, "dp": n, "nodes": ids}
    cl.start_job(TINY, v1, "n0")
    time.sleep(2)  # the last entries published
    pids = [x.pid for x in cl.nodes] + [cl.etcd.proc.pid]
    r0, c0, t0 = etcd_requests(cl.etcd.url), cpu_seconds(pids), time.monotonic()
    time.sleep(10)
    r1, c1, dt = etcd_requests(cl.etcd.url), cpu_seconds(pids), time.monotonic() - t0
    per_s, cores = (r1 - r0) / dt, (c1 - c0) / dt
    print(f"{n} idle daemons and etcd: {cores:.4f} cores, {per_s:.1f} etcd requests/s")
    # One keep-alive per node per second (each answered as one request), and nothing
    # else: no polling.
    assert per_s <= 1.5 * n, f"{per_s:.1f} etcd requests/s from {n} idle nodes"
    assert cores < 0.05, f"{cores:.4f} cores for {n} idle daemons and etcd"

    v2 = {"version": 2, "tp": 1, "pp": 1, "dp": n // 2, "nodes": ids[:n // 2]}
    t = time.monotonic()
    p = cl.reconfigure("n0", v2)
    took = time.monotonic() - t
    assert p.returncode == 0, f"{p.stderr}\n{cl.describe()}"
    cl.wait_version(2)
    print(f"reconfiguration across {n} daemons: {took:.3f} s")
    assert all(s["version"] == 2 for s in cl.statuses().values())
    assert json.loads(cl.keys()["config"].value) == v2
