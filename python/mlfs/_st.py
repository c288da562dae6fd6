"""safetensors files, NumPy only: what the package hands to `mlfs import` and reads
back from the live view full/<state>.safetensors (docs/formats.md has the format).

The writer writes the canonical form of docs/formats.md (tensors back to back in
the order given, `__metadata__` first, compact JSON padded with spaces to a
multiple of 8 bytes). The reader reads a file with ONE open, so a file of the live
view is one version of the state to its end.
"""
import json
import os

import numpy as np

# safetensors dtype -> (schema dtype, the NumPy dtype mlfs stores it as)
DTYPES = {
    "F64": ("float64", "<f8"), "F32": ("float32", "<f4"), "F16": ("float16", "<f2"),
    "BF16": ("bfloat16", "<u2"), "I64": ("int64", "<i8"), "I32": ("int32", "<i4"),
    "I16": ("int16", "<i2"), "I8": ("int8", "i1"), "U8": ("uint8", "u1"),
    "BOOL": ("bool", "?"), "F8_E4M3": ("float8_e4m3fn", "u1"),
    "F8_E5M2": ("float8_e5m2", "u1"),
}
BY_SCHEMA = {schema: st for st, (schema, _) in DTYPES.items()}


def stored(schema_dtype):
    """The NumPy dtype mlfs stores @schema_dtype as (bfloat16 as <u2, fp8 as |u1)."""
    return np.dtype(DTYPES[BY_SCHEMA[schema_dtype]][1])


def write(path, entries):
    """Writes a safetensors file of @entries [(name, schema dtype, shape, produce)],
    in that order: produce() returns the tensor's bytes as a C-contiguous NumPy array
    (its stored dtype), called once, when the tensor is written, so that one tensor
    at a time is in memory. A produced array of another size is an error."""
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, dtype, shape, _ in entries:
        n = int(np.prod(shape, dtype=np.int64)) * stored(dtype).itemsize
        header[name] = {"dtype": BY_SCHEMA[dtype], "shape": [int(s) for s in shape],
                        "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for name, dtype, shape, produce in entries:
            arr = np.ascontiguousarray(produce())
            want = header[name]["data_offsets"]
            if arr.nbytes != want[1] - want[0] or tuple(arr.shape) != tuple(shape):
                raise ValueError(f"{name}: {list(arr.shape)} ({arr.nbytes} bytes), "
                                 f"expected {list(shape)} ({want[1] - want[0]} bytes)")
            f.write(arr.reshape(-1).view(np.uint8).data)
    os.replace(tmp, path)


def read(path, alloc):
    """Reads the safetensors file @path with one open: {name: alloc(name, schema
    dtype, shape)} with each tensor's bytes read into the writable C-contiguous
    NumPy byte view that alloc returns (with the tensor it stands for, as a pair:
    alloc returns (tensor, uint8 view of its memory)). Tensors in file order."""
    out = {}
    with open(path, "rb") as f:
        n = int.from_bytes(_exactly(f, 8, path), "little")
        if n > 100 << 20:
            raise ValueError(f"{path}: a header of {n} bytes")
        header = json.loads(_exactly(f, n, path))
        header.pop("__metadata__", None)
        base = 8 + n
        for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            dtype = DTYPES[e["dtype"]][0]
            t, view = alloc(name, dtype, tuple(e["shape"]))
            a, b = e["data_offsets"]
            if view.nbytes != b - a:
                raise ValueError(f"{path}: {name}: {b - a} bytes for {e['shape']} {dtype}")
            f.seek(base + a)
            mv, got = memoryview(view.reshape(-1)), 0
            while got < view.nbytes:
                k = f.readinto(mv[got:])
                if not k:
                    raise ValueError(f"{path}: {name}: the file ends early")
                got += k
            out[name] = t
    return out


def _exactly(f, n, path):
    b = f.read(n)
    if len(b) != n:
        raise ValueError(f"{path}: {len(b)} of {n} bytes, then end of file")
    return b
