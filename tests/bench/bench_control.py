"""The control plane at scale (issue 17, item 6): N daemons and one etcd on this
machine, a tiny model, nothing happening; then one reconfiguration.

For each N: the CPU the daemons and etcd use together over an idle window (from
/proc/<pid>/stat, in cores), the etcd requests that window cost (etcd's own
counter of gRPC requests from its /metrics), and the wall-clock time of
one reconfiguration of a tiny model (`mlfs reconfigure`, from writing the config
until every node swapped), first run, and the median of that run and --runs - 1 more (four by default)
(back and forth between all nodes and half of them; the medians of each direction
apart too: halving moves nothing over the network, growing back makes the new half
fetch), with the CPU every daemon and etcd spent on the first. Ratios are against
N = 4 in the same run.

    BUILD=build /usr/bin/python3 tests/bench/bench_control.py [--nodes 4,16,32,64]
        [--idle-seconds 10] [--runs 5] [--paired 4,32] [--paired-runs 15] [--json OUT]

Then the ratio the issue asks for, measured paired (--paired): the clusters of those
sizes up at once, one reconfiguration on each in turn, --paired-runs rounds; each
size's median (and each direction's) against the first size's. Sizes run one after
the other meet whatever else the shared machine does at that moment; paired ones meet
the same.

Also per command: etcd's WAL fsyncs and their total time (etcd's /metrics). The
harness keeps etcd's data under $TMPDIR (default /tmp); TMPDIR=/dev/shm runs the
same benchmark with etcd's data in memory, which takes the disk's fsyncs out.
"""
import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))  # the mlfs package of this tree
from mlfs import testing  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
SCHEMA = {"model": "tiny", "num_layers": 2, "states": {"model": {}},
          "tensors": [{"name": "layers/{L}/w", "dtype": "float32", "shape": [64, 64],
                       "split": {"dim": 0}},
                      {"name": "emb", "dtype": "float32", "shape": [128, 64],
                       "split": {"dim": 0}, "place": "first"}]}


def cpu_seconds(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except OSError:
            pass
    return total / TICK


def wal_fsyncs(url):
    """etcd's WAL fsyncs so far: (count, seconds). Each write etcd acknowledges waits
    for one; on a shared disk under load they are what a write's latency is made of."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    got = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^etcd_disk_wal_fsync_duration_seconds_(count|sum) ([0-9.e+]+)$', text, re.M)}
    return got.get("count", 0.0), got.get("sum", 0.0)


def install(cl, n):
    """The tiny model's schema and a first config on all @n nodes of @cl, committed."""
    n0 = cl.mounts["n0"]
    with open(os.path.join(n0, "schema.json"), "w") as f:
        f.write(json.dumps(SCHEMA))
    v1 = {"version": 1, "tp": 1, "pp": 1, "dp": n, "nodes": cl.ids}
    with open(os.path.join(n0, "config.json"), "w") as f:
        f.write(json.dumps(v1))
    cl.wait_version(1, timeout=120)
    return n0, v1


def config(cl, n, v):
    """Version @v: even ones on the first half of the nodes, odd ones on all of them."""
    half = max(1, n // 2)
    if v % 2:
        return {"version": v, "tp": 1, "pp": 1, "dp": n, "nodes": cl.ids}
    return {"version": v, "tp": 1, "pp": 1, "dp": half, "nodes": cl.ids[:half]}


def one(n, idle_s, runs=5):
    with testing.start(nnodes=n, devices=1, job=f"ctl{n}", etcd=True) as cl:
        n0, v1 = install(cl, n)
        time.sleep(2)  # the last entries published
        pids = [node.pid for node in cl.nodes]
        r0, d0, e0 = cl.etcd.calls(), cpu_seconds(pids), cpu_seconds([cl.etcd.pid])
        t0 = time.monotonic()
        time.sleep(idle_s)
        dt = time.monotonic() - t0
        r1, d1, e1 = cl.etcd.calls(), cpu_seconds(pids), cpu_seconds([cl.etcd.pid])
        # One reconfiguration: the job onto half of the nodes (every node takes part).
        v2 = config(cl, n, 2)
        path = os.path.join(cl.tmp, "v2.json")
        with open(path, "w") as f:
            json.dump(v2, f)
        r2 = cl.etcd.calls()
        c2 = cpu_seconds(pids) + cpu_seconds([cl.etcd.pid])
        # CPU and etcd's WAL fsyncs during the commands alone
        spent = {"daemons": 0.0, "etcd": 0.0, "fsyncs": 0.0, "fsync_s": 0.0}

        def timed():
            f = wal_fsyncs(cl.etcd_url)
            d, e, t = cpu_seconds(pids), cpu_seconds([cl.etcd.pid]), time.monotonic()
            p = subprocess.run([testing.MLFS, "reconfigure", n0, path], capture_output=True,
                               text=True, timeout=300)
            took = time.monotonic() - t
            spent["daemons"] += cpu_seconds(pids) - d
            spent["etcd"] += cpu_seconds([cl.etcd.pid]) - e
            f2 = wal_fsyncs(cl.etcd_url)
            spent["fsyncs"] += f2[0] - f[0]
            spent["fsync_s"] += f2[1] - f[1]
            return p, took

        p, reconf = timed()
        if p.returncode:
            raise SystemExit(f"N={n}: mlfs reconfigure: {p.stderr}")
        cl.wait_version(2, timeout=120)
        c3 = cpu_seconds(pids) + cpu_seconds([cl.etcd.pid])
        r3 = cl.etcd.calls()
        # runs - 1 more (four by default), back and forth between all nodes and half
        # of them: the median says what the first run's noise hides on a shared
        # machine.
        times = [reconf]
        shrink, grow = [reconf], []  # v2 (even versions) halves the job, v1 grows it back
        for v in range(3, 2 + runs):
            cfg = config(cl, n, v)
            with open(path, "w") as f:
                json.dump(cfg, f)
            time.sleep(0.5)  # the retained layout released, entries settled
            p, took = timed()
            times.append(took)
            (grow if v % 2 else shrink).append(took)
            if p.returncode:
                raise SystemExit(f"N={n}: mlfs reconfigure to {v}: {p.stderr}")
            cl.wait_version(v, timeout=120)
        return {"nodes": n, "idle_seconds": round(dt, 2),
                "daemons_cores": round((d1 - d0) / dt, 4),
                "etcd_cores": round((e1 - e0) / dt, 4),
                "cores": round((d1 - d0 + e1 - e0) / dt, 4),
                "etcd_requests_per_s_idle": round((r1 - r0) / dt, 1),
                "reconfigure_s": round(reconf, 3),
                "reconfigure_median_s": round(sorted(times)[len(times) // 2], 3),
                # the two directions apart: onto half of the nodes (nothing fetched),
                # and back onto all of them (the new half fetches its partitions)
                "reconfigure_shrink_median_s": round(sorted(shrink)[len(shrink) // 2], 3),
                "reconfigure_grow_median_s":
                    round(sorted(grow)[len(grow) // 2], 3) if grow else None,
                # CPU of every daemon and etcd over the reconfiguration: on this
                # machine's cores the time cannot be less than this / cores
                "reconfigure_cpu_s": round(c3 - c2, 3),
                # the same split, over the 5 commands alone (clock ticks: a mean)
                "reconfigure_daemons_cpu_ms": round(spent["daemons"] / len(times) * 1000, 1),
                "reconfigure_etcd_cpu_ms": round(spent["etcd"] / len(times) * 1000, 1),
                # etcd's WAL fsyncs per command (a mean), and their total time
                "reconfigure_wal_fsyncs": round(spent["fsyncs"] / len(times), 1),
                "reconfigure_wal_fsync_ms": round(spent["fsync_s"] / len(times) * 1000, 1),
                "etcd_requests_reconfigure": int(r3 - r2)}


def paired(sizes, runs):
    """Clusters of every size in @sizes up at once (each with its own etcd), one
    reconfiguration on each in turn, @runs rounds: the sizes' medians then met the
    same load on this shared machine, which two runs minutes apart do not (the
    ratio of two such runs moved from 1.96x to 2.61x). The idle clusters beside
    the one reconfiguring cost a few thousandths of a core each."""
    with contextlib.ExitStack() as stack:
        clusters = []
        for n in sizes:
            cl = stack.enter_context(testing.start(nnodes=n, devices=1, job=f"pair{n}",
                                                   etcd=True))
            n0, _ = install(cl, n)
            clusters.append((n, cl, n0, os.path.join(cl.tmp, "paired.json")))
        time.sleep(2)  # the last entries published
        times = {n: {"shrink": [], "grow": []} for n in sizes}
        for v in range(2, 2 + runs):
            for n, cl, n0, path in clusters:
                with open(path, "w") as f:
                    json.dump(config(cl, n, v), f)
            time.sleep(0.5)  # the retained layouts released, entries settled
            for n, cl, n0, path in clusters:
                t = time.monotonic()
                p = subprocess.run([testing.MLFS, "reconfigure", n0, path],
                                   capture_output=True, text=True, timeout=300)
                took = time.monotonic() - t
                if p.returncode:
                    raise SystemExit(f"N={n}: mlfs reconfigure to {v}: {p.stderr}")
                times[n]["grow" if v % 2 else "shrink"].append(took)
                time.sleep(0.1)
        return {n: {d: sorted(t[d]) for d in t} for n, t in times.items()}


def median(xs):
    return sorted(xs)[len(xs) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="4,16,32,64", help="sizes measured one at a time ('' for none)")
    ap.add_argument("--idle-seconds", type=float, default=10)
    ap.add_argument("--runs", type=int, default=5,
                    help="reconfigurations per size (the first and the median are reported)")
    ap.add_argument("--paired", default="4,32",
                    help="sizes reconfigured in turn, all up at once ('' for none)")
    ap.add_argument("--paired-runs", type=int, default=15)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error(f"--runs {a.runs}: at least one reconfiguration per size")
    if a.paired and a.paired_runs < 2:
        ap.error(f"--paired-runs {a.paired_runs}: at least two (one each way)")
    rows = []
    for n in [int(x) for x in a.nodes.split(",") if x]:  # "" for none
        rows.append(one(n, a.idle_seconds, a.runs))
        r = rows[-1]
        base = rows[0]
        print(f"N={n:3d}: idle {r['cores']:.4f} cores (daemons {r['daemons_cores']:.4f}, "
              f"etcd {r['etcd_cores']:.4f}), {r['etcd_requests_per_s_idle']:.1f} etcd "
              f"requests/s; reconfigure {r['reconfigure_s']:.3f} s "
              f"({r['reconfigure_s'] / base['reconfigure_s']:.2f}x N={base['nodes']}), median "
              f"of {a.runs} {r['reconfigure_median_s']:.3f} s "
              f"({r['reconfigure_median_s'] / base['reconfigure_median_s']:.2f}x; halving "
              f"{r['reconfigure_shrink_median_s']:.3f} s, growing "
              f"{r['reconfigure_grow_median_s'] or 0:.3f} s), "
              f"{r['etcd_requests_reconfigure']} etcd requests, "
              f"{r['reconfigure_cpu_s']:.2f} CPU s ({r['reconfigure_cpu_s'] / n * 1000:.1f} ms "
              f"per node; floor {r['reconfigure_cpu_s'] / os.cpu_count():.3f} s on "
              f"{os.cpu_count()} cores); during a command: daemons "
              f"{r['reconfigure_daemons_cpu_ms']:.1f} ms + etcd {r['reconfigure_etcd_cpu_ms']:.1f} "
              f"ms of CPU; {r['reconfigure_wal_fsyncs']:.1f} etcd WAL fsyncs taking "
              f"{r['reconfigure_wal_fsync_ms']:.1f} ms", flush=True)
    out = {"sizes": rows}
    if a.paired:
        sizes = [int(x) for x in a.paired.split(",")]
        got = paired(sizes, a.paired_runs)
        base = got[sizes[0]]
        out["paired"] = got
        for n in sizes:
            t = got[n]
            every = t["shrink"] + t["grow"]
            print(f"paired N={n:3d}: median of {len(every)} {median(every):.3f} s "
                  f"({median(every) / median(base['shrink'] + base['grow']):.2f}x N={sizes[0]}); "
                  f"halving {median(t['shrink']):.3f} s "
                  f"({median(t['shrink']) / median(base['shrink']):.2f}x), growing "
                  f"{median(t['grow']):.3f} s ({median(t['grow']) / median(base['grow']):.2f}x)",
                  flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
