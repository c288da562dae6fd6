"""32 daemons and one etcd (issue 17, item 6): an idle job costs etcd only the lease
keep-alives (one request per node every 2 s) and almost no CPU, and a
reconfiguration of a tiny model across all of them commits. The figures at 4, 16,
32 and 64 daemons are tests/bench/bench_control.py's (BENCHMARKS.md). The control
plane alone, simulated (tests/bench/sim_control.c), at 64 nodes: its figures at 1,000
and 10,000 are tests/bench/bench_sim.py's."""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))
from bench_control import cpu_seconds  # noqa: E402

# Issue 17's goal (0.05 of a core at 32 idle daemons) is the plain build's; under
# AddressSanitizer (make test's second pass, BUILD=build/asan) every keep-alive's
# allocations cost 2-3x the CPU, so that pass holds it to twice the goal (it measured
# 0.057 once in a full run, 0.02-0.03 alone).
SANITIZED = os.path.basename(os.environ.get("BUILD", "build")) == "asan"
IDLE_CORES = 0.10 if SANITIZED else 0.05

TINY = {"model": "tiny", "num_layers": 2, "states": {"model": {}},
        "tensors": [{"name": "layers/{L}/w", "dtype": "float32", "shape": [64, 64],
                     "split": {"dim": 0}}]}


def test_32_idle_daemons_cost_only_keepalives(cluster_factory):
    n = 32
    cl = cluster_factory(nnodes=n, devices=1)
    ids = [x.id for x in cl.nodes]
    v1 = {"version": 1, "tp": 1, "pp": 1, "dp": n, "nodes": ids}
    cl.start_job(TINY, v1, "n0")
    time.sleep(2)  # the last entries published
    pids = [x.pid for x in cl.nodes] + [cl.etcd.proc.pid]
    r0, c0, t0 = cl.etcd.calls(), cpu_seconds(pids), time.monotonic()
    time.sleep(10)
    r1, c1, dt = cl.etcd.calls(), cpu_seconds(pids), time.monotonic() - t0
    per_s, cores = (r1 - r0) / dt, (c1 - c0) / dt
    print(f"{n} idle daemons and etcd: {cores:.4f} cores, {per_s:.1f} etcd requests/s")
    # One keep-alive per node every 2 s (each answered as one request), and
    # nothing else: no polling.
    assert per_s <= 0.9 * n, f"{per_s:.1f} etcd requests/s from {n} idle nodes"
    assert cores < IDLE_CORES, f"{cores:.4f} cores for {n} idle daemons and etcd"

    v2 = {"version": 2, "tp": 1, "pp": 1, "dp": n // 2, "nodes": ids[:n // 2]}
    t = time.monotonic()
    p = cl.reconfigure("n0", v2)
    took = time.monotonic() - t
    assert p.returncode == 0, f"{p.stderr}\n{cl.describe()}"
    cl.wait_version(2)
    print(f"reconfiguration across {n} daemons: {took:.3f} s")
    assert all(s["version"] == 2 for s in cl.statuses().values())
    assert json.loads(cl.keys()["config"].value) == v2


def test_simulated_control_plane_of_64_nodes(etcd):
    """tests/bench/sim_control.c, the control plane alone (per node the real decision
    function, etcd client and watch; no FUSE, no data), 64 simulated nodes against a
    real etcd: an idle job costs only the keep-alives, and one reconfiguration touching
    every node commits, every node swaps and lets its retained layout go, for exactly
    the etcd requests the daemon's rules make (sim_control.c's DESIGN block: 7,
    and 6 watch events per node's watch), every vote and swap ack sent over HTTP to
    the coordinator's peer server, none through etcd.
    bench_sim.py runs it at 1,000 and 10,000 nodes (BENCHMARKS.md)."""
    n = 64
    sim = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), os.environ.get("BUILD", "build"), "tests", "sim_control")
    p = subprocess.run([sim, "--etcd", etcd.url, "--nodes", str(n), "--idle-seconds", "2",
                        "--etcd-pid", str(etcd.proc.pid), "--timeout", "60"],
                       capture_output=True, text=True, timeout=180)
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    assert p.returncode == 0 and lines, f"sim_control exited {p.returncode}: {p.stderr[-3000:]}"
    r = json.loads(lines[-1])
    idle, rec = r["idle"], r["reconfigure"]
    print(f"{n} simulated nodes: idle {idle['requests_per_s']:.1f} etcd requests/s; "
          f"reconfiguration {rec['requests_without_keepalives']} requests, "
          f"{rec['create_to_commit_s']:.3f} s to the commit, "
          f"{rec['commit_to_last_swap_s']:.3f} s to the last swap, "
          f"{rec['commit_to_last_release_s']:.3f} s to the last release")
    assert r["one_watch_per_node"] and r["watch_streams"] == n, r
    # Idle: the keep-alives and nothing else, one per node every keepalive_ms (the
    # daemon's schedule: 2 s, a third of the 6 s TTL); no watch event, no round.
    assert r["daemon_schedule"] and r["keepalive_ms"] == 2000 and r["lease_ttl_s"] == 6, r
    per_node = 1000 / r["keepalive_ms"]
    assert idle["requests"] == idle["requests_by_kind"]["keepalive"], idle
    assert 0.7 * n * per_node <= idle["requests_per_s"] <= 1.05 * n * per_node, idle
    assert idle["leases_expired"] == 0 and idle["watch_events"] == 0, idle
    assert idle["rounds"] == 0, idle
    # The reconfiguration: committed; every node swapped to version 2, its entry says
    # so, and it let its retained layout go; every lease alive.
    assert rec["committed"] and rec["votes"] == n and rec["discards"] == 0, rec
    assert rec["swapped"] == rec["swaps_published"] == rec["released"] == n, rec
    assert rec["leases_expired"] == 0, rec
    # The votes and the swap acks: each participant's vote and ack reached the
    # coordinator's box once each, n0's own directly, the n - 1 others' by a POST to
    # its peer server (none failed, none refused).
    assert rec["votes_received"] == 2 * n and rec["votes_http_failed"] == 0, rec
    assert rec["acks"] == n and rec["acks_failed"] == 0, rec
    assert rec["peer_server_requests"] == 2 * (n - 1) and rec["peer_server_refused"] == 0, rec
    # The daemon's etcd requests (sim_control.c's DESIGN block: 7): no put. Each swap
    # ack carries the node's new entry to the coordinator, and its announcement
    # ("released") puts them all in one transaction (each node's vote and swap ack are
    # no etcd request; no passing state). The coordinator reads the job and the nodes'
    # entries (two ranges), follows the entries (a watch and a range, from its proposal
    # until it announces the swaps), and creates, commits and announces (three
    # transactions). No node but the coordinator reads an entry (no 2 s fallback), no
    # polling, no registration.
    kinds = rec["requests_by_kind"]
    assert kinds["put"] == 0, kinds
    assert (kinds["range"], kinds["txn"], kinds["grant"], kinds["watch"]) == (3, 3, 0, 1), kinds
    assert rec["requests_without_keepalives"] == 7, rec
    assert rec["announced"] == 1, rec
    assert rec["entries_follows"] == 1 and rec["entries_follows_fallback"] == 0, rec
    # etcd's own count of the requests it started agrees (a keep-alive in flight at
    # either end of the window aside).
    assert abs(rec["etcd_grpc_started"] - rec["requests"]) <= 5, rec
    # Every node's own watch got every change of the job's keys, nothing else: the
    # attempt's put, the commit's four keys (config, config_id, attempt, result) and
    # "released"; no node's entry, no vote. The coordinator's range (before the attempt
    # existed) read all n entries at version 1; it announced on the acks, and the
    # entries' puts came after the announcement: its entries watch, stopped in the
    # round of the announcement, got those put before its stop took effect (etcd
    # tells the other watches of "released" before it answers the put), at most n;
    # etcd also counts those it sent as the watch closed. So etcd sent what the
    # watches got, and at most n entry events more.
    assert rec["watch_events_per_stream"] == 6, rec
    assert rec["watch_events_stale"] == 0 and rec["watch_events_dropped"] == 0, rec
    assert rec["entries_read"] == n and rec["entries_watch_events"] <= n, rec
    got = rec["watch_events_all"]
    assert got == rec["watch_events"] + rec["entries_watch_events"], rec
    assert rec["watch_events"] == 6 * n, rec
    assert got <= rec["etcd_events_sent"] <= got + n, rec
