"""The store under concurrency and faults (issue 10): every read is one version
of a partition, an import changes only what it imports, a file cut short
during an import or a control file shared between threads cannot hurt the
daemon, shell redirects write partitions, and the recommended memory-map
pattern survives reconfigurations.

The races are made likely rather than certain: several processes, loops for a
bounded time. Each test failed (most within a few seconds) before its fix.
"""
import errno
import io
import json
import multiprocessing as mp
import os
import subprocess
import threading
import time

import numpy as np
import pytest

from conftest import EXAMPLE, run_mlfs

SPEC = {"version": 1, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n0"]}


def one_tensor(shape, dtype="float32", split=0):
    return {"model": "m", "num_layers": 0, "states": {"model": {}, "opt": {}},
            "tensors": [{"name": "w", "dtype": dtype, "shape": list(shape),
                         "split": {"dim": split}}]}


def cfg(version, tp=1, pp=1, dp=1):
    return {"version": version, "tp": tp, "pp": pp, "dp": dp, "nodes": ["n0"]}


def mmap_load(path):
    """The memory-map pattern of docs/single-node.md: one open; the header and the mapping come
    from the same file descriptor, so they describe the same version."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        shape, fortran, dtype = np.lib.format._read_array_header(f, version)
        return np.memmap(f, dtype=dtype, mode="r", shape=shape, offset=f.tell(),
                         order="F" if fortran else "C")


def _load_loop(path, seconds, out, mode):
    """Child process: loads @path until @seconds pass; puts (loads, [problems])."""
    bad, n, end = [], 0, time.monotonic() + seconds
    while time.monotonic() < end and len(bad) < 5:
        try:
            if mode == "npload":
                a = np.load(path)
            elif mode == "mmap":
                m = mmap_load(path)
                a = np.array(m)
                del m
            else:  # raw: one open, one read of the whole file
                with open(path, "rb") as f:
                    raw = f.read()
                a = np.load(io.BytesIO(raw))
        except FileNotFoundError:
            continue
        except Exception as e:  # noqa: BLE001 - any failure to read is a problem
            bad.append(f"{type(e).__name__}: {e}")
            continue
        n += 1
        vals = np.unique(a)
        if len(vals) != 1:
            bad.append(f"shape {a.shape}: {len(vals)} values {vals[:4]}")
    out.put((n, bad))


def run_readers(path, seconds, mode, nproc=2):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_load_loop, args=(path, seconds, q, mode))
             for _ in range(nproc)]
    for p in procs:
        p.start()
    return procs, q


def join_readers(procs, q):
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0, f"reader died with {p.exitcode}"
    return sum(n for n, _ in results), [b for _, bad in results for b in bad]


@pytest.mark.parametrize("mode", ["npload", "mmap"])
def test_reads_during_writes_are_one_version(mount, mode):
    """Item 1: numpy.save of value k in a loop, two processes loading: every load
    holds one value (before the fix about 4% held rows of two)."""
    mount.setup(one_tensor((256, 1024)), SPEC)
    path = mount.p("ranks/0/model/w.npy")
    np.save(path, np.zeros((256, 1024), np.float32))
    procs, q = run_readers(path, 6, mode)
    k, end = 0, time.monotonic() + 6
    while time.monotonic() < end:
        k += 1
        np.save(path, np.full((256, 1024), k, np.float32))
    loads, bad = join_readers(procs, q)
    assert not bad, bad
    assert loads > 50 and k > 50, (loads, k)
    assert np.array_equal(np.load(path), np.full((256, 1024), k, np.float32))


@pytest.mark.parametrize("mode", ["raw", "mmap"])
def test_reads_during_reconfigurations_are_one_version(mount, tmp_path, mode):
    """Items 1 and 8: a tp 1 <-> 2 loop while two processes read ranks/0's
    partition: each read is one layout's whole file, its header and its bytes (and
    with the recommended mmap pattern, no SIGBUS)."""
    mount.setup(one_tensor((4096, 256)), cfg(1))
    path = mount.p("ranks/0/model/w.npy")
    np.save(path, np.full((4096, 256), 1, np.float32))  # value v is written at version v
    procs, q = run_readers(path, 8, mode)
    v, end = 1, time.monotonic() + 8
    while time.monotonic() < end:
        v += 1
        tp = v % 2 + 1
        p = tmp_path / "c.json"
        p.write_text(json.dumps(cfg(v, tp=tp)))
        run_mlfs("reconfigure", mount.path, p)
        for r in range(tp):
            np.save(mount.p(f"ranks/{r}/model/w.npy"), np.full((4096 // tp, 256), v, np.float32))
        for r in range(tp):
            mount.write(f"ranks/{r}/step", str(v))
    loads, bad = join_readers(procs, q)
    assert not bad, bad
    assert loads > 20 and v > 5, (loads, v)


# ------------------------------------------------------------------ imports

def big_opt_checkpoint(tmp_path, rows, value):
    """A checkpoint folder with only the "opt" state of one_tensor((rows, 1024))."""
    d = tmp_path / f"ckpt-{value}"
    (d / "opt").mkdir(parents=True, exist_ok=True)
    np.save(d / "opt" / "w.npy", np.full((rows, 1024), value, np.float32))
    return d


def test_import_changes_only_what_it_imports(mount, tmp_path):
    """Item 2: a write to a "model" partition that closes while `mlfs import --state
    opt` runs is kept (before the fix the import swapped in the whole table it had
    taken at its start: 2 of 10 trials lost the write)."""
    rows = 65536  # 256 MiB of "opt": the import takes long enough for writes to land inside
    schema = one_tensor((rows, 1024))
    schema["tensors"].append({"name": "s", "dtype": "float32", "shape": [16]})
    mount.setup(schema, SPEC)
    ckpt = big_opt_checkpoint(tmp_path, rows, 5)
    np.save(ckpt / "opt" / "s.npy", np.full(16, 5, np.float32))
    part = mount.p("ranks/0/model/s.npy")
    inside, trial = 0, 0
    while inside < 3 and trial < 16:  # until 3 writes landed inside an import
        imp = subprocess.Popen([str(mount_binary()), "import", str(mount.path), "--from",
                                str(ckpt), "--state", "opt"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.02 + 0.02 * (trial % 8))
        k = 100 + trial
        np.save(part, np.full(16, k, np.float32))  # acknowledged at its close
        landed = imp.poll() is None  # ... while the import still ran
        out, err = imp.communicate(timeout=120)
        assert imp.returncode == 0, err
        assert np.array_equal(np.load(part), np.full(16, k, np.float32)), \
            f"trial {trial}: the write of {k} was undone"
        assert np.load(mount.p("ranks/0/opt/w.npy"), mmap_mode="r")[-1, -1] == 5
        inside += landed
        trial += 1
    assert inside >= 3, "too few writes landed inside an import to test anything"


def mount_binary():
    from conftest import MLFS
    return MLFS


def test_import_of_a_file_cut_short(mount, tmp_path):
    """Item 3: a checkpoint file truncated while `mlfs import` reads it fails the
    import with an error naming the file, changes nothing, and the daemon lives on
    (before the fix: SIGBUS, the mount answered ENOTCONN)."""
    rows = 32768  # 128 MiB
    mount.setup(one_tensor((rows, 1024)), SPEC)
    part = mount.p("ranks/0/opt/w.npy")
    outcomes = set()
    for trial, delay in enumerate([0.0, 0.005, 0.01, 0.02, 0.04, 0.08]):
        ckpt = big_opt_checkpoint(tmp_path, rows, 10 + trial)
        path = ckpt / "opt" / "w.npy"
        before = np.array(np.load(part, mmap_mode="r")[[0, -1], [0, -1]])
        imp = subprocess.Popen([str(mount_binary()), "import", str(mount.path), "--from",
                                str(ckpt), "--state", "opt"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        os.truncate(path, 4096 + (trial * 7919) % 65536)
        out, err = imp.communicate(timeout=60)
        got = np.load(part, mmap_mode="r")  # the daemon is alive
        if imp.returncode == 0:
            outcomes.add("imported")
            assert got[0, 0] == 10 + trial and got[-1, -1] == 10 + trial
        else:
            outcomes.add("refused")
            assert "opt/w.npy" in err, err
            assert "opt/w.npy" in mount.status()["error"]
            assert np.array_equal(np.array(got[[0, -1], [0, -1]]), before), "half imported"
    assert "refused" in outcomes, outcomes


def test_import_refuses_a_fifo(mount, tmp_path):
    """Item 9: a FIFO in the checkpoint folder is refused at once, named."""
    mount.setup(one_tensor((8, 4)), SPEC)
    d = tmp_path / "ck"
    (d / "opt").mkdir(parents=True)
    os.mkfifo(d / "opt" / "w.npy")
    p = subprocess.run([str(mount_binary()), "import", str(mount.path), "--from", str(d),
                        "--state", "opt"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 1
    assert "opt/w.npy: not a regular file" in p.stderr, p.stderr


# ------------------------------------------------------------ control files

def test_control_file_shared_by_threads(mount):
    """Item 4: a pread and a write racing on one .mlfs-ctl descriptor (the write
    replaced the reply the read was copying: a use-after-free under ASan). Every
    read returns one whole reply."""
    fd = os.open(mount.p(".mlfs-ctl"), os.O_RDWR)
    stop = threading.Event()
    bad, reads = [], [0]

    def reader():
        while not stop.is_set():
            data = os.pread(fd, 65536, 0)
            if data:
                try:
                    json.loads(data)
                except ValueError:
                    bad.append(data[:80])
                reads[0] += 1

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        end, n = time.monotonic() + 3, 0
        while time.monotonic() < end:
            n += 1
            req = json.dumps({"op": "nothing-" + "x" * (n % 300)}).encode()
            try:
                os.pwrite(fd, req, 0)
            except OSError as e:
                assert e.errno == errno.EINVAL
    finally:
        stop.set()
        for t in threads:
            t.join()
        os.close(fd)
    assert not bad, bad[:3]
    assert reads[0] > 100
    assert "unknown op" in mount.status()["error"]


def test_control_text_limits_and_memory(mount_factory):
    """Item 5: control texts are bounded and counted: a config.json writer past 1 MiB
    gets EFBIG, and open writers' texts show in memory_used until they close."""
    m = mount_factory(max_memory="64M")
    base = m.status()["memory_used"]
    f = open(m.p("config.json"), "wb", buffering=0)
    try:
        f.write(b"[" + b" " * (512 << 10))
        assert m.status()["memory_used"] >= base + (512 << 10)
        with pytest.raises(OSError) as e:
            f.write(b" " * (600 << 10))
        assert e.value.errno == errno.EFBIG
    finally:
        with pytest.raises(OSError):
            f.close()  # the text never completed: refused at close
    # close() returns at the kernel's FLUSH; its RELEASE (which frees the text) follows
    # on its own, a moment later under a sanitizer.
    deadline = time.monotonic() + 5
    while m.status()["memory_used"] != base and time.monotonic() < deadline:
        time.sleep(0.01)
    assert m.status()["memory_used"] == base
    assert "config.json: more than 1048576 bytes" in m.status()["error"]


def test_big_schema_written_in_small_pieces(mount):
    """Item 6: a schema of several MB written 4 KiB at a time (dd bs=4k) is scanned
    once and parsed once (before: re-parsed at every write, 158 s for 5.6 MB)."""
    tensors = [{"name": f"block{i // 100}/" + "p" * 120 + f"/t{i}", "dtype": "float32",
                "shape": [2]} for i in range(30000)]
    text = json.dumps({"model": "many", "num_layers": 0, "states": {"model": {}},
                       "tensors": tensors})
    assert len(text) > 4 << 20
    src = mount.tmp / "big-schema.json"
    src.write_text(text)
    t0 = time.monotonic()
    subprocess.run(["dd", f"if={src}", f"of={mount.p('schema.json')}", "bs=4k",
                    "status=none"], check=True, timeout=120)
    assert time.monotonic() - t0 < 10, "a text written in pieces must be scanned once"
    assert mount.read("schema.json") == text.encode()
    mount.write("config.json", json.dumps(SPEC))
    assert os.path.exists(mount.p("ranks/0/model/block299/" + "p" * 120 + "/t29999.npy"))


# --------------------------------------------------------------- partitions

def test_shell_redirects_write_partitions(mount, tmp_path):
    """Item 7: `cat x > part`, `dd of=part` and `cp` write a partition (the shell
    opens with O_TRUNC, duplicates the descriptor and closes the original before
    writing: that first close must not commit an empty file)."""
    mount.setup(one_tensor((64, 256)), SPEC)
    part = mount.p("ranks/0/model/w.npy")
    for k, cmd in enumerate(["cat {src} > {dst}", "dd if={src} of={dst} bs=4k status=none",
                             "dd if={src} of={dst} bs=1000 status=none", "cp {src} {dst}",
                             "exec 3>{dst}; cat {src} >&3; exec 3>&-"], start=1):
        src = tmp_path / f"x{k}.npy"
        np.save(src, np.full((64, 256), k, np.float32))
        subprocess.run(["bash", "-c", cmd.format(src=src, dst=part)], check=True, timeout=30)
        assert np.array_equal(np.load(part), np.full((64, 256), k, np.float32)), cmd
    assert mount.status()["error"] is None
    # A redirect that writes nothing keeps the content and says so.
    subprocess.run(["bash", "-c", f": > {part}"], check=True, timeout=30)
    assert np.array_equal(np.load(part), np.full((64, 256), 5, np.float32))
    assert "truncated, then closed without a write" in mount.status()["error"]
    # One of a wrong size fails and keeps the content.
    p = subprocess.run(["bash", "-c", f"head -c 1000 {tmp_path / 'x1.npy'} > {part}"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert "file is 1000 bytes, expected 65664" in mount.status()["error"]
    assert np.array_equal(np.load(part), np.full((64, 256), 5, np.float32))
    # Not an .npy at all: refused, and status.json says why (item 11).
    with pytest.raises(OSError) as e:
        mount.write("ranks/0/model/w.npy", b"hello, this is not a header")
    assert e.value.errno == errno.EINVAL
    assert "not a .npy file" in mount.status()["error"]


def test_superseded_versions_are_freed(mount):
    """Pinned versions do not pile up: after 30 overwrites read in between, the
    memory in use comes back to one copy of the partition."""
    mount.setup(one_tensor((1024, 1024)), SPEC)  # 4 MiB a state
    part = mount.p("ranks/0/model/w.npy")
    # The setup's writers count their texts until the kernel's RELEASE, which
    # follows their close asynchronously (late under load and ASan): settle first.
    base, same = mount.status()["memory_used"], 0
    end = time.monotonic() + 10
    while same < 5 and time.monotonic() < end:
        time.sleep(0.05)
        now = mount.status()["memory_used"]
        same, base = (same + 1, base) if now == base else (0, now)
    for k in range(30):
        np.save(part, np.full((1024, 1024), k, np.float32))
        with open(part, "rb") as f:
            f.read(4096)
    deadline = time.monotonic() + 10
    while mount.status()["memory_used"] > base and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mount.status()["memory_used"] == base


def test_job_files_count_in_max_memory(mount_factory):
    """Item 5: job/ files are counted in --max-memory (before: 240 MiB stored under
    --max-memory 64M with memory_used 0): past it a write fails with ENOSPC."""
    m = mount_factory(max_memory="64M")
    base = m.status()["memory_used"]
    written = 0
    with pytest.raises(OSError) as e:
        with open(m.p("job/big.bin"), "wb", buffering=0) as f:
            for _ in range(100):
                f.write(b"x" * (1 << 20))
                written += 1 << 20
    assert e.value.errno == errno.ENOSPC
    assert 16 << 20 <= written <= 64 << 20
    assert base + written <= m.status()["memory_used"] <= 64 << 20
    # Many small files count too (their names and nodes), and deleting gives it back.
    os.mkdir(m.p("job/d"))
    for i in range(200):
        with open(m.p(f"job/d/f{i}"), "wb") as f:
            f.write(b"y" * 1000)
    os.unlink(m.p("job/big.bin"))
    for i in range(200):
        os.unlink(m.p(f"job/d/f{i}"))
    os.rmdir(m.p("job/d"))
    assert m.status()["memory_used"] == base


# ---------------------------------------------------------------- start-up

def test_mount_refuses_a_dead_mount_and_bad_cluster_files(mount_factory, tmp_path):
    """Item 11: a daemon killed with -9 leaves a dead mount; a new daemon there is
    refused with a message saying what to do (it used to mount on top of it), and
    works once it is unmounted. A cluster.json that is a FIFO or over 1 MiB is
    refused at once."""
    from conftest import MLFS
    m = mount_factory()
    m.proc.kill()
    m.proc.wait()
    with pytest.raises(OSError) as e:
        os.statvfs(m.path)
    assert e.value.errno == errno.ENOTCONN
    cluster = tmp_path / "mnt-cluster.json"
    args = [str(MLFS), "mount", str(m.path), "--node", "n0", "--cluster", str(cluster), "-f"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert p.returncode == 1
    assert "a dead mount is still there" in p.stderr and "mlfs umount" in p.stderr, p.stderr
    run_mlfs("umount", m.path)
    assert not os.path.ismount(m.path)
    m2 = mount_factory(name="mnt2")  # and a live mount point is refused too
    p = subprocess.run([str(MLFS), "mount", str(m2.path), "--node", "n0", "--cluster",
                        str(cluster), "-f"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and "already a mount point" in p.stderr, p.stderr
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"nodes": [{"id": "n0", "addr": "127.0.0.1:7070",
                                          "devices": 8}], "pad": "x" * (1 << 20)}))
    for bad, why in [(fifo, "not a regular file"), (big, "more than the limit 1048576")]:
        p = subprocess.run([str(MLFS), "mount", str(m.path), "--node", "n0", "--cluster",
                            str(bad), "-f"], capture_output=True, text=True, timeout=30)
        assert p.returncode == 1 and why in p.stderr, p.stderr
    m.proc = subprocess.Popen(["true"])  # the fixture's teardown: this daemon is gone
    m.proc.wait()


def test_open_file_outlives_its_path(mount, tmp_path):
    """A file opened before a reconfiguration removed its path reads, stats and maps
    its content to the end (before: reads failed with ENOENT once the kernel asked
    for the size of the vanished path, and numpy.load returned size-0 arrays)."""
    mount.setup(one_tensor((512, 256)), cfg(1, tp=2))
    want = np.arange(256 * 256, dtype=np.float32).reshape(256, 256)
    np.save(mount.p("ranks/1/model/w.npy"), want)
    f = open(mount.p("ranks/1/model/w.npy"), "rb", buffering=0)
    m = mmap_load(mount.p("ranks/1/model/w.npy"))
    (tmp_path / "c.json").write_text(json.dumps(cfg(2, tp=1)))
    run_mlfs("reconfigure", mount.path, tmp_path / "c.json")
    try:
        assert os.listdir(mount.p("ranks")) == ["0"]
        size = os.fstat(f.fileno()).st_size
        data = f.read()
        assert size == len(data) and np.array_equal(np.load(io.BytesIO(data)), want)
        assert np.array_equal(m, want)
    finally:
        f.close()
        del m
    with pytest.raises(FileNotFoundError):
        open(mount.p("ranks/1/model/w.npy"), "rb")
