"""One etcd member on loopback for a local job (or a cluster of them: EtcdCluster), and
its keys read through etcd's v3 JSON gateway (urllib only)."""
import base64
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

from .util import ETCD, ClusterError, free_port

KV = collections.namedtuple("KV", "key value lease version create_revision mod_revision")


def _b64(b):
    return base64.b64encode(b if isinstance(b, bytes) else b.encode()).decode()


def _prefix_end(prefix):
    b = prefix.encode()
    return b[:-1] + bytes([b[-1] + 1])


class Etcd:
    """One etcd member on two free loopback ports (client, peer), its data in
    @tmp/etcd/data and its log in @tmp/etcd/etcd.log (@tmp a pathlib.Path).

    url, data_dir, alive, pid
    start() -> self                  runs it and waits until it answers
    kv(key) -> KV | None             one key: KV(key, value bytes, lease, version,
                                     create_revision, mod_revision)
    range(prefix) -> {key: KV}
    job(job) -> {rel: KV}            every key of the job, by the rest of its name
    lease_ttl(lease) -> (ttl, granted_ttl)   (-1, 0) once the lease is gone
    kill()                           SIGKILL (etcd unreachable); restart() on the same
                                     ports and data dir, waited for
    stop()                           kill() and remove the data dir (its WAL alone
                                     is 128 MB preallocated); the log stays
    """

    def __init__(self, tmp, name="default"):
        self.tmp = tmp
        self.name = name
        home = tmp / "etcd" if name == "default" else tmp / "etcd" / name
        self.data_dir = home / "data"
        self.log_path = home / "etcd.log"
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.client_port, self.peer_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self.peer_url = f"http://127.0.0.1:{self.peer_port}"
        self.initial_cluster = f"{name}={self.peer_url}"  # EtcdCluster sets every member's
        self.proc = None

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self):
        return self.proc.pid

    def start(self, timeout=20):
        self.launch()
        return self.wait(timeout)

    def launch(self):
        """Runs it without waiting (the members of a cluster answer only once a
        quorum of them runs)."""
        if not os.access(ETCD, os.X_OK):
            raise ClusterError(f"{ETCD} is missing: run `make deps` (Debian's etcd-server)")
        peer = self.peer_url
        args = [ETCD, "--name", self.name, "--data-dir", str(self.data_dir),
                "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", self.initial_cluster]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        return self

    def wait(self, timeout=20):
        """Until it answers a read (through the cluster's leader)."""
        deadline = time.monotonic() + timeout
        why = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ClusterError(f"etcd exited {self.proc.returncode}: {self.log()}")
            try:
                self.post("/v3/kv/range", {"key": _b64("/ping")}, timeout=1)
                return self
            except (OSError, urllib.error.URLError, ValueError) as e:
                why = str(e)
            time.sleep(0.05)
        raise ClusterError(f"etcd did not answer in {timeout} s ({why}): {self.log()}")

    def log(self):
        return self.log_path.read_text(errors="replace")[-3000:]

    def kill(self):
        """SIGKILL: the control plane is unreachable until restart()."""
        if self.alive:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def stop(self):
        """For good: kill() and free the disk the data dir holds. etcd preallocates
        two 64 MB WAL segments, so a test suite that kept them would fill a disk."""
        self.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def restart(self):
        self.kill()
        return self.start()

    def post(self, path, body, timeout=5):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"},
                                     method="POST")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def calls(self, method=None):
        """How many gRPC calls this member handled so far (its /metrics'
        grpc_server_handled_total): of @method ("Range", "Txn", ...) alone, or of every
        method (the daemons' calls, and those the JSON gateway makes for these reads)."""
        text = urllib.request.urlopen(f"{self.url}/metrics", timeout=5).read().decode()
        only = f'[^}}]*grpc_method="{method}"' if method else ""
        return sum(float(m.group(1)) for m in re.finditer(
            r'^grpc_server_handled_total\{' + only + r'[^}]*\} ([0-9.e+]+)$', text, re.M))

    @staticmethod
    def _kv(j):
        return KV(base64.b64decode(j["key"]).decode(), base64.b64decode(j.get("value", "")),
                  int(j.get("lease", 0)), int(j.get("version", 0)),
                  int(j.get("create_revision", 0)), int(j.get("mod_revision", 0)))

    def kv(self, key):
        r = self.post("/v3/kv/range", {"key": _b64(key)})
        kvs = r.get("kvs", [])
        return self._kv(kvs[0]) if kvs else None

    def range(self, prefix):
        r = self.post("/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(_prefix_end(prefix))})
        return {kv.key: kv for kv in map(self._kv, r.get("kvs", []))}

    def job(self, job):
        """The job's keys by name: /mlfs/<job>/<name>, and the nodes' entries and saved
        marks (under /mlfs-nodes/<job>/) as nodes/<id> and saved/<id>."""
        prefix, nodes = f"/mlfs/{job}/", f"/mlfs-nodes/{job}/"
        keys = {k[len(prefix):]: v for k, v in self.range(prefix).items()}
        for k, v in self.range(nodes).items():
            name = k[len(nodes):]
            keys[name if name.startswith("saved/") else f"nodes/{name}"] = v
        return keys

    def lease_ttl(self, lease):
        """(remaining TTL, granted TTL) of @lease; (-1, 0) when it does not exist."""
        r = self.post("/v3/lease/timetolive", {"ID": str(lease)})
        return int(r.get("TTL", -1)), int(r.get("grantedTTL", 0))


class EtcdCluster:
    """@n etcd members on loopback (the production shape: 3), every one in
    @tmp/etcd/m<i>/; what Etcd offers, reads through any member that answers.

    url                              every member's client URL, comma-separated (the
                                     "etcd" of cluster.json)
    members                          the Etcd of each: kill(), restart(), pid
    freeze(i), thaw(i)               SIGSTOP and SIGCONT member i (frozen: its port
                                     takes connections and answers nothing)
    """

    def __init__(self, tmp, n=3):
        self.members = [Etcd(tmp, f"m{i}") for i in range(n)]
        every = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.initial_cluster = every
        self.url = ",".join(m.url for m in self.members)

    @property
    def alive(self):
        return any(m.alive for m in self.members)

    @property
    def pid(self):
        """The first live member's."""
        return next((m.pid for m in self.members if m.alive), self.members[0].pid)

    def start(self, timeout=30):
        for m in self.members:
            m.launch()
        for m in self.members:
            m.wait(timeout)
        return self

    def freeze(self, i):
        os.kill(self.members[i].pid, signal.SIGSTOP)

    def thaw(self, i):
        os.kill(self.members[i].pid, signal.SIGCONT)

    def kill(self):
        for m in self.members:
            if m.alive:
                os.kill(m.pid, signal.SIGCONT)  # a frozen one dies too
            m.kill()

    def stop(self):
        for m in self.members:
            if m.alive:
                os.kill(m.pid, signal.SIGCONT)
            m.stop()

    def restart(self):
        self.kill()
        return self.start()

    def log(self):
        return "\n".join(f"{m.name}: {m.log()}" for m in self.members)

    def _any(self, fn):
        why = None
        for m in self.members:
            if not m.alive or m.proc.poll() is not None:
                continue
            try:
                return fn(m)
            except (OSError, urllib.error.URLError, ValueError) as e:
                why = e
        raise ClusterError(f"no etcd member answered: {why}")

    def post(self, path, body, timeout=2):
        return self._any(lambda m: m.post(path, body, timeout))

    def kv(self, key):
        return self._any(lambda m: m.kv(key))

    def range(self, prefix):
        return self._any(lambda m: m.range(prefix))

    def job(self, job):
        return self._any(lambda m: m.job(job))

    def lease_ttl(self, lease):
        return self._any(lambda m: m.lease_ttl(lease))
