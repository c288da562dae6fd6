"""Shared fixtures for end-to-end tests: the built `mlfs` binary and examples, and the
Python package python/mlfs on sys.path, whose mlfs.testing is the harness of local
daemons and jobs (Daemon, Cluster, Etcd; see its doc). Fixtures:

  mount_factory    make(devices=8, max_memory=None, name="mnt", extra_args=()) -> Mount
  mount            a mount of node n0 with 8 devices
  etcd             an mlfs.testing.Etcd on two free loopback ports, its data in the
                   test's tmp dir; killed at teardown and its data dir removed (etcd
                   preallocates 128 MB of WAL: kept, they filled a CI machine's disk)
  cluster_factory  make(nnodes=4, devices=2, job="j", registered=True, extra_args=(),
                   node_env=None) -> mlfs.testing.Cluster: a token file, cluster.json
                   and one daemon per node, each waited for until mounted (and, with
                   @registered, until every node's key is in etcd). At teardown every
                   daemon still running is unmounted and must exit 0; in a test that
                   injected no fault (no kill, freeze or etcd loss) its stderr must also
                   be free of "error", as mount_factory asks of one node.
"""
import gc
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The mlfs package of this tree (python/mlfs), never an installed copy.
sys.path.insert(0, str(ROOT / "python"))
from mlfs import testing  # noqa: E402

MLFS = ROOT / os.environ.get("BUILD", "build") / "mlfs"
EXAMPLE = ROOT / "examples" / "gpt-tiny"
# Free space one run of the suite needs where its temporary directories go, with room to
# spare: a whole run left 545 MB (measured at 6d6023c; 257 MB of it is
# test_import_changes_only_what_it_imports), and a live etcd preallocates 128 MB of WAL.
# pytest keeps the last three runs' directories, so make test's second run (ASan) starts
# with the first one's still there.
NEED_FREE = 1 << 30


def pytest_sessionstart(session):
    """A disk too full for the suite fails it at once, saying so, not as a cascade of
    daemons that cannot write (a CI run once failed 140 tests that way)."""
    tmp = tempfile.gettempdir()
    free = shutil.disk_usage(tmp).free
    if free < NEED_FREE:
        pytest.exit(f"{tmp} has {free / 2**20:.0f} MiB free; the end-to-end tests need "
                    f"{NEED_FREE / 2**20:.0f} MiB there (free some, or point TMPDIR at "
                    f"another disk)", returncode=1)


def run_mlfs(*args, check=True):
    """Runs `mlfs args...`; returns the CompletedProcess (text)."""
    p = subprocess.run([str(MLFS), *map(str, args)], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise AssertionError(f"mlfs {' '.join(map(str, args))} failed: {p.stderr}")
    return p


@pytest.fixture
def write_json(tmp_path):
    def write(name, obj):
        path = tmp_path / name
        path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
        return path
    return write


# A running `mlfs mount -f` daemon and helpers to use its mount (p, read, write,
# read_json, status, setup, mlfs, stderr, wait_exit, umount): the harness's class.
Mount = testing.Daemon


@pytest.fixture
def mount_factory(tmp_path):
    """mount_factory(devices=8, max_memory=None, name="mnt", extra_args=()) -> Mount: a
    one-node cluster ("n0" with @devices), mounted in the foreground (@extra_args are
    more `mlfs mount` options, e.g. ("--prefetch", "2")); every mount is unmounted at
    teardown, and its daemon must exit 0 with no error on stderr (unless the test set
    m.errors_expected: it checks the errors it causes itself)."""
    mounts = []

    def make(devices=8, max_memory=None, name="mnt", extra_args=()):
        mnt = tmp_path / name
        mnt.mkdir()
        cluster = tmp_path / f"{name}-cluster.json"
        cluster.write_text(json.dumps(
            {"nodes": [{"id": "n0", "addr": "127.0.0.1:7070", "devices": devices}]}))
        errpath = tmp_path / f"{name}.stderr"
        args = [str(MLFS), "mount", str(mnt), "--node", "n0", "--cluster", str(cluster), "-f"]
        if max_memory is not None:
            args += ["--max-memory", str(max_memory)]
        args += [str(a) for a in extra_args]
        with open(errpath, "wb") as err:
            proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err)
        m = Mount(mnt, proc, errpath, tmp_path, MLFS)
        mounts.append(m)
        deadline = time.monotonic() + 10
        while not os.path.ismount(mnt):
            if proc.poll() is not None:
                raise AssertionError(f"mlfs mount exited {proc.returncode}: {m.stderr()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{mnt} not mounted after 10 s: {m.stderr()}")
            time.sleep(0.01)
        return m

    yield make
    gc.collect()  # drop NumPy memory maps that keep a mount busy
    failures = []
    for m in mounts:
        if os.path.ismount(m.path):
            p = subprocess.run(["fusermount3", "-u", str(m.path)], capture_output=True, text=True)
            if p.returncode != 0:
                failures.append(f"fusermount3 -u {m.path}: {p.stderr.strip()} (held by: "
                                f"{testing.holders(m.path) or 'no process found'})")
                subprocess.run(["fusermount3", "-u", "-z", str(m.path)], capture_output=True)
        try:
            rc = m.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            m.proc.kill()
            rc = m.proc.wait()
        if rc != 0:
            failures.append(f"mlfs mount {m.path} exited {rc}: {m.stderr()}")
        elif "error" in m.stderr().lower() and not m.errors_expected:
            failures.append(f"mlfs mount {m.path} logged: {m.stderr()}")
    assert not failures, "\n".join(failures)


@pytest.fixture
def mount(mount_factory):
    """A mount of node n0 with 8 devices and the default memory limit."""
    return mount_factory()


@pytest.fixture
def etcd(tmp_path):
    e = testing.Etcd(tmp_path).start()
    yield e
    e.stop()


@pytest.fixture
def cluster_factory(tmp_path, etcd):
    made = []

    def make(nnodes=4, devices=2, job="j", registered=True, extra_args=(), node_env=None):
        cl = testing.Cluster(tmp_path, etcd, nnodes, devices, job, extra_args, node_env,
                             mlfs=MLFS)
        made.append(cl)
        cl.mount_all(registered)
        return cl

    yield make
    errors = []
    for cl in made:
        try:
            cl.teardown()
        except AssertionError as e:
            errors.append(str(e))
    assert not errors, "\n".join(errors)
