"""mlfs daemons on this machine, for examples and tests: one etcd and N daemons on
127.0.0.1 (or one daemon alone), each with its own mount, peer port and stderr
(DESIGN sections 5, 7, 9, 10). The one harness of the project: the examples, the
benchmarks and the end-to-end tests (tests/e2e/conftest.py's fixtures) use it.

    from mlfs import testing
    with testing.start(nnodes=4, devices=2, job="train") as cl:
        cl.mounts                    # {"n0": "<tmp>/n0", ...}: each node's mount point
        cl.client("n0")              # an mlfs.Mount of it
        cl["n0"].setup(schema, {"version": 1, "tp": 2, "pp": 2, "dp": 2,
                                "nodes": ["n0", "n1"]})
        cl.wait_version(1)           # every running node at version 1, idle
        cl.reconfigure("n2", {"version": 2, ...})   # `mlfs reconfigure`, waited for
        cl.kill("n1")                # kill -9 (its dead mount lazily unmounted)
        cl.restart("n1")             # mounted again on the same directory
        cl.freeze("n2"); cl.thaw("n2")   # SIGSTOP / SIGCONT: a node that stops answering
        cl.status("n2")              # that node's status.json

    with testing.start(nnodes=1, devices=8) as cl:   # one node: no etcd, no token
        mnt = cl.client("n0")

start(nnodes, devices=2, job="demo", tmp=None, mlfs=None, etcd=None, extra_args=(),
node_env=None) runs Debian's etcd-server (`etcd`, `make deps`) on two free loopback
ports with its data in <tmp>/etcd (for two nodes or more, or when @etcd; etcd=3: three
members, every one in cluster.json, as a production job has them), writes a
token file (0600, 32 random hex characters) and <tmp>/cluster.json {"job", "etcd",
"token_file", "nodes": [{"id": "n<i>", "addr": "127.0.0.1:<free port>", "devices"}]},
and mounts every node (`mlfs mount <tmp>/n<i> --node n<i> --cluster cluster.json -f`,
stderr in <tmp>/n<i>.stderr), waiting until each is mounted and, with etcd, every
node's key is in etcd. At the end every daemon still running is unmounted and must
exit 0, and, when no fault was injected (kill, freeze, etcd loss), its stderr must be
free of "error"; etcd is killed and the temporary directory removed (unless @tmp was
given). Failures raise ClusterError, an AssertionError.

The `mlfs` binary is $MLFS, else <source tree>/$BUILD/mlfs when this package is
imported from the source tree and that binary is built, else `mlfs` on the PATH.

Cluster (cluster.py):
  cl[0], cl["n1"] -> Node          cl.nodes (all, in cluster.json order), cl.live()
  cl.spec, cl.token, cl.cluster_path, cl.job, cl.etcd (an Etcd, or None), cl.tmp,
  cl.ids, cl.mounts, cl.etcd_url
  cl.status(n) -> status.json      cl.client(n) -> mlfs.Mount
  cl.keys() -> {rel: KV}           the job's etcd keys
  cl.file(name, obj) -> path       a JSON file in the tmp dir (configs for the CLI)
  cl.kill(n)                       kill -9 node n's daemon and lazily unmount its dead
                                   mount (fusermount3 -u -z)
  cl.freeze(n) / cl.thaw(n)        SIGSTOP / SIGCONT (a node that stops answering;
                                   freeze returns once every thread of it stopped)
  cl.kill_etcd()                   the control plane gone (cl.etcd.restart() brings it back)
  cl.mount(id, cluster_path=None) -> Node   starts node id's daemon (cl.mount_all(): all)
  cl.restart(n) -> Node            mounts a killed node n again on the same mount dir
  cl.join(id, spec, cluster_path=None) -> Node   a node of a longer cluster.json @spec
  cl.try_mount(id, spec, name) -> Node | (rc, stderr)   a daemon with another cluster.json
  cl.statuses() -> {id: status.json or a string saying why it could not be read}
  cl.describe() -> str             every node's status.json, the job's etcd keys and the
                                   end of every daemon's stderr (for failure messages)
  cl.wait(pred, what, timeout)     polls pred() until truthy, else fails with describe()
  cl.wait_version(v, nodes=None, state="idle")   every live node (or @nodes) at v, idle
  cl.wait_settled()                no attempt in etcd and every live node idle or failed,
                                   all at the committed version; returns that version
  cl.wait_registered(ids) / cl.wait_down(id)   nodes/<id> present / gone in etcd
  cl.committed() -> dict | None    the config in etcd
  cl.reconfigure(n, cfg, wait=True, follow=True) -> CompletedProcess | Popen
                                   `mlfs reconfigure` on node n's mount
  cl.plan(schema, a, b, down=()) -> dict   `mlfs plan ... --cluster cluster.json --json`
  cl.teardown()                    what start() does at the end (a Cluster made by hand)

Test-only helpers, bit-exact checks against the NumPy reference of mlfs.testing.layout
(full tensors -> every rank's partitions, computed with NumPy alone):
  cl.allocation(cfg) -> {rank: (node id, device)}   DESIGN section 2's allocation
  cl.hosted(cfg, id) -> [rank]
  cl.start_job(schema, cfg, on, full, step)   schema.json then config.json on node @on,
                                   waits for every node to have them, imports the
                                   checkpoint of @full on every node, waits until
                                   every node published its ranks' steps
  cl.wait_published(cfg, step, others={})   every node's etcd entry has "steps"
                                   {"<rank>": step} for its ranks of @cfg
  cl.check_layout(schema, cfg, full, step=None, nodes=None)   every partition of every
                                   (live) node against the NumPy reference
  cl.snapshot(nodes=None) -> {id: {path: bytes}}   every file under ranks/

Node (a Daemon): id, addr, pid, port, p(), read(), write(), read_json(), status(),
  setup(), mlfs(cmd, ...), stderr(); get(path, token=TOKEN, headers=None,
  method="GET", host=None) -> (HTTP status, body bytes): a request to the node's peer
  server, with the cluster token by default (token=None: no Authorization header; a
  string: that header value after "Bearer ").

Etcd (etcd.py): url, data_dir, alive, pid, kv(key) -> KV | None, range(prefix),
  job(job) -> {rel: KV}, lease_ttl(lease), calls(method=None) (gRPC calls handled so
  far, of one method or all), kill(), restart(), stop() (kill and remove
  the data dir: etcd preallocates 128 MB of WAL per member).
EtcdCluster(tmp, n=3): n members (url: every client URL, comma-separated, the "etcd" of
  cluster.json), members (each an Etcd), freeze(i), thaw(i); reads through any member.

Also: expect_oserror(codes, fn, *args) (fn fails with one of those errnos; returns the
OSError), timed(fn, timeout) (fn on a thread, TimeoutError when it hangs),
wait_for(what, fn, timeout), free_port(), holders(path) (the processes that keep a mount
busy, for a failed unmount's message). The package never imports pytest; the
fixtures (etcd, cluster_factory, mount_factory) are tests/e2e/conftest.py's.
"""
from .cluster import TOKEN, Cluster, Daemon, Node, start
from .etcd import KV, Etcd, EtcdCluster
from .util import (ETCD, MLFS, ROOT, ClusterError, expect_oserror, find_mlfs, free_port, holders,
                   timed, wait_for)

__all__ = ["start", "Cluster", "Node", "Daemon", "Etcd", "EtcdCluster", "KV", "TOKEN", "ClusterError",
           "expect_oserror", "timed", "wait_for", "free_port", "find_mlfs", "holders", "MLFS",
           "ROOT", "ETCD"]
