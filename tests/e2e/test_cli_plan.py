"""`mlfs plan` and `mlfs schema` as a user runs them: figures, JSON, errors."""
import json

import numpy as np
import pytest

from conftest import EXAMPLE, run_mlfs


def plan_json(*extra):
    p = run_mlfs("plan", "--schema", EXAMPLE / "schema.json",
                 "--from", EXAMPLE / "config-tp2pp2dp2.json",
                 "--to", EXAMPLE / "config-tp4pp1dp2.json",
                 "--cluster", EXAMPLE / "cluster.json", "--json", *extra)
    return json.loads(p.stdout)


def test_readme_example_figures():
    j = plan_json()
    # 19 tensors x 3 states; state dtypes: model per tensor, optim float32.
    assert j["bytes_total"] == (j["bytes_reused"] + j["bytes_local"] + j["bytes_network"]
                                + j["bytes_zero"])
    assert j["bytes_network"] == j["lower_bound_network"]
    # Old: n0 = stage 0 (embedding, layers 0-1), n1 = stage 1 (layers 2-3, final_norm,
    # output tied to the embedding). New: tp4 pp1 dp2, one full replica per node.
    # n0 must fetch layers 2-3 and final_norm; n1 layers 0-1 (it has the embedding
    # through the tied output layer).
    layer = (192 * 64 + 64 * 64 + 64 + 512 * 64)  # elements per layer
    per_state = {"model": 2, "optim/exp_avg": 4, "optim/exp_avg_sq": 4}
    n0_in = sum(b * (2 * layer + 64) for b in per_state.values())
    # final_norm is float32 in model state.
    n0_in += 64 * (4 - 2)
    n1_in = sum(b * 2 * layer for b in per_state.values())
    assert j["per_node"]["n0"]["bytes_in"] == n0_in
    assert j["per_node"]["n1"]["bytes_in"] == n1_in
    assert j["per_node"]["n0"]["bytes_out"] == n1_in
    assert j["per_node"]["n1"]["bytes_out"] == n0_in
    kinds = {op["op"] for op in j["operations"]}
    assert kinds <= {"reuse", "copy", "fetch", "dup", "zero"}
    # every fetch crosses nodes; every copy stays on its node
    for op in j["operations"]:
        if op["op"] == "fetch":
            assert op["src_node"] != op["node"]
        if op["op"] in ("copy", "dup", "reuse"):
            assert op["src_node"] == op["node"]


def test_node_part_is_the_whole_plans_share():
    """--node ID: that node's ops and figures; what it serves is what the
    other nodes' parts fetch from it."""
    whole = plan_json()
    parts = {n: plan_json("--node", n) for n in ("n0", "n1")}
    for n, j in parts.items():
        assert j["node"] == n
        mine, all_ = j["per_node"][n], whole["per_node"][n]
        for k in ("bytes_in", "bytes_local", "bytes_reused", "bytes_zero", "bytes_total"):
            assert mine[k] == all_[k], (n, k)
        assert j["bytes_network"] == j["lower_bound_network"] == mine["bytes_in"]
        ops = [op for op in whole["operations"] if op["node"] == n]
        assert len(j["operations"]) == len(ops)
        assert all(op["node"] == n for op in j["operations"])
    for n, j in parts.items():
        asked = sum(op["bytes"] for m, q in parts.items() for op in q["operations"]
                    if op["op"] == "fetch" and op["src_node"] == n)
        assert j["per_node"][n]["bytes_out"] == asked
    p = run_mlfs("plan", "--schema", EXAMPLE / "schema.json",
                 "--from", EXAMPLE / "config-tp2pp2dp2.json",
                 "--to", EXAMPLE / "config-tp4pp1dp2.json",
                 "--cluster", EXAMPLE / "cluster.json", "--node", "n1")
    assert 'node "n1" alone' in p.stdout and "\nall " not in p.stdout
    p = run_mlfs("plan", "--schema", EXAMPLE / "schema.json",
                 "--from", EXAMPLE / "config-tp2pp2dp2.json",
                 "--to", EXAMPLE / "config-tp4pp1dp2.json",
                 "--cluster", EXAMPLE / "cluster.json", "--node", "nx", check=False)
    assert p.returncode == 1
    assert 'mlfs plan: --node: node "nx" is not in the cluster' in p.stderr


def test_summary_is_readable():
    p = run_mlfs("plan", "--schema", EXAMPLE / "schema.json",
                 "--from", EXAMPLE / "config-tp2pp2dp2.json",
                 "--to", EXAMPLE / "config-tp4pp1dp2.json", "--cluster", EXAMPLE / "cluster.json")
    assert "plan v1 -> v2: tp2 pp2 dp2 -> tp4 pp1 dp2" in p.stdout
    assert "lower bound" in p.stdout and "n0" in p.stdout and "n1" in p.stdout


def test_default_cluster_is_said(write_json):
    p = run_mlfs("plan", "--schema", EXAMPLE / "schema.json",
                 "--from", EXAMPLE / "config-tp2pp2dp2.json",
                 "--to", EXAMPLE / "config-tp4pp1dp2.json")
    assert "assuming 8 devices on each of n0, n1" in p.stderr


def test_down_node_without_replica_fails_naming_tensors(write_json):
    to = write_json("to.json", {"version": 2, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"]})
    p = run_mlfs("plan", "--schema", EXAMPLE / "schema.json",
                 "--from", EXAMPLE / "config-tp2pp2dp2.json", "--to", to,
                 "--cluster", EXAMPLE / "cluster.json", "--down", "n1", check=False)
    assert p.returncode == 1
    assert 'no surviving copy of "layers/2/attn/qkv/weight"' in p.stderr
    assert p.stdout == ""


def test_down_node_with_replica_succeeds(write_json):
    # dp2 across the two nodes: each node holds a full replica.
    a = write_json("a.json", {"version": 1, "tp": 2, "pp": 1, "dp": 2, "nodes": ["n0", "n1"]})
    b = write_json("b.json", {"version": 2, "tp": 4, "pp": 1, "dp": 1, "nodes": ["n0"]})
    p = run_mlfs("plan", "--schema", EXAMPLE / "schema.json", "--from", a, "--to", b,
                 "--cluster", EXAMPLE / "cluster.json", "--down", "n1", "--json")
    j = json.loads(p.stdout)
    assert j["bytes_network"] == 0 and j["per_node"]["n1"]["bytes_out"] == 0


def test_down_node_served_from_backup(write_json):
    """With "replicas": 1 each node's state has a backup on the next node of the
    config's "nodes": n1's stage (layer 1 of tp4 pp3) lives on in n2's backup."""
    cluster = write_json("c.json", {"nodes": [{"id": n, "devices": 4}
                                              for n in ("n0", "n1", "n2")]})
    a = {"version": 1, "tp": 4, "pp": 3, "dp": 1, "nodes": ["n0", "n1", "n2"]}
    # A full replica on each of n0 and n2: both need layer 1.
    b = write_json("b.json", {"version": 2, "tp": 4, "pp": 1, "dp": 2, "nodes": ["n0", "n2"]})

    def plan(conf, *extra, to=b, check=True):
        return run_mlfs("plan", "--schema", EXAMPLE / "schema.json",
                        "--from", write_json("a.json", conf), "--to", to,
                        "--cluster", cluster, *extra, check=check)

    # No backups: n1's layers are gone.
    p = plan(a, "--down", "n1", check=False)
    assert p.returncode == 1 and 'no surviving copy of "layers/1/' in p.stderr, p.stderr

    j = json.loads(plan({**a, "replicas": 1}, "--down", "n1", "--json").stdout)
    backup = [op for op in j["operations"] if op.get("backup")]
    assert backup
    for op in j["operations"]:
        # Every read of n1's ranks (4-7) is a fetch from its backup, and only those.
        from_n1 = op["op"] in ("reuse", "copy", "fetch") and 4 <= op["src_rank"] < 8
        assert from_n1 == bool(op.get("backup")), op
        if op.get("backup"):
            assert op["op"] == "fetch" and op["src_node"] == "n1" and op["backup"] is True
    # n2 keeps n1's backup and serves it, to n0 and to itself; dead n1 serves nothing.
    assert {op["node"] for op in backup} == {"n0", "n2"}
    served = {"n0": 0, "n1": 0, "n2": 0}
    for op in j["operations"]:
        if op["op"] == "fetch":
            served["n2" if op.get("backup") else op["src_node"]] += op["bytes"]
    assert served["n1"] == 0
    assert {n: j["per_node"][n]["bytes_out"] for n in served} == served
    assert j["bytes_network"] == j["lower_bound_network"]

    text = plan({**a, "replicas": 1}, "--down", "n1").stdout
    assert f"from backups: {len(backup)} fetches" in text, text

    # n1 and n2 both down: n1's backup died with n2 (n2's own, layers 2-3, lives on n0).
    only_n0 = write_json("n0.json", {"version": 2, "tp": 4, "pp": 1, "dp": 1, "nodes": ["n0"]})
    p = plan({**a, "replicas": 1}, "--down", "n1,n2", to=only_n0, check=False)
    assert p.returncode == 1 and 'no surviving copy of "layers/1/' in p.stderr, p.stderr
    assert "layers/2/" not in p.stderr and "layers/3/" not in p.stderr


@pytest.mark.parametrize("conf,msg", [
    ({"version": 2, "tp": 3, "pp": 1, "dp": 4, "nodes": ["n0", "n1"]},
     "tp * pp * dp = 12 ranks exceed the 8 devices of its 2 nodes"),
    ({"version": 2, "tp": 1, "pp": 1, "dp": 1, "nodes": ["n7"]},
     'nodes[0] = "n7" is not in the cluster'),
    ({"version": 2, "tp": 1, "pp": 8, "dp": 1, "nodes": ["n0", "n1"]},
     '"pp" = 8 exceeds the 4 layers of the schema'),
    ({"version": 2, "tp": 0, "pp": 1, "dp": 1, "nodes": ["n0"]},
     '"tp" = 0 is out of range'),
    ('{"version": 2, "tp": 1,', "invalid JSON at line 1"),
])
def test_bad_config_exits_nonzero_with_message(write_json, conf, msg):
    to = write_json("bad.json", conf)
    p = run_mlfs("plan", "--schema", EXAMPLE / "schema.json",
                 "--from", EXAMPLE / "config-tp2pp2dp2.json", "--to", to,
                 "--cluster", EXAMPLE / "cluster.json", check=False)
    assert p.returncode == 1
    assert msg in p.stderr, p.stderr
    assert str(to) in p.stderr


def test_missing_file_and_usage():
    p = run_mlfs("plan", "--schema", "/nonexistent.json", "--from", "a", "--to", "b",
                 check=False)
    assert p.returncode == 1 and "/nonexistent.json: No such file" in p.stderr
    p = run_mlfs("plan", "--schema", "x", check=False)
    assert p.returncode == 2 and "usage: mlfs plan" in p.stderr
    p = run_mlfs("frobnicate", check=False)
    assert p.returncode == 2 and 'unknown command "frobnicate"' in p.stderr


def test_schema_generators_feed_the_planner(tmp_path, write_json):
    p = run_mlfs("schema", "llama", "--layers", 4, "--hidden", 256, "--heads", 8,
                 "--kv-heads", 2, "--vocab", 1000, "--tied")
    s = json.loads(p.stdout)
    qkv = next(t for t in s["tensors"] if t["name"].endswith("query_key_value/weight"))
    assert qkv["shape"] == [256 + 2 * 2 * 32, 256]
    assert qkv["split"]["chunks"] == [256, 64, 64]
    path = write_json("llama.json", p.stdout)
    a = write_json("a.json", {"version": 1, "tp": 2, "pp": 2, "dp": 1, "nodes": ["n0"]})
    b = write_json("b.json", {"version": 2, "tp": 1, "pp": 1, "dp": 2, "nodes": ["n0"]})
    j = json.loads(run_mlfs("plan", "--schema", path, "--from", a, "--to", b, "--json").stdout)
    assert j["bytes_network"] == 0 and j["lower_bound_network"] == 0
    # tp2 -> tp1 merges: everything is copied locally, nothing reused except
    # replicated norms that stayed on their rank's node.
    assert j["bytes_local"] > 0
    # Heads stay whole (split "unit" = head size 32): 2 KV heads admit tp 2, not tp 4,
    # which would give each TP rank half a KV head.
    assert qkv["split"]["unit"] == 32
    c = write_json("c.json", {"version": 2, "tp": 4, "pp": 1, "dp": 1, "nodes": ["n0"]})
    p = run_mlfs("plan", "--schema", path, "--from", a, "--to", c, check=False)
    assert p.returncode == 1 and '"tp" = 4 exceeds the 2 units of 32 rows (heads) of chunk 1' \
        in p.stderr, p.stderr
    # The Adam moments are float32 unless asked otherwise.
    assert s["states"]["optim/exp_avg"] == {"dtype": "float32"}
    p = run_mlfs("schema", "llama", "--layers", 1, "--hidden", 64, "--heads", 4, "--vocab", 100,
                 "--moments-dtype", "bfloat16")
    assert json.loads(p.stdout)["states"] == {"model": {}, "optim/exp_avg": {"dtype": "bfloat16"},
                                              "optim/exp_avg_sq": {"dtype": "bfloat16"}}
    p = run_mlfs("schema", "llama", "--layers", 1, "--hidden", 64, "--heads", 4, "--vocab", 100,
                 "--moments-dtype", "bf17", check=False)
    assert p.returncode == 2 and '--moments-dtype "bf17" is not a known dtype' in p.stderr
    p = run_mlfs("schema", "megatron-gpt", "--layers", 2, "--hidden", 64, "--heads", 5,
                 "--vocab", 100, check=False)
    assert p.returncode == 1 and '"--heads" = 5 does not divide "--hidden" = 64' in p.stderr


def test_moe_schema_plans_per_node(write_json):
    """`mlfs schema moe`: 3 + layers x (5 + 2 experts + 2 shared) tensors, each expert's
    MLP split by TP like a dense one; one node's plan of a TP change moves exactly the
    whole plan's share of that node."""
    p = run_mlfs("schema", "moe", "--layers", 4, "--hidden", 64, "--heads", 4, "--kv-heads", 4,
                 "--vocab", 128, "--experts", 8, "--expert-ffn", 32, "--shared-experts", 1)
    s = json.loads(p.stdout)
    assert len(s["tensors"]) == 3 + 5 + 2 * 8 + 2, len(s["tensors"])
    names = {t["name"]: t for t in s["tensors"]}
    up = names["layers/{L}/mlp/experts/7/dense_h_to_4h/weight"]
    assert up["shape"] == [64, 64] and up["split"]["dim"] == 0
    assert names["layers/{L}/mlp/router/weight"]["shape"] == [8, 64]
    path = write_json("moe.json", p.stdout)
    cl = write_json("c.json", {"nodes": [{"id": f"n{i}", "addr": f"127.0.0.1:{7000 + i}",
                                          "devices": 4} for i in range(2)]})
    a = write_json("a.json", {"version": 1, "tp": 2, "pp": 2, "dp": 2, "nodes": ["n0", "n1"]})
    b = write_json("b.json", {"version": 2, "tp": 4, "pp": 2, "dp": 1, "nodes": ["n0", "n1"]})
    whole = json.loads(run_mlfs("plan", "--schema", path, "--from", a, "--to", b, "--cluster",
                                cl, "--json").stdout)
    for n in ("n0", "n1"):
        mine = json.loads(run_mlfs("plan", "--schema", path, "--from", a, "--to", b,
                                   "--cluster", cl, "--node", n, "--json").stdout)
        assert mine["per_node"][n] == whole["per_node"][n], n
    assert whole["bytes_network"] == whole["lower_bound_network"]
    p = run_mlfs("schema", "moe", "--layers", 2, "--hidden", 64, "--heads", 4, "--vocab", 100,
                 "--experts", 0, check=False)
    assert p.returncode != 0 and "--experts" in p.stderr, p.stderr


def test_plan_json_reproduces_layout_with_numpy(write_json):
    """Apply `mlfs plan --json` operations to NumPy arrays: the result is the new layout."""
    s = {"num_layers": 2, "states": {"model": {}},
         "tensors": [{"name": "emb", "dtype": "float32", "shape": [10, 3],
                      "split": {"dim": 0, "pad_multiple": 4}, "place": "first"},
                     {"name": "l/{L}/w", "dtype": "float32", "shape": [4, 6],
                      "split": {"dim": 1, "chunks": [2, 4]}}]}
    schema = write_json("s.json", s)
    cluster = write_json("c.json", {"nodes": [{"id": "a", "devices": 2}, {"id": "b", "devices": 2}]})
    A = {"version": 1, "tp": 2, "pp": 2, "dp": 1, "nodes": ["a", "b"]}
    B = {"version": 2, "tp": 1, "pp": 1, "dp": 3, "nodes": ["b", "a"]}
    j = json.loads(run_mlfs("plan", "--schema", schema, "--from", write_json("A.json", A),
                            "--to", write_json("B.json", B), "--cluster", cluster,
                            "--json").stdout)
    rng = np.random.default_rng(0)
    full = {"emb": rng.standard_normal((10, 3)).astype(np.float32),
            "l/0/w": rng.standard_normal((4, 6)).astype(np.float32),
            "l/1/w": rng.standard_normal((4, 6)).astype(np.float32)}

    def part(name, tp, t):
        x = full[name]
        if name == "emb":
            per = -(-10 // (4 * tp)) * 4 * tp // tp
            padded = np.zeros((per * tp, 3), np.float32)
            padded[:10] = x
            return padded[t * per:(t + 1) * per]
        cols = [range(c0 + t * n // tp, c0 + (t + 1) * n // tp) for c0, n in ((0, 2), (2, 4))]
        return x[:, [c for r in cols for c in r]]

    def stage_has(name, pp, p):
        if name == "emb":
            return p == 0
        layer = int(name.split("/")[1])
        return p * 2 // pp <= layer < (p + 1) * 2 // pp

    def layout(cfg):
        tp, pp, dp = cfg["tp"], cfg["pp"], cfg["dp"]
        out = {}
        for r in range(tp * pp * dp):
            t, p = r % tp, r // (tp * dp)
            for name in full:
                if stage_has(name, pp, p):
                    out[(r, name)] = part(name, tp, t)
        return out

    old, want = layout(A), layout(B)
    new = {k: np.full_like(v, np.nan) for k, v in want.items()}
    for op in sorted(j["operations"], key=lambda o: o["phase"]):
        k = (op["rank"], op["tensor"])
        axis = 0 if op["tensor"] == "emb" else 1
        dst = np.moveaxis(new[k], axis, 0)
        if op["op"] == "zero":
            dst[op["row"]:op["row"] + op["rows"]] = 0
            continue
        src_arr = (new if op["op"] == "dup" else old)[(op["src_rank"], op["src_tensor"])]
        src = np.moveaxis(src_arr, axis, 0)
        dst[op["row"]:op["row"] + op["rows"]] = src[op["src_row"]:op["src_row"] + op["rows"]]
    assert new.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(new[k], want[k], err_msg=str(k))


def test_suggest_gpt_tiny(write_json):
    """`mlfs suggest` on the example: JSON that parses, the fastest first, a top
    layout `mlfs plan` accepts, reconfiguration bytes equal to the plan's."""
    args = ("suggest", "--schema", EXAMPLE / "schema.json", "--cluster", EXAMPLE / "cluster.json",
            "--from", EXAMPLE / "config-tp2pp2dp2.json", "--global-batch", 64, "--seq", 256)
    j = json.loads(run_mlfs(*args, "--json", "--top", 3).stdout)
    assert j["devices"] == 8 and j["nodes"] == ["n0", "n1"]
    assert j["inputs"]["hidden"] == 64 and j["inputs"]["global_batch"] == 64
    s = j["suggestions"]
    assert 1 <= len(s) <= 3 and j["fit"] >= len(s)
    assert [x["step_s"] for x in s] == sorted(x["step_s"] for x in s)
    for x in s:
        assert x["tp"] * x["pp"] * x["dp"] == 8
        parts = (x["compute_s"] + x["overhead_s"] + x["tp_comm_s"] + x["pp_comm_s"]
                 + x["bubble_s"] + x["dp_comm_s"] + x["reconf_s"])
        assert abs(x["step_s"] - parts) <= 1e-9 * x["step_s"]
        assert 0 < x["memory_bytes"] <= j["profile"]["memory_per_device_bytes"]
    # tp8 would span both nodes of 4 devices; pp8 exceeds the 4 layers.
    assert j["dropped"]["tp_across_nodes"]["count"] == 1
    assert '"pp" = 8 exceeds the 4 layers' in j["dropped"]["schema"]["first"]
    # The top layout is a valid next config: `mlfs plan` takes it, moving its bytes.
    top = write_json("top.json", s[0]["config"])
    assert s[0]["config"]["version"] == 2
    plan = json.loads(run_mlfs("plan", "--schema", EXAMPLE / "schema.json",
                               "--from", EXAMPLE / "config-tp2pp2dp2.json", "--to", top,
                               "--cluster", EXAMPLE / "cluster.json", "--json").stdout)
    assert plan["bytes_network"] == s[0]["reconf_bytes"]

    text = run_mlfs(*args).stdout
    assert 'suggest "gpt-tiny" on 2 nodes (n0, n1), 8 devices' in text
    assert f"  1 tp{s[0]['tp']} pp{s[0]['pp']} dp{s[0]['dp']}" in text
    assert "TP group across nodes" in text

    # One node: 4 devices only; a profile that lets TP cross nodes; bad inputs.
    one = json.loads(run_mlfs("suggest", "--schema", EXAMPLE / "schema.json", "--cluster",
                              EXAMPLE / "cluster.json", "--nodes", "n1", "--json").stdout)
    assert one["devices"] == 4 and one["nodes"] == ["n1"]
    prof = write_json("prof.json", {"tp_across_nodes": True, "mfu": 0.5})
    j = json.loads(run_mlfs("suggest", "--schema", EXAMPLE / "schema.json", "--cluster",
                            EXAMPLE / "cluster.json", "--profile", prof, "--json").stdout)
    assert "tp_across_nodes" not in j["dropped"] and j["profile"]["mfu"] == 0.5
    bad = write_json("bad.json", {"mfu": 2})
    for extra, code, msg in [
            (("--profile", bad), 1, f'{bad}: "mfu" = 2 is out of range (0, 1]'),
            (("--nodes", "n0,n9"), 1, '--nodes: node "n9" is not in the cluster'),
            (("--nodes", "n0,n0"), 1, '--nodes: node "n0" is listed twice'),
            (("--micro-batch", "0"), 2, '--micro-batch "0" is not a positive integer'),
            (("--global-batch", "4", "--micro-batch", "8"), 1,
             "--micro-batch = 8 exceeds the global batch of 4")]:
        p = run_mlfs("suggest", "--schema", EXAMPLE / "schema.json", "--cluster",
                     EXAMPLE / "cluster.json", *extra, check=False)
        assert p.returncode == code and msg in p.stderr, (extra, p.stderr)
    p = run_mlfs("suggest", "--schema", EXAMPLE / "schema.json", check=False)
    assert p.returncode == 2 and "usage: mlfs suggest" in p.stderr
