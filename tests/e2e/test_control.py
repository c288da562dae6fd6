"""The control plane keeps the atomic promise through freezes, deaths and restarts
(issue 17), on four daemons and one etcd (mlfs.testing), every partition checked against
NumPy slices of the checkpoint:

1. a node frozen through an aborted attempt never commits its stale layout under the
   job's version: it missed the commit, says so ("lost"), and a config that places
   ranks on it is refused;
2. an abort behind a frozen peer cancels every transfer in flight: every node is idle
   again within seconds of the decision, and a config without the frozen node commits;
3. a node that dies between its ready vote and its swap loses nothing: the survivors
   retain the layout the commit was planned from, and the next config is planned from it;
4. a whole-job restart never makes zero-filled partitions the state: every node is
   "lost", configs are refused, and `mlfs reset` (with every daemon stopped) starts the
   job afresh;
5. etcd down after every vote: the nodes stay "prepared", refuse partition writes and
   say in status.json what they wait for, and commit once etcd is back.
"""
import errno
import json
import os
import signal
import subprocess
import time

import numpy as np

from conftest import MLFS
from mlfs import testing
from mlfs.testing import expect_oserror
from test_cluster import full_of, wait_attempt
from test_store import MIXED, make_full, write_full

ALL = ["n0", "n1", "n2", "n3"]


def vote_of(cl, to, nid):
    """Node @nid's vote on version @to as the coordinator n0 has it."""
    return cl.vote("n0", to, nid)


def import_step(cl, nodes, full, step):
    """Imports @full on @nodes as the saved state of @step."""
    ckpt = os.path.join(cl.tmp, f"ckpt-{step}")
    if not os.path.isdir(ckpt):
        write_full(ckpt, full)
    for nid in nodes:
        p = cl[nid].mlfs("import", "--from", ckpt, "--step", str(step), check=False)
        assert p.returncode == 0, f"import on {nid}: {p.stderr}\n{cl.describe()}"


def test_frozen_node_never_commits_a_stale_layout(cluster_factory):
    cl = cluster_factory(nnodes=4, devices=1)
    full = full_of(30)
    v1 = {"version": 1, "tp": 1, "pp": 1, "dp": 4, "nodes": ALL}  # a replica on each node
    cl.start_job(MIXED, v1, "n0", full, step=7)

    # X = version 2 on all four nodes; n1 frozen never votes, so X cannot commit.
    x = {"version": 2, "tp": 2, "pp": 1, "dp": 2, "nodes": ALL}
    cl.freeze("n1")
    proc = cl.reconfigure("n0", x, wait=False, follow=False)
    aid = json.loads(wait_attempt(cl, proc).value)["id"]
    cl.wait(lambda: vote_of(cl, 2, "n3").startswith(aid + " ready"), "n3's ready vote on X",
            timeout=30)
    proc.wait(timeout=30)  # config.json written: it reads nothing of n0 after that
    # n3 is frozen with X prepared; X dies with its frozen coordinator's lease.
    cl.freeze("n3")
    cl.freeze("n0")
    cl.wait(lambda: "attempt" not in cl.keys(), "X gone with n0's lease", timeout=30)
    # n3's lease too: its last keep-alive may have come up to a second after n0's, and a
    # config proposed while it is alive makes it a participant, whose expiry then
    # aborts the attempt (as it must).
    cl.wait(lambda: "nodes/n3" not in cl.keys() and "nodes/n0" not in cl.keys(),
            "n0's and n3's leases expired", timeout=30)
    cl.thaw("n1")
    cl.wait(lambda: "nodes/n1" in cl.keys() and all(
        cl[n].status()["state"] in ("idle", "failed") for n in ("n1", "n2")),
        "n1 and n2 settled", timeout=30)

    # Y = version 2 without n0 and n3 commits; its ranks save step 8.
    y = {"version": 2, "tp": 1, "pp": 1, "dp": 2, "nodes": ["n1", "n2"]}
    p = cl.reconfigure("n2", y)
    assert p.returncode == 0, f"{p.stderr}\n{cl.describe()}"
    cl.wait_version(2, nodes=["n1", "n2"])
    full8 = full_of(31)
    import_step(cl, ["n1", "n2"], full8, 8)

    # n3 and n0 thaw: they missed the commit of Y; n3 never serves X as version 2.
    cl.thaw("n3")
    cl.thaw("n0")
    cl.wait(lambda: all(cl[n].status()["state"] == "lost" for n in ("n0", "n3")),
            "n0 and n3 lost", timeout=30)
    for nid in ("n0", "n3"):
        st = cl[nid].status()
        assert st["version"] == 1, (nid, st)
        assert "missed the commit of version 2" in st["error"], (nid, st)
    # A config that places ranks on n3 is refused, naming it; the job is Y at step 8.
    z = {"version": 3, "tp": 1, "pp": 1, "dp": 3, "nodes": ["n1", "n2", "n3"]}
    p = cl.reconfigure("n1", z)
    assert p.returncode != 0 and "n3" in p.stderr, (p.returncode, p.stderr)
    cl.check_layout(MIXED, y, full8, step=8, nodes=["n1", "n2"])
    # ... and one without them goes on from Y, bit-exact.
    w = {"version": 3, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n1", "n2"]}
    p = cl.reconfigure("n1", w)
    assert p.returncode == 0, f"{p.stderr}\n{cl.describe()}"
    cl.wait_version(3, nodes=["n1", "n2"])
    cl.check_layout(MIXED, w, full8, step=8, nodes=["n1", "n2"])


def test_abort_behind_a_frozen_peer_is_quick(cluster_factory):
    cl = cluster_factory(nnodes=4, devices=2)
    full = full_of(32)
    v1 = {"version": 1, "tp": 2, "pp": 1, "dp": 2, "nodes": ["n0", "n1"]}
    cl.start_job(MIXED, v1, "n0", full, step=5)
    before = cl.snapshot(["n0", "n2", "n3"])

    # Everything moves to n2 and n3, fetched from n0 and n1; n1 is frozen.
    v2 = {"version": 2, "tp": 2, "pp": 1, "dp": 2, "nodes": ["n2", "n3"]}
    cl.freeze("n1")
    proc = cl.reconfigure("n0", v2, wait=False)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "n1" in err, (proc.returncode, out, err)
    decided = time.monotonic()
    cl.wait(lambda: all(s["state"] in ("idle", "failed")
                        for s in cl.statuses(["n0", "n2", "n3"]).values()),
            "every live node idle after the abort", timeout=30)
    idle_after = time.monotonic() - decided
    assert idle_after < 3, f"{idle_after:.1f} s from the abort to idle\n{cl.describe()}"
    assert cl.snapshot(["n0", "n2", "n3"]) == before
    # A config without n1 commits, served from n0's replica.
    v3 = {"version": 2, "tp": 1, "pp": 1, "dp": 2, "nodes": ["n2", "n3"]}
    p = cl.reconfigure("n2", v3)
    assert p.returncode == 0, f"{p.stderr}\n{cl.describe()}"
    cl.wait_version(2, nodes=["n0", "n2", "n3"])
    cl.check_layout(MIXED, v3, full, step=5, nodes=["n2", "n3"])
    cl.thaw("n1")


def reset(cl):
    return subprocess.run([str(MLFS), "reset", "--cluster", cl.cluster_path],
                          capture_output=True, text=True, timeout=60)


def retained(cl, nid):
    """The layout version node @nid retains, as its peer server's /v1/health says."""
    status, body = cl[nid].get("/v1/health")
    assert status == 200, (nid, status, body)
    return json.loads(body)["retained"]


def test_death_between_vote_and_swap_loses_nothing(cluster_factory):
    """3. Version 2 moves everything onto n3 alone; n3 votes ready and dies before it swaps
    (a failpoint stalls its control thread at the commit while its lease stays alive, then
    kill -9). The commit goes ahead, but every survivor retains version 1 until every node
    of the commit swapped, so a config without n3 is planned from version 1 and commits
    bit-exact; once every node of that commit swapped, the retained layout is let go."""
    cl = cluster_factory(nnodes=4, devices=1,
                         node_env={"n3": {"MLFS_FAILPOINT": "stall-before-swap"}})
    full = full_of(34)
    v1 = {"version": 1, "tp": 1, "pp": 1, "dp": 2, "nodes": ["n0", "n1"]}
    cl.start_job(MIXED, v1, "n0", full, step=6)

    v2 = {"version": 2, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n3"]}
    proc = cl.reconfigure("n0", v2, wait=False)
    proc.communicate(timeout=60)
    cl.wait(lambda: (cl.committed() or {}).get("version") == 2, "version 2 committed")
    cl.wait_version(2, nodes=["n0", "n1", "n2"])
    assert cl["n3"].status()["version"] == 1  # stalled before its swap
    for nid in ("n0", "n1", "n2"):  # version 1 retained: n3 never showed its swap
        cl.wait(lambda nid=nid: retained(cl, nid) == 1, f"{nid} retains version 1")
    cl.kill("n3")
    cl.wait_down("n3")

    # Version 2's only holder is gone; the survivors' version 1 has all of it.
    v3 = {"version": 3, "tp": 1, "pp": 1, "dp": 2, "nodes": ["n0", "n1"]}
    p = cl.reconfigure("n1", v3)
    assert p.returncode == 0, f"{p.stderr}\n{cl.describe()}"
    cl.wait_version(3, nodes=["n0", "n1", "n2"])
    cl.check_layout(MIXED, v3, full, step=6, nodes=["n0", "n1"])
    for nid in ("n0", "n1", "n2"):
        st = cl[nid].status()
        assert st["state"] == "idle" and st["error"] is None, (nid, st)
    # Every node of version 3's commit swapped: the retained layout goes.
    for nid in ("n0", "n1", "n2"):
        cl.wait(lambda nid=nid: retained(cl, nid) == 0,
                f"{nid} released its retained layout")


def test_swaps_acked_to_the_coordinator_carry_the_entries(cluster_factory):
    """After the commit each participant acks its swap to the coordinator (POST /v1/vote,
    "swapped"), whose rounds count the acks as they count the entries: it announces the
    release ("released") on them, and `mlfs reconfigure` (polling its status.json)
    returns on them. Each ack carries the node's new entry, and the announcement puts
    them all with it in one transaction: every entry at the new version has the
    announcement's revision, which names every node (before, each node put its own
    after the announcement: N puts, N raft entries). The retained layouts go, each
    node's at its next round after the announcement (within a second; the
    announcement itself wakes none), none reading the entries itself (no 2 s
    fallback), and a config written at once commits."""
    cl = cluster_factory(nnodes=4, devices=1)
    full = full_of(35)
    v1 = {"version": 1, "tp": 1, "pp": 1, "dp": 4, "nodes": ["n0", "n1", "n2", "n3"]}
    cl.start_job(MIXED, v1, "n0", full, step=6)

    v2 = {"version": 2, "tp": 1, "pp": 1, "dp": 2, "nodes": ["n1", "n2"]}
    p = cl.reconfigure("n0", v2)
    assert p.returncode == 0, f"{p.stderr}\n{cl.describe()}"
    done, ranges = time.monotonic(), cl.etcd.calls("Range")
    for nid in cl.ids:  # (/v1/health: the peer server's, no etcd request)
        cl.wait(lambda nid=nid: retained(cl, nid) == 0, f"{nid} released version 1")
        assert "cannot reach the coordinator" not in cl[nid].stderr(), cl[nid].stderr()
    print(f"every retained layout released {time.monotonic() - done:.2f} s after the command")
    assert cl.etcd.calls("Range") == ranges, "a node read the entries to release"
    # the command's table: every node at version 2 when it returned
    rows = {ln.split()[0]: ln.split() for ln in p.stdout.splitlines()
            if ln.startswith("  n") and ln.split()[0] != "node"}
    assert sorted(rows) == ["n0", "n1", "n2", "n3"], p.stdout
    assert all(r[1] == "up" and r[2] == "2" for r in rows.values()), p.stdout

    def entries():
        return {nid: cl.etcd.kv(f"/mlfs-nodes/{cl.job}/{nid}") for nid in cl.ids}
    cl.wait(lambda: json.loads(cl.keys()["released"].value)["version"] == 2,
            "the release of version 2 announced", timeout=10)
    rel = cl.keys()["released"]
    assert sorted(json.loads(rel.value)["entries"]) == cl.ids, rel.value
    got = entries()
    for nid, e in got.items():
        assert json.loads(e.value)["version"] == 2 and json.loads(e.value)["state"] == "idle", \
            (nid, e.value)
        assert e.mod_revision == rel.mod_revision, (nid, e.mod_revision, rel.mod_revision)
        assert e.lease, (nid, "the entry is bound to no lease")
    # No node put its entry again after the announcement: it took the one its ack
    # carried as its own.
    time.sleep(0.5)
    assert {nid: e.mod_revision for nid, e in entries().items()} == \
        {nid: rel.mod_revision for nid in cl.ids}

    # Back to back, on another node each time: a config written as the command
    # returns commits.
    v3 = {"version": 3, "tp": 1, "pp": 1, "dp": 4, "nodes": ["n0", "n1", "n2", "n3"]}
    v4 = {"version": 4, "tp": 1, "pp": 1, "dp": 2, "nodes": ["n2", "n3"]}
    for nid, v in (("n1", v3), ("n3", v4)):
        p = cl.reconfigure(nid, v)
        assert p.returncode == 0, f"{p.stderr}\n{cl.describe()}"
    cl.wait_version(4)
    cl.check_layout(MIXED, v4, full, step=6)


def test_entry_put_after_the_ack_is_not_overwritten(cluster_factory):
    """A node that puts its own entry after its swap ack took it (a failpoint does what
    a step saved then does) is never overwritten by the older entry its ack carries:
    either the announcement's comparison fails and it goes alone, or the coordinator,
    which follows the entries, saw that put show the swap before the ack came, and the
    announcement names the others only. Its entry in etcd is its own last put, at
    version 2, and so is every other's."""
    cl = cluster_factory(nnodes=3, devices=1,
                         node_env={"n2": {"MLFS_FAILPOINT": "put-entry-after-ack"}})
    full = full_of(36)
    v1 = {"version": 1, "tp": 1, "pp": 1, "dp": 3, "nodes": ["n0", "n1", "n2"]}
    cl.start_job(MIXED, v1, "n0", full, step=4)
    v2 = {"version": 2, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n1"]}
    p = cl.reconfigure("n0", v2)
    assert p.returncode == 0, f"{p.stderr}\n{cl.describe()}"

    def released():
        r = cl.keys().get("released")
        v = json.loads(r.value) if r else 0
        return r, (v if isinstance(v, dict) else {"version": v, "entries": []})
    cl.wait(lambda: released()[1]["version"] == 2, "version 2's release announced", timeout=10)
    cl.wait(lambda: all(json.loads(cl.etcd.kv(f"/mlfs-nodes/{cl.job}/{nid}").value)["version"]
                        == 2 for nid in cl.ids), "every entry at version 2", timeout=10)
    rel, value = released()
    assert "n2" not in value["entries"], rel
    n2 = cl.etcd.kv(f"/mlfs-nodes/{cl.job}/n2")
    assert n2.mod_revision != rel.mod_revision, (n2, rel)  # its own put, not the ack's
    assert "failpoint put-entry-after-ack" in cl["n2"].stderr()
    if not value["entries"]:
        assert "the release announced alone" in cl["n0"].stderr(), cl["n0"].stderr()
    time.sleep(0.5)  # and no put of the older one after
    assert cl.etcd.kv(f"/mlfs-nodes/{cl.job}/n2").mod_revision == n2.mod_revision
    cl.check_layout(MIXED, v2, full, step=4)


def test_whole_job_restart_is_lost_until_reset(cluster_factory):
    cl = cluster_factory(nnodes=2, devices=2)
    full = full_of(33)
    v1 = {"version": 1, "tp": 2, "pp": 1, "dp": 2, "nodes": ["n0", "n1"]}
    cl.start_job(MIXED, v1, "n0", full, step=8)

    # Every daemon killed and restarted, etcd kept: zeros are not the job's state.
    for nid in ("n0", "n1"):
        cl.kill(nid)
    for nid in ("n0", "n1"):
        cl.restart(nid)
    cl.wait(lambda: all(s["state"] == "lost" for s in cl.statuses().values()),
            "every restarted node lost", timeout=30)
    for nid, st in cl.statuses().items():
        assert st["version"] == 1, (nid, st)
        assert "started without the job's state" in st["error"], (nid, st)
    v2 = {"version": 2, "tp": 1, "pp": 1, "dp": 4, "nodes": ["n0", "n1"]}
    p = cl.reconfigure("n0", v2)
    assert p.returncode != 0 and "lost" in p.stderr, (p.returncode, p.stderr)
    assert all(s["version"] == 1 for s in cl.statuses().values())

    # mlfs reset refuses while a node of the job is up ...
    r = reset(cl)
    assert r.returncode != 0 and "n0" in r.stderr and "up" in r.stderr, (r.returncode, r.stderr)
    assert "config" in cl.keys()
    # ... and, with every daemon stopped, starts the job afresh: no config, no saved
    # state; the schema and cluster stay.
    for nid in ("n0", "n1"):
        cl.kill(nid)
    for nid in ("n0", "n1"):
        cl.wait_down(nid)
    r = reset(cl)
    assert r.returncode == 0, r.stderr
    keys = cl.keys()
    assert "config" not in keys and "schema" in keys and "cluster" in keys, sorted(keys)
    assert not any(k.startswith(("saved/", "attempt")) for k in keys), sorted(keys)
    for nid in ("n0", "n1"):
        cl.restart(nid)
    cl.wait(lambda: all(s["state"] == "idle" and not s.get("version")
                        for s in cl.statuses().values()), "a fresh job", timeout=30)
    cl["n0"].write("config.json", json.dumps(v1))
    cl.wait_version(1)
    import_step(cl, ["n0", "n1"], full, 8)
    cl.check_layout(MIXED, v1, full, step=8)
    p = cl.reconfigure("n1", v2)
    assert p.returncode == 0, f"{p.stderr}\n{cl.describe()}"
    cl.wait_version(2)
    cl.check_layout(MIXED, v2, full, step=8)


# 64 MiB of float32 a replica: fetching one takes long enough to freeze its fetcher
# before it votes (a tiny model's attempt ends within the harness's polling).
BIG = {"model": "big", "num_layers": 2, "states": {"model": {}},
       "tensors": [{"name": "layers/{L}/w", "dtype": "float32", "shape": [4096, 2048],
                    "split": {"dim": 0}}]}


def test_etcd_down_after_every_vote_waits_for_the_decision(cluster_factory):
    # n0, the coordinator, hosts no rank; n3 none of v1's (no one fetches from it).
    cl = cluster_factory(nnodes=4, devices=2)
    full = make_full(BIG, np.random.default_rng(34))
    v1 = {"version": 1, "tp": 2, "pp": 1, "dp": 2, "nodes": ["n1", "n2"]}
    cl.start_job(BIG, v1, "n1", full, step=5)
    v2 = {"version": 2, "tp": 2, "pp": 1, "dp": 3, "nodes": ["n1", "n2", "n3"]}

    proc = cl.reconfigure("n0", v2, wait=False, follow=False)
    aid = json.loads(wait_attempt(cl, proc).value)["id"]
    cl.freeze("n3")  # fetching its replica: it votes last
    assert not vote_of(cl, 2, "n3"), cl.describe()
    cl.wait(lambda: all(vote_of(cl, 2, n).startswith(aid + " ready") for n in ALL[:3]),
            "n0-n2 voted ready", timeout=30)
    proc.wait(timeout=30)  # config.json written: it reads nothing of n0 after that
    # etcd stops answering before the last vote reaches the coordinator, which sends
    # etcd its commit then: the transaction waits in etcd's socket unread ...
    os.kill(cl.etcd.proc.pid, signal.SIGSTOP)
    cl.thaw("n3")
    cl.wait(lambda: vote_of(cl, 2, "n3").startswith(aid + " ready"), "n3's vote", timeout=30)
    cl.kill_etcd()  # ... and is never applied
    time.sleep(2)
    sts = cl.statuses()
    for nid, st in sts.items():
        assert st["version"] == 1 and st["state"] == "prepared", (nid, st)
        assert "etcd's decision on version 2" in st.get("waiting", ""), (nid, st)
        assert "etcd unreachable" in st["waiting"], (nid, st)
    expect_oserror(errno.EBUSY, cl["n1"].write, "ranks/0/step", "6\n")
    # etcd back: the commit point was its; every node commits.
    cl.etcd.restart()
    cl.wait_version(2, timeout=60)
    cl.check_layout(BIG, v2, full, step=5)
    assert all("waiting" not in s for s in cl.statuses().values())


def test_a_prepared_node_unmounted_exits_cleanly_and_the_attempt_aborts(cluster_factory):
    """A node unmounted between its ready vote and the decision discards what it
    prepared and exits 0: before, its unmount stopped the control plane first and the
    abort of the prepared attempt then woke the freed control plane (a use after free
    that ASan reported at the teardown of a test whose attempt was still in progress).
    Its lease goes with it, so the attempt aborts on every other node; the old layout
    stays current."""
    cl = cluster_factory(nnodes=4, devices=2)
    full = make_full(BIG, np.random.default_rng(35))
    v1 = {"version": 1, "tp": 2, "pp": 1, "dp": 2, "nodes": ["n1", "n2"]}
    cl.start_job(BIG, v1, "n1", full, step=5)
    before = cl.snapshot(["n0", "n2", "n3"])
    v2 = {"version": 2, "tp": 2, "pp": 1, "dp": 3, "nodes": ["n1", "n2", "n3"]}

    proc = cl.reconfigure("n0", v2, wait=False)
    aid = json.loads(wait_attempt(cl, proc).value)["id"]
    cl.freeze("n3")  # fetching its replica: no decision until it votes
    cl.wait(lambda: vote_of(cl, 2, "n1").startswith(aid + " ready"), "n1 voted ready",
            timeout=30)
    assert cl.status("n1")["state"] == "prepared", cl.describe()
    cl["n1"].umount()  # exits 0, nothing logged as an error
    cl.thaw("n3")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "n1" in err, (proc.returncode, out, err)
    cl.wait_version(1, nodes=["n0", "n2", "n3"], state="failed")  # the abort said
    assert cl.snapshot(["n0", "n2", "n3"]) == before
    cl.check_layout(BIG, v1, full, step=5, nodes=["n2"])


def test_the_job_goes_on_when_an_etcd_member_dies_or_freezes(tmp_path):
    """etcd as in production, three members, every one listed in cluster.json. The member
    every node calls first is killed, then (back again) a member they moved to is frozen
    (SIGSTOP: its port takes connections and answers nothing). Each time the nodes go on
    through the others: a reconfiguration commits bit-exact, and no node's lease ever
    expired (every entry keeps the lease it had), so no node was taken for down. Before,
    cluster.json took one URL, and the nodes lost the control plane with that member."""
    et = testing.EtcdCluster(tmp_path, 3).start()
    cl = testing.Cluster(tmp_path, et, 3, 2, "j", mlfs=MLFS)
    try:
        cl.mount_all()
        full = full_of(41)
        v1 = {"version": 1, "tp": 2, "pp": 1, "dp": 2, "nodes": ["n0", "n1"]}
        cl.start_job(MIXED, v1, "n0", full, step=4)
        leases = {nid: cl.keys()[f"nodes/{nid}"].lease for nid in ("n0", "n1", "n2")}
        assert all(leases.values()), leases

        et.members[0].kill()
        v2 = {"version": 2, "tp": 2, "pp": 1, "dp": 3, "nodes": ["n0", "n1", "n2"]}
        p = cl.reconfigure("n2", v2)
        assert p.returncode == 0, f"{p.stderr}\n{cl.describe()}"
        cl.wait_version(2, timeout=20)
        cl.check_layout(MIXED, v2, full, step=4)
        time.sleep(7)  # past a lease's TTL (6 s): kept alive through the others
        keys = cl.keys()
        assert {nid: keys[f"nodes/{nid}"].lease for nid in leases} == leases, cl.describe()
        on = {nid: st["cluster"]["etcd_member"] for nid, st in cl.statuses().items()}
        assert et.members[0].url not in on.values(), on  # moved on, and stayed

        et.members[0].start()  # back: a quorum again without the next one
        frozen = [m.url for m in et.members].index(on["n0"])
        et.freeze(frozen)  # the member n0 (at least) moved to
        try:
            time.sleep(7)  # a lease's TTL with the member frozen
            v3 = {"version": 3, "tp": 1, "pp": 2, "dp": 1, "nodes": ["n1", "n2"]}
            p = cl.reconfigure("n0", v3)
            assert p.returncode == 0, f"{p.stderr}\n{cl.describe()}"
            sts = cl.wait_version(3, timeout=30)
            cl.check_layout(MIXED, v3, full, step=4)
            keys = cl.keys()
            assert {nid: keys[f"nodes/{nid}"].lease for nid in leases} == leases, \
                cl.describe()
            for nid, st in sts.items():
                assert st["error"] is None and st["cluster"]["etcd"] == "ok", (nid, st)
                assert all(n["up"] for n in st["cluster"]["nodes"]), (nid, st)
                assert st["cluster"]["etcd_member"] != on["n0"], (nid, st)
        finally:
            et.thaw(frozen)
    finally:
        try:
            cl.teardown()
        finally:
            et.stop()
