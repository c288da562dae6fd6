"""A job of many nodes on one machine, for end-to-end tests: one etcd and N mlfs
daemons on 127.0.0.1, each with its own mount, port and stderr (DESIGN sections 5,
7, 9, 10; issue 12).

Fixtures (import them into a test module: `from cluster import etcd, cluster_factory`):

  etcd             an Etcd: Debian's etcd-server (/usr/bin/etcd) on two free loopback
                   ports (client, peer), its data in the test's tmp dir; killed at
                   teardown.
  cluster_factory  make(nnodes=4, devices=2, job="j", registered=True, extra_args=())
                   -> Cluster: a token file (0600, 32 random hex characters), a
                   cluster.json {"job", "etcd", "token_file", "nodes": [{"id": "n<i>",
                   "addr": "127.0.0.1:<free port>", "devices"}]}, and one daemon per node
                   (`mlfs mount <tmp>/n<i> --node n<i> --cluster cluster.json -f`),
                   each waited for until mounted (and, with @registered, until every
                   node's key is in etcd). At teardown every daemon still running is
                   unmounted and must exit 0; in a test that injected no fault (no
                   kill, freeze or etcd loss) its stderr must also be free of "error",
                   as conftest.py asks of one node.

Etcd (through its v3 JSON gateway, urllib only):
  url, data_dir, alive
  kv(key) -> KV | None             one key: KV(key, value bytes, lease, version,
                                   create_revision, mod_revision)
  range(prefix) -> {key: KV}
  job(job) -> {rel: KV}            every key under /mlfs/<job>/, by the rest of its name
  lease_ttl(lease) -> (ttl, granted_ttl)   (-1, 0) once the lease is gone
  kill()                           SIGKILL (etcd unreachable); restart() on the same
                                   ports and data dir, waited for

Cluster:
  cl[0], cl["n1"] -> Node          cl.nodes (all, in cluster.json order), cl.live()
  cl.spec, cl.token, cl.cluster_path, cl.job, cl.etcd, cl.tmp
  cl.keys() -> {rel: KV}           the job's etcd keys
  cl.file(name, obj) -> path       a JSON file in the tmp dir (configs for the CLI)
  cl.kill(n)                       kill -9 node n's daemon and lazily unmount its dead
                                   mount (fusermount3 -u -z)
  cl.freeze(n) / cl.thaw(n)        SIGSTOP / SIGCONT (a node that stops answering)
  cl.restart(n) -> Node            mounts node n again on the same mount dir
  cl.try_mount(id, spec) -> Node | (rc, stderr)   a daemon with another cluster.json
  cl.statuses() -> {id: status.json or a string saying why it could not be read}
  cl.describe() -> str             every node's status.json, the job's etcd keys and the
                                   end of every daemon's stderr (for failure messages)
  cl.wait(pred, what, timeout)     polls pred() until truthy, else fails with describe()
  cl.wait_version(v, nodes=None)   every live node (or @nodes) reports version v, idle
  cl.wait_settled()                no attempt in etcd and every live node idle or failed,
                                   all at the committed version; returns that version
  cl.wait_registered(ids) / cl.wait_down(id)   nodes/<id> present / gone in etcd
  cl.reconfigure(n, cfg, wait=True) -> CompletedProcess | Popen   `mlfs reconfigure`
  cl.plan(schema, a, b, down=()) -> dict   `mlfs plan ... --cluster cluster.json --json`
  cl.allocation(cfg) -> {rank: (node id, device)}   DESIGN section 2's allocation
  cl.hosted(cfg, id) -> [rank]
  cl.start_job(schema, cfg, on, full, step)   schema.json then config.json on node @on,
                                   waits for every node to have them, imports the
                                   checkpoint of @full on every node, waits until
                                   every node published its ranks' steps
  cl.wait_published(cfg, step, others={})   every node's etcd entry has "steps"
                                   {"<rank>": step} for its ranks of @cfg
  cl.check_layout(schema, cfg, full, step=None, nodes=None)   every partition of every
                                   (live) node against the NumPy reference
  cl.snapshot(nodes=None) -> {id: {path: bytes}}   every file under ranks/

Node (a conftest.Mount): id, addr, pid, p(), read(), write(), read_json(), status(),
  hosted ranks via cl.hosted; get(path, token=TOKEN, headers=None, method="GET",
  host=None) -> (HTTP status, body bytes): a request to the node's peer server, with
  the cluster token by default (token=None: no Authorization header; a string: that
  header value after "Bearer ").
"""
import base64
import collections
import errno
import gc
import http.client
import json
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import MLFS, Mount
from test_store import coords, expected_layout, rank_tree, snapshot, stage_layers, write_full

ETCD = "/usr/bin/etcd"
TOKEN = object()  # Node.get's default: the cluster token


def free_port():
    """A TCP port of 127.0.0.1 that nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(fn, timeout=10):
    """fn() on a daemon thread; raises TimeoutError when it does not return in time (a
    FUSE request to a hung daemon never returns, and must not hang the test run)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: B902 - handed to the caller
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"no answer in {timeout} s")
    if "error" in out:
        raise out["error"]
    return out["value"]


# ------------------------------------------------------------------- etcd

KV = collections.namedtuple("KV", "key value lease version create_revision mod_revision")


def _b64(b):
    return base64.b64encode(b if isinstance(b, bytes) else b.encode()).decode()


def _prefix_end(prefix):
    b = prefix.encode()
    return b[:-1] + bytes([b[-1] + 1])


class Etcd:
    """One etcd member on loopback, its data in @tmp/etcd."""

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

    def start(self, timeout=20):
        if not os.access(ETCD, os.X_OK):
            raise AssertionError(f"{ETCD} is missing: run `make deps` (Debian's etcd-server)")
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
                raise AssertionError(f"etcd exited {self.proc.returncode}: {self.log()}")
            try:
                self.post("/v3/kv/range", {"key": _b64("/ping")}, timeout=1)
                return self
            except (OSError, urllib.error.URLError, ValueError) as e:
                why = str(e)
            time.sleep(0.05)
        raise AssertionError(f"etcd did not answer in {timeout} s ({why}): {self.log()}")

    def log(self):
        return self.log_path.read_text(errors="replace")[-3000:]

    def kill(self):
        """SIGKILL: the control plane is unreachable until restart()."""
        if self.alive:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

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


@pytest.fixture
def etcd(tmp_path):
    e = Etcd(tmp_path).start()
    yield e
    e.kill()


# ------------------------------------------------------------------ nodes

class Node(Mount):
    """One daemon of the job: a conftest.Mount with a node id and a peer address."""

    def __init__(self, cluster, node_id, path, proc, stderr_path, spec=None):
        super().__init__(path, proc, stderr_path, cluster.tmp)
        self.cluster = cluster
        self.id = node_id
        spec = spec or cluster.spec
        self.spec = next(n for n in spec["nodes"] if n["id"] == node_id)
        self.addr = self.spec["addr"]
        self.killed = False
        self.frozen = False

    def __repr__(self):
        return f"<node {self.id} pid {self.pid}{' killed' if self.killed else ''}>"

    @property
    def pid(self):
        return self.proc.pid

    @property
    def port(self):
        return int(self.addr.rsplit(":", 1)[1])

    def status(self, timeout=10):
        assert not self.frozen and not self.killed, f"{self.id} cannot answer"
        return timed(lambda: self.read_json("status.json"), timeout)

    def get(self, path, token=TOKEN, headers=None, method="GET", host=None, timeout=10):
        """One HTTP request to this node's peer server: (status, body)."""
        h = dict(headers or {})
        if token is TOKEN:
            token = self.cluster.token
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        conn = http.client.HTTPConnection(host or "127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, headers=h)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()


class Cluster:
    """A job of daemons started by cluster_factory; see the module's docstring."""

    def __init__(self, tmp, etcd, nnodes, devices, job, extra_args, node_env=None):
        self.tmp = tmp
        self.node_env = node_env or {}  # {node id: {VAR: value}} for its daemon
        self.etcd = etcd
        self.job = job
        self.extra_args = [str(a) for a in extra_args]
        self.token = secrets.token_hex(16)
        self.token_path = tmp / "token"
        fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, (self.token + "\n").encode())
        os.close(fd)
        ports = set()
        while len(ports) < nnodes:
            ports.add(free_port())
        self.spec = {"job": job, "etcd": etcd.url, "token_file": str(self.token_path),
                     "nodes": [{"id": f"n{i}", "addr": f"127.0.0.1:{p}", "devices": devices}
                               for i, p in enumerate(sorted(ports))]}
        self.cluster_path = self.file("cluster.json", self.spec)
        self.nodes = []
        self.retired = []  # daemons of earlier runs of a node (restarts, try_mount)
        self.faults = False

    # ------------------------------------------------------------- basics

    def __getitem__(self, key):
        if isinstance(key, Node):
            return key
        if isinstance(key, int):
            return self.nodes[key]
        for n in self.nodes:
            if n.id == key:
                return n
        raise KeyError(key)

    def live(self):
        return [n for n in self.nodes if not n.killed]

    def file(self, name, obj):
        path = self.tmp / name
        path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
        return path

    def keys(self):
        return self.etcd.job(self.job)

    def devices(self):
        return {n["id"]: n["devices"] for n in self.spec["nodes"]}

    # ------------------------------------------------------------ daemons

    def _spawn(self, node_id, mnt, cluster_path, tag):
        errpath = self.tmp / f"{node_id}{tag}.stderr"
        args = [str(MLFS), "mount", str(mnt), "--node", node_id, "--cluster",
                str(cluster_path), "-f", *self.extra_args]
        env = dict(os.environ, **self.node_env.get(node_id, {}))
        with open(errpath, "wb") as err:
            proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, env=env)
        return proc, errpath

    def _wait_mounted(self, node, timeout=20):
        deadline = time.monotonic() + timeout
        while not os.path.ismount(node.path):
            if node.proc.poll() is not None:
                return False
            if time.monotonic() > deadline:
                raise AssertionError(f"{node.id}: {node.path} not mounted after {timeout} s: "
                                     f"{node.stderr()}")
            time.sleep(0.01)
        return True

    def mount(self, node_id, cluster_path=None):
        """Starts node @node_id's daemon on <tmp>/<id> (again, after a kill), with the
        job's cluster.json or @cluster_path."""
        mnt = self.tmp / node_id
        mnt.mkdir(exist_ok=True)
        assert not os.path.ismount(mnt), f"{mnt} is still a mount point"
        runs = sum(1 for n in self.nodes + self.retired if n.id == node_id)
        proc, errpath = self._spawn(node_id, mnt, cluster_path or self.cluster_path,
                                    f".{runs}" if runs else "")
        node = Node(self, node_id, mnt, proc, errpath)
        if not self._wait_mounted(node):
            raise AssertionError(f"mlfs mount --node {node_id} exited {proc.returncode}: "
                                 f"{node.stderr()}")
        old = [i for i, n in enumerate(self.nodes) if n.id == node_id]
        if old:
            self.retired.append(self.nodes[old[0]])
            self.nodes[old[0]] = node
        else:
            self.nodes.append(node)
        return node

    def restart(self, n):
        """Mounts node @n again on the same mount dir; it must have been killed."""
        node = self[n]
        assert node.killed, f"{node.id} is running"
        return self.mount(node.id)

    def try_mount(self, node_id, spec, name):
        """A daemon for @node_id with cluster.json @spec on a new mount dir <tmp>/<name>:
        the Node when it mounts (unmounted at teardown), else (exit status, stderr)."""
        mnt = self.tmp / name
        mnt.mkdir()
        path = self.file(f"{name}-cluster.json", spec)
        proc, errpath = self._spawn(node_id, mnt, path, f".{name}")
        node = Node(self, node_id, mnt, proc, errpath, spec)
        if self._wait_mounted(node):
            self.retired.append(node)
            return node
        return proc.returncode, node.stderr()

    def join(self, node_id, spec, cluster_path=None):
        """Starts node @node_id with cluster.json @spec, which lists more nodes than the
        job's (they join it): it becomes the harness's cluster.json (restarts, plans).
        @cluster_path: mount with that file instead (e.g. an older, shorter one)."""
        old_spec, old_path = self.spec, self.cluster_path
        self.spec = spec
        self.cluster_path = self.file(f"cluster-{len(spec['nodes'])}.json", spec)
        try:
            return self.mount(node_id, cluster_path)
        except AssertionError:
            self.spec, self.cluster_path = old_spec, old_path
            raise

    def kill(self, n):
        """kill -9 of node @n's daemon; its dead mount is lazily unmounted."""
        node = self[n]
        self.faults = True
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(timeout=30)
        node.killed, node.frozen = True, False
        subprocess.run(["fusermount3", "-u", "-z", str(node.path)], capture_output=True)
        assert not os.path.ismount(node.path), f"{node.path} still mounted"

    def freeze(self, n):
        """SIGSTOP: the node stops answering (peers, etcd keep-alives, FUSE)."""
        node = self[n]
        self.faults = True
        node.proc.send_signal(signal.SIGSTOP)
        node.frozen = True

    def thaw(self, n):
        node = self[n]
        node.proc.send_signal(signal.SIGCONT)
        node.frozen = False

    def kill_etcd(self):
        self.faults = True
        self.etcd.kill()

    def teardown(self):
        gc.collect()  # NumPy memory maps keep a mount busy
        failures = []
        everyone = self.nodes + self.retired
        for n in everyone:
            if n.frozen:
                self.thaw(n)
        for n in everyone:
            if n.proc.poll() is None and os.path.ismount(n.path):
                p = subprocess.run(["fusermount3", "-u", str(n.path)], capture_output=True,
                                   text=True, timeout=30)
                if p.returncode != 0:
                    failures.append(f"fusermount3 -u {n.path}: {p.stderr}")
                    subprocess.run(["fusermount3", "-u", "-z", str(n.path)],
                                   capture_output=True)
        for n in everyone:
            if n.killed:
                continue
            try:
                rc = n.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                n.proc.kill()
                rc = n.proc.wait()
                failures.append(f"{n.id}: the daemon did not exit within 30 s of its unmount")
            if rc != 0:
                failures.append(f"{n.id}: mlfs mount exited {rc}: {n.stderr()[-3000:]}")
            elif rc == 0 and not self.faults and "error" in n.stderr().lower():
                failures.append(f"{n.id}: mlfs mount logged: {n.stderr()[-3000:]}")
        for n in everyone:
            if os.path.ismount(n.path):
                subprocess.run(["fusermount3", "-u", "-z", str(n.path)], capture_output=True)
        assert not failures, "\n".join(failures)

    # ------------------------------------------------------------ reading

    def statuses(self, nodes=None):
        """{id: status.json} of every live node (or @nodes); a string when unreadable."""
        out = {}
        for n in (self.live() if nodes is None else [self[x] for x in nodes]):
            if n.frozen:
                out[n.id] = "(frozen)"
                continue
            try:
                out[n.id] = n.status(timeout=5)
            except (OSError, ValueError, TimeoutError) as e:
                out[n.id] = f"unreadable: {e!r}"
        return out

    def describe(self):
        lines = []
        for n in self.nodes:
            if n.killed:
                lines.append(f"--- {n.id}: killed")
            else:
                st = self.statuses([n])[n.id]
                lines.append(f"--- {n.id} status.json: "
                             f"{st if isinstance(st, str) else json.dumps(st, sort_keys=True)}")
        try:
            keys = self.keys() if self.etcd.alive else "etcd is down"
        except (OSError, urllib.error.URLError, ValueError) as e:
            keys = f"unreadable: {e!r}"
        if isinstance(keys, dict):
            lines.append("--- etcd /mlfs/%s/:" % self.job)
            for k, kv in sorted(keys.items()):
                v = kv.value.decode(errors="replace")
                lines.append(f"  {k} (lease {kv.lease}): {v[:300]}{'...' if len(v) > 300 else ''}")
        else:
            lines.append(f"--- etcd: {keys}")
        for n in self.nodes + self.retired:
            tail = n.stderr().strip().splitlines()[-8:]
            lines.append(f"--- {n.id} stderr ({n.stderr_path.name}):")
            lines += ["  " + s for s in tail]
        return "\n".join(lines)

    def wait(self, pred, what, timeout=30, interval=0.05):
        """Polls pred() until it returns something truthy (returned); else fails saying
        @what and showing every node."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            try:
                got = pred()
                if got:
                    return got
            except (OSError, ValueError, KeyError, TimeoutError,
                    urllib.error.URLError) as e:
                last = e
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not after {timeout} s"
                                     f"{f' (last: {last!r})' if last else ''}\n{self.describe()}")
            time.sleep(interval)

    def wait_version(self, version, nodes=None, state="idle", timeout=60):
        """Every live node (or @nodes) reports @version in @state; returns the statuses."""
        ids = [self[n].id for n in nodes] if nodes is not None else [n.id for n in self.live()]

        def ok():
            sts = self.statuses(ids)
            if all(isinstance(s, dict) and s["version"] == version and s["state"] == state
                   for s in sts.values()):
                return sts
            return None
        return self.wait(ok, f"every node of {ids} at version {version}, {state}", timeout)

    def wait_settled(self, timeout=60):
        """No attempt in etcd, every live node idle or failed at the committed version:
        the job agrees on one version, which is returned."""
        def ok():
            keys = self.keys()
            if "attempt" in keys or "config" not in keys:
                return None
            v = json.loads(keys["config"].value)["version"]
            sts = self.statuses()
            if all(isinstance(s, dict) and s["version"] == v and s["state"] in ("idle", "failed")
                   for s in sts.values()):
                return v
            return None
        return self.wait(ok, "the job settled on its committed version", timeout)

    def wait_registered(self, ids=None, timeout=20):
        ids = ids or [n.id for n in self.live()]
        self.wait(lambda: all(f"nodes/{i}" in self.keys() for i in ids),
                  f"{ids} registered in etcd under /mlfs-nodes/{self.job}/", timeout)

    def wait_down(self, node_id, timeout=30):
        self.wait(lambda: f"nodes/{node_id}" not in self.keys(),
                  f"/mlfs-nodes/{self.job}/{node_id} gone (its lease expired)", timeout)

    def committed(self):
        """The config in etcd's "config" key (a dict), or None."""
        kv = self.etcd.kv(f"/mlfs/{self.job}/config")
        return json.loads(kv.value) if kv else None

    # ------------------------------------------------------------ commands

    def reconfigure(self, n, cfg, wait=True, timeout=60, follow=True):
        """`mlfs reconfigure <mnt of n> <cfg file>`: the CompletedProcess, or with
        wait=False the running Popen (text pipes). Fails, showing every node, when it
        has not returned after @timeout seconds. follow=False: `--no-wait`, the command
        only writes config.json (a test that freezes the node must not leave it reading
        status.json: killed there, its exit would wait for the frozen daemon's answer to
        the close)."""
        path = self.file(f"config-v{cfg['version']}-{secrets.token_hex(3)}.json", cfg)
        args = [str(MLFS), "reconfigure", str(self[n].path), str(path)]
        if not follow:
            args.append("--no-wait")
        if not wait:
            return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"mlfs reconfigure of version {cfg['version']} on {self[n].id} "
                                 f"still running after {timeout} s (stdout {e.stdout!r}, "
                                 f"stderr {e.stderr!r})\n{self.describe()}") from None

    def plan(self, schema, a, b, down=()):
        args = [str(MLFS), "plan", "--schema", self.file("plan-schema.json", schema),
                "--from", self.file("plan-a.json", a), "--to", self.file("plan-b.json", b),
                "--cluster", self.cluster_path, "--json"]
        if down:
            args += ["--down", ",".join(down)]
        p = subprocess.run(list(map(str, args)), capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    # ---------------------------------------------------------- reference

    def allocation(self, cfg):
        """{rank: (node id, device)}: ranks fill the devices of cfg["nodes"] in order."""
        world = cfg["tp"] * cfg["pp"] * cfg["dp"]
        devs = self.devices()
        slots = [(nid, d) for nid in cfg["nodes"] for d in range(devs[nid])]
        assert world <= len(slots), f"{world} ranks do not fit {cfg['nodes']}"
        return dict(enumerate(slots[:world]))

    def hosted(self, cfg, node_id):
        return sorted(r for r, (nid, _) in self.allocation(cfg).items() if nid == node_id)

    def start_job(self, schema, cfg, on="n0", full=None, step=None):
        """schema.json and config.json written on node @on; waits until every live node
        has both (version cfg["version"], idle); with @full, writes the checkpoint and
        imports it on every live node (each fills its own partitions) at @step."""
        for name, obj in (("schema.json", schema), ("config.json", cfg)):
            try:
                self[on].write(name, json.dumps(obj))
            except OSError as e:
                raise AssertionError(f"writing {name} on {on}: {e!r}\n{self.describe()}")
        self.wait_version(cfg["version"])
        if full is not None:
            ckpt = self.tmp / "ckpt"
            if not ckpt.exists():
                write_full(ckpt, full)
            for n in self.live():
                args = ["--step", str(step)] if step is not None else []
                p = n.mlfs("import", "--from", ckpt, *args, check=False)
                assert p.returncode == 0, f"import on {n.id}: {p.stderr}\n{self.describe()}"
        self.wait_published(cfg, step or 0)

    def wait_published(self, cfg, step, others=None, timeout=20):
        """Every live node's etcd entry shows @step saved by each of its ranks of @cfg
        ("steps": {"<rank>": step}; @others: {rank: step} for ranks that differ): the
        job-wide saved-step check can see them."""
        others = others or {}

        def ok():
            keys = self.keys()
            for n in self.live():
                kv = keys.get(f"nodes/{n.id}")
                steps = json.loads(kv.value).get("steps", {}) if kv else {}
                if any(steps.get(str(r)) != others.get(r, step)
                       for r in self.hosted(cfg, n.id)):
                    return False
            return True
        self.wait(ok, f"every node's ranks of version {cfg['version']} published step {step}",
                  timeout)

    def check_node(self, node, schema, cfg, full, step=None, want=None):
        """Node @node hosts exactly its ranks of @cfg, each with rank.json, step and every
        partition equal to the NumPy reference (bit-exact)."""
        node = self[node]
        want = want or expected_layout(schema, cfg, full)
        alloc = self.allocation(cfg)
        mine = self.hosted(cfg, node.id)
        got = sorted(os.listdir(node.p("ranks")), key=int)
        assert got == [str(r) for r in mine], (node.id, got, mine)
        for r in mine:
            t, d, p = coords(cfg, r)
            lo, hi = stage_layers(schema["num_layers"], cfg["pp"], p)
            assert node.read_json(f"ranks/{r}/rank.json") == {
                "rank": r, "tp": t, "pp": p, "dp": d, "node": node.id, "device": alloc[r][1],
                "layers": [lo, hi], "tp_size": cfg["tp"], "pp_size": cfg["pp"],
                "dp_size": cfg["dp"], "version": cfg["version"]}, (node.id, r)
            if step is not None:
                assert int(node.read(f"ranks/{r}/step")) == step, (node.id, r)
            assert rank_tree(node, r) == set(want[r]), (node.id, r)
            for rel, a in want[r].items():
                b = np.load(node.p("ranks", r, rel))
                assert b.dtype == a.dtype and b.shape == a.shape, (node.id, r, rel, b.dtype,
                                                                   b.shape)
                assert np.array_equal(b, a), f"{node.id}: ranks/{r}/{rel} differs"

    def check_layout(self, schema, cfg, full, step=None, nodes=None):
        want = expected_layout(schema, cfg, full)
        for n in (self.live() if nodes is None else [self[x] for x in nodes]):
            self.check_node(n, schema, cfg, full, step, want)
        return want

    def snapshot(self, nodes=None):
        return {n.id: snapshot(n) for n in (self.live() if nodes is None
                                            else [self[x] for x in nodes])}


@pytest.fixture
def cluster_factory(tmp_path, etcd):
    made = []

    def make(nnodes=4, devices=2, job="j", registered=True, extra_args=(), node_env=None):
        cl = Cluster(tmp_path, etcd, nnodes, devices, job, extra_args, node_env)
        made.append(cl)
        for n in cl.spec["nodes"]:
            cl.mount(n["id"])
        if registered:
            cl.wait_registered()
        return cl

    yield make
    errors = []
    for cl in made:
        try:
            cl.teardown()
        except AssertionError as e:
            errors.append(str(e))
    assert not errors, "\n".join(errors)


def expect_oserror(codes, fn, *args, **kw):
    """fn(...) fails with one of the errno values @codes; returns the OSError."""
    codes = (codes,) if isinstance(codes, int) else tuple(codes)
    with pytest.raises(OSError) as e:
        fn(*args, **kw)
    assert e.value.errno in codes, (
        f"{getattr(fn, '__name__', fn)}: {e.value!r}, expected "
        f"{'/'.join(errno.errorcode[c] for c in codes)}")
    return e.value
