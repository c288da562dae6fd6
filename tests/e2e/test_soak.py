"""Soak: readers, writers, imports and reconfigurations together on one mount for a
bounded time (MLFS_SOAK_SECONDS, default 30, in each of `make test`'s two passes;
`make soak` runs it for 10 minutes), every read checked against what could have been
current.

Every element of every tensor encodes its global row and a version:
`row * 65536 + version` (int32). A writer saves every "model" partition of the
layout with version k, then every rank's step, and only then may a
reconfiguration run (they share a lock, as a training job would: save, then
change layout); imports of the "opt" state (all of it, with version j) run at
any time, as do the readers. So any read of one partition, whatever the
interleaving, must be one layout's slice of the global rows (its header and
its bytes agreeing) holding one version; a full tensor must hold every global
row in order. Readers use the three read patterns of docs/single-node.md: numpy.load,
the one-open memory map and plain reads.
"""
import json
import multiprocessing as mp
import os
import random
import subprocess
import threading
import time

import numpy as np

from conftest import MLFS, run_mlfs

ROWS = {"w": 1024, "e": 96}
COLS = {"w": 48, "e": 8}
SCHEMA = {
    "model": "soak", "num_layers": 0,
    "states": {"model": {}, "opt": {}},
    "tensors": [
        {"name": "w", "dtype": "int32", "shape": [ROWS["w"], COLS["w"]], "split": {"dim": 0}},
        {"name": "blocks/e", "dtype": "int32", "shape": [ROWS["e"], COLS["e"]],
         "split": {"dim": 0, "chunks": 2}},
        {"name": "b", "dtype": "int32", "shape": [40]},
    ],
}
LAYOUTS = [(1, 1), (2, 1), (4, 1), (2, 2), (1, 4), (4, 2), (2, 4), (1, 2)]  # (tp, dp)
SECONDS = float(os.environ.get("MLFS_SOAK_SECONDS", "30"))


def full_array(name, version):
    if name == "b":
        return np.arange(40, dtype=np.int32) * 65536 + version
    rows = np.arange(ROWS[name.split("/")[-1]], dtype=np.int32)[:, None] * 65536 + version
    return np.repeat(rows, COLS[name.split("/")[-1]], axis=1)


def part_array(name, version, tp, t):
    a = full_array(name, version)
    if name == "b":
        return a
    if name == "w":
        n = ROWS["w"]
        return a[t * n // tp:(t + 1) * n // tp]
    half = ROWS["e"] // 2  # two chunks, each split among tp ranks
    return np.concatenate([a[c * half + t * half // tp: c * half + (t + 1) * half // tp]
                           for c in range(2)])


def allowed_row_sets(name):
    """{tuple of global rows} a partition of @name may hold, over every tp used."""
    out = set()
    for tp in {tp for tp, _ in LAYOUTS}:
        for t in range(tp):
            out.add(tuple(part_array(name, 0, tp, t)[:, 0] // 65536) if name != "b"
                    else tuple(range(40)))
    return out


def check_part(name, a, allowed):
    """Problems with a partition read of @name (empty list when it is fine)."""
    if a.dtype != np.int32:
        return [f"{name}: dtype {a.dtype}"]
    rows = a // 65536 if name == "b" else a[:, 0] // 65536
    versions = np.unique(a % 65536)
    bad = []
    if tuple(rows) not in allowed:
        bad.append(f"{name}: rows {rows[:3]}..{rows[-3:]} ({len(rows)}) are no layout's slice")
    if name != "b" and not np.array_equal(a // 65536, np.repeat(rows[:, None], a.shape[1], 1)):
        bad.append(f"{name}: a row holds another row's values")
    if len(versions) != 1:
        bad.append(f"{name}: {len(versions)} versions in one read: {versions[:4]}")
    return bad


def mmap_load(path):
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        shape, fortran, dtype = np.lib.format._read_array_header(f, version)
        return np.array(np.memmap(f, dtype=dtype, mode="r", shape=shape, offset=f.tell()))


def raw_load(path):
    import io
    with open(path, "rb") as f:
        return np.load(io.BytesIO(f.read()))


def reader(mnt, seconds, mode, seed, out):
    rng = random.Random(seed)
    names = ["w", "blocks/e", "b"]
    allowed = {n: allowed_row_sets(n) for n in names}
    load = {"npload": np.load, "mmap": mmap_load, "raw": raw_load}[mode]
    reads, gone, bad = 0, 0, []
    end = time.monotonic() + seconds
    while time.monotonic() < end and len(bad) < 5:
        r, name = rng.randrange(8), rng.choice(names)
        state = rng.choice(["model", "opt"])
        full = rng.random() < 0.1
        path = (os.path.join(mnt, "full", state, name + ".npy") if full
                else os.path.join(mnt, "ranks", str(r), state, name + ".npy"))
        try:
            a = load(path)
        except FileNotFoundError:
            gone += 1
            continue
        except Exception as e:  # noqa: BLE001 - anything else is a failure
            bad.append(f"{path}: {type(e).__name__}: {e}")
            continue
        reads += 1
        if full:
            want_rows = np.arange(40 if name == "b" else ROWS[name.split("/")[-1]])
            got_rows = a // 65536 if name == "b" else a[:, 0] // 65536
            if not np.array_equal(got_rows, want_rows):
                bad.append(f"{path}: rows out of order")
        else:
            bad += [f"{path}: {b}" for b in check_part(name, a, allowed[name])]
    out.put((mode, reads, gone, bad))


def test_soak(mount, tmp_path):
    mount.setup(SCHEMA, {"version": 1, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]})
    mnt = str(mount.path)
    layout = {"tp": 1, "dp": 1, "version": 1}
    lock = threading.Lock()  # a save and a layout change do not overlap
    stop = threading.Event()
    counts = {"writes": 0, "imports": 0, "import_refused": 0, "reconfigs": 0,
              "step_refusals": 0}
    failures = []

    def write_model(version):
        tp, dp = layout["tp"], layout["dp"]
        for r in range(tp * dp):
            for name in ["w", "blocks/e", "b"]:
                np.save(os.path.join(mnt, "ranks", str(r), "model", name + ".npy"),
                        part_array(name, version, tp, r % tp))
        for r in range(tp * dp):
            mount.write(f"ranks/{r}/step", str(version))

    def writer():
        k = 1
        while not stop.is_set():
            k += 1
            with lock:
                try:
                    write_model(k)
                except OSError as e:
                    failures.append(f"write of version {k}: {e!r}: {mount.status()['error']}")
                    return
            counts["writes"] += 1

    def reconfigurer():
        rng = random.Random(3)
        while not stop.wait(0.3):
            tp, dp = rng.choice([x for x in LAYOUTS if x != (layout["tp"], layout["dp"])])
            with lock:
                cfg = {"version": layout["version"] + 1, "tp": tp, "pp": 1, "dp": dp,
                       "nodes": ["n0"]}
                p = tmp_path / "next.json"
                p.write_text(json.dumps(cfg))
                for _ in range(20):
                    res = run_mlfs("reconfigure", mnt, p, check=False)
                    if ("have not saved the same step" not in res.stderr and
                            "write it again" not in res.stderr):
                        break
                    # An import (which sets every rank's step) landed inside the
                    # last save, or between the plan and its start: refused,
                    # nothing changed; save the steps again.
                    counts["step_refusals"] += 1
                    for r in range(layout["tp"] * layout["dp"]):
                        mount.write(f"ranks/{r}/step", "7")
                if res.returncode != 0:
                    failures.append(f"reconfigure to {cfg}: {res.stderr}")
                    return
                layout.update(tp=tp, dp=dp, version=cfg["version"])
            counts["reconfigs"] += 1

    def importer():
        j = 1000
        while not stop.wait(0.05):
            j += 1
            d = tmp_path / f"opt{j % 2}"
            for name in ["w", "blocks/e", "b"]:
                path = d / "opt" / (name + ".npy")
                path.parent.mkdir(parents=True, exist_ok=True)
                np.save(path, full_array(name, j))
            res = subprocess.run([str(MLFS), "import", mnt, "--from", str(d), "--state", "opt",
                                  "--step", "0"], capture_output=True, text=True, timeout=60)
            if res.returncode == 0:
                counts["imports"] += 1
            elif ("the layout changed during the import" in res.stderr or
                  "is in progress" in res.stderr):  # refused while a reconfiguration runs
                counts["import_refused"] += 1
            else:
                failures.append(f"import {j}: {res.stderr}")
                return

    # Nothing zero-filled is left when the readers start.
    write_model(1)
    d = tmp_path / "opt-first"
    for name in ["w", "blocks/e", "b"]:
        (d / "opt" / name).parent.mkdir(parents=True, exist_ok=True)
        np.save(d / "opt" / (name + ".npy"), full_array(name, 1000))
    run_mlfs("import", mnt, "--from", d, "--state", "opt", "--step", "1")

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=reader, args=(mnt, SECONDS, mode, i, q))
             for i, mode in enumerate(["npload", "mmap", "raw"])]
    for p in procs:
        p.start()
    threads = [threading.Thread(target=f) for f in (writer, reconfigurer, importer)]
    for t in threads:
        t.start()
    try:
        results = [q.get(timeout=SECONDS + 120) for _ in procs]
    finally:
        stop.set()
        for t in threads:
            t.join(120)
        for p in procs:
            p.join(30)
    assert not failures, failures[:5]
    for p in procs:
        assert p.exitcode == 0, f"a reader died with {p.exitcode} (SIGBUS is -7)"
    for mode, reads, gone, bad in results:
        assert not bad, (mode, bad[:5])
        assert reads > 50, (mode, reads, gone)
    assert counts["writes"] > 5 and counts["reconfigs"] > 5 and counts["imports"] > 5, counts
    # Quiet now: the last save and the last import are what every partition holds.
    tp, dp = layout["tp"], layout["dp"]
    for r in range(tp * dp):
        a = np.load(mount.p(f"ranks/{r}/model/w.npy"))
        assert np.array_equal(a % 65536, np.full(a.shape, a[0, 0] % 65536))
    st = mount.status()
    assert st["state"] == "idle" and st["version"] == layout["version"]
    print(f"soak {SECONDS:.0f} s: {counts}, reads "
          f"{ {m: (n, g) for m, n, g, _ in results} } (done, gone)")
