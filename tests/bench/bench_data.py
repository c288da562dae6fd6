#!/usr/bin/python3
"""Dataset benchmark: reading the views of consecutive steps through the mount
(np.load of ranks/<r>/data/<s>.npy) vs reading the same records from the
shard files directly, measured in the same run on the same files.

A file:// dataset of GPT-style records (int32 [2049]) in 8 shards, config tp1
pp1 dp2, global_batch 256 (--global-batch), shuffle true. Each step is read
once, as in training. References, given the ids of each view (<s>.ids.npy):
- memmap gather: an np.memmap of every shard, fancy-indexed with the ids
  (the fastest way to get the records without mlfs; every page of the maps
  touched beforehand, so it is a memory copy);
- pread per record: one os.preadv per record into the batch array (what a
  map-style Dataset reading its records from the files does).
Rows:
- warm: the steady state of a long run: the shards in the page cache, every
  page of them mapped by both readers (the memmaps touched; the daemon's
  mappings by an untimed pass over epoch 0); each repetition reads steps of
  later epochs that neither side read before (best of --reps);
- windows: the same, reading --window steps (default 8) a file
  (<s>-<e>.npy), after an untimed pass of windows, vs the memmap gather of
  the same records;
- re-read: the views of a warm pass read again (the kernel keeps a view's
  pages), vs np.load of the same views saved on tmpfs (/dev/shm): what any
  file interface costs per step (open, header, read, close);
- tp2: a mount of config tp2 dp2; per step, the second rank of each DP group
  reads the view the first one read (the daemon holds it assembled), vs the
  same tmpfs reference;
- cold: a fresh mount, the shards' pages dropped (posix_fadvise DONTNEED after
  fsync), vs the memmap gather with the same pages dropped.

Buffers: unlike bench_store.py (whose buffers are page-aligned), every array
here is NumPy's, on the mount side and the reference side alike: np.load
allocates its own and reads the bulk of the data straight into it at an
offset its stdio buffer decides (the file's first st_blksize bytes go
through that buffer: 3968 bytes into the array for a 4 KiB buffer and a
128-byte header), whatever the array's alignment; a loader reading into
aligned buffers would also make fewer reads than np.load, which is what
training does. The references' arrays come from the same allocator.

Usage: bench_data.py [--size-mib N] [--steps N] [--dir DIR] [--reps N]
                     [--global-batch N]
   (default 512 MiB in a temporary folder under /tmp, 64 steps, 3 reps,
   global_batch 256: views of 1 MiB)
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmount import MLFS, Mount


SEQ = 2049          # int32 values per record
REC_BYTES = SEQ * 4
SHARDS = 8
GB = 256
DP = 2


def make_dataset(d, size_mib):
    """8 shards of random int32 records, sizes a little uneven; returns counts."""
    total = (size_mib << 20) // REC_BYTES
    base = total // SHARDS
    counts = [base + (i % 3) - 1 for i in range(SHARDS)]
    counts[-1] += total - sum(counts)
    rng = np.random.default_rng(0)
    for i, c in enumerate(counts):
        with open(os.path.join(d, f"shard{i:02d}.bin"), "wb") as f:
            for lo in range(0, c, 4096):
                f.write(rng.integers(0, 50257, (min(4096, c - lo), SEQ), dtype=np.int32).tobytes())
            f.flush()
            os.fsync(f.fileno())
    subprocess.run([MLFS, "dataset", "index", d, "--dtype", "int32", "--shape", str(SEQ)],
                   check=True, capture_output=True)
    return counts


def drop_cache(d, counts):
    for i in range(len(counts)):
        fd = os.open(os.path.join(d, f"shard{i:02d}.bin"), os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def setup_mount(tmp, name, d, extra_args=(), tp=1):
    m = Mount(tmp, name, devices=tp * DP, extra_args=extra_args)
    m.write("schema.json", {"model": "bench", "num_layers": 0, "states": {"model": {}},
                            "tensors": [{"name": "w", "dtype": "float32", "shape": [4]}]})
    m.write("config.json", {"version": 1, "tp": tp, "pp": 1, "dp": DP, "nodes": ["n0"],
                            "dataset": {"index": "file://" + os.path.join(d, "index.json"),
                                        "global_batch": GB, "seed": 1, "shuffle": True}})
    return m


def mount_pass(m, steps):
    """Reads every view of @steps for both DP ranks; returns (seconds, bytes)."""
    t0 = time.perf_counter()
    nbytes = 0
    for s in steps:
        for r in range(DP):
            nbytes += np.load(m.view(r, s)).nbytes
    return time.perf_counter() - t0, nbytes


def shared_pass(m, steps, tp):
    """Reads step by step the views of all tp * DP ranks; returns (seconds,
    bytes) of the reads of a view that another rank of its DP group read
    before (same ids)."""
    t_shared, nbytes = 0.0, 0
    for s in steps:
        seen = set()
        for r in range(tp * DP):
            ids = np.load(m.view(r, s, ".ids.npy")).tobytes()
            t0 = time.perf_counter()
            n = np.load(m.view(r, s)).nbytes
            if ids in seen:
                t_shared += time.perf_counter() - t0
                nbytes += n
            seen.add(ids)
    return t_shared, nbytes


def tmpfs_pass(paths):
    t0 = time.perf_counter()
    for p in paths:
        np.load(p)
    return time.perf_counter() - t0


class Direct:
    """The references: a memory map of each shard, fancy indexing by global id;
    or one pread per record."""

    def __init__(self, d, counts):
        self.maps = [np.memmap(os.path.join(d, f"shard{i:02d}.bin"), np.int32, "r",
                               shape=(c, SEQ)) for i, c in enumerate(counts)]
        self.fds = [os.open(os.path.join(d, f"shard{i:02d}.bin"), os.O_RDONLY)
                    for i in range(len(counts))]
        self.starts = np.cumsum([0] + counts[:-1])

    def close(self):
        for fd in self.fds:
            os.close(fd)

    def touch(self):
        """Maps every page (the steady state of a long run)."""
        for m in self.maps:
            int(m[:, 0].sum())

    def read(self, ids):
        sh = np.searchsorted(self.starts, ids, "right") - 1
        loc = ids - self.starts[sh]
        out = np.empty((len(ids), SEQ), np.int32)
        for h in np.unique(sh):
            sel = sh == h
            out[sel] = self.maps[h][loc[sel]]
        return out

    def pread(self, ids):
        sh = np.searchsorted(self.starts, ids, "right") - 1
        loc = (ids - self.starts[sh]) * REC_BYTES
        out = np.empty((len(ids), SEQ), np.int32)
        for i, (h, off) in enumerate(zip(sh.tolist(), loc.tolist())):
            os.preadv(self.fds[h], [out[i]], off)
        return out

    def run(self, all_ids, how="read"):
        f = getattr(self, how)
        t0 = time.perf_counter()
        nbytes = 0
        for ids in all_ids:
            nbytes += f(ids).nbytes
        return time.perf_counter() - t0, nbytes


def view_ids(m, steps):
    return [np.load(m.view(r, s, ".ids.npy")) for s in steps for r in range(DP)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--steps", type=int, default=64, help="steps per repetition")
    ap.add_argument("--dir", default="/tmp", help="where the shards go (not tmpfs for the "
                    "cold row)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--window", type=int, default=8, help="steps a window file holds")
    ap.add_argument("--global-batch", type=int, default=256,
                    help="records a step (256: views of 1 MiB a DP rank)")
    a = ap.parse_args()
    global GB
    GB = a.global_batch
    rows = []
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        d = os.path.join(tmp, "ds")
        os.makedirs(d)
        counts = make_dataset(d, a.size_mib)
        n = sum(counts)
        S = min(a.steps, n // GB)

        # Cold: a fresh mount, the shards out of the page cache.
        drop_cache(d, counts)
        m = setup_mount(tmp, "cold", d)
        try:
            t_mcold, nb = mount_pass(m, range(S))
            cold_ids = view_ids(m, range(S))
        finally:
            m.close()
        direct = Direct(d, counts)
        drop_cache(d, counts)
        t_dcold, nb_d = direct.run(cold_ids)
        assert nb == nb_d

        # Warm, the steady state of a long run: the shards in the page
        # cache and every page of them mapped by both readers (the direct
        # reader's memmaps touched, the daemon's mappings by an untimed pass
        # over epoch 0); each repetition reads steps of later epochs that
        # neither side read before.
        direct.touch()
        m = setup_mount(tmp, "warm", d)
        try:
            epoch = n // GB
            mount_pass(m, range(epoch))
            t_mwarm, t_dwarm, t_pwarm, t_rwarm = [], [], [], []
            for rep in range(a.reps):
                steps = range(epoch + S * rep, epoch + S * (rep + 1))
                t, nb = mount_pass(m, steps)
                t_mwarm.append(t)
                ids = view_ids(m, steps)
                t_dwarm.append(direct.run(ids)[0])
                t_pwarm.append(direct.run(ids, "pread")[0])
                t_rwarm.append(mount_pass(m, steps)[0])
            for s in list(steps)[:2] + list(steps)[-2:]:  # the readers agree
                for r in range(DP):
                    ids = np.load(m.view(r, s, ".ids.npy"))
                    v = np.load(m.view(r, s))
                    assert np.array_equal(v, direct.read(ids))
                    assert np.array_equal(v, direct.pread(ids))
            # Windows of W steps (<s>-<s+W>.npy): one file for W views,
            # on steps not read before, after an untimed pass of windows
            # (their buffers in the daemon's pool: the steady state).
            t_mwin, t_dwin = [], []
            for rep in range(-1, a.reps):
                lo = epoch + S * (a.reps + 1 + rep)
                wins = [(w, w + a.window) for w in range(lo, lo + S - a.window + 1, a.window)]
                t0 = time.perf_counter()
                nbw = sum(np.load(m.view(r, f"{w}-{e}")).nbytes for w, e in wins
                          for r in range(DP))
                t_mwin.append(time.perf_counter() - t0)
                wids = [np.load(m.view(r, f"{w}-{e}", ".ids.npy")).ravel() for w, e in wins
                        for r in range(DP)]
                t, nb_d = direct.run(wids)
                assert nb_d == nbw
                t_dwin.append(t)
                if rep < 0:
                    t_mwin, t_dwin = [], []
            w, e = wins[-1]
            assert np.array_equal(np.load(m.view(1, f"{w}-{e}")).reshape(-1, SEQ),
                                  direct.read(wids[-1]))
            shm = tempfile.mkdtemp(dir="/dev/shm")
            try:
                paths = []
                for s in steps:
                    for r in range(DP):
                        paths.append(os.path.join(shm, f"{s}-{r}.npy"))
                        with open(m.view(r, s), "rb") as src, open(paths[-1], "wb") as dst:
                            dst.write(src.read())
                t_twarm = min(tmpfs_pass(paths) for _ in range(a.reps))
            finally:
                shutil.rmtree(shm)
        finally:
            m.close()
            direct.close()

        # tp2: the other rank of each DP group reads the view the first one
        # read (assembled once, cached by the daemon).
        m = setup_mount(tmp, "tp2", d, tp=2)
        try:
            t_shared = min(shared_pass(m, range(S * (rep + 1), S * (rep + 2)), 2)[0]
                           for rep in range(a.reps))
        finally:
            m.close()
        gib = nb / (1 << 30)
        rows.append(("warm, first read vs memmap gather", gib / min(t_mwarm),
                     gib / min(t_dwarm), ">= 0.7x"))
        rows.append(("warm, first read vs pread per record", gib / min(t_mwarm),
                     gib / min(t_pwarm), ">= 0.7x"))
        gibw = nbw / (1 << 30)
        rows.append((f"warm, {a.window}-step windows vs memmap gather", gibw / min(t_mwin),
                     gibw / min(t_dwin), ">= 0.7x"))
        rows.append(("re-read vs np.load of the same views on tmpfs", gib / min(t_rwarm),
                     gib / t_twarm, "-"))
        rows.append(("tp2, second rank of a DP group vs np.load on tmpfs", gib / t_shared,
                     gib / t_twarm, "-"))
        rows.append(("cold vs memmap gather", gib / t_mcold, gib / t_dcold, "-"))
    print(f"dataset benchmark: {a.size_mib} MiB in {SHARDS} shards of int32 [{SEQ}] records "
          f"({n} records), tp1 pp1 dp{DP}, global_batch {GB}, shuffle, {S} steps "
          f"x {DP} ranks a pass ({nb >> 20} MiB of views), {os.cpu_count()} CPUs "
          f"(references measured in the same run)\n")
    print("| pass | mount GiB/s | reference GiB/s | ratio mount/reference | goal |")
    print("|---|---|---|---|---|")
    for name, v, ref, goal in rows:
        print(f"| {name} | {v:.2f} | {ref:.2f} | {v / ref:.2f}x | {goal} |")


if __name__ == "__main__":
    sys.exit(main())
