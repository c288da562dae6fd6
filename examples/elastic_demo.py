#!/usr/bin/python3
"""A training job's state on one mlfs node, re-sliced from tp2 pp2 dp2 to
tp4 pp1 dp2 by rewriting config.json, and checked against NumPy slices;
then its dataset views carried through a change of data parallelism
(dp2 -> dp4): every record once, in the order of a run without the change.

Run by `make demo` (after `make`); uses build/mlfs and examples/gpt-tiny.
"""
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLFS = os.path.join(ROOT, os.environ.get("BUILD", "build"), "mlfs")
sys.path.insert(0, os.path.join(ROOT, "python"))  # the mlfs package, not installed
from mlfs import testing  # noqa: E402
EX = os.path.join(ROOT, "examples", "gpt-tiny")


class CheckFailed(Exception):
    """A check of the demo that did not hold; the message says which."""


def check(ok, what):
    """Raises CheckFailed(what) unless ok. Explicit, unlike `assert`, which
    `python -O` strips."""
    if not ok:
        raise CheckFailed(what)


def sh(*args):
    print("$ mlfs " + " ".join(args[1:]))
    out = subprocess.run(args, capture_output=True, text=True)
    sys.stdout.write(out.stdout)
    if out.returncode:
        sys.stderr.write(out.stderr)
        raise SystemExit(f"mlfs {args[1]} failed")


def tp_slice(x, dim, tp, t, pad=None, chunks=1):
    """Rank t's partition per DESIGN section 3 (used to check the store)."""
    n = x.shape[dim]
    if pad:
        q = pad * tp
        padded = (n + q - 1) // q * q
        shape = list(x.shape)
        shape[dim] = padded
        y = np.zeros(shape, x.dtype)
        np.moveaxis(y, dim, 0)[:n] = np.moveaxis(x, dim, 0)
        per = padded // tp
        return np.moveaxis(np.moveaxis(y, dim, 0)[t * per:(t + 1) * per], 0, dim)
    c = n // chunks
    idx = [i for k in range(chunks) for i in range(k * c + t * c // tp, k * c + (t + 1) * c // tp)]
    return np.take(x, idx, axis=dim)


REC = 8  # int32 values per dataset record: record i holds i * 100 + 0..7


def write_dataset(d):
    """Three raw shards of 400 records each and their index (mlfs dataset index)."""
    os.makedirs(d)
    for k in range(3):
        ids = np.arange(k * 400, (k + 1) * 400)
        (ids[:, None] * 100 + np.arange(REC)).astype(np.int32).tofile(
            os.path.join(d, f"shard{k}.bin"))
    sh(MLFS, "dataset", "index", d, "--dtype", "int32", "--shape", str(REC))
    return "file://" + os.path.join(d, "index.json")


def batch_ids(mnt, step):
    """The global batch of @step as the DP ranks read it: their views' ids
    in DP order (one rank per DP group), each view checked against its ids."""
    by_d = {}
    for r in sorted(os.listdir(os.path.join(mnt, "ranks")), key=int):
        d = json.load(open(os.path.join(mnt, "ranks", r, "rank.json")))["dp"]
        by_d.setdefault(d, r)
    out = []
    for d in sorted(by_d):
        base = os.path.join(mnt, "ranks", by_d[d], "data", str(step))
        ids, recs = np.load(base + ".ids.npy"), np.load(base + ".npy")
        check(np.array_equal(recs, ids[:, None] * 100 + np.arange(REC)),
              f"{base}.npy: step {step}, DP rank {d}: its records are not those of its ids")
        out.append(ids)
    return np.concatenate(out), len(by_d)


def main():
    schema = json.load(open(os.path.join(EX, "schema.json")))
    # One node of 8 devices (mlfs.testing: the daemon, unmounted at the end, which
    # raises unless it exits 0 with no error in its log).
    with testing.start(1, devices=8, job="elastic-demo", mlfs=MLFS) as node:
        tmp, mnt = node.tmp, node.mounts["n0"]
        print(f"mounted {mnt}")
        with open(os.path.join(mnt, "schema.json"), "w") as f:
            json.dump(schema, f)
        # One node of 8 devices: the layouts of docs/concepts.md on a single machine.
        dataset = {"index": write_dataset(os.path.join(tmp, "data")), "global_batch": 16,
                   "seed": 7}
        with open(os.path.join(mnt, "config.json"), "w") as f:
            json.dump({"version": 1, "tp": 2, "pp": 2, "dp": 2, "nodes": ["n0"],
                       "dataset": dataset}, f)
        print("ranks:", sorted(os.listdir(os.path.join(mnt, "ranks")), key=int))
        print("rank 5:", json.load(open(os.path.join(mnt, "ranks/5/rank.json"))))

        # A checkpoint of full tensors, as numpy.save writes them.
        rng = np.random.default_rng(0)
        ckpt = os.path.join(tmp, "ckpt")
        full, specs = {}, {}
        for state, spec in schema["states"].items():
            for t in schema["tensors"]:
                if "tied" in t:
                    continue
                names = ([t["name"].replace("{L}", str(i)) for i in range(schema["num_layers"])]
                         if "{L}" in t["name"] else [t["name"]])
                dt = spec.get("dtype", t["dtype"])
                for name in names:
                    specs[name] = t
                    shape = t["shape"]
                    a = (rng.integers(0, 2**16, shape, dtype=np.uint16) if dt == "bfloat16"
                         else rng.standard_normal(shape).astype(dt))
                    full[(state, name)] = a
                    path = os.path.join(ckpt, state, name + ".npy")
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    np.save(path, a)
        sh(MLFS, "import", mnt, "--from", ckpt, "--step", "100")

        p = os.path.join(mnt, "ranks/1/model/layers/0/attn/qkv/weight.npy")
        part = np.load(p, mmap_mode="r")
        print(f"ranks/1/model/layers/0/attn/qkv/weight.npy: shape {part.shape}, dtype "
              f"{os.getxattr(p, 'user.mlfs.dtype').decode()}")
        check(np.array_equal(part, tp_slice(full[("model", "layers/0/attn/qkv/weight")], 0, 2, 1)),
              f"{p}: not rank 1's slice of the imported tensor")
        del part  # an open mapping keeps the mount busy

        # Every rank saved step 100 (import set it); now change the layout.
        new = os.path.join(tmp, "tp4pp1dp2.json")
        with open(new, "w") as f:  # checked close
            json.dump({"version": 2, "tp": 4, "pp": 1, "dp": 2, "nodes": ["n0"],
                       "dataset": dataset}, f)
        sh(MLFS, "reconfigure", mnt, new)
        sh(MLFS, "status", mnt)
        checked = 0
        for r in range(8):
            t = r % 4
            for (state, name), a in full.items():
                split = specs[name].get("split")
                want = a if not split else tp_slice(a, split["dim"], 4, t, split.get("pad_multiple"),
                                                    split.get("chunks", 1))
                got = np.load(os.path.join(mnt, f"ranks/{r}", state, name + ".npy"))
                check(np.array_equal(got, want),
                      f"ranks/{r}/{state}/{name}.npy: not its NumPy slice of tp4")
                checked += 1
        print(f"checked {checked} partitions of tp4 pp1 dp2 against NumPy slices: equal")
        out = os.path.join(tmp, "export")
        sh(MLFS, "export", mnt, "--to", out)
        for (state, name), a in full.items():
            check(np.array_equal(np.load(os.path.join(out, state, name + ".npy")), a),
                  f"export {state}/{name}.npy: not the imported tensor")
        print("export equals the imported checkpoint")

        # The dataset: the ranks saved step 100, so data/100.npy is their
        # next batch. The global order of steps 100-105 under dp2 ...
        before = [batch_ids(mnt, s)[0] for s in range(100, 106)]
        print("steps 100-105 under dp2, global batches:",
              " ".join(str(b[:4].tolist())[:-1] + ", ...]" for b in before[:2]), "...")
        # ... training reaches step 103, then the job grows to dp4.
        for r in os.listdir(os.path.join(mnt, "ranks")):
            with open(os.path.join(mnt, "ranks", r, "step"), "w") as f:
                f.write("103\n")
        grow = os.path.join(tmp, "tp2pp1dp4.json")
        with open(grow, "w") as f:  # checked close
            json.dump({"version": 3, "tp": 2, "pp": 1, "dp": 4, "nodes": ["n0"],
                       "dataset": dataset}, f)
        sh(MLFS, "reconfigure", mnt, grow)
        after = []
        for s in range(103, 106):
            ids, dp = batch_ids(mnt, s)
            check(dp == 4, f"step {s}: {dp} DP groups after the change, 4 expected")
            after.append(ids)
        seen = np.concatenate(before[:3] + after)
        check(np.array_equal(seen, np.concatenate(before)),
              "steps 103-105 under dp4: not the records of the run without the change, "
              "in its order")
        check(len(np.unique(seen)) == len(seen) == 96,
              f"steps 100-105: {len(seen)} records read, {len(np.unique(seen))} distinct; "
              "96 expected, each once")
        print("steps 103-105 under dp4 (4 DP ranks of 4 records): the same 48 records "
              "in the same order; 96 records in 6 steps, each once")
        w = np.load(os.path.join(mnt, "ranks/0/data/103-106.npy"))
        print(f"ranks/0/data/103-106.npy (a window of 3 steps): shape {w.shape}")
    print("unmounted; daemon exited 0")


if __name__ == "__main__":
    try:
        main()
    except CheckFailed as e:
        sys.exit(f"elastic_demo: check failed: {e}")
