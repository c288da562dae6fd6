"""The control plane alone at 1,000 and 10,000 nodes (issue 17, "Scale"): for each N,
a fresh etcd (Debian's etcd-server) in a temporary directory on free loopback ports
and one run of sim_control (tests/bench/sim_control.c): N simulated nodes, each with
its lease kept alive on the daemon's schedule, its entry (/mlfs-nodes/<job>/<id>), its
own watch of the job's keys (/mlfs/<job>/; the coordinator also follows the entries
while it needs them), its vote sent over HTTP to the coordinator's peer server (n0's,
into its votebox: no vote goes through etcd) and its rounds of the real decision
function (cluster/mlfs_decide.c) over the real etcd client; no FUSE, no store, no data
(a prepare succeeds at once).
sim_control.c's DESIGN block says what is real per node and how a simulated node
differs from a daemon.

Per N: etcd requests per second over an idle window, and etcd's CPU then; one
reconfiguration touching every node (n0 coordinates, every node takes part, the job
moves onto half of them): its etcd requests, the time from the attempt's creation to
the commit, from the commit to the last node's swap, and to the last node letting its
retained layout go (the coordinator, following the entries, sees every swap and puts
"released"; the others let go on that event, or follow the entries themselves 2 s
after their swap), the watch events etcd sent, and whether every lease stayed alive.

    BUILD=build /usr/bin/python3 tests/bench/bench_sim.py [--nodes 1000,10000]
        [--watches 0,100] [--idle-seconds 10] [--timeout 240] [--sim-args "..."]
        [--nice 10] [--strict] [--json OUT]

The simulator runs at a lower CPU priority than etcd (--nice): it stands for the CPU
of N machines, and must not take this machine's cores from etcd, whose costs are
what is measured. --watches gives each N its number of watch streams: 0 (the default) is one per node,
what the daemon does; fewer share a stream among nodes, which the daemon does NOT do
(the row says "shared"). A run that did not reach its end is a row that says so (exit
1 only with --strict). Figures and their reading: BENCHMARKS.md, "Simulated control
plane (1,000 and 10,000 nodes)".
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BUILD", "build")
SIM = os.path.join(ROOT, BUILD, "tests", "sim_control")
ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """One etcd member on loopback, its data in a temporary directory."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="mlfs-sim-etcd-")
        cport, pport = free_port(), free_port()
        self.url = f"http://127.0.0.1:{cport}"
        peer = f"http://127.0.0.1:{pport}"
        self.log_path = os.path.join(self.tmp, "etcd.log")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [ETCD, "--name", "default", "--data-dir", os.path.join(self.tmp, "data"),
                 "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"default={peer}"],
                stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"etcd exited {self.proc.returncode}: {self.log()}")
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=1).read()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise SystemExit(f"etcd did not answer in 30 s: {self.log()}")
                time.sleep(0.05)

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def run(n, watches=0, idle_s=10, timeout=240, extra=(), nice=10, log=sys.stderr):
    """One sim_control run against a fresh etcd: its JSON (with "rc"). The simulator
    runs @nice steps below etcd's CPU priority: it stands for N machines' CPU, which
    must not take etcd's cores on this one."""
    if not os.access(SIM, os.X_OK):
        raise SystemExit(f"{SIM} is missing: make BUILD={BUILD} {BUILD}/tests/sim_control")
    with Etcd() as etcd:
        args = [SIM, "--etcd", etcd.url, "--nodes", str(n), "--idle-seconds", str(idle_s),
                "--etcd-pid", str(etcd.proc.pid), "--timeout", str(timeout), *extra]
        if watches:
            args += ["--watches", str(watches)]
        t0 = time.monotonic()
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=log, text=True,
                           timeout=3 * timeout + 300, preexec_fn=lambda: os.nice(nice))
        lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
        if not lines:
            raise SystemExit(f"N={n}: sim_control exited {p.returncode} without a result\n"
                             f"{etcd.log()}")
        r = json.loads(lines[-1])
        r["rc"] = p.returncode
        r["wall_s"] = time.monotonic() - t0
        r["sim_nice"] = nice
        return r


def f(v, fmt):
    return "-" if v is None else format(v, fmt)


def line(r):
    """One row of the table, as printed."""
    i, c = r.get("idle", {}), r.get("reconfigure", {})
    streams = (f"{r['watch_streams']:,} (one per node)" if r.get("one_watch_per_node")
               else f"{r['watch_streams']:,} (shared, not the daemon's)")
    return (f"| {r['nodes']:,} | {streams} | "
            f"{f(i.get('requests_per_s'), ',.0f')} | {f(i.get('etcd_cores'), '.2f')} | "
            f"{f(i.get('keepalive_latency_max_s'), '.2f')} s | "
            f"{f(i.get('leases_expired'), ',')} | "
            f"{f(c.get('requests_without_keepalives'), ',')} "
            f"({f(c.get('requests_per_node_without_keepalives'), '.3f')}) | "
            f"{f(c.get('create_to_commit_s'), '.2f')} s | "
            f"{f(c.get('commit_to_last_swap_s'), '.2f')} s | "
            f"{f(c.get('commit_to_last_release_s'), '.1f')} s | "
            f"{f(c.get('etcd_events_sent'), ',')} | "
            f"{f(c.get('etcd_cpu_s'), '.1f')} s / {f(c.get('sim_cpu_s'), '.1f')} s | "
            f"{f(c.get('keepalive_latency_max_s'), '.2f')} s, "
            f"{f(c.get('keepalive_errors'), ',')} | {f(c.get('leases_expired'), ',')} |"
            + (f" {r['failed']}" if r.get("failed") else ""))


HEADER = ("| nodes | watch streams | idle etcd requests/s | idle etcd cores | idle "
          "keep-alive max latency | idle leases expired | reconfiguration requests without "
          "keep-alives (per node) | creation to commit | commit to last swap | commit to "
          "last release | watch events etcd sent | etcd / sim CPU during it | keep-alive "
          "max latency, errors | leases expired |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="1000,10000")
    ap.add_argument("--watches", default="",
                    help="watch streams per N, comma-separated (0: one per node)")
    ap.add_argument("--idle-seconds", type=float, default=10)
    ap.add_argument("--timeout", type=float, default=240,
                    help="seconds each phase (start-up, reconfiguration) may take")
    ap.add_argument("--sim-args", default="", help="more arguments for sim_control")
    ap.add_argument("--nice", type=int, default=10,
                    help="the simulator's CPU priority below etcd's (default 10)")
    ap.add_argument("--json")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a run did not reach its end (default: the table says so)")
    a = ap.parse_args()
    ns = [int(x) for x in a.nodes.split(",")]
    ws = [int(x) for x in a.watches.split(",")] if a.watches else [0] * len(ns)
    rows = []
    print(HEADER, flush=True)
    for n, w in zip(ns, ws):
        r = run(n, w, a.idle_seconds, a.timeout, a.sim_args.split(), a.nice)
        rows.append(r)
        print(line(r), flush=True)
    if a.json:
        with open(a.json, "w") as out:
            json.dump(rows, out, indent=1)
    if a.strict and any(r["rc"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
