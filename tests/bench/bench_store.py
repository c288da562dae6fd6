#!/usr/bin/python3
"""Store benchmarks: I/O through the mount vs tmpfs, and local reconfiguration
vs single-thread memcpy, each measured against its reference in this same run.
Every buffer written from, read into or copied is page-aligned (aligned_empty)
and shared by both sides.

Usage: bench_store.py [--size-mib N]   (default 1024: a 1 GiB partition)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmount import MLFS, Mount, aligned_empty


def best(fn, reps=3):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def write_file(path, header, data):
    with open(path, "wb", buffering=0) as f:
        f.write(header)
        f.write(memoryview(data).cast("B"))


def read_file(path, out):
    with open(path, "rb", buffering=0) as f:
        view = memoryview(out).cast("B")
        n = 0
        while n < len(view):
            got = f.readinto(view[n:n + (64 << 20)])
            if not got:
                break
            n += got
    return n


def io_bench(tmp, size_mib):
    n = size_mib << 18  # float32 elements
    m = Mount(tmp, devices=1)
    try:
        m.write("schema.json", {"num_layers": 0, "tensors": [
            {"name": "w", "dtype": "float32", "shape": [n]}]})
        m.write("config.json", {"version": 1, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]})
        part = os.path.join(m.dir, "ranks/0/model/w.npy")
        header = open(part, "rb").read(128)
        header = header[:10 + int.from_bytes(header[8:10], "little")]
        data = aligned_empty(n, np.float32)
        np.random.default_rng(0).random(n, dtype=np.float32, out=data)
        out = aligned_empty(n, np.float32)
        shm = tempfile.NamedTemporaryFile(dir="/dev/shm", delete=False)
        shm.close()
        try:
            t_tmpfs_w = best(lambda: write_file(shm.name, header, data))
            t_mlfs_w = best(lambda: write_file(part, header, data))
            # tmpfs has no cold state: its reads come from memory either way.
            t_tmpfs_r = best(lambda: read_file(shm.name, out))

            def cold():  # a new buffer each time, its pages dropped from the kernel cache
                write_file(part, header, data)
                fd = os.open(part, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
                t0 = time.perf_counter()
                read_file(part, out)
                return time.perf_counter() - t0
            t_cold = min(cold() for _ in range(3))
            read_file(part, out)
            t_warm = best(lambda: read_file(part, out))
            # The file is the header then data; out holds its first n * 4 bytes.
            got, want = out.view(np.uint8), data.view(np.uint8)
            assert got[:len(header)].tobytes() == header
            assert np.array_equal(got[len(header):], want[:len(want) - len(header)])
        finally:
            os.unlink(shm.name)
    finally:
        m.close()
    gib = (n * 4 + len(header)) / (1 << 30)
    return [
        ("write", gib / t_mlfs_w, gib / t_tmpfs_w, 0.5),
        ("cold read", gib / t_cold, gib / t_tmpfs_r, 0.5),
        ("warm re-read", gib / t_warm, gib / t_tmpfs_r, 0.9),
    ]


def reconf_bench(tmp, size_mib):
    rows = size_mib << 8  # 4 layers of [rows, 256] float32 = size_mib MiB each... scaled below
    rows = max(1024, (size_mib << 20) // (4 * 256 * 4))
    m = Mount(tmp, devices=8)
    try:
        m.write("schema.json", {"num_layers": 4, "tensors": [
            {"name": "l/{L}/w", "dtype": "float32", "shape": [rows, 256], "split": {"dim": 0}},
            {"name": "l/{L}/v", "dtype": "float32", "shape": [256, rows], "split": {"dim": 1}}]})
        m.write("config.json", {"version": 1, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"]})
        results = []
        version = 1
        for tp in (4, 8, 2):
            version += 1
            path = os.path.join(tmp, f"c{version}.json")
            with open(path, "w") as f:
                json.dump({"version": version, "tp": tp, "pp": 1, "dp": 1, "nodes": ["n0"]}, f)
            subprocess.run([MLFS, "reconfigure", m.dir, path], check=True, capture_output=True)
            st = json.load(open(os.path.join(m.dir, "status.json")))["last"]
            results.append((st["bytes_copied"], st["seconds"]))
        copied = max(b for b, _ in results)
        secs = min(s for b, s in results if b == copied)
        src = aligned_empty(copied // 4, np.float32)
        np.random.default_rng(1).random(copied // 4, dtype=np.float32, out=src)
        dst = aligned_empty(copied // 4, np.float32)
        dst.fill(0)  # fault its pages in before timing, as np.copyto's first rep did
        t_memcpy = best(lambda: np.copyto(dst, src))
    finally:
        m.close()
    gib = copied / (1 << 30)
    return [("reconfiguration (tp change)", gib / secs, gib / t_memcpy, 0.7)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rows += io_bench(os.path.join(tmp, "io"), a.size_mib)
    with tempfile.TemporaryDirectory() as tmp:
        rows += reconf_bench(os.path.join(tmp, "rc"), a.size_mib)
    print(f"store benchmarks, {a.size_mib} MiB, {os.cpu_count()} CPUs "
          f"(reference measured in the same run)\n")
    print("| operation | mlfs GiB/s | reference | reference GiB/s | ratio | goal |")
    print("|---|---|---|---|---|---|")
    refs = {"write": "tmpfs write", "cold read": "tmpfs read", "warm re-read": "tmpfs read",
            "reconfiguration (tp change)": "1-thread memcpy"}
    for name, v, ref, goal in rows:
        print(f"| {name} | {v:.2f} | {refs[name]} | {ref:.2f} | {v / ref:.2f}x | >= {goal}x |")


if __name__ == "__main__":
    sys.exit(main())
