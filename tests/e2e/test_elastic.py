"""The elastic controller (issue 20, item 2): with "elastic" in the config, one daemon of
the job (etcd's "controller" key, bound to its lease) chooses a new layout when a node
dies or joins, and proposes it like any config write; every partition is then checked
against NumPy slices of the checkpoint.

Contract asserted here: status.json has "elastic": {"controller": id, "this_node":
bool, "decision": text, "proposed": version or null, "why": the decision that proposed
it, "error": text or null} on every
node of an elastic job; the controller key's lease is its node's.
"""
import json

import numpy as np

from test_store import MIXED, make_full

ALL = ["n0", "n1", "n2", "n3"]


def elastic(version, tp, pp, dp, nodes, lo=2, hi=4):
    return {"version": version, "tp": tp, "pp": pp, "dp": dp, "nodes": nodes,
            "elastic": {"min_nodes": lo, "max_nodes": hi, "policy": "auto"}}


def controller(cl):
    kv = cl.keys().get("controller")
    if kv is None:  # none now: between the old controller's lease and the next election
        return None
    return kv.value.decode() if isinstance(kv.value, bytes) else kv.value


def wait_committed(cl, version, timeout=60):
    return cl.wait(lambda: (c := cl.committed()) and c["version"] >= version and c,
                   f"version {version} committed", timeout)


def test_controller_replaces_a_dead_node_and_grows_back(cluster_factory):
    """Four nodes of two devices at tp 2 pp 1 dp 4 (every stage on every node: each
    node's partitions have three DP replicas). The elected controller's node stays; one
    other node is killed with kill -9: once its lease expires the controller proposes a
    layout of the three survivors by itself, served from the replicas, bit-exact at the
    saved step. The killed node restarts (empty): the job grows back onto it."""
    cl = cluster_factory()
    full = make_full(MIXED, np.random.default_rng(20))
    v1 = elastic(1, 2, 1, 4, ALL)
    cl.start_job(MIXED, v1, "n0", full, step=6)

    # One controller, elected by etcd, its key bound to its node's lease.
    boss = cl.wait(lambda: controller(cl), "a controller elected")
    assert boss in ALL, boss
    assert cl.keys()["controller"].lease == cl.keys()[f"nodes/{boss}"].lease
    st = cl[boss].status()["elastic"]
    assert st["controller"] == boss and st["this_node"] is True, st
    other = next(n for n in ALL if n != boss)
    assert cl[other].status()["elastic"]["this_node"] is False
    assert cl.committed()["version"] == 1  # nothing changed: nothing proposed

    # kill -9 of a node that is not the controller: its lease expires, the controller
    # proposes the survivors.
    victim = next(n for n in reversed(ALL) if n != boss)
    cl.kill(victim)
    v2 = wait_committed(cl, 2)
    survivors = [n for n in ALL if n != victim]
    assert v2["nodes"] == survivors, v2
    assert v2["tp"] * v2["pp"] * v2["dp"] == 2 * len(survivors), v2
    assert v2["elastic"] == v1["elastic"], v2
    cl.wait_version(2, nodes=survivors)
    cl.check_layout(MIXED, v2, full, step=6, nodes=survivors)
    st = cl[boss].status()["elastic"]
    assert st["proposed"] == 2 and st["error"] is None, st
    assert f"node {victim} of version 1 is down or lost" in st["why"], st
    assert "version 2 on " + ",".join(survivors) in st["why"], st

    # It restarts without its memory: it joins the job again, which grows onto it.
    cl.restart(victim)
    v3 = wait_committed(cl, 3, timeout=90)
    assert sorted(v3["nodes"]) == sorted(ALL), v3
    assert v3["nodes"][:3] == survivors, v3  # the config's nodes first, in their order
    cl.wait_version(3)
    cl.check_layout(MIXED, v3, full, step=6)
    assert f"node {victim} joined" in cl[controller(cl)].status()["elastic"]["why"]


def test_controller_dies_and_another_takes_over_never_below_min(cluster_factory):
    """The controller's own node is killed: its key goes with its lease, another node
    takes it and lays the job out on the survivors. Then two more die: one node is
    below min_nodes 2, and the controller proposes nothing, saying why."""
    cl = cluster_factory()
    full = make_full(MIXED, np.random.default_rng(21))
    v1 = elastic(1, 2, 1, 4, ALL, lo=2, hi=4)
    cl.start_job(MIXED, v1, "n0", full, step=2)
    boss = cl.wait(lambda: controller(cl), "a controller elected")
    cl.kill(boss)
    new = cl.wait(lambda: (c := controller(cl)) and c != boss and c, "a new controller",
                  timeout=30)
    v2 = wait_committed(cl, 2)
    survivors = [n for n in ALL if n != boss]
    assert v2["nodes"] == survivors, v2
    cl.wait_version(2, nodes=survivors)
    cl.check_layout(MIXED, v2, full, step=2, nodes=survivors)
    st = cl[new].status()["elastic"]
    assert st["this_node"] and st["proposed"] == 2, st

    # Two more die: one node left, below min_nodes 2: nothing is proposed.
    for victim in [n for n in survivors if n != new]:
        cl.kill(victim)
    cl.wait(lambda: "fewer than min_nodes 2" in cl[new].status()["elastic"]["decision"],
            "the controller waiting for nodes", timeout=30)
    assert cl.committed()["version"] == 2
    assert cl[new].status()["elastic"]["proposed"] == 2


def test_drain_moves_the_job_off_a_live_node(cluster_factory):
    """`mlfs drain <mnt> NODE`: tp 2 pp 2 on n0 and n1, no DP replica, no backup; n1 is
    marked for draining: the controller lays the job out without it, its stage fetched
    from n1 itself (up, so nothing is lost), bit-exact. A node that is not the job's is
    refused, naming it; --undo removes the mark."""
    cl = cluster_factory()
    full = make_full(MIXED, np.random.default_rng(22))
    v1 = elastic(1, 2, 2, 1, ["n0", "n1"], lo=1, hi=2)
    cl.start_job(MIXED, v1, "n0", full, step=4)
    cl.wait(lambda: controller(cl), "a controller elected")

    p = cl["n2"].mlfs("drain", "n9", check=False)
    assert p.returncode == 1 and 'no node "n9"' in p.stderr, p.stderr
    assert "drain/n9" not in cl.keys()

    p = cl["n2"].mlfs("drain", "n1")
    assert "n1: marked for draining" in p.stdout, p.stdout
    assert "drain/n1" in cl.keys()
    v2 = wait_committed(cl, 2)
    assert v2["nodes"] == ["n0", "n2"], v2  # the config's usable node, then the first other
    cl.wait_version(2, nodes=["n0", "n1", "n2", "n3"])
    cl.check_layout(MIXED, v2, full, step=4, nodes=["n0", "n2"])
    st = cl[controller(cl)].status()["elastic"]
    assert "node n1 of version 1 is draining" in st["why"], st

    cl["n2"].mlfs("drain", "n1", "--undo")
    assert "drain/n1" not in cl.keys()


def test_a_persons_config_replaces_the_controllers_attempt(cluster_factory):
    """Every node ignores the controller's attempts (MLFS_FAILPOINT=
    ignore-controller-attempts), so the controller's attempt after a death stays open; a person's config written
    meanwhile replaces it (the attempt said "by": "controller") and commits, and the
    controller leaves it standing."""
    fp = {f"n{i}": {"MLFS_FAILPOINT": "ignore-controller-attempts"} for i in range(4)}
    cl = cluster_factory(node_env=fp)
    full = make_full(MIXED, np.random.default_rng(23))
    cl.start_job(MIXED, elastic(1, 2, 1, 4, ALL), "n0", full, step=1)
    boss = cl.wait(lambda: controller(cl), "a controller elected")
    victim = next(n for n in reversed(ALL) if n != boss)
    cl.kill(victim)
    att = cl.wait(lambda: (kv := cl.keys().get("attempt")) and json.loads(kv.value),
                  "the controller's attempt", timeout=30)
    assert att["by"] == "controller" and att["coordinator"] == boss, att
    survivors = [n for n in ALL if n != victim]
    mine = {"version": 2, "tp": 1, "pp": 1, "dp": 6, "nodes": survivors}
    person = next(n for n in survivors if n != boss)
    try:
        cl[person].write("config.json", json.dumps(mine))
    except OSError as e:
        raise AssertionError(f"{e!r}: {cl[person].status()['error']}\n{cl.describe()}")
    assert wait_committed(cl, 2) == mine
    cl.wait_version(2, nodes=survivors)
    cl.check_layout(MIXED, mine, full, step=1, nodes=survivors)
    assert "replaces the controller's attempt" in cl[person].stderr()
    # Not elastic any more (the person's config has no "elastic"): nothing follows.
    cl.wait(lambda: cl[boss].status().get("elastic", {}).get("decision")
            == "the committed config is not elastic", "the controller standing down")
    assert cl.committed() == mine
