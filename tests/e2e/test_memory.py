"""Memory counted exactly (issue 21, item 4): what grows with the schema (its text and
parsed form, names, name trees, layouts, partition tables and the buffers' own
allocations, plans, step tables) is counted in status.json's memory_used, so that it
follows the daemon's resident memory and --max-memory bounds it."""
import errno
import json
import os
import time

import numpy as np
import pytest

from conftest import run_mlfs

# Under AddressSanitizer (make test's second pass, BUILD=build/asan) every
# allocation carries redzones and freed memory sits in a quarantine: RSS says
# nothing about what the daemon counts. The plain build's pass checks it.
SANITIZED = os.path.basename(os.environ.get("BUILD", "build")) == "asan"
RSS_UNDER_ASAN = "RSS under AddressSanitizer (redzones, quarantine) is not the daemon's; " \
    "checked by the plain build's pass"

MIB = 1 << 20
LAYERS = 16384
STATES = {"model": {}, "optim/exp_avg": {"dtype": "float32"},
          "optim/exp_avg_sq": {"dtype": "float32"}, "optim/master": {"dtype": "float32"}}
# Fixed allowance besides the 10%: the code pages the reconfiguration path touches
# the first time (text of libmlfs and libc), the per-thread malloc arenas that the
# I/O worker and the transformer threads create on their first allocation (one
# 132 KiB heap each, up to 8 x cores arenas), and the FUSE request buffers the
# kernel's writes of schema.json and config.json fill. Measured: about 2 MiB.
ALLOWANCE = 6 * MIB


def big_schema(layers=LAYERS):
    """num_layers @layers, 4 states, two small {L} tensors per layer: 32,769 tensors x
    4 states = 131,076 files, each partition a few bytes, so that what the daemon holds
    is almost all metadata."""
    return {"model": "meta", "num_layers": layers, "states": STATES,
            "tensors": [{"name": "layers/{L}/attention/query_key_value/weight",
                         "dtype": "bfloat16", "shape": [4]},
                        {"name": "layers/{L}/mlp/dense_4h_to_h/bias", "dtype": "bfloat16",
                         "shape": [2]},
                        {"name": "embedding/word_embeddings/weight", "dtype": "bfloat16",
                         "shape": [8, 4], "split": {"dim": 0}}]}


def rss(pid):
    """VmRSS of @pid, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def settle(m, version):
    """status.json once version @version is current and idle."""
    deadline = time.monotonic() + 120
    while True:
        st = m.status()
        if st["version"] == version and st["state"] == "idle":
            return st
        assert st["state"] != "failed" and time.monotonic() < deadline, st
        time.sleep(0.05)


@pytest.mark.skipif(SANITIZED, reason=RSS_UNDER_ASAN)
def test_memory_used_follows_rss(mount_factory, tmp_path):
    """A schema of 16,384 layers and 4 states, its first config, a dp change and a tp and
    pp change: at each point memory_used has grown by the daemon's RSS growth within 10%
    (plus ALLOWANCE). Before it was counted exactly, memory_used grew by 44 MiB where
    RSS grew 112 MiB (first config), 45 vs 216 MiB (dp change), 70 vs 336 MiB (issue 21).
    DP replicas on one node share their partitions after a reconfiguration; their
    buffers' own allocations are counted for each rank (a write gives each its own),
    so memory_used may lead RSS by those, within the tolerance."""
    m = mount_factory(devices=8)
    pid = m.proc.pid
    time.sleep(0.2)
    rss0, used0 = rss(pid), m.status()["memory_used"]
    rows = []

    def check(what):
        st = m.status()
        grew, counted = rss(pid) - rss0, st["memory_used"] - used0
        rows.append((what, grew, counted))
        print(f"{what}: RSS +{grew / MIB:.1f} MiB, memory_used +{counted / MIB:.1f} MiB")
        return grew, counted

    m.write("schema.json", json.dumps(big_schema()))
    check("schema")
    m.write("config.json", json.dumps({"version": 1, "tp": 1, "pp": 1, "dp": 1,
                                       "nodes": ["n0"]}))
    settle(m, 1)
    check("config tp1 pp1 dp1")
    path = tmp_path / "v2.json"
    path.write_text(json.dumps({"version": 2, "tp": 1, "pp": 1, "dp": 2, "nodes": ["n0"]}))
    run_mlfs("reconfigure", m.path, path)
    settle(m, 2)
    check("dp 1 -> 2")
    path.write_text(json.dumps({"version": 3, "tp": 2, "pp": 2, "dp": 2, "nodes": ["n0"]}))
    run_mlfs("reconfigure", m.path, path)
    settle(m, 3)
    check("tp2 pp2 dp2")
    for what, grew, counted in rows[1:]:
        assert abs(grew - counted) <= 0.10 * grew + ALLOWANCE, \
            f"{what}: RSS grew {grew} bytes, memory_used {counted}: {rows}"


@pytest.mark.skipif(SANITIZED, reason=RSS_UNDER_ASAN)
def test_max_memory_refuses_before_rss_passes(mount_factory):
    """--max-memory between the old undercount of big_schema()'s first layout and what it
    really needs: the config is refused, naming --max-memory, and the daemon's RSS is
    back under the limit. Before, it was accepted and RSS grew 112 MiB past an 80 MiB
    limit. (The name trees are measured once built, so RSS may pass the limit while
    they are, by the trees of one view, before the refusal frees them.)"""
    # The first config of big_schema() grows RSS by 112 MiB and memory_used now by the
    # same; the old estimate counted 44 MiB of it (test above, before and after).
    limit = 80 * MIB
    m = mount_factory(devices=8, max_memory=limit)
    pid = m.proc.pid
    time.sleep(0.2)
    rss0 = rss(pid)
    m.write("schema.json", json.dumps(big_schema()))
    with pytest.raises(OSError) as e:
        m.write("config.json", json.dumps({"version": 1, "tp": 1, "pp": 1, "dp": 1,
                                           "nodes": ["n0"]}))
    assert e.value.errno in (errno.ENOSPC, errno.EINVAL)
    st = m.status()
    assert st["version"] is None and "max-memory" in st["error"], st["error"]
    assert rss(pid) - rss0 <= limit, (rss(pid) - rss0, limit)


def test_partition_write_enospc_in_status(mount_factory):
    """A partition write refused with ENOSPC (its staging does not fit in --max-memory)
    says so in status.json's "error", naming the partition and --max-memory."""
    m = mount_factory(max_memory="64M")
    schema = {"model": "m", "num_layers": 0, "states": {"model": {}},
              "tensors": [{"name": "w", "dtype": "float32", "shape": [5 * MIB // 4, 4],
                           "split": {"dim": 0}}]}
    m.write("schema.json", json.dumps(schema))
    m.write("config.json", json.dumps({"version": 1, "tp": 1, "pp": 1, "dp": 3,
                                       "nodes": ["n0"]}))
    assert not m.status()["error"]
    with pytest.raises(OSError) as e:
        np.save(m.p("ranks/0/model/w.npy"), np.ones((5 * MIB // 4, 4), np.float32))
    assert e.value.errno == errno.ENOSPC
    err = m.status()["error"]
    assert "ranks/0/model/w.npy" in err and "--max-memory" in err, err
