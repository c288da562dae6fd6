#!/usr/bin/python3
"""The live view full/model.safetensors in a job of many nodes (issue 19): the
whole state read on a node that holds a quarter of it (4 daemons and one etcd on
this machine, one device each, tp2 pp2: the other three quarters are fetched from
the peers at the open, XXH3-checked), against the reference measured in the same
run: the same file read on a one-node mount of 4 devices at tp2 pp2, every part
local. One open, reads of 1 MiB to the end, as an inference engine loading the
weights would; the runs alternate between the two, and every read is compared
byte for byte with the file the script wrote (exit 1 on a difference).

Usage: bench_stview.py [--size-mib N] [--reps N]
  --size-mib  state size (default 256: 4 fp32 layers of [4H, H], H a multiple of 128)
The daemon is $BUILD/mlfs (BUILD defaults to "build", as in the Makefile).
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
from conftest import MLFS  # noqa: E402  (and python/ on sys.path)
from mlfs.testing import Cluster, Etcd  # noqa: E402
from test_safetensors import st_bytes  # noqa: E402


def read_file(path, want):
    t = time.perf_counter()
    parts = []
    with open(path, "rb") as f:
        while True:
            c = f.read(1 << 20)
            if not c:
                break
            parts.append(c)
    dt = time.perf_counter() - t
    if b"".join(parts) != want:
        sys.exit(f"{path}: the bytes differ from the file written")
    return dt


def one_node(tmp):
    mnt = tmp / "one"
    mnt.mkdir()
    spec = tmp / "one-cluster.json"
    spec.write_text(json.dumps({"nodes": [{"id": "n0", "addr": "127.0.0.1:1", "devices": 4}]}))
    proc = subprocess.Popen([str(MLFS), "mount", str(mnt), "--node", "n0", "--cluster",
                             str(spec), "-f"], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not os.path.ismount(mnt):
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit("the one-node mount did not start")
        time.sleep(0.05)
    return mnt, proc


def cluster(tmp, etcd):
    """Four daemons of one device; ports are picked free, and another process may take
    one first on a shared machine: tried three times."""
    for attempt in range(3):
        (tmp / f"c{attempt}").mkdir()
        cl = Cluster(tmp / f"c{attempt}", etcd, 4, 1, f"j{attempt}", ())
        try:
            for n in cl.spec["nodes"]:
                cl.mount(n["id"])
            cl.wait_registered()
            return cl
        except AssertionError as e:
            print(f"cluster start {attempt + 1}: {str(e).splitlines()[0]}")
            try:
                cl.teardown()
            except AssertionError:
                pass  # the node that could not listen exited 1
    sys.exit("the cluster did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    h = 128
    while 4 * 4 * (4 * (h + 128) * (h + 128)) <= a.size_mib << 20:
        h += 128
    schema = {"model": "bench", "num_layers": 4, "states": {"model": {}},
              "tensors": [{"name": "layers/{L}/fc/weight", "dtype": "float32",
                           "shape": [4 * h, h], "split": {"dim": 0}}]}
    cfg = {"version": 1, "tp": 2, "pp": 2, "dp": 1}
    rng = np.random.default_rng(19)
    data = st_bytes([(f"layers/{i}/fc/weight", "float32",
                      rng.standard_normal((4 * h, h), dtype=np.float32)) for i in range(4)])
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="mlfs-bench-stview-"))
    etcd = Etcd(tmp)
    etcd.start()
    one, proc, cl = None, None, None
    try:
        src = tmp / "model.safetensors"
        src.write_bytes(data)
        cl = cluster(tmp, etcd)
        cl.start_job(schema, dict(cfg, nodes=["n0", "n1", "n2", "n3"]))
        for n in cl.nodes:
            n.mlfs("import", "--from", src)
        one, proc = one_node(tmp)
        for name, obj in (("schema.json", schema), ("config.json", dict(cfg, nodes=["n0"]))):
            with open(one / name, "w") as f:
                f.write(json.dumps(obj))
        subprocess.run([str(MLFS), "import", str(one), "--from", str(src)], check=True)
        local, remote = [], []
        for i in range(a.reps):
            runs = [(local, one / "full/model.safetensors"),
                    (remote, cl["n0"].p("full/model.safetensors"))]
            for out, path in (runs if i % 2 == 0 else runs[::-1]):
                out.append(read_file(path, data))
        gb = len(data) / 1e9

        def row(ts):
            return (f"{ts[0]:.3f}, {statistics.median(ts):.3f}, {min(ts):.3f} s "
                    f"({gb / min(ts):.2f} GB/s best)")
        print(f"state: {len(data)} bytes (H = {h}), tp2 pp2, {a.reps} runs each")
        print(f"one node, every part local:      {row(local)}")
        print(f"n0 of 4, 3/4 fetched at the open: {row(remote)}")
        print(f"ratio (n0 of 4 / one node): first {remote[0] / local[0]:.2f}, median "
              f"{statistics.median(remote) / statistics.median(local):.2f}, best "
              f"{min(remote) / min(local):.2f}")
    finally:
        if one is not None:
            subprocess.run(["fusermount3", "-u", str(one)])
            proc.wait(timeout=30)
        if cl is not None:
            cl.teardown()
        etcd.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
