#!/usr/bin/python3
"""Is the suggested layout the fastest? (issue 20, item 5): the training example's GPT
(examples/elastic_train.py: MODEL, SEQ, GLOBAL_BATCH, HP; examples/train_gpt.py the
worker) on 1 to 4 local daemons of NODE_DEVICES devices each, one etcd, every valid
layout measured and compared with `mlfs suggest`'s ranking under a profile measured
on this machine (examples/calibrate.py).

For each node count n (devices D = n * NODE_DEVICES, one worker process per device):

  1. `mlfs suggest --json --top 1000` lists every layout that fits on the n nodes for
     the example's global batch, micro-batch and sequence (tp within a node);
  2. --repeats rounds; in each, in an order shuffled per round (so that the machine's
     noise spreads over every layout), the calibration (examples/calibrate.py with D
     ranks at once) and every layout: the job is reconfigured to it (`mlfs
     reconfigure`, elastic_train.reconfigure), D workers train --steps steps
     (elastic_train.run_workers), and each step's time on rank 0 is kept but the first
     (warm-up);
  3. the profile is the median of the rounds' calibrations, key by key; `mlfs suggest
     --profile` ranks the layouts with it (and with the default profile, for reference).

Reported per n: each layout's predicted and measured (median) step time, the suggested
layout's measured time against the best measured (the issue asks: within 10%),
Spearman's rank correlation between predicted and measured step times (calibrated and
default profiles), and the machine's load (1-minute load average, median over the runs).

    BUILD=build /usr/bin/python3 tests/bench/bench_suggest.py [--nodes 1,2,3,4]
        [--repeats 3] [--steps 6] [--json OUT] [--dir DIR]
"""
import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "python"))
import calibrate  # noqa: E402
import elastic_train as et  # noqa: E402
from mlfs import testing  # noqa: E402


def ranks_of(xs):
    """Ranks 1..n of @xs, ties given their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a, b):
    """Spearman's rank correlation of two equal-length lists; None below 3 values (two
    values always give +-1: no evidence either way)."""
    if len(a) < 3:
        return None
    ra, rb = ranks_of(a), ranks_of(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    return cov / (va * vb) ** 0.5 if va and vb else None


def suggest(schema_path, cluster_path, profile_path=None):
    """`mlfs suggest --json --top 1000` for the example's batch: the JSON."""
    args = ["suggest", "--schema", schema_path, "--cluster", cluster_path,
            "--global-batch", et.GLOBAL_BATCH, "--micro-batch", et.HP["micro_batch"],
            "--seq", et.SEQ, "--top", 1000, "--json"]
    if profile_path:
        args += ["--profile", profile_path]
    return json.loads(et.run_mlfs(*args))


def retried(fn, *args, tries=3, **kw):
    """fn(*args, **kw), again when its workers lost their free port to another process
    between free_port() and their bind (this machine is shared): "Address already in use"."""
    for k in range(tries):
        try:
            return fn(*args, **kw)
        except RuntimeError as e:
            if "Address already in use" not in str(e) or k == tries - 1:
                raise
            print("  (a worker's port was taken; again)", flush=True)


def median_profile(profiles):
    """Key by key, the median of numeric values (booleans from the first)."""
    out = dict(profiles[0])
    for k, v in out.items():
        if isinstance(v, float):
            out[k] = statistics.median(p[k] for p in profiles)
    return out


def bench_nodes(n, args, work, say):
    """Every layout of @n nodes measured, the calibration rounds interleaved with them."""
    devices = n * et.NODE_DEVICES
    with testing.start(n, et.NODE_DEVICES, job=f"suggest-{n}",
                       tmp=os.path.join(work, f"n{n}"), mlfs=et.MLFS) as cl:
        mounts, cluster_path = dict(cl.mounts), cl.cluster_path
        schema_path = os.path.join(work, "schema.json")
        with open(schema_path, "w") as f:
            json.dump(et.schema(), f)
        listed = suggest(schema_path, cl.cluster_path)
        nodes = tuple(listed["nodes"])
        layouts = [(s["tp"], s["pp"], s["dp"]) for s in listed["suggestions"]]
        say(f"\n== {n} node{'s' if n > 1 else ''} ({', '.join(nodes)}), {devices} devices: "
            f"{len(layouts)} layouts fit, " + ", ".join("tp%d pp%d dp%d" % x for x in layouts))
        et.set_up(mounts, os.path.join(work, "job"), layouts[0] + (nodes,))
        steps = {x: [] for x in layouts}
        profiles, loads = [], []
        rng = random.Random(n)
        current = layouts[0]
        for rep in range(args.repeats):
            items = layouts + ["calibrate"]
            rng.shuffle(items)
            for item in items:
                loads.append(os.getloadavg()[0])
                if item == "calibrate":
                    prof, m = retried(calibrate.calibrate, devices, args.calibrate_seconds)
                    profiles.append(prof)
                    say(f"  round {rep + 1} calibration: layer tp1 "
                        f"{m['layer_s']['1'] * 1e3:.2f} ms, overhead "
                        f"{prof['layer_overhead_s'] * 1e3:.2f} ms, latency "
                        f"{prof['latency_s'] * 1e6:.0f} us, "
                        f"p2p {prof['p2p_latency_s'] * 1e6:.0f} us")
                    continue
                if item != current:
                    et.reconfigure(mounts, item + (nodes,), nodes[0])
                    current = item
                where = et.hosts(mounts)
                events = retried(et.run_workers, where, devices, args.steps, timeout=600)
                tm = next(e for e in events if e["kind"] == "time")
                steps[item] += tm["step_s"][1:]  # the first step warms up
                say(f"  round {rep + 1} tp{item[0]} pp{item[1]} dp{item[2]}: steps "
                    + " ".join(f"{s * 1e3:.0f}" for s in tm["step_s"]) + " ms"
                    + f" (load {loads[-1]:.1f})")
    prof = median_profile(profiles)
    prof_path = os.path.join(args.dir, f"profile-n{n}.json")
    with open(prof_path, "w") as f:
        json.dump(prof, f, indent=1)
    calibrated = suggest(schema_path, cluster_path, prof_path)
    default = {(s["tp"], s["pp"], s["dp"]): s["step_s"] for s in listed["suggestions"]}
    pred = {(s["tp"], s["pp"], s["dp"]): s for s in calibrated["suggestions"]}
    assert sorted(pred) == sorted(layouts), "the calibrated profile dropped a layout"
    measured = {x: statistics.median(v) for x, v in steps.items()}
    best = min(measured, key=measured.get)
    top = (calibrated["suggestions"][0]["tp"], calibrated["suggestions"][0]["pp"],
           calibrated["suggestions"][0]["dp"])
    order = sorted(layouts, key=lambda x: pred[x]["step_s"])
    top_default = (listed["suggestions"][0]["tp"], listed["suggestions"][0]["pp"],
                   listed["suggestions"][0]["dp"])
    return {"nodes": n, "devices": devices, "profile": prof, "profile_path": prof_path,
            "layouts": [{"layout": list(x), "predicted_s": pred[x]["step_s"],
                         "parts": {k: pred[x][k] for k in ("compute_s", "overhead_s",
                                                           "tp_comm_s", "pp_comm_s",
                                                           "bubble_s", "dp_comm_s")},
                         "default_predicted_s": default[x], "measured_s": measured[x],
                         "steps_s": steps[x]} for x in order],
            "suggested": list(top), "best": list(best),
            "suggested_vs_best": measured[top] / measured[best],
            "default_suggested": list(top_default),
            "default_suggested_vs_best": measured[top_default] / measured[best],
            "spearman": spearman([pred[x]["step_s"] for x in layouts],
                                 [measured[x] for x in layouts]),
            "spearman_default": spearman([default[x] for x in layouts],
                                         [measured[x] for x in layouts]),
            "load_median": statistics.median(loads), "load_max": max(loads)}


def fmt_rho(r):
    return "n/a" if r is None else f"{r:+.2f}"


def report(results, args, say):
    say(f"\n== step time of every layout, measured (median of {args.repeats} rounds x "
        f"{args.steps - 1} steps) vs predicted by `mlfs suggest` with the calibrated profile")
    say(f"{'nodes':>5} {'layout':<14} {'predicted':>10} {'measured':>10} {'vs best':>8}"
        f"  {'default profile':>15}")
    for r in results:
        best = min(x["measured_s"] for x in r["layouts"])
        for i, x in enumerate(r["layouts"]):
            lay = "tp%d pp%d dp%d" % tuple(x["layout"])
            say(f"{r['nodes'] if i == 0 else '':>5} {lay:<14} {x['predicted_s'] * 1e3:>8.0f} ms"
                f" {x['measured_s'] * 1e3:>7.0f} ms {x['measured_s'] / best:>7.2f}x"
                f"  {x['default_predicted_s'] * 1e6:>12.1f} us")
    say(f"\n{'nodes':>5} {'layouts':>7} {'suggested':<14} {'best measured':<14} "
        f"{'suggested/best':>14} {'rho':>6} {'default: suggested/best':>23} {'rho':>6} "
        f"{'load':>10}")
    for r in results:
        ok = r["suggested_vs_best"] <= 1.10
        name = {k: "tp%d pp%d dp%d" % tuple(r[k]) for k in ("suggested", "best")}
        say(f"{r['nodes']:>5} {len(r['layouts']):>7} {name['suggested']:<14} {name['best']:<14} "
            f"{r['suggested_vs_best']:>13.2f}{' ' if ok else '!'} {fmt_rho(r['spearman']):>6} "
            f"{'tp%d pp%d dp%d' % tuple(r['default_suggested']):>15} "
            f"{r['default_suggested_vs_best']:>7.2f} {fmt_rho(r['spearman_default']):>6} "
            f"{r['load_median']:>4.1f} ({r['load_max']:.0f})")
    say("(suggested/best: the suggested layout's measured step over the fastest measured; "
        "'!' past the 10% the issue asks. rho: Spearman's rank correlation of predicted and "
        "measured step times, n/a below 3 layouts. default: the same with the default "
        "profile. load: the "
        f"1-minute load average on {os.cpu_count()} CPUs, median (max) over the runs.)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1,2,3,4", help="node counts, comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="rounds over every layout")
    ap.add_argument("--steps", type=int, default=6,
                    help="steps per run of a layout, the first discarded (at least 2)")
    ap.add_argument("--calibrate-seconds", type=float, default=0.5,
                    help="examples/calibrate.py --seconds for each round's calibration")
    ap.add_argument("--dir", default=os.path.join(ROOT, et.BUILD, "bench_suggest"),
                    help="where the profiles (profile-n<N>.json) are written")
    ap.add_argument("--json", help="write every figure there")
    args = ap.parse_args()
    try:
        counts = [int(x) for x in args.nodes.split(",")]
    except ValueError:
        ap.error(f"--nodes {args.nodes!r}: not a list of integers")
    if not counts or any(not 1 <= c <= 8 for c in counts):
        ap.error(f"--nodes {args.nodes!r}: each count must be 1 to 8")
    if args.steps < 2 or args.repeats < 1 or args.calibrate_seconds <= 0:
        ap.error("--steps must be at least 2, --repeats at least 1, --calibrate-seconds > 0")
    os.makedirs(args.dir, exist_ok=True)
    t0 = time.monotonic()
    results = []
    say = lambda s: print(s, flush=True)  # noqa: E731
    say(f"GPT {et.MODEL}, seq {et.SEQ}, global batch {et.GLOBAL_BATCH}, micro-batch "
        f"{et.HP['micro_batch']}; {et.NODE_DEVICES} devices (worker processes) a node; "
        f"{os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}")
    for n in counts:
        with tempfile.TemporaryDirectory(prefix="mlfs-bench-suggest-") as work:
            results.append(bench_nodes(n, args, work, say))
    report(results, args, say)
    say(f"({time.monotonic() - t0:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
