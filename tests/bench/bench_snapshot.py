#!/usr/bin/python3
"""Snapshots and restore (issue 18, item 6): `mlfs snapshot` and `mlfs import --from
SNAPSHOT` on one mount, each against a reference measured by this script in the same
run, on the same disk:

  write     `mlfs snapshot <mnt> --to DIR` (zstd level 1, every file fsync'ed) of a
            megatron-gpt state (bf16 weights, fp32 Adam moments; values like a
            model's: N(0, 0.02) weights, N(0, 1e-3) exp_avg, its square exp_avg_sq)
            against `dd bs=4M conv=fdatasync` of as many bytes as the state holds
            uncompressed (from a file of random bytes on /dev/shm), and against
            torch.save of the same per-rank tensors (one file per rank, fsync'ed);
  restore   `mlfs import <mnt> --from DIR` into the layout it was taken in against
            `dd` reading the file dd wrote; caches dropped before every read
            (`sync; echo 3 > /proc/sys/vm/drop_caches` as root, else
            posix_fadvise(DONTNEED) on every file read);
  layout    the same snapshot (tp2 pp2 dp1) restored into tp4 pp1 dp1 against the
            user's alternative: torch.load of the tp2 pp2 per-rank files, then every
            tp4 pp1 rank's tensors cut from them with PyTorch (each full tensor put
            together from its old TP parts with narrow/copy_, then each new part cut
            from it), the same bytes; every restored partition and every PyTorch
            tensor checked bit-exact against the NumPy slice of the state;
  zstd      compression ratio and speed (`zstd -b<L> -i1`, one thread) at levels 1, 3
            and 9, of random values (32 MiB of each kind) and of a trained state: the
            training example (examples/elastic_train.py, a wider model: --trained-
            hidden) after --trained-steps Adam steps at tp1 pp1 dp1 on a mount, its
            fp32 weights, their bf16 rounding (what a bf16 model holds), and its
            moments; with mlfs's own level-1 ratio per state from the manifests.

Each timed operation runs --reps times (default 5) in turns with its reference, which
goes first in every other run; the first run, the median and the best are reported
(this machine is shared and noisy), with the share of the CPU other processes (and the
hypervisor's steal) used meanwhile. The checksum cost of a reconfiguration is
tests/bench/bench_sum.py's (MLFS_BENCH_NOSUM has no effect on snapshots and imports,
which always hash).

Usage: bench_snapshot.py [--size-mib N] [--reps N] [--trained-steps N]
                         [--trained-hidden H] [--dir DIR] [--json FILE]
  --dir   where snapshots, dd's and torch.save's files go, in a new directory (default:
          $TMPDIR or /tmp, or $BUILD when that is tmpfs); on the disk to measure.
The daemon is $BUILD/mlfs (BUILD defaults to "build", as in the Makefile).
"""
import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from bench_cluster import (BenchError, CpuMeter, _segments, check, coords,  # noqa: E402
                           fmt_bytes, log, part_shape, partitions, pick_schema, state_bytes,
                           tp_cut, world)
from benchmount import MLFS, Mount  # noqa: E402
from test_store import expand, holds, np_dtype, state_dtype  # noqa: E402

SRC = {"version": 1, "tp": 2, "pp": 2, "dp": 1, "nodes": ["n0"]}   # snapshot taken here
DST = {"tp": 4, "pp": 1, "dp": 1, "nodes": ["n0"]}                  # and restored here
DEVICES = 4
STEP = 100
LEVELS = (1, 3, 9)
BLOB = 32 << 20  # bytes of each kind of random values for zstd -b


# ------------------------------------------------------------------ helpers

def mlfs(*args, timeout=600):
    p = subprocess.run([MLFS, *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    check(p.returncode == 0, f"mlfs {' '.join(map(str, args))}: {p.stderr.strip()}")
    return p.stdout


def bf16_bits(a):
    """float32 @a rounded to bfloat16 (nearest, ties to even), as raw uint16 bits."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def values(rng, state, dtype, shape):
    """Model-like values: weights N(0, 0.02), exp_avg N(0, 1e-3), exp_avg_sq its square."""
    a = rng.standard_normal(shape, dtype=np.float32)
    a *= 0.02 if state == "model" else 1e-3
    if state.endswith("exp_avg_sq"):
        a *= a
    return bf16_bits(a) if dtype == "bfloat16" else a.astype(np_dtype(dtype), copy=False)


def make_state(schema, rng):
    full = {}
    for state in schema["states"]:
        for name, spec, _ in expand(schema):
            if "tied" not in spec:
                full[(state, name)] = values(rng, state, state_dtype(schema, state, spec),
                                             spec["shape"])
    return full


class Cache:
    """Dropping the page cache before a timed read: drop_caches as root, else
    posix_fadvise(DONTNEED) on every file under the paths given."""

    def __init__(self):
        try:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")
            self.how = "sync; echo 3 > /proc/sys/vm/drop_caches"
        except OSError:
            self.how = "posix_fadvise(POSIX_FADV_DONTNEED) on every file read (not root)"

    def drop(self, *paths):
        os.sync()
        if self.how.startswith("sync"):
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")
            return
        for p in paths:
            for d, _, names in os.walk(p) if os.path.isdir(p) else [("", [], [p])]:
                for n in names:
                    fd = os.open(os.path.join(d, n), os.O_RDONLY)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    os.close(fd)


def timed(fn, pids):
    """(seconds, share of the machine's CPU other processes used meanwhile, result)."""
    meter = CpuMeter(pids).start()
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    cpu = meter.stop()
    return wall, cpu["others"] / (cpu["cpus"] * cpu["wall"]), out


def fs_of(path):
    """"SOURCE FSTYPE" of the filesystem holding @path."""
    return subprocess.run(["findmnt", "-n", "-o", "SOURCE,FSTYPE", "-T", path],
                          capture_output=True, text=True).stdout.strip()


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(path) for n in ns)


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def close_mount(m):
    """Unmounts @m and waits for its daemon, even if the mount is busy."""
    gc.collect()
    try:
        m.close()
    except Exception as e:  # noqa: BLE001 - the mount must go whatever happened
        log(f"   unmount of {m.dir}: {e!r}; lazily unmounting and killing the daemon")
        subprocess.run(["fusermount3", "-u", "-z", m.dir], capture_output=True)
        if m.proc.poll() is None:
            m.proc.kill()
        m.proc.wait()
        return False
    return True


# ----------------------------------------------------------- mlfs layouts

def verify(mnt, schema, cfg, full):
    """Every partition of every rank of @cfg on mount @mnt equals its NumPy slice."""
    n = 0
    for r in range(world(cfg)):
        t = coords(cfg, r)[0]
        for _, state, _, name, spec in partitions(schema, cfg, r):
            got = np.load(os.path.join(mnt, "ranks", str(r), state, name + ".npy"))
            want = tp_cut(full[(state, name)], spec.get("split"), cfg["tp"], t)
            check(got.dtype == want.dtype and np.array_equal(got, want),
                  f"tp{cfg['tp']} pp{cfg['pp']} rank {r} {state}/{name} differs from the state")
            n += 1
    return n


def reconfigure(m, tmp, cfg):
    path = os.path.join(tmp, f"config-{cfg['version']}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    mlfs("reconfigure", m.dir, path)


def manifest_ratios(snap):
    """{state: (bytes, compressed)} from a snapshot's manifest."""
    man = json.load(open(os.path.join(snap, "manifest.json")))
    out = {}
    for f in man["files"]:
        b, c = out.get(f["state"], (0, 0))
        out[f["state"]] = (b + f["bytes"], c + f["compressed"])
    return out


# ------------------------------------------------------------------ torch

def torch_tensor(a):
    import torch
    if a.dtype == np.uint16:  # bfloat16 bits
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def torch_numpy(t):
    import torch
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def torch_save_ranks(schema, cfg, full, out_dir):
    """Builds every rank's {"<state>/<name>": tensor} of @cfg (untimed), then returns
    a function that torch.saves each to out_dir/rank<r>.pt and fsyncs it."""
    ranks = {}
    for r in range(world(cfg)):
        t = coords(cfg, r)[0]
        ranks[r] = {f"{state}/{name}": torch_tensor(
            tp_cut(full[(state, name)], spec.get("split"), cfg["tp"], t))
            for _, state, _, name, spec in partitions(schema, cfg, r)}

    def save():
        import torch
        os.makedirs(out_dir, exist_ok=True)
        for r, sd in ranks.items():
            with open(os.path.join(out_dir, f"rank{r}.pt"), "wb") as f:
                torch.save(sd, f)
                f.flush()
                os.fsync(f.fileno())
        fsync_dir(out_dir)
    return save


def torch_restore(schema, old, new, in_dir):
    """torch.load of every rank file of layout @old, then every rank of @new's tensors
    cut from them in PyTorch: {new rank: {"<state>/<name>": tensor}}."""
    import torch
    loaded = {r: torch.load(os.path.join(in_dir, f"rank{r}.pt")) for r in range(world(old))}
    L = schema["num_layers"]
    out = {r: {} for r in range(world(new))}
    for state in schema["states"]:
        for name, spec, layer in expand(schema):
            if "tied" in spec:
                continue
            key = f"{state}/{name}"
            p_old = next(p for p in range(old["pp"]) if holds(spec, layer, L, old["pp"], p))
            # dp replica 0 of stage p_old, TP ranks 0..tp-1
            parts = [loaded[p_old * old["tp"] * old["dp"] + t][key] for t in range(old["tp"])]
            split = spec.get("split")
            news = [r for r in range(world(new))
                    if holds(spec, layer, L, new["pp"], coords(new, r)[2])]
            if not split:
                for r in news:
                    out[r][key] = parts[0].clone()
                continue
            k, n = split["dim"], spec["shape"][split["dim"]]
            padded, _ = _segments(split, old["tp"], 0, n)
            shape = list(spec["shape"])
            shape[k] = padded
            whole = torch.empty(shape, dtype=parts[0].dtype)
            for t, part in enumerate(parts):  # the full tensor from its old TP parts
                pos = 0
                for lo, hi in _segments(split, old["tp"], t, n)[1]:
                    whole.narrow(k, lo, hi - lo).copy_(part.narrow(k, pos, hi - lo))
                    pos += hi - lo
            for r in news:  # each new rank's part of it
                t = coords(new, r)[0]
                a = torch.empty(part_shape(spec, new["tp"], t), dtype=whole.dtype)
                pos = 0
                for lo, hi in _segments(split, new["tp"], t, n)[1]:
                    real = max(0, min(hi, n) - lo)
                    if real:
                        a.narrow(k, pos, real).copy_(whole.narrow(k, lo, real))
                    if hi - lo > real:
                        a.narrow(k, pos + real, hi - lo - real).zero_()
                    pos += hi - lo
                out[r][key] = a
            del whole, parts
        for sd in loaded.values():  # this state's old tensors are no longer needed
            for key in [k for k in sd if k.startswith(state + "/")]:
                del sd[key]
    return out


def check_torch(schema, new, got, full):
    for r, sd in got.items():
        t = coords(new, r)[0]
        want = {f"{state}/{name}": (state, name, spec)
                for _, state, _, name, spec in partitions(schema, new, r)}
        check(set(sd) == set(want), f"PyTorch rank {r}: other tensors than the layout's")
        for key, (state, name, spec) in want.items():
            ref = tp_cut(full[(state, name)], spec.get("split"), new["tp"], t)
            a = torch_numpy(sd[key])
            check(a.dtype == ref.dtype and np.array_equal(a, ref),
                  f"PyTorch rank {r} {key} differs from the state")


# ------------------------------------------------------------------- zstd

def zstd_bench(path, level):
    """(ratio, compression MB/s, decompression MB/s) of `zstd -b<level> -i1` (one thread)."""
    p = subprocess.run(["zstd", f"-b{level}", "-i1", "-q", path], capture_output=True,
                       text=True, timeout=600)
    for line in (p.stdout + p.stderr).splitlines():
        f = line.split()
        if f and f[0] == f"-{level}" and len(f) >= 6:
            return float(f[2].strip("()")), float(f[3]), float(f[5])
    raise BenchError(f"zstd -b{level} {path}: {p.stdout}{p.stderr}")


def trained_state(tmp, steps, hidden):
    """The training example's full state ({(state, name): fp32 array}) after @steps Adam
    steps at tp1 pp1 dp1, and its snapshot's level-1 ratios per state."""
    os.environ.setdefault("BUILD", "build")
    import elastic_train as et
    if hidden:
        et.MODEL.update(hidden=hidden, ffn=4 * hidden)
    m = Mount(tmp, name="train", devices=1)
    try:
        et.set_up(m.dir, tmp, (1, 1, 1))
        t0 = time.perf_counter()
        events = et.run_workers(m.dir, 1, steps)
        secs = time.perf_counter() - t0
        loss = [e["loss"] for e in sorted(events, key=lambda e: e.get("step", 0))
                if e["kind"] == "loss"]
        sch = json.load(open(os.path.join(m.dir, "schema.json")))
        full = {}
        for state in sch["states"]:
            for name, spec, _ in expand(sch):
                if "tied" not in spec:
                    full[(state, name)] = np.load(os.path.join(m.dir, "full", state,
                                                               name + ".npy"))
        snap = os.path.join(tmp, "trained-snap")
        mlfs("snapshot", m.dir, "--to", snap)
        ratios = manifest_ratios(snap)
    finally:
        close_mount(m)
    return full, ratios, loss, secs, et.MODEL


# ------------------------------------------------------------------- main

def summary(runs):
    """First run and best of a list of (seconds, others' CPU share)."""
    return {"first": runs[0][0], "median": statistics.median(s for s, _ in runs),
            "best": min(s for s, _ in runs), "runs": [s for s, _ in runs],
            "others": [o for _, o in runs]}


def run(args, tmp):
    import torch
    torch.set_num_threads(os.cpu_count())
    res = {"cpus": os.cpu_count()}
    cache = Cache()
    fs = fs_of(tmp)
    check("tmpfs" not in fs, f"--dir {tmp} is on {fs}: use a directory on a disk")
    schema = pick_schema(args.size_mib)
    S = state_bytes(schema)
    hidden = schema["tensors"][0]["shape"][1]
    log(f"== model: megatron-gpt, hidden {hidden}, {schema['num_layers']} layers, bf16 "
        f"weights N(0, 0.02), fp32 exp_avg N(0, 1e-3) and exp_avg_sq (its square): "
        f"{fmt_bytes(S)} of state; {args.reps} runs of each; files in {tmp} ({fs}); "
        f"before every read: {cache.how}")
    res.update(state_bytes=S, fs=fs, cache=cache.how)

    rng = np.random.default_rng(18)
    full = make_state(schema, rng)
    ddsrc = tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="bench-snap-", delete=False)
    m = None
    try:
        with ddsrc:  # dd's source: S random bytes in memory
            left = S
            while left:
                n = min(left, 64 << 20)
                ddsrc.write(rng.bytes(n))
                left -= n
        m = Mount(tmp, name="mnt", devices=DEVICES)
        pids = {"daemon": m.proc.pid}
        m.write("schema.json", schema)
        m.write("config.json", SRC)
        ckpt = tempfile.mkdtemp(dir="/dev/shm", prefix="bench-snap-ckpt-")
        try:
            for (state, name), a in full.items():
                path = os.path.join(ckpt, state, name + ".npy")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                np.save(path, a)
            mlfs("import", m.dir, "--from", ckpt, "--step", STEP)
        finally:
            shutil.rmtree(ckpt)
        nparts = verify(m.dir, schema, SRC, full)
        log(f"   imported and checked: {nparts} partitions at tp2 pp2 dp1, step {STEP}")

        # --- write and restore in the same layout, against dd --------------------
        snap_w, dd_w, snap_r, dd_r, zbytes = [], [], [], [], None
        snap = None
        for i in range(args.reps):  # even runs: dd first; odd runs: mlfs first
            ddf = os.path.join(tmp, f"dd-{i}")
            if snap:
                shutil.rmtree(snap)
            snap = os.path.join(tmp, f"snap-{i}")

            def dd_write():
                os.sync()
                dd_w.append(timed(lambda: subprocess.run(
                    ["dd", f"if={ddsrc.name}", f"of={ddf}", "bs=4M", "conv=fdatasync"],
                    check=True, capture_output=True), pids)[:2])
                check(os.path.getsize(ddf) == S, "dd wrote another size")

            def snap_write():
                os.sync()
                s, o, out = timed(lambda: mlfs("snapshot", m.dir, "--to", snap), pids)
                snap_w.append((s, o))
                return out

            def dd_read():
                cache.drop(ddf)
                dd_r.append(timed(lambda: subprocess.run(
                    ["dd", f"if={ddf}", "of=/dev/null", "bs=4M"], check=True,
                    capture_output=True), pids)[:2])

            def snap_read():
                cache.drop(snap)
                snap_r.append(timed(lambda: mlfs("import", m.dir, "--from", snap), pids)[:2])
            if i % 2 == 0:
                dd_write()
                out = snap_write()
                dd_read()
                snap_read()
            else:
                out = snap_write()
                dd_write()
                snap_read()
                dd_read()
            os.unlink(ddf)
            zbytes = dir_bytes(snap)
            log(f"   run {i + 1} ({'dd' if i % 2 == 0 else 'mlfs'} first): dd write "
                f"{s_fmt(dd_w[-1])}, mlfs snapshot {s_fmt(snap_w[-1])}; dd read "
                f"{s_fmt(dd_r[-1])}, mlfs import (tp2 pp2 dp1) {s_fmt(snap_r[-1])}")
            if i == 0:
                log(f"   ({out.splitlines()[0]})")
        verify(m.dir, schema, SRC, full)
        # the same import with the snapshot in the page cache: what is not disk I/O
        warm = [timed(lambda: mlfs("import", m.dir, "--from", snap), pids)[:2]
                for _ in range(args.reps)]
        log(f"   mlfs import (tp2 pp2 dp1), the snapshot in the page cache: "
            f"{', '.join(s_fmt(x) for x in warm)}")
        res["same_layout"] = {"dd_write": summary(dd_w), "snapshot": summary(snap_w),
                              "dd_read": summary(dd_r), "import": summary(snap_r),
                              "import_warm": summary(warm),
                              "snapshot_bytes_on_disk": zbytes}
        res["ratios_level1_random"] = manifest_ratios(snap)

        # --- restore into another layout, against torch.load + re-slicing --------
        tdir = os.path.join(tmp, "torch")
        save = torch_save_ranks(schema, SRC, full, tdir)
        t_save = []
        for i in range(args.reps):
            os.sync()
            s, o, _ = timed(save, pids)
            t_save.append((s, o))
        del save
        gc.collect()
        tbytes = dir_bytes(tdir)
        res["torch_save"] = dict(summary(t_save), bytes_on_disk=tbytes)
        log(f"   torch.save of the {world(SRC)} tp2 pp2 dp1 ranks' tensors, fsync'ed: "
            f"{', '.join(s_fmt(x) for x in t_save)} ({fmt_bytes(tbytes)})")
        reconfigure(m, tmp, dict(DST, version=2))
        dst = dict(DST, version=2)
        m_new, t_new = [], []
        for i in range(args.reps):  # even runs: mlfs first; odd runs: PyTorch first
            def mlfs_new():
                cache.drop(snap)
                m_new.append(timed(lambda: mlfs("import", m.dir, "--from", snap), pids)[:2])
                if i == 0:
                    verify(m.dir, schema, dst, full)

            def torch_new():
                cache.drop(tdir)
                s, o, got = timed(lambda: torch_restore(schema, SRC, dst, tdir), pids)
                t_new.append((s, o))
                if i == 0:
                    check_torch(schema, dst, got, full)
                del got
                gc.collect()
            for fn in ((mlfs_new, torch_new) if i % 2 == 0 else (torch_new, mlfs_new)):
                fn()
            log(f"   run {i + 1}: into tp4 pp1 dp1: mlfs import {s_fmt(m_new[-1])}, "
                f"torch.load + re-slice {s_fmt(t_new[-1])}")
        res["other_layout"] = {"import": summary(m_new), "torch": summary(t_new)}
        shutil.rmtree(tdir)
        shutil.rmtree(snap)
    finally:
        os.unlink(ddsrc.name)
        if m is not None:
            close_mount(m)
    full = None  # noqa: F841 - frees the state before the compression part
    gc.collect()

    # --- compression: random values and a trained state ---------------------------
    blobs = []
    rng = np.random.default_rng(7)
    n = BLOB // 4
    for label, state, dtype in (("bf16 weights, N(0, 0.02)", "model", "bfloat16"),
                                ("fp32 exp_avg, N(0, 1e-3)", "optim/exp_avg", "float32"),
                                ("fp32 exp_avg_sq, its square", "optim/exp_avg_sq",
                                 "float32")):
        a = values(rng, state, dtype, (n if dtype == "float32" else 2 * n,))
        blobs.append(("random", label, a))
    trained, tratios, loss, tsecs, model = trained_state(os.path.join(tmp, "train"),
                                                         args.trained_steps,
                                                         args.trained_hidden)
    log(f"   trained the example (llama, {model['layers']} layers, hidden {model['hidden']}, "
        f"ffn {model['ffn']}) {args.trained_steps} steps in {tsecs:.1f} s: loss "
        f"{loss[0]:.3f} -> {loss[-1]:.3f}")

    def cat(state):
        return np.concatenate([a.ravel() for (s, _), a in sorted(trained.items()) if s == state])
    w = cat("model")
    blobs += [("trained", "bf16 weights (fp32 rounded)", bf16_bits(w)),
              ("trained", "fp32 weights", w),
              ("trained", "fp32 exp_avg", cat("optim/exp_avg")),
              ("trained", "fp32 exp_avg_sq", cat("optim/exp_avg_sq"))]
    comp = []
    for kind, label, a in blobs:
        path = os.path.join(tmp, "blob")
        a.tofile(path)
        row = {"kind": kind, "data": label, "bytes": a.nbytes}
        for lv in LEVELS:
            row[lv] = zstd_bench(path, lv)
        os.unlink(path)
        comp.append(row)
    res["zstd"] = comp
    res["ratios_level1_trained"] = tratios
    res["trained"] = {"model": model, "steps": args.trained_steps, "loss": [loss[0], loss[-1]]}
    return res


def s_fmt(x):
    s, o = x
    return f"{s:.2f} s (others {100 * o:.0f}%)"


def report(res, reps):
    S = res["state_bytes"]
    sl, ol = res["same_layout"], res["other_layout"]
    Z = sl["snapshot_bytes_on_disk"]
    log(f"\n== snapshot and restore: {fmt_bytes(S)} of state (one mount, tp2 pp2 dp1, "
        f"{res['cpus']} CPUs), snapshot {fmt_bytes(Z)} on disk; {reps} runs each: the "
        f"first, the median, the best; x = reference's time / mlfs's (above 1: mlfs faster)")
    log("| operation | mlfs s: first, median, best (state GB/s, first) | reference | "
        "reference s: first, median, best (GB/s, first) | x, first | x, median | x, best |")
    log("|---|---|---|---|---|---|---|")

    def row(name, a, ref_name, b):
        def three(x):
            return (f"{x['first']:.2f}, {x['median']:.2f}, {x['best']:.2f} "
                    f"({S / x['first'] / 1e9:.2f})")
        log(f"| {name} | {three(a)} | {ref_name} | {three(b)} | "
            + " | ".join(f"{b[k] / a[k]:.2f}x" for k in ("first", "median", "best")) + " |")
    row("snapshot (level 1)", sl["snapshot"], "dd write, conv=fdatasync", sl["dd_write"])
    row("snapshot (level 1)", sl["snapshot"], "torch.save per rank, fsync", res["torch_save"])
    row("import, same layout", sl["import"], "dd read, caches dropped", sl["dd_read"])
    row("import into tp4 pp1 dp1", ol["import"], "torch.load + re-slice", ol["torch"])
    for k, v in (("dd write", sl["dd_write"]), ("snapshot", sl["snapshot"]),
                 ("torch.save", res["torch_save"]), ("dd read", sl["dd_read"]),
                 ("import, same layout", sl["import"]),
                 ("import, same layout, snapshot in the page cache", sl["import_warm"]),
                 ("import, tp4 pp1 dp1", ol["import"]), ("torch.load + re-slice", ol["torch"])):
        log(f"   {k}: runs {', '.join(f'{s:.2f}' for s in v['runs'])} s; others' CPU "
            f"{', '.join(f'{100 * o:.0f}%' for o in v['others'])}")
    # zstd alone: the state's bytes at zstd -b1's one-thread speeds (random rows, this
    # run), on as many threads as the daemon has (--threads: online CPUs)
    speed = dict(zip(("model", "optim/exp_avg", "optim/exp_avg_sq"),
                     [r[1] for r in res["zstd"] if r["kind"] == "random"]))
    per = res["ratios_level1_random"]
    zc = sum(b / (speed[st][1] * 1e6) for st, (b, _) in per.items()) / res["cpus"]
    zd = sum(b / (speed[st][2] * 1e6) for st, (b, _) in per.items()) / res["cpus"]
    log(f"   zstd level 1 alone on {res['cpus']} threads (zstd -b1's speeds, this run): "
        f"{zc:.2f} s to compress the state, {zd:.2f} s to decompress it; snapshot's time "
        f"{sl['snapshot']['first'] / zc:.2f}x that (first), {sl['snapshot']['best'] / zc:.2f}x "
        f"(best); same-layout import's {sl['import']['first'] / zd:.2f}x (first), "
        f"{sl['import']['best'] / zd:.2f}x (best)")
    log(f"   snapshot's disk bytes/s ({fmt_bytes(Z)}) against dd's ({fmt_bytes(S)}): first "
        f"{(Z / sl['snapshot']['first']) / (S / sl['dd_write']['first']):.2f}x, best "
        f"{(Z / sl['snapshot']['best']) / (S / sl['dd_write']['best']):.2f}x")
    log("\n== mlfs's level-1 ratio per state (manifest bytes / compressed)")
    for title, key in (("random values, above", "ratios_level1_random"),
                       ("trained example", "ratios_level1_trained")):
        log(f"   {title}: " + ", ".join(f"{s} {b / c:.3f}x" for s, (b, c) in res[key].items()))
    log(f"\n== zstd -b<L> -i1, one thread (ratio, compression / decompression MB/s); "
        f"trained: {res['trained']['steps']} steps, loss {res['trained']['loss'][0]:.3f} -> "
        f"{res['trained']['loss'][1]:.3f}")
    log("| data | MiB | " + " | ".join(f"level {lv}" for lv in LEVELS) + " |")
    log("|---|---|" + "---|" * len(LEVELS))
    for r in res["zstd"]:
        log(f"| {r['kind']} {r['data']} | {r['bytes'] / 2**20:.1f} | " + " | ".join(
            f"{r[lv][0]:.3f}x, {r[lv][1]:.0f} / {r[lv][2]:.0f}" for lv in LEVELS) + " |")
    log("\n== checksum cost on a reconfiguration: tests/bench/bench_sum.py (MLFS_BENCH_NOSUM)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--trained-steps", type=int, default=30)
    ap.add_argument("--trained-hidden", type=int, default=128,
                    help="the training example's hidden size (ffn 4x); 0: the example's own")
    ap.add_argument("--dir", help="a directory on the disk to measure")
    ap.add_argument("--json")
    args = ap.parse_args()
    where = args.dir or tempfile.gettempdir()
    if not args.dir and "tmpfs" in fs_of(where):  # then the build directory's disk
        where = os.path.join(ROOT, os.environ.get("BUILD", "build"))
    os.makedirs(where, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench-snapshot-", dir=where)
    try:
        res = run(args, tmp)
    except BenchError as e:
        log(f"FAILED: {e}")
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(res, args.reps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
