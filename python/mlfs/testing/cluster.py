"""The daemons of a local job: Daemon (one `mlfs mount -f`), Node (a daemon of a job of
many), Cluster (cluster.json, its nodes, faults, waits and commands) and start(), the
context manager around them. See the package's doc (mlfs.testing)."""
import contextlib
import gc
import http.client
import json
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error

import numpy as np

from .. import client
from .etcd import Etcd, EtcdCluster
from .layout import coords, expected_layout, rank_tree, snapshot, stage_layers, write_full
from .util import MLFS, ClusterError, free_port, holders, timed

TOKEN = object()  # Node.get's default: the cluster token


def wait_stopped(pid, timeout=10):
    """Waits until every thread of process @pid is stopped (state T in
    /proc/<pid>/task/<tid>/stat), or it is gone; TimeoutError after @timeout s."""
    deadline = time.monotonic() + timeout
    while True:
        if not os.path.exists(f"/proc/{pid}"):
            return  # it exited
        states = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:
            continue  # a thread ended while they were read: read them again
        if states and all(st in "TtZX" for st in states):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} not stopped in {timeout} s: {states}")
        time.sleep(0.002)


class Daemon:
    """A running `mlfs mount -f` daemon and helpers to use its mount: @path (the mount
    point), @proc (its Popen), @stderr_path, @tmp (a directory for files the helpers
    write), @binary (the mlfs binary that runs commands on it); @errors_expected (False)
    is set by a test whose daemon logs errors it causes and checks itself."""

    def __init__(self, path, proc, stderr_path, tmp, binary=None):
        self.path = path
        self.proc = proc
        self.stderr_path = stderr_path
        self.tmp = tmp
        self.binary = str(binary or MLFS)
        self.errors_expected = False

    def p(self, *parts):
        """Path string of <mnt>/parts..."""
        return os.path.join(str(self.path), *map(str, parts))

    def write(self, rel, data):
        """Writes text or bytes to <mnt>/rel in one open/write/close (OSError on refusal)."""
        with open(self.p(rel), "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)

    def read(self, rel):
        with open(self.p(rel), "rb") as f:
            return f.read()

    def read_json(self, rel):
        return json.loads(self.read(rel))

    def status(self):
        return self.read_json("status.json")

    def setup(self, schema, config):
        """Writes schema.json then config.json (dicts)."""
        self.write("schema.json", json.dumps(schema))
        self.write("config.json", json.dumps(config))

    def mlfs(self, cmd, *args, check=True):
        """Runs `mlfs cmd <mnt> args...`: the CompletedProcess (text); ClusterError when
        it fails and @check."""
        args = [self.binary, cmd, str(self.path), *map(str, args)]
        p = subprocess.run(args, capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        if check and p.returncode != 0:
            raise ClusterError(f"mlfs {' '.join(args[1:])} failed: {p.stderr}")
        return p

    def stderr(self):
        return pathlib.Path(self.stderr_path).read_text(errors="replace")

    def wait_exit(self, timeout=30):
        rc = self.proc.wait(timeout=timeout)
        assert rc == 0, f"mlfs mount exited {rc}: {self.stderr()}"
        assert "error" not in self.stderr().lower(), self.stderr()
        return rc

    def umount(self):
        """Unmounts with `mlfs umount` and checks the daemon exits 0 without errors."""
        p = subprocess.run([self.binary, "umount", str(self.path)], capture_output=True,
                           text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stderr
        self.wait_exit()
        assert not os.path.ismount(self.path)


class Node(Daemon):
    """One daemon of the job: a Daemon with a node id and a peer address."""

    def __init__(self, cluster, node_id, path, proc, stderr_path, spec=None):
        super().__init__(path, proc, stderr_path, cluster.tmp, cluster.binary)
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

    def get(self, path, token=TOKEN, headers=None, method="GET", host=None, timeout=10,
            body=None):
        """One HTTP request to this node's peer server (with @body: its bytes, a POST's):
        (status, body)."""
        h = dict(headers or {})
        if token is TOKEN:
            token = self.cluster.token
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        conn = http.client.HTTPConnection(host or "127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()


class Cluster:
    """The cluster.json and the daemons of one job; see mlfs.testing's doc. Nothing runs
    until mount() (or mount_all()); teardown() stops every daemon."""

    def __init__(self, tmp, etcd, nnodes, devices, job, extra_args=(), node_env=None,
                 mlfs=None):
        self.tmp = pathlib.Path(tmp)
        self.node_env = node_env or {}  # {node id: {VAR: value}} for its daemon
        self.etcd = etcd
        self.job = job
        self.binary = str(mlfs or MLFS)
        self.extra_args = [str(a) for a in extra_args]
        ports = set()
        while len(ports) < nnodes:
            ports.add(free_port())
        nodes = [{"id": f"n{i}", "addr": f"127.0.0.1:{p}", "devices": devices}
                 for i, p in enumerate(sorted(ports))]
        self.token = self.token_path = None
        self.spec = {"nodes": nodes}  # one node alone: no etcd, no token
        if etcd is not None:
            self.token = secrets.token_hex(16)
            self.token_path = self.tmp / "token"
            fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.write(fd, (self.token + "\n").encode())
            os.close(fd)
            self.spec = {"job": job, "etcd": etcd.url, "token_file": str(self.token_path),
                         "nodes": nodes}
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
        if self.etcd is None:
            raise ClusterError("a job without etcd has no keys")
        return self.etcd.job(self.job)

    @property
    def ids(self):
        """Every node's id, in cluster.json order."""
        return [n["id"] for n in self.spec["nodes"]]

    @property
    def mounts(self):
        """{id: mount point (a string)} of every node mounted, killed ones included."""
        return {n.id: str(n.path) for n in self.nodes}

    @property
    def etcd_url(self):
        return self.etcd.url if self.etcd is not None else None

    def status(self, n):
        """Node @n's status.json (a dict)."""
        return self[n].status()

    def client(self, n):
        """An mlfs.Mount of node @n's mount point: the package's API on it."""
        return client.Mount(str(self[n].path))

    def devices(self):
        return {n["id"]: n["devices"] for n in self.spec["nodes"]}

    # ------------------------------------------------------------ daemons

    def _spawn(self, node_id, mnt, cluster_path, tag):
        errpath = self.tmp / f"{node_id}{tag}.stderr"
        args = [str(self.binary), "mount", str(mnt), "--node", node_id, "--cluster",
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
                raise ClusterError(f"{node.id}: {node.path} not mounted after {timeout} s: "
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
            raise ClusterError(f"mlfs mount --node {node_id} exited {proc.returncode}: "
                                 f"{node.stderr()}")
        old = [i for i, n in enumerate(self.nodes) if n.id == node_id]
        if old:
            self.retired.append(self.nodes[old[0]])
            self.nodes[old[0]] = node
        else:
            self.nodes.append(node)
        return node

    def mount_all(self, registered=True):
        """Mounts every node of cluster.json; with @registered (and etcd), waits until
        every node's key is in etcd. Returns self."""
        for n in self.spec["nodes"]:
            self.mount(n["id"])
        if registered and self.etcd is not None:
            self.wait_registered()
        return self

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
        """SIGSTOP: the node stops answering (peers, etcd keep-alives, FUSE). Returns
        once every thread of it is stopped: the stop begins when one of its threads
        next runs and takes the signal, and until then the others go on; on a
        busy machine a FUSE request made just after the kill was answered."""
        node = self[n]
        self.faults = True
        node.proc.send_signal(signal.SIGSTOP)
        node.frozen = True
        wait_stopped(node.proc.pid)

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
                # Busy with no process holding a file of it: one was exiting (its
                # files are closed as it ends); again for up to 3 s. A holder that
                # stays is named below.
                deadline = time.monotonic() + 3
                while (p.returncode != 0 and "busy" in p.stderr and not holders(n.path)
                       and time.monotonic() < deadline):
                    time.sleep(0.1)
                    p = subprocess.run(["fusermount3", "-u", str(n.path)], capture_output=True,
                                       text=True, timeout=30)
                if p.returncode != 0:
                    failures.append(f"fusermount3 -u {n.path}: {p.stderr.strip()} (held by: "
                                    f"{holders(n.path) or 'no process found'})")
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
            keys = ("no etcd" if self.etcd is None else
                    self.keys() if self.etcd.alive else "etcd is down")
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
                raise ClusterError(f"{what}: not after {timeout} s"
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

    def vote(self, coordinator, to, n):
        """Node @n's vote on the attempt to version @to as its coordinator @coordinator
        has it (status.json's cluster.attempt.votes): "<attempt id> ready", "<attempt id>
        failed: <reason>", or "" when none arrived (votes go to the coordinator, not to
        etcd)."""
        att = self[coordinator].status()["cluster"].get("attempt") or {}
        v = att.get("votes", {}).get(n) if att.get("to") == to else None
        return f"{att['id']} {v}" if v else ""

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
        args = [str(self.binary), "reconfigure", str(self[n].path), str(path)]
        if not follow:
            args.append("--no-wait")
        if not wait:
            return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise ClusterError(f"mlfs reconfigure of version {cfg['version']} on {self[n].id} "
                                 f"still running after {timeout} s (stdout {e.stdout!r}, "
                                 f"stderr {e.stderr!r})\n{self.describe()}") from None

    def plan(self, schema, a, b, down=()):
        args = [str(self.binary), "plan", "--schema", self.file("plan-schema.json", schema),
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
                raise ClusterError(f"writing {name} on {on}: {e!r}\n{self.describe()}")
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


@contextlib.contextmanager
def start(nnodes, devices=2, job="demo", tmp=None, mlfs=None, etcd=None, extra_args=(),
          node_env=None):
    """A job of @nnodes daemons of @devices devices each, every one mounted (and, with
    etcd, registered), with one etcd when @etcd (by default when @nnodes > 1; an int
    n > 1: an etcd cluster of n members, EtcdCluster, all in cluster.json), in @tmp (a
    new temporary directory, removed at the end, when None); yields the Cluster. At the
    end every daemon still running is unmounted and must exit 0 (with no "error" in its
    stderr unless a fault was injected) and etcd is killed; ClusterError otherwise,
    unless the body itself raised. @mlfs: the binary (default MLFS); @extra_args: more
    `mlfs mount` options for every daemon; @node_env: {id: {VAR: value}}."""
    if not isinstance(nnodes, int) or nnodes < 1:
        raise ClusterError(f"nnodes = {nnodes!r}: a job needs at least one node")
    if nnodes > 1 and etcd is not None and not etcd:
        raise ClusterError(f"etcd = {etcd!r} with {nnodes} nodes: a job of many nodes needs "
                           "etcd")
    own = tmp is None
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"mlfs-{job}-") if own else tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    et = cl = None
    ok = False
    try:
        if type(etcd) is int and etcd > 1:
            et = EtcdCluster(tmp, etcd).start()
        elif nnodes > 1 if etcd is None else etcd:
            et = Etcd(tmp).start()
        cl = Cluster(tmp, et, nnodes, devices, job, extra_args, node_env, mlfs)
        cl.mount_all()
        yield cl
        ok = True
    finally:
        try:
            if cl is not None:
                try:
                    cl.teardown()
                except AssertionError:
                    if ok:  # after a failure, the failure is what to report
                        raise
        finally:
            if et is not None:
                et.stop()
            if own:
                shutil.rmtree(tmp, ignore_errors=True)
