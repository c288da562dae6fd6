"""Reconfiguration as a state machine (issue 11, item 1): prepare, commit and abort
through the control file, as the cluster coordinator will drive them, and the
one-node path through config.json that does all three by itself.

While an attempt is preparing or prepared the old layout stays current and
readable, byte for byte, and partition and step writes get EBUSY; an abort
leaves it exactly as it was and gives the memory back; a commit makes the new
layout current, checked against NumPy slices of the full tensors
(test_store.py's reference, independent of the daemon's code). Requests in the
wrong state are refused with a message that names the state.
"""
import errno
import json
import os
import time

import numpy as np
import pytest

from test_store import (MIXED, check_layout, expect_errno, make_full, np_dtype, snapshot,
                        write_full, write_steps)

V1 = {"version": 1, "tp": 2, "pp": 2, "dp": 2, "nodes": ["n0"]}
V2 = {"version": 2, "tp": 4, "pp": 1, "dp": 2, "nodes": ["n0"]}


def ctl(m, **req):
    """Sends one request to <mnt>/.mlfs-ctl; returns (errno of the write or 0, reply)."""
    fd = os.open(m.p(".mlfs-ctl"), os.O_RDWR)
    try:
        err = 0
        try:
            os.write(fd, json.dumps(req).encode())
        except OSError as e:
            err = e.errno
        reply = json.loads(os.pread(fd, 65536, 0))
    finally:
        os.close(fd)
    assert reply["ok"] == (err == 0), reply
    return err, reply


def prepare(m, cfg):
    return ctl(m, op="prepare", config=json.dumps(cfg))


def refused(m, code, words, **req):
    """The request fails with @code, and its reply and status.json name every word."""
    err, reply = ctl(m, **req)
    assert err == code, (errno.errorcode.get(err), reply)
    for w in words:
        assert w in reply["error"], reply
        assert w in m.status()["error"], m.status()
    return reply


def wait_state(m, *states, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        st = m.status()
        if st["state"] in states:
            return st
        assert st["state"] != "failed", st
        assert time.monotonic() < deadline, st
        time.sleep(0.01)


def wait_memory(m, want, timeout=10):
    """memory_used comes back to @want (a closed file's text is let go by the kernel's
    release, just after close returns)."""
    deadline = time.monotonic() + timeout
    while m.status()["memory_used"] != want and time.monotonic() < deadline:
        time.sleep(0.01)
    assert m.status()["memory_used"] == want


def settled_memory(m, timeout=10):
    """memory_used once it stops changing: buffers superseded by a write or an import are
    let go when the kernel releases the writer's file and forgets the old inodes, a little
    after the write returns."""
    deadline = time.monotonic() + timeout
    last = m.status()["memory_used"]
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = m.status()["memory_used"]
        if now == last:
            return now
        last = now
    raise AssertionError(f"memory_used still changing after {timeout} s")


def imported(m, tmp_path, cfg=V1, step=5, seed=1):
    """MIXED under @cfg with a random checkpoint imported at @step; returns the full tensors."""
    m.setup(MIXED, cfg)
    full = make_full(MIXED, np.random.default_rng(seed))
    write_full(tmp_path / "ckpt", full)
    m.mlfs("import", "--from", tmp_path / "ckpt", "--step", step)
    return full


def some_partition(m, full):
    """Path and content of rank 1's model/layers/0/qkv/weight.npy under V1."""
    path = m.p("ranks/1/model/layers/0/qkv/weight.npy")
    return path, np.load(path)


def test_prepare_abort_then_prepare_commit(mount, tmp_path):
    m = mount
    full = imported(m, tmp_path)
    before = snapshot(m)
    part, content = some_partition(m, full)
    base = settled_memory(m)

    err, reply = prepare(m, V2)
    assert err == 0 and reply["state"] in ("preparing", "prepared"), reply
    st = wait_state(m, "prepared")
    assert st["version"] == 1 and st["target_version"] == 2 and st["error"] is None
    assert st["progress_bytes"] == st["progress_total"] > 0
    assert st["memory_used"] > base  # the new partitions, built beside the old ones

    # The old layout stays current and readable, to the byte; writes wait.
    check_layout(m, MIXED, V1, full, step=5)
    got = np.load(m.p("full/model/layers/2/qkv/weight.npy"))
    assert np.array_equal(got, full[("model", "layers/2/qkv/weight")])
    expect_errno(errno.EBUSY, np.save, part, content + 1)
    expect_errno(errno.EBUSY, m.write, "ranks/0/step", "6\n")
    expect_errno(errno.EBUSY, m.write, "config.json", json.dumps(dict(V2, version=3)))
    assert "version 2 is in progress (prepared)" in m.status()["error"]
    p = m.mlfs("import", "--from", tmp_path / "ckpt", "--step", "9", check=False)
    assert p.returncode == 1 and "in progress" in p.stderr, p.stderr
    assert snapshot(m) == before

    # Requests that do not fit the prepared attempt.
    refused(m, errno.EBUSY, ["prepare:", "version 2 is in progress (prepared)"],
            op="prepare", config=json.dumps(dict(V2, version=3)))
    refused(m, errno.EINVAL, ["commit:", "version 3", "version 2"], op="commit", version=3)
    refused(m, errno.EINVAL, ["abort:", "version 3", "version 2"], op="abort", version=3)
    assert m.status()["state"] == "prepared"

    # Abort: the old layout exactly as it was, the memory back, writes open again.
    err, reply = ctl(m, op="abort", version=2, reason="node n3 failed to fetch")
    assert err == 0 and reply["state"] == "failed", reply
    st = m.status()
    assert st["state"] == "failed" and st["version"] == 1 and "target_version" not in st
    assert st["error"] == "reconfiguration to version 2 aborted: node n3 failed to fetch"
    wait_memory(m, base)
    assert "last" not in st
    assert snapshot(m) == before
    check_layout(m, MIXED, V1, full, step=5)
    refused(m, errno.EINVAL, ["commit:", "no reconfiguration is in progress (state failed)"],
            op="commit", version=2)
    refused(m, errno.EINVAL, ["abort:", "no reconfiguration is in progress (state failed)"],
            op="abort", version=2)
    np.save(part, content + 1)
    np.save(part, content)
    write_steps(m, V1, 5)

    # Prepared again, then committed: the new layout, from the same saved step.
    assert prepare(m, V2)[0] == 0
    wait_state(m, "prepared")
    check_layout(m, MIXED, V1, full, step=5)
    err, reply = ctl(m, op="commit", version=2)
    assert err == 0 and reply["state"] == "idle", reply
    st = m.status()
    assert st["state"] == "idle" and st["version"] == 2 and st["error"] is None
    assert st["last"]["from_version"] == 1 and st["last"]["to_version"] == 2
    assert st["last"]["bytes_copied"] > 0 and st["step"] == 5
    check_layout(m, MIXED, V2, full, step=5)
    refused(m, errno.EINVAL, ["commit:", "no reconfiguration is in progress (state idle)"],
            op="commit", version=2)
    # Writes go to the new layout.
    np.save(m.p("ranks/0/model/final_norm/weight.npy"), np.arange(8, dtype=np.float32))
    assert np.array_equal(np.load(m.p("full/model/final_norm/weight.npy")), np.arange(8))


def test_abort_while_preparing(mount_factory):
    """An abort that comes while the build runs discards it when it ends: aborting, then
    failed, with the memory back and the old layout as it was."""
    m = mount_factory(max_memory="1G")
    schema = {"model": "big", "num_layers": 0, "states": {"model": {}, "opt": {}},
              "tensors": [{"name": "w", "dtype": "float32", "shape": [8192, 4096],
                           "split": {"dim": 0}}]}
    cfg = {"version": 1, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]}
    m.setup(schema, cfg)
    w = np.arange(8192 * 4096, dtype=np.float32).reshape(8192, 4096)
    np.save(m.p("ranks/0/model/w.npy"), w)
    base = settled_memory(m)
    assert prepare(m, {"version": 2, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"]})[0] == 0
    err, reply = ctl(m, op="abort", version=2, reason="coordinator gone")
    assert err == 0 and reply["state"] in ("aborting", "failed"), reply
    st = wait_state(m, "failed")
    assert st["error"] == "reconfiguration to version 2 aborted: coordinator gone"
    assert st["version"] == 1
    wait_memory(m, base)
    assert np.array_equal(np.load(m.p("ranks/0/model/w.npy"), mmap_mode="r")[::512], w[::512])
    assert sorted(os.listdir(m.p("ranks"))) == ["0"]


def test_requests_in_the_wrong_state(mount, tmp_path):
    m = mount
    # Nothing to reconfigure yet.
    refused(m, errno.EINVAL, ["prepare:", "no current layout"], op="prepare",
            config=json.dumps(V1))
    m.write("schema.json", json.dumps(MIXED))
    refused(m, errno.EINVAL, ["prepare:", "no current layout"], op="prepare",
            config=json.dumps(V1))
    refused(m, errno.EINVAL, ["commit:", "no reconfiguration is in progress (state idle)"],
            op="commit", version=1)
    refused(m, errno.EINVAL, ["abort:", "no reconfiguration is in progress (state idle)"],
            op="abort", version=1, reason="x")
    m.write("config.json", json.dumps(V1))
    # Malformed requests.
    refused(m, errno.EINVAL, ["prepare:", "\"config\""], op="prepare")
    refused(m, errno.EINVAL, ["prepare:", "\"config\""], op="prepare", config=V2)
    refused(m, errno.EINVAL, ["commit:", "\"version\""], op="commit")
    refused(m, errno.EINVAL, ["abort:", "\"version\""], op="abort", version="2")
    refused(m, errno.EINVAL, ["abort:", "\"reason\""], op="abort", version=2, reason=7)
    # Configs refused as config.json refuses them, named "prepare".
    refused(m, errno.EINVAL, ["prepare:", "not greater than the current 1"], op="prepare",
            config=json.dumps(dict(V2, version=1)))
    refused(m, errno.EINVAL, ["prepare:"], op="prepare", config='{"version": 2, "tp"')
    refused(m, errno.EINVAL, ["prepare:", "n9"], op="prepare",
            config=json.dumps(dict(V2, nodes=["n9"])))
    m.write("ranks/3/step", "4")
    refused(m, errno.EINVAL, ["prepare:", "rank 0 lags", "rank 3 saved step 4"],
            op="prepare", config=json.dumps(V2))
    st = m.status()
    assert st["state"] == "idle" and st["version"] == 1
    # A commit before the build ends waits its turn: EBUSY, or it is prepared already.
    write_steps(m, V1, 4)
    assert prepare(m, V2)[0] == 0
    err, reply = ctl(m, op="commit", version=2)
    if err:
        assert err == errno.EBUSY and "is preparing" in reply["error"], reply
        wait_state(m, "prepared")
        assert ctl(m, op="commit", version=2)[0] == 0
    assert m.status()["version"] == 2 and m.status()["state"] == "idle"
    zeros = {k: np.zeros_like(v) for k, v in make_full(MIXED, np.random.default_rng(0)).items()}
    check_layout(m, MIXED, V2, zeros, step=4)


def test_config_json_still_reconfigures_by_itself(mount, tmp_path):
    """One node: writing config.json validates, prepares and commits; `mlfs reconfigure`
    waits and reports as before, and status.json goes back to idle."""
    m = mount
    full = imported(m, tmp_path, step=7, seed=2)
    cfg = V1
    for v, (tp, pp, dp) in enumerate([(1, 4, 2), (4, 2, 1), (2, 1, 3)], start=2):
        cfg = {"version": v, "tp": tp, "pp": pp, "dp": dp, "nodes": ["n0"]}
        path = tmp_path / f"v{v}.json"
        path.write_text(json.dumps(cfg))
        p = m.mlfs("reconfigure", path)
        assert f"version {v}:" in p.stdout, p.stdout
        st = m.status()
        assert st["state"] == "idle" and st["version"] == v and st["error"] is None
        assert st["last"]["to_version"] == v and st["last"]["from_version"] == v - 1
        check_layout(m, MIXED, cfg, full, step=7)
    # A plain write of config.json, polled through status.json.
    cfg = dict(V2, version=9)
    m.write("config.json", json.dumps(cfg))
    st = wait_state(m, "idle")
    assert st["version"] == 9 and st["last"]["to_version"] == 9
    check_layout(m, MIXED, cfg, full, step=7)
    assert json.loads(m.read("config.json")) == cfg


def test_status_json_can_be_polled(mount, tmp_path):
    """status.json, kept open, turns readable (POLLIN | POLLPRI) when what a waiter
    reads in it changed since the open (the state, the version, an error), and not
    before: `mlfs reconfigure` waits on it instead of reading it every few ms. Any
    other file is always readable."""
    import select
    m = mount
    imported(m, tmp_path)

    def opened():
        fd = os.open(m.p("status.json"), os.O_RDONLY)
        return fd, json.loads(os.pread(fd, 1 << 20, 0))

    def polled(fd, ms):
        p = select.poll()
        p.register(fd, select.POLLIN | select.POLLPRI)
        return p.poll(ms)

    fd, st = opened()
    try:
        assert st["state"] == "idle" and st["version"] == 1, st
        assert polled(fd, 300) == [], "nothing changed, yet status.json polled readable"
        err, _ = prepare(m, V2)  # idle -> preparing -> prepared, from another handle
        assert err == 0
        t = time.monotonic()
        got = polled(fd, 10000)
        assert got and got[0][1] & select.POLLIN, got
        assert time.monotonic() - t < 5, "the poll waited past the change"
    finally:
        os.close(fd)
    wait_state(m, "prepared")
    fd, st = opened()
    try:
        assert st["state"] == "prepared", st
        assert polled(fd, 300) == []
        err, _ = ctl(m, op="commit", version=2)
        assert err == 0
        assert polled(fd, 10000), "the commit did not wake the poll"
    finally:
        os.close(fd)
    fd, st = opened()
    try:  # the text as of this open: the new version; a refusal wakes it again
        assert st["state"] == "idle" and st["version"] == 2, st
        expect_errno(errno.EINVAL, m.write, "config.json", "{not json")
        assert polled(fd, 10000), "a refused write (status.json's error) did not wake it"
    finally:
        os.close(fd)
    with open(m.p("config.json")) as f:  # any other file: readable at once
        p = select.poll()
        p.register(f.fileno(), select.POLLIN)
        assert p.poll(0), "config.json not readable"


def test_umount_with_a_prepared_attempt(mount_factory, tmp_path):
    """A prepared attempt never committed is discarded at unmount; the daemon exits 0."""
    m = mount_factory()
    imported(m, tmp_path, seed=3)
    assert prepare(m, V2)[0] == 0
    wait_state(m, "prepared")
    m.umount()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_full_tensors_during_prepared(mount, tmp_path, dtype):
    """full/ assembles from the old layout while prepared, from the new after commit."""
    m = mount
    schema = {"model": "m", "num_layers": 0, "states": {"model": {}},
              "tensors": [{"name": "emb", "dtype": dtype, "shape": [50, 6],
                           "split": {"dim": 0, "pad_multiple": 4}}]}
    m.setup(schema, {"version": 1, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"]})
    rng = np.random.default_rng(4)
    x = rng.integers(0, 2**15, (50, 6)).astype(np_dtype(dtype))
    np.save(m.p("ranks/0/model/emb.npy"), x[:28])
    part1 = np.zeros((28, 6), x.dtype)
    part1[:22] = x[28:]
    np.save(m.p("ranks/1/model/emb.npy"), part1)
    assert prepare(m, {"version": 2, "tp": 4, "pp": 1, "dp": 1, "nodes": ["n0"]})[0] == 0
    wait_state(m, "prepared")
    assert np.array_equal(np.load(m.p("full/model/emb.npy")), x)
    assert sorted(os.listdir(m.p("ranks"))) == ["0", "1"]
    assert ctl(m, op="commit", version=2)[0] == 0
    assert np.array_equal(np.load(m.p("full/model/emb.npy")), x)
    assert sorted(os.listdir(m.p("ranks"))) == ["0", "1", "2", "3"]
    assert np.array_equal(np.load(m.p("ranks/3/model/emb.npy"))[:2], x[48:])
