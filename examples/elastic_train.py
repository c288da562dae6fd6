#!/usr/bin/python3
"""Elastic training on mlfs: a GPT (examples/train_gpt.py) trained with tensor,
pipeline and data parallelism changes its layout four times in the middle of
its run, and trains on as if nothing had changed.

Three runs of the same job (same initial weights, same dataset), each on its
own mount:
  elastic:   tp2 pp2 dp1 -> tp1 pp2 dp2 -> tp4 pp1 dp1 -> tp1 pp1 dp4 -> tp2 pp1 dp2,
             a few steps each: the workers save and stop, the driver writes a new
             config.json, the workers restart in the new layout from the mount;
  reference: tp1 pp1 dp1 from the first step to the last, never stopped;
  restart:   the elastic run's layouts, with a loader that starts the dataset again
             from its first record at every start (what a loader without carried
             state does).
The elastic run's loss must match the reference's at every step within TOLERANCE,
its samples must be each record once per epoch in the reference's order, and the
restart run must not match. Prints what happened and plots the three curves.

    BUILD=build /usr/bin/python3 examples/elastic_train.py [--steps-per-layout 4]
        [--out build/training]

The functions (set_up, train_run, ...) are what tests/e2e/test_training.py runs.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.environ.get("BUILD", "build")
MLFS = os.path.join(ROOT, BUILD, "mlfs")
sys.path.insert(0, os.path.join(ROOT, "python"))  # the mlfs package, not installed
import mlfs  # noqa: E402
from mlfs import testing  # noqa: E402

# A tiny model so that a run takes seconds on two CPU cores.
MODEL = {"layers": 4, "hidden": 64, "heads": 8, "kv_heads": 4, "ffn": 128, "vocab": 200}
SEQ = 32                   # tokens per sample (a record holds SEQ + 1: inputs and labels)
RECORDS = 200              # the dataset: 2 shards of 100 records, 12.5 steps an epoch
GLOBAL_BATCH = 16          # samples per step, split among DP ranks
HP = {"heads": MODEL["heads"], "micro_batch": 2, "lr": 5e-3, "betas": [0.9, 0.95],
      "eps": 1e-8, "norm_eps": 1e-5, "rope_base": 10000.0}
SCHEDULE = [(2, 2, 1), (1, 2, 2), (4, 1, 1), (1, 1, 4), (2, 1, 2)]  # (tp, pp, dp)
REFERENCE = [(1, 1, 1)]
# --nodes 4: the same job on four daemons of NODE_DEVICES devices each (one etcd), its
# layouts on changing sets of nodes, (tp, pp, dp, nodes): ranks fill the devices of the
# nodes in order. The job moves off n0 (n2 joins), then off n1, grows from two nodes to
# four (eight ranks), and shrinks back to two with n3 first.
NODE_DEVICES = 2
NODE_SCHEDULE = [(2, 2, 1, ("n0", "n1")), (1, 2, 2, ("n1", "n2")), (4, 1, 1, ("n2", "n3")),
                 (2, 2, 2, ("n0", "n1", "n2", "n3")), (2, 1, 2, ("n3", "n0"))]
# Tolerance on the loss, absolute. fp32: far above what another order of the same sums
# gives (0 to 2 ulps, 1e-6, over 20 steps here; see docs/training.md), far below what a change
# of data or of state gives (0.01 and more). float64 (--dtype float64) shows that these
# differences are rounding: the same runs then agree to about 1e-15.
TOLERANCES = {"float32": 1e-5, "float64": 1e-12}
TOLERANCE = TOLERANCES["float32"]


def layout_name(layout):
    """"tp2 pp2 dp1", and " on n0,n1" for a layout that names its nodes."""
    name = "tp%d pp%d dp%d" % tuple(layout[:3])
    return name + " on " + ",".join(layout[3]) if len(layout) > 3 else name


def mounts_of(mnt_path):
    """{node id: mount path}: a job's mounts (a dict as given), or one node's ("n0")."""
    return dict(mnt_path) if isinstance(mnt_path, dict) else {"n0": mnt_path}


def hosts(mnt_path):
    """{rank: mount path of the node that hosts it}, from every node's ranks/ (each node
    shows only its own ranks), checked against the allocation of DESIGN section 2:
    ranks fill the devices of config["nodes"] in order."""
    mounts = mounts_of(mnt_path)
    out = {}
    for node, path in mounts.items():
        for r in mlfs.Mount(path).ranks():
            assert r not in out, f"rank {r} on two nodes"
            out[r] = path
    any_mnt = mlfs.Mount(next(iter(mounts.values())))
    cfg, devices = any_mnt.config(), {n["id"]: n["devices"]
                                      for n in any_mnt._json("cluster.json")["nodes"]}
    order = [n for n in cfg["nodes"] for _ in range(devices[n])]
    want = {r: order[r] for r in range(cfg["tp"] * cfg["pp"] * cfg["dp"])}
    got = {r: next(n for n, p in mounts.items() if p == path) for r, path in out.items()}
    assert got == want, f"ranks hosted {got}, not {want}"
    return out


def run_mlfs(*args):
    p = subprocess.run([MLFS, *map(str, args)], capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"mlfs {' '.join(map(str, args))}: {p.stderr.strip()}")
    return p.stdout


# --- the job: schema, dataset, initial weights --------------------------------------------

def schema(dtype="float32"):
    """The GPT's schema from `mlfs schema llama`, every state in @dtype."""
    m = MODEL
    sch = json.loads(run_mlfs("schema", "llama", "--layers", m["layers"], "--hidden", m["hidden"],
                          "--heads", m["heads"], "--kv-heads", m["kv_heads"], "--ffn", m["ffn"],
                          "--vocab", m["vocab"], "--tied", "--dtype", dtype))
    for spec in sch["states"].values():
        spec.pop("dtype", None)  # the moments as the weights (the generator says float32)
    return sch


def make_dataset(folder, seed=1):
    """A synthetic language: each token is followed by one of 3 successors (probabilities
    0.6, 0.3, 0.1), so the loss can fall from ln(200) = 5.3 towards 0.9. Two raw shards
    of int32 records of SEQ + 1 tokens, indexed by `mlfs dataset index`."""
    rng = np.random.default_rng(seed)
    v = MODEL["vocab"]
    succ = np.stack([rng.choice(v, 3, replace=False) for _ in range(v)])
    seqs = np.empty((RECORDS, SEQ + 1), np.int32)
    seqs[:, 0] = rng.integers(0, v, RECORDS)
    for i in range(1, SEQ + 1):
        pick = rng.choice(3, RECORDS, p=[0.6, 0.3, 0.1])
        seqs[:, i] = succ[seqs[:, i - 1], pick]
    os.makedirs(folder, exist_ok=True)
    half = RECORDS // 2
    seqs[:half].tofile(os.path.join(folder, "shard0.bin"))
    seqs[half:].tofile(os.path.join(folder, "shard1.bin"))
    run_mlfs("dataset", "index", folder, "--dtype", "int32", "--shape", SEQ + 1)
    return seqs


def make_checkpoint(folder, sch, seed=0):
    """Initial weights as full tensors (Megatron's init: normal(0, 0.02), output
    projections scaled by 1/sqrt(2 * layers), norms at 1), zero moments."""
    rng = np.random.default_rng(seed)
    std = 0.02
    for t in sch["tensors"]:
        if "tied" in t:
            continue  # the tied copy holds its target's data
        names = ([t["name"].replace("{L}", str(i)) for i in range(sch["num_layers"])]
                 if "{L}" in t["name"] else [t["name"]])
        for name in names:
            if name.endswith("layernorm/weight"):
                w = np.ones(t["shape"], t["dtype"])
            else:
                s = std / np.sqrt(2 * sch["num_layers"]) if name.endswith(
                    ("dense/weight", "dense_4h_to_h/weight")) else std
                w = (rng.standard_normal(t["shape"]) * s).astype(t["dtype"])
            for state in sch["states"]:
                path = os.path.join(folder, state, name + ".npy")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                np.save(path, w if state == "model" else np.zeros_like(w))


def set_up(mnt_path, work, layout, dtype="float32", extra=None):
    """A new job on an empty mount: schema, dataset, first layout, hyper-parameters
    (job/train.json) and the initial weights (mlfs import, step 0). @mnt_path: a mount,
    or {node id: mount} for a job of many nodes (@layout then (tp, pp, dp, nodes)): the
    schema and config are written on the first node and reach the others through etcd;
    job/train.json (a job/ file reaches the other nodes at a reconfiguration) and the
    import (each node fills the partitions it hosts) are done on every node. @extra:
    more keys of the first config ("elastic", ...)."""
    mounts = mounts_of(mnt_path)
    mnt = mlfs.Mount(next(iter(mounts.values())))
    sch = schema(dtype)
    data_dir = os.path.join(work, "data")
    if not os.path.exists(os.path.join(data_dir, "index.json")):
        make_dataset(data_dir)
    ckpt = os.path.join(work, "init-" + dtype)
    if not os.path.isdir(ckpt):
        make_checkpoint(ckpt, sch)
    tp, pp, dp = layout[:3]
    nodes = list(layout[3]) if len(layout) > 3 else ["n0"]
    mnt.set_up(sch, {"version": 1, "tp": tp, "pp": pp, "dp": dp, "nodes": nodes,
                     "dataset": {"index": "file://" + os.path.join(data_dir, "index.json"),
                                 "global_batch": GLOBAL_BATCH, "shuffle": False},
                     **(extra or {})})
    for path in mounts.values():
        m = mlfs.Mount(path)
        m.wait_version(1, timeout=60)
        m.job_json("train.json", HP)
        run_mlfs("import", path, "--from", ckpt, "--step", 0)
    return mnt


# --- running the workers -------------------------------------------------------------------

free_port = testing.free_port  # below the ephemeral ports: see its doc


def run_workers(mnt_path, world, steps, data="mount", timeout=300):
    """Starts train_gpt.py on ranks 0..world-1 (torchrun's environment) for @steps steps;
    returns their "@mlfs" events. @mnt_path: the mount, or {rank: mount of the node that
    hosts it} (each rank runs on its node, LOCAL_RANK its place there). A worker that
    fails stops the others (they would wait for it forever) and raises with its stderr."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    where = mnt_path if isinstance(mnt_path, dict) else dict.fromkeys(range(world), mnt_path)
    procs = []
    with tempfile.TemporaryDirectory() as logs:
        for r in range(world):
            err = open(os.path.join(logs, f"{r}.err"), "w+")
            local = sum(1 for q in range(r) if where[q] == where[r])
            p = subprocess.Popen(
                [sys.executable, os.path.join(HERE, "train_gpt.py"), "--mnt", where[r],
                 "--steps", str(steps), "--data", data],
                env=dict(env, RANK=str(r), LOCAL_RANK=str(local)),
                stdout=subprocess.PIPE, stderr=err, text=True)
            procs.append((p, err))
        deadline = time.monotonic() + timeout
        failed = None
        while any(p.poll() is None for p, _ in procs):
            bad = [(r, p) for r, (p, _) in enumerate(procs) if p.poll() not in (None, 0)]
            if bad or time.monotonic() > deadline:
                failed = bad[0][0] if bad else None
                for p, _ in procs:
                    if p.poll() is None:
                        p.kill()
                break
            time.sleep(0.05)
        events = []
        for r, (p, err) in enumerate(procs):
            out = p.communicate()[0]
            events += [json.loads(line[6:]) for line in out.splitlines()
                       if line.startswith("@mlfs ")]
            if p.returncode and failed is None:
                failed = r
        if failed is not None or any(p.returncode for p, _ in procs):
            err = procs[failed or 0][1]
            err.seek(0)
            raise RuntimeError(f"rank {failed} of {world} failed:\n{err.read()[-3000:]}")
    return events


def mib(n):
    return f"{n / 2**20:.2f} MiB"


def plan(mnt, new):
    """`mlfs plan --json` of the change from @mnt's config to @new (its cluster.json)."""
    with tempfile.TemporaryDirectory() as d:
        files = {}
        for name, obj in (("schema", mnt.schema()), ("from", mnt.config()), ("to", new),
                          ("cluster", mnt._json("cluster.json"))):
            files[name] = os.path.join(d, name + ".json")
            with open(files[name], "w") as f:
                json.dump(obj, f)
        return json.loads(run_mlfs("plan", "--schema", files["schema"], "--from", files["from"],
                               "--to", files["to"], "--cluster", files["cluster"], "--json"))


def reconfigure(mnt_path, layout, on):
    """Writes the config of @layout on node @on (the coordinator); waits until every node
    of the job has the new version. Returns ({node: status.json's "last"} of the nodes
    that report this change, `mlfs plan --json` of it)."""
    mounts = mounts_of(mnt_path)
    changes = dict(zip(("tp", "pp", "dp"), layout[:3]))
    if len(layout) > 3:
        changes["nodes"] = list(layout[3])
    coord = mlfs.Mount(mounts[on])
    cfg = coord.config()
    planned = plan(coord, dict(cfg, **changes, version=cfg["version"] + 1))
    last = coord.reconfigure(changes)
    v = last["to_version"]
    figures = {on: last}
    for node, path in mounts.items():
        got = mlfs.Mount(path).wait_version(v, timeout=120)
        if got and got["to_version"] == v:
            figures[node] = got
    return {n: figures[n] for n in mounts if n in figures}, planned


def train_run(mnt_path, schedule, steps_per_layout, data="mount", say=print, label=""):
    """Trains @steps_per_layout steps in each layout of @schedule, reconfiguring the mount
    between them. @mnt_path: one mount, or {node id: mount} for a job of many nodes, whose
    layouts are then (tp, pp, dp, nodes): each change is written on another node in turn
    (version v to v + 1 on node v modulo the nodes), each rank runs with the mount of its
    node. Returns {"loss": {step: loss}, "ids": {step:
    global batch ids}, "tokens_sum": {step: sum of the tokens of that batch, to check them
    against the ids}, "changes": [{"step", "frm", "to", "on", "nodes": {node: figures},
    figures summed...}], "times": [...]}."""
    mounts = mounts_of(mnt_path)
    ids = list(mounts)
    res = {"loss": {}, "ids": {}, "tokens_sum": {}, "changes": [], "times": []}
    for k, layout in enumerate(schedule):
        tp, pp, dp = layout[:3]
        where = hosts(mnt_path)
        cfg = mlfs.Mount(where[0]).config()
        old = (cfg["tp"], cfg["pp"], cfg["dp"]) + ((tuple(cfg["nodes"]),) if len(layout) > 3
                                                   else ())
        if old != tuple(layout):
            step = mlfs.Mount(where[0]).rank(0).saved_step()
            on = ids[cfg["version"] % len(ids)]  # version 1 -> 2 on n1, then n2, ...
            t = time.monotonic()
            figures, planned = reconfigure(mnt_path, layout, on)
            wall = time.monotonic() - t
            total = {key: sum(f[key] for f in figures.values())
                     for key in ("bytes_reused", "bytes_copied", "bytes_zeroed",
                                 "bytes_fetched", "bytes_served")}
            res["changes"].append(dict(figures[on], **total, step=step, frm=old, to=tuple(layout),
                                       on=on, nodes=figures, wall_s=wall,
                                       plan_network=planned["bytes_network"],
                                       lower_bound_network=planned["lower_bound_network"],
                                       seconds=max(f["seconds"] for f in figures.values())))
            v = figures[on]["to_version"]
            if len(ids) == 1:
                last = figures[on]
                say(f"{label}-- step {step}: config.json version {v}: "
                    f"{layout_name(old)} -> {layout_name(layout)}: "
                    f"{last['bytes_reused']} bytes reused, {last['bytes_copied']} copied, "
                    f"{last['bytes_zeroed']} zeroed in {last['seconds'] * 1e3:.1f} ms "
                    f"({wall * 1e3:.0f} ms with the wait)")
            else:
                say(f"{label}-- step {step}: config.json version {v} written on {on}: "
                    f"{layout_name(old)} -> {layout_name(layout)} in "
                    f"{wall * 1e3:.0f} ms (every node swapped)")
                say(f"{label}   node    fetched     served     copied     reused     zeroed"
                    f"   seconds")
                for n, f in list(figures.items()) + [("all", dict(total, seconds=None))]:
                    say(f"{label}   {n:<4}" + "".join(
                        f"{f[key]:>11}" for key in ("bytes_fetched", "bytes_served",
                                                    "bytes_copied", "bytes_reused",
                                                    "bytes_zeroed"))
                        + (f"{f['seconds']:>10.3f}" if f["seconds"] is not None else ""))
                say(f"{label}   network: {total['bytes_fetched']} bytes fetched, "
                    f"{total['bytes_served']} served; mlfs plan: {planned['bytes_network']}, "
                    f"lower bound {planned['lower_bound_network']}")
            where = hosts(mnt_path)
        t = time.monotonic()
        events = run_workers(where if len(ids) > 1 else where[0], tp * pp * dp,
                             steps_per_layout, data)
        wall = time.monotonic() - t
        by_step = {}
        for e in events:
            if e["kind"] == "loss":
                res["loss"][e["step"]] = e["loss"]
            elif e["kind"] == "ids":
                by_step.setdefault(e["step"], {})[e["d"]] = e
            elif e["kind"] == "time":
                res["times"].append(dict(e, layout=layout, wall_s=wall))
                tm = e
        for s, parts in sorted(by_step.items()):
            assert sorted(parts) == list(range(dp)), f"step {s}: DP ranks {sorted(parts)}"
            res["ids"][s] = [i for d in range(dp) for i in parts[d]["ids"]]
            res["tokens_sum"][s] = sum(parts[d]["tokens_sum"] for d in range(dp))
        steps = sorted(by_step)
        say(f"{label}{layout_name(layout)}: {tp * pp * dp} workers, steps {steps[0]}-{steps[-1]}: "
            + " ".join(f"{res['loss'][s]:.4f}" for s in steps)
            + f"   ({wall:.1f} s: start {tm['init_s']:.1f}, load {tm['load_s']:.2f}, "
              f"train {tm['train_s']:.2f}, save {tm['save_s']:.2f})")
    return res


# --- the proof ---------------------------------------------------------------------------

def exactly_once(ids_by_step, n_records):
    """Checks that the samples of the steps, in order, hold every record once per epoch:
    returns (epochs complete, samples); AssertionError if a record repeats in an epoch
    or a complete epoch misses one."""
    stream = np.concatenate([ids_by_step[s] for s in sorted(ids_by_step)])
    assert sorted(ids_by_step) == list(range(len(ids_by_step))), "steps missing"
    for e in range(0, len(stream), n_records):
        epoch = stream[e:e + n_records]
        assert len(np.unique(epoch)) == len(epoch), \
            f"epoch {e // n_records}: {len(epoch) - len(np.unique(epoch))} samples repeated"
        if len(epoch) == n_records:
            assert np.array_equal(np.sort(epoch), np.arange(n_records)), \
                f"epoch {e // n_records} misses records"
    return len(stream) // n_records, len(stream)


def max_loss_diff(a, b):
    steps = sorted(a)
    assert steps == sorted(b), "the runs trained different steps"
    return max(abs(a[s] - b[s]) for s in steps)


def full_state(mnt_path):
    """Every state's full tensors, assembled by the mount (full/<state>/<name>.npy)."""
    out, root = {}, os.path.join(mnt_path, "full")
    for d, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".npy"):
                continue  # full/<state>.safetensors: the same state, another format
            path = os.path.join(d, f)
            out[os.path.relpath(path, root)[:-4]] = mlfs.read_npy(path)
    return out


def state_diff(a, b):
    """Largest |a - b| relative to max |b| over the tensors of two full states."""
    return max(float(np.abs(a[k] - b[k]).max() / max(np.abs(b[k]).max(), 1e-30)) for k in b)


def plot(path, runs, changes, tolerance=TOLERANCE):
    """Loss per step of the runs (top) and their distance to the reference (bottom, log
    scale; bitwise equal steps at the bottom line), the layout changes marked."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, dx) = plt.subplots(2, 1, figsize=(7.5, 6), sharex=True,
                                 gridspec_kw={"height_ratios": [3, 2]})
    ref = runs["reference"]["loss"]
    steps = sorted(ref)
    many = bool(changes) and len(changes[0]["to"]) > 3
    style = {"reference": dict(color="black", lw=2, label="reference: tp1 pp1 dp1, never changed"),
             "elastic": dict(color="tab:blue", ls="none", marker="o", ms=5,
                             label=f"elastic on mlfs: {len(changes)} layout changes"
                             + (" across nodes" if many else "")),
             "restart": dict(color="tab:red", ls="--", marker="x", ms=5,
                             label="elastic, data restarted at each change")}
    floor = tolerance / 1000
    for name, r in runs.items():
        ax.plot(steps, [r["loss"][s] for s in steps], **style[name])
        if name != "reference":
            dx.semilogy(steps, [max(abs(r["loss"][s] - ref[s]), floor) for s in steps],
                        **style[name])
    dx.axhline(tolerance, color="gray", lw=1, ls=":")
    dx.text(steps[0], tolerance * 1.6, f"tolerance {tolerance:g}", color="gray", fontsize=8)
    ticks = [floor] + [10.0 ** e for e in range(int(np.log10(floor)) + 2, 1, 2)]
    dx.set_yticks(ticks)
    dx.set_yticklabels(["equal"] + [f"{t:g}" for t in ticks[1:]])
    lo, hi = min(min(r["loss"].values()) for r in runs.values()), max(ref.values())
    ax.set_ylim(lo - 0.1, hi + (0.95 if many else 0.55))
    marks = [(steps[0] - 0.5, changes[0]["frm"])] if changes else []
    marks += [(c["step"] - 0.5, c["to"]) for c in changes]
    for x, layout in marks:
        for a in (ax, dx):
            a.axvline(x, color="tab:green", lw=1, alpha=0.6)
        ax.text(x + 0.15, hi + (0.9 if many else 0.5),
                layout_name(layout).replace(" on ", "\n").replace(" ", "\n"),
                fontsize=7,
                color="tab:green", va="top")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title("A GPT on mlfs changes tp, pp and dp" + (" and nodes" if many else "")
                 + " (green lines) and keeps its loss curve", fontsize=10)
    dx.set_ylabel("|loss - reference|")
    dx.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    try:  # a palette of 64 colours: a third of the size, nothing visible lost
        from PIL import Image
        Image.open(path).convert("RGB").quantize(64).save(path, optimize=True)
    except ImportError:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps-per-layout", type=int, default=4)
    ap.add_argument("--dtype", choices=sorted(TOLERANCES), default="float32",
                    help="of the weights and moments (float64: to see that the fp32 "
                         "differences are rounding)")
    ap.add_argument("--nodes", type=int, choices=(1, 4), default=1,
                    help="4: the elastic run on four daemons of this machine (one etcd, "
                         f"{NODE_DEVICES} devices each), its layouts on changing sets of nodes; "
                         "the reference on one node; no restart run")
    ap.add_argument("--out", default=os.path.join(ROOT, BUILD, "training"),
                    help="where to write loss.png and runs.json")
    args = ap.parse_args()
    n = args.steps_per_layout
    many = args.nodes > 1
    schedule = NODE_SCHEDULE if many else SCHEDULE
    total = n * len(schedule)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.monotonic()
    runs, final = {}, {}
    jobs = [("elastic", schedule, n, "mount"), ("reference", REFERENCE, total, "mount")]
    if not many:
        jobs.append(("restart", SCHEDULE, n, "restart"))
    with tempfile.TemporaryDirectory() as tmp:
        work = os.path.join(tmp, "work")
        m = MODEL
        print(f"GPT: {m['layers']} layers, hidden {m['hidden']}, {m['heads']} heads "
              f"({m['kv_heads']} KV), SwiGLU {m['ffn']}, vocab {m['vocab']}, tied embedding; "
              f"{RECORDS} samples of {SEQ} tokens, global batch {GLOBAL_BATCH}, "
              f"micro-batch {HP['micro_batch']}, Adam lr {HP['lr']}, {args.dtype}")
        for name, sched, per, data in jobs:
            print(f"\n== {name}: " + " -> ".join(layout_name(x) for x in sched)
                  + f", {per} steps each")
            nodes, devices = (args.nodes, NODE_DEVICES) if len(sched[0]) > 3 else (1, 4)
            with testing.start(nodes, devices, job=f"elastic-{name}",
                               tmp=os.path.join(tmp, name), mlfs=MLFS) as where:
                if nodes > 1:
                    print(f"{args.nodes} nodes on this machine ({', '.join(where.mounts)}; "
                          f"{NODE_DEVICES} devices each), etcd at {where.etcd_url}")
                    mnt = where.mounts
                else:
                    mnt = where.mounts["n0"]
                set_up(mnt, work, sched[0], args.dtype)
                t = time.monotonic()
                runs[name] = train_run(mnt, sched, per, data)
                runs[name]["seconds"] = time.monotonic() - t
                if isinstance(mnt, dict):  # read on a node that hosts none of the ranks
                    idle = [i for i, p in mnt.items() if not mlfs.Mount(p).ranks()]
                    runs[name]["full_on"] = full_on = (idle or list(mnt))[0]
                    final[name] = full_state(mnt[full_on])
                else:
                    final[name] = full_state(mnt)
            print(f"({runs[name]['seconds']:.1f} s)")

    el, ref = runs["elastic"], runs["reference"]
    d_el = max_loss_diff(el["loss"], ref["loss"])
    p_el = state_diff(final["elastic"], final["reference"])
    epochs, samples = exactly_once(el["ids"], RECORDS)
    same_order = all(el["ids"][s] == ref["ids"][s] for s in ref["ids"])
    if not many:
        rs = runs["restart"]
        d_rs = max_loss_diff(rs["loss"], ref["loss"])
        p_rs = state_diff(final["restart"], final["reference"])
        rs_stream = np.concatenate([rs["ids"][s] for s in sorted(rs["ids"])])
        rs_distinct = len(np.unique(rs_stream))
        try:
            exactly_once(rs["ids"], RECORDS)
            rs_once = "each once"
        except AssertionError as e:
            rs_once = str(e)
    with open(os.path.join(args.out, "runs.json"), "w") as f:
        json.dump({k: {"loss": v["loss"], "changes": [dict(c, frm=list(c["frm"]), to=list(c["to"]))
                                                      for c in v["changes"]],
                       "times": v["times"], "seconds": v["seconds"]} for k, v in runs.items()},
                  f, indent=1)
    png = os.path.join(args.out, "loss.png")
    tol = TOLERANCES[args.dtype]
    plot(png, runs, el["changes"], tol)

    ok = d_el <= tol and same_order and (many or d_rs > 100 * tol)
    lay = " -> ".join(layout_name(x) for x in schedule)
    reconf_ms = sum(c["seconds"] for c in el["changes"]) * 1e3
    moved = sum(c["bytes_copied"] for c in el["changes"])
    fetched = sum(c["bytes_fetched"] for c in el["changes"])
    reused = sum(c["bytes_reused"] for c in el["changes"])
    starts = [t["init_s"] for t in el["times"]]
    epochs_said = (f"{epochs} epoch{'s' if epochs > 1 else ''} of {RECORDS} records and "
                   f"{samples - epochs * RECORDS} more" if epochs else f"of {RECORDS} records")
    if many:
        nsets = " -> ".join(str(len(x[3])) for x in schedule)
        waits = [c["wall_s"] * 1e3 for c in el["changes"]]
        print(f"""
== what happened
The elastic run trained {total} steps in {len(schedule)} layouts on {args.nodes} nodes (mlfs daemons
on this machine, one etcd, {NODE_DEVICES} devices each; nodes per layout {nsets}):
  {lay}.
At each change, every worker saved its partitions (model and both Adam moments) and its
step to the mount of its node and exited; the driver wrote a new config.json on one node;
every node of the old and new layouts planned the change, fetched from its peers what it
lacked, re-sliced the rest locally, and one etcd transaction made the new layout current
everywhere ({len(el["changes"])} changes: {fetched / 2**20:.1f} MiB fetched over the network, \
{moved / 2**20:.1f} MiB copied
locally, {reused / 2**20:.2f} MiB reused; {reconf_ms:.0f} ms of work on the nodes in all). New \
workers, each
on the mount of the node that hosts its rank, read their ranks' files and data views and
trained on. Starting the workers took {min(starts):.1f} to {max(starts):.1f} s; each change, from \
writing
config.json until every node had swapped, {min(waits):.0f} to {max(waits):.0f} ms.
- Loss: equal to the run that never changed layout (tp1 pp1 dp1 on one node) at every
  step, within {d_el:.1e} ({args.dtype}; tolerance {tol:g}).
- State after step {total - 1}, read on {el["full_on"]} (which hosts no rank: full/ assembles every
  tensor from the other nodes): parameters and moments within {p_el:.1e} of it (relative).
- Data: {samples} samples ({epochs_said}), each node's ranks reading
  their own views: every record once per epoch, in the order of the reference
  ({'the same' if same_order else 'NOT the same'} batch at every step).
Plot: {png} ({time.monotonic() - t0:.0f} s in all)
{"OK" if ok else "FAILED"}""")
        return 0 if ok else 1
    print(f"""
== what happened
The elastic run trained {total} steps in five layouts: {lay}.
At each change, every worker saved its partitions (model and both Adam moments) and its
step to the mount and exited; the driver wrote a new config.json; mlfs re-sliced the
state for the new layout (4 changes: {moved / 2**20:.1f} MiB copied in {reconf_ms:.0f} ms in all);
new workers read their new ranks' files and data views and trained on. Starting the
workers (Python, PyTorch, gloo) took {min(starts):.1f} to {max(starts):.1f} s; the change itself, milliseconds.
- Loss: equal to the run that never changed layout at every step, within {d_el:.1e}
  ({args.dtype}; tolerance {tol:g}). Not bitwise: a different tp or dp sums the same
  numbers in another order, and each order rounds differently.
- State after step {total - 1}: parameters and moments within {p_el:.1e} of it (relative).
- Data: {samples} samples ({epochs_said}): every record once per epoch, in the
  order of the reference ({'the same' if same_order else 'NOT the same'} batch at every step).
- A loader that restarts its data at each change saw {rs_distinct} distinct records in
  {len(rs_stream)} samples ({rs_once}). Its loss is up to {d_rs:.2f} away from
  the reference's, lower because it sees the same records again: it is another training
  run (final state {p_rs:.1e} away).
Plot: {png} ({time.monotonic() - t0:.0f} s in all)
{"OK" if ok else "FAILED"}""")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
