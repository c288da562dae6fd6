"""Hostile inputs (issue 10, items 5, 6 and 11): files planted where the command
line writes, and schemas whose size or names would cost the daemon minutes of
CPU, unbounded memory or paths the kernel refuses later. Each is refused or
sidestepped, promptly, with the reason named."""
import errno
import json
import os
import subprocess
import sys
import time

import numpy as np

from conftest import MLFS, run_mlfs

SCHEMA = {
    "model": "small",
    "num_layers": 2,
    "states": {"model": {}, "optim/m": {"dtype": "float32"}},
    "tensors": [
        {"name": "embedding/weight", "dtype": "float16", "shape": [16, 4],
         "split": {"dim": 0}, "place": "first"},
        {"name": "layers/{L}/w", "dtype": "float32", "shape": [8, 4], "split": {"dim": 1}},
        {"name": "final/bias", "dtype": "int32", "shape": [5], "place": "last"},
    ],
}
CONFIG = {"version": 1, "tp": 2, "pp": 2, "dp": 1, "nodes": ["n0"]}


def full_tensors(rng):
    """{"<state>/<tensor>.npy": array} of SCHEMA, {L} expanded."""
    out = {}
    for state, sd in SCHEMA["states"].items():
        for t in SCHEMA["tensors"]:
            names = [t["name"].replace("{L}", str(i)) for i in range(SCHEMA["num_layers"])] \
                if "{L}" in t["name"] else [t["name"]]
            for n in names:
                dt = np.dtype(sd.get("dtype", t["dtype"]))
                out[f"{state}/{n}.npy"] = (rng.standard_normal(t["shape"]) * 50).astype(dt)
    return out


def files_under(d):
    return {os.path.relpath(os.path.join(p, f), d) for p, _, fs in os.walk(d) for f in fs}


def write_in_child(path, data, timeout):
    """Writes @data to @path in one open/write/close in a child process (a daemon that
    spins cannot hang the test); returns the errno of the failure, or 0."""
    code = ("import os, sys\n"
            "try:\n"
            "    with open(sys.argv[1], 'wb') as f:\n"
            "        f.write(sys.stdin.buffer.read())\n"
            "except OSError as e:\n"
            "    sys.exit(e.errno)\n")
    p = subprocess.run([sys.executable, "-c", code, path], input=data, timeout=timeout,
                       capture_output=True)
    assert p.returncode in (0, errno.EINVAL), p.stderr
    return p.returncode


# ------------------------------------------------------- planted temporaries

def test_export_does_not_follow_planted_tmp(mount, tmp_path):
    """`mlfs export` once wrote "<dst>.tmp" with O_CREAT | O_TRUNC, following a
    symlink planted there (truncating its target), and then renamed the symlink
    over <dst>. Now its temporaries are new files: the victim keeps its bytes, a
    dangling link creates nothing, each <dst> is a regular file of the tensor."""
    mount.setup(SCHEMA, CONFIG)
    full = full_tensors(np.random.default_rng(10))
    ckpt = tmp_path / "ckpt"
    for rel, a in full.items():
        os.makedirs(os.path.dirname(ckpt / rel), exist_ok=True)
        np.save(ckpt / rel, a)
    mount.mlfs("import", "--from", ckpt, "--step", "1")

    out = tmp_path / "out"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious bytes\n")
    nowhere = tmp_path / "created-by-export"
    planted = {"model/layers/1/w.npy.tmp": victim,
               "optim/m/embedding/weight.npy.tmp": victim,
               "model/final/bias.npy.tmp": nowhere}
    for rel, target in planted.items():
        os.makedirs(os.path.dirname(out / rel), exist_ok=True)
        os.symlink(target, out / rel)

    p = mount.mlfs("export", "--to", out)
    assert p.stdout.strip() == f"exported {len(full)} files to {out}"
    assert victim.read_bytes() == b"precious bytes\n"
    assert not os.path.lexists(nowhere)
    for rel, target in planted.items():
        assert os.readlink(out / rel) == str(target)
    # Exactly the tensors and the planted links: no temporary left behind.
    assert files_under(out) == set(full) | set(planted)
    for rel, a in full.items():
        assert not os.path.islink(out / rel), rel
        got = np.load(out / rel)
        assert got.dtype == a.dtype and np.array_equal(got, a), rel
        assert np.array_equal(np.load(mount.p("full", rel)), a), rel

    # Exporting again replaces the files in place, still leaving nothing else.
    mount.mlfs("export", "--to", out)
    assert files_under(out) == set(full) | set(planted)
    assert victim.read_bytes() == b"precious bytes\n"


def test_export_failure_leaves_no_tmp(mount, tmp_path):
    """A file that cannot take its place (a directory holds its name) fails the
    export, naming it, after its bytes were copied: the temporary is removed."""
    mount.setup(SCHEMA, CONFIG)
    out = tmp_path / "out"
    (out / "model" / "final" / "bias.npy").mkdir(parents=True)
    p = mount.mlfs("export", "--to", out, check=False)
    assert p.returncode == 1
    assert "model/final/bias.npy: Is a directory" in p.stderr, p.stderr
    assert [f for f in files_under(out) if os.path.basename(f).startswith(".")] == []


def test_dataset_index_does_not_follow_planted_tmp(tmp_path):
    """`mlfs dataset index` wrote "<out>.tmp<pid>" through fopen. The pid is known
    to whoever starts the command: here a shell that execs it once the link to the
    victim is planted at that name."""
    d = tmp_path / "ds"
    d.mkdir()
    np.arange(4 * 10, dtype=np.int32).tofile(d / "s0.bin")
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious bytes\n")
    (tmp_path / "o").mkdir()
    out = tmp_path / "o" / "index.json"
    sh = subprocess.Popen(
        ["sh", "-c", 'read go; exec "$0" dataset index "$1" --dtype int32 --shape 4 --out "$2"',
         str(MLFS), str(d), str(out)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    os.symlink(victim, f"{out}.tmp{sh.pid}")
    stdout, stderr = sh.communicate("go\n", timeout=60)
    assert sh.returncode == 0, stderr
    assert victim.read_bytes() == b"precious bytes\n"
    assert not os.path.islink(out)
    idx = json.loads(out.read_text())
    assert idx["shards"] == [{"uri": f"file://{os.path.realpath(d)}/s0.bin", "count": 10}]
    assert sorted(os.listdir(out.parent)) == ["index.json", f"index.json.tmp{sh.pid}"]
    assert "1 shards, 10 records" in stdout


# ------------------------------------------------------- schemas that explode

def hostile_schema():
    """Like issue 10's 894-byte schema: 16 {L} tensors over 65536 layers (1048576
    tensors; 3 states) in about 1 KB. It was accepted; the first config then took
    597 s of CPU building the name tree and the daemon grew to 453 MiB."""
    names = ["attn/qkv/weight", "attn/qkv/bias", "attn/proj/weight", "attn/proj/bias",
             "ln1/weight", "ln1/bias", "ln2/weight", "ln2/bias", "mlp/fc1/weight",
             "mlp/fc1/bias", "mlp/fc2/weight", "mlp/fc2/bias", "mlp/gate/weight",
             "norm/q", "norm/k", "rope/inv_freq"]
    return {"model": "x", "num_layers": 65536,
            "states": {"model": {}, "optim/exp_avg": {}, "optim/exp_avg_sq": {}},
            "tensors": [{"name": f"layers/{{L}}/{n}", "dtype": "bool", "shape": [1]}
                        for n in names]}


def test_hostile_schema_refused_promptly(mount):
    text = json.dumps(hostile_schema(), separators=(",", ":")).encode()
    assert len(text) < 1100
    t0 = time.monotonic()
    assert write_in_child(mount.p("schema.json"), text, timeout=60) == errno.EINVAL
    assert time.monotonic() - t0 < 20
    err = mount.status()["error"]
    assert err == ('schema.json: "num_layers" = 65536 with 16 {L} tensors expands to 1048576 '
                   'tensors, more than the limit 131072'), err
    # Nothing was set: the tree is still empty, and a sane schema goes through.
    assert os.listdir(mount.p("ranks")) == []
    mount.setup(SCHEMA, CONFIG)
    assert sorted(os.listdir(mount.p("ranks")), key=int) == ["0", "1", "2", "3"]
    assert mount.status()["error"] is None


def test_limits_named_in_status(mount):
    """Each limit refuses at the schema write, naming the tensor or state."""
    def refused(schema, want):
        assert write_in_child(mount.p("schema.json"), json.dumps(schema).encode(),
                              timeout=60) == errno.EINVAL
        err = mount.status()["error"]
        assert want in err, err

    one = {"name": "w", "dtype": "bool", "shape": [1]}
    # A file name over NAME_MAX (".npy" included): it used to fail later with
    # ENAMETOOLONG on lookup.
    refused({"tensors": [one, dict(one, name="a/" + "n" * 252)]},
            f'tensors[1].name "a/{"n" * 18}...{"n" * 20}" has a component of 256 bytes '
            '(".npy" included), more than the limit 255')
    refused({"states": {"model": {}, "m" * 256: {}}, "tensors": [one]},
            'has a component of 256 bytes, more than the limit 255')
    # "<state>/<tensor>.npy" over 3072 bytes.
    long_name = "/".join(["p" * 200] * 16)  # 3215 bytes
    refused({"tensors": [dict(one, name=long_name)]},
            'makes a path "<state>/<tensor>.npy" of 3225 bytes, more than the limit 3072')
    refused({"states": {f"s{i}": {} for i in range(65)}, "tensors": [one]},
            '"states" has 65 states, more than the limit 64')
    # "a" is the file a.npy: "a.npy/b" cannot be a directory beside it.
    refused({"tensors": [dict(one, name="a"), dict(one, name="a.npy/b")]},
            'tensors[1].name "a.npy/b" and tensors[0].name "a" overlap as paths')

    # The longest name that fits works end to end: the file exists and reads.
    name = "d/" + "n" * 251
    mount.setup({"tensors": [dict(one, name=name)]}, CONFIG | {"pp": 1, "tp": 1})
    a = np.load(mount.p("ranks/0/model", name + ".npy"))
    assert a.shape == (1,) and a.dtype == np.bool_ and not a.any()
    assert os.listdir(mount.p("full/model/d")) == ["n" * 251 + ".npy"]


def test_partition_table_limit(mount_factory):
    """A node's ranks x states x tensors is bounded: 4096 ranks on one node x 3
    states x 2048 tensors would be 2^25 slots of its partition table."""
    m = mount_factory(devices=4096)
    schema = {"num_layers": 2048, "states": {"model": {}, "m": {}, "v": {}},
              "tensors": [{"name": "l{L}", "dtype": "bool", "shape": [1]}]}
    m.write("schema.json", json.dumps(schema))
    cfg = {"version": 1, "tp": 1, "pp": 1, "dp": 4096, "nodes": ["n0"]}
    assert write_in_child(m.p("config.json"), json.dumps(cfg).encode(),
                          timeout=60) == errno.EINVAL
    err = m.status()["error"]
    assert err == ('config.json: node "n0" hosts 4096 ranks x 3 states x 2048 tensors = '
                   "25165824 partitions, more than the limit 16777216 per node"), err
    assert os.listdir(m.p("ranks")) == []
