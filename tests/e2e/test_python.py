"""The Python package python/mlfs (issue 19, item 1) on real mounts: Mount and Rank
(rank.json, partitions as torch tensors, bfloat16 through the xattr, refusals with
status.json's reason, data views, windows, reconfigure with progress); mlfs.torch's
rank.save(model, optimizer, step) and rank.load_into(model, optimizer) of a bfloat16
model and its Adam moments (and fp32 main params) carried through tp1 -> tp2 -> tp1;
a refused `step` raising in rank.save; mount.reconfigure raising with status.json's
error; and the examples' shims."""
import errno
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, run_mlfs
from test_reconf import ctl, prepare, wait_state

import mlfs  # python/mlfs (conftest puts it on sys.path)

LAYERS = 2
# Which dimension TP splits, by tensor (the rest are replicated).
SPLIT = {"emb/weight": 0, "fc/weight": 0, "proj/weight": 1}


def small_schema(main=False):
    """Two layers: bfloat16 weights split by rows or columns, a float32 norm replicated;
    the Adam moments in float32, and with @main the fp32 main params (optim/main)."""
    states = {"model": {}, "optim/exp_avg": {"dtype": "float32"},
              "optim/exp_avg_sq": {"dtype": "float32"}}
    if main:
        states["optim/main"] = {"dtype": "float32"}
    return {"model": "small", "num_layers": LAYERS, "states": states, "tensors": [
        {"name": "emb/weight", "dtype": "bfloat16", "shape": [16, 8], "split": {"dim": 0}},
        {"name": "layers/{L}/fc/weight", "dtype": "bfloat16", "shape": [12, 8],
         "split": {"dim": 0}},
        {"name": "layers/{L}/proj/weight", "dtype": "bfloat16", "shape": [8, 12],
         "split": {"dim": 1}},
        {"name": "layers/{L}/norm/weight", "dtype": "float32", "shape": [8]}]}


def config(version, tp):
    return {"version": version, "tp": tp, "pp": 1, "dp": 1, "nodes": ["n0"]}


def small_model(tp, seed, norm_dtype=torch.float32):
    """TP rank's slice of the small schema's model, randomly initialised: its parameter
    names are the schema's with dots ("layers.0.fc.weight"), but the embedding's
    ("embedding.weight": names= maps it)."""
    g = torch.Generator().manual_seed(seed)

    def param(*shape, dtype=torch.bfloat16):
        return torch.nn.Parameter(torch.randn(*shape, generator=g).to(dtype))
    m = torch.nn.Module()
    m.embedding = torch.nn.Module()
    m.embedding.weight = param(16 // tp, 8)
    m.layers = torch.nn.ModuleList()
    for _ in range(LAYERS):
        layer = torch.nn.Module()
        for name, shape in (("fc", (12 // tp, 8)), ("proj", (8, 12 // tp))):
            setattr(layer, name, torch.nn.Module())
            getattr(layer, name).weight = param(*shape)
        layer.norm = torch.nn.Module()
        layer.norm.weight = param(8, dtype=norm_dtype)
        m.layers.append(layer)
    return m


NAMES = {"embedding.weight": "emb/weight"}  # the rest: dots to slashes


def schema_names(model):
    return {NAMES.get(n, n.replace(".", "/")): p for n, p in model.named_parameters()}


class Job:
    """A model and its optimizer on one rank: Adam over the parameters, or (@main)
    over fp32 main copies of bfloat16 parameters, copied back after each step."""

    def __init__(self, tp, seed, main):
        self.main = main
        self.model = small_model(tp, seed, torch.bfloat16 if main else torch.float32)
        self.train = ([p.detach().float().requires_grad_() for p in self.model.parameters()]
                      if main else list(self.model.parameters()))
        self.opt = torch.optim.Adam(self.train, lr=0.01)

    def step(self, grads):
        """One Adam step with @grads {schema name: gradient}."""
        by_id = {id(p): n for n, p in schema_names(self.model).items()}
        for p, q in zip(self.model.parameters(), self.train):
            q.grad = grads[by_id[id(p)]].to(q.dtype)
        self.opt.step()
        with torch.no_grad():
            for p, q in zip(self.model.parameters(), self.train):
                p.copy_(q)

    def state(self):
        """{(state root, schema name): tensor}, as the mount should hold them."""
        out = {}
        for (n, p), q in zip(schema_names(self.model).items(), self.train):
            out[("model", n)] = p.detach().clone()
            for key in ("exp_avg", "exp_avg_sq"):
                out[("optim/" + key, n)] = self.opt.state[q][key].clone()
            if self.main:
                out[("optim/main", n)] = q.detach().clone()
        return out

    def save(self, me, step):
        me.save(self.model, self.opt, step, names=NAMES)

    def load(self, me):
        return me.load_into(self.model, self.opt, names=NAMES)


def split_dim(name):
    return SPLIT.get(name.split("/", 2)[-1] if name.startswith("layers/") else name)


def tp_slice(name, full, t, tp):
    dim = split_dim(name)
    return full if dim is None else full.chunk(tp, dim)[t]


def grads(tp, t, seed):
    """Gradients of TP rank @t of @tp: slices of one full gradient per tensor, so that
    every replica of a replicated tensor takes the same step."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for n, shape in (("emb/weight", (16, 8)),) + tuple(
            (f"layers/{i}/{k}", s) for i in range(LAYERS)
            for k, s in (("fc/weight", (12, 8)), ("proj/weight", (8, 12)), ("norm/weight", (8,)))):
        out[n] = tp_slice(n, torch.randn(*shape, generator=g), t, tp)
    return out


def same(a, b):
    """Bitwise equal tensors of one dtype."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# ----------------------------------------------------------------- Mount and Rank

def test_client(mount_factory):
    """The client on a bfloat16 schema: rank.json, load (mapped and read, bfloat16 through
    the xattr), save and step, refusals with status.json's reason, data views, windows,
    and reconfigure with progress."""
    m = mount_factory(devices=4)
    schema = json.loads(run_mlfs("schema", "megatron-gpt", "--layers", 2, "--hidden", 32,
                                 "--heads", 4, "--vocab", 100, "--seq", 8).stdout)
    rec = m.tmp / "records"
    rec.mkdir()
    (np.arange(64 * 9, dtype=np.int32)).tofile(rec / "a.bin")
    run_mlfs("dataset", "index", rec, "--dtype", "int32", "--shape", 9)
    mnt = mlfs.Mount(m.path)
    dataset = {"index": f"file://{rec}/index.json", "global_batch": 8, "shuffle": False}
    mnt.set_up(schema, {"version": 1, "tp": 2, "pp": 2, "dp": 1, "nodes": ["n0"],
                        "dataset": dataset})
    assert mnt.ranks() == [0, 1, 2, 3]
    me = mnt.rank(3)
    assert (me.t, me.p, me.d, me.tp, me.pp, me.dp) == (1, 1, 0, 2, 2, 1)
    assert list(me.layers) == [1]
    qkv = "layers/1/self_attention/query_key_value/weight"
    assert me.dtype("model", qkv) == "bfloat16"
    assert me.dtype("optim/exp_avg", qkv) == "float32"
    w = me.load("model", qkv)
    assert w.dtype == torch.bfloat16 and tuple(w.shape) == (48, 32)
    assert not w.any()  # zeros until written

    new = torch.linspace(-2, 2, 48 * 32).reshape(48, 32).to(torch.bfloat16)
    me.save("model", qkv, new)  # the first client's save(state, name, tensor)
    for mapped in (True, False):
        assert torch.equal(me.load("model", qkv, mapped=mapped), new)
    raw = np.load(me.path("model", qkv))  # what NumPy sees: the bfloat16 bits as <u2
    assert raw.dtype == np.dtype("<u2")
    assert np.array_equal(raw, new.view(torch.int16).numpy().view("<u2"))
    assert np.array_equal(me.read("model", qkv), raw)
    with pytest.raises(mlfs.MlfsError, match="shape|dtype") as e:
        me.save_tensor("model", qkv, torch.zeros(47, 32, dtype=torch.bfloat16))
    assert e.value.errno == errno.EINVAL
    assert torch.equal(me.load("model", qkv), new)  # refused: the old content stays

    recs, ids = me.data(0)
    assert ids.tolist() == list(range(8)) and recs.shape == (8, 9)
    assert np.array_equal(recs, np.arange(8 * 9).reshape(8, 9))
    recs, ids = me.window(2, 5)
    assert recs.shape == (3, 8, 9) and ids[0].tolist() == list(range(16, 24))

    # A reconfiguration needs every rank's step: refused with the lagging rank named.
    me.save_state({"model": {qkv: new}}, 5)
    assert me.saved_step() == 5
    with pytest.raises(mlfs.MlfsError, match="rank"):
        mnt.reconfigure({"tp": 1, "dp": 2})
    for r in mnt.ranks():
        mnt.rank(r).mark_step(5)
    seen = []
    last = mnt.reconfigure({"tp": 1, "dp": 2}, progress=lambda *a: seen.append(a))
    assert last["to_version"] == 2 and last["bytes_copied"] > 0 and seen
    assert mnt.config()["version"] == 2 and mnt.config()["dataset"] == dataset
    me = mnt.rank(3)  # now t0 p1 d1: rank 3 holds the whole qkv of layer 1, from both slices
    assert (me.t, me.p, me.d) == (0, 1, 1)
    full = me.load("model", qkv)
    assert tuple(full.shape) == (96, 32)
    # Megatron-Core's QKV, interleaved per query group (4 groups of 24 rows): rank 3
    # (t1) held the contiguous rows of groups 2 and 3; t0's (rank 2) were never written.
    assert torch.equal(full[48:96], new)
    assert not full[0:48].any()
    recs, ids = me.data(5)  # the cursor carried: step 5 is records 40-47, d1 has 44-47
    assert ids.tolist() == [44, 45, 46, 47]
    # on_progress, the first name of progress, still works.
    seen.clear()
    mnt.reconfigure({"tp": 2, "dp": 1}, on_progress=lambda *a: seen.append(a))
    assert seen and mnt.rank(3).t == 1


# ----------------------------------------------------------------- mlfs.torch

@pytest.mark.parametrize("main", [False, True], ids=["adam", "fp32-main"])
def test_save_and_load_into_across_tp(mount, main):
    """A bfloat16 model and its Adam moments (float32 on the mount), with @main the
    optimizer's fp32 main params too: saved at tp1, loaded into two tp2 ranks (each
    its slices, Adam's step count the saved step), trained a step there, saved by both,
    loaded back at tp1: every tensor bitwise what the ranks held."""
    mnt = mlfs.Mount(mount.path)
    mnt.set_up(small_schema(main), config(1, 1))
    one = Job(1, seed=1, main=main)
    for s in (1, 2):
        one.step(grads(1, 0, seed=10 + s))
    one.save(mnt.rank(0), 2)
    want = one.state()
    me = mnt.rank(0)
    assert me.saved_step() == 2
    # What NumPy sees: the bfloat16 weights' raw bits, the moments in float32.
    w = want[("model", "emb/weight")]
    assert np.array_equal(np.load(me.path("model", "emb/weight")),
                          w.view(torch.int16).numpy().view("<u2"))
    m = want[("optim/exp_avg", "layers/1/proj/weight")]
    assert np.array_equal(np.load(me.path("optim/exp_avg", "layers/1/proj/weight")),
                          m.float().numpy())
    if main:  # the fp32 main params are not the bfloat16 weights rounded
        q = want[("optim/main", "emb/weight")]
        assert q.dtype == torch.float32 and not torch.equal(q, w.float())

    last = mnt.reconfigure({"tp": 2})
    assert last["to_version"] == 2 and last["bytes_copied"] > 0
    ranks = {t: Job(2, seed=5 + t, main=main) for t in (0, 1)}
    for t, job in ranks.items():
        assert job.load(mnt.rank(t)) == 2
        got = job.state()
        for (state, n), full in want.items():
            assert same(got[(state, n)], tp_slice(n, full, t, 2)), (t, state, n)
        for q in job.train:
            assert job.opt.state[q]["step"].item() == 2
    for t, job in ranks.items():
        job.step(grads(2, t, seed=13))
    for t, job in ranks.items():
        job.save(mnt.rank(t), 3)
    held = {t: job.state() for t, job in ranks.items()}

    mnt.reconfigure({"tp": 1})
    back = Job(1, seed=9, main=main)
    assert back.load(mnt.rank(0)) == 3
    for (state, n), got in back.state().items():
        parts = [held[t][(state, n)] for t in (0, 1)]
        dim = split_dim(n)
        assert same(got, parts[0] if dim is None else torch.cat(parts, dim)), (state, n)
    for q in back.train:
        assert back.opt.state[q]["step"].item() == 3


def test_load_into_checks_names_and_shapes(mount):
    """A parameter that is no partition, a partition no parameter maps to, and a model
    built for another tp are refused, naming them; names= may skip a parameter."""
    mnt = mlfs.Mount(mount.path)
    mnt.set_up(small_schema(), config(1, 1))
    me = mnt.rank(0)
    job = Job(1, seed=1, main=False)
    with pytest.raises(mlfs.MlfsError, match="embedding/weight.*emb/weight"):
        me.load_into(job.model)  # without names=: "embedding.weight" is no partition
    extra = Job(1, seed=1, main=False)
    extra.model.scale = torch.nn.Parameter(torch.ones(1))
    with pytest.raises(mlfs.MlfsError, match="'scale'"):
        me.load_into(extra.model, names=NAMES)
    skip = dict(NAMES, scale=None)
    assert me.load_into(extra.model, names=lambda n: skip[n] if n in skip
                        else n.replace(".", "/")) == 0
    with pytest.raises(mlfs.MlfsError, match=r"emb/weight.npy: the partition is \[16, 8\]"):
        me.load_into(Job(2, seed=1, main=False).model, names=NAMES)
    with pytest.raises(mlfs.MlfsError, match=r"two parameters to each of \['emb/weight'\]"):
        me.load_into(job.model, names=lambda n: "emb/weight")
    with pytest.raises(mlfs.MlfsError, match="optim/main"):  # main params, no root for them
        Job(1, seed=1, main=True).save(me, 1)
    assert me.saved_step() == 0  # nothing was saved


def test_refused_step_raises_in_save(mount):
    """A reconfiguration between a save's partitions and its `step` (as test_reconf.py
    provokes it through .mlfs-ctl) is refused, naming the rank that is saving: it would
    build the new layout from partitions newer than the step agreed; the save completes.
    A save while a reconfiguration is prepared raises at its first partition, and a
    `step` alone at its close (recorded in status.json too); the saved step stays. After
    the abort, saves and reconfigurations work again."""
    mnt = mlfs.Mount(mount.path)
    mnt.set_up(small_schema(), config(1, 1))
    me = mnt.rank(0)
    me.busy_wait = 0  # fail at once (test_save_busy.py: the wait)
    job = Job(1, seed=1, main=False)
    job.step(grads(1, 0, seed=2))
    job.save(me, 1)
    real_mark_step = me.mark_step

    def prepare_first(step, wait=None):
        err, reply = prepare(mount, config(2, 2))
        assert err == errno.EBUSY and "rank 0 is saving" in reply["error"], reply
        real_mark_step(step, wait=wait)
    me.mark_step = prepare_first
    job.step(grads(1, 0, seed=3))
    job.save(me, 2)
    me.mark_step = real_mark_step
    assert me.saved_step() == 2 and mnt.status()["state"] in ("idle", "failed")

    assert prepare(mount, config(2, 2))[0] == 0
    wait_state(mount, "prepared")
    job.step(grads(1, 0, seed=4))
    with pytest.raises(mlfs.MlfsError, match="in progress") as e:
        job.save(me, 3)
    assert e.value.errno == errno.EBUSY and "ranks/0/model/" in str(e.value)
    with pytest.raises(mlfs.MlfsError, match="in progress") as e:
        me.mark_step(3)
    assert e.value.errno == errno.EBUSY and "ranks/0/step" in str(e.value)
    assert me.saved_step() == 2
    # The refusal is in status.json too, for a writer that does not check its close.
    assert "step" in mount.status()["error"] and "in progress" in mount.status()["error"]

    assert ctl(mount, op="abort", version=2, reason="test")[0] == 0
    job.save(me, 3)
    assert me.saved_step() == 3
    assert mnt.reconfigure({"tp": 2})["to_version"] == 2


def test_reconfigure_raises_with_the_status_error(mount):
    """A config the mount refuses at the close of config.json, and a change that fails
    while mount.wait_version polls, raise MlfsError with status.json's error."""
    mnt = mlfs.Mount(mount.path)
    mnt.set_up(small_schema(), config(1, 1))
    for bad, words in (({"nodes": ["n9"]}, "n9"), ({"tp": 16}, "exceed the 8 devices"),
                       ({"version": 1, "tp": 2}, "not greater")):
        with pytest.raises(mlfs.MlfsError) as e:
            mnt.reconfigure(bad)
        error = mnt.status()["error"]
        assert words in error and error in str(e.value), (str(e.value), error)
        assert e.value.errno == errno.EINVAL
        assert mnt.config() == config(1, 1)

    assert prepare(mount, config(2, 2))[0] == 0
    wait_state(mount, "prepared")
    assert ctl(mount, op="abort", version=2, reason="node n3 failed to fetch")[0] == 0
    with pytest.raises(mlfs.MlfsError, match="version 2 aborted: node n3 failed to fetch"):
        mnt.wait_version(2)


# ----------------------------------------------------------------- the package itself

def test_import_costs_no_torch_and_the_shims():
    """`import mlfs` does not import torch (mlfs.torch does, when first used), nor does
    mlfs.testing (the harness) import pytest, and the examples' first client module
    (mlfs_client) is a shim of the package."""
    code = (
        "import sys\n"
        f"sys.path[:0] = [{str(ROOT / 'python')!r}, {str(ROOT / 'examples')!r}]\n"
        "import mlfs, mlfs_client\n"
        "assert 'torch' not in sys.modules, 'import mlfs imported torch'\n"
        "assert mlfs_client.Mount is mlfs.Mount and mlfs_client.Rank is mlfs.Rank\n"
        "assert mlfs.testing.Cluster and 'pytest' not in sys.modules, 'mlfs.testing: pytest'\n"
        "assert mlfs_client.to_torch is mlfs.torch.to_torch and 'torch' in sys.modules\n"
        "assert mlfs.__file__.startswith(sys.path[0]), mlfs.__file__\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=os.path.dirname(__file__), timeout=120)
    assert p.returncode == 0, p.stderr


def test_testing_start_refuses_what_cannot_run(tmp_path):
    """mlfs.testing.start names a job it cannot start, and starts nothing for it."""
    for kw, msg in (({"nnodes": 0}, "nnodes = 0: a job needs at least one node"),
                    ({"nnodes": 2, "etcd": False},
                     "etcd = False with 2 nodes: a job of many nodes needs etcd")):
        with pytest.raises(mlfs.testing.ClusterError, match=msg):
            with mlfs.testing.start(tmp=str(tmp_path / "job"), **kw):
                pass
        assert not (tmp_path / "job").exists()


def test_elastic_batch_plan_and_agent_refusals(mount):
    """mlfs.elastic: a DP rank's share of the global batch and its micro-batches, refused
    when dp does not split the batch into whole micro-batches; an agent without a
    worker command, or on a path that is not a mount, refuses to start."""
    import mlfs.elastic as me
    cfg = {"dataset": {"global_batch": 16}}
    assert me.batch_plan(cfg, 2, 1) == (16, 8)
    assert me.batch_plan(cfg, 2, 4) == (4, 2)
    with pytest.raises(mlfs.MlfsError, match="over dp 3 is not whole micro-batches of 2"):
        me.batch_plan(cfg, 2, 3)
    with pytest.raises(mlfs.MlfsError, match="over dp 16 is not whole micro-batches of 2"):
        me.batch_plan(cfg, 2, 16)
    r = subprocess.run([sys.executable, "-m", "mlfs.elastic", "--mnt", str(mount.path)],
                       capture_output=True, text=True, env=dict(os.environ,
                       PYTHONPATH=str(ROOT / "python")))
    assert r.returncode == 2 and "the worker's command line is missing" in r.stderr, r.stderr
    with pytest.raises(mlfs.MlfsError, match="not an mlfs mount"):
        me.Agent(str(ROOT), ["true"])
    # A worker's view of its layout: unchanged, then changed by a reconfiguration.
    mnt = mlfs.Mount(mount.path)
    mnt.set_up(small_schema(), config(1, 1))
    assert not me.layout_changed(mnt, 1)
    mnt.reconfigure({"tp": 2})
    assert me.layout_changed(mount.path, 1) and not me.layout_changed(mnt, 2)
