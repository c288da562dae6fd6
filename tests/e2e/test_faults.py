"""Faults of the data plane (issue 17): a TCP proxy (proxy.py) in front of a daemon's
peer port holds, cuts or delays that node's replies while the other nodes fetch from
it during a reconfiguration. Every partition is checked against NumPy slices of the
checkpoint, read through the mounts.

The proxied node's cluster.json "addr" is the proxy's port, which its peers connect
to; the daemon itself listens on its real port (`mlfs mount --peer-listen`).

1. replies held (the node alive in etcd): the coordinator cannot read its job/ (written
   since the last commit) within 2 s, so its vote fails once it prepared; the abort cancels the fetches held in the
   proxy, every node is idle again within 2 s of the decision, the old layout is intact,
   and the same config commits once replies pass. Replies held for 3 s (less than the
   fetch's 10 s stall timeout), then released: the config commits;
2. a reply cut mid-body once: the fetch is retried and the config commits, bit-exact;
   every reply cut (FIN or RST): the attempt aborts, naming the node, the old layout
   intact; with a DP replica elsewhere, the rows come from the replica and it commits;
3. every reply chunk delayed 50 ms: the config commits, bit-exact, and the node served
   what the plan says through the proxy;
4. checksums (issue 18): one bit flipped in every /v1/part reply body of a node: with a
   DP replica elsewhere the rows come from the replica and the config commits,
   bit-exact; without one the attempt aborts naming the partition and the node, the old
   layout intact. One bit flipped in every backup fetch (&snap=): the backup is not
   taken (status.json says "checksum mismatch") and a config dropping the dead node is
   refused; once replies pass, the backup is taken and serves the dead node bit-exact.
   `mlfs verify` finds a byte flipped in memory (the MLFS_TEST_HOOKS=1 hook "flip").

These tests found three bugs, fixed with them: a peer fetch was never retried on the
same node (the peer client's net_http had no retries), an attempt aborted by a failed
fetch said only "Input/output error" (the build's abort overwrote the fetch's note naming
the peer), and a fetch cancelled by an abort overwrote the abort's reason.
"""
import json
import os
import re
import time

import numpy as np
import pytest

from mlfs.testing import Cluster
from proxy import Proxy
from test_store import expand, make_full

# Stage 1 of V1 (layer 1, two TP ranks) is about 1.6 MiB: replies of many chunks.
SCHEMA = {
    "model": "faults",
    "num_layers": 2,
    "states": {"model": {}, "optim/exp_avg": {"dtype": "float32"}},
    "tensors": [
        {"name": "embedding/weight", "dtype": "bfloat16", "shape": [1000, 64],
         "split": {"dim": 0, "pad_multiple": 4}, "place": "first"},
        {"name": "layers/{L}/qkv/weight", "dtype": "bfloat16", "shape": [384, 256],
         "split": {"dim": 0, "chunks": [128, 128, 128]}},
        {"name": "layers/{L}/proj/weight", "dtype": "float32", "shape": [256, 512],
         "split": {"dim": 1}},
        {"name": "layers/{L}/proj/bias", "dtype": "bfloat16", "shape": [256]},
    ],
}
# n0 holds stage 0, n1 stage 1 (no DP replica) ...
V1 = {"version": 1, "tp": 2, "pp": 2, "dp": 1, "nodes": ["n0", "n1"]}
# ... then n1 takes stage 0 (fetched from n0) and n2 stage 1 (fetched from n1 only).
V2 = {"version": 2, "tp": 2, "pp": 2, "dp": 1, "nodes": ["n1", "n2"]}
PART = b"/v1/part"


class ProxiedCluster(Cluster):
    """A Cluster whose nodes @behind are reached through a Proxy each (self.proxies):
    cluster.json gives them the proxy's address, and their daemons listen on the port
    the harness chose (--peer-listen)."""

    def __init__(self, tmp, etcd, nnodes, devices, behind, node_env=None):
        super().__init__(tmp, etcd, nnodes, devices, "j", (), node_env)
        taken = {int(n["addr"].rsplit(":", 1)[1]) for n in self.spec["nodes"]}
        taken |= {etcd.client_port, etcd.peer_port}
        self.proxies, self.listen = {}, {}
        for nid in behind:
            node = next(n for n in self.spec["nodes"] if n["id"] == nid)
            port = int(node["addr"].rsplit(":", 1)[1])
            p = Proxy(port, avoid=taken, chunk=16384)
            self.proxies[nid] = p
            taken.add(p.port)
            self.listen[nid] = node["addr"]
            node["addr"] = p.addr
        self.cluster_path = self.file("cluster.json", self.spec)

    def _spawn(self, node_id, mnt, cluster_path, tag):
        extra = self.extra_args
        if node_id in self.listen:
            self.extra_args = extra + ["--peer-listen", self.listen[node_id]]
        try:
            return super()._spawn(node_id, mnt, cluster_path, tag)
        finally:
            self.extra_args = extra

    def describe(self):
        return "\n".join([super().describe()] +
                         [f"--- proxy of {nid}: {p!r}" for nid, p in self.proxies.items()])

    def close_proxies(self):
        errors = []
        for p in self.proxies.values():
            try:
                p.close()
            except AssertionError as e:
                errors.append(str(e))
        assert not errors, "\n".join(errors)


@pytest.fixture
def proxied(tmp_path, etcd):
    """proxied(nnodes=3, devices=2, behind=("n1",)) -> ProxiedCluster, every node
    mounted and registered. At teardown the daemons stop as cluster_factory's do, then
    every proxy closes with all its threads and sockets."""
    made = []

    def make(nnodes=3, devices=2, behind=("n1",), node_env=None):
        cl = ProxiedCluster(tmp_path, etcd, nnodes, devices, behind, node_env)
        made.append(cl)
        for n in cl.spec["nodes"]:
            cl.mount(n["id"])
        cl.wait_registered()
        return cl

    yield make
    errors = []
    for cl in made:
        for p in cl.proxies.values():
            p.passthrough()
        for step in (cl.teardown, cl.close_proxies):
            try:
                step()
            except AssertionError as e:
                errors.append(str(e))
    assert not errors, "\n".join(errors)


def start(cl, v1, seed, step=5):
    full = make_full(SCHEMA, np.random.default_rng(seed))
    cl.start_job(SCHEMA, v1, "n0", full, step=step)
    return full


def served_by(cl, a, b, nid):
    """Bytes node @nid sends its peers for the plan of @a to @b."""
    return cl.plan(SCHEMA, a, b)["per_node"].get(nid, {}).get("bytes_out", 0)


def check_unchanged(cl, before, v, full, step):
    """The old layout is current everywhere, byte for byte, and NumPy-exact."""
    now = cl.snapshot()
    for nid in before:
        assert now[nid] == before[nid], f"{nid}: the old layout changed\n{cl.describe()}"
    cl.check_layout(SCHEMA, v, full, step=step)


def commit(cl, cfg, on, full, step):
    p = cl.reconfigure(on, cfg)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}\n{cl.describe()}"
    cl.wait_version(cfg["version"])
    cl.check_layout(SCHEMA, cfg, full, step=step)


def test_held_replies_abort_and_every_node_is_idle_within_2s(proxied):
    cl = proxied(behind=("n0", "n1"))
    p0, p1 = cl.proxies["n0"], cl.proxies["n1"]
    full = start(cl, V1, 40)
    before = cl.snapshot()
    # a job/ write on n1: its entry no longer says its job/ is the coordinator's, so the
    # coordinator must read n1's (it reads only those it does not know)
    cl["n1"].write("job/notes.txt", "n1's\n")
    cl.wait(lambda: "job" not in json.loads(cl.etcd.kv(f"/mlfs-nodes/{cl.job}/n1").value),
            "n1's entry without its job/ digest", timeout=10)

    # n1's replies are all held: the coordinator's read of n1's job/ (2 s) and n2's
    # fetches of stage 1. n0's partition replies are held too, so that n1, fetching
    # stage 0, votes only once n2 is surely stuck on n1.
    cl.faults = True
    p1.stall()
    p0.stall(match=PART)
    t0 = time.monotonic()
    proc = cl.reconfigure("n0", V2, wait=False)
    # the attempt is created once the read of n1's job/ gave up, after 2 s
    created = cl.wait(lambda: "attempt" in cl.keys() and time.monotonic(), "the attempt",
                      timeout=20, interval=0.01) - t0
    assert 1.9 < created < 10, f"the attempt created after {created:.1f} s"
    cl.wait(lambda: any("/v1/part" in r for r in p1.held_requests()) and
            p0.held_requests(), "n2's fetch held at n1's proxy and n1's at n0's", timeout=20)
    keys = cl.keys()
    att = json.loads(keys["attempt"].value)
    assert att["to"] == 2 and att["job_missing"] == ["n1"], att
    assert not cl.vote("n0", 2, "n1") and not cl.vote("n0", 2, "n2"), cl.describe()
    assert "result/2" not in keys
    held_at_n1 = p1.held_requests()

    p0.passthrough()  # n1 prepares, then votes failed: its job/ was not read
    decided = cl.wait(lambda: "attempt" not in cl.keys() and time.monotonic(),
                      "the abort of version 2", timeout=20, interval=0.01)
    result = cl.keys()["result/2"].value.decode()
    assert result.startswith("aborted: node n1: failed:") and "job/" in result, result

    def idle():
        sts = cl.statuses()
        return (all(isinstance(s, dict) and s["version"] == 1 and
                    s["state"] in ("idle", "failed") for s in sts.values())
                and p1.stats()["held"] == 0)
    cl.wait(idle, "every node idle at version 1, no reply held", timeout=30, interval=0.02)
    idle_after = time.monotonic() - decided
    # n2 hung up its held fetches within 2 s of the decision (the proxy's clock; the
    # decision is when this test saw it, at most a poll late) ...
    hangups = [t - decided for t, r in p1.hangups if "/v1/part" in r]
    assert hangups and max(hangups) < 2, (hangups, p1.hangups)
    # ... and every node said so in status.json (read through FUSE, polled: a loaded
    # machine may add a little)
    assert idle_after < 3, f"{idle_after:.2f} s from the abort to idle\n{cl.describe()}"
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "n1" in err, (proc.returncode, out, err)
    sts = cl.statuses()
    # (the coordinator quotes etcd's result: "... aborted: aborted: node n1: ...")
    assert sts["n0"]["error"].startswith("reconfiguration to version 2 aborted") and \
        "node n1: failed:" in sts["n0"]["error"], sts["n0"]
    for nid in ("n1", "n2"):
        assert sts[nid]["state"] == "failed", (nid, sts[nid])
    assert sts["n1"]["error"].startswith("reconfiguration to version 2 aborted"), sts["n1"]
    # (a single piece, or a batch of small ones: /v1/part or /v1/parts)
    assert any(re.search(r"/v1/parts?\?version=1&", r) for r in held_at_n1), held_at_n1
    check_unchanged(cl, before, V1, full, 5)

    # Replies pass again: the same config commits, bit-exact.
    p1.passthrough()
    commit(cl, V2, "n0", full, 5)
    assert cl.committed() == V2

    # n2's status.json said why the attempt ended, as every participant's must
    # (many-nodes.md: "status.json and mlfs reconfigure say why"): its fetch, cancelled
    # by the abort, does not overwrite the reason.
    assert sts["n2"]["error"].startswith("reconfiguration to version 2 aborted"), sts["n2"]


def test_replies_held_briefly_then_released_commit(proxied):
    cl = proxied()
    p1 = cl.proxies["n1"]
    full = start(cl, V1, 45)
    # n2's fetches of stage 1 held for 3 s, less than the fetch's stall timeout (10 s)
    p1.stall(match=PART)
    proc = cl.reconfigure("n0", V2, wait=False)
    cl.wait(lambda: any("/v1/part" in r for r in p1.held_requests()),
            "n2's fetch held at n1's proxy", timeout=20)
    held = time.monotonic()
    while time.monotonic() - held < 3:
        st = cl["n2"].status()
        assert st["version"] == 1 and st["state"] == "preparing", st
        assert not cl.vote("n0", 2, "n2") and proc.poll() is None
        time.sleep(0.2)
    p1.passthrough()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, f"{out}\n{err}\n{cl.describe()}"
    cl.wait_version(2)
    cl.check_layout(SCHEMA, V2, full, step=5)
    assert p1.stats()["holds"] >= 1 and p1.stats()["held"] == 0, p1.stats()


def test_votes_the_coordinators_port_refuses_go_into_the_entries(proxied):
    """n1 and n2 reach etcd and each other, but not the coordinator n0's peer port
    for their votes: no POST /v1/vote reaches n0, each waits out its 2 s deadline. Each puts
    its vote into its node entry instead, which the coordinator follows during its
    attempt, and the attempt commits (before, it waited out its 300 s deadline with
    every node prepared and partition writes refused). Once the attempt is gone,
    the entry's next put drops the vote. Their swap acks after the commit (the same
    POST) are lost the same way: each entry says the swap at once, and the
    coordinator releases version 1 on the entries."""
    cl = proxied(behind=("n0",))
    p0 = cl.proxies["n0"]
    full = start(cl, V1, 47)
    cl.faults = True  # the undelivered votes are logged
    p0.swallow(match=b"/v1/vote")
    t0 = time.monotonic()
    p = cl.reconfigure("n0", V2)
    took = time.monotonic() - t0
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}\n{cl.describe()}"
    assert took < 30, f"committed after {took:.1f} s"
    assert sum("/v1/vote" in r for r in p0.requests) >= 2, p0.requests
    assert p0.stats()["swallowed"] >= 2, p0.stats()
    cl.wait_version(2)
    cl.check_layout(SCHEMA, V2, full, step=5)
    assert cl.keys()["result/2"].value == b"committed"
    for nid in ("n1", "n2"):
        assert "put in this node's entry instead" in cl[nid].stderr(), cl[nid].stderr()
        # their swap acks (the same POST) were swallowed too: each entry said it at
        # once, and the coordinator released on the entries
        assert "cannot reach the coordinator" in cl[nid].stderr(), cl[nid].stderr()
    def released():  # "2", or {"version": 2, "entries": [...]} with the entries it put
        v = json.loads(cl.keys()["released"].value)
        return v["version"] if isinstance(v, dict) else v
    cl.wait(lambda: released() == 2, "version 2 released", timeout=10)

    def no_vote_in_entries():
        entries = [json.loads(cl.etcd.kv(f"/mlfs-nodes/{cl.job}/{nid}").value)
                   for nid in ("n1", "n2")]
        return all("vote" not in e and e["version"] == 2 for e in entries)
    cl.wait(no_vote_in_entries, "the entries at version 2 without the votes", timeout=10)

    # Still cut off: the next reconfiguration commits the same way.
    p = cl.reconfigure("n0", dict(V1, version=3))
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}\n{cl.describe()}"
    p0.passthrough()
    cl.wait_version(3)
    cl.check_layout(SCHEMA, dict(V1, version=3), full, step=5)


def check_abort_names(cl, proc_err, culprit, fetcher, to=2):
    """The attempt to version @to aborted because @fetcher could not fetch from
    @culprit: `mlfs reconfigure`'s message, etcd's result and @fetcher's status.json
    name @culprit. Returns the problems found (a list of strings)."""
    result = cl.keys()[f"result/{to}"].value.decode()
    err = cl[fetcher].status()["error"] or ""
    return [f"{what} does not name {culprit}: {text!r}"
            for what, text in (("mlfs reconfigure", proc_err), (f"result/{to}", result),
                               (f"{fetcher}'s status.json error", err))
            if culprit not in text]


def test_a_batch_that_fails_is_fetched_piece_by_piece(proxied):
    """n2 fetches stage 1's small pieces from n1 in batches (/v1/parts); every batch
    reply is cut: after net_http's retries each piece of it is fetched alone
    (/v1/part), and the commit is bit-exact."""
    cl = proxied()
    p1 = cl.proxies["n1"]
    full = start(cl, V1, 42)
    cl.faults = True  # the cuts are logged
    p1.drop(after=0, match=b"/v1/parts")
    p = cl.reconfigure("n0", V2)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    batches = [r for r in p1.requests if "/v1/parts?" in r]
    singles = [r for r in p1.requests if "/v1/part?" in r]
    assert batches and p1.stats()["cuts"] >= len(batches), (p1.stats(), p1.requests)
    # each batch carried several pieces, each asked again alone
    assert len(singles) > len(set(batches)), p1.requests
    cl.wait_version(2)
    cl.check_layout(SCHEMA, V2, full, step=5)
    plan = cl.plan(SCHEMA, V1, V2)["per_node"]
    assert cl["n2"].status()["last"]["bytes_fetched"] == plan["n2"]["bytes_in"]


def test_a_batch_is_at_most_a_megabyte(proxied):
    """/v1/parts carries at most XF_BATCH_BYTES (1 MiB): five boxes of 256 KiB are a
    400 that says so, four are served, byte for byte the rows of /v1/part."""
    cl = proxied()
    start(cl, V1, 43)
    names = [name for name, _, _ in expand(SCHEMA)]
    t = names.index("layers/1/proj/weight")  # 256 x 256 float32 per TP rank: 256 KiB
    n1 = cl["n1"]
    box = f"2.0.{t}.0.256"
    status, body = n1.get(f"/v1/parts?version=1&boxes={','.join([box] * 5)}")
    assert status == 400 and b"more than 1048576 bytes" in body, (status, body)
    status, body = n1.get(f"/v1/parts?version=1&boxes={','.join([box] * 4)}")
    assert status == 200 and len(body) == 4 << 18, (status, len(body))
    status, one = n1.get(f"/v1/part?version=1&rank=2&state=0&tensor={t}&row=0&rows=256")
    assert status == 200 and body == one * 4


def test_reply_cut_once_is_retried(proxied):
    cl = proxied()
    p1 = cl.proxies["n1"]
    full = start(cl, V1, 41)
    cl.faults = True  # the cut is logged
    p1.drop(after=20000, count=1, match=PART)  # in the body of the first part reply
    p = cl.reconfigure("n0", V2)
    st = p1.stats()
    assert st["cuts"] == 1 and st["mode"] == "pass", st
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    assert any(p1.requests.count(r) > 1 for r in p1.requests if "/v1/part" in r), \
        p1.requests  # the cut one asked again
    cl.wait_version(2)
    cl.check_layout(SCHEMA, V2, full, step=5)
    # n2 fetched what the plan says from n1 (the cut try's bytes are not counted)
    plan = cl.plan(SCHEMA, V1, V2)["per_node"]
    last = cl["n2"].status()["last"]
    assert last["bytes_fetched"] == plan["n2"]["bytes_in"], (last, plan)


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_every_reply_cut_aborts_naming_the_node(proxied, reset):
    cl = proxied()
    p1 = cl.proxies["n1"]
    full = start(cl, V1, 42)
    before = cl.snapshot()
    cl.faults = True
    p1.drop(after=20000, match=PART, reset=reset)
    p = cl.reconfigure("n0", V2)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert cl.wait_settled() == 1
    result = cl.keys()["result/2"].value.decode()
    assert result.startswith("aborted: node n2: failed:"), result
    sts = cl.statuses()
    for nid in ("n0", "n2"):
        assert sts[nid]["state"] == "failed", (nid, sts[nid])
        assert sts[nid]["error"].startswith("reconfiguration to version 2 "), (nid, sts[nid])
    assert "node n2" in sts["n0"]["error"], sts["n0"]
    assert p1.stats()["cuts"] >= 1, p1.stats()
    check_unchanged(cl, before, V1, full, 5)
    assert not check_abort_names(cl, p.stderr, "n1", "n2")

    p1.passthrough()
    commit(cl, V2, "n0", full, 5)


def test_every_reply_cut_is_served_by_a_dp_replica(proxied):
    cl = proxied()
    p1 = cl.proxies["n1"]
    v1 = {"version": 1, "tp": 2, "pp": 1, "dp": 2, "nodes": ["n0", "n1"]}
    v2 = {"version": 2, "tp": 1, "pp": 1, "dp": 2, "nodes": ["n2"]}
    full = start(cl, v1, 43)
    plan = cl.plan(SCHEMA, v1, v2)["per_node"]
    assert plan.get("n1", {}).get("bytes_out", 0) > 0, plan  # the plan reads from n1
    cl.faults = True
    p1.drop(after=20000, match=PART)
    commit(cl, v2, "n0", full, 5)
    assert p1.stats()["cuts"] >= 1, p1.stats()
    # n0 served what the plan gave it and the rows of every cut reply
    assert cl["n0"].status()["last"]["bytes_served"] > plan["n0"]["bytes_out"], plan


def test_delayed_replies_commit(proxied):
    cl = proxied()
    p1 = cl.proxies["n1"]
    full = start(cl, V1, 44)
    p1.delay(0.05)
    down0 = p1.stats()["bytes_down"]
    commit(cl, V2, "n0", full, 5)
    st = p1.stats()
    out = served_by(cl, V1, V2, "n1")
    # every byte n1 served went through the proxy, in chunks of at most 16 KiB, each
    # 50 ms late
    assert st["bytes_down"] - down0 >= out > 0, (st, out)
    assert st["delayed"] >= out // 16384, (st, out)
    assert cl["n1"].status()["last"]["bytes_served"] == out


# ------------------------------------------------------------------ 4. checksums

def test_bit_flipped_in_every_fetch_is_served_by_a_dp_replica(proxied):
    cl = proxied()
    p1 = cl.proxies["n1"]
    v1 = {"version": 1, "tp": 2, "pp": 1, "dp": 2, "nodes": ["n0", "n1"]}
    v2 = {"version": 2, "tp": 1, "pp": 1, "dp": 2, "nodes": ["n2"]}
    full = start(cl, v1, 46)
    plan = cl.plan(SCHEMA, v1, v2)["per_node"]
    assert plan.get("n1", {}).get("bytes_out", 0) > 0, plan  # the plan reads from n1
    cl.faults = True
    p1.flip(at=1000, match=PART)  # every reply longer than 1000 bytes
    commit(cl, v2, "n0", full, 5)  # NumPy-exact: no flipped byte was used
    assert p1.stats()["flips"] >= 1, p1.stats()
    # n0 served what the plan gave it and the rows of every corrupted reply
    assert cl["n0"].status()["last"]["bytes_served"] > plan["n0"]["bytes_out"], plan


def test_bit_flipped_in_every_fetch_aborts_naming_the_partition(proxied):
    cl = proxied()
    p1 = cl.proxies["n1"]
    full = start(cl, V1, 47)
    before = cl.snapshot()
    cl.faults = True
    p1.flip(at=1000, match=PART)
    p = cl.reconfigure("n0", V2)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert cl.wait_settled() == 1
    result = cl.keys()["result/2"].value.decode()
    assert result.startswith("aborted: node n2: failed:"), result
    assert p1.stats()["flips"] >= 1, p1.stats()
    err = cl["n2"].status()["error"]
    # the partition (rank, state, tensor), the node it came from, and why
    assert "partition (rank " in err and "from node n1" in err and \
        "checksum mismatch" in err, err
    check_unchanged(cl, before, V1, full, 5)
    assert not check_abort_names(cl, p.stderr, "n1", "n2")

    p1.passthrough()
    commit(cl, V2, "n0", full, 5)


def backup_entry(cl, holder):
    kv = cl.keys().get(f"nodes/{holder}")
    return json.loads(kv.value).get("backup") if kv else None


def test_bit_flipped_in_a_backup_fetch_is_refused(proxied):
    """n0 backs up n1's saved state, fetched through n1's proxy (&snap=): a flipped bit
    there is caught against the checksum n1 stored with its partition, the backup is not
    taken, and a config that drops a dead n1 is refused; once replies pass, the backup
    is taken, and it serves n1's rows bit-exact."""
    cl = proxied()
    p1 = cl.proxies["n1"]
    a = {"version": 1, "tp": 2, "pp": 2, "dp": 1, "nodes": ["n0", "n1"], "replicas": 1}
    cl.faults = True
    p1.flip(at=1000, match=b"&snap=")
    full = start(cl, a, 48, step=3)
    want = {str(r): 3 for r in cl.hosted(a, "n1")}

    def refused():
        bk = cl["n0"].status().get("cluster", {}).get("backup") or {}
        return bk if "checksum mismatch" in bk.get("error", "") else None
    bk = cl.wait(refused, "n0's backup of n1 refused for its checksum", timeout=30)
    assert bk["of"] == "n1" and bk["steps"] != want, bk
    assert p1.stats()["flips"] >= 1, p1.stats()
    time.sleep(1.5)  # the backup thread tries again: never taken while bits flip
    entry = backup_entry(cl, "n0")
    assert not entry or entry["steps"] != want, entry

    p1.passthrough()
    cl.wait(lambda: (backup_entry(cl, "n0") or {}).get("steps") == want,
            "n0's backup of n1 at step 3", timeout=30)
    cl.kill("n1")
    cl.wait_down("n1")
    b = {"version": 2, "tp": 2, "pp": 2, "dp": 1, "nodes": ["n0", "n2"], "replicas": 1}
    p = cl.reconfigure("n2", b)
    assert p.returncode == 0, f"{p.stderr}\n{cl.describe()}"
    cl.wait_version(2)
    cl.check_layout(SCHEMA, b, full, step=3)


def test_verify_finds_a_flipped_byte(proxied):
    cl = proxied(nnodes=2, behind=(), node_env={"n1": {"MLFS_TEST_HOOKS": "1"}})
    start(cl, V1, 49)
    for nid in ("n0", "n1"):
        p = cl[nid].mlfs("verify", check=False)
        assert p.returncode == 0 and " 0 mismatches" in p.stdout, (p.returncode, p.stdout,
                                                                    p.stderr)
    cl.faults = True
    # without MLFS_TEST_HOOKS=1 there is no such op
    with pytest.raises(OSError):
        cl["n0"].write(".mlfs-ctl", json.dumps({"op": "flip", "rank": 0, "state": "model",
                                                 "tensor": "embedding/weight", "byte": 7}))
    rank = cl.hosted(V1, "n1")[0]
    cl["n1"].write(".mlfs-ctl", json.dumps({"op": "flip", "rank": rank,
                                            "state": "optim/exp_avg",
                                            "tensor": "layers/1/proj/weight", "byte": 12345}))
    p = cl["n1"].mlfs("verify", check=False)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert f"MISMATCH rank {rank} optim/exp_avg/layers/1/proj/weight" in p.stdout, p.stdout
    assert " 1 mismatch\n" in p.stdout, p.stdout
    p = cl["n0"].mlfs("verify", check=False)
    assert p.returncode == 0, p.stdout



def held_attempt(cl, proxy, cfg, on="n0"):
    """Starts the reconfiguration to @cfg on @on with @proxy's partition replies held:
    the attempt exists and stays open, its participants preparing. The process."""
    proxy.stall(match=PART)
    proc = cl.reconfigure(on, cfg, wait=False)
    cl.wait(lambda: any(PART.decode() in r for r in proxy.held_requests()),
            "a fetch held at the proxy", timeout=20)
    assert "attempt" in cl.keys()
    return proc


def test_job_writes_during_an_attempt_are_kept(proxied):
    """job/ written while an attempt is under way (after the coordinator read the
    writers' manifests) survives the commit on its writer, and the next commit brings
    it to every node with its writer's mtime. Before the fix the swap replaced the
    writer's job/ with the staged tree: writes that had succeeded and read back
    vanished from every node."""
    cl = proxied(behind=("n1",))
    full = start(cl, V1, 46)
    n0, n1, n2 = cl["n0"], cl["n1"], cl["n2"]
    n1.write("job/a.txt", "first\n")
    commit(cl, V2, "n0", full, 5)  # job/a.txt on every node
    v3, v4 = dict(V1, version=3), dict(V2, version=4)
    proc = held_attempt(cl, cl.proxies["n1"], v3)  # n0 fetches stage 0 from n1
    n1.write("job/a.txt", "second\n")  # newer than every manifest's copy
    os.mkdir(n1.p("job/new"))
    n1.write("job/new/late.txt", "written during the attempt\n")  # in no manifest
    n0.write("job/co.txt", "the coordinator's, during the attempt\n")
    cl.proxies["n1"].passthrough()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, f"{out}\n{err}\n{cl.describe()}"
    cl.wait_version(3)
    cl.check_layout(SCHEMA, v3, full, step=5)
    assert n1.read("job/a.txt") == b"second\n", cl.describe()
    assert n1.read("job/new/late.txt") == b"written during the attempt\n", cl.describe()
    assert n0.read("job/co.txt") == b"the coordinator's, during the attempt\n"
    assert n2.read("job/a.txt") == b"first\n"  # the union was read before the write
    # the next commit's union takes the writes everywhere, with their writer's mtime
    commit(cl, v4, "n2", full, 5)
    for rel in ("job/a.txt", "job/new/late.txt", "job/co.txt"):
        want = (n1 if rel != "job/co.txt" else n0)
        for n in (n0, n1, n2):
            assert n.read(rel) == want.read(rel), (n.id, rel)
        mtimes = {n.id: os.stat(n.p(rel)).st_mtime_ns for n in (n0, n1, n2)}
        assert len(set(mtimes.values())) == 1, f"{rel}: {mtimes}"



def test_job_file_changed_or_deleted_at_its_source(proxied):
    """A job/ file that the other nodes must fetch from its writer, rewritten there
    during the attempt: the fetch finds another content than the manifest's, the
    source's manifest now names those very bytes, newer, so they are staged with
    their mtime and the config commits with the new content everywhere (before, the
    attempt aborted: a node that keeps writing a job/ file blocked every
    reconfiguration). Deleted there during the attempt: the attempt aborts naming the
    file; the same config then commits, the file gone."""
    cl = proxied(behind=("n1",))
    full = start(cl, V1, 47)
    n1 = cl["n1"]
    commit(cl, V2, "n0", full, 5)
    n1.write("job/b.txt", "one\n")  # on n1 alone: n0 and n2 fetch it
    proc = held_attempt(cl, cl.proxies["n1"], dict(V1, version=3))
    n1.write("job/b.txt", "two, longer\n")
    cl.proxies["n1"].passthrough()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, f"{out}\n{err}\n{cl.describe()}"
    cl.wait_version(3)
    # n0 staged job/ only once its fetch from n1 passed, after the write; n2, which
    # fetches no partition, may have staged it before (it gets it at the next commit)
    mtimes = set()
    for n in (cl["n0"], n1):
        assert n.read("job/b.txt") == b"two, longer\n", n.id
        mtimes.add(os.stat(n.p("job/b.txt")).st_mtime_ns)
    assert len(mtimes) == 1, mtimes
    assert cl["n2"].read("job/b.txt") in (b"one\n", b"two, longer\n")

    n1.write("job/c.txt", "soon gone\n")
    v4 = dict(V2, version=4)
    proc = held_attempt(cl, cl.proxies["n1"], v4)
    os.unlink(n1.p("job/c.txt"))
    cl.proxies["n1"].passthrough()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "job/c.txt" in err, f"{out}\n{err}"
    cl.wait(lambda: all(isinstance(s, dict) and s["state"] in ("idle", "failed") and
                        s["version"] == 3 for s in cl.statuses().values()),
            "every node back at version 3", timeout=20)
    cl.check_layout(SCHEMA, dict(V1, version=3), full, step=5)
    commit(cl, v4, "n0", full, 5)
    for n in cl.nodes:
        assert not os.path.exists(n.p("job/c.txt")), n.id
        assert n.read("job/b.txt") == b"two, longer\n", n.id
        mtimes.add(os.stat(n.p("job/b.txt")).st_mtime_ns)
    assert len(mtimes) == 1, mtimes


def test_job_file_rewritten_against_a_newer_directory_is_kept(proxied):
    """n1's job/x is a file, n2's a newer directory: the union takes the directory.
    n1 rewrites its file while the attempt is held, before it stages: the swap cannot
    merge a file into the union's directory, so n1 keeps its live job/ whole (the
    write kept, a warning logged) instead of dropping the write. Before, a staged
    directory had the staging time as mtime, newer than the write, and the file was
    dropped. Without a write during the attempt the union's directory is taken."""
    cl = proxied(behind=("n0",))
    full = start(cl, V1, 48)
    n1, n2 = cl["n1"], cl["n2"]
    n1.write("job/x", "a file\n")
    n1.write("job/z", "an older file\n")
    time.sleep(0.01)
    os.mkdir(n2.p("job/x"))
    n2.write("job/x/y", "in a directory\n")
    os.mkdir(n2.p("job/z"))  # newer than n1's job/z, which n1 leaves alone
    proc = held_attempt(cl, cl.proxies["n0"], V2)  # n1 fetches stage 0 from n0
    n1.write("job/x", "rewritten during the attempt\n")
    cl.proxies["n0"].passthrough()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, f"{out}\n{err}\n{cl.describe()}"
    cl.wait_version(2)
    assert n1.read("job/x") == b"rewritten during the attempt\n", cl.describe()
    assert "cannot join it" in n1.stderr(), n1.stderr()
    assert n2.read("job/x/y") == b"in a directory\n"
    assert os.path.isdir(n2.p("job/z"))
    # n1 wrote nothing more: the next commit's union (n1's file is now the newest
    # job/x) is taken everywhere, and job/z, n2's newer directory, reaches n1
    commit(cl, dict(V1, version=3), "n0", full, 5)
    for n in cl.nodes:
        assert n.read("job/x") == b"rewritten during the attempt\n", n.id
        assert os.path.isdir(n.p("job/z")), n.id
