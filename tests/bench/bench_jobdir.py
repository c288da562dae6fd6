#!/usr/bin/python3
"""job/ directories of many files: N files created one after another in one
job/ directory of a one-node mount (a script that writes a file per step), the
time of the last 1,000 creates against the first 1,000 in the same run, then
1,000 stats of existing names. A directory searched name by name makes the
ratio grow with N (18.8x at 20,000 files before the names were indexed); an
indexed one keeps it near 1.

Usage: bench_jobdir.py [--files N]
The daemon is $BUILD/mlfs (BUILD defaults to "build", as in the Makefile).
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
from mlfs import testing  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=20000)
    a = ap.parse_args()
    if a.files < 2000:
        raise SystemExit("--files: at least 2000 (the first and the last 1,000 apart)")
    with testing.start(nnodes=1, devices=1, job="jobdir", etcd=False) as cl:
        d = os.path.join(cl.mounts["n0"], "job", "steps")
        os.mkdir(d)
        marks = []
        for i in range(a.files):
            if i % 1000 == 0:
                marks.append(time.monotonic())
            with open(os.path.join(d, f"step-{i:06d}.json"), "w") as f:
                f.write("{}")
        marks.append(time.monotonic())
        first, last = marks[1] - marks[0], marks[-1] - marks[-2]
        t = time.monotonic()
        for i in range(a.files - 1000, a.files):
            os.stat(os.path.join(d, f"step-{i:06d}.json"))
        stat = time.monotonic() - t
        if len(os.listdir(d)) != a.files:
            raise SystemExit(f"job/steps holds {len(os.listdir(d))} names, not {a.files}")
    print(json.dumps({"files": a.files, "first_1000_creates_s": round(first, 3),
                      "last_1000_creates_s": round(last, 3),
                      "last_vs_first": round(last / first, 2),
                      "stats_1000_s": round(stat, 3)}))


if __name__ == "__main__":
    main()
