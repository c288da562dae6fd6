"""safetensors on a real mount: `mlfs import` of .safetensors files (schema names and
Hugging Face names, fused and split), `mlfs export --format safetensors`, and the live
view full/<state>.safetensors read during reconfigurations.

Every file is compared with one written here by an independent writer of the format
(docs/formats.md: a u64 length, compact JSON, spaces to a multiple of 8, tensors back
to back), not with the safetensors package, and every partition with NumPy slices.
"""
import json
import os
import struct
import threading

import numpy as np
import pytest

from conftest import run_mlfs
from test_store import (check_layout, expand, make_full, reconfigure, state_dtype,
                        tp_slice)

ST_DTYPES = {"bfloat16": "BF16", "float32": "F32", "float16": "F16", "float64": "F64",
             "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
             "bool": "BOOL"}


def st_bytes(tensors):
    """A safetensors file of [(name, dtype, array)], in that order."""
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, a in tensors:
        header[name] = {"dtype": ST_DTYPES[dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    data = b"".join(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
                    for _, _, a in tensors)
    return struct.pack("<Q", len(text)) + text + data


def st_read(data):
    """{name: (dtype, shape, bytes)} of a safetensors file's bytes."""
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    return {k: (v["dtype"], v["shape"], data[base + v["data_offsets"][0]:
                                             base + v["data_offsets"][1]])
            for k, v in header.items()}


def st_shards(tensors, max_bytes, base):
    """{file name: bytes} and the index of [(name, dtype, array)] in shards of at most
    @max_bytes, greedy in order (a larger tensor alone)."""
    groups, used = [[]], 0
    for t in tensors:
        if groups[-1] and used + t[2].nbytes > max_bytes:
            groups.append([])
            used = 0
        groups[-1].append(t)
        used += t[2].nbytes
    n = len(groups)
    names = [f"{base}.safetensors"] if n == 1 else \
        [f"{base}-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
    files = {names[k]: st_bytes(g) for k, g in enumerate(groups)}
    index = {"metadata": {"total_size": sum(t[2].nbytes for t in tensors)},
             "weight_map": {t[0]: names[k] for k, g in enumerate(groups) for t in g}}
    return files, (index if n > 1 else None)


def state_tensors(schema, full, state):
    """The state's tensors in schema order as the mount writes them."""
    return [(name, state_dtype(schema, state, spec), full[(state, name)])
            for name, spec, _ in expand(schema) if "tied" not in spec]


def mixed_schema(states=("model", "optim/exp_avg"), fc=(1024, 256)):
    """bf16 weights, fp32 norms and fc (@fc: its shape), the @states beyond "model" in
    fp32; fused and padded splits, a dim-1 split, a tied output; two layers, so that
    pp 2 puts each on its own stage."""
    return {
        "model": "mixed", "num_layers": 2,
        "states": {k: ({} if k == "model" else {"dtype": "float32"}) for k in states},
        "tensors": [
            {"name": "embedding/weight", "dtype": "bfloat16", "shape": [100, 64],
             "split": {"dim": 0, "pad_multiple": 8}, "place": "first"},
            {"name": "layers/{L}/qkv/weight", "dtype": "bfloat16", "shape": [192, 64],
             "split": {"dim": 0, "chunks": 3}},
            {"name": "layers/{L}/proj/weight", "dtype": "bfloat16", "shape": [64, 64],
             "split": {"dim": 1}},
            {"name": "layers/{L}/norm/weight", "dtype": "float32", "shape": [64]},
            {"name": "layers/{L}/fc/weight", "dtype": "float32", "shape": list(fc),
             "split": {"dim": 0, "chunks": 2}},
            {"name": "final_norm/weight", "dtype": "float32", "shape": [64], "place": "last"},
            {"name": "output/weight", "dtype": "bfloat16", "shape": [100, 64],
             "split": {"dim": 0, "pad_multiple": 8}, "place": "last",
             "tied": "embedding/weight"},
        ]}


def cfg(version, tp, pp=1, dp=1):
    return {"version": version, "tp": tp, "pp": pp, "dp": dp, "nodes": ["n0"]}


def read_tree(root):
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                out[os.path.relpath(os.path.join(d, f), root)] = fh.read()
    return out


def test_round_trip_bf16_fp32(mount, tmp_path):
    schema = mixed_schema()
    full = make_full(schema, np.random.default_rng(7))
    mount.setup(schema, cfg(1, 2))
    src = tmp_path / "in"
    want = {}
    for state in schema["states"]:
        files, index = st_shards(state_tensors(schema, full, state), 1 << 40,
                                 state.split("/")[-1])
        assert index is None
        for name, data in files.items():
            path = src / os.path.dirname(state) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            want[os.path.join(os.path.dirname(state), name)] = data
    mount.mlfs("import", "--from", src, "--step", "5")
    check_layout(mount, schema, cfg(1, 2), full, step=5)
    # The live view is the writer's file, byte for byte.
    assert mount.read("full/model.safetensors") == want["model.safetensors"]
    assert mount.read("full/optim/exp_avg.safetensors") == want["optim/exp_avg.safetensors"]
    assert "model.safetensors" in os.listdir(mount.p("full"))

    reconfigure(mount, tmp_path, cfg(2, 4, pp=2))
    check_layout(mount, schema, cfg(2, 4, pp=2), full)
    out = tmp_path / "out"
    mount.mlfs("export", "--to", out, "--format", "safetensors")
    assert read_tree(out) == want

    # Shards of 1 MiB: the fp32 MLPs (1 MiB each) each alone, and an index.
    sharded = tmp_path / "sharded"
    mount.mlfs("export", "--to", sharded, "--format", "safetensors", "--shard-mib", "1")
    files, index = st_shards(state_tensors(schema, full, "model"), 1 << 20, "model")
    assert index is not None and len(files) > 2
    got = read_tree(sharded)
    for name, data in files.items():
        assert got[name] == data, name
    assert json.loads(got["model.safetensors.index.json"]) == index

    # A sharded checkpoint imports back through its index.
    mount.mlfs("import", "--from", sharded, "--step", "6")
    check_layout(mount, schema, cfg(2, 4, pp=2), full, step=6)


def test_import_bf16_file_and_refusals(mount, tmp_path):
    schema = mixed_schema()
    full = make_full(schema, np.random.default_rng(8))
    mount.setup(schema, cfg(1, 2))
    good = state_tensors(schema, full, "model")
    path = tmp_path / "one.safetensors"
    path.write_bytes(st_bytes(good))
    mount.mlfs("import", "--from", path, "--step", "3")
    check_layout(mount, schema, cfg(1, 2), {**full, **{
        ("optim/exp_avg", n): np.zeros_like(a) for (s, n), a in full.items()
        if s == "optim/exp_avg"}}, step=3)
    before = mount.read("full/model.safetensors")

    def refused(data, *words):
        bad = tmp_path / "bad.safetensors"
        bad.write_bytes(data)
        p = mount.mlfs("import", "--from", bad, check=False)
        assert p.returncode == 1, p.stderr
        assert "bad.safetensors" in p.stderr and "nothing imported" in p.stderr, p.stderr
        for w in words:
            assert w in p.stderr, (w, p.stderr)
        assert mount.read("full/model.safetensors") == before

    f32 = [(n, "float32" if d == "bfloat16" else d, a.astype(np.float32) if d == "bfloat16"
            else a) for n, d, a in good]
    refused(st_bytes(f32), '"embedding/weight": dtype F32', "BF16")
    refused(st_bytes(good[1:]), '"embedding/weight" is in no file')
    refused(st_bytes(good + [("extra", "float32", np.zeros(2, np.float32))]), '"extra"')
    refused(st_bytes(good)[:-1], "past the file")
    data = st_bytes(good)
    refused(struct.pack("<Q", 1 << 40) + data[8:], "exceeds")
    n = struct.unpack("<Q", data[:8])[0]
    refused(data[:8] + b"[" + data[9:8 + n] + data[8 + n:], "not JSON")
    twisted = data.replace(b'"shape":[100,64]', b'"shape":[64,100]', 1)
    refused(twisted, "shape")
    dup = data[8:8 + n].replace(b'"layers/0/norm/weight"', b'"layers/1/norm/weight"', 1)
    refused(data[:8] + dup + data[8 + n:], "duplicate")
    overlap = data.replace(b'"data_offsets":[0,', b'"data_offsets":[2,', 1)
    refused(overlap, "embedding/weight")
    assert mount.status()["error"] and "nothing imported" in mount.status()["error"]


# ----------------------------------------------------------- Hugging Face names

def llama_hf(rng, L, H, A, G, F, V):
    """A Llama-style checkpoint with Hugging Face names: {name: bf16 bits}."""
    d = H // A
    bf = lambda *shape: rng.integers(0, 2**16, shape, dtype=np.uint16)
    t = {"model.embed_tokens.weight": bf(V, H)}
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = bf(H)
        t[p + "self_attn.q_proj.weight"] = bf(A * d, H)
        t[p + "self_attn.k_proj.weight"] = bf(G * d, H)
        t[p + "self_attn.v_proj.weight"] = bf(G * d, H)
        t[p + "self_attn.o_proj.weight"] = bf(H, A * d)
        t[p + "post_attention_layernorm.weight"] = bf(H)
        t[p + "mlp.gate_proj.weight"] = bf(F, H)
        t[p + "mlp.up_proj.weight"] = bf(F, H)
        t[p + "mlp.down_proj.weight"] = bf(H, F)
    t["model.norm.weight"] = bf(H)
    t["lm_head.weight"] = bf(V, H)
    return t


def llama_full(hf, L):
    """The schema's tensors from HF's: q/k/v and gate/up fused."""
    full = {"embedding/word_embeddings/weight": hf["model.embed_tokens.weight"],
            "final_layernorm/weight": hf["model.norm.weight"],
            "output_layer/weight": hf["lm_head.weight"]}
    for i in range(L):
        p, s = f"model.layers.{i}.", f"layers/{i}/"
        full[s + "input_layernorm/weight"] = hf[p + "input_layernorm.weight"]
        full[s + "self_attention/query_key_value/weight"] = np.concatenate(
            [hf[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
        full[s + "self_attention/dense/weight"] = hf[p + "self_attn.o_proj.weight"]
        full[s + "post_attention_layernorm/weight"] = hf[p + "post_attention_layernorm.weight"]
        full[s + "mlp/dense_h_to_4h/weight"] = np.concatenate(
            [hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]])
        full[s + "mlp/dense_4h_to_h/weight"] = hf[p + "mlp.down_proj.weight"]
    return full


def test_hf_llama_gqa_resliced(mount, tmp_path):
    L, H, A, G, F, V = 2, 64, 8, 4, 96, 200
    text = run_mlfs("schema", "llama", "--layers", L, "--hidden", H, "--heads", A,
                      "--kv-heads", G, "--vocab", V, "--ffn", F).stdout
    schema = json.loads(text)
    hf = llama_hf(np.random.default_rng(11), L, H, A, G, F, V)
    logical = llama_full(hf, L)
    full = {}
    for state in schema["states"]:
        for name, spec, _ in expand(schema):
            if "tied" not in spec:
                full[(state, name)] = logical[name] if state == "model" else \
                    np.zeros(spec["shape"], np.float32)
    mount.setup(schema, cfg(1, 1))
    src = tmp_path / "hf"
    src.mkdir()
    # Two shards and Hugging Face's index.
    names = list(hf)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    for f, ns in shards.items():
        (src / f).write_bytes(st_bytes([(n, "bfloat16", hf[n]) for n in ns]))
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(a.nbytes for a in hf.values())},
         "weight_map": {n: f for f, ns in shards.items() for n in ns}}))
    mount.mlfs("import", "--from", src, "--names", "hf", "--step", "1")
    for v, tp in enumerate([1, 2, 4], start=1):
        if v > 1:
            reconfigure(mount, tmp_path, cfg(v, tp))
        want = check_layout(mount, schema, cfg(v, tp), full)
        # The fused QKV of each rank: its q heads, then its k and v heads.
        d = H // A
        for t in range(tp):
            q = hf["model.layers.1.self_attn.q_proj.weight"]
            k = hf["model.layers.1.self_attn.k_proj.weight"]
            vv = hf["model.layers.1.self_attn.v_proj.weight"]
            a, g = A // tp, G // tp
            rank_qkv = np.concatenate([q[t * a * d:(t + 1) * a * d], k[t * g * d:(t + 1) * g * d],
                                       vv[t * g * d:(t + 1) * g * d]])
            assert np.array_equal(
                want[t]["model/layers/1/self_attention/query_key_value/weight.npy"], rank_qkv)
    # The same map as a file (`mlfs schema ... --names hf`) imports the same.
    mapfile = tmp_path / "map.json"
    mapfile.write_text(run_mlfs("schema", "llama", "--layers", L, "--hidden", H, "--heads", A,
                                "--kv-heads", G, "--vocab", V, "--ffn", F, "--names", "hf").stdout)
    assert json.loads(mapfile.read_text())["tensors"]["model.layers.0.mlp.up_proj.weight"] == {
        "to": "layers/0/mlp/dense_h_to_4h/weight", "runs": [[0, F, F]], "transpose": False}
    mount.mlfs("import", "--from", src, "--map", mapfile, "--step", "2")
    check_layout(mount, schema, cfg(3, 4), full, step=2)
    # Exported with HF names: q/k/v and gate/up split back, every byte as imported.
    out = tmp_path / "out"
    mount.mlfs("export", "--to", out, "--format", "safetensors", "--names", "hf")
    got = st_read((out / "model.safetensors").read_bytes())
    assert set(got) == set(hf)
    for n, a in hf.items():
        assert got[n] == ("BF16", list(a.shape), a.tobytes()), n
    # In schema order (a template's tensors for every layer, then the next
    # template's), a fused tensor's pieces in their chunks' order.
    pieces = {"self_attention/query_key_value/weight": ["self_attn.q_proj", "self_attn.k_proj",
                                                        "self_attn.v_proj"],
              "mlp/dense_h_to_4h/weight": ["mlp.gate_proj", "mlp.up_proj"]}
    order = []
    for name, _, layer in expand(schema):
        rest = name.split("/", 2)[2] if layer is not None else None
        if rest in pieces:
            order += [f"model.layers.{layer}.{x}.weight" for x in pieces[rest]]
        else:
            order += [n for n in hf if np.array_equal(hf[n], logical[name])]
    assert (out / "model.safetensors").read_bytes() == \
        st_bytes([(n, "bfloat16", hf[n]) for n in order])


def test_hf_gpt2_transposed(mount, tmp_path):
    L, H, A, V, S = 2, 32, 4, 50, 16
    schema = json.loads(run_mlfs("schema", "megatron-gpt", "--layers", L, "--hidden", H,
                                   "--heads", A, "--vocab", V, "--seq", S, "--tied",
                                   "--dtype", "float32").stdout)
    rng = np.random.default_rng(3)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    hf = {"wte.weight": f(V, H), "wpe.weight": f(S, H), "ln_f.weight": f(H),
          "ln_f.bias": f(H)}
    for i in range(L):
        p = f"h.{i}."
        hf.update({p + "ln_1.weight": f(H), p + "ln_1.bias": f(H),
                   p + "attn.c_attn.weight": f(H, 3 * H), p + "attn.c_attn.bias": f(3 * H),
                   p + "attn.c_proj.weight": f(H, H), p + "attn.c_proj.bias": f(H),
                   p + "ln_2.weight": f(H), p + "ln_2.bias": f(H),
                   p + "mlp.c_fc.weight": f(H, 4 * H), p + "mlp.c_fc.bias": f(4 * H),
                   p + "mlp.c_proj.weight": f(4 * H, H), p + "mlp.c_proj.bias": f(H),
                   p + "attn.bias": np.ones((1, 1, S, S), np.float32)})
    mount.setup(schema, cfg(1, 2))
    path = tmp_path / "gpt2.safetensors"
    path.write_bytes(st_bytes([(n, "float32", a) for n, a in hf.items()]))
    mount.mlfs("import", "--from", path, "--names", "hf")
    d = H // A
    w = hf["h.1.attn.c_attn.weight"].T  # [3H, H]: q, k, v rows
    megatron = np.concatenate([w[k * H + h * d:k * H + (h + 1) * d]
                               for h in range(A) for k in range(3)])
    got = np.load(mount.p("full/model/layers/1/self_attention/query_key_value/weight.npy"))
    assert np.array_equal(got, megatron)
    got = np.load(mount.p("full/model/layers/0/mlp/dense_4h_to_h/weight.npy"))
    assert np.array_equal(got, hf["h.0.mlp.c_proj.weight"].T)
    part = np.load(mount.p("ranks/1/model/layers/1/self_attention/query_key_value/weight.npy"))
    assert np.array_equal(part, megatron[3 * H // 2:])  # heads 2 and 3, whole groups
    out = tmp_path / "out"
    mount.mlfs("export", "--to", out, "--format", "safetensors", "--names", "hf")
    got = st_read((out / "model.safetensors").read_bytes())
    for n, a in hf.items():
        if not n.endswith("attn.bias"):
            assert got["transformer." + n] == ("F32", list(a.shape), a.tobytes()), n


# ------------------------------------------------------------------ live view

def test_live_view_one_version(mount, tmp_path):
    """Readers of full/model.safetensors during a loop of reconfigurations and saves
    get exactly one version's bytes per open."""
    schema = mixed_schema()
    schema["states"] = {"model": {}}
    rng = np.random.default_rng(5)
    versions = [make_full(schema, rng) for _ in range(2)]
    expect = [st_bytes(state_tensors(schema, f, "model")) for f in versions]
    mount.setup(schema, cfg(1, 2))
    src = tmp_path / "v0.safetensors"
    src.write_bytes(expect[0])
    mount.mlfs("import", "--from", src)

    # One open across a reconfiguration and a save keeps the old version.
    with open(mount.p("full/model.safetensors"), "rb") as fh:
        head = fh.read(4096)
        reconfigure(mount, tmp_path, cfg(2, 4))
        src1 = tmp_path / "v1.safetensors"
        src1.write_bytes(expect[1])
        mount.mlfs("import", "--from", src1, "--step", "1")
        rest = fh.read()
    assert head + rest == expect[0]
    assert mount.read("full/model.safetensors") == expect[1]

    stop, seen, bad = threading.Event(), set(), []

    def reader():
        while not stop.is_set():
            with open(mount.p("full/model.safetensors"), "rb") as fh:
                chunks = []
                while True:
                    c = fh.read(65536)
                    if not c:
                        break
                    chunks.append(c)
            data = b"".join(chunks)
            if data in expect:
                seen.add(expect.index(data))
            else:
                bad.append(len(data))

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        version, step = 2, 1
        for i, tp in enumerate([2, 1, 4, 2, 1, 4]):
            version += 1
            reconfigure(mount, tmp_path, cfg(version, tp, pp=1 + i % 2))
            step += 1
            mount.mlfs("import", "--from", [src, src1][i % 2], "--step", step)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not bad, bad
    assert seen == {0, 1}
