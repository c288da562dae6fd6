"""mlfs daemons on this machine for examples and tests: one etcd and N daemons on
127.0.0.1, or one daemon alone, as a context manager.

    with mlfs.testing.start(nnodes=4, devices=2, job="train") as cl:
        cl.mounts            # {"n0": "<tmp>/n0", ...}: each node's mount point
        cl.mount("n0")       # an mlfs.Mount of it
        cl.spec              # cluster.json: {"job", "etcd", "token_file", "nodes": [...]}
        cl.status("n1")      # that node's status.json
        cl.wait_version(2)   # every running node at version 2, idle
        cl.kill("n1")        # kill -9 of n1's daemon (its dead mount lazily unmounted)
        cl.restart("n1")     # started again, empty: it joins the job

    with mlfs.testing.start(nnodes=1, devices=8) as cl:   # one node: no etcd, no token
        mnt = cl.mount("n0")

start() runs Debian's etcd-server (`etcd`, installed by `make deps`) on two free
loopback ports with its data in a temporary directory, writes a token file (0600)
and cluster.json (DESIGN section 5: every node "n<i>" with its own free port and
@devices devices), and mounts every node (`mlfs mount <tmp>/n<i> --node n<i>
--cluster cluster.json -f`, each daemon's stderr in <tmp>/n<i>.log). A job of
one node needs no etcd (etcd=None runs one only for two nodes or more). At the
end every daemon still running is unmounted (`mlfs umount`) and must exit 0,
with no "error" in its log unless a node was killed, etcd is stopped, and the
temporary directory removed (unless it was given). Failures raise ClusterError.

The `mlfs` binary is $MLFS, else <source tree>/$BUILD/mlfs when this package
is imported from the source tree and that binary is built, else `mlfs` on
the PATH.
"""
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

from .client import Mount

__all__ = ["ClusterError", "LocalCluster", "start", "free_port", "wait_for", "find_mlfs",
           "MLFS", "ROOT", "ETCD"]

_TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The source tree this package was imported from (<ROOT>/python/mlfs), or None.
ROOT = _TREE if os.path.isfile(os.path.join(_TREE, "python", "pyproject.toml")) else None
ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def find_mlfs():
    """The mlfs binary to run: see the module's doc."""
    if os.environ.get("MLFS"):
        return os.environ["MLFS"]
    built = os.path.join(ROOT, os.environ.get("BUILD", "build"), "mlfs") if ROOT else None
    if built and os.path.isfile(built):
        return built
    return shutil.which("mlfs") or built or "mlfs"


MLFS = find_mlfs()


class ClusterError(RuntimeError):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, fn, timeout=30):
    """Polls fn() until it returns something true, which is returned; ClusterError
    after @timeout seconds."""
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > end:
            raise ClusterError(f"timed out waiting for {what}")
        time.sleep(0.05)


class LocalCluster:
    """The etcd, the cluster.json and the daemons of one job; see the module's doc."""

    def __init__(self, tmp, nnodes, devices, job, mlfs, etcd):
        self.tmp, self.job, self.mlfs = tmp, job, mlfs
        self.etcd = None
        self.procs, self.mounts, self.killed = {}, {}, set()
        self.ever_killed = False  # a kill makes the others log errors about it
        ports = set()
        while len(ports) < nnodes + 2:
            ports.add(free_port())
        cport, pport, *nports = sorted(ports)
        nodes = [{"id": f"n{i}", "addr": f"127.0.0.1:{p}", "devices": devices}
                 for i, p in enumerate(nports)]
        self.cluster_path = os.path.join(tmp, "cluster.json")
        self.token_path = self.etcd_url = None
        self.spec = {"nodes": nodes}
        if etcd:
            self.etcd_url = f"http://127.0.0.1:{cport}"
            self._etcd_peer = f"http://127.0.0.1:{pport}"
            self.token_path = os.path.join(tmp, "token")
            self.spec = {"job": job, "etcd": self.etcd_url, "token_file": self.token_path,
                         "nodes": nodes}

    @property
    def ids(self):
        return [n["id"] for n in self.spec["nodes"]]

    def mount(self, node_id="n0"):
        """An mlfs.Mount of that node's mount point."""
        return Mount(self.mounts[node_id])

    def log(self, node_id):
        try:
            with open(os.path.join(self.tmp, f"{node_id}.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def logs(self, tail=2000):
        return "".join(f"--- {i}'s log:\n{self.log(i)[-tail:]}" for i in self.mounts)

    def status(self, node_id):
        with open(os.path.join(self.mounts[node_id], "status.json"), "rb") as f:
            return json.loads(f.read())

    def running(self):
        return [i for i in self.mounts if i not in self.killed]

    def wait_version(self, version, ids=None, timeout=60):
        """Every running node (or @ids) at @version and idle: {id: status.json}."""
        ids = ids or self.running()

        def ok():
            sts = {i: self.status(i) for i in ids}
            bad = [i for i, s in sts.items() if s["state"] == "failed"]
            if bad:
                raise ClusterError(f"{bad[0]} failed: {sts[bad[0]].get('error')}")
            return sts if all(s["version"] == version and s["state"] == "idle"
                              for s in sts.values()) else None
        return wait_for(f"every node of {ids} at version {version}", ok, timeout)

    def kill(self, node_id):
        """kill -9 of a daemon; its dead mount is lazily unmounted."""
        self.killed.add(node_id)
        self.ever_killed = True
        self.procs[node_id].send_signal(signal.SIGKILL)
        self.procs[node_id].wait()
        subprocess.run(["fusermount3", "-u", "-z", self.mounts[node_id]], capture_output=True)

    def restart(self, node_id):
        """Starts a killed node's daemon again, empty (its memory is gone): it registers
        and joins the job; returns when it is mounted."""
        if node_id not in self.killed:
            raise ClusterError(f"{node_id} is running: kill it first")
        self.killed.discard(node_id)
        self._spawn(node_id, "a")
        self._wait_mounted(node_id)

    # ---------------------------------------------------------------- start, stop

    def _start_etcd(self):
        with open(os.path.join(self.tmp, "etcd.log"), "w") as log:
            self.etcd = subprocess.Popen(
                [ETCD, "--name", "default", "--data-dir", os.path.join(self.tmp, "etcd"),
                 "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
                 "--listen-peer-urls", self._etcd_peer,
                 "--initial-advertise-peer-urls", self._etcd_peer,
                 "--initial-cluster", f"default={self._etcd_peer}"],
                stdout=subprocess.DEVNULL, stderr=log)

        def etcd_up():
            if self.etcd.poll() is not None:
                raise ClusterError(f"etcd exited {self.etcd.returncode}: see "
                                   f"{os.path.join(self.tmp, 'etcd.log')}")
            try:
                urllib.request.urlopen(f"{self.etcd_url}/health", timeout=1).read()
                return True
            except OSError:
                return False
        wait_for("etcd", etcd_up)
        fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, (os.urandom(16).hex() + "\n").encode())
        os.close(fd)

    def _start(self):
        if self.etcd_url:
            self._start_etcd()
        with open(self.cluster_path, "w") as f:
            json.dump(self.spec, f)
        for i in self.ids:
            self.mounts[i] = os.path.join(self.tmp, i)
            os.mkdir(self.mounts[i])
            self._spawn(i, "w")
        for i in self.ids:
            self._wait_mounted(i)

    def _spawn(self, i, mode):
        with open(os.path.join(self.tmp, f"{i}.log"), mode) as err:
            self.procs[i] = subprocess.Popen(
                [self.mlfs, "mount", self.mounts[i], "--node", i, "--cluster",
                 self.cluster_path, "-f"], stdout=subprocess.DEVNULL, stderr=err)

    def _wait_mounted(self, i):
        def mounted():
            if self.procs[i].poll() is not None:
                raise ClusterError(f"mlfs mount --node {i} exited "
                                   f"{self.procs[i].returncode}: {self.log(i)}")
            return os.path.ismount(self.mounts[i])
        wait_for(f"the mount of {i}", mounted)

    def _stop(self, check):
        problems = []
        for i, p in self.procs.items():
            if p.poll() is None:
                problems += self._umount(i, p)
            # After a kill the others may log what they saw of it: only their exit counts.
            if i not in self.killed and (p.returncode or not self.ever_killed
                                         and "error" in self.log(i).lower()):
                problems.append(f"{i}: the daemon exited {p.returncode}: {self.log(i)[-2000:]}")
        if self.etcd:
            self.etcd.kill()
            self.etcd.wait()
        if check and problems:
            raise ClusterError("\n".join(problems))

    def _umount(self, i, p):
        """Unmounts node @i and waits for its daemon @p; the problems met."""
        problems = []
        for _ in range(50):  # a mount can be busy for a moment after its last user
            r = subprocess.run([self.mlfs, "umount", self.mounts[i], "--force"],
                               capture_output=True, text=True)
            if r.returncode == 0:
                break
            time.sleep(0.1)
        else:
            problems.append(f"mlfs umount {self.mounts[i]}: {r.stderr.strip()}")
            subprocess.run(["fusermount3", "-u", "-z", self.mounts[i]], capture_output=True)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            problems.append(f"{i}: the daemon did not exit after its unmount")
        return problems


@contextlib.contextmanager
def start(nnodes, devices=2, job="demo", tmp=None, mlfs=None, etcd=None):
    """A job of @nnodes daemons of @devices devices each, with one etcd when @etcd (by
    default when @nnodes > 1), in @tmp (a new temporary directory, removed at the end,
    when None); yields a LocalCluster. @mlfs: the binary (default MLFS)."""
    own = tmp is None
    if own:
        tmp = tempfile.mkdtemp(prefix=f"mlfs-{job}-")
    else:
        os.makedirs(tmp, exist_ok=True)
    cl = LocalCluster(tmp, nnodes, devices, job, mlfs or MLFS,
                      nnodes > 1 if etcd is None else etcd)
    ok = False
    try:
        cl._start()
        yield cl
        ok = True
    finally:
        try:
            cl._stop(check=ok)  # after a failure, the failure is what to report
        finally:
            if own:
                shutil.rmtree(tmp, ignore_errors=True)
