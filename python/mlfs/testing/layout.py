"""The NumPy reference of mlfs's layouts, for tests (test-only helpers): full tensors
of a schema, every rank's partitions under a config (DESIGN sections 2 and 3) computed
with NumPy alone, and readers of a mount's ranks/ tree to compare with it bit for bit.
Cluster.check_layout and tests/e2e use them."""
import os

import numpy as np

NP_DTYPES = {
    "float64": "<f8", "float32": "<f4", "float16": "<f2", "bfloat16": "<u2",
    "int64": "<i8", "int32": "<i4", "int16": "<i2", "int8": "|i1", "uint8": "|u1",
    "bool": "|b1",
}


# A schema with every slicing feature: padding, equal and listed chunks, split
# dim 1, replicated tensors, first/last/all placement, a tied output layer,
# per-state dtypes and 5 layers (uneven pipeline splits for pp 2 and 4). The
# e2e tests' (tests/e2e/test_store.py and the files that import it from there)
# and tests/chaos's.
MIXED = {
    "model": "mixed",
    "num_layers": 5,
    "states": {"model": {}, "optim/exp_avg": {"dtype": "float32"}},
    "tensors": [
        {"name": "embedding/weight", "dtype": "bfloat16", "shape": [50, 8],
         "split": {"dim": 0, "pad_multiple": 4}, "place": "first"},
        {"name": "pos/weight", "dtype": "float16", "shape": [7, 3]},
        {"name": "layers/{L}/qkv/weight", "dtype": "bfloat16", "shape": [24, 8],
         "split": {"dim": 0, "chunks": [12, 6, 6]}},
        {"name": "layers/{L}/proj/weight", "dtype": "bfloat16", "shape": [8, 10],
         "split": {"dim": 1}},
        {"name": "layers/{L}/proj/bias", "dtype": "bfloat16", "shape": [8]},
        {"name": "layers/{L}/fc1/weight", "dtype": "float32", "shape": [20, 6],
         "split": {"dim": 0, "chunks": 2}},
        {"name": "final_norm/weight", "dtype": "float32", "shape": [8], "place": "last"},
        {"name": "output/weight", "dtype": "bfloat16", "shape": [50, 8],
         "split": {"dim": 0, "pad_multiple": 4}, "place": "last",
         "tied": "embedding/weight"},
    ],
}


def np_dtype(name):
    return np.dtype(NP_DTYPES[name])


def random_array(rng, dtype, shape):
    """Random data of schema dtype @dtype (bfloat16 as raw uint16 bits)."""
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype == "bfloat16":
        return rng.integers(0, 2**16, shape, dtype=np.uint16)
    dt = np_dtype(dtype)
    if dt.kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)


def expand(schema):
    """[(name, spec, layer or None)] in schema order, {L} expanded."""
    out = []
    for t in schema["tensors"]:
        if "{L}" in t["name"]:
            out += [(t["name"].replace("{L}", str(i)), t, i) for i in range(schema["num_layers"])]
        else:
            out.append((t["name"], t, None))
    return out


def state_dtype(schema, state, spec):
    return schema["states"][state].get("dtype", spec["dtype"])


def tp_slice(x, split, tp, t):
    """TP rank t's part of full tensor x (DESIGN section 3)."""
    if not split:
        return x
    k = split["dim"]
    y = np.moveaxis(x, k, 0)
    n = y.shape[0]
    m = split.get("pad_multiple")
    if m:
        q = m * tp
        padded = -(-n // q) * q
        z = np.zeros((padded,) + y.shape[1:], x.dtype)
        z[:n] = y
        y, n = z, padded
    ch = split.get("chunks", 1)
    sizes = [n // ch] * ch if isinstance(ch, int) else list(ch)
    assert sum(sizes) == n
    parts, off = [], 0
    for c in sizes:
        parts.append(y[off + t * c // tp: off + (t + 1) * c // tp])
        off += c
    return np.ascontiguousarray(np.moveaxis(np.concatenate(parts, 0), 0, k))


def coords(cfg, r):
    tp, dp = cfg["tp"], cfg["dp"]
    return r % tp, (r // tp) % dp, r // (tp * dp)


def stage_layers(L, pp, p):
    return p * L // pp, (p + 1) * L // pp


def holds(spec, layer, L, pp, p):
    """Whether pipeline stage p holds this tensor (DESIGN section 2)."""
    if layer is not None:
        lo, hi = stage_layers(L, pp, p)
        return lo <= layer < hi
    if "tied" in spec:
        return pp > 1 and p == pp - 1
    place = spec.get("place", "all")
    return place == "all" or (place == "first" and p == 0) or (place == "last" and p == pp - 1)


def make_full(schema, rng):
    """{(state, name): full array} for every non-tied tensor."""
    full = {}
    for state in schema["states"]:
        for name, spec, _ in expand(schema):
            if "tied" not in spec:
                full[(state, name)] = random_array(rng, state_dtype(schema, state, spec),
                                                   spec["shape"])
    return full


def expected_layout(schema, cfg, full):
    """{rank: {"<state>/<name>.npy": array}} for config @cfg."""
    L, tp, pp = schema["num_layers"], cfg["tp"], cfg["pp"]
    out = {}
    for r in range(cfg["tp"] * cfg["pp"] * cfg["dp"]):
        t, _, p = coords(cfg, r)
        files = {}
        for state in schema["states"]:
            for name, spec, layer in expand(schema):
                if not holds(spec, layer, L, pp, p):
                    continue
                src = full[(state, spec.get("tied", name))]
                files[f"{state}/{name}.npy"] = tp_slice(src, spec.get("split"), tp, t)
        out[r] = files
    return out


def write_full(dirpath, full):
    for (state, name), a in full.items():
        path = os.path.join(dirpath, state, name + ".npy")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.save(path, a)


def rank_tree(m, r):
    """Relative paths of the .npy files under ranks/<r> (dataset views excluded)."""
    base = m.p("ranks", r)
    found = set()
    for d, dirs, files in os.walk(base):
        if d == base and "data" in dirs:
            dirs.remove("data")
        found |= {os.path.relpath(os.path.join(d, f), base) for f in files if f.endswith(".npy")}
    return found


def snapshot(m):
    """Bytes of every file under ranks/, and the listing, for "nothing changed" checks."""
    snap = {}
    for d, _, files in os.walk(m.p("ranks")):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                snap[os.path.relpath(os.path.join(d, f), m.p("ranks"))] = fh.read()
    return snap
