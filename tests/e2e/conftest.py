"""Shared fixtures for end-to-end tests: the built `mlfs` binary and examples, and the
Python package python/mlfs on sys.path."""
import gc
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The mlfs package of this tree (python/mlfs), never an installed copy.
sys.path.insert(0, str(ROOT / "python"))
MLFS = ROOT / os.environ.get("BUILD", "build") / "mlfs"
EXAMPLE = ROOT / "examples" / "gpt-tiny"


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


class Mount:
    """A running `mlfs mount -f` daemon and helpers to use its mount."""

    def __init__(self, path, proc, stderr_path, tmp):
        self.path = path
        self.proc = proc
        self.stderr_path = stderr_path
        self.tmp = tmp

    def p(self, *parts):
        """Path string of <mnt>/parts..."""
        return os.path.join(str(self.path), *map(str, parts))

    def write(self, rel, data):
        """Writes text or bytes to <mnt>/rel in one open/write/close (OSError on refusal)."""
        with open(self.p(rel), "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)

    def read(self, rel):
        with open(self.p(rel), "rb") as f:
            return f.read()

    def read_json(self, rel):
        return json.loads(self.read(rel))

    def status(self):
        return self.read_json("status.json")

    def setup(self, schema, config):
        """Writes schema.json then config.json (dicts)."""
        self.write("schema.json", json.dumps(schema))
        self.write("config.json", json.dumps(config))

    def mlfs(self, cmd, *args, check=True):
        """Runs `mlfs cmd <mnt> args...`."""
        return run_mlfs(cmd, self.path, *args, check=check)

    def stderr(self):
        return pathlib.Path(self.stderr_path).read_text(errors="replace")

    def wait_exit(self, timeout=30):
        rc = self.proc.wait(timeout=timeout)
        assert rc == 0, f"mlfs mount exited {rc}: {self.stderr()}"
        assert "error" not in self.stderr().lower(), self.stderr()
        return rc

    def umount(self):
        """Unmounts with `mlfs umount` and checks the daemon exits 0 without errors."""
        p = run_mlfs("umount", self.path, check=False)
        assert p.returncode == 0, p.stderr
        self.wait_exit()
        assert not os.path.ismount(self.path)


@pytest.fixture
def mount_factory(tmp_path):
    """mount_factory(devices=8, max_memory=None, name="mnt", extra_args=()) -> Mount: a
    one-node cluster ("n0" with @devices), mounted in the foreground (@extra_args are
    more `mlfs mount` options, e.g. ("--prefetch", "2")); every mount is unmounted at
    teardown, and its daemon must exit 0 with no error on stderr."""
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
        m = Mount(mnt, proc, errpath, tmp_path)
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
                failures.append(f"fusermount3 -u {m.path}: {p.stderr}")
                subprocess.run(["fusermount3", "-u", "-z", str(m.path)], capture_output=True)
        try:
            rc = m.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            m.proc.kill()
            rc = m.proc.wait()
        if rc != 0:
            failures.append(f"mlfs mount {m.path} exited {rc}: {m.stderr()}")
        elif "error" in m.stderr().lower():
            failures.append(f"mlfs mount {m.path} logged: {m.stderr()}")
    assert not failures, "\n".join(failures)


@pytest.fixture
def mount(mount_factory):
    """A mount of node n0 with 8 devices and the default memory limit."""
    return mount_factory()
