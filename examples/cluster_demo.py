#!/usr/bin/python3
"""Three mlfs nodes on this machine, one etcd, one job (part of `make demo`).

Starts etcd on free ports and three daemons (n0, n1, n2, 4 devices each, each
serving its peers on its own port, with a cluster token), then:
  1. the gpt-tiny schema and a tp2 pp2 dp2 layout on n0 and n1, written on n0;
  2. a checkpoint imported on each node (each fills the partitions it hosts),
     every rank saves step 10;
  3. `mlfs reconfigure` on n2 to tp2 pp1 dp4 on n1 and n2: n0 leaves, n2 joins,
     n2 fetches its partitions from n0 and n1, one etcd transaction commits;
  4. n1 is killed (kill -9); once its lease expires, a config on n2 alone is
     served from n2's DP replicas;
and checks after each step that `mlfs export` on a node (full tensors, parts
fetched from the other nodes) equals the checkpoint. Everything started is
stopped at the end (mlfs.testing, python/mlfs); exit 0 when every check held.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))  # the mlfs package, not installed
from mlfs import testing  # noqa: E402
from mlfs.testing import MLFS, ClusterError, wait_for  # noqa: E402

SCHEMA = os.path.join(ROOT, "examples", "gpt-tiny", "schema.json")


class DemoError(ClusterError):
    pass


def check(cond, what):
    if not cond:
        raise DemoError(what)


def sh(*args, check_rc=True):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120)
    if check_rc and p.returncode != 0:
        raise DemoError(f"{' '.join(map(str, args))} failed: {p.stderr.strip()}")
    return p


def expand(schema):
    for t in schema["tensors"]:
        if "{L}" in t["name"]:
            for i in range(schema["num_layers"]):
                yield t["name"].replace("{L}", str(i)), t
        else:
            yield t["name"], t


def make_checkpoint(schema, d):
    rng = np.random.default_rng(3)
    full = {}
    for state, sd in schema["states"].items():
        for name, t in expand(schema):
            if "tied" in t:
                continue
            dtype = sd.get("dtype", t["dtype"])
            a = (rng.integers(0, 2**16, t["shape"], dtype=np.uint16) if dtype == "bfloat16"
                 else rng.standard_normal(t["shape"]).astype(dtype))
            path = os.path.join(d, state, name + ".npy")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            np.save(path, a)
            full[(state, name)] = a
    return full


def check_export(mnt, out, full, where):
    shutil.rmtree(out, ignore_errors=True)
    sh(MLFS, "export", mnt, "--to", out)
    for (state, name), a in full.items():
        got = np.load(os.path.join(out, state, name + ".npy"))
        check(got.dtype == a.dtype and np.array_equal(got, a),
              f"{where}: {state}/{name} differs from the checkpoint")
    print(f"   export on {where}: all {len(full)} full tensors equal the checkpoint")


def main():
    try:
        with testing.start(nnodes=3, devices=4, job="demo") as cl:
            try:
                demo(cl)
            except ClusterError:
                sys.stderr.write(cl.describe() + "\n")
                raise
    except ClusterError as e:
        print(f"cluster demo FAILED: {e}", file=sys.stderr)
        return 1
    print("cluster demo: every check held")
    return 0


def demo(cl):
    tmp, mounts, nodes = cl.tmp, cl.mounts, cl.spec["nodes"]
    print(f"== etcd at {cl.etcd_url}; three nodes, 4 devices each, ports "
          f"{', '.join(n['addr'].split(':')[1] for n in nodes)}")

    schema = json.load(open(SCHEMA))
    with open(SCHEMA, "rb") as src, open(os.path.join(mounts["n0"], "schema.json"), "wb") as dst:
        dst.write(src.read())
    v1 = {"version": 1, "tp": 2, "pp": 2, "dp": 2, "nodes": ["n0", "n1"]}
    with open(os.path.join(mounts["n0"], "config.json"), "w") as f:
        json.dump(v1, f)
    cl.wait_version(1)
    hosted = {i: sorted(os.listdir(os.path.join(m, "ranks"))) for i, m in mounts.items()}
    print(f"1. schema and config v1 (tp2 pp2 dp2) written on n0; ranks per node: {hosted}")
    check(hosted == {"n0": ["0", "1", "2", "3"], "n1": ["4", "5", "6", "7"], "n2": []},
          f"ranks are not where DESIGN section 2 puts them: {hosted}")

    ckpt = os.path.join(tmp, "ckpt")
    full = make_checkpoint(schema, ckpt)
    for i in ("n0", "n1"):
        sh(MLFS, "import", mounts[i], "--from", ckpt, "--step", "10")
    print(f"2. checkpoint of {len(full)} tensors imported on n0 and n1 (step 10)")
    check_export(mounts["n2"], os.path.join(tmp, "out1"), full, "n2 (hosts nothing)")

    v2 = {"version": 2, "tp": 2, "pp": 1, "dp": 4, "nodes": ["n1", "n2"]}
    with open(os.path.join(tmp, "v2.json"), "w") as f:
        json.dump(v2, f)
    t0 = time.monotonic()
    p = sh(MLFS, "reconfigure", mounts["n2"], os.path.join(tmp, "v2.json"))
    took = time.monotonic() - t0
    fetched = {i: cl.status(i)["last"]["bytes_fetched"] for i in mounts}
    print(f"3. mlfs reconfigure on n2 to v2 (tp2 pp1 dp4 on n1, n2) in {took:.2f} s; "
          f"bytes fetched per node: {fetched}")
    print("   " + p.stdout.strip().replace("\n", "\n   "))
    check(fetched["n2"] > 0, "n2 fetched nothing")
    check(sorted(os.listdir(os.path.join(mounts["n0"], "ranks"))) == [],
          "n0 still hosts ranks")
    check_export(mounts["n0"], os.path.join(tmp, "out2"), full, "n0 (hosts nothing now)")

    cl.kill("n1")
    wait_for("n1's lease to expire",
             lambda: not cl.status("n2")["cluster"]["nodes"][1]["up"])
    print("4. n1 killed (kill -9); its lease expired, the job sees it down:")
    print("   " + sh(MLFS, "status", mounts["n2"]).stdout.strip().replace("\n", "\n   "))
    v3 = {"version": 3, "tp": 2, "pp": 1, "dp": 2, "nodes": ["n2"]}
    with open(os.path.join(tmp, "v3.json"), "w") as f:
        json.dump(v3, f)
    sh(MLFS, "reconfigure", mounts["n2"], os.path.join(tmp, "v3.json"))
    print("   config v3 (tp2 pp1 dp2 on n2 alone) served from n2's DP replicas")
    check_export(mounts["n2"], os.path.join(tmp, "out3"), full, "n2")


if __name__ == "__main__":
    sys.exit(main())
