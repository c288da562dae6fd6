"""A one-node mlfs mount for the benchmarks: mounted in the foreground under
@tmp/<name>, unmounted by close(), which checks that the daemon exited 0."""
import json
import os
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLFS = os.path.join(ROOT, os.environ.get("BUILD", "build"), "mlfs")


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
