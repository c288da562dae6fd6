"""What one request costs etcd through its JSON gateway (the client mlfs used until
the daemons moved to etcd's gRPC API: docs/decisions.md, "etcd's gRPC API, not its
JSON gateway"; this script, in Python, still speaks JSON): the CPU etcd spends per put and per range, with no watcher and
with W watchers of the written prefix (each put is an event to every watch), its
data directory on this machine's disk (as the tests' and the benchmarks' etcd) and,
for comparison, on tmpfs (the WAL's fsync is part of a put's cost here).

This is the floor under bench_control.py's reconfiguration time at N daemons: every
reconfiguration puts two keys per node (its vote and, after its swap, its entry:
DESIGN section 7's rules), so etcd alone spends about 2N puts' CPU, on the same
cores as the daemons.

    BUILD=build /usr/bin/python3 tests/bench/bench_etcd_cost.py [--watchers 32]
        [--requests 400] [--json OUT]
"""
import argparse
import base64
import http.client
import json
import os
import pathlib
import shutil
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))  # the mlfs package of this tree
from mlfs.testing.etcd import Etcd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_control import cpu_seconds  # noqa: E402


def b64(s):
    return base64.b64encode(s.encode()).decode()


def post(conn, path, body):
    conn.request("POST", path, json.dumps(body))
    r = conn.getresponse()
    out = r.read()
    if r.status != 200:
        raise SystemExit(f"etcd {path}: HTTP {r.status}: {out[:200]!r}")


def watch(host, port, stop):
    """One watch of /b/ over the gateway's stream, read until @stop."""
    c = http.client.HTTPConnection(host, port, timeout=60)
    c.request("POST", "/v3/watch",
              json.dumps({"create_request": {"key": b64("/b/"), "range_end": b64("/b0")}}))
    r = c.getresponse()
    while not stop.is_set() and r.fp.readline():
        pass


def one(tmp_root, watchers, requests, size):
    et = Etcd(pathlib.Path(tempfile.mkdtemp(dir=tmp_root)))
    et.start()
    stop = threading.Event()
    try:
        host, port = et.url.split("//")[1].rsplit(":", 1)
        threads = [threading.Thread(target=watch, args=(host, int(port), stop), daemon=True)
                   for _ in range(watchers)]
        for t in threads:
            t.start()
        time.sleep(1)  # every watch created
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        value = b64("x" * size)
        out = {}
        for kind in ("put", "range"):
            c0, t0 = cpu_seconds([et.pid]), time.monotonic()
            for i in range(requests):
                if kind == "put":
                    post(conn, "/v3/kv/put", {"key": b64(f"/b/k{i % 64}"), "value": value})
                else:
                    post(conn, "/v3/kv/range", {"key": b64(f"/b/k{i % 64}")})
            out[kind + "_cpu_ms"] = round((cpu_seconds([et.pid]) - c0) / requests * 1000, 3)
            out[kind + "_wall_ms"] = round((time.monotonic() - t0) / requests * 1000, 3)
        return out
    finally:
        stop.set()
        et.stop()
        shutil.rmtree(et.tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--watchers", type=int, default=32)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--size", type=int, default=100, help="bytes of each value put")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for where, root in (("disk", None), ("tmpfs", "/dev/shm")):
        for w in (0, a.watchers):
            r = dict(one(root, w, a.requests, a.size), data_dir=where, watchers=w)
            rows.append(r)
            print(f"etcd data on {where:5s}, {w:3d} watchers: put {r['put_cpu_ms']:.3f} ms of "
                  f"etcd CPU ({r['put_wall_ms']:.3f} ms wall), range {r['range_cpu_ms']:.3f} ms "
                  f"({r['range_wall_ms']:.3f} ms wall)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
