"""A one-node mlfs mount for the benchmarks: mounted in the foreground under
@tmp/<name>, unmounted by close(), which checks that the daemon exited 0.
The daemon is $BUILD/mlfs (BUILD defaults to "build", as in the Makefile).

Also aligned_empty(): the buffers a benchmark writes from, reads into or
copies, on the mlfs side and the reference side alike.
"""
import json
import mmap
import os
import subprocess
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLFS = os.path.join(ROOT, os.environ.get("BUILD", "build"), "mlfs")

HUGE = 2 << 20


def aligned_empty(shape, dtype):
    """An uninitialised array whose data starts on a 2 MiB boundary (so on a
    page boundary), in an anonymous mapping advised for transparent huge
    pages as NumPy advises its own large arrays. np.empty's data starts 16
    bytes past a page boundary (malloc's chunk header): on the VM of issue
    10 that slowed the kernel's copy into it about 3x, and the tmpfs
    reference more than mlfs. The mapping lives as long as the array."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    m = mmap.mmap(-1, nbytes + HUGE)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    base = np.frombuffer(m, np.uint8)
    skip = -base.ctypes.data % HUGE
    out = base[skip:skip + nbytes].view(dtype).reshape(shape)
    assert out.ctypes.data % HUGE == 0
    return out


class Mount:
    def __init__(self, tmp, name="mnt", devices=8, extra_args=()):
        self.dir = os.path.join(tmp, name)
        os.makedirs(self.dir)
        cluster = os.path.join(tmp, f"{name}-cluster.json")
        with open(cluster, "w") as f:
            json.dump({"nodes": [{"id": "n0", "addr": "127.0.0.1:7070", "devices": devices}]}, f)
        self.err = open(os.path.join(tmp, f"{name}.err"), "w")
        self.proc = subprocess.Popen([MLFS, "mount", self.dir, "--node", "n0", "--cluster",
                                      cluster, "-f", *extra_args], stderr=self.err)
        for _ in range(500):
            if os.path.ismount(self.dir):
                return
            time.sleep(0.02)
        raise RuntimeError("mount did not appear")

    def write(self, name, obj):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(json.dumps(obj))

    def view(self, r, s, ext=".npy"):
        """Dataset view file of rank @r at step @s."""
        return os.path.join(self.dir, "ranks", str(r), "data", f"{s}{ext}")

    def close(self):
        subprocess.run(["fusermount3", "-u", self.dir], check=True)
        assert self.proc.wait(timeout=30) == 0
