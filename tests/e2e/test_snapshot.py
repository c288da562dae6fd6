"""Snapshots (`mlfs snapshot`) and restores from them (`mlfs import --from SNAPSHOT`):
zstd-compressed .npy boxes and a manifest written last; restored bit-exact into
another layout; a truncated or corrupt file refused by name with nothing changed."""
import json
import os
import shutil
import subprocess

import numpy as np

from test_store import (MIXED, check_layout, expand, expected_layout, make_full, tp_slice,
                        write_full)

SRC = {"version": 1, "tp": 2, "pp": 2, "dp": 2, "nodes": ["n0"]}
DST = {"version": 1, "tp": 4, "pp": 1, "dp": 1, "nodes": ["n0"]}


def load_zst(path):
    """zstd -d, then numpy.load: no mlfs involved."""
    raw = subprocess.run(["zstd", "-d", "-c", "-q", str(path)], check=True,
                         capture_output=True).stdout
    import io
    return np.load(io.BytesIO(raw))


def take_snapshot(tmp_path, mount_factory):
    src = mount_factory(name="src")
    src.setup(MIXED, SRC)
    full = make_full(MIXED, np.random.default_rng(18))
    ckpt = tmp_path / "ckpt"
    write_full(ckpt, full)
    src.mlfs("import", "--from", ckpt, "--step", "7")
    snap = tmp_path / "snap"
    p = src.mlfs("snapshot", "--to", snap)
    assert "manifest.json written" in p.stdout, p.stdout
    return src, full, snap


def test_snapshot_restores_into_another_layout(tmp_path, mount_factory):
    src, full, snap = take_snapshot(tmp_path, mount_factory)
    m = json.loads((snap / "manifest.json").read_text())
    assert m["format"] == "mlfs-snapshot" and m["step"] == 7 and m["level"] == 1
    assert m["schema"] == MIXED and m["config"] == SRC
    # Each row range once: the tp2 boxes of every state's logical tensors,
    # DP replicas and the tied output/weight not written again.
    files = {f["path"] for f in m["files"]}
    assert len(files) == len(m["files"])
    written = set()
    for d, _, names in os.walk(snap):
        written |= {os.path.relpath(os.path.join(d, n), snap) for n in names}
    assert written == files | {"manifest.json"}
    assert not any("output/weight" in f for f in files)
    for state in MIXED["states"]:
        for name, spec, _ in expand(MIXED):
            if "tied" in spec:
                continue
            mine = [f for f in m["files"] if f["state"] == state and f["tensor"] == name]
            split = spec.get("split")
            # qkv: 3 chunks per TP rank, each a box of its own
            want = 1 if not split else 2 * (3 if name.endswith("qkv/weight") else
                                             2 if name.endswith("fc1/weight") else 1)
            assert len(mine) == want, (state, name, mine)
            rows = sorted((f["offsets"][split["dim"]] if split else 0,
                           f["shape"][split["dim"]] if split else 1) for f in mine)
            at = 0
            for a, n in rows:
                assert a == at
                at += n
            assert at == (spec["shape"][split["dim"]] if split else 1)
    # Every file is an ordinary zstd .npy of its box (bf16 as its raw uint16).
    for f in m["files"]:
        if f["tensor"] in ("layers/2/qkv/weight", "layers/1/proj/weight", "pos/weight"):
            a = load_zst(snap / f["path"])
            box = full[(f["state"], f["tensor"])]
            sl = tuple(slice(o, o + n) for o, n in zip(f["offsets"], f["shape"]))
            assert a.dtype == box.dtype and np.array_equal(a, box[sl]), f
            assert f["dtype"] == ("float32" if f["state"] == "optim/exp_avg" else
                                  dict((n, s["dtype"]) for n, s, _ in expand(MIXED))[f["tensor"]])
    # Another mount, another layout: bit-exact, the snapshot's step.
    dst = mount_factory(name="dst", devices=4)
    dst.setup(MIXED, DST)
    p = dst.mlfs("import", "--from", snap)
    assert p.returncode == 0
    check_layout(dst, MIXED, DST, full, step=7)
    assert dst.status()["error"] is None
    out = np.load(dst.p("ranks/3/model/embedding/weight.npy"))
    assert np.array_equal(out[:14], tp_slice(full[("model", "embedding/weight")],
                                             MIXED["tensors"][0]["split"], 4, 3)[:14])
    # And back into the first layout, over other data.
    src.mlfs("import", "--from", tmp_path / "ckpt", "--step", "3")
    src.mlfs("import", "--from", snap)
    check_layout(src, MIXED, SRC, full, step=7)


def test_snapshot_refusals(tmp_path, mount_factory):
    src, full, snap = take_snapshot(tmp_path, mount_factory)
    # A directory that holds a snapshot is not written again.
    p = src.mlfs("snapshot", "--to", snap, check=False)
    assert p.returncode == 1 and "holds a snapshot already" in p.stderr
    # Ranks that saved different steps: refused, naming them.
    src.write("ranks/5/step", "8")
    p = src.mlfs("snapshot", "--to", tmp_path / "snap2", check=False)
    assert p.returncode == 1 and "rank 0 lags at step 7 while rank 5 saved step 8" in p.stderr
    assert not (tmp_path / "snap2" / "manifest.json").exists()


def test_snapshot_damaged_files_refused(tmp_path, mount_factory):
    _, full, snap = take_snapshot(tmp_path, mount_factory)
    dst = mount_factory(name="dst", devices=4)
    dst.setup(MIXED, DST)
    other = make_full(MIXED, np.random.default_rng(5))
    write_full(tmp_path / "other", other)
    dst.mlfs("import", "--from", tmp_path / "other", "--step", "3")
    m = json.loads((snap / "manifest.json").read_text())
    name = next(f["path"] for f in m["files"] if f["tensor"] == "layers/4/fc1/weight")

    def refused(bad, why):
        p = dst.mlfs("import", "--from", bad, check=False)
        assert p.returncode == 1
        assert name in p.stderr and why in p.stderr, p.stderr
        assert name in dst.status()["error"]
        check_layout(dst, MIXED, DST, other, step=3)  # nothing changed

    cut = tmp_path / "cut"
    shutil.copytree(snap, cut)
    data = (cut / name).read_bytes()
    (cut / name).write_bytes(data[:len(data) // 2])
    refused(cut, "truncated")

    flip = tmp_path / "flip"
    shutil.copytree(snap, flip)
    data = bytearray((flip / name).read_bytes())
    data[len(data) // 2] ^= 0x10
    (flip / name).write_bytes(bytes(data))
    refused(flip, "corrupt")

    # A file that is not the one the manifest describes (another job's, of the
    # same size): its bytes do not hash to the manifest's checksum.
    foreign = tmp_path / "foreign"
    shutil.copytree(snap, foreign)
    m2 = json.loads((foreign / "manifest.json").read_text())
    entry = next(f for f in m2["files"] if f["path"] == name)
    entry["xxh3"] = "%016x" % (int(entry["xxh3"], 16) ^ 1)
    (foreign / "manifest.json").write_text(json.dumps(m2))
    refused(foreign, "checksum mismatch")

    # A manifest of another schema: refused naming the entry.
    alien = tmp_path / "alien"
    shutil.copytree(snap, alien)
    m3 = json.loads((alien / "manifest.json").read_text())
    entry = next(f for f in m3["files"] if f["path"] == name)
    entry["tensor_shape"] = [21, 6]
    (alien / "manifest.json").write_text(json.dumps(m3))
    refused(alien, "its tensor's shape is not the schema's")

    # Nothing wrong: it restores.
    dst.mlfs("import", "--from", snap)
    check_layout(dst, MIXED, DST, full, step=7)


# ------------------------------------------------------------- many nodes

from conftest import MLFS  # noqa: E402


def test_job_snapshot_survives_every_daemon(tmp_path, cluster_factory):
    """A 4-node job at tp2 pp2 dp2: `mlfs snapshot` on every node into one shared
    directory (each node writes the boxes it owns, rank 0's node the manifest); every
    daemon killed and the job reset; restored into tp4 pp1 dp1 on 2 nodes, bit-exact."""
    cl = cluster_factory(nnodes=4, devices=2)
    full = make_full(MIXED, np.random.default_rng(44))
    v1 = {"version": 1, "tp": 2, "pp": 2, "dp": 2, "nodes": ["n0", "n1", "n2", "n3"]}
    cl.start_job(MIXED, v1, "n0", full, step=5)
    snap = tmp_path / "shared-snap"
    for attempt in range(50):  # until every node saw every rank's step 5
        procs = [subprocess.Popen([str(MLFS), "snapshot", n.path, "--to", snap, "--wait", "60"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for n in cl.nodes]
        outs = [(p.wait(timeout=120), *p.communicate()) for p in procs]
        if all(rc == 0 for rc, _, _ in outs):
            break
        assert all(rc == 0 or "same step" in err for rc, _, err in outs), outs
        shutil.rmtree(snap, ignore_errors=True)
        import time
        time.sleep(0.2)
    assert all(rc == 0 for rc, _, _ in outs), outs
    assert "manifest.json written" in outs[0][1], outs
    m = json.loads((snap / "manifest.json").read_text())
    assert m["step"] == 5 and not [f for f in os.listdir(snap) if f.startswith(".")]
    # Each row range once in the job: the same files as a one-node snapshot would hold.
    assert len({f["path"] for f in m["files"]}) == len(m["files"])

    for n in cl.nodes:
        cl.kill(n.id)
    for n in cl.nodes:
        cl.wait_down(n.id)
    r = subprocess.run([str(MLFS), "reset", "--cluster", cl.cluster_path],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for n in ("n0", "n1", "n2", "n3"):
        cl.restart(n)
    cl.wait(lambda: all(s["state"] == "idle" and not s.get("version")
                        for s in cl.statuses().values()), "a fresh job", timeout=30)
    v2 = {"version": 1, "tp": 4, "pp": 1, "dp": 1, "nodes": ["n0", "n1"]}
    cl["n0"].write("config.json", json.dumps(v2))
    cl.wait_version(1)
    for nid in ("n0", "n1"):
        p = cl[nid].mlfs("import", "--from", snap, check=False)
        assert p.returncode == 0, f"{nid}: {p.stderr}"
    cl.wait_published(v2, 5)
    cl.check_layout(MIXED, v2, full, step=5, nodes=["n0", "n1"])


# ------------------------------------------------------- periodic snapshots

# 2 MiB per step: at "max_mib_s": 1 a snapshot takes about 2 s, while the writer
# saves the next steps over the same partitions.
BIG = {"model": "big", "num_layers": 2, "states": {"model": {}},
       "tensors": [{"name": "layers/{L}/w", "dtype": "float32", "shape": [512, 512],
                    "split": {"dim": 0}},
                   {"name": "norm/weight", "dtype": "bfloat16", "shape": [512]}]}


def save_step(m, schema, cfg, full, step):
    """What a training step's save does: every rank's partitions, then its step."""
    for r, files in expected_layout(schema, cfg, full).items():
        for rel, a in files.items():
            with open(m.p("ranks", r, rel), "wb") as f:
                np.save(f, a)
        m.write(f"ranks/{r}/step", str(step))


def check_snapshot_holds(snap, full):
    """Every box of the snapshot in @snap equals the same box of @full."""
    m = json.loads((snap / "manifest.json").read_text())
    for f in m["files"]:
        a = load_zst(snap / f["path"])
        sl = tuple(slice(o, o + n) for o, n in zip(f["offsets"], f["shape"]))
        assert np.array_equal(a, full[(f["state"], f["tensor"])][sl]), (snap, f["path"])
    return m


def wait_snapshots(m, step, timeout=60):
    import time
    deadline = time.monotonic() + timeout
    while True:
        sn = m.status()["snapshots"]
        if sn["writing"] is None and sn["newest_step"] == step:
            return sn
        assert time.monotonic() < deadline, sn
        time.sleep(0.1)


def test_periodic_snapshots_never_mix_steps(tmp_path, mount_factory):
    """"snapshot": {"every": 2, "keep": 2, "max_mib_s": 1}: a writer saves 14 steps,
    each with other values, faster than the snapshots are written; every
    snapshot left holds exactly its step's values (the pins are taken at the step
    write, so a save racing the snapshot writer never leaks into it), steps that came
    due while one was written are skipped, older snapshots are removed, status.json and
    `mlfs status` name the newest, and it restores."""
    snaps = tmp_path / "snaps"
    cfg = {"version": 1, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"],
           "snapshot": {"dir": str(snaps), "every": 2, "keep": 2, "max_mib_s": 1}}
    m = mount_factory(name="src")
    m.setup(BIG, cfg)
    fulls = {}
    import time
    for step in range(1, 15):  # a step every ~0.25 s, a snapshot takes ~2 s
        fulls[step] = make_full(BIG, np.random.default_rng(100 + step))
        save_step(m, BIG, cfg, fulls[step], step)
        time.sleep(0.2)
    sn = wait_snapshots(m, 14)
    assert sn["error"] is None and sn["dir"] == str(snaps), sn
    assert sn["written"] >= 2 and sn["written"] + sn["skipped"] <= 7, sn
    left = sorted(os.listdir(snaps), key=lambda d: int(d[5:]))
    complete = [d for d in left if (snaps / d / "manifest.json").exists()]
    assert complete[-1] == "step-14" and len(complete) == 2, left
    assert all(int(d[5:]) % 2 == 0 for d in left), left
    for d in complete:
        step = int(d[5:])
        man = check_snapshot_holds(snaps / d, fulls[step])
        assert man["step"] == step and man["config"] == cfg
    out = m.mlfs("status").stdout
    assert f"newest snapshot: step 14 in {snaps}/step-14" in out, out
    assert "periodic snapshots: every 2 steps" in out, out
    # The newest restores: step 14's saved state over other data.
    save_step(m, BIG, cfg, fulls[3], 3)
    m.mlfs("import", "--from", snaps / "step-14")
    check_layout(m, BIG, cfg, fulls[14], step=14)


# ------------------------------------------------------------ mlfs umount

def umount_on_tty(path, answer):
    """`mlfs umount <path>` with a terminal on stdin that types @answer."""
    import pty
    import select
    master, slave = pty.openpty()
    p = subprocess.Popen([str(MLFS), "umount", str(path)], stdin=slave, stdout=slave,
                         stderr=slave)
    os.close(slave)
    out = b""
    answered = False
    while True:
        r, _, _ = select.select([master], [], [], 30)
        assert r, out
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
        if not answered and b"[y/N]" in out:
            os.write(master, answer.encode())
            answered = True
    os.close(master)
    return p.wait(timeout=30), out.decode()


def test_umount_warns_before_losing_the_only_copy(tmp_path, mount_factory):
    """A node whose saved step is newer than the newest snapshot, with no copy on
    another node: `mlfs umount` names the step; on a terminal it asks, and "n" keeps
    the mount; a script (no terminal) is warned and unmounts; after a snapshot of the
    step, or with --force, nothing is asked."""
    src = mount_factory(name="src")
    src.setup(MIXED, SRC)
    full = make_full(MIXED, np.random.default_rng(18))
    write_full(tmp_path / "ckpt", full)
    src.mlfs("import", "--from", tmp_path / "ckpt", "--step", "7")
    rc, out = umount_on_tty(src.path, "n\n")
    assert rc == 1, out
    assert "node n0 holds the only copy of step 7" in out and "there is no snapshot" in out, out
    assert "stays mounted" in out and os.path.ismount(src.path)
    check_layout(src, MIXED, SRC, full, step=7)
    # A snapshot of step 7: the step is kept, so nothing to ask.
    src.mlfs("snapshot", "--to", tmp_path / "s7")
    assert src.status()["snapshots"]["newest_step"] == 7
    src.write("ranks/0/step", "8")  # rank 0 saved step 8 over it (status "step")
    rc, out = umount_on_tty(src.path, "n\n")
    assert rc == 1 and "only copy of step 8" in out and "newest snapshot is step 7" in out, out
    src.write("ranks/0/step", "7")
    rc, out = umount_on_tty(src.path, "n\n")
    assert rc == 0 and "warning" not in out, out
    src.wait_exit()
    # A script: warned, unmounted.
    other = mount_factory(name="other")
    other.setup(MIXED, SRC)
    other.mlfs("import", "--from", tmp_path / "ckpt", "--step", "3")
    p = other.mlfs("umount")
    assert p.returncode == 0 and "holds the only copy of step 3" in p.stderr, p.stderr
    other.wait_exit()
    assert not os.path.ismount(other.path)
    # --force: no question, no warning.
    third = mount_factory(name="third")
    third.setup(MIXED, SRC)
    third.mlfs("import", "--from", tmp_path / "ckpt", "--step", "3")
    p = third.mlfs("umount", "--force")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    third.wait_exit()


# ------------------------------------------------------------- mlfs resume

def test_whole_job_resumes_from_its_periodic_snapshot(tmp_path, cluster_factory):
    """A 4-node job at tp2 pp2 dp2 with "snapshot": {"every": 5}: every rank saves
    step 10 on its node, each node writes its boxes and n0 the manifest; every daemon
    killed and restarted (each lost); one `mlfs resume --cluster` restores step 10 into
    the committed layout, bit-exact, on every node. A second resume is refused (nodes
    hold state), and so is one into a job of another schema's snapshot."""
    cl = cluster_factory(nnodes=4, devices=2)
    full = make_full(MIXED, np.random.default_rng(46))
    snaps = tmp_path / "shared-snaps"
    v1 = {"version": 1, "tp": 2, "pp": 2, "dp": 2, "nodes": ["n0", "n1", "n2", "n3"],
          "snapshot": {"dir": str(snaps), "every": 5}}
    cl.start_job(MIXED, v1, "n0", full, step=3)
    for nid in ("n0", "n1", "n2", "n3"):
        for r in cl.hosted(v1, nid):
            cl[nid].write(f"ranks/{r}/step", "10")
    cl.wait(lambda: (snaps / "step-10" / "manifest.json").exists(), "the snapshot of step 10",
            timeout=60)
    m = check_snapshot_holds(snaps / "step-10", full)
    assert m["step"] == 10 and m["version"] == 1
    cl.wait(lambda: cl["n1"].status()["snapshots"]["newest_step"] == 10, "n1 sees it")

    for nid in ("n0", "n1", "n2", "n3"):
        cl.kill(nid)
    for nid in ("n0", "n1", "n2", "n3"):
        cl.wait_down(nid)
    for nid in ("n0", "n1", "n2", "n3"):
        cl.restart(nid)
    cl.wait(lambda: all(s["state"] == "lost" for s in cl.statuses().values()),
            "every node lost", timeout=30)
    r = subprocess.run([str(MLFS), "resume", "--cluster", cl.cluster_path, "--wait", "60"],
                       capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"restored from {snaps}/step-10 (step 10)" in r.stdout, r.stdout
    assert r.stdout.count("restored\n") == 4, r.stdout
    cl.wait(lambda: all(s["state"] == "idle" and not s.get("lost")
                        for s in cl.statuses().values()), "every node idle")
    cl.check_layout(MIXED, v1, full, step=10)
    # The job is whole again: a reconfiguration moves it as usual.
    v2 = {"version": 2, "tp": 4, "pp": 1, "dp": 1, "nodes": ["n0", "n1"]}
    cl.reconfigure("n2", v2)
    cl.check_layout(MIXED, v2, full, step=10, nodes=["n0", "n1"])
    # Nodes hold state now: refused, naming one; nothing put.
    r = subprocess.run([str(MLFS), "resume", "--cluster", cl.cluster_path],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and "is up and not lost" in r.stderr, r.stderr


def test_periodic_snapshot_on_a_full_disk(tmp_path, mount_factory):
    """The snapshot directory's file system fills up (a 4 MiB tmpfs: room for one
    snapshot of this model, 2 MiB of random floats): the snapshot of the next step
    fails with an error naming its step and the disk, the newest complete one stays
    the newest and restores, nothing else is removed; once there is room again, the
    next due step is written and the broken attempt is cleaned up."""
    import time
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    # -c (no canonicalization): mount and umount otherwise stat other mount points,
    # other tests' FUSE mounts included, which may then be busy at their unmount
    subprocess.run(["mount", "-c", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(snaps)],
                   check=True)
    try:
        cfg = {"version": 1, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"],
               "snapshot": {"dir": str(snaps), "every": 2, "keep": 1}}
        m = mount_factory(name="src")
        m.errors_expected = True  # the failed snapshot; checked below
        m.setup(BIG, cfg)
        fulls = {s: make_full(BIG, np.random.default_rng(300 + s)) for s in (2, 4, 6)}
        save_step(m, BIG, cfg, fulls[2], 2)
        sn = wait_snapshots(m, 2)
        assert sn["error"] is None, sn
        # Fill what is left.
        with open(snaps / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        save_step(m, BIG, cfg, fulls[4], 4)
        deadline = time.monotonic() + 60
        while True:
            sn = m.status()["snapshots"]
            if sn["error"] and sn["writing"] is None:
                break
            assert time.monotonic() < deadline, sn
            time.sleep(0.1)
        assert "step-4" in sn["error"] and "No space left on device" in sn["error"], sn
        assert sn["newest_step"] == 2 and sn["newest"] == f"{snaps}/step-2", sn
        assert (snaps / "step-2" / "manifest.json").exists()
        assert not (snaps / "step-4" / "manifest.json").exists()
        check_snapshot_holds(snaps / "step-2", fulls[2])
        out = m.mlfs("status").stdout
        assert "newest snapshot: step 2" in out and "No space left on device" in out, out
        assert "step-4" in m.stderr() and "No space left on device" in m.stderr()
        # Room again: step 6 is written, step 4's remains go, step 2 goes (keep 1).
        os.unlink(snaps / "filler")
        save_step(m, BIG, cfg, fulls[6], 6)
        sn = wait_snapshots(m, 6)
        assert sn["error"] is None, sn
        assert sorted(os.listdir(snaps)) == ["step-6"], os.listdir(snaps)
        check_snapshot_holds(snaps / "step-6", fulls[6])
        save_step(m, BIG, cfg, fulls[2], 7)
        m.mlfs("import", "--from", snaps / "step-6")
        check_layout(m, BIG, cfg, fulls[6], step=6)
    finally:
        subprocess.run(["umount", "-c", "-l", str(snaps)], check=False)
