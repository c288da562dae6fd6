#!/usr/bin/python3
"""Writes a measured profile for `mlfs suggest --profile`: what the cost model's constants
stand for, measured on this machine with the training example's shapes
(examples/elastic_train.py: MODEL, SEQ, HP; the layer code of examples/train_gpt.py),
PyTorch on the CPU and gloo, while as many worker processes run as the layout has ranks.

    /usr/bin/python3 examples/calibrate.py --ranks 4 --out profile.json [--seconds 1]

--ranks N processes (torchrun's environment, one thread each, as train_gpt.py runs) all
measure at once, so each sees the share of the CPU that a rank of an N-rank job gets:

  compute      one transformer layer of train_gpt.py, forward and backward of one
               micro-batch, at every tp that divides the heads (1, 2, 4: the layer's
               partitions at that tp); a least-squares line through
               time = layer_overhead_s + 6 * layer parameters / tp * tokens / flops
               gives "layer_overhead_s" (what a split does not shrink: the cost per
               operator) and "flops_per_device" ("mfu" 1);
  collectives  the ranks in pairs, all pairs at once: gloo all-reduces of 64 bytes and
               4 MiB (time = 2 latency + bytes / bandwidth for two ranks) give
               "latency_s" and "intra_node_bw" = "inter_node_bw" (the nodes of
               mlfs.testing share this machine's loopback);
  pipeline     ping-pong of one micro-batch's activations (mb * seq * hidden * 4
               bytes) in each pair: half the round trip is "p2p_latency_s".

"memory_per_device_bytes" is MemAvailable / N; "shared_cores" this machine's CPUs (every
rank of every node runs here). The profile keeps "tp_across_nodes" false. Each figure is the median over rounds, then over ranks. Prints what it measured.
The function calibrate() is what tests/bench/bench_suggest.py runs.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

SMALL, LARGE = 64, 4 << 20  # all-reduce sizes, bytes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fit_line(xs, ys):
    """Least squares y = a + b x; (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def profile_from(m, ranks, mem_available):
    """The profile JSON from the medians @m of worker(): see the module's doc."""
    xs = [6.0 * m["layer_params"] / tp * m["tokens"] for tp in m["tps"]]
    ys = [m["layer_s"][str(tp)] for tp in m["tps"]]
    a, b = fit_line(xs, ys)
    if b <= 0:  # noise hid the FLOPs: all of it is per-operator cost
        a, b = sum(ys) / len(ys), 1e-15
    elif a < 0:  # all of it is FLOPs: the line through 0
        a, b = 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    t1, t2 = m["allreduce_s"][str(SMALL)], m["allreduce_s"][str(LARGE)]
    bw = (LARGE - SMALL) / max(t2 - t1, 1e-9)
    lat = max((t1 - SMALL / bw) / 2, 0.0)
    return {"flops_per_device": 1 / b, "mfu": 1.0, "layer_overhead_s": a,
            "latency_s": lat, "p2p_latency_s": m["p2p_s"],
            "intra_node_bw": bw, "inter_node_bw": bw,
            "memory_per_device_bytes": float(mem_available // ranks),
            "shared_cores": float(os.cpu_count()), "tp_across_nodes": False}


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 << 30


def calibrate(ranks, seconds=1.0, timeout=600):
    """Runs @ranks workers at once; returns (profile, measured): the profile JSON for
    `mlfs suggest --profile` and the medians it was computed from."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(ranks), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker",
                               "--seconds", str(seconds)],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for r in range(ranks)]
    outs = []
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"calibrate: rank {r} of {ranks} timed out")
        if p.returncode:
            for q in procs:
                q.kill()
            raise RuntimeError(f"calibrate: rank {r} of {ranks} failed:\n{err[-3000:]}")
        outs.append(out)
    m = json.loads([line for line in outs[0].splitlines() if line.startswith("{")][-1])
    return profile_from(m, ranks, mem_available()), m


# --- the worker ------------------------------------------------------------------------------

def worker(seconds):
    import statistics

    import torch
    import torch.distributed as dist

    sys.path.insert(0, HERE)
    import elastic_train as et
    import train_gpt as tg

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # Pairs (0, 1), (2, 3), ...: every process creates every group, in the same order.
    pairs = [dist.new_group([i, i + 1]) for i in range(0, world - 1, 2)]
    pair = pairs[rank // 2] if rank // 2 < len(pairs) else None
    peer = rank ^ 1

    sch = et.schema()  # `mlfs schema llama` of the example's MODEL
    spec = {t["name"]: t for t in sch["tensors"]}
    heads, kv = et.MODEL["heads"], et.MODEL["kv_heads"]
    tps = [tp for tp in (1, 2, 4, 8) if heads % tp == 0 and kv % tp == 0]
    mb, seq, hidden = et.HP["micro_batch"], et.SEQ, et.MODEL["hidden"]

    class Me:  # what Stage reads of rank.json: one layer, no pipeline
        p, pp, t, layers = 0, 1, 0, range(0, 1)

    class NoGroups:  # a group of one: every all-reduce is a no-op
        tp = dp = embedding = prev = next = None

    stages, layer_params = {}, 0
    for tp in tps:
        params = {}
        for name, t in spec.items():
            if not name.startswith("layers/{L}/"):
                continue
            shape = list(t["shape"])
            if "split" in t:
                shape[t["split"]["dim"]] //= tp
            params[name.replace("{L}", "0")] = torch.randn(shape).mul_(0.02).requires_grad_()
        if tp == 1:
            layer_params = sum(p.numel() for p in params.values())
        me = Me()
        me.tp = tp
        stages[tp] = tg.Stage(me, sch, dict(et.HP), params, NoGroups())
    x = torch.randn(mb, seq, hidden, requires_grad=True)

    def layer_once(tp):
        stages[tp].forward(x).sum().backward()

    def timed(fn, n):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n

    # Rounds of every measurement, interleaved; all ranks start each round together.
    for tp in tps:
        layer_once(tp)  # warm-up
    small = torch.zeros(SMALL // 4)
    large = torch.zeros(LARGE // 4)
    act = torch.zeros(mb, seq, hidden)

    def allreduce(buf):
        if pair is not None:
            dist.all_reduce(buf, group=pair)

    def pingpong():
        if pair is None:
            return
        if rank % 2 == 0:
            dist.send(act, peer)
            dist.recv(act, peer)
        else:
            dist.recv(act, peer)
            dist.send(act, peer)

    allreduce(small)
    allreduce(large)
    pingpong()
    res = {str(tp): [] for tp in tps}
    ar = {str(SMALL): [], str(LARGE): []}
    p2p = []
    end = time.monotonic() + seconds * 6
    rounds = 0
    while True:
        dist.barrier()
        for tp in tps:
            res[str(tp)].append(timed(lambda: layer_once(tp), 5))
        dist.barrier()
        ar[str(SMALL)].append(timed(lambda: allreduce(small), 20))
        ar[str(LARGE)].append(timed(lambda: allreduce(large), 2))
        p2p.append(timed(pingpong, 20) / 2)
        rounds += 1
        done = torch.tensor([1.0 if time.monotonic() > end and rounds >= 3 else 0.0])
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if done.item():
            break
    med = {"layer_s": {k: statistics.median(v) for k, v in res.items()},
           "allreduce_s": {k: statistics.median(v) for k, v in ar.items()},
           "p2p_s": statistics.median(p2p)}
    got = [None] * world
    dist.all_gather_object(got, med)
    if rank == 0:
        paired = [g for r, g in enumerate(got) if r // 2 < len(pairs)]
        out = {"ranks": world, "rounds": rounds, "tps": tps, "layer_params": layer_params,
               "tokens": mb * seq,
               "layer_s": {k: statistics.median(g["layer_s"][k] for g in got)
                           for k in med["layer_s"]},
               "allreduce_s": {k: statistics.median(g["allreduce_s"][k] for g in paired)
                               for k in med["allreduce_s"]},
               "p2p_s": statistics.median(g["p2p_s"] for g in paired)}
        print(json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, help="worker processes at once: the layout's ranks")
    ap.add_argument("--out", help="the profile JSON to write (default: print it)")
    ap.add_argument("--seconds", type=float, default=1.0,
                    help="about a sixth of the time spent measuring")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.seconds)
        return 0
    if not args.ranks or args.ranks < 2:
        ap.error("--ranks must be at least 2 (the collectives need a pair)")
    if args.seconds <= 0:
        ap.error("--seconds must be greater than 0")
    prof, m = calibrate(args.ranks, args.seconds)
    print(f"{args.ranks} ranks at once, {m['rounds']} rounds: one layer forward+backward "
          + ", ".join(f"tp{tp} {m['layer_s'][str(tp)] * 1e3:.2f} ms" for tp in m["tps"])
          + f"; all-reduce of 2 ranks {SMALL} B {m['allreduce_s'][str(SMALL)] * 1e6:.0f} us, "
          f"{LARGE >> 20} MiB {m['allreduce_s'][str(LARGE)] * 1e3:.2f} ms; "
          f"p2p {m['p2p_s'] * 1e6:.0f} us", file=sys.stderr)
    text = json.dumps(prof, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
