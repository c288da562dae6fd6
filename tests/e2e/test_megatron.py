"""`mlfs schema megatron-gpt` is Megatron-Core's layout (issue 19, item 3): the fused
QKV is interleaved per query group, [ng, (np/ng + 2) * hn, h], so Megatron's TP rank
r holds the contiguous block of rows of its ng/tp groups. A full QKV built in that
order, imported and re-sliced by mlfs through tp 1 -> 2 -> 4 (MHA) and 1 -> 2 (GQA),
equals Megatron's per-rank tensor on every rank, weight and bias."""
import json

import numpy as np
import pytest

from conftest import run_mlfs
from test_store import make_full, reconfigure, write_full

QKV = "layers/0/self_attention/query_key_value"


def megatron_qkv(nq, nkv, d, h, rng):
    """A full fused QKV in Megatron-Core's order, and its groups' parts for checking:
    group g's rows are its nq/nkv query heads, its key head, its value head."""
    def part(rows):
        return rng.standard_normal((rows, h)).astype(np.float32)
    groups = [(part(nq // nkv * d), part(d), part(d)) for _ in range(nkv)]
    full = np.concatenate([np.concatenate(g) for g in groups])
    return full, groups


def megatron_rank(groups, tp, r):
    """What Megatron's TP rank r holds: the groups r * ng/tp .. (r + 1) * ng/tp - 1,
    each as its queries, key, value."""
    per = len(groups) // tp
    return np.concatenate([np.concatenate(g) for g in groups[r * per:(r + 1) * per]])


@pytest.mark.parametrize("heads,kv,tps", [(4, 4, [1, 2, 4]), (8, 2, [1, 2])])
def test_qkv_is_megatrons_per_rank_layout(mount, tmp_path, heads, kv, tps):
    hidden = 64
    d = hidden // heads
    schema = json.loads(run_mlfs("schema", "megatron-gpt", "--layers", 1, "--hidden", hidden,
                                 "--heads", heads, "--kv-heads", kv, "--vocab", 64,
                                 "--dtype", "float32").stdout)
    rng = np.random.default_rng(heads * 10 + kv)
    full = make_full(schema, rng)
    w, wg = megatron_qkv(heads, kv, d, hidden, rng)
    b, bg = megatron_qkv(heads, kv, d, 1, rng)
    for state in schema["states"]:
        full[(state, f"{QKV}/weight")] = w
        full[(state, f"{QKV}/bias")] = b[:, 0]
    write_full(tmp_path / "ckpt", full)
    cfg = {"version": 1, "tp": tps[0], "pp": 1, "dp": 1, "nodes": ["n0"]}
    mount.setup(schema, cfg)
    mount.mlfs("import", "--from", tmp_path / "ckpt", "--step", "1")
    for v, tp in enumerate(tps, start=1):
        if v > 1:
            cfg = dict(cfg, version=v, tp=tp)
            reconfigure(mount, tmp_path, cfg)
        for r in range(tp):
            got = np.load(mount.p("ranks", r, "model", QKV, "weight.npy"))
            assert np.array_equal(got, megatron_rank(wg, tp, r)), (tp, r)
            got = np.load(mount.p("ranks", r, "model", QKV, "bias.npy"))
            assert np.array_equal(got, megatron_rank(bg, tp, r)[:, 0]), (tp, r)
