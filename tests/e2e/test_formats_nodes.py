"""Formats in a job of many nodes (issue 19): the live view full/<state>.safetensors
(and its index) on a node that holds only part of the state, assembled with the parts
fetched from the other nodes; and `mlfs import --every-node` (and the package's
`every_node=True`): one command, every node of the job filling its own ranks from one
checkpoint they all read.

Four daemons and one etcd on 127.0.0.1 (cluster.py). Every file is parsed by the
test's own safetensors reader and compared bit for bit with NumPy (test_safetensors.py's
writer and reader); every partition of every node with NumPy slices (check_layout).
"""
import json
import os
import threading

import numpy as np
import pytest
import torch

from test_safetensors import (ST_DTYPES, mixed_schema, st_bytes, st_read, st_shards,
                              state_tensors)
from test_store import make_full, write_full

import mlfs
import mlfs.megatron
import mlfs.torch as mt

NODES = ["n0", "n1", "n2", "n3"]


def schema(states=("model",)):
    """test_safetensors.py's mixed schema with a smaller fc."""
    return mixed_schema(states, fc=(512, 128))


def cfg(version, tp, pp, dp=1, nodes=NODES):
    return {"version": version, "tp": tp, "pp": pp, "dp": dp, "nodes": list(nodes)}


def import_each(cl, src, *args):
    """`mlfs import` run on every node, each filling its own ranks (the old way)."""
    for n in cl.nodes:
        p = n.mlfs("import", "--from", src, *args, check=False)
        assert p.returncode == 0, (n.id, p.stderr, cl.describe())


def check_parsed(data, tensors):
    """@data parsed by the test's reader equals the NumPy arrays, dtype and shape
    included, bit for bit."""
    got = st_read(data)
    assert list(got) == [name for name, _, _ in tensors]
    for name, dtype, a in tensors:
        d, shape, raw = got[name]
        assert (d, shape) == (ST_DTYPES[dtype], list(a.shape)), name
        assert raw == np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes(), name


def read_all(path, chunk=65536):
    with open(path, "rb") as f:
        parts = []
        while True:
            c = f.read(chunk)
            if not c:
                return b"".join(parts)
            parts.append(c)


# ------------------------------------------------- 1. the live view across nodes

def test_live_safetensors_from_peers(cluster_factory):
    """tp2 pp2 over four nodes of one device: each node holds a quarter of the state.
    full/model.safetensors on any of them is the whole state (the other parts fetched
    from their nodes), bit-exact; sharded with its index on a node that shards; an open
    file keeps its version across a reconfiguration and an import; readers during
    reconfigurations get one version per open."""
    sch = schema()
    rng = np.random.default_rng(19)
    fulls = [make_full(sch, rng) for _ in range(2)]
    tensors = [state_tensors(sch, f, "model") for f in fulls]
    expect = [st_bytes(t) for t in tensors]
    shard_max = 200000
    cl = cluster_factory(devices=1, node_env={
        "n3": {"MLFS_TEST_HOOKS": "1", "MLFS_ST_SHARD_BYTES": str(shard_max)}})
    v1 = cfg(1, 2, 2)
    cl.start_job(sch, v1)
    src = [cl.tmp / "v0.safetensors", cl.tmp / "v1.safetensors"]
    for p, b in zip(src, expect):
        p.write_bytes(b)
    import_each(cl, src[0])
    cl.wait_published(v1, 0)
    cl.check_layout(sch, v1, fulls[0], step=0)
    assert all(len(cl.hosted(v1, n)) == 1 for n in NODES)

    for n in ("n0", "n2"):  # stage 0, tp 0; stage 1, tp 0
        data = read_all(cl[n].p("full/model.safetensors"))
        assert data == expect[0], n
        check_parsed(data, tensors[0])
        assert os.stat(cl[n].p("full/model.safetensors")).st_size == len(expect[0])
    # n3 shards (MLFS_ST_SHARD_BYTES): every shard and the index, as a writer would.
    files, index = st_shards(tensors[0], shard_max, "model")
    assert index is not None and len(files) > 1
    n3 = cl["n3"]
    assert json.loads(n3.read("full/model.safetensors.index.json")) == index
    for name, b in files.items():
        assert read_all(n3.p("full", name)) == b, name
    assert sorted(f for f in os.listdir(n3.p("full")) if "safetensors" in f) == sorted(
        list(files) + ["model.safetensors.index.json"])

    # One open across a reconfiguration (tp4: every part elsewhere again) and an
    # import of another version keeps the version it opened.
    v2 = cfg(2, 4, 1)
    with open(cl["n1"].p("full/model.safetensors"), "rb") as fh:
        head = fh.read(4096)
        p = cl.reconfigure("n2", v2)
        assert p.returncode == 0, (p.stderr, cl.describe())
        cl.wait_version(2)
        import_each(cl, src[1], "--step", "1")
        rest = fh.read()
    assert head + rest == expect[0]
    cl.wait_published(v2, 1)
    for n in NODES[:3]:
        assert read_all(cl[n].p("full/model.safetensors")) == expect[1], n

    # Readers on two nodes while the layout changes under them: each open reads one
    # whole version (nothing is imported meanwhile: the content stays version 1's).
    stop, seen, bad, refused = threading.Event(), [], [], []

    def reader(node):
        while not stop.is_set():
            try:
                data = read_all(cl[node].p("full/model.safetensors"))
            except OSError as e:  # an open that lost the race with a commit
                refused.append(repr(e))
                continue
            (seen if data == expect[1] else bad).append(len(data))

    threads = [threading.Thread(target=reader, args=(n,)) for n in ("n0", "n1")]
    for t in threads:
        t.start()
    try:
        for version, (tp, pp) in enumerate([(2, 2), (4, 1), (2, 2)], start=3):
            p = cl.reconfigure(NODES[version % 4], cfg(version, tp, pp))
            assert p.returncode == 0, (p.stderr, cl.describe())
            cl.wait_version(version)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not bad, bad
    assert len(seen) >= 2, (seen, refused)
    cl.check_layout(sch, cfg(5, 2, 2), fulls[1], step=1)


# ------------------------------------------------- 2. one import, every node

def torch_sd(full, state="model"):
    """{schema name with dots: tensor}: bf16 (uint16 bits in the reference) as
    torch.bfloat16."""
    sd = {}
    for (st, name), a in full.items():
        if st != state:
            continue
        if a.dtype == np.uint16:
            t = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        else:
            t = torch.from_numpy(a.copy())
        sd[name.replace("/", ".")] = t
    return sd


def test_import_every_node(cluster_factory, mount_factory, tmp_path):
    """tp2 pp2 dp2 over four nodes of two devices: one `mlfs import --every-node` of a
    safetensors file, of a directory of .npy files, and one
    mlfs.torch.import_state_dict(every_node=True) fill every partition of every node,
    bit-exact. A path that does not exist is refused before anything; a snapshot one
    node cannot read fails naming that node (the others imported); run again once
    readable, it fixes the job."""
    sch = schema(("model", "optim/exp_avg"))
    rng = np.random.default_rng(23)
    full_a, full_b, full_c = (make_full(sch, rng) for _ in range(3))
    cl = cluster_factory()
    v1 = cfg(1, 2, 2, dp=2)
    cl.start_job(sch, v1)
    assert all(len(cl.hosted(v1, n)) == 2 for n in NODES)

    # A safetensors file of the state "model", named on n1, run by every node.
    st = cl.tmp / "a.safetensors"
    st.write_bytes(st_bytes(state_tensors(sch, full_a, "model")))
    p = cl["n1"].mlfs("import", "--from", st, "--state", "model", "--step", "3",
                      "--every-node")
    assert p.stdout.splitlines() == [f"node {n}: imported" for n in NODES], p.stdout
    want = {k: (a if k[0] == "model" else np.zeros_like(a)) for k, a in full_a.items()}
    cl.wait_published(v1, 3)
    cl.check_layout(sch, v1, want, step=3)
    entries = {n: json.loads(cl.keys()[f"nodes/{n}"].value) for n in NODES}
    ids = {e["import"]["id"] for e in entries.values()}
    assert len(ids) == 1 and all(e["import"]["error"] is None for e in entries.values())
    assert json.loads(cl.keys()["import"].value)["id"] in ids

    # Every state from a directory of .npy files, from n3.
    write_full(cl.tmp / "ckpt-b", full_b)
    p = cl["n3"].mlfs("import", "--from", cl.tmp / "ckpt-b", "--step", "4", "--every-node")
    assert p.returncode == 0 and p.stdout.count("imported") == 4, p.stdout
    cl.wait_published(v1, 4)
    cl.check_layout(sch, v1, full_b, step=4)

    # A torch state dict through the package, once, from n2: written under a directory
    # every node reads (here: the test's), removed after.
    shared = cl.tmp / "shared"
    shared.mkdir()
    m2 = mlfs.Mount(cl["n2"].path)
    for call in (lambda: mt.import_state_dict(m2, torch_sd(full_c), every_node=True),
                 lambda: mlfs.megatron.import_checkpoint(m2, cl.tmp, every_node=True)):
        with pytest.raises(mlfs.MlfsError, match="give tmpdir, a directory every node"):
            call()
    reply = mt.import_state_dict(m2, torch_sd(full_c), step=5, tmpdir=shared, every_node=True)
    assert reply["nodes"] == {n: "imported" for n in NODES}, reply
    assert os.listdir(shared) == []
    want = {k: (full_c[k] if k[0] == "model" else a) for k, a in full_b.items()}
    cl.wait_published(v1, 5)
    cl.check_layout(sch, v1, want, step=5)

    # Bad path: refused by the command before any key is put; nothing changes.
    before = cl.keys()["import"].value
    p = cl["n0"].mlfs("import", "--from", cl.tmp / "nowhere", "--every-node", check=False)
    assert p.returncode == 1 and "nowhere" in p.stderr and "No such file" in p.stderr, p.stderr
    assert cl.keys()["import"].value == before
    # A directory that is no checkpoint: every node refuses it, all named, none changed.
    (cl.tmp / "empty").mkdir()
    p = cl["n0"].mlfs("import", "--from", cl.tmp / "empty", "--every-node", check=False)
    assert p.returncode == 1 and "node n0: " in p.stderr, p.stderr
    assert "No such file" in p.stderr and "; and 3 more nodes failed" in p.stderr, p.stderr
    cl.check_layout(sch, v1, want, step=5)

    # A snapshot one node cannot read: at tp2 pp2 dp1 the ranks are on n0 (stage 0) and
    # n1 (stage 1); the boxes of layer 1 are n1's alone. Made on one node at tp1.
    one = mount_factory(name="one")
    one.setup(sch, {"version": 1, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]})
    write_full(tmp_path / "ckpt-d", full_a)
    one.mlfs("import", "--from", tmp_path / "ckpt-d", "--step", "9")
    snap = cl.tmp / "snap"
    one.mlfs("snapshot", "--to", snap)
    v2 = cfg(2, 2, 2)
    p = cl.reconfigure("n0", v2)
    assert p.returncode == 0, (p.stderr, cl.describe())
    cl.wait_version(2)
    assert cl.hosted(v2, "n0") == [0, 1] and cl.hosted(v2, "n1") == [2, 3]
    box = snap / "model" / "layers" / "1" / "fc"  # its boxes
    hidden = cl.tmp / "hidden-fc"
    os.rename(box, hidden)
    p = cl["n2"].mlfs("import", "--from", snap, "--every-node", check=False)
    assert p.returncode == 1, p.stderr
    assert "node n1: import" in p.stderr and "layers/1/fc/weight" in p.stderr, p.stderr
    assert "more nodes failed" not in p.stderr, p.stderr
    st1 = cl["n1"].status()
    assert "layers/1/fc/weight" in st1["error"], st1
    # n0 imported step 9, n1 kept step 5 and its partitions: a mixed job.
    assert [int(cl["n0"].read(f"ranks/{r}/step")) for r in (0, 1)] == [9, 9]
    assert [int(cl["n1"].read(f"ranks/{r}/step")) for r in (2, 3)] == [5, 5]
    cl.check_node("n0", sch, v2, full_a, step=9)
    cl.check_node("n1", sch, v2, want, step=5)
    # The ranks' steps differ: a reconfiguration is refused, naming a rank, until fixed.
    cl.wait_published(v2, 9, others={2: 5, 3: 5})
    p = cl.reconfigure("n0", cfg(3, 2, 2, dp=2))
    assert p.returncode == 1 and "rank" in p.stderr, (p.returncode, p.stderr)
    assert cl.committed() == v2
    # Readable again: the same command fixes it (a new id: every node imports again).
    os.rename(hidden, box)
    p = cl["n2"].mlfs("import", "--from", snap, "--every-node")
    assert p.stdout.count("imported") == 4, p.stdout
    cl.wait_published(v2, 9)
    cl.check_layout(sch, v2, full_a, step=9)
