#!/usr/bin/python3
"""Checksum cost on a reconfiguration (issue 18): the same reconfiguration of the same
model on 4 local daemons and one etcd, with checksums (every new partition sealed with
its XXH3 in the build, every /v1/part reply carrying the XXH3 of its bytes, verified by
the receiver as they arrive) and without (the daemons run with MLFS_BENCH_NOSUM=1, a
switch of this benchmark only), one cluster after the other in the same run. Each
reconfiguration is timed end to end with `mlfs reconfigure` (best of --reps; the layout
moves back, untimed, between runs) and checked bit-exact against NumPy; the daemons'
own build time and its checksum phase come from status.json ("last": seconds,
seconds_sum, bytes_summed). The hash's throughput against memcpy is
$BUILD/tests/bench_sum's.

Usage: bench_sum.py [--size-mib N] [--reps N]
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))

from bench_cluster import (DEVICES, N4, check, check_layout, fmt_bytes,  # noqa: E402
                           log, pick_schema, save_step, state_bytes)
from conftest import MLFS  # noqa: E402  (and python/ on sys.path)
from mlfs.testing import Cluster, Etcd  # noqa: E402
from test_store import make_full  # noqa: E402

START = {"tp": 2, "pp": 2, "dp": 2, "nodes": N4}
CASES = [("TP change", {"tp": 4, "pp": 2, "dp": 1, "nodes": N4}),
         ("4-to-2 nodes", {"tp": 2, "pp": 2, "dp": 1, "nodes": ["n2", "n3"]})]


def measure(tmp, schema, full, nosum, reps):
    env = {"MLFS_BENCH_NOSUM": "1"} if nosum else {}
    etcd = Etcd(tmp).start()
    cl = Cluster(tmp, etcd, 4, DEVICES, "sum", [], {n: env for n in N4}, mlfs=MLFS)
    out = {}
    try:
        for n in cl.spec["nodes"]:
            cl.mount(n["id"])
        cl.wait_registered()
        cur, step = dict(START, version=1), 100
        cl.start_job(schema, cur, on="n0", full=full, step=step)
        for name, to in CASES:
            back = {k: cur[k] for k in ("tp", "pp", "dp", "nodes")}
            runs = []
            for rep in range(reps):
                for target, timed in ((to, True), (back, False)):
                    step += 1
                    save_step(cl, cur, step)
                    cur = dict(target, version=cur["version"] + 1)
                    t0 = time.perf_counter()
                    p = cl.reconfigure("n0", cur, timeout=600)
                    wall = time.perf_counter() - t0
                    check(p.returncode == 0, f"{name}: {p.stderr}\n{cl.describe()}")
                    sts = cl.wait_version(cur["version"], timeout=120)
                    if timed:
                        check_layout(cl, schema, cur, full)
                        last = [s.get("last") or {} for s in sts.values()]
                        runs.append({
                            "wall_s": wall,
                            "daemon_s": max(ls.get("seconds", 0) for ls in last),
                            "sum_s": max(ls.get("seconds_sum", 0) for ls in last),
                            "summed": sum(ls.get("bytes_summed", 0) for ls in last),
                            "fetched": sum(ls.get("bytes_fetched", 0) for ls in last)})
            out[name] = min(runs, key=lambda r: r["wall_s"])
            out[name]["runs"] = [r["wall_s"] for r in runs]
    finally:
        cl.teardown()
        etcd.kill()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1500)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    schema = pick_schema(args.size_mib)
    full = make_full(schema, np.random.default_rng(18))
    log(f"== checksum cost on a reconfiguration: {fmt_bytes(state_bytes(schema))} of "
        f"state on 4 daemons, start tp2 pp2 dp2; best of {args.reps}")
    with tempfile.TemporaryDirectory(prefix="bench-sum-") as tmp:
        res = {}
        for nosum in (False, True):
            sub = os.path.join(tmp, "nosum" if nosum else "sum")
            os.mkdir(sub)
            import pathlib
            res[nosum] = measure(pathlib.Path(sub), schema, full, nosum, args.reps)
    for name, _ in CASES:
        a, b = res[False][name], res[True][name]
        log(f"   {name}: with checksums {a['wall_s']:.3f} s (daemon build {a['daemon_s']:.3f}"
            f" s, of which sealing {a['sum_s']:.3f} s for {fmt_bytes(a['summed'])}; fetched "
            f"{fmt_bytes(a['fetched'])}; runs {', '.join(f'{x:.3f}' for x in a['runs'])}), "
            f"without {b['wall_s']:.3f} s (daemon build {b['daemon_s']:.3f} s; runs "
            f"{', '.join(f'{x:.3f}' for x in b['runs'])}): "
            f"{100 * (a['wall_s'] / b['wall_s'] - 1):+.1f}% end to end, "
            f"{100 * (a['daemon_s'] / b['daemon_s'] - 1):+.1f}% daemon build")


if __name__ == "__main__":
    main()
