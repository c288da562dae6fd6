#!/usr/bin/python3
"""Elastic without a human: the GPT of examples/train_gpt.py trains on four daemons
(one etcd, one device each) with "elastic" in its config; a node is killed with
kill -9 in the middle of a step, the job chooses a new layout on the survivors by
itself and trains on; the node comes back, and the job grows onto it by itself.

    BUILD=build /usr/bin/python3 examples/elastic_auto.py [--steps 24] [--out build/elastic-auto]

Nobody writes a config after the first: the daemons' controller (an etcd election)
proposes each change, served from the DP replicas of the dead node's state, and one
mlfs.elastic agent per node restarts that node's workers in each new layout. The
loss must match a run that never changed (tp1 pp1 dp1 on one node, the same
steps) within the tolerance of examples/elastic_train.py, every sample must be
read once per epoch, and the steps trained twice (after the last save before the
death) must give the same losses. Prints the time from the death (and from the
return) to the first step in the new layout, split into detection (the lease),
decision, reconfiguration and the workers' restart, and plots the loss with each
automatic change marked.

The functions (run_elastic, ...) are what tests/e2e/test_training.py runs.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import elastic_train as et  # noqa: E402  (puts the mlfs package on sys.path)

from mlfs import testing  # noqa: E402

NODES = ["n0", "n1", "n2", "n3"]
FIRST = (1, 1, 4)     # the person's first layout: a DP replica of everything on every node
SAVE_EVERY = 2        # steps between saves: a death loses at most this many steps
VICTIM = "n3"         # killed (or the next one, if it is the controller)
# The controller's bounds, and the workers' micro-batch: it proposes only DP degrees
# that split the global batch into whole micro-batches.
ELASTIC = {"min_nodes": 2, "max_nodes": len(NODES), "policy": "auto",
           "micro_batch": et.HP["micro_batch"]}


class Node:
    """One node's agent (python3 -m mlfs.elastic) and the events of its stdout."""

    def __init__(self, node_id, mnt, steps, port, events, lock):
        self.id, self.mnt = node_id, mnt
        argv = [sys.executable, "-m", "mlfs.elastic", "--mnt", mnt, "--master-port",
                str(port), "--relayout-timeout", "120", "--",
                sys.executable, os.path.join(HERE, "train_gpt.py"), "--mnt", mnt,
                "--until", str(steps), "--save-every", str(SAVE_EVERY)]
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.path.join(et.ROOT, "python"))
        self.err = open(os.path.join(os.path.dirname(mnt), f"agent-{node_id}.err"), "w+")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env=env, start_new_session=True)
        self.events, self.lock = events, lock
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self):
        for line in self.proc.stdout:
            if line.startswith("@mlfs "):
                e = dict(json.loads(line[6:]), at=time.time(), node=self.id)
                with self.lock:
                    self.events.append(e)

    def kill(self):
        """kill -9 of the agent and its workers (its process group), and a wait until
        every one of them is gone: a worker still exiting keeps files of the mount
        open, and the mount busy."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.reader.join(5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)  # a member left (a worker, reparented)
            except ProcessLookupError:
                break
            time.sleep(0.05)

    def stderr(self):
        self.err.seek(0)
        return self.err.read()[-3000:]


def master_port_base(versions=8):
    """A base for MASTER_PORT (plus the version: 1 to @versions here) whose every port is
    free now: the daemons' and etcd's ports, chosen before, are not among them."""
    import socket
    while True:
        base = testing.free_port()
        try:
            for p in range(base, base + versions + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue


def watch_versions(cl, live, stop, seen):
    """Records {version: wall time when every live node was idle at it} until @stop."""
    while not stop.is_set():
        try:
            sts = {i: cl.status(i) for i in list(live)}
            vs = {s["version"] for s in sts.values()}
            if len(vs) == 1 and all(s["state"] == "idle" for s in sts.values()):
                v = vs.pop()
                seen.setdefault(v, time.time())
        except (OSError, ValueError, KeyError, AssertionError):  # a node killed under the read
            pass
        time.sleep(0.02)


def controller_status(cl, live):
    for i in live:
        try:
            el = cl.status(i).get("elastic") or {}
        except (OSError, AssertionError):  # a node killed under the read
            continue
        if el.get("this_node"):
            return i, el
    return None, {}


def wait(what, fn, timeout, nodes=()):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        for n in nodes:
            if n.proc.poll() not in (None, 0):
                raise RuntimeError(f"the agent of {n.id} exited {n.proc.returncode} while "
                                   f"waiting for {what}:\n{n.stderr()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def run_elastic(tmp, steps, say=print):
    """The four-node run; returns {"loss", "ids", "tokens_sum", "redone", "changes"}.
    "changes": per automatic change {"step", "frm", "to", "why", "timeline": {...}}."""
    work = os.path.join(tmp, "work")
    events, lock = [], threading.Lock()
    res = {"loss": {}, "ids": {}, "tokens_sum": {}, "redone": {}, "changes": []}
    with testing.start(len(NODES), devices=1, job="auto", tmp=os.path.join(tmp, "cl")) as cl:
        layout = FIRST + (tuple(NODES),)
        mounts = dict(cl.mounts)
        et.set_up(mounts, work, layout, extra={"elastic": ELASTIC})
        first = cl.client("n0")
        say(f"-- version 1: {et.layout_name(layout)}, elastic {json.dumps(ELASTIC)}")
        port = master_port_base()  # MASTER_PORT's base (plus the version): every node's
        agents = {i: Node(i, mounts[i], steps, port, events, lock) for i in NODES}
        live = list(NODES)
        stop, seen = threading.Event(), {}
        watcher = threading.Thread(target=watch_versions, args=(cl, live, stop, seen), daemon=True)
        watcher.start()
        try:
            def losses():
                with lock:
                    return [e for e in events if e.get("kind") == "loss"]

            # 1. In the middle of a step after the third save: kill -9 of a node that is
            # not the controller (the controller's death works too: test_elastic.py).
            boss = wait("a controller", lambda: controller_status(cl, NODES)[0], 60,
                        agents.values())
            victim = VICTIM if VICTIM != boss else next(n for n in reversed(NODES) if n != boss)
            kill_after = 3 * SAVE_EVERY  # the step whose loss we wait for
            wait(f"step {kill_after}", lambda: any(e["step"] >= kill_after for e in losses()),
                 300, agents.values())

            live.remove(victim)
            t_kill = time.time()
            agents[victim].kill()
            cl.kill(victim)
            v_before = first.config()["version"]
            say(f"-- kill -9 of {victim} (daemon, agent, worker) at step {kill_after + 1}")
            res["changes"].append(change(cl, live, seen, events, lock, v_before, t_kill,
                                         "death", victim, agents, say))

            # 2. A save later it comes back, empty: the job grows onto it by itself.
            back_after = res["changes"][-1]["step"] + SAVE_EVERY
            wait(f"step {back_after}", lambda: any(e["step"] >= back_after for e in losses()),
                 300, [agents[i] for i in live])
            v_before = first.config()["version"]
            t_back = time.time()
            cl.restart(victim)
            live.append(victim)
            agents[victim] = Node(victim, mounts[victim], steps, port, events, lock)
            say(f"-- {victim} restarted (empty) at step {back_after + 1}")
            res["changes"].append(change(cl, live, seen, events, lock, v_before, t_back,
                                         "join", victim, agents, say))

            # 3. To the end.
            for n in agents.values():
                if n.proc.poll() is None and n.id in live:
                    try:
                        n.proc.wait(timeout=600)
                    except subprocess.TimeoutExpired:
                        raise RuntimeError(f"the agent of {n.id} did not finish")
                if n.id in live and n.proc.returncode:
                    raise RuntimeError(f"the agent of {n.id} exited {n.proc.returncode}:\n"
                                       f"{n.stderr()}")
        except RuntimeError as e:
            sts = {}
            for i in live:
                try:
                    sts[i] = cl.status(i)
                except (OSError, AssertionError) as err:
                    sts[i] = str(err)
            raise RuntimeError(f"{e}\nstatus.json: {json.dumps(sts)}\n{cl.describe()}") from e
        finally:
            stop.set()
            for n in agents.values():  # an agent that ended may leave a worker exiting
                n.kill()
        st = first.status()
        assert st["state"] == "idle", st
        if st["error"] is not None:
            # A save that raced a reconfiguration is refused, by design: its worker
            # reports a relayout, exits, and the agent starts it again in the new
            # layout. The daemon keeps that refusal as its last error; any other
            # error is one.
            with lock:
                relayouts = [e for e in events if e.get("kind") == "relayout"]
            assert "the layout changed while the file was open" in st["error"] and relayouts, st
        res["final_steps"] = {r: first.rank(r).saved_step() for r in first.ranks()}
    with lock:
        evs = list(events)
    for e in evs:
        if e.get("kind") == "loss":
            if e["step"] in res["loss"]:
                res["redone"][e["step"]] = (res["loss"][e["step"]], e["loss"])
            res["loss"][e["step"]] = e["loss"]
    last = {}  # {step: (version, {d: event})}: the last layout that trained the step
    for e in evs:
        if e.get("kind") == "ids":
            v, parts = last.get(e["step"], (e["version"], {}))
            if e["version"] > v:
                v, parts = e["version"], {}  # trained again in a later layout: that counts
            if e["version"] == v:
                parts[e["d"]] = e
            last[e["step"]] = (v, parts)
    by_step = {s: parts for s, (_, parts) in last.items()}
    for s, parts in sorted(by_step.items()):
        res["ids"][s] = [i for d in sorted(parts) for i in parts[d]["ids"]]
        res["tokens_sum"][s] = sum(p["tokens_sum"] for p in parts.values())
    res["events"] = evs
    return res


def change(cl, live, seen, events, lock, v_before, t0, what, victim, agents, say):
    """Waits for the automatic change after a death or a return at @t0 and the first
    step trained in its layout; its timeline."""
    v = v_before + 1
    running = [agents[i] for i in live if i in agents]
    at = wait(f"version {v} on {live}", lambda: seen.get(v), 180, running)
    boss, el = controller_status(cl, live)
    cfg = cl.client(live[0]).config()

    def first_step():
        with lock:
            got = [e for e in events if e.get("kind") == "loss" and e.get("version") == v]
        return min(got, key=lambda e: e["t"]) if got else None
    step = wait(f"a step in version {v}", first_step, 300, running)
    with lock:
        starts = [e for e in events if e.get("kind") == "agent" and e.get("event") == "start"
                  and e.get("version") == v]
    tl = {"detection_s": el["seen_at"] - t0, "decision_s": el["proposed_at"] - el["seen_at"],
          "reconfiguration_s": at - el["proposed_at"],
          "restart_s": step["t"] - at, "total_s": step["t"] - t0,
          "workers_started_s": (min(e["t"] for e in starts) - at) if starts else None}
    layout = (cfg["tp"], cfg["pp"], cfg["dp"], tuple(cfg["nodes"]))
    say(f"-- version {v} by the controller ({boss}): {et.layout_name(layout)}; "
        f"first step {step['step']} in it")
    say(f"   why: {el.get('why')}")
    say(f"   {what} to first step: {tl['total_s']:.2f} s = detection {tl['detection_s']:.2f} + "
        f"decision {tl['decision_s']:.2f} + reconfiguration {tl['reconfiguration_s']:.2f} + "
        f"workers' restart {tl['restart_s']:.2f}")
    return {"step": step["step"], "version": v, "to": layout, "what": what, "node": victim,
            "why": el.get("why"), "timeline": tl}


def run_reference(tmp, steps, say=print):
    """tp1 pp1 dp1 on one node for @steps steps, never stopped."""
    with testing.start(1, devices=1, job="ref", tmp=os.path.join(tmp, "ref")) as cl:
        mnt = cl.mounts["n0"]
        et.set_up(mnt, os.path.join(tmp, "work"), et.REFERENCE[0])
        return et.train_run(mnt, et.REFERENCE, steps, say=say, label="reference: ")


def check(res, ref, steps):
    """The proof: same loss as the reference, every record once per epoch, the redone
    steps equal. Returns (max loss difference, epochs, samples)."""
    assert sorted(res["loss"]) == list(range(steps)), sorted(res["loss"])
    assert set(res["final_steps"].values()) == {steps}, res["final_steps"]
    diff = et.max_loss_diff(res["loss"], ref["loss"])
    assert diff <= et.TOLERANCE, (
        f"loss differs from the reference by {diff}: step, elastic, reference: "
        + "; ".join(f"{s} {res['loss'][s]:.6f} {ref['loss'][s]:.6f}" for s in sorted(ref["loss"]))
        + f"; redone {res['redone']}")
    for s, (a, b) in res["redone"].items():
        assert abs(a - b) <= et.TOLERANCE, f"step {s} trained twice: {a} then {b}"
    bad = [s for s in ref["ids"] if res["ids"].get(s) != list(map(int, ref["ids"][s]))]
    assert not bad, (f"the samples of step {bad[0]} differ from the reference's: "
                     f"{res['ids'].get(bad[0])} vs {ref['ids'][bad[0]]}")
    epochs, samples = et.exactly_once(res["ids"], et.RECORDS)
    return diff, epochs, samples


def plot(path, res, ref):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = sorted(ref["loss"])
    fig, ax = plt.subplots(figsize=(7.5, 4))
    ax.plot(steps, [ref["loss"][s] for s in steps], color="black", lw=2,
            label="reference: tp1 pp1 dp1, never changed")
    ax.plot(steps, [res["loss"][s] for s in steps], color="tab:blue", ls="none", marker="o",
            ms=5, label="elastic: the controller chose every change")
    hi = max(ref["loss"].values())
    for c in res["changes"]:
        x = c["step"] - 0.5
        ax.axvline(x, color="tab:red" if c["what"] == "death" else "tab:green", lw=1)
        ax.text(x + 0.15, hi, f"{c['node']} {'killed' if c['what'] == 'death' else 'back'}:\n"
                + et.layout_name(c["to"][:3]) + f"\non {len(c['to'][3])} nodes\n"
                f"{c['timeline']['total_s']:.1f} s to the next step", fontsize=7, va="top")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title("kill -9 of a node, then its return: the job relays itself out", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--out", default=os.path.join(et.ROOT, et.BUILD, "elastic-auto"))
    ap.add_argument("--keep", metavar="DIR", help="work in DIR (kept: logs, agents' stderr)")
    a = ap.parse_args()
    import tempfile
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mlfs-auto-") as tmp:
        tmp = a.keep or tmp
        ref = run_reference(tmp, a.steps, say=lambda line: None)
        res = run_elastic(tmp, a.steps)
    diff, epochs, samples = check(res, ref, a.steps)
    print("loss: " + " ".join(f"{res['loss'][s]:.4f}" for s in sorted(res["loss"])))
    print(f"the same as the run that never changed: largest difference {diff:.2e} "
          f"(tolerance {et.TOLERANCE:g}); {len(res['redone'])} steps trained twice, equal; "
          f"{samples} samples, each record once per epoch ({epochs} epochs complete)")
    path = os.path.join(a.out, "elastic-auto.png")
    plot(path, res, ref)
    with open(os.path.join(a.out, "elastic-auto.json"), "w") as f:
        json.dump({k: res[k] for k in ("loss", "changes", "redone")}, f, indent=1,
                  default=list)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
