"""The store on a real mount: NumPy I/O on partitions, import/export,
reconfiguration checked against NumPy slices, refusals, POSIX in job/, the
memory bound, and a clean unmount (DESIGN sections 2-7, 9-10).

Every expected partition is computed from the full tensors with a NumPy
reimplementation of DESIGN sections 2-3, independent of the daemon's code
(mlfs.testing.layout, python/mlfs/testing/layout.py; imported here, where the tests
have always found it).
"""
import errno
import io
import json
import os
import random
import shutil
import threading
import time

import numpy as np
import pytest

from conftest import run_mlfs
from mlfs.testing.layout import (MIXED, NP_DTYPES, coords, expand, expected_layout,  # noqa: F401
                                 holds, make_full, np_dtype, random_array, rank_tree,
                                 snapshot, stage_layers, state_dtype, tp_slice,
                                 write_full)

# ----------------------------------------------------------------- reference


def check_layout(m, schema, cfg, full, step=None):
    """Every rank's every partition (names, shapes, dtypes, data), rank.json and step."""
    want = expected_layout(schema, cfg, full)
    assert sorted(os.listdir(m.p("ranks")), key=int) == [str(r) for r in sorted(want)]
    for r, files in want.items():
        t, d, p = coords(cfg, r)
        lo, hi = stage_layers(schema["num_layers"], cfg["pp"], p)
        assert m.read_json(f"ranks/{r}/rank.json") == {
            "rank": r, "tp": t, "pp": p, "dp": d, "node": "n0", "device": r,
            "layers": [lo, hi], "tp_size": cfg["tp"], "pp_size": cfg["pp"],
            "dp_size": cfg["dp"], "version": cfg["version"]}
        if step is not None:
            assert int(m.read(f"ranks/{r}/step")) == step
        assert rank_tree(m, r) == set(files), r
        for rel, a in files.items():
            got = np.load(m.p("ranks", r, rel))
            assert got.dtype == a.dtype and got.shape == a.shape, (r, rel, got.dtype, got.shape)
            assert np.array_equal(got, a), (r, rel)
    return want


def layout_bytes(want):
    return sum(a.nbytes for files in want.values() for a in files.values())


def check_export(m, out, full):
    m.mlfs("export", "--to", out)
    found = set()
    for d, _, files in os.walk(out):
        found |= {os.path.relpath(os.path.join(d, f), out) for f in files}
    assert found == {f"{s}/{n}.npy" for s, n in full}
    for (state, name), a in full.items():
        got = np.load(os.path.join(out, state, name + ".npy"))
        assert got.dtype == a.dtype and np.array_equal(got, a), (state, name)


def write_steps(m, cfg, step):
    for r in range(cfg["tp"] * cfg["pp"] * cfg["dp"]):
        m.write(f"ranks/{r}/step", f"{step}\n")


def reconfigure(m, tmp_path, cfg, check=True):
    path = tmp_path / f"config-v{cfg['version']}.json"
    path.write_text(json.dumps(cfg))
    return m.mlfs("reconfigure", path, check=check)


def expect_errno(code, fn, *args, **kw):
    with pytest.raises(OSError) as e:
        fn(*args, **kw)
    assert e.value.errno == code, f"{fn.__name__}: {e.value!r}, expected {errno.errorcode[code]}"


# MIXED (mlfs.testing.layout): every slicing feature, the schema of most tests here.


# ------------------------------------------------------------ 1. dtypes

def test_numpy_round_trip_every_dtype(mount):
    dtypes = list(NP_DTYPES)
    schema = {"model": "dtypes", "num_layers": 0, "states": {"model": {}},
              "tensors": [{"name": f"t/{d}", "dtype": d, "shape": [6, 5], "split": {"dim": 0}}
                          for d in dtypes]}
    mount.setup(schema, {"version": 1, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"]})
    rng = np.random.default_rng(1)
    for d in dtypes:
        full = random_array(rng, d, (6, 5))
        for r in range(2):
            path = mount.p(f"ranks/{r}/model/t/{d}.npy")
            assert os.getxattr(path, "user.mlfs.dtype") == d.encode()
            part = full[3 * r:3 * r + 3]
            np.save(path, part)
            got = np.load(path)
            assert got.dtype == np_dtype(d) and got.shape == (3, 5)
            assert np.array_equal(got, part)
            mm = np.load(path, mmap_mode="r")
            assert mm.dtype == np_dtype(d) and np.array_equal(mm, part)
            del mm
            with open(path, "rb") as f:
                assert f"'descr': '{NP_DTYPES[d]}'".encode() in f.read(128)
        fpath = mount.p(f"full/model/t/{d}.npy")
        assert os.getxattr(fpath, "user.mlfs.dtype") == d.encode()
        got = np.load(fpath)
        assert got.dtype == np_dtype(d) and np.array_equal(got, full)


def test_write_visible_at_close(mount):
    schema = {"model": "m", "num_layers": 0, "states": {"model": {}},
              "tensors": [{"name": "w", "dtype": "float32", "shape": [256, 64]}]}
    mount.setup(schema, {"version": 1, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]})
    path = mount.p("ranks/0/model/w.npy")
    new = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)
    buf = io.BytesIO()
    np.save(buf, new)
    data = buf.getvalue()
    zeros = np.zeros((256, 64), np.float32)
    early = open(path, "rb")  # a reader open before the write: its snapshot is zeros
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        assert os.write(fd, data[:len(data) // 2]) == len(data) // 2
        assert np.array_equal(np.load(path), zeros)  # not visible before close
        assert os.write(fd, data[len(data) // 2:]) == len(data) - len(data) // 2
        assert np.array_equal(np.load(path), zeros)
        assert np.array_equal(np.load(early), zeros)
    finally:
        os.close(fd)
        early.close()
    assert np.array_equal(np.load(path), new)
    # A plain write of data bytes at an offset, without O_TRUNC, keeps the rest.
    hdr = len(data) - new.nbytes
    with open(path, "r+b") as f:
        f.seek(hdr + 4 * 64)
        f.write(np.full(64, -1, np.float32).tobytes())
    new[1] = -1
    assert np.array_equal(np.load(path), new)


# ------------------------------------------------ 2. zero-filled partitions

ZERO_SCHEMA = {
    "model": "zeros", "num_layers": 3,
    "states": {"model": {}, "optim/m": {"dtype": "float64"}},
    "tensors": [
        {"name": "a", "dtype": "float32", "shape": [10, 6], "split": {"dim": 0}},
        {"name": "b", "dtype": "int16", "shape": [6, 9], "split": {"dim": 1}},
        {"name": "layers/{L}/c", "dtype": "bfloat16", "shape": [12, 4],
         "split": {"dim": 0, "chunks": 2}},
        {"name": "layers/{L}/d", "dtype": "float16", "shape": [15, 4],
         "split": {"dim": 0, "chunks": [7, 4, 4]}},
        {"name": "e", "dtype": "float32", "shape": [50, 4],
         "split": {"dim": 0, "pad_multiple": 8}, "place": "first"},
        {"name": "f", "dtype": "uint8", "shape": [5], "place": "last"},
        {"name": "g", "dtype": "float32", "shape": [3, 5, 7], "split": {"dim": 1}},
    ],
}


@pytest.mark.parametrize("cfg", [
    {"version": 1, "tp": 4, "pp": 2, "dp": 1, "nodes": ["n0"]},
    {"version": 5, "tp": 3, "pp": 1, "dp": 2, "nodes": ["n0"]},
    {"version": 1, "tp": 2, "pp": 3, "dp": 1, "nodes": ["n0"]},
])
def test_partitions_exist_zero_filled(mount, cfg):
    mount.write("schema.json", json.dumps(ZERO_SCHEMA))
    assert os.listdir(mount.p("ranks")) == []
    mount.write("config.json", json.dumps(cfg))
    zeros = {(s, n): np.zeros(spec["shape"], np_dtype(state_dtype(ZERO_SCHEMA, s, spec)))
             for s in ZERO_SCHEMA["states"] for n, spec, _ in expand(ZERO_SCHEMA)}
    want = check_layout(mount, ZERO_SCHEMA, cfg, zeros, step=0)
    # Shapes by hand for a few of them, so the reference slicing is checked too.
    shapes = {r: {k: v.shape for k, v in files.items()} for r, files in want.items()}
    if cfg["tp"] == 4:
        assert [shapes[r]["model/a.npy"] for r in range(4)] == [(2, 6), (3, 6), (2, 6), (3, 6)]
        assert [shapes[r]["model/b.npy"] for r in range(4)] == [(6, 2), (6, 2), (6, 2), (6, 3)]
        assert [shapes[r]["model/layers/0/c.npy"] for r in range(4)] == [(2, 4), (4, 4)] * 2
        assert [shapes[r]["model/layers/0/d.npy"] for r in range(4)] == [
            (1 + 1 + 1, 4), (2 + 1 + 1, 4), (2 + 1 + 1, 4), (2 + 1 + 1, 4)]
        assert [shapes[r]["model/e.npy"] for r in range(4)] == [(16, 4)] * 4
        assert "model/e.npy" not in shapes[4] and "model/f.npy" in shapes[4]
        assert [shapes[r]["model/g.npy"] for r in range(4)] == [(3, 1, 7), (3, 1, 7),
                                                              (3, 1, 7), (3, 2, 7)]
    if cfg["tp"] == 3:
        assert [shapes[r]["model/e.npy"] for r in range(3)] == [(24, 4)] * 3
        assert [shapes[r]["model/layers/2/d.npy"] for r in range(3)] == [(4, 4), (4, 4), (7, 4)]
    for (s, n), z in zeros.items():
        path = mount.p("full", s, n + ".npy")
        got = np.load(path)
        assert got.dtype == z.dtype and np.array_equal(got, z)
    st = mount.status()
    assert st["version"] == cfg["version"] and st["state"] == "idle" and st["error"] is None
    assert st["memory_used"] >= layout_bytes(want)


# ------------------------------------------------------- 3. wrong headers

def test_wrong_header_refused(mount):
    schema = {"model": "m", "num_layers": 0, "states": {"model": {}},
              "tensors": [{"name": "x/w", "dtype": "float32", "shape": [8, 4],
                           "split": {"dim": 0}},
                          {"name": "x/h", "dtype": "bfloat16", "shape": [4]}]}
    mount.setup(schema, {"version": 1, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"]})
    path = mount.p("ranks/1/model/x/w.npy")
    good = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.save(path, good)

    def save(a, p=path):
        with open(p, "wb") as f:
            np.save(f, a)

    cases = [
        (good.astype(np.float64), "dtype"),              # wrong dtype
        (good.reshape(2, 8), "shape"),                   # wrong shape, same size
        (np.zeros((8, 4), np.float32), "shape"),         # the full tensor's shape
        (good.astype(np.int32), "dtype"),
    ]
    for bad, why in cases:
        expect_errno(errno.EINVAL, save, bad)
        assert np.array_equal(np.load(path), good)
        err = mount.status()["error"]
        assert err and "ranks/1/model/x/w.npy" in err and why in err, err
    # bfloat16 partitions take '<u2' only.
    hpath = mount.p("ranks/0/model/x/h.npy")
    expect_errno(errno.EINVAL, save, np.ones(4, np.float16), hpath)
    assert "ranks/0/model/x/h.npy" in mount.status()["error"]
    np.save(hpath, np.array([1, 2, 3, 4], np.uint16))
    assert np.array_equal(np.load(hpath), [1, 2, 3, 4])
    # A right header with too few data bytes fails at close; content kept.
    buf = io.BytesIO()
    np.save(buf, good * 2)
    with pytest.raises(OSError) as e:
        with open(path, "wb") as f:
            f.write(buf.getvalue()[:-4])
    assert e.value.errno == errno.EINVAL
    assert np.array_equal(np.load(path), good)
    assert "expected" in mount.status()["error"]
    # Not a .npy at all.
    expect_errno(errno.EINVAL, mount.write, "ranks/1/model/x/w.npy", b"hello world, not npy")
    assert np.array_equal(np.load(path), good)
    # The daemon still takes a right write.
    np.save(path, good + 1)
    assert np.array_equal(np.load(path), good + 1)


# ---------------------------------------------------------------- 4. import

def test_import_export(mount, tmp_path):
    cfg = {"version": 1, "tp": 2, "pp": 2, "dp": 2, "nodes": ["n0"]}
    mount.setup(MIXED, cfg)
    full = make_full(MIXED, np.random.default_rng(4))
    ckpt = tmp_path / "ckpt"
    write_full(ckpt, full)
    assert not (ckpt / "model/output/weight.npy").exists()  # tied: no file of its own
    p = mount.mlfs("import", "--from", ckpt, "--step", "7")
    assert p.returncode == 0
    want = check_layout(mount, MIXED, cfg, full, step=7)
    assert mount.status()["step"] == 7 and mount.status()["error"] is None
    # Padding rows are zero, logical rows are the checkpoint's.
    emb = np.load(mount.p("ranks/0/model/embedding/weight.npy"))
    assert emb.shape == (28, 8) and np.array_equal(emb, full[("model", "embedding/weight")][:28])
    emb = np.load(mount.p("ranks/1/model/embedding/weight.npy"))
    assert emb.shape == (28, 8) and not emb[22:].any()
    out = np.load(mount.p("ranks/7/optim/exp_avg/output/weight.npy"))
    assert out.dtype == np.float32 and not out[22:].any()
    assert np.array_equal(out[:22], full[("optim/exp_avg", "embedding/weight")][28:])

    # A bad checkpoint: one file missing, one mis-shaped, one of the wrong dtype.
    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    full2 = make_full(MIXED, np.random.default_rng(5))
    write_full(bad, full2)
    os.unlink(bad / "model/layers/3/qkv/weight.npy")
    np.save(bad / "optim/exp_avg/layers/1/proj/weight.npy", np.zeros((10, 8), np.float32))
    np.save(bad / "model/final_norm/weight.npy", np.zeros(8, np.float64))
    p = mount.mlfs("import", "--from", bad, "--step", "9", check=False)
    assert p.returncode == 1
    for name in ["model/layers/3/qkv/weight.npy", "optim/exp_avg/layers/1/proj/weight.npy",
                 "model/final_norm/weight.npy"]:
        assert name in p.stderr, p.stderr
        assert name in mount.status()["error"]
    check_layout(mount, MIXED, cfg, full, step=7)  # nothing changed
    check_export(mount, tmp_path / "out", full)

    # Only one state: the other keeps its content.
    os.unlink(bad / "optim/exp_avg/layers/1/proj/weight.npy")
    np.save(bad / "model/layers/3/qkv/weight.npy", full2[("model", "layers/3/qkv/weight")])
    np.save(bad / "model/final_norm/weight.npy", full2[("model", "final_norm/weight")])
    mount.mlfs("import", "--from", bad, "--state", "model", "--step", "8")
    mixed = {k: (full2[k] if k[0] == "model" else full[k]) for k in full}
    check_layout(mount, MIXED, cfg, mixed, step=8)
    check_export(mount, tmp_path / "out2", mixed)
    assert layout_bytes(want) > 0


def test_import_names_every_missing_file(mount, tmp_path):
    """An empty checkpoint folder for a schema of 200 tensors: the error names the
    first files and counts the rest, and nothing changes."""
    schema = {"model": "many", "num_layers": 0, "states": {"model": {}},
              "tensors": [{"name": f"block{i:03d}/weight", "dtype": "float32", "shape": [4, 4]}
                          for i in range(200)]}
    mount.setup(schema, {"version": 1, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]})
    (tmp_path / "empty").mkdir()
    p = mount.mlfs("import", "--from", tmp_path / "empty", check=False)
    assert p.returncode == 1
    assert "model/block000/weight.npy" in p.stderr, p.stderr
    shown = p.stderr.count(".npy:")
    assert 1 <= shown < 200
    assert f"and {200 - shown} more" in p.stderr, p.stderr
    assert not np.load(mount.p("ranks/0/model/block199/weight.npy")).any()


# ------------------------------------------------- 5. reconfiguration

def random_config(rnd, version, L):
    tp = rnd.choice([1, 2, 4])
    pp = rnd.choice([p for p in (1, 2, 4) if p <= L and tp * p <= 8])
    dp = rnd.randint(1, 8 // (tp * pp))
    return {"version": version, "tp": tp, "pp": pp, "dp": dp, "nodes": ["n0"]}


def update_tensor(m, schema, cfg, full, rng, state, name):
    """Writes new values of one logical tensor to every rank holding it (and to its
    tied copies) with numpy.save; returns the new full tensor."""
    spec = next(s for n, s, _ in expand(schema) if n == name)
    new = random_array(rng, state_dtype(schema, state, spec), spec["shape"])
    full[(state, name)] = new
    want = expected_layout(schema, cfg, full)
    tied = [n for n, s, _ in expand(schema) if s.get("tied") == name]
    for r, files in want.items():
        for n in [name] + tied:
            rel = f"{state}/{n}.npy"
            if rel in files:
                np.save(m.p("ranks", r, rel), files[rel])


@pytest.mark.parametrize("seed", [11, 12])
def test_random_reconfigurations(mount, tmp_path, seed):
    rnd = random.Random(seed)
    rng = np.random.default_rng(seed)
    L = MIXED["num_layers"]
    cfg = random_config(rnd, 1, L)
    mount.setup(MIXED, cfg)
    full = make_full(MIXED, rng)
    write_full(tmp_path / "ckpt", full)
    mount.mlfs("import", "--from", tmp_path / "ckpt", "--step", "100")
    check_layout(mount, MIXED, cfg, full, step=100)
    logical = [k for k in full]
    step = 100
    seen = set()
    for i in range(7):
        # Training went on: some tensors changed, every rank saved the step.
        for _ in range(2):
            state, name = rnd.choice(logical)
            update_tensor(mount, MIXED, cfg, full, rng, state, name)
        step += 1
        write_steps(mount, cfg, step)
        old = cfg
        cfg = random_config(rnd, old["version"] + rnd.randint(1, 3), L)
        seen.add((cfg["tp"], cfg["pp"], cfg["dp"]))
        p = reconfigure(mount, tmp_path, cfg)
        assert f"version {cfg['version']}" in p.stdout
        want = check_layout(mount, MIXED, cfg, full, step=step)
        st = mount.status()
        assert st["version"] == cfg["version"] and st["state"] == "idle"
        assert st["error"] is None and st["step"] == step
        last = st["last"]
        assert last["from_version"] == old["version"] and last["to_version"] == cfg["version"]
        assert last["bytes_fetched"] == 0
        assert last["bytes_reused"] + last["bytes_copied"] + last["bytes_zeroed"] == \
            layout_bytes(want), (old, cfg, last)
        if (old["tp"], old["pp"]) == (cfg["tp"], cfg["pp"]) and cfg["dp"] <= old["dp"]:
            assert last["bytes_reused"] == layout_bytes(want)  # nothing to copy
        if old["tp"] != cfg["tp"]:
            assert last["bytes_copied"] > 0
    assert len(seen) >= 3
    check_export(mount, tmp_path / "out", full)


def test_reconfiguration_all_layouts_round_trip(mount, tmp_path):
    """Every (tp, pp) pair once, from the previous one."""
    rng = np.random.default_rng(3)
    cfgs = [(1, 1, 1), (4, 2, 1), (2, 4, 1), (1, 2, 3), (4, 1, 2), (2, 1, 1), (1, 4, 2),
            (2, 2, 2), (4, 1, 1)]
    cfg = {"version": 1, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]}
    mount.setup(MIXED, cfg)
    full = make_full(MIXED, rng)
    write_full(tmp_path / "ckpt", full)
    mount.mlfs("import", "--from", tmp_path / "ckpt", "--step", "1")
    for v, (tp, pp, dp) in enumerate(cfgs[1:], start=2):
        cfg = {"version": v, "tp": tp, "pp": pp, "dp": dp, "nodes": ["n0"]}
        reconfigure(mount, tmp_path, cfg)
        check_layout(mount, MIXED, cfg, full, step=1)
    check_export(mount, tmp_path / "out", full)


# ------------------------------------------------------------ 6. refusals

def test_refusals_change_nothing(mount, tmp_path):
    cfg = {"version": 2, "tp": 2, "pp": 2, "dp": 1, "nodes": ["n0"]}
    mount.setup(MIXED, cfg)
    full = make_full(MIXED, np.random.default_rng(6))
    write_full(tmp_path / "ckpt", full)
    mount.mlfs("import", "--from", tmp_path / "ckpt", "--step", "3")
    before = snapshot(mount)
    assert len(before) > 20

    def refused(new, reason, text=None):
        if text is None:
            path = tmp_path / "new.json"
            path.write_text(json.dumps(new))
        else:
            path = tmp_path / "new.json"
            path.write_text(text)
        p = run_mlfs("reconfigure", mount.path, path, check=False)
        assert p.returncode == 1, p.stdout
        assert reason in p.stderr, p.stderr
        st = mount.status()
        assert st["version"] == 2 and st["state"] == "idle"
        assert snapshot(mount) == before
        return st

    for v in (2, 1):
        st = refused({"version": v, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]},
                     "is not greater than the current 2")
        assert "not greater" in st["error"]
    st = refused({"version": 3, "tp": 4, "pp": 1, "dp": 4, "nodes": ["n0"]}, "exceed")
    assert "16" in st["error"] and "8 devices" in st["error"]
    st = refused({"version": 3, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n9"]}, "n9")
    assert "n9" in st["error"]
    st = refused({"version": 3, "tp": 1, "pp": 6, "dp": 1, "nodes": ["n0"]}, "layers")
    assert "pp" in st["error"]
    st = refused({"version": 3, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"], "replicas": 1},
                 '"replicas": 1')
    assert "2 or more nodes" in st["error"]
    refused(None, "new.json", text='{"version": 3, "tp": 1, "pp": 1')
    refused(None, "tpp", text='{"version": 3, "tpp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]}')
    # Malformed JSON written straight to config.json: EINVAL and status says why.
    expect_errno(errno.EINVAL, mount.write, "config.json", '{"version": 3, "tp": 1, "pp"')
    st = mount.status()
    assert "config.json" in st["error"] and st["version"] == 2
    assert snapshot(mount) == before
    expect_errno(errno.EINVAL, mount.write, "config.json",
                 json.dumps({"version": 1, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]}))
    assert "not greater" in mount.status()["error"]

    # Steps not saved equally: rank 2 lags.
    write_steps(mount, cfg, 5)
    mount.write("ranks/2/step", "4")
    before = snapshot(mount)
    st = refused({"version": 3, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]}, "rank 2 lags")
    assert "rank 2" in st["error"] and "step 4" in st["error"] and "step 5" in st["error"]
    # Once it catches up, the same config goes through.
    mount.write("ranks/2/step", "5")
    new = {"version": 3, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]}
    reconfigure(mount, tmp_path, new)
    check_layout(mount, MIXED, new, full, step=5)
    assert mount.status()["error"] is None


# ---------------------------------------------- 7. readers during a change

def test_readers_see_old_or_new_never_a_mix(mount, tmp_path):
    schema = {"model": "big", "num_layers": 0, "states": {"model": {}},
              "tensors": [{"name": "w", "dtype": "float32", "shape": [4096, 4096],
                           "split": {"dim": 0}}]}
    mount.setup(schema, {"version": 1, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]})
    full = np.random.default_rng(7).standard_normal((4096, 4096)).astype(np.float32)
    np.save(mount.p("ranks/0/model/w.npy"), full)
    expected = {  # path -> acceptable contents
        "ranks/0/model/w.npy": [full, full[:2048]],
        "ranks/1/model/w.npy": [full[2048:]],
    }
    stop = threading.Event()
    seen = {"reads": 0, "enoent": 0, "shapes": set()}
    failures = []

    def reader(rel):
        while not stop.is_set():
            try:
                with open(mount.p(rel), "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                seen["enoent"] += 1
                time.sleep(0.001)
                continue
            except OSError as e:
                failures.append(f"{rel}: {e!r}")
                return
            try:
                got = np.load(io.BytesIO(data))
            except Exception as e:  # noqa: BLE001 - any parse failure is a mix
                failures.append(f"{rel}: {len(data)} bytes do not parse: {e!r}")
                return
            if not any(got.shape == a.shape and np.array_equal(got, a) for a in expected[rel]):
                failures.append(f"{rel}: read {got.shape} matching neither layout")
                return
            seen["reads"] += 1
            seen["shapes"].add((rel, got.shape))

    threads = [threading.Thread(target=reader, args=(rel,)) for rel in expected]
    for t in threads:
        t.start()
    try:
        # At least 16 reconfigurations, more on a slow machine until the readers
        # saw both layouts; ends on tp1 (odd version).
        v = 2
        while v < 18 or v % 2 == 1 or (v < 80 and (seen["reads"] < 10 or not seen["enoent"])):
            tp = 2 if v % 2 == 0 else 1
            reconfigure(mount, tmp_path, {"version": v, "tp": tp, "pp": 1, "dp": 1,
                                          "nodes": ["n0"]})
            time.sleep(0.1)
            v += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not failures, failures[:5]
    assert seen["reads"] >= 10 and seen["enoent"] > 0
    assert ("ranks/0/model/w.npy", (4096, 4096)) in seen["shapes"]
    assert ("ranks/0/model/w.npy", (2048, 4096)) in seen["shapes"]
    assert np.array_equal(np.load(mount.p("ranks/0/model/w.npy")), full)


def test_open_file_keeps_its_snapshot(mount, tmp_path):
    """A file opened before a reconfiguration reads the old layout to its end, even
    when the new layout's file at that path is smaller."""
    schema = {"model": "m", "num_layers": 0, "states": {"model": {}},
              "tensors": [{"name": "w", "dtype": "float32", "shape": [1024, 4096],
                           "split": {"dim": 0}}]}
    mount.setup(schema, {"version": 1, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]})
    full = np.random.default_rng(8).standard_normal((1024, 4096)).astype(np.float32)
    np.save(mount.p("ranks/0/model/w.npy"), full)
    buf = io.BytesIO()
    np.save(buf, full)
    want = buf.getvalue()
    with open(mount.p("ranks/0/model/w.npy"), "rb") as f:
        head = f.read(1 << 20)
        reconfigure(mount, tmp_path, {"version": 2, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"]})
        rest = f.read()
    assert len(head) + len(rest) == len(want)
    assert head + rest == want
    assert np.array_equal(np.load(mount.p("ranks/0/model/w.npy")), full[:512])


# ------------------------------------------------------------ 8. POSIX

def posix_sequence(root):
    """Runs file operations under @root; returns their results (values or errno names)."""
    log = []

    def do(label, fn, *args):
        try:
            res = fn(*args)
        except OSError as e:
            res = "E" + errno.errorcode[e.errno]
        log.append((label, res))
        return res

    def p(*parts):
        return os.path.join(root, *parts)

    def write(path, data, mode="wb"):
        with open(path, mode) as f:
            return f.write(data)

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    def write_at(path, off, data):
        fd = os.open(path, os.O_WRONLY)
        try:
            return os.pwrite(fd, data, off)
        finally:
            os.close(fd)

    def tree():
        out = []
        for d, dirs, files in os.walk(root):
            dirs.sort()
            rel = os.path.relpath(d, root)
            out.append((rel, sorted(dirs), sorted((f, os.path.getsize(os.path.join(d, f)))
                                                  for f in files)))
        return out

    def ftrunc(path, n):
        with open(path, "r+b") as f:
            f.truncate(n)
            f.seek(0)
            return f.read()

    do("mkdir a", os.mkdir, p("a"))
    do("mkdir a/b", os.mkdir, p("a", "b"))
    do("mkdir a again", os.mkdir, p("a"))
    do("mkdir in missing", os.mkdir, p("zz", "y"))
    do("write a/f", write, p("a", "f.txt"), b"hello world")
    do("read a/f", read, p("a", "f.txt"))
    do("append a/f", write, p("a", "f.txt"), b"!!", "ab")
    do("read a/f 2", read, p("a", "f.txt"))
    do("pwrite past end", write_at, p("a", "f.txt"), 20, b"XY")
    do("read sparse", read, p("a", "f.txt"))
    do("excl create", lambda: os.close(os.open(p("a", "f.txt"), os.O_CREAT | os.O_EXCL)))
    do("open missing", read, p("a", "nope"))
    do("listdir a", lambda: sorted(os.listdir(p("a"))))
    do("rename f into b", os.rename, p("a", "f.txt"), p("a", "b", "g.txt"))
    do("read moved", read, p("a", "b", "g.txt"))
    do("read old name", read, p("a", "f.txt"))
    do("write x", write, p("x.txt"), b"xxx")
    do("write y", write, p("y.txt"), b"yyyyyy")
    do("rename x over y", os.rename, p("x.txt"), p("y.txt"))
    do("read y", read, p("y.txt"))
    do("stat x", lambda: os.stat(p("x.txt")).st_size)
    do("rename dir b -> c", os.rename, p("a", "b"), p("c"))
    do("read via new dir", read, p("c", "g.txt"))
    do("tree 1", tree)
    do("rename file over dir", os.rename, p("y.txt"), p("c"))
    do("rename dir over file", os.rename, p("c"), p("y.txt"))
    do("mkdir d", os.mkdir, p("d"))
    do("write d/z", write, p("d", "z"), b"z")
    do("rename dir over nonempty dir", os.rename, p("c"), p("d"))
    do("rename dir into itself", os.rename, p("c"), p("c", "sub"))
    do("rename missing", os.rename, p("nope"), p("nope2"))
    do("mkdir e", os.mkdir, p("e"))
    do("rename dir over empty dir", os.rename, p("c"), p("e"))
    do("read via e", read, p("e", "g.txt"))
    do("rmdir nonempty", os.rmdir, p("e"))
    do("rmdir file", os.rmdir, p("y.txt"))
    do("unlink dir", os.unlink, p("d"))
    do("unlink file", os.unlink, p("e", "g.txt"))
    do("unlink again", os.unlink, p("e", "g.txt"))
    do("rmdir empty", os.rmdir, p("e"))
    do("rmdir again", os.rmdir, p("e"))
    do("write t", write, p("t.bin"), b"0123456789")
    do("truncate grow", os.truncate, p("t.bin"), 16)
    do("read grown", read, p("t.bin"))
    do("truncate shrink", os.truncate, p("t.bin"), 4)
    do("read shrunk", read, p("t.bin"))
    do("ftruncate grow", ftrunc, p("t.bin"), 9)
    do("ftruncate 0", ftrunc, p("t.bin"), 0)
    do("write w+ trunc", write, p("t.bin"), b"new", "wb")
    do("read t", read, p("t.bin"))
    do("file as dir", os.mkdir, p("t.bin", "sub"))
    do("listdir file", os.listdir, p("t.bin"))
    do("isdir d", os.path.isdir, p("d"))
    do("isfile t", os.path.isfile, p("t.bin"))
    do("tree 2", tree)
    return log


def test_posix_job_dir_matches_tmpfs(mount, tmp_path):
    ref_root = tmp_path / "ref"
    ref_root.mkdir()
    ref = posix_sequence(str(ref_root))
    got = posix_sequence(mount.p("job"))
    for (label, want), (_, res) in zip(ref, got):
        assert res == want, f"{label}: mlfs {res!r}, local fs {want!r}"
    assert len(ref) == len(got)
    # job/ is there before any schema or config, and survives a reconfiguration.
    mount.setup(MIXED, {"version": 1, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]})
    reconfigure(mount, tmp_path, {"version": 2, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"]})
    assert mount.read("job/t.bin") == b"new"
    assert sorted(os.listdir(mount.p("job"))) == ["a", "d", "t.bin", "y.txt"]


def test_fixed_tree_refuses_changes(mount):
    schema = {"model": "m", "num_layers": 0, "states": {"model": {}},
              "tensors": [{"name": "x/w", "dtype": "float32", "shape": [8, 4]}]}
    mount.setup(schema, {"version": 1, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]})
    part = mount.p("ranks/0/model/x/w.npy")
    np.save(part, np.ones((8, 4), np.float32))

    def perm(fn, *args):
        with pytest.raises(OSError) as e:
            fn(*args)
        assert e.value.errno in (errno.EPERM, errno.EACCES), (fn.__name__, args, e.value)

    perm(os.mkdir, mount.p("ranks/new"))
    perm(os.mkdir, mount.p("ranks/0/model/y"))
    perm(os.mkdir, mount.p("newdir"))
    expect_errno(errno.EPERM, os.unlink, part)
    expect_errno(errno.EPERM, os.unlink, mount.p("ranks/0/step"))
    expect_errno(errno.EPERM, os.rmdir, mount.p("ranks/0/model/x"))
    expect_errno(errno.EPERM, os.rename, part, mount.p("ranks/0/model/x/v.npy"))
    expect_errno(errno.EPERM, os.rename, part, mount.p("job/w.npy"))
    expect_errno(errno.EPERM, os.rename, mount.p("ranks/0"), mount.p("ranks/1"))
    expect_errno(errno.EPERM, open, mount.p("ranks/0/model/x/new.npy"), "wb")
    expect_errno(errno.EACCES, mount.write, "status.json", "{}")
    expect_errno(errno.EACCES, mount.write, "cluster.json", "{}")
    expect_errno(errno.EACCES, mount.write, "ranks/0/rank.json", "{}")
    expect_errno(errno.EACCES, mount.write, "full/model/x/w.npy", b"")
    expect_errno(errno.EINVAL, os.truncate, part, 10)
    expect_errno(errno.EINVAL, os.truncate, part, 0)
    expect_errno(errno.ENOTSUP, os.setxattr, part, "user.mlfs.dtype", b"float64")
    expect_errno(errno.ENOTSUP, os.setxattr, mount.p("job"), "user.x", b"1")
    assert os.getxattr(part, "user.mlfs.dtype") == b"float32"
    # Nothing changed.
    assert np.array_equal(np.load(part), np.ones((8, 4), np.float32))
    assert sorted(os.listdir(mount.p("ranks/0/model/x"))) == ["w.npy"]
    assert os.listdir(mount.p("ranks")) == ["0"]


# --------------------------------------------------------- 9. memory bound

def test_max_memory(mount_factory, tmp_path):
    m = mount_factory(max_memory="64M")
    mib = 1 << 20
    schema = {"model": "m", "num_layers": 0, "states": {"model": {}},
              "tensors": [{"name": "w", "dtype": "float32", "shape": [5 * mib // 4, 4],
                           "split": {"dim": 0}}]}
    m.write("schema.json", json.dumps(schema))
    # 4 replicas of 20 MiB do not fit in 64 MiB.
    with pytest.raises(OSError) as e:
        m.write("config.json", json.dumps({"version": 1, "tp": 1, "pp": 1, "dp": 4,
                                           "nodes": ["n0"]}))
    assert e.value.errno in (errno.ENOSPC, errno.EINVAL)
    st = m.status()
    assert st["version"] is None and "max-memory" in st["error"]
    assert os.listdir(m.p("ranks")) == []
    # 3 fit (60 MiB).
    cfg = {"version": 1, "tp": 1, "pp": 1, "dp": 3, "nodes": ["n0"]}
    m.write("config.json", json.dumps(cfg))
    st = m.status()
    assert st["memory_limit"] == 64 * mib and st["memory_used"] >= 60 * mib
    # Staging a 20 MiB write pushes past the limit: ENOSPC, content kept.
    new = np.ones((5 * mib // 4, 4), np.float32)
    with pytest.raises(OSError) as e:
        np.save(m.p("ranks/0/model/w.npy"), new)
    assert e.value.errno == errno.ENOSPC
    # The daemon goes on serving.
    assert not np.load(m.p("ranks/0/model/w.npy"), mmap_mode="r")[::4096].any()
    m.write("job/note", "still here")
    assert m.read("job/note") == b"still here"
    assert m.status()["memory_used"] <= 64 * mib
    # Re-slicing for tp 2 needs 20 MiB of new partitions while the old ones (60 MiB)
    # stay current: refused before it starts, saying how much.
    write_steps(m, cfg, 1)
    path = tmp_path / "new.json"
    path.write_text(json.dumps({"version": 2, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"]}))
    p = run_mlfs("reconfigure", m.path, path, check=False)
    assert p.returncode == 1
    st = m.status()
    assert str(20 * mib) in st["error"] and "max-memory" in st["error"], st["error"]
    assert str(20 * mib) in p.stderr
    assert st["version"] == 1 and st["state"] == "idle"
    assert sorted(os.listdir(m.p("ranks"))) == ["0", "1", "2"]
    # More DP replicas share the partitions: no memory needed.
    path.write_text(json.dumps({"version": 2, "tp": 1, "pp": 1, "dp": 4, "nodes": ["n0"]}))
    run_mlfs("reconfigure", m.path, path)
    assert m.status()["last"]["bytes_reused"] == 80 * mib
    # 60 MiB of partitions, plus what metadata and job/ count (small).
    assert m.status()["memory_used"] <= 61 * mib
    path.write_text(json.dumps({"version": 3, "tp": 1, "pp": 1, "dp": 2, "nodes": ["n0"]}))
    run_mlfs("reconfigure", m.path, path)
    assert sorted(os.listdir(m.p("ranks"))) == ["0", "1"]
    # With room again, writes and the tp 2 layout fit.
    np.save(m.p("ranks/0/model/w.npy"), new)
    np.save(m.p("ranks/1/model/w.npy"), new)
    assert np.array_equal(np.load(m.p("ranks/0/model/w.npy")), new)
    path.write_text(json.dumps({"version": 4, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"]}))
    run_mlfs("reconfigure", m.path, path)
    for r in range(2):
        got = np.load(m.p(f"ranks/{r}/model/w.npy"))
        assert got.shape == (5 * mib // 8, 4)
        assert np.array_equal(got, new[r * 5 * mib // 8:(r + 1) * 5 * mib // 8])
    assert m.status()["error"] is None


# ---------------------------------------------------------- 10. unmount

def test_umount_exits_clean(mount_factory, tmp_path):
    m = mount_factory()
    m.setup(MIXED, {"version": 1, "tp": 2, "pp": 2, "dp": 2, "nodes": ["n0"]})
    full = make_full(MIXED, np.random.default_rng(10))
    write_full(tmp_path / "ckpt", full)
    m.mlfs("import", "--from", tmp_path / "ckpt", "--step", "2")
    a = np.load(m.p("ranks/3/model/layers/1/qkv/weight.npy"))
    np.save(m.p("ranks/3/model/layers/1/qkv/weight.npy"), a + 1)
    m.write("job/x", "1")
    p = m.mlfs("status")
    assert "version 1" in p.stdout and "step 2" in p.stdout
    m.umount()
    assert os.listdir(m.path) == []
    assert m.proc.returncode == 0
