"""One etcd member on loopback for a local job, and its keys read through etcd's v3
JSON gateway (urllib only)."""
import base64
import collections
import json
import os
import shutil
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

    def __init__(self, tmp):
        self.tmp = tmp
        self.data_dir = tmp / "etcd" / "data"
        self.log_path = tmp / "etcd" / "etcd.log"
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.client_port, self.peer_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self.proc = None

    @property
    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self):
        return self.proc.pid

    def start(self, timeout=20):
        if not os.access(ETCD, os.X_OK):
            raise ClusterError(f"{ETCD} is missing: run `make deps` (Debian's etcd-server)")
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [ETCD, "--name", "default", "--data-dir", str(self.data_dir),
                "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"default={peer}"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
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
