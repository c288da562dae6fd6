#!/usr/bin/python3
"""A randomized adversary for mlfs's multi-node control plane (DESIGN section 7,
docs/many-nodes.md "Failures, phase by phase"). Not a pytest test: run it as

    BUILD=build /usr/bin/python3 tests/chaos/chaos.py --seconds 300 --seed 1 --nodes 5

It starts etcd and --nodes daemons on 127.0.0.1 (mlfs.testing), each of 1 or 2
devices (chosen from the seed), installs a schema (tensors split along dim 0 and dim 1,
fused chunks, vocabulary padding, replicated ones, pipeline-placed "first"/"last" and a
tied one, plus a larger float32 tensor per layer so that transfers take a moment) and
imports a checkpoint of random full tensors. Then, round after round until --seconds
pass:

  * a random new config (version = committed + 1): a random subset of the nodes in a
    random order, random tp/pp/dp (dp >= 2) such that every slice (TP rank, stage) has
    replicas on at least two different nodes, before and after, so that no single
    node's death loses state; sometimes "replicas": 1;
  * `mlfs reconfigure` (not waited for) on a random node, the coordinator;
  * one fault at a random moment (0-200 ms before the command starts, 0-500 ms after
    it started, when the attempt appears in etcd, when the faulted node reports a
    phase in status.json, or right after the commit in etcd): none; kill -9 of a node
    (the coordinator or another); SIGSTOP of a node for a short time or past the 6 s
    lease; etcd killed for a moment and restarted;
  * the command is waited for, the fault undone (thaw; a killed node restarted at
    once or after its lease expired; etcd restarted) and the job must settle;
  * invariants (one_round, check_state): (a) etcd's committed config is the old or the new
    one, never anything else, also at every moment a poller saw during the round, and
    the new one when the command exited 0; a round without a fault commits;
    (b) every live node that is not lost is at the committed version, idle (or
    "failed" after an abort), its config.json the committed one, registered; a lost
    node is one the design says is lost (restarted while it holds ranks of the
    committed layout; frozen through a commit it did not take part in); no daemon
    died by itself; (c) every partition of every live, non-lost node is bit-exact
    against the NumPy reference; (d) a failed command says why on stderr; (e) the job
    is never wedged: after the fault is undone, a node that missed a commit is
    restarted (the one operator action the design names for it), a lost node is
    dropped by a config, and a config onto every live node commits.

One line per round, a summary at the end; on a violation it prints the seed, the
round, the fault, the configs, the cluster's description and the daemons' stderr, and
exits 1 (keeping the temporary directory). Choices are drawn from Random(seed, round),
so a seed replays the same choices as long as the outcomes (commit or abort) are the
same; timing is not reproducible.

The binary is mlfs.testing's: $MLFS, else <tree>/$BUILD/mlfs. --debug prints the nodes'
etcd entries, the attempts and the command's output around each drop of a lost node.
The first bug it found (a restarted, lost node could not be dropped while up: its own
prepare counted its zeroed steps) is fixed in 5e9661e; test_cluster.py's
test_restarted_daemon_reads_the_committed_config covers it.
"""
import argparse
import collections
import copy
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "python"))

from mlfs import testing  # noqa: E402
from mlfs.testing import ClusterError  # noqa: E402
from mlfs.testing.layout import MIXED, make_full, write_full  # noqa: E402

LEASE_S = 6          # a node's etcd lease TTL (docs/many-nodes.md)
CMD_TIMEOUT = 150    # an `mlfs reconfigure` that has not returned by then is hung
SETTLE_TIMEOUT = 90  # the job settles on one version within this after the fault is undone


def schema_of(big_rows):
    """mlfs.testing.layout's MIXED (every kind of slicing and placement), plus a larger
    float32 tensor per layer."""
    s = copy.deepcopy(MIXED)
    s["model"] = "chaos"
    if big_rows:
        s["tensors"].append({"name": "layers/{L}/big/weight", "dtype": "float32",
                             "shape": [big_rows, 512], "split": {"dim": 0}})
    return s


MAX_TP = 4  # qkv's smallest chunk has 6 rows, proj 10 columns: tp <= 4 keeps it simple
NUM_LAYERS = 5


class Violation(Exception):
    def __init__(self, what, detail=""):
        super().__init__(what)
        self.what = what
        self.detail = detail


# ----------------------------------------------------------------- configs

def allocation(devs, nodes, world):
    slots = [(nid, d) for nid in nodes for d in range(devs[nid])]
    return slots[:world] if world <= len(slots) else None


def two_copies(devs, cfg):
    """Every (TP rank, stage) has replicas on at least two distinct nodes."""
    tp, pp, dp = cfg["tp"], cfg["pp"], cfg["dp"]
    alloc = allocation(devs, cfg["nodes"], tp * pp * dp)
    if alloc is None:
        return False
    for p in range(pp):
        for t in range(tp):
            where = {alloc[t + tp * d + tp * dp * p][0] for d in range(dp)}
            if len(where) < 2:
                return False
    return True


def hosted_nodes(devs, cfg):
    alloc = allocation(devs, cfg["nodes"], cfg["tp"] * cfg["pp"] * cfg["dp"])
    return {nid for nid, _ in alloc}


def layouts(devs, nodes, every_node=False):
    """Every (tp, pp, dp) over @nodes (in order) that keeps two copies of every slice;
    with @every_node, only those giving every node at least one rank."""
    total = sum(devs[n] for n in nodes)
    out = []
    for tp in range(1, MAX_TP + 1):
        for pp in range(1, NUM_LAYERS + 1):
            for dp in range(2, total + 1):
                if tp * pp * dp > total:
                    break
                cfg = {"tp": tp, "pp": pp, "dp": dp, "nodes": list(nodes)}
                if not two_copies(devs, cfg):
                    continue
                if every_node and hosted_nodes(devs, cfg) != set(nodes):
                    continue
                out.append((tp, pp, dp))
    return out


def pick_config(rr, devs, candidates, version, every_node=False, min_nodes=2):
    """A random config of @version over a random subset (all of @candidates with
    @every_node) in a random order."""
    for _ in range(200):
        if every_node:
            nodes = list(candidates)
        else:
            k = rr.randint(min(min_nodes, len(candidates)), len(candidates))
            nodes = rr.sample(list(candidates), k)
        if rr.random() < 0.6:  # mostly in cluster.json order, sometimes shuffled
            nodes.sort(key=lambda n: int(n[1:]))
        opts = layouts(devs, nodes, every_node)
        if not opts:
            continue
        tp, pp, dp = rr.choice(opts)
        cfg = {"version": version, "tp": tp, "pp": pp, "dp": dp, "nodes": nodes}
        if rr.random() < 0.15:
            cfg["replicas"] = 1
        return cfg
    raise RuntimeError(f"no layout keeps two copies of every slice on {candidates} ({devs})")


def short(cfg):
    if not cfg:
        return "none"
    r = " r1" if cfg.get("replicas") else ""
    return (f"v{cfg['version']} tp{cfg['tp']} pp{cfg['pp']} dp{cfg['dp']} "
            f"[{','.join(cfg['nodes'])}]{r}")


# ----------------------------------------------------------------- etcd poller

class Monitor(threading.Thread):
    """Polls the job's keys in etcd during a round: every distinct committed config
    seen (in order) and every attempt seen, by id."""

    def __init__(self, cl, interval=0.01, entries=False):
        super().__init__(daemon=True)
        self.entries = entries  # also record every change of the nodes' entries
        self.entry_log = []
        self.last_entries = {}
        self.cl = cl
        self.interval = interval
        self.stop_ev = threading.Event()
        self.lock = threading.Lock()
        self.configs = []     # [(t, config dict)] on each change
        self.attempts = {}    # id -> attempt dict (participants as indices)
        self.config_id = None
        self.polls = self.failures = 0
        self.t0 = time.monotonic()

    def run(self):
        prefix = f"/mlfs/{self.cl.job}/"
        while not self.stop_ev.is_set():
            try:
                kvs = self.cl.etcd.range(prefix) if self.cl.etcd.alive else None
            except Exception:  # noqa: BLE001 - etcd down or restarting
                kvs = None
            if kvs is None:
                self.failures += 1
            else:
                self.polls += 1
                self.record(kvs, prefix)
                if self.entries:
                    try:
                        ents = self.cl.etcd.range(f"/mlfs-nodes/{self.cl.job}/")
                    except Exception:  # noqa: BLE001
                        ents = {}
                    for k, kv in ents.items():
                        v = kv.value.decode(errors="replace")
                        if self.last_entries.get(k) != v:
                            self.last_entries[k] = v
                            self.entry_log.append((round(time.monotonic() - self.t0, 3),
                                                   k.rsplit("/", 1)[-1], v[:160]))
            self.stop_ev.wait(self.interval)

    def record(self, kvs, prefix):
        cfg_kv = kvs.get(prefix + "config")
        att_kv = kvs.get(prefix + "attempt")
        id_kv = kvs.get(prefix + "config_id")
        with self.lock:
            if cfg_kv is not None:
                try:
                    cfg = json.loads(cfg_kv.value)
                except ValueError:
                    cfg = {"unparsable": cfg_kv.value.decode(errors="replace")}
                if not self.configs or self.configs[-1][1] != cfg:
                    self.configs.append((time.monotonic() - self.t0, cfg))
            if att_kv is not None:
                try:
                    a = json.loads(att_kv.value)
                    if a.get("id") not in self.attempts:
                        self.attempts[a.get("id")] = a
                except ValueError:
                    pass
            if id_kv is not None:
                self.config_id = id_kv.value.decode(errors="replace").strip().strip('"')

    def seen_attempt(self):
        with self.lock:
            return bool(self.attempts)

    def seen_config(self, version):
        with self.lock:
            return any(c.get("version") == version for _, c in self.configs)

    def stop(self):
        self.stop_ev.set()
        self.join(10)


def participants(att, ids):
    """The participants of an attempt: "0-2,4" (indices into cluster.json) -> ids."""
    p = att.get("participants")
    if isinstance(p, list):
        return set(p)
    out = set()
    for part in (p or "").split(","):
        if not part:
            continue
        a, _, b = part.partition("-")
        for i in range(int(a), int(b or a) + 1):
            out.add(ids[i])
    return out


# ----------------------------------------------------------------- the adversary

class Chaos:
    def __init__(self, args):
        self.args = args
        self.seed = args.seed
        self.rng = random.Random(f"{args.seed}:setup")
        self.stats = collections.Counter()
        self.faults = collections.Counter()
        self.outcomes = collections.Counter()
        self.notes = []
        self.round = 0
        self.ctx = {}  # what the current round did, for a violation's report

    # ------------------------------------------------------------- cluster

    def start_cluster(self):
        a = self.args
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"mlfs-chaos-s{a.seed}-"))
        self.etcd = testing.Etcd(self.tmp).start()
        cl = testing.Cluster(self.tmp, self.etcd, a.nodes, 2, "chaos")
        if a.devices == "mixed":
            devs = [self.rng.choice([1, 2]) for _ in range(a.nodes)]
        else:
            devs = [int(a.devices)] * a.nodes
        for n, d in zip(cl.spec["nodes"], devs):
            n["devices"] = d
        cl.cluster_path = cl.file("cluster.json", cl.spec)
        self.cl = cl
        self.devs = {n["id"]: n["devices"] for n in cl.spec["nodes"]}
        cl.mount_all()
        return cl

    def teardown(self, keep):
        cl = getattr(self, "cl", None)
        problems = None
        try:
            if cl is not None:
                cl.teardown()
        except AssertionError as e:
            problems = str(e)
        finally:
            if getattr(self, "etcd", None) is not None:
                self.etcd.stop()
            if not keep and getattr(self, "tmp", None) is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
        return problems

    # ------------------------------------------------------------- helpers

    def log(self, msg):
        print(msg, flush=True)

    def live(self):
        return [n.id for n in self.cl.live()]

    def crashed(self):
        """Daemons that exited although nobody killed them."""
        return [(n.id, n.proc.returncode) for n in self.cl.nodes
                if not n.killed and n.proc.poll() is not None]

    def committed(self):
        return self.cl.wait(lambda: self.cl.committed() or None, "etcd's committed config",
                            timeout=30)

    def settle(self, expect_lost=(), timeout=SETTLE_TIMEOUT):
        """Waits until etcd has no attempt, every live node is registered and either idle
        or failed at the committed version, or lost (those of @expect_lost may be lost
        at an older version: they missed a commit). Returns (committed config,
        statuses). A node lost that hosts no rank of the committed layout must clear
        (rule 4), so it is waited for."""
        cl = self.cl

        def ok():
            if self.crashed():
                raise Violation("a daemon died by itself", f"{self.crashed()}")
            keys = cl.keys()
            if "attempt" in keys or "config" not in keys:
                return None
            cfg = json.loads(keys["config"].value)
            v = cfg["version"]
            hosts = hosted_nodes(self.devs, cfg)
            sts = cl.statuses()
            for nid, st in sts.items():
                if not isinstance(st, dict) or f"nodes/{nid}" not in keys:
                    return None
                if st["state"] == "lost" or st.get("lost"):
                    if st["state"] != "lost":
                        return None
                    if st["version"] == v and nid in hosts:
                        continue
                    if st["version"] < v and nid in expect_lost:
                        continue
                    return None
                if st["version"] != v or st["state"] not in ("idle", "failed"):
                    return None
            return cfg, sts
        try:
            return cl.wait(ok, "the job settled on its committed version", timeout,
                           interval=0.1)
        except ClusterError as e:
            raise Violation("(e) the job did not settle after the fault was undone",
                            str(e)) from None

    def check_state(self, cfg, sts, aborted, lost_ok):
        """(b) and (c) on a settled job: @lost_ok: {id: why} nodes allowed to be lost."""
        cl = self.cl
        v = cfg["version"]
        keys = cl.keys()
        good = []
        for nid, st in sts.items():
            if st["state"] == "lost":
                if nid not in lost_ok:
                    raise Violation(f"(b) {nid} is lost, with no fault that makes it so",
                                    json.dumps(st))
                want = lost_ok[nid]
                if want not in (st.get("error") or ""):
                    raise Violation(f"(b) {nid} is lost, but not for the reason the design "
                                    f"gives ({want!r})", json.dumps(st))
                continue
            if st["version"] != v:
                raise Violation(f"(b) {nid} at version {st['version']}, committed {v}",
                                json.dumps(st))
            if st["state"] not in (("idle", "failed") if aborted else ("idle",)):
                raise Violation(f"(b) {nid} is {st['state']} after the round "
                                f"({'abort' if aborted else 'commit'})", json.dumps(st))
            for field in ("target_version", "waiting"):
                if field in st:
                    raise Violation(f"(b) {nid}'s status.json still has {field!r}",
                                    json.dumps(st))
            got = cl[nid].read_json("config.json")
            if got != cfg:
                raise Violation(f"(b) {nid}'s config.json is not the committed config",
                                f"{nid}: {got}\netcd: {cfg}")
            entry = keys.get(f"nodes/{nid}")
            ev = json.loads(entry.value) if entry else None
            if not ev or ev.get("version") != v:
                # its entry follows its swap (put or carried by the ack): give it a moment
                def entry_ok(nid=nid):
                    kv = cl.keys().get(f"nodes/{nid}")
                    return kv and json.loads(kv.value).get("version") == v
                try:
                    cl.wait(entry_ok, f"{nid}'s etcd entry at version {v}", timeout=15)
                except ClusterError as e:
                    raise Violation(f"(b) {nid}'s etcd entry is not at version {v}",
                                    str(e)) from None
            good.append(nid)
        try:
            cl.check_layout(self.schema, cfg, self.full, step=self.step, nodes=good)
        except (AssertionError, OSError, ValueError) as e:
            raise Violation("(c) a partition differs from the NumPy reference",
                            f"{type(e).__name__}: {e}") from None
        return good

    def restart(self, nid):
        """Mounts a killed node again; first removes what a command may have written
        into its bare mount dir while it was unmounted."""
        node = self.cl[nid]
        if not os.path.ismount(node.path):
            for p in pathlib.Path(node.path).iterdir():
                if p.is_file():
                    p.unlink()
        self.cl.restart(nid)
        self.stats["restarts"] += 1

    def run_cmd(self, on, cfg, what):
        """A reconfiguration outside the chaos (recovery): waited for, must commit."""
        t = time.monotonic()
        mon = Monitor(self.cl, entries=True) if self.args.debug else None
        if mon:
            mon.start()
        p = self.cl.reconfigure(on, cfg, wait=False)
        try:
            out, err = p.communicate(timeout=CMD_TIMEOUT)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise Violation(f"(e) {what}: `mlfs reconfigure` {short(cfg)} on {on} still running "
                            f"after {CMD_TIMEOUT} s", f"stdout {out}\nstderr {err}")
        finally:
            if mon:
                mon.stop()
        if self.args.debug:
            atts = [f"{a.get('from')}->{a.get('to')} by {a.get('coordinator')} participants "
                    f"{sorted(participants(a, self.cl.ids))} down {a.get('down')} source "
                    f"{a.get('source')}" for a in mon.attempts.values()]
            self.log(f"    debug: {what} on {on}: rc {p.returncode}, {time.monotonic() - t:.1f} s, "
                     f"attempts {atts}, stdout {out.strip()[:80]!r}, stderr {err.strip()!r}")
            for e in mon.entry_log:
                self.log(f"      entry {e}")
        if p.returncode != 0:
            raise Violation(f"(e) {what}: {short(cfg)} on {on} failed (rc {p.returncode}) on a "
                            "healthy job", f"stdout {out}\nstderr {err}")
        self.stats["recovery_commits"] += 1
        return time.monotonic() - t

    # ------------------------------------------------------------- the job

    def start_job(self):
        cl = self.cl
        self.schema = schema_of(self.args.big_rows)
        self.full = make_full(self.schema, np.random.default_rng(self.seed))
        self.step = self.rng.randint(1, 100)
        ids = self.live()
        cfg = pick_config(self.rng, self.devs, ids, 1)
        on = self.rng.choice(ids)
        cl.start_job(self.schema, cfg, on, self.full, self.step)
        cl.check_layout(self.schema, cfg, self.full, step=self.step)
        self.log(f"# seed {self.seed}: {len(ids)} nodes, devices "
                 f"{ {k: v for k, v in self.devs.items()} }, tmp {self.tmp}")
        self.log(f"# job started: {short(cfg)} on {on}, step {self.step}")

    def new_checkpoint(self, cfg):
        """Imports new full tensors at the next step on every node (the job trains)."""
        cl = self.cl
        self.step += 1
        self.full = make_full(self.schema, np.random.default_rng([self.seed, self.step]))
        ckpt = cl.tmp / f"ckpt-{self.step}"
        write_full(ckpt, self.full)
        for nid in self.live():
            p = cl[nid].mlfs("import", "--from", ckpt, "--step", str(self.step), check=False)
            if p.returncode != 0:
                raise Violation(f"import of step {self.step} on {nid} failed on a healthy job",
                                p.stderr)
        cl.wait_published(cfg, self.step)
        shutil.rmtree(ckpt, ignore_errors=True)
        self.stats["imports"] += 1

    # ------------------------------------------------------------- one round

    def pick_fault(self, rr, coord, ids):
        kind = rr.choices(["none", "kill", "freeze", "etcd"], weights=[2, 3, 3, 2])[0]
        f = {"kind": kind}
        if kind in ("kill", "freeze"):
            others = [n for n in ids if n != coord]
            f["node"] = coord if rr.random() < 0.35 or not others else rr.choice(others)
            f["role"] = "coordinator" if f["node"] == coord else "participant"
        if kind == "freeze":
            f["seconds"] = (round(rr.uniform(LEASE_S + 0.5, LEASE_S + 4), 2)
                            if rr.random() < 0.4 else round(rr.uniform(0.05, 2.5), 2))
        if kind == "etcd":
            f["seconds"] = round(rr.uniform(0.1, 4.0), 2)
        if kind == "kill":
            f["restart"] = rr.choice(["at once", "after its lease"])
        # "before": the fault begins 0-200 ms before the command starts (a tiny job's
        # attempt commits within tens of milliseconds, so this is how a fault lands
        # before the votes); "delay": 0-500 ms after it started; "attempt": once the
        # attempt is in etcd; "phase": once the faulted node (or the coordinator)
        # reports that state in status.json; "committed": once etcd has the new config.
        trig = rr.choices(["before", "delay", "attempt", "phase", "committed"],
                          weights=[3, 2, 2, 2, 1])[0]
        if kind == "none":
            trig = "delay"
        if trig == "before" and kind == "kill" and f["node"] == coord:
            # the command would run on a dead mount: kill another node instead
            others = [n for n in ids if n != coord]
            f["node"], f["role"] = rr.choice(others), "participant"
        f["trigger"] = trig
        f["delay"] = round(rr.uniform(0, {"delay": 0.5, "before": 0.2}.get(trig, 0.1)), 3)
        if trig == "phase":
            f["phase"] = rr.choice(["preparing", "prepared", "committing"])
            f["watch"] = f.get("node", coord)
        return f

    def describe_fault(self, f):
        k = f["kind"]
        if k == "none":
            s = "none"
        elif k == "kill":
            s = f"kill -9 {f['node']} ({f['role']}; restart {f['restart']})"
        elif k == "freeze":
            s = f"SIGSTOP {f['node']} ({f['role']}) {f['seconds']} s"
        else:
            s = f"etcd down {f['seconds']} s"
        if k != "none":
            if f["trigger"] == "before":
                s += f" @ {int(f['delay'] * 1000)} ms before the command"
            else:
                at = {"delay": "", "attempt": "attempt in etcd + ",
                      "committed": "commit in etcd + ",
                      "phase": f"{f.get('watch')} {f.get('phase')} + "}[f["trigger"]]
                s += f" @ {at}{int(f['delay'] * 1000)} ms"
        return s

    def wait_trigger(self, f, proc, mon, new):
        """Waits for the fault's moment; returns how it fired ("on time", or "late" when
        the command ended, or 15 s passed, first)."""
        t = f["trigger"]
        if t == "delay":
            time.sleep(f["delay"])
            return "on time"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if t == "attempt" and mon.seen_attempt():
                break
            if t == "committed" and mon.seen_config(new["version"]):
                break
            if t == "phase":
                try:
                    st = self.cl[f["watch"]].status(timeout=5)
                    if st["state"] == f["phase"]:
                        break
                except (OSError, ValueError, TimeoutError):
                    pass
            if proc.poll() is not None:
                return "late (the command had ended)"
            time.sleep(0.002 if t == "phase" else 0.003)
        else:
            return "late (15 s)"
        time.sleep(f["delay"])
        return "on time"

    def begin_fault(self, f):
        """Kills, freezes or takes etcd down now; returns when (time.monotonic())."""
        cl = self.cl
        if f["kind"] == "kill":
            cl.kill(f["node"])
        elif f["kind"] == "freeze":
            cl.freeze(f["node"])
        elif f["kind"] == "etcd":
            cl.kill_etcd()
        return time.monotonic()

    def one_round(self):
        cl = self.cl
        self.round += 1
        rr = random.Random(f"{self.seed}:{self.round}")
        t0 = time.monotonic()
        old = self.committed()
        ids = self.live()
        new = pick_config(rr, self.devs, ids, old["version"] + 1)
        coord = rr.choice(ids)
        f = self.pick_fault(rr, coord, ids)
        self.ctx = {"round": self.round, "old": old, "new": new, "coordinator": coord,
                    "fault": self.describe_fault(f)}
        self.faults[f["kind"] + (f"-{f['role']}" if "role" in f else "") +
                    ("-long" if f["kind"] == "freeze" and f["seconds"] > LEASE_S else "")] += 1

        mon = Monitor(cl)
        mon.start()
        killed = f["node"] if f["kind"] == "kill" else None
        if f["trigger"] == "before":
            began = self.begin_fault(f)
            time.sleep(f["delay"])
            proc = cl.reconfigure(coord, new, wait=False)
            fired = "on time"
        else:
            proc = cl.reconfigure(coord, new, wait=False)
            fired = self.wait_trigger(f, proc, mon, new) if f["kind"] != "none" else "-"
            began = self.begin_fault(f)
        self.ctx["fired"] = fired
        if f["kind"] == "freeze":
            time.sleep(max(0.0, began + f["seconds"] - time.monotonic()))
            cl.thaw(f["node"])
        elif f["kind"] == "etcd":
            time.sleep(max(0.0, began + f["seconds"] - time.monotonic()))
            cl.etcd.restart()

        try:
            out, err = proc.communicate(timeout=CMD_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            self.ctx.update(stdout=out, stderr=err)
            raise Violation(f"(e) `mlfs reconfigure` on {coord} still running {CMD_TIMEOUT} s "
                            "after it started, the fault undone")
        rc = proc.returncode
        self.ctx.update(rc=rc, stdout=out, stderr=err)

        if killed:
            if f["restart"] == "after its lease":
                cl.wait_down(killed, timeout=30)
            self.restart(killed)

        # The job settles; a node frozen through a commit it took no part in may be
        # lost ("missed the commit"), found below.
        frozen = [f["node"]] if f["kind"] == "freeze" else []
        cfg, sts = self.settle(expect_lost=frozen)
        time.sleep(0.3)  # a poll or two more of etcd after the settle
        mon.stop()
        self.ctx["configs_seen"] = [(round(t, 3), short(c)) for t, c in mon.configs]
        self.ctx["attempts_seen"] = [
            f"{aid}: {a.get('from')}->{a.get('to')} by {a.get('coordinator')}, participants "
            f"{sorted(participants(a, cl.ids))}, down {a.get('down')}"
            for aid, a in mon.attempts.items()] + [f"config_id {mon.config_id}"]

        # (a) the committed config is the old or the new one, at every moment seen
        for _, c in mon.configs:
            if c != old and c != new:
                raise Violation("(a) etcd's committed config was neither the old nor the new "
                                "config during the round", json.dumps(c))
        seq = [c["version"] for _, c in mon.configs]
        if old["version"] + 1 in seq and seq.index(old["version"] + 1) < len(seq) - 1:
            raise Violation("(a) the committed config went back after the commit", str(seq))
        if cfg != old and cfg != new:
            raise Violation("(a) etcd's committed config is neither the old nor the new config",
                            json.dumps(cfg))
        if rc == 0 and cfg != new:
            raise Violation("(a) `mlfs reconfigure` exited 0 but the old config is committed")
        if f["kind"] == "none" and rc != 0:
            raise Violation("(a) a round without a fault did not commit (healthy nodes, "
                            "a valid config)")
        # (d) a failed command says why
        if rc != 0 and not err.strip():
            raise Violation("(d) `mlfs reconfigure` failed with an empty stderr")
        committed_new = cfg == new
        aborted = not committed_new

        # Who may be lost: the node restarted (if it hosts ranks of the committed
        # layout), and a frozen node that took no part in the commit (missed it).
        lost_ok = {}
        if killed and killed in hosted_nodes(self.devs, cfg):
            lost_ok[killed] = "started without the job's state"
        missed = []
        if f["kind"] == "freeze" and committed_new:
            att = mon.attempts.get(mon.config_id)
            nid = f["node"]
            if att is not None and nid not in participants(att, cl.ids):
                lost_ok[nid] = "missed the commit"
                missed.append(nid)
            st = sts.get(nid)
            if isinstance(st, dict) and st["state"] == "lost" and nid not in lost_ok:
                raise Violation(f"(b) {nid}, frozen {f['seconds']} s, is lost after a commit "
                                "it took part in (the design: it swaps when it thaws)",
                                json.dumps(st) + f"\nattempt {json.dumps(att)}")
        good = self.check_state(cfg, sts, aborted, lost_ok)
        lost = sorted(n for n, st in sts.items() if st["state"] == "lost")

        outcome = "commit" if committed_new else "abort"
        self.outcomes[outcome] += 1
        self.outcomes[f"{f['kind']}:{outcome}"] += 1
        why = ""
        if rc != 0:
            why = " | " + " ".join(err.strip().splitlines()[-1:])[:140]
        line = (f"round {self.round:3d} {short(old)} -> {short(new)} on {coord}; "
                f"fault {self.describe_fault(f)} [{fired}]; rc {rc} {outcome}"
                f"{'; lost ' + ','.join(lost) if lost else ''}; checked {len(good)} nodes")

        # (e) never wedged: undo what the design says an operator undoes, then a
        # config onto every live node commits.
        rec = ""
        if f["kind"] != "none" or lost or rr.random() < 0.25:
            rec = self.recover(rr, cfg, missed)
        if rr.random() < self.args.import_prob:
            self.new_checkpoint(self.committed())
            rec += f"; imported step {self.step}"
        self.log(f"{line}{rec}{why}; {time.monotonic() - t0:.1f} s")

    def recover(self, rr, cfg, missed):
        cl = self.cl
        steps = []
        for nid in missed:  # "must be restarted" (docs/many-nodes.md, Lost nodes)
            cl.kill(nid)
            self.restart(nid)
            self.stats["operator_restarts"] += 1
            steps.append(f"restart {nid}")
        if missed:
            cfg, sts = self.settle()
            self.check_state(cfg, sts, True, {n: "started without the job's state"
                                             for n in missed})
        sts = cl.statuses()
        lost = [n for n, st in sts.items() if isinstance(st, dict) and st["state"] == "lost"]
        if lost:  # drop it from the config first (its state comes from the others)
            keep = [n for n in self.live() if n not in lost]
            drop = pick_config(rr, self.devs, keep, cfg["version"] + 1)
            on = rr.choice(keep)
            self.ctx["recovery"] = f"drop {lost}: {short(drop)} on {on}"
            if self.args.debug:
                keys = cl.keys()
                for k in sorted(keys):
                    if k.startswith(("nodes/", "released", "config_id", "saved/")):
                        self.log(f"    debug before the drop: {k} = "
                                 f"{keys[k].value.decode(errors='replace')[:200]}")
                for nid in self.live():
                    st, h = cl[nid].get("/v1/health")
                    self.log(f"    debug before the drop: {nid} /v1/health {st} {h[:200]}")

            secs = self.run_cmd(on, drop, f"dropping lost {lost}")
            cfg, sts = self.settle()
            if cfg != drop:
                raise Violation("(a) the drop config exited 0 but is not committed")
            self.check_state(cfg, sts, False, {})
            steps.append(f"drop {','.join(lost)} {short(drop)} {secs:.1f} s")
        # ... then every live node
        every = pick_config(rr, self.devs, self.live(), cfg["version"] + 1, every_node=True)
        on = rr.choice(self.live())
        self.ctx["recovery"] = f"onto every node: {short(every)} on {on}"
        secs = self.run_cmd(on, every, "a config onto every live node")
        cfg, sts = self.settle()
        if cfg != every:
            raise Violation("(a) the config onto every node exited 0 but is not committed")
        self.check_state(cfg, sts, False, {})
        steps.append(f"all {short(every)} {secs:.1f} s")
        return "; recovery: " + ", ".join(steps)

    # ------------------------------------------------------------- reports

    def report_violation(self, v):
        cl = getattr(self, "cl", None)
        out = ["", "=" * 78, f"VIOLATION: {v.what}", f"seed {self.seed}, round {self.round}"]
        for k in ("fault", "fired", "coordinator", "old", "new", "recovery", "rc", "stdout",
                  "stderr", "configs_seen", "attempts_seen"):
            if k in self.ctx:
                val = self.ctx[k]
                if isinstance(val, dict):
                    val = json.dumps(val)
                out.append(f"{k}: {val}")
        if v.detail:
            out.append(f"detail: {v.detail}")
        if cl is not None:
            try:
                out.append("--- cl.describe():")
                out.append(cl.describe())
            except Exception as e:  # noqa: BLE001
                out.append(f"(describe failed: {e!r})")
            for n in cl.nodes + cl.retired:
                try:
                    tail = n.stderr().strip().splitlines()[-40:]
                except OSError:
                    tail = []
                out.append(f"--- {n.id} {n.stderr_path} (last {len(tail)} lines):")
                out += ["  " + s for s in tail]
        out.append(f"tmp kept: {getattr(self, 'tmp', None)}")
        out.append("=" * 78)
        self.log("\n".join(out))

    def summary(self, elapsed, status):
        f = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items()))
        o = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()) if ":" in k)
        self.log(f"summary: seed {self.seed}, {self.args.nodes} nodes, {status}, "
                 f"{self.round} rounds in {elapsed:.0f} s: {self.outcomes['commit']} commits, "
                 f"{self.outcomes['abort']} aborts; recovery commits "
                 f"{self.stats['recovery_commits']}, restarts {self.stats['restarts']} "
                 f"(operator restarts {self.stats['operator_restarts']}), checkpoint imports "
                 f"{self.stats['imports']}")
        self.log(f"summary: faults: {f}")
        self.log(f"summary: outcomes by fault: {o}")

    def main(self):
        start = time.monotonic()
        status, code = "ok", 0
        keep = self.args.keep
        try:
            self.start_cluster()
            self.start_job()
            while time.monotonic() - start < self.args.seconds:
                self.one_round()
        except Violation as v:
            self.report_violation(v)
            status, code, keep = f"VIOLATION at round {self.round}", 1, True
        except (ClusterError, AssertionError, Exception) as e:  # noqa: BLE001
            self.report_violation(Violation(f"harness failure: {type(e).__name__}",
                                            traceback.format_exc()))
            status, code, keep = f"FAILURE at round {self.round}", 1, True
        finally:
            problems = self.teardown(keep)
        if problems:
            self.log(f"teardown: {problems}")
            if code == 0:
                status, code = "teardown failed", 1
        self.summary(time.monotonic() - start, status)
        return code


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=5)
    ap.add_argument("--devices", default="mixed", help="1, 2 or mixed (per node, seeded)")
    ap.add_argument("--big-rows", type=int, default=1024,
                    help="rows of the float32 [rows, 512] tensor per layer (0: none)")
    ap.add_argument("--import-prob", type=float, default=0.1,
                    help="chance per round of importing a new checkpoint at the next step")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--debug", action="store_true",
                    help="print the nodes' etcd entries and /v1/health before each drop")
    args = ap.parse_args()
    if args.nodes < 3:
        ap.error("--nodes must be at least 3 (two copies on two nodes, one node faulted)")
    sys.exit(Chaos(args).main())


if __name__ == "__main__":
    main()
