"""mlfs.elastic: training that follows the layout of its mount.

With "elastic" in the job's config, the daemons choose a new layout by themselves
when a node dies or joins (docs/many-nodes.md, "The elastic controller"). This
module is the training side of that: one agent per node, as torchrun's elastic
agent, runs the workers of the ranks its node hosts, in the committed layout,
and starts them again in the next one:

    agent = mlfs.elastic.Agent("/mnt/mlfs", ["python3", "train.py", "--until", "1000"])
    agent.run()          # returns when the workers finished (exit 0)

and a worker, after each save:

    me.save(model, optimizer, step)                  # every partition, then `step`
    if mlfs.elastic.layout_changed(mnt, version):    # a new layout is coming or came
        sys.exit(mlfs.elastic.EXIT_RELAYOUT)         # the agent restarts us in it

The agent (Agent.run):
  1. waits until its node is idle at a committed version whose layout gives it
     ranks (a node left out waits: a later layout may place it);
  2. starts one worker per rank of its node with torchrun's environment (RANK,
     LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR: the host of the node of
     rank 0, from cluster.json; MASTER_PORT: master_port + the version modulo 1000,
     the same on every node, another at every version) and MLFS_MOUNT, MLFS_VERSION;
  3. when the workers exit 0, the training is over; when one exits with
     EXIT_RELAYOUT (it saw the layout change after a save, or its save was refused
     because the layout changed: mlfs.MlfsError with errno ESTALE), or fails (a peer
     died: its collectives fail), it stops the others on its node and goes back to
     1 for a version newer than the one they ran in (the others get a grace period
     to end by themselves first: one in the middle of its save finishes it). A
     failure with no new layout
     within @relayout_timeout seconds ends run() with an error: the agent does not
     restart workers in the layout they failed in (a bug would loop).

The global batch is the config's (dataset.global_batch) in every layout; a worker
keeps it by accumulating gradients over more micro-batches when dp shrinks
(batch_plan), as the Tenplex paper asks for hyper-parameter consistency, so the
learning-rate schedule and the loss curve do not change with the layout. The
controller proposes only DP degrees that split the global batch into whole
micro-batches of the config's elastic.micro_batch.

Events: the agent prints one line per event on its stdout, "@mlfs " and JSON
({"kind": "agent", "event": "start" | "stop" | "done", "node", "version", "ranks",
"t": wall clock, ...}), the workers' stdout being the same file, so a driver reads
one stream per node.
"""
import errno
import json
import os
import signal
import subprocess
import sys
import time

from .client import MlfsError, Mount

EXIT_RELAYOUT = 75  # os.EX_TEMPFAIL: "start me again in the new layout"


def batch_plan(config, micro_batch, dp):
    """(local_batch, micro_batches): a DP rank's share of the config's global batch
    and the micro-batches of @micro_batch samples it accumulates per step. MlfsError
    when dp does not split the global batch into whole micro-batches."""
    gb = int(config["dataset"]["global_batch"])
    if gb % dp or (gb // dp) % micro_batch:
        raise MlfsError(f"global batch {gb} over dp {dp} is not whole micro-batches of "
                        f"{micro_batch} samples (set elastic.micro_batch in the config so "
                        "that the controller proposes only DP degrees that divide it)")
    return gb // dp, gb // dp // micro_batch


def layout_changed(mount, version):
    """Whether @mount's layout is no longer version @version, or is about to change (a
    reconfiguration in progress): a worker that saved should stop and be restarted
    in the new layout."""
    s = Mount(mount).status() if not isinstance(mount, Mount) else mount.status()
    return s.get("version") != version or s.get("state") not in ("idle", "failed")


def stale(e):
    """Whether exception @e is a save refused because the layout changed under it."""
    return isinstance(e, MlfsError) and e.errno == errno.ESTALE


class AgentError(MlfsError):
    pass


class Agent:
    """The workers of one node's ranks, in the mount's committed layout (see the module's
    docstring). @argv: the worker's command line; @env: more environment."""

    def __init__(self, mount, argv, master_port=29500, env=None, poll=0.05,
                 relayout_timeout=300, out=None, grace=10.0):
        self.mnt = mount if isinstance(mount, Mount) else Mount(mount)
        self.argv = list(argv)
        self.master_port = int(master_port)
        self.env = dict(os.environ, **(env or {}))
        self.poll = poll
        self.relayout_timeout = relayout_timeout
        self.grace = grace
        self.out = out or sys.stdout
        self.procs = []
        self.stopping = False

    def emit(self, event, **kw):
        line = json.dumps(dict(kind="agent", event=event, node=self.node(), t=time.time(), **kw))
        self.out.write("@mlfs " + line + "\n")
        self.out.flush()

    def node(self):
        try:
            return self.mnt.status().get("node")
        except OSError:
            return None

    def ready(self, newer_than):
        """(version, config, ranks) once this node is idle at a committed version >
        @newer_than whose layout gives it ranks, else None."""
        s = self.mnt.status()
        v = s.get("version") or 0
        if s.get("state") != "idle" or v <= newer_than:
            return None
        cfg = self.mnt.config()
        ranks = self.mnt.ranks()
        if cfg.get("version") != v or not ranks:
            return None
        return v, cfg, ranks

    def master_addr(self, cfg):
        """The host of the node of rank 0 (the config's first node: ranks fill the
        devices of the nodes in order), from cluster.json's addr."""
        cluster = self.mnt._json("cluster.json")
        first = cfg["nodes"][0]
        for n in cluster["nodes"]:
            if n["id"] == first:
                return n["addr"].rsplit(":", 1)[0].strip("[]")
        raise AgentError(f"cluster.json has no node {first!r} (the config's first node)")

    def start(self, version, cfg, ranks):
        world = cfg["tp"] * cfg["pp"] * cfg["dp"]
        env = dict(self.env, WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(len(ranks)),
                   MASTER_ADDR=self.master_addr(cfg),
                   MASTER_PORT=str(self.master_port + version % 1000),
                   MLFS_MOUNT=self.mnt.path, MLFS_VERSION=str(version))
        self.procs = []
        for local, r in enumerate(ranks):
            self.procs.append(subprocess.Popen(
                self.argv, env=dict(env, RANK=str(r), LOCAL_RANK=str(local)),
                stdout=self.out))
        self.emit("start", version=version, ranks=ranks, world=world,
                  layout=[cfg["tp"], cfg["pp"], cfg["dp"]], nodes=cfg["nodes"])

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()

    def watch(self):
        """Waits for the workers: 0 when all exited 0, EXIT_RELAYOUT when one asked for
        the new layout, another code when one failed. After the first that did not exit
        0, the others get @grace seconds to exit by themselves (a worker in the middle
        of its save finishes it, then fails at its next collective: a rank killed
        between its partitions and its `step` would keep every reconfiguration
        refused, docs/decisions.md), and are killed then."""
        first = None
        while True:
            codes = [p.poll() for p in self.procs]
            bad = [c for c in codes if c not in (None, 0)]
            if bad and first is None:
                first = time.monotonic()
            if bad and (all(c is not None for c in codes)
                        or time.monotonic() - first > self.grace):
                self.stop_all()
                return EXIT_RELAYOUT if EXIT_RELAYOUT in bad else bad[0]
            if all(c == 0 for c in codes):
                return 0
            time.sleep(self.poll)

    def run(self, timeout=None):
        """Runs the node's workers until they finish; returns 0. AgentError when they
        failed and no new layout came within relayout_timeout, or after @timeout s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ran = 0  # the version the workers last ran in
        failed_at = None
        try:
            while True:
                got = self.ready(ran)
                if got is None:
                    now = time.monotonic()
                    if deadline is not None and now > deadline:
                        raise AgentError(f"agent: no end after {timeout} s")
                    if failed_at is not None and now - failed_at > self.relayout_timeout:
                        raise AgentError(
                            f"agent: the workers of version {ran} failed and no new layout "
                            f"came in {self.relayout_timeout} s")
                    time.sleep(self.poll)
                    continue
                version, cfg, ranks = got
                self.start(version, cfg, ranks)
                ran = version
                code = self.watch()
                if code == 0:
                    self.emit("done", version=version)
                    return 0
                why = "relayout" if code == EXIT_RELAYOUT else "failed"
                self.emit("stop", version=version, code=code, why=why)
                print(f"mlfs.elastic: the workers of version {version} stopped ({why}, exit "
                      f"code {code}): waiting for a newer layout", file=sys.stderr, flush=True)
                failed_at = None if code == EXIT_RELAYOUT else time.monotonic()
        finally:
            self.stop_all()


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(
        prog="python3 -m mlfs.elastic",
        description="One node's elastic agent: runs the workers of the ranks this node "
                    "hosts in the mount's committed layout, again in every new one.")
    ap.add_argument("--mnt", required=True, help="this node's mlfs mount point")
    ap.add_argument("--master-port", type=int, default=29500,
                    help="base of MASTER_PORT (plus the version modulo 1000)")
    ap.add_argument("--relayout-timeout", type=float, default=300)
    ap.add_argument("worker", nargs=argparse.REMAINDER, help="-- the worker's command line")
    a = ap.parse_args(argv)
    cmd = a.worker[1:] if a.worker[:1] == ["--"] else a.worker
    if not cmd:
        ap.error("the worker's command line is missing (after --)")
    agent = Agent(a.mnt, cmd, master_port=a.master_port, relayout_timeout=a.relayout_timeout)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return agent.run()
    except MlfsError as e:
        print(f"mlfs.elastic: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
