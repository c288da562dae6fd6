"""Dataset views on a real mount (docs/dataset.md "Views": exactly-once views across
reconfigurations", DESIGN section 8): `mlfs dataset index`, the order of the
sample stream through reconfigurations, the views under ranks/<r>/data/,
variable records, HTTP sources with failures, corrupt indexes and refusals.

Every expected view is computed here from docs/dataset.md with a small pure-Python
reference (the cursor, batches, balanced DP slices), independent of the
daemon's code. Records are self-describing: fixed record k is int32
[k*1000, k*1000+1, ...], variable record k is int32 [k*1000, ...] of length
(7k) % 13, so any view's bytes can be checked against its ids.
"""
import errno
import io
import json
import os
import re
import shutil
import socket
import threading
import time
import urllib.request

import numpy as np
import pytest

from conftest import run_mlfs

REC = 129  # int32 values per fixed record

# A tiny model: 2 layers (pp up to 2), rows split by TP (tp up to 4).
SCHEMA = {"model": "tiny", "num_layers": 2, "states": {"model": {}},
          "tensors": [{"name": "layers/{L}/w", "dtype": "float32", "shape": [4, 4],
                       "split": {"dim": 0}}]}


# ---------------------------------------------------------------- datasets

def fixed_records(ids, n=REC):
    """The records of global ids @ids: int32 [len(ids), n], record k = k*1000 + arange(n)."""
    ids = np.asarray(ids, np.int64)
    return (ids[:, None] * 1000 + np.arange(n, dtype=np.int64)[None, :]).astype(np.int32)


def var_record(k):
    """Variable record k's bytes (empty for k % 13 == 0)."""
    return (np.arange((7 * k) % 13, dtype=np.int64) + k * 1000).astype("<i4").tobytes()


def write_fixed(d, counts, names=None, index=True, n=REC):
    """Writes raw shards of fixed records (global ids in shard order) into folder @d
    and, if @index, a hand-written index.json with relative URIs. Returns the
    record count."""
    os.makedirs(d, exist_ok=True)
    names = names or [f"shard{i}.bin" for i in range(len(counts))]
    k = 0
    for name, c in zip(names, counts):
        fixed_records(range(k, k + c), n).tofile(os.path.join(d, name))
        k += c
    if index:
        write_index(d, {"records": "fixed", "dtype": "int32", "shape": [n],
                        "shards": [{"uri": u, "count": c} for u, c in zip(names, counts)]})
    return k


def write_index(d, idx):
    path = os.path.join(d, "index.json")
    with open(path, "w") as f:
        f.write(idx if isinstance(idx, str) else json.dumps(idx))
    return "file://" + os.path.abspath(path)


def file_uri(d):
    return "file://" + os.path.abspath(os.path.join(d, "index.json"))


def write_variable(d, counts):
    """Variable-record shards with offsets tables in each documented form: shard 0
    raw int64 offsets from 0; shard 1 a .npy of int64 and 12 junk bytes before its
    first record; shard 2 raw, with junk after its last record. Returns N."""
    os.makedirs(d, exist_ok=True)
    shards, k = [], 0
    for i, c in enumerate(counts):
        head = b"\xee" * (12 if i == 1 else 0)
        tail = b"\xdd" * (7 if i == 2 else 0)
        recs = [var_record(k + j) for j in range(c)]
        offs = np.cumsum([len(head)] + [len(r) for r in recs]).astype("<i8")
        with open(os.path.join(d, f"v{i}.bin"), "wb") as f:
            f.write(head + b"".join(recs) + tail)
        if i == 1:
            oname = f"v{i}.offsets.npy"
            np.save(os.path.join(d, oname), offs)
        else:
            oname = f"v{i}.off"
            offs.tofile(os.path.join(d, oname))
        shards.append({"uri": f"v{i}.bin", "count": c, "offsets": oname})
        k += c
    write_index(d, {"records": "variable", "dtype": "int32", "shards": shards})
    return k


# --------------------------------------------------------------- reference

def dp_slices(batch, dp):
    """Balanced contiguous slices of a batch: [(lo, hi)] for d in range(dp); the
    first batch % dp DP ranks get one more."""
    q, r = divmod(batch, dp)
    out, lo = [], 0
    for d in range(dp):
        hi = lo + q + (d < r)
        out.append((lo, hi))
        lo = hi
    return out


class Cursor:
    """docs/dataset.md "Reconfiguration carries the cursor": segments of steps under one
    config; step S + k of a config that took effect at S consumes samples
    samples(S) + k * global_batch."""

    def __init__(self, global_batch, dp, total=None):
        self.segs = [(0, 0, global_batch, dp)]  # (first step, first sample, gb, dp)
        self.total = total  # samples in the whole run (epochs * N), None = no limit

    def seg(self, s):
        return [g for g in self.segs if g[0] <= s][-1]

    def samples(self, s):
        """Samples consumed before step s."""
        first, base, gb, _ = self.seg(s)
        return base + (s - first) * gb

    def change(self, step, global_batch, dp):
        """A new config takes effect at saved step @step."""
        self.segs.append((step, self.samples(step), global_batch, dp))

    def batch(self, s):
        """Stream positions [a, b) of step s (clipped at the end of the last epoch)."""
        a = self.samples(s)
        b = a + self.seg(s)[2]
        if self.total is not None:
            b = max(a, min(b, self.total))
        return a, b

    def slices(self, s):
        """Stream positions [(a, b)] of step s's DP slices."""
        a, b = self.batch(s)
        return [(a + lo, a + hi) for lo, hi in dp_slices(b - a, self.seg(s)[3])]


def coords(cfg, r):
    tp, dp = cfg["tp"], cfg["dp"]
    return r % tp, (r // tp) % dp, r // (tp * dp)


def nranks(cfg):
    return cfg["tp"] * cfg["pp"] * cfg["dp"]


def check_epochs(stream, n):
    """Each complete epoch of @stream (ids by stream position) is a permutation of
    range(n); a partial last epoch has no repeats."""
    stream = np.asarray(stream)
    for e in range(0, len(stream), n):
        ep = stream[e:e + n]
        if len(ep) == n:
            assert np.array_equal(np.sort(ep), np.arange(n)), f"epoch {e // n} not a permutation"
        else:
            assert len(np.unique(ep)) == len(ep) and ep.min() >= 0 and ep.max() < n


# ------------------------------------------------------------------- views

def dataset_cfg(version, tp, pp, dp, index, global_batch, **kw):
    ds = {"index": index, "global_batch": global_batch}
    ds.update(kw)
    return {"version": version, "tp": tp, "pp": pp, "dp": dp, "nodes": ["n0"], "dataset": ds}


FIXED_EXTS = (".npy", ".ids.npy")
VAR_EXTS = (".bin", ".offsets.npy", ".ids.npy")


def read_views(m, cfg, s, exts=FIXED_EXTS, dp=None):
    """Step s's views on every rank of @cfg as raw bytes; asserts that every TP/PP
    rank of a DP group sees identical bytes. Returns [{ext: bytes}] by DP rank.
    @dp: the data parallelism step s ran with, when it ran under an earlier
    config (docs/dataset.md: views of earlier steps keep their slices); DP ranks past it
    have no view of s (ENODATA)."""
    groups = {}
    dp = cfg["dp"] if dp is None else dp
    for r in range(nranks(cfg)):
        _, d, _ = coords(cfg, r)
        if d >= dp:
            for ext in exts:
                expect_errno(errno.ENODATA, m.read, f"ranks/{r}/data/{s}{ext}")
            continue
        files = {}
        for ext in exts:
            path = m.p("ranks", r, "data", f"{s}{ext}")
            files[ext] = m.read(f"ranks/{r}/data/{s}{ext}")
            assert os.path.getsize(path) == len(files[ext]), (r, s, ext)
        if d in groups:
            assert files == groups[d], f"step {s}: rank {r} differs from its DP group {d}"
        else:
            groups[d] = files
    return [groups[d] for d in range(min(dp, cfg["dp"]))]


def load_ids(raw, local):
    ids = np.load(io.BytesIO(raw))
    assert ids.dtype == np.dtype("<i8") and ids.shape == (local,), (ids.dtype, ids.shape)
    return ids


def check_fixed_view(files, local, n=REC):
    """Shape, dtype and contents of one fixed view; returns its ids."""
    ids = load_ids(files[".ids.npy"], local)
    data = np.load(io.BytesIO(files[".npy"]))
    assert data.dtype == np.dtype("<i4") and data.shape == (local, n), (data.dtype, data.shape)
    assert np.array_equal(data, fixed_records(ids, n)), "records do not match their ids"
    return ids


def check_var_view(files, local):
    ids = load_ids(files[".ids.npy"], local)
    offs = np.load(io.BytesIO(files[".offsets.npy"]))
    assert offs.dtype == np.dtype("<i8") and offs.shape == (local + 1,), (offs.dtype, offs.shape)
    blob = files[".bin"]
    assert offs[0] == 0 and offs[-1] == len(blob)
    assert [blob[offs[i]:offs[i + 1]] for i in range(local)] == [var_record(int(k)) for k in ids]
    return ids


def step_ids(m, cfg, cur, s, var=False, n=REC):
    """Reads and checks step s on every rank (fixed records of @n int32);
    returns the step's ids in DP order."""
    views = read_views(m, cfg, s, VAR_EXTS if var else FIXED_EXTS)
    out = []
    for d, ((a, b), files) in enumerate(zip(cur.slices(s), views)):
        out.append(check_var_view(files, b - a) if var else check_fixed_view(files, b - a, n))
    return np.concatenate(out)


def expect_errno(code, fn, *args, **kw):
    with pytest.raises(OSError) as e:
        fn(*args, **kw)
    assert e.value.errno == code, f"{e.value!r}, expected {errno.errorcode[code]}"


def write_steps(m, cfg, step):
    for r in range(nranks(cfg)):
        m.write(f"ranks/{r}/step", f"{step}\n")


def reconfigure(m, cfg, check=True):
    path = m.tmp / f"{os.path.basename(m.path)}-config-v{cfg['version']}.json"
    path.write_text(json.dumps(cfg))
    return run_mlfs("reconfigure", m.path, path, check=check)


VIEW_NAME = re.compile(r"^(\d+)(\.npy|\.ids\.npy|\.bin|\.offsets\.npy)$")


def listed_steps(m, r, exts):
    """{step: set of extensions} of `ls ranks/<r>/data/`; every name must be a view."""
    found = {}
    for name in os.listdir(m.p("ranks", r, "data")):
        mt = VIEW_NAME.match(name)
        assert mt and mt.group(2) in exts, f"ranks/{r}/data/{name}"
        found.setdefault(int(mt.group(1)), set()).add(mt.group(2))
    return found


def check_listing(m, cfg, saved, exts=FIXED_EXTS):
    for r in range(nranks(cfg)):
        found = listed_steps(m, r, exts)
        assert found and min(found) == saved, (r, sorted(found))
        assert found[saved] == set(exts), (r, found[saved])


# ---------------------------------------------- 1. mlfs dataset index

def test_dataset_index_command(tmp_path, mount):
    d = tmp_path / "ds"
    counts = {"s1.bin": 100, "s10.bin": 37, "s2.bin": 250}  # sorted by name: s1, s10, s2
    k = 0
    d.mkdir()
    for name in sorted(counts):
        fixed_records(range(k, k + counts[name])).tofile(d / name)
        k += counts[name]
    (d / ".hidden").write_bytes(b"x" * 3)  # excluded: starts with "."
    (d / "sub").mkdir()                   # excluded: not a regular file
    (d / "sub" / "x.bin").write_bytes(b"x" * 5)
    (d / "index.json").write_text("stale")  # excluded and replaced
    p = run_mlfs("dataset", "index", d, "--dtype", "int32", "--shape", REC)
    assert p.returncode == 0
    idx = json.loads((d / "index.json").read_text())
    assert idx["records"] == "fixed" and idx["dtype"] == "int32" and idx["shape"] == [REC]
    assert [(s["uri"], s["count"]) for s in idx["shards"]] == \
        [("s1.bin", 100), ("s10.bin", 37), ("s2.bin", 250)]
    for s in idx["shards"]:
        assert "offsets" not in s

    # The index works as is: every record of the 387, in shard-name order.
    mount.setup(SCHEMA, dataset_cfg(1, 1, 1, 1, file_uri(d), 387, shuffle=False))
    ids = check_fixed_view({e: mount.read(f"ranks/0/data/0{e}") for e in FIXED_EXTS}, 387)
    assert np.array_equal(ids, np.arange(387))

    # A shard whose size is not a multiple of 129 * 4 bytes: an error naming it,
    # and no index.json written.
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    os.unlink(bad / "index.json")
    with open(bad / "s10.bin", "ab") as f:
        f.write(b"\0\0\0\0")
    p = run_mlfs("dataset", "index", bad, "--dtype", "int32", "--shape", REC, check=False)
    assert p.returncode != 0
    assert "s10.bin" in p.stderr and "s1.bin:" not in p.stderr, p.stderr
    assert not (bad / "index.json").exists()
    # An unknown dtype is refused too.
    os.unlink(bad / "s10.bin")
    p = run_mlfs("dataset", "index", bad, "--dtype", "int33", "--shape", REC, check=False)
    assert p.returncode != 0 and "int33" in p.stderr
    assert not (bad / "index.json").exists()


# ------------------------------------- 2. exactly once across reconfigurations

# (tp, pp, dp, global_batch, steps): DP changes, TP and PP changes, global_batch
# changes, uneven DP slices (20 / 3, 7 / 2), 366 samples over 113 records.
PHASES = [(1, 1, 2, 12, 4), (1, 1, 4, 12, 5), (2, 1, 3, 12, 3), (1, 2, 1, 20, 4),
          (1, 1, 3, 20, 5), (2, 2, 2, 7, 6)]
COUNTS = [50, 23, 40]


@pytest.mark.parametrize("shuffle", [True, False])
def test_exactly_once_through_reconfigurations(mount_factory, tmp_path, shuffle):
    n = write_fixed(tmp_path / "ds", COUNTS)
    index = file_uri(tmp_path / "ds")
    ds = {"seed": 77, "shuffle": shuffle, "epochs": 4}
    total = sum(gb * k for _, _, _, gb, k in PHASES)
    assert 3 * n < total < 4 * n

    # Reference: one mount whose config never changes (tp1 pp1 dp2, global_batch 12).
    if shuffle:
        ref_m = mount_factory(name="ref")
        ref_cfg = dataset_cfg(1, 1, 1, 2, index, 12, **ds)
        ref_m.setup(SCHEMA, ref_cfg)
        ref_cur = Cursor(12, 2, 4 * n)
        ref = np.concatenate([step_ids(ref_m, ref_cfg, ref_cur, s)
                              for s in range(-(-total // 12))])[:total]
        check_epochs(ref, n)
        assert not np.array_equal(ref[:n], np.arange(n)), "shuffle true gave the identity"
        assert not np.array_equal(ref[:n], ref[n:2 * n]), "epochs 0 and 1 in the same order"
    else:
        ref = np.arange(total) % n

    # Elastic run on a second mount.
    m = mount_factory(name="elastic")
    tp, pp, dp, gb, _ = PHASES[0]
    cfg = dataset_cfg(1, tp, pp, dp, index, gb, **ds)
    m.setup(SCHEMA, cfg)
    cur = Cursor(gb, dp, 4 * n)
    stream, step = [], 0
    for i, (tp, pp, dp, gb, k) in enumerate(PHASES):
        if i:
            old = cfg
            write_steps(m, old, step)
            cfg = dataset_cfg(old["version"] + 1, tp, pp, dp, index, gb, **ds)
            reconfigure(m, cfg)
            cur.change(step, gb, dp)
            st = m.status()
            assert st["version"] == cfg["version"] and st["error"] is None, st
            check_listing(m, cfg, step)
            # Earlier steps keep their old batches and slices: the new layout's
            # views of step - 1 are the old DP ranks' views (those of DP ranks the
            # old config had; see test_earlier_step_views_keep_old_slices).
            views = read_views(m, cfg, step - 1, dp=old["dp"])
            for d, ((x, y), v) in enumerate(zip(cur.slices(step - 1), views)):
                got = np.load(io.BytesIO(v[".ids.npy"]))
                assert np.array_equal(got, ref[x:y]), (
                    f"step {step - 1} DP rank {d} changed after v{cfg['version']}")
        for s in range(step, step + k):
            a, b = cur.batch(s)
            assert b - a == gb
            ids = step_ids(m, cfg, cur, s)
            assert np.array_equal(ids, ref[a:b]), (
                f"phase {i} (tp{tp} pp{pp} dp{dp} gb{gb}) step {s}: samples {a}..{b}")
            stream.append(ids)
        step += k
    stream = np.concatenate(stream)
    assert len(stream) == total
    check_epochs(stream, n)
    assert np.array_equal(stream, ref)


def test_earlier_step_views_keep_old_slices(mount, tmp_path):
    """docs/dataset.md: "earlier steps keep their old batches (views of steps before S are
    computed with the config that was current then)": after dp 2 -> 4 at step 4,
    DP rank 0's and 1's views of step 3 are still the old config's slices 0 and 1
    (6 records each of global_batch 12), not slices of 4."""
    write_fixed(tmp_path / "ds", COUNTS)
    index = file_uri(tmp_path / "ds")
    cfg = dataset_cfg(1, 1, 1, 2, index, 12, shuffle=False)
    mount.setup(SCHEMA, cfg)
    cur = Cursor(12, 2)
    before = {s: read_views(mount, cfg, s) for s in range(4)}
    write_steps(mount, cfg, 4)
    new = dataset_cfg(2, 1, 1, 4, index, 20, shuffle=False)
    reconfigure(mount, new)
    cur.change(4, 20, 4)
    assert np.array_equal(step_ids(mount, new, cur, 4), np.arange(48, 68))
    for s in range(4):
        for d in range(2):
            got = {e: mount.read(f"ranks/{d}/data/{s}{e}") for e in FIXED_EXTS}
            a, b = cur.slices(s)[d]
            ids = check_fixed_view(got, b - a)
            assert np.array_equal(ids, np.arange(a, b)), (s, d)
            assert got == before[s][d], (s, d)


def test_seed_decides_the_order(mount_factory, tmp_path):
    """Same seed on two mounts: same order; another seed: another order."""
    n = write_fixed(tmp_path / "ds", COUNTS)
    orders = []
    for name, seed in [("a", 5), ("b", 5), ("c", 6)]:
        m = mount_factory(name=name)
        cfg = dataset_cfg(1, 1, 1, 1, file_uri(tmp_path / "ds"), n, seed=seed)
        m.setup(SCHEMA, cfg)
        cur = Cursor(n, 1)
        orders.append([step_ids(m, cfg, cur, s) for s in range(2)])
    for o in orders:
        check_epochs(np.concatenate(o), n)
    assert all(np.array_equal(x, y) for x, y in zip(orders[0], orders[1]))
    assert not np.array_equal(orders[0][0], orders[2][0])
    assert not np.array_equal(orders[0][1], orders[2][1])


# ------------------------------------------------------------- 3. views

def test_views(mount_factory, tmp_path):
    n = write_fixed(tmp_path / "ds", [40, 33, 37])  # 110 records = 10 steps of 11
    m = mount_factory()
    cfg = dataset_cfg(1, 2, 2, 2, file_uri(tmp_path / "ds"), 11, shuffle=False, epochs=1)
    m.setup(SCHEMA, cfg)
    cur = Cursor(11, 2, n)
    assert cur.slices(3) == [(33, 39), (39, 44)]  # 6 + 5
    for s in [0, 3, 9]:
        views = read_views(m, cfg, s)
        for (a, b), files in zip(cur.slices(s), views):
            ids = check_fixed_view(files, b - a)
            assert np.array_equal(ids, np.arange(a, b))
            # Views are direct I/O: private memory maps work, shared ones are
            # refused by the kernel (libfuse 3.14 cannot ask for them).
            path = m.p("ranks/5/data", f"{s}.npy")
            assert np.array_equal(np.load(path, mmap_mode="c"), np.load(path))
            expect_errno(errno.ENODEV, np.load, path, mmap_mode="r")
    check_listing(m, cfg, 0)
    # The listing follows the saved step.
    write_steps(m, cfg, 4)
    check_listing(m, cfg, 4)
    assert sorted(os.listdir(m.p("ranks/3"))) == ["data", "model", "rank.json", "step"]
    # Past the end of the last epoch: ENODATA; the last step still works.
    for s in [10, 11, 1000000]:
        for ext in FIXED_EXTS:
            expect_errno(errno.ENODATA, m.read, f"ranks/0/data/{s}{ext}")
            expect_errno(errno.ENODATA, m.read, f"ranks/7/data/{s}{ext}")
    ids = check_fixed_view(read_views(m, cfg, 9)[1], 5)
    assert np.array_equal(ids, np.arange(105, 110))
    assert m.status()["error"] is None


@pytest.mark.parametrize("epochs", [1, 2])
def test_last_partial_batch(mount_factory, tmp_path, epochs):
    """"A batch may span an epoch boundary (nothing is dropped)": with 113 records
    and global_batch 12, the last step (9 for one epoch, 18 for two) holds the last
    5 (10) samples, in balanced DP slices (3, 2) ((5, 5)); the step after it is past
    the end. Whatever the last step holds, it is one step: its DP ranks either all
    get their slice or all fail."""
    n = write_fixed(tmp_path / "ds", COUNTS)
    m = mount_factory()
    cfg = dataset_cfg(1, 1, 1, 2, file_uri(tmp_path / "ds"), 12, shuffle=False, epochs=epochs)
    m.setup(SCHEMA, cfg)
    cur = Cursor(12, 2, epochs * n)
    last = epochs * n // 12
    assert cur.slices(last) == ([(108, 111), (111, 113)] if epochs == 1 else
                                [(216, 221), (221, 226)])
    expect_errno(errno.ENODATA, m.read, f"ranks/0/data/{last + 1}.npy")
    expect_errno(errno.ENODATA, m.read, f"ranks/1/data/{last + 1}.ids.npy")
    got = []
    for r in range(2):
        try:
            got.append(np.load(io.BytesIO(m.read(f"ranks/{r}/data/{last}.ids.npy"))).tolist())
        except OSError as e:
            got.append(errno.errorcode[e.errno])
    assert all(isinstance(g, list) for g in got) or all(g == "ENODATA" for g in got), \
        f"step {last}: DP ranks disagree on whether it exists: {got}"
    assert np.array_equal(step_ids(m, cfg, cur, last), np.arange(last * 12, epochs * n) % n)


@pytest.mark.parametrize("rec", [REC, 1100])
def test_windows(mount_factory, tmp_path, rec):
    """docs/dataset.md "Windows": <s>-<e>.npy and <s>-<e>.ids.npy stack the views of
    steps [s, e) of a rank: [e - s, local_batch, ...], through epoch ends
    and reconfigurations, as long as the local batch does not change (small
    records, and records of 4400 bytes: replies span pages)."""
    d = tmp_path / "ds"
    n = write_fixed(d, [40, 33, 37], n=rec)  # 110 records; 12 a step: 220 in 18 steps + 4
    m = mount_factory()
    cfg = dataset_cfg(1, 2, 1, 2, file_uri(d), 12, seed=3, epochs=2)
    m.setup(SCHEMA, cfg)

    def window(r, s, e, m=m):
        w = np.load(m.p("ranks", r, "data", f"{s}-{e}.npy"))
        wid = np.load(m.p("ranks", r, "data", f"{s}-{e}.ids.npy"))
        for k, step in enumerate(range(s, e)):
            assert np.array_equal(w[k], np.load(m.p("ranks", r, "data", f"{step}.npy")))
            assert np.array_equal(wid[k], np.load(m.p("ranks", r, "data", f"{step}.ids.npy")))
        assert np.array_equal(w, fixed_records(wid.ravel(), rec).reshape(w.shape))
        for ext in FIXED_EXTS:
            name = f"ranks/{r}/data/{s}-{e}{ext}"
            assert os.path.getsize(m.p(name)) == len(m.read(name))
        return w, wid

    for r in range(4):
        w, wid = window(r, 3, 8)
        assert w.shape == (5, 6, rec) and wid.shape == (5, 6) and wid.dtype == np.int64
    # Windows of both DP ranks through epoch 0 (steps 0-8: 108 of its 110
    # records; step 9 holds its end): each record once.
    by_d = {coords(cfg, r)[1]: r for r in range(4)}
    ids = np.concatenate([window(by_d[dd], 0, 9)[1].ravel() for dd in range(2)])
    assert len(ids) == 108 and len(set(ids.tolist())) == 108 and ids.max() < n
    assert window(by_d[0], 6, 12)[0].shape == (6, 6, rec)  # across the epoch end
    assert window(1, 0, 1)[0].shape == (1, 6, rec)
    # The last step is shorter (4 records: 2 a DP rank): not in a window.
    expect_errno(errno.EINVAL, m.read, "ranks/0/data/15-19.npy")
    assert window(0, 15, 18)[0].shape == (3, 6, rec)
    expect_errno(errno.ENODATA, m.read, "ranks/0/data/17-20.npy")
    for name in ["8-8.npy", "9-8.npy", "1-66.npy", "01-3.npy", "1-03.npy", "1-.npy", "-3.npy",
                 "1-3-5.npy", "1-3.bin"]:
        expect_errno(errno.ENOENT, m.read, f"ranks/0/data/{name}")
    # After a change of dp at step 6: windows before keep the old slices,
    # a window across the change is refused (its local batch changes).
    old = window(by_d[0], 2, 6)[1]
    write_steps(m, cfg, 6)
    cfg = dataset_cfg(2, 4, 1, 1, file_uri(d), 12, seed=3, epochs=2)
    reconfigure(m, cfg)
    for r in range(4):  # all of DP rank 0 now: the old slices of DP rank 0
        assert np.array_equal(window(r, 2, 6)[1], old)
    expect_errno(errno.EINVAL, m.read, "ranks/0/data/5-8.npy")
    w, wid = window(3, 6, 9)
    assert w.shape == (3, 12, rec)
    # The longest window, in a run without an epoch limit.
    m2 = mount_factory(name="long")
    m2.setup(SCHEMA, dataset_cfg(1, 1, 1, 1, file_uri(d), 12, seed=3))
    w, wid = window(0, 1, 65, m2)
    assert w.shape == (64, 12, rec)
    check_epochs(np.concatenate([np.load(m2.p("ranks/0/data/0.ids.npy")), wid.ravel()]), n)


# ------------------------------------------------- 4. variable records

def test_variable_records(mount_factory, tmp_path):
    n = write_variable(tmp_path / "vds", [30, 17, 25])
    index = file_uri(tmp_path / "vds")
    m = mount_factory(name="plain")
    cfg = dataset_cfg(1, 2, 1, 2, index, 9, shuffle=False, epochs=2)
    m.setup(SCHEMA, cfg)
    cur = Cursor(9, 2, 2 * n)
    stream = [step_ids(m, cfg, cur, s, var=True) for s in range(5)]
    check_listing(m, cfg, 0, VAR_EXTS)
    write_steps(m, cfg, 5)
    cfg = dataset_cfg(2, 1, 1, 3, index, 10, shuffle=False, epochs=2)
    reconfigure(m, cfg)
    cur.change(5, 10, 3)
    check_listing(m, cfg, 5, VAR_EXTS)
    stream += [step_ids(m, cfg, cur, s, var=True) for s in range(5, 14)]  # to 135 of 144
    stream = np.concatenate(stream)
    assert np.array_equal(stream, np.arange(len(stream)) % n)
    expect_errno(errno.ENODATA, m.read, "ranks/0/data/15.bin")
    for name in ["1-3.bin", "1-3.offsets.npy", "1-3.ids.npy"]:  # windows: fixed records
        expect_errno(errno.ENOENT, m.read, f"ranks/0/data/{name}")
    # Shuffled: every epoch a permutation, contents match the ids.
    m2 = mount_factory(name="shuffled")
    cfg = dataset_cfg(1, 1, 1, 2, index, 8, seed=3)
    m2.setup(SCHEMA, cfg)
    cur = Cursor(8, 2)
    stream = np.concatenate([step_ids(m2, cfg, cur, s, var=True) for s in range(18)])
    check_epochs(stream, n)
    assert not np.array_equal(stream[:n], np.arange(n))


# ------------------------------------------------------------ 5. HTTP

@pytest.mark.parametrize("rec", [REC, 1100])
def test_shard_shrinks_under_the_mount(mount_factory, tmp_path, rec):
    """The daemon reads file shards through a memory map: a shard cut short
    while mounted gives EIO naming it (the SIGBUS is caught), never a crash
    or wrong bytes, and the views read fine again once the shard is whole
    (small records, and records of 4400 bytes: a copy spans pages)."""
    d = tmp_path / "ds"
    n = write_fixed(d, [400, 50], n=rec)
    whole = (d / "shard0.bin").read_bytes()
    m = mount_factory(extra_args=("--prefetch", "1"))
    cfg = dataset_cfg(1, 1, 1, 1, file_uri(d), 10, shuffle=False, epochs=1)
    m.setup(SCHEMA, cfg)
    cur = Cursor(10, 1, n)
    assert np.array_equal(step_ids(m, cfg, cur, 0, n=rec), np.arange(10))  # shard0 mapped
    time.sleep(0.3)  # the prefetch of step 1
    with open(d / "shard0.bin", "r+b") as f:
        f.truncate(10 * rec * 4)
    expect_errno(errno.EIO, m.read, "ranks/0/data/30.npy")
    err = m.status()["error"]
    assert "shard0.bin" in err and "shorter than when opened" in err, err
    # Reopened: the next read names the new size.
    expect_errno(errno.EIO, m.read, "ranks/0/data/31.npy")
    err = m.status()["error"]
    assert f"shard0.bin: holds {10 * rec * 4} bytes" in err, err
    (d / "shard0.bin").write_bytes(whole)
    for s in [1, 30, 31, 39, 40]:
        assert np.array_equal(step_ids(m, cfg, cur, s, n=rec), np.arange(10 * s, 10 * s + 10))


def http_get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.read()


def stats(port):
    return json.loads(http_get(port, "/__stats"))


@pytest.fixture
def http_server():
    """http_server(root, **kw) -> port of a rangeserver serving @root; all stopped
    at teardown."""
    rangeserver = pytest.importorskip("rangeserver")
    servers = []

    def start(root, **kw):
        server, port = rangeserver.start(str(root), **kw)
        servers.append(server)
        return port

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


HTTP_COUNTS = [8000, 8000, 8000, 8000]  # 4 shards of ~3.9 MiB: 16 blocks of 1 MiB
HTTP_GB = 64


def test_http_views_equal_file_views(mount_factory, tmp_path, http_server):
    d = tmp_path / "ds"
    n = write_fixed(d, [3000, 1234, 2500], index=False)
    run_mlfs("dataset", "index", d, "--dtype", "int32", "--shape", REC)
    port = http_server(d)
    ds = {"seed": 9, "epochs": 2}
    mf, mh = mount_factory(name="file"), mount_factory(name="http")
    cfg_f = dataset_cfg(1, 2, 1, 2, file_uri(d), 100, **ds)
    cfg_h = dataset_cfg(1, 2, 1, 2, f"http://127.0.0.1:{port}/index.json", 100, **ds)
    mf.setup(SCHEMA, cfg_f)
    mh.setup(SCHEMA, cfg_h)
    cur = Cursor(100, 2, 2 * n)
    for s in [0, 1, 2, 40, 67, 90, 133]:
        assert read_views(mh, cfg_h, s) == read_views(mf, cfg_f, s), f"step {s}"
        step_ids(mh, cfg_h, cur, s)
    expect_errno(errno.ENODATA, mh.read, "ranks/0/data/135.npy")
    for r in range(4):  # windows too, through the block cache
        for name in ["60-68.npy", "60-68.ids.npy", "125-134.npy"]:
            assert mh.read(f"ranks/{r}/data/{name}") == mf.read(f"ranks/{r}/data/{name}")
    assert stats(port)["failed"] == 0
    assert mh.status()["error"] is None


def test_http_failures(mount_factory, tmp_path, http_server):
    d = tmp_path / "ds"
    n = write_fixed(d, HTTP_COUNTS)
    port = http_server(d)
    index = f"http://127.0.0.1:{port}/index.json"
    cfg = dataset_cfg(1, 1, 1, 2, index, HTTP_GB, shuffle=False)
    cur = Cursor(HTTP_GB, 2)
    steps = n // HTTP_GB  # 500

    # 30% of requests fail, in every way: every view of an epoch is still right.
    m = mount_factory(name="flaky")
    m.setup(SCHEMA, cfg)
    http_get(port, "/__set?fail_rate=0.3&modes=500,503,drop,truncate,ignore-range,short,badrange")
    for s in range(steps):
        ids = step_ids(m, cfg, cur, s)
        assert np.array_equal(ids, np.arange(s * HTTP_GB, (s + 1) * HTTP_GB))
    st = stats(port)
    print("flaky source:", st)
    assert st["failed"] > 0 and st["requests"] > st["failed"], st
    http_get(port, "/__set?fail_rate=0&modes=500")

    # A source that keeps failing, once the index is loaded: EIO for a view not yet
    # cached, status.json names the shard; never wrong bytes.
    m = mount_factory(name="down")
    m.setup(SCHEMA, cfg)
    for s in range(6):
        step_ids(m, cfg, cur, s)  # steps 0..5 and their prefetch: shard 0, block 0
    settle(port)
    http_get(port, "/__set?fail_always=1&modes=500&reset=1")
    far = 403  # records 25792..25855: shard 3, bytes 924672..957696, never read before
    assert 24000 <= far * HTTP_GB and (far + 1 - 375) * HTTP_GB * REC * 4 <= 1 << 20
    expect_errno(errno.EIO, m.read, f"ranks/0/data/{far}.npy")
    settle(port)
    st = stats(port)
    assert 1 < st["requests"] <= 6, st  # a 5xx is retried, up to 5 times
    for ext in FIXED_EXTS:
        expect_errno(errno.EIO, m.read, f"ranks/1/data/{far}{ext}")
    err = m.status()["error"]
    assert err and "shard3.bin" in err and "500" in err, err
    ok = step_ids(m, cfg, cur, 2)  # cached: still served, and right
    assert np.array_equal(ok, np.arange(128, 192))
    # Failures off: the same view opens fine.
    http_get(port, "/__set?fail_always=0&fail_rate=0")
    ids = step_ids(m, cfg, cur, far)
    assert np.array_equal(ids, np.arange(far * HTTP_GB, (far + 1) * HTTP_GB))
    # A 404 (shard gone from the server) fails at once, without retries.
    settle(port)
    http_get(port, "/__set?reset=1")
    os.rename(d / "shard2.bin", d / "gone.bin")
    mid = 16000 // HTTP_GB + 20  # shard 2, ~660 KiB in: not read before
    expect_errno(errno.EIO, m.read, f"ranks/0/data/{mid}.npy")
    settle(port)
    assert stats(port)["requests"] == 1, stats(port)
    err = m.status()["error"]
    assert "shard2.bin" in err and "404" in err, err
    os.rename(d / "gone.bin", d / "shard2.bin")
    ids = step_ids(m, cfg, cur, mid)
    assert np.array_equal(ids, np.arange(mid * HTTP_GB, (mid + 1) * HTTP_GB))


def test_http_stall_bounded(mount_factory, tmp_path, http_server):
    """A source that accepts requests and never answers: a view open fails with
    EIO once the deadline (--http-deadline 5) stops the attempts, each cut after
    --http-timeout 1 s without a byte, not after 6 attempts of 30 s; status.json
    names the shard and says it timed out. A config naming such an index fails
    as promptly (EINVAL)."""
    d = tmp_path / "ds"
    n = write_fixed(d, HTTP_COUNTS)
    port = http_server(d)
    cfg = dataset_cfg(1, 1, 1, 2, f"http://127.0.0.1:{port}/index.json", HTTP_GB, shuffle=False)
    cur = Cursor(HTTP_GB, 2)
    m = mount_factory(extra_args=("--http-timeout", "1", "--http-deadline", "5"))
    m.setup(SCHEMA, cfg)
    for s in range(3):
        step_ids(m, cfg, cur, s)
    settle(port)
    http_get(port, "/__set?fail_always=1&modes=stall&stall_seconds=120&reset=1")
    far = 403  # shard 3: not fetched before (test_http_failures)
    t0 = time.monotonic()
    expect_errno(errno.EIO, m.read, f"ranks/0/data/{far}.npy")
    took = time.monotonic() - t0
    assert 1 <= took < 20, took
    err = m.status()["error"]
    assert err and "shard3.bin" in err and "timed out" in err, err
    assert "nothing received for 1 s" in err and "deadline of 5 s reached" in err, err
    assert stats(port)["requests"] >= 2  # retried within the deadline

    # The index itself from a stalled server: the config write fails as promptly.
    cfg2 = dataset_cfg(2, 1, 1, 2, f"http://127.0.0.1:{port}/index.json", HTTP_GB,
                       shuffle=False, seed=5)
    m2 = mount_factory(name="fresh", extra_args=("--http-timeout", "1",
                                                  "--http-deadline", "3"))
    m2.write("schema.json", json.dumps(SCHEMA))
    t0 = time.monotonic()
    expect_errno(errno.EINVAL, m2.write, "config.json", json.dumps(cfg2))
    took = time.monotonic() - t0
    assert took < 15, took
    st = m2.status()
    assert st["version"] is None and "index.json" in st["error"], st
    assert "timed out (nothing received for 1 s)" in st["error"], st
    assert "deadline of 3 s reached" in st["error"], st
    http_get(port, "/__set?fail_always=0&stall_seconds=5")
    # Once the source answers again, the same view opens fine.
    ids = step_ids(m, cfg, cur, far)
    assert np.array_equal(ids, np.arange(far * HTTP_GB, (far + 1) * HTTP_GB))


def test_http_options_refused(tmp_path):
    for opt, bad in [("--http-timeout", "0"), ("--http-timeout", "1.5"),
                     ("--http-deadline", "-3"), ("--http-deadline", "x")]:
        p = run_mlfs("mount", tmp_path, "--node", "n0", "--cluster", tmp_path / "c.json",
                     opt, bad, check=False)
        assert p.returncode == 2 and opt in p.stderr and f'"{bad}"' in p.stderr, p.stderr


def settle(port, quiet=0.5, timeout=20):
    """Waits until the server has seen no request for @quiet seconds (prefetch done)."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        n = stats(port)["requests"]
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        time.sleep(0.05)


# ------------------------------------------------- 6. corrupt indexes

def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


GOOD_IDX = {"records": "fixed", "dtype": "int32", "shape": [REC],
            "shards": [{"uri": "shard0.bin", "count": 10}, {"uri": "shard1.bin", "count": 5}]}


def bad_index(case, d):
    """Builds a bad dataset for @case in folder @d: (dataset dict, words the error
    must contain)."""
    write_fixed(d, [10, 5])
    idx = json.loads(json.dumps(GOOD_IDX))
    if case == "invalid json":
        return {"index": write_index(d, json.dumps(idx).replace(",", " ", 1))}, ["index.json"]
    if case == "truncated":
        return {"index": write_index(d, json.dumps(idx)[:60])}, ["index.json"]
    if case == "missing shards":
        del idx["shards"]
        return {"index": write_index(d, idx)}, ["shards"]
    if case == "missing count":
        del idx["shards"][1]["count"]
        return {"index": write_index(d, idx)}, ["count"]
    if case == "missing shape":
        del idx["shape"]
        return {"index": write_index(d, idx)}, ["shape"]
    if case == "wrong dtype":
        idx["dtype"] = "int33"
        return {"index": write_index(d, idx)}, ["int33"]
    if case == "wrong records":
        idx["records"] = "fixd"
        return {"index": write_index(d, idx)}, ["records"]
    if case == "negative count":
        idx["shards"][0]["count"] = -5
        return {"index": write_index(d, idx)}, ["count"]
    if case == "missing file":
        return {"index": "file://" + str(d / "nope" / "index.json")}, ["nope/index.json"]
    if case == "unreachable http":
        return {"index": f"http://127.0.0.1:{closed_port()}/index.json"}, ["127.0.0.1"]
    if case == "offsets wrong length":
        write_variable(d, [6, 4])
        offs = np.fromfile(d / "v0.off", "<i8")
        offs[:-1].tofile(d / "v0.off")  # count entries instead of count + 1
        return {"index": file_uri(d)}, ["offsets"]
    if case == "unknown dataset field":
        return {"index": file_uri(d), "sed": 4}, ["sed"]
    if case == "zero global_batch":
        return {"index": file_uri(d), "global_batch": 0}, ["global_batch"]
    raise AssertionError(case)


BAD_CASES = ["invalid json", "truncated", "missing shards", "missing count", "missing shape",
             "wrong dtype", "wrong records", "negative count", "missing file",
             "unreachable http", "offsets wrong length", "unknown dataset field",
             "zero global_batch"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_corrupt_index_refused(mount, tmp_path, case):
    ds, words = bad_index(case, tmp_path / "ds")
    ds.setdefault("global_batch", 4)
    mount.write("schema.json", json.dumps(SCHEMA))
    # As the first config: EINVAL, the reason in status.json, no layout.
    cfg = {"version": 1, "tp": 1, "pp": 1, "dp": 2, "nodes": ["n0"], "dataset": ds}
    expect_errno(errno.EINVAL, mount.write, "config.json", json.dumps(cfg))
    st = mount.status()
    assert st["version"] is None and st["error"], st
    for w in words:
        assert w in st["error"], (w, st["error"])
    assert os.listdir(mount.p("ranks")) == []
    # After a config without a dataset: refused too, the old config stays, no data/.
    mount.write("config.json", json.dumps({k: v for k, v in cfg.items() if k != "dataset"}))
    before = mount.read("config.json")
    cfg["version"] = 2
    expect_errno(errno.EINVAL, mount.write, "config.json", json.dumps(cfg))
    st = mount.status()
    assert st["version"] == 1 and st["error"], st
    assert mount.read("config.json") == before
    assert sorted(os.listdir(mount.p("ranks"))) == ["0", "1"]
    assert "data" not in os.listdir(mount.p("ranks/0"))


def call_or_release(fn, fifo, timeout=10):
    """Runs fn() on a thread; returns the errno of the OSError it raised (0 if
    none). A FIFO open that waits for a writer (the daemon before the fix: the
    caller hung uninterruptibly) is released after @timeout s by opening @fifo
    for writing, and the test fails instead of hanging."""
    out = {}

    def run():
        try:
            fn()
            out["errno"] = 0
        except OSError as e:
            out["errno"] = e.errno

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        for _ in range(50):  # open for writing until the blocked reader takes it
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
            t.join(0.1)
            if not t.is_alive():
                break
        pytest.fail(f"still blocked after {timeout} s: the daemon waits on the FIFO {fifo}")
    return out["errno"]


@pytest.mark.parametrize("which", ["index", "offsets"])
def test_fifo_index_refused(mount, tmp_path, which):
    """A FIFO named as the index (or as an offsets table) is refused at once
    with EINVAL, status.json naming it, never waited on."""
    d = tmp_path / "ds"
    if which == "index":
        write_fixed(d, [10, 5], index=False)
        fifo = d / "index.json"
    else:
        write_variable(d, [6, 4])
        fifo = d / "v0.off"
        os.unlink(fifo)
    os.mkfifo(fifo)
    mount.write("schema.json", json.dumps(SCHEMA))
    cfg = dataset_cfg(1, 1, 1, 2, file_uri(d), 4)
    t0 = time.monotonic()
    assert call_or_release(lambda: mount.write("config.json", json.dumps(cfg)),
                           fifo) == errno.EINVAL
    assert time.monotonic() - t0 < 5
    st = mount.status()
    assert st["version"] is None, st
    assert f"{fifo}: not a regular file" in st["error"], st


def test_fifo_shard_refused(mount_factory, tmp_path):
    """A shard that is a FIFO: the view open fails with EIO, status.json naming
    the shard and why, never waited on; the other shards' views still open."""
    d = tmp_path / "ds"
    write_fixed(d, [10, 5])
    os.unlink(d / "shard1.bin")
    os.mkfifo(d / "shard1.bin")
    m = mount_factory(extra_args=("--prefetch", "1"))
    cfg = dataset_cfg(1, 1, 1, 1, file_uri(d), 5, shuffle=False, epochs=1)
    m.setup(SCHEMA, cfg)
    t0 = time.monotonic()
    assert call_or_release(lambda: m.read("ranks/0/data/2.npy"), d / "shard1.bin") == errno.EIO
    assert time.monotonic() - t0 < 5
    err = m.status()["error"]
    assert f"{d / 'shard1.bin'}: not a regular file" in err, err
    cur = Cursor(5, 1, 15)
    assert np.array_equal(step_ids(m, cfg, cur, 1), np.arange(5, 10))


# ------------------------------------------- 7. reconfiguration refusals

def test_reconfiguration_refusals(mount, tmp_path):
    n = write_fixed(tmp_path / "ds", COUNTS)
    shutil.copytree(tmp_path / "ds", tmp_path / "copy")  # same records, another index
    index = file_uri(tmp_path / "ds")
    ds = {"seed": 1, "shuffle": False, "epochs": 3}
    cfg = dataset_cfg(1, 1, 1, 2, index, 12, **ds)
    mount.setup(SCHEMA, cfg)
    write_steps(mount, cfg, 2)
    before = read_views(mount, cfg, 2)

    def refused(new, word):
        p = reconfigure(mount, new, check=False)
        assert p.returncode != 0, p.stdout
        assert word in p.stderr, (word, p.stderr)
        # Written straight to config.json: EINVAL, the reason in status.json.
        expect_errno(errno.EINVAL, mount.write, "config.json", json.dumps(new))
        st = mount.status()
        assert st["version"] == 1 and st["state"] == "idle" and word in st["error"], st
        assert read_views(mount, cfg, 2) == before
        check_listing(mount, cfg, 2)

    def with_ds(**kw):
        d = dict(ds, index=index, global_batch=12)
        d.update(kw)
        return {"version": 2, "tp": 1, "pp": 1, "dp": 2, "nodes": ["n0"],
                "dataset": {k: v for k, v in d.items() if v is not None}}

    refused(with_ds(seed=2), "seed")
    refused(with_ds(shuffle=True), "shuffle")
    refused(with_ds(epochs=4), "epochs")
    refused(with_ds(epochs=None), "epochs")  # no limit is a change too
    refused(with_ds(index=file_uri(tmp_path / "copy")), "index")
    bad = with_ds(global_batch=3)
    bad["dp"] = 4
    refused(bad, "global_batch")
    # A global_batch change with more DP ranks goes through; the cursor carries.
    good = with_ds(global_batch=20)
    good["dp"] = 4
    reconfigure(mount, good)
    cur = Cursor(12, 2, 3 * n)
    cur.change(2, 20, 4)
    assert cur.slices(2) == [(24, 29), (29, 34), (34, 39), (39, 44)]
    ids = step_ids(mount, good, cur, 2)
    assert np.array_equal(ids, np.arange(24, 44))


def test_global_batch_below_dp_refused(mount, tmp_path):
    write_fixed(tmp_path / "ds", COUNTS)
    mount.write("schema.json", json.dumps(SCHEMA))
    cfg = dataset_cfg(1, 1, 1, 4, file_uri(tmp_path / "ds"), 3)
    expect_errno(errno.EINVAL, mount.write, "config.json", json.dumps(cfg))
    st = mount.status()
    assert st["version"] is None and "global_batch" in st["error"], st
    cfg["dataset"]["global_batch"] = 4
    mount.write("config.json", json.dumps(cfg))
    assert [len(np.load(mount.p(f"ranks/{r}/data/0.ids.npy"))) for r in range(4)] == [1] * 4


def test_stalled_source_blocks_no_fuse_worker(mount_factory, tmp_path, http_server):
    """Issue 11: opens of views whose source stalls wait on I/O workers, not on the
    mount's FUSE workers: with 24 such opens in flight (more than libfuse's 16
    workers), partition reads, status.json and listings answer at once; the views
    open once the source answers again."""
    d = tmp_path / "ds"
    write_fixed(d, HTTP_COUNTS)
    port = http_server(d)
    cfg = dataset_cfg(1, 1, 1, 2, f"http://127.0.0.1:{port}/index.json", HTTP_GB, shuffle=False)
    m = mount_factory(extra_args=("--http-timeout", "8", "--http-deadline", "120",
                                  "--prefetch", "0"))
    m.setup(SCHEMA, cfg)
    np.save(m.p("ranks/0/model/layers/0/w.npy"), np.full((4, 4), 7, np.float32))
    settle(port)
    http_get(port, "/__set?fail_always=1&modes=stall&stall_seconds=600&reset=1")
    results = {}

    def open_view(step):
        try:
            results[step] = m.read(f"ranks/{step % 2}/data/{step}.ids.npy")
        except OSError as e:
            results[step] = e

    steps = [100 + 13 * i for i in range(24)]  # spread over shards 0-3, none read yet
    threads = [threading.Thread(target=open_view, args=(s,)) for s in steps]
    for t in threads:
        t.start()
    time.sleep(1.0)
    assert not results, "the source was meant to stall"
    for _ in range(3):
        t0 = time.monotonic()
        assert np.array_equal(np.load(m.p("ranks/0/model/layers/0/w.npy")),
                              np.full((4, 4), 7, np.float32))
        assert m.status()["version"] == 1
        assert sorted(os.listdir(m.p("ranks"))) == ["0", "1"]
        assert time.monotonic() - t0 < 5, "a FUSE worker waited on the stalled source"
    http_get(port, "/__set?fail_always=0&stall_seconds=0")
    for t in threads:
        t.join(180)
    for s in steps:
        got = results[s]
        assert not isinstance(got, Exception), (s, got)
        ids = np.load(io.BytesIO(got))
        half = HTTP_GB // 2
        lo = s * HTTP_GB + (s % 2) * half
        assert np.array_equal(ids, np.arange(lo, lo + half)), s
