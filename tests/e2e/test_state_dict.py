"""mlfs.torch.import_state_dict and export_state_dict (issue 19, item 4): a state dict
of full tensors, bf16 and fp32, keyed by the schema's names (dots for slashes), by a
dict or a function, or by Hugging Face's names, imported into the mount's current
layout (every partition checked against NumPy slices, test_store.check_layout),
carried through reconfigurations, and exported back bit-exact, dtypes kept."""
import json

import numpy as np
import pytest
import torch

from conftest import run_mlfs
from test_store import check_layout, expand, reconfigure, snapshot

import mlfs
import mlfs.torch as mt

HEADS, KV, D, HIDDEN, FFN, VOCAB = 8, 4, 4, 32, 48, 50


def schema():
    """Llama (grouped-query QKV chunks, SwiGLU chunks, padded vocab, tied output), its
    norms in fp32 and the rest in bf16."""
    s = json.loads(run_mlfs("schema", "llama", "--layers", 2, "--hidden", HIDDEN, "--heads",
                            HEADS, "--kv-heads", KV, "--ffn", FFN, "--vocab", VOCAB,
                            "--tied").stdout)
    for t in s["tensors"]:
        if "norm" in t["name"]:
            t["dtype"] = "float32"
    return s


def bits(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view("<u2")
    return t.numpy()


def random_state(sch, seed, state="model"):
    """{schema name with dots: tensor} of every tensor of @state, tied ones as the same
    tensor as their target (what a tied model's state_dict() holds)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    sdt = sch["states"][state].get("dtype")
    for name, spec, _ in expand(sch):
        dt = getattr(torch, sdt or spec["dtype"])
        key = name.replace("/", ".")
        if "tied" in spec:
            out[key] = out[spec["tied"].replace("/", ".")]
        else:
            out[key] = (torch.randn(*spec["shape"], generator=g) * 3).to(dt)
    return out


def full_of(sch, states):
    """{(state, name): NumPy array as stored} for check_layout; zeros for states not given."""
    full = {}
    for state in sch["states"]:
        for name, spec, _ in expand(sch):
            if "tied" in spec:
                continue
            if state in states:
                full[(state, name)] = bits(states[state][name.replace("/", ".")])
            else:
                dt = sch["states"][state].get("dtype", spec["dtype"])
                full[(state, name)] = np.zeros(spec["shape"], "<u2" if dt == "bfloat16" else dt)
    return full


def same_dict(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].view(torch.int16) if a[k].dtype == torch.bfloat16 else a[k],
                           b[k].view(torch.int16) if b[k].dtype == torch.bfloat16 else b[k]), k


def test_round_trip_through_reconfigurations(mount, tmp_path):
    """A bf16 + fp32 state dict (and an fp32 optimizer moment from a torch.save'd file)
    imported at tp2 pp2, every partition checked; reconfigured to tp4 pp1 dp2 and to tp1
    pp2; exported: bit-exact, dtypes kept, the tied output layer the embedding."""
    sch = schema()
    mnt = mlfs.Mount(mount.path)
    cfg = {"version": 1, "tp": 2, "pp": 2, "dp": 1, "nodes": ["n0"]}
    mnt.set_up(sch, cfg)
    model = random_state(sch, 1)
    moment = random_state(sch, 2, "optim/exp_avg")
    assert model["layers.0.input_layernorm.weight"].dtype == torch.float32
    assert model["layers.0.mlp.dense_h_to_4h.weight"].dtype == torch.bfloat16
    mt.import_state_dict(mnt, model, step=5)
    torch.save(moment, tmp_path / "exp_avg.pt")
    mt.import_state_dict(mount.path, tmp_path / "exp_avg.pt", state="optim/exp_avg", step=5)
    states = {"model": model, "optim/exp_avg": moment}
    check_layout(mount, sch, cfg, full_of(sch, states), step=5)

    for v, (tp, pp, dp) in enumerate([(4, 1, 2), (1, 2, 1)], start=2):
        cfg = dict(cfg, version=v, tp=tp, pp=pp, dp=dp)
        reconfigure(mount, tmp_path, cfg)
        check_layout(mount, sch, cfg, full_of(sch, states), step=5)
        for state, want in states.items():
            got = mt.export_state_dict(mnt, state)
            same_dict(got, want)
            assert got["output_layer.weight"] is got["embedding.word_embeddings.weight"]


def test_names_dict_callable_and_hf(mount_factory, tmp_path):
    """Keys named otherwise: a dict (with a key left out by None), a function, and
    Hugging Face's Llama names, whose q/k/v and gate/up the daemon fuses into the
    schema's chunks; each exported back under the same names, bit-exact."""
    sch = schema()
    cfg = {"version": 1, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"]}
    model = random_state(sch, 3)
    ours = {k: v for k, v in model.items() if k != "output_layer.weight"}

    m = mount_factory(name="dict")
    mnt = mlfs.Mount(m.path)
    mnt.set_up(sch, cfg)
    names = {"tok.weight": "embedding/word_embeddings/weight", "rope.inv_freq": None}
    sd = {("tok.weight" if k == "embedding.word_embeddings.weight" else k): v
          for k, v in ours.items()}
    sd["rope.inv_freq"] = torch.ones(4)
    mt.import_state_dict(mnt, sd, names=names)
    check_layout(m, sch, cfg, full_of(sch, {"model": model}), step=0)
    got = mt.export_state_dict(mnt, names=names)
    del sd["rope.inv_freq"]
    sd["output.weight"] = got.pop("output_layer.weight")
    same_dict(got, {k: v for k, v in sd.items() if k != "output.weight"})
    assert torch.equal(sd["output.weight"].view(torch.int16), sd["tok.weight"].view(torch.int16))

    mnt2 = mlfs.Mount(mount_factory(name="fn").path)
    mnt2.set_up(sch, cfg)
    mt.import_state_dict(mnt2, {"m." + k: v for k, v in ours.items()},
                         names=lambda k: k[2:].replace(".", "/"))
    same_dict(mt.export_state_dict(mnt2, names=lambda n: "m." + n.replace("/", ".")), {
        "m." + k: v for k, v in model.items()})

    # Hugging Face's names: q/k/v and gate/up separate; the schema's rows hold them in
    # its chunks, so a TP rank gets its q heads, its k and v heads, its gate and up rows.
    hf = {"model.embed_tokens.weight": model["embedding.word_embeddings.weight"],
          "model.norm.weight": model["final_layernorm.weight"]}
    for i in range(2):
        p, q = f"layers.{i}.", f"model.layers.{i}."
        qkv = model[p + "self_attention.query_key_value.weight"]
        hf[q + "self_attn.q_proj.weight"] = qkv[:HEADS * D].clone()
        hf[q + "self_attn.k_proj.weight"] = qkv[HEADS * D:(HEADS + KV) * D].clone()
        hf[q + "self_attn.v_proj.weight"] = qkv[(HEADS + KV) * D:].clone()
        fc1 = model[p + "mlp.dense_h_to_4h.weight"]
        hf[q + "mlp.gate_proj.weight"], hf[q + "mlp.up_proj.weight"] = \
            fc1[:FFN].clone(), fc1[FFN:].clone()
        hf[q + "self_attn.o_proj.weight"] = model[p + "self_attention.dense.weight"]
        hf[q + "mlp.down_proj.weight"] = model[p + "mlp.dense_4h_to_h.weight"]
        hf[q + "input_layernorm.weight"] = model[p + "input_layernorm.weight"]
        hf[q + "post_attention_layernorm.weight"] = model[p + "post_attention_layernorm.weight"]
    m3 = mount_factory(name="hf")
    mnt3 = mlfs.Mount(m3.path)
    mnt3.set_up(sch, cfg)
    mt.import_state_dict(mnt3, hf, names="hf", step=2)
    check_layout(m3, sch, cfg, full_of(sch, {"model": model}), step=2)
    reconfigure(m3, tmp_path, dict(cfg, version=2, tp=1, dp=2))
    same_dict(mt.export_state_dict(mnt3, names="hf", tmpdir=tmp_path), hf)
    same_dict(mt.export_state_dict(mnt3), model)


def test_refusals_change_nothing(mount, tmp_path):
    """A tensor of another dtype (fp32 for bf16), a missing tensor, a key the schema
    does not have, a tied copy that differs from its target: refused naming it, every
    partition unchanged."""
    sch = schema()
    mnt = mlfs.Mount(mount.path)
    mnt.set_up(sch, {"version": 1, "tp": 2, "pp": 1, "dp": 1, "nodes": ["n0"]})
    model = random_state(sch, 4)
    mt.import_state_dict(mnt, model, step=3)
    before = snapshot(mount)
    new = random_state(sch, 5)
    w = "layers.1.self_attention.dense.weight"
    cases = [
        (dict(new, **{w: new[w].float()}), "layers/1/self_attention/dense/weight"),
        ({k: v for k, v in new.items() if k != w}, "layers/1/self_attention/dense/weight"),
        (dict(new, extra=torch.zeros(2)), "extra"),
        (dict(new, **{"output_layer.weight": new["output_layer.weight"] + 1}),
         "tied to embedding/word_embeddings/weight"),
    ]
    for sd, words in cases:
        with pytest.raises(mlfs.MlfsError, match=words):
            mt.import_state_dict(mnt, sd, step=4)
        assert snapshot(mount) == before
    same_dict(mt.export_state_dict(mnt), model)
