"""mlfs_client: what a training script needs from an mlfs mount.

A small module (NumPy; PyTorch when installed) over the files of DESIGN
section 6. Every rank of a job opens the mount, reads where it sits in the
layout, loads its partitions, trains, and saves them back:

    mnt = mlfs_client.Mount("/mnt/mlfs")
    me = mnt.rank(int(os.environ["RANK"]))     # ranks/<r>/rank.json
    me.t, me.p, me.d, me.layers                # its TP, PP, DP coordinates, its layers
    step = me.saved_step()                     # ranks/<r>/step: the next step to train
    w = me.load("model", "layers/0/self_attention/query_key_value/weight")  # a torch tensor
    batch, ids = me.window(step, step + 8)     # data/<s>-<e>.npy and .ids.npy
    ...
    me.save_state({"model": params, "optim/exp_avg": m, ...}, step + 8)  # partitions, then step

and a driver changes the layout between two runs of the workers:

    mnt.reconfigure({"tp": 4, "pp": 1, "dp": 1})  # config.json with version + 1; waits
    mnt.reconfigure({"tp": 2, "pp": 2, "dp": 1, "nodes": ["n1", "n2"]})  # many nodes:
    other.wait_version(3)                         # then each node's Mount waits for it

Rules this module follows, and a hand-written client must too:
- Read a partition with ONE open (numpy.load(path), or `read_npy` here):
  one open file is one version to its end. numpy.load(mmap_mode="r") opens
  the path twice and can pair one version's header with another's bytes.
- bfloat16 (and fp8) partitions are stored as <u2 (|u1); the true dtype is
  in the extended attribute user.mlfs.dtype.
- A write becomes visible when the file is closed; a header with another
  dtype or shape is refused (EINVAL) and status.json says why.
- Write every partition first, then `step`: `step` is the rank's promise
  that its state for that step is complete. A reconfiguration needs every
  rank of the current layout to have written the same step.
"""
import json
import os
import time

import numpy as np

try:
    import torch
except ImportError:  # the NumPy half works without PyTorch
    torch = None

__all__ = ["Mount", "Rank", "MlfsError", "read_npy", "to_torch", "from_torch"]

# True dtype (user.mlfs.dtype) -> how the .npy stores it.
_STORED = {"bfloat16": np.dtype("<u2"), "float8_e4m3fn": np.dtype("u1"),
           "float8_e5m2": np.dtype("u1")}


class MlfsError(RuntimeError):
    """A refusal of the mount, with status.json's reason when it gives one."""


def read_npy(path, mapped=False):
    """Reads a .npy file with one open. @mapped: a copy-on-write memory map of
    the open file (no copy until written; the mapping keeps that version
    alive until it is freed); otherwise the bytes are read into memory."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        shape, fortran, dtype = np.lib.format._read_array_header(f, version)
        order = "F" if fortran else "C"
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            return np.empty(shape, dtype, order=order)
        if mapped:
            return np.memmap(f, dtype=dtype, mode="c", shape=shape, offset=f.tell(),
                             order=order)
        buf = bytearray(count * dtype.itemsize)
        view, got = memoryview(buf), 0
        while got < len(buf):
            n = f.readinto(view[got:])
            if not n:
                raise MlfsError(f"{path}: {got} of {len(buf)} bytes, then end of file")
            got += n
        return np.frombuffer(buf, dtype).reshape(shape, order=order)


def to_torch(arr, true_dtype=None):
    """A NumPy array from a partition as a torch tensor sharing its memory
    (bfloat16 reinterpreted from its <u2 storage)."""
    if true_dtype == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    if true_dtype in _STORED:
        raise MlfsError(f"{true_dtype}: this PyTorch has no such dtype; read it with NumPy")
    return torch.from_numpy(arr)


def from_torch(t):
    """A torch tensor as the NumPy array that mlfs stores (bfloat16 as <u2)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view("<u2")
    return t.numpy()


class Mount:
    """An mlfs mount point. Reads are not cached: every call reads the file."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.isfile(self.p("status.json")):
            raise MlfsError(f"{self.path}: not an mlfs mount (no status.json)")

    def p(self, *parts):
        return os.path.join(self.path, *map(str, parts))

    def _json(self, name):
        with open(self.p(name), "rb") as f:
            return json.loads(f.read())

    def config(self):
        return self._json("config.json")

    def schema(self):
        return self._json("schema.json")

    def status(self):
        return self._json("status.json")

    def error(self):
        """status.json's error (why the last write or reconfiguration was refused), or None."""
        try:
            return self.status().get("error")
        except OSError:
            return None

    def ranks(self):
        """The ranks hosted on this node, in order."""
        return sorted(int(r) for r in os.listdir(self.p("ranks")))

    def rank(self, r):
        return Rank(self, r)

    def write(self, name, data):
        """Writes a control or job/ file with one open, one write, one close;
        MlfsError with status.json's reason when the mount refuses it."""
        data = data.encode() if isinstance(data, str) else data
        try:
            with open(self.p(name), "wb") as f:
                f.write(data)
        except OSError as e:
            raise MlfsError(f"{name}: {e.strerror}: {self.error() or 'no reason given'}") from e

    def job_json(self, name, value=None):
        """Reads (or, with @value, writes) job/<name>: JSON shared by every rank and kept
        across reconfigurations (hyper-parameters, run metadata)."""
        if value is None:
            return self._json(os.path.join("job", name))
        self.write(os.path.join("job", name), json.dumps(value, indent=1))
        return value

    def set_up(self, schema, config):
        """A new job: the schema, then the first layout (every partition then exists, zeroed)."""
        self.write("schema.json", json.dumps(schema, indent=1))
        self.write("config.json", json.dumps(config, indent=1))

    def reconfigure(self, changes, wait=True, timeout=600, on_progress=None):
        """Writes a new config.json: the current config updated with @changes (a dict,
        e.g. {"tp": 2, "pp": 1, "dp": 2}, or with the nodes too in a job of many nodes:
        {"tp": 2, "pp": 1, "dp": 2, "nodes": ["n1", "n2"]}) and, unless @changes gives
        one, the next version. Every rank must have saved the same step first. With
        @wait, waits for the new version on this node (wait_version) and returns
        status.json's "last" figures (bytes_reused, bytes_copied, bytes_fetched,
        bytes_zeroed, seconds, ...). MlfsError, with the reason, when the config is
        refused or the change fails."""
        cur = self.config()
        new = dict(cur, **changes)
        if "version" not in changes:
            new["version"] = cur["version"] + 1
        self.write("config.json", json.dumps(new))
        if not wait:
            return None
        return self.wait_version(new["version"], timeout, on_progress)

    def wait_version(self, version, timeout=600, on_progress=None):
        """Polls status.json until config version @version (or a later one) is current
        on this node and the node is idle, calling on_progress(state, bytes_done,
        bytes_total) as it goes; returns status.json's "last" figures. In a job of many
        nodes every node swaps when it sees the commit, the node where config.json was
        written not necessarily first: wait on each node whose files are read next.
        MlfsError, with the reason, when the change failed."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.status()
            if s["state"] == "failed":
                raise MlfsError(f"reconfiguration to version {version}: {s.get('error')}")
            if on_progress:
                on_progress(s["state"], s.get("progress_bytes", 0), s.get("progress_total", 0))
            if s["state"] == "idle" and (s["version"] or 0) >= version:
                return s.get("last")
            if time.monotonic() > deadline:
                raise MlfsError(f"reconfiguration to version {version}: still "
                                f"{s['state']} after {timeout} s")
            time.sleep(0.01)


class Rank:
    """One rank's directory, ranks/<r>/, and its place in the layout (rank.json)."""

    def __init__(self, mount, r):
        self.mount = mount
        self.rank = int(r)
        self.dir = mount.p("ranks", self.rank)
        with open(os.path.join(self.dir, "rank.json"), "rb") as f:
            self.info = json.loads(f.read())
        i = self.info
        self.t, self.p, self.d = i["tp"], i["pp"], i["dp"]  # coordinates
        self.tp, self.pp, self.dp = i["tp_size"], i["pp_size"], i["dp_size"]  # degrees
        self.layers = range(*i["layers"])
        self.version = i["version"]

    def __repr__(self):
        return (f"<rank {self.rank}: t{self.t}/{self.tp} p{self.p}/{self.pp} "
                f"d{self.d}/{self.dp} layers {self.layers.start}-{self.layers.stop - 1}>")

    def path(self, state, name):
        return os.path.join(self.dir, state, name + ".npy")

    def tensor_names(self, state="model"):
        """The tensors this rank holds (its stage's), as schema names, sorted."""
        root = os.path.join(self.dir, state)
        out = []
        for d, _, files in os.walk(root):
            out += [os.path.relpath(os.path.join(d, f), root)[:-4]
                    for f in files if f.endswith(".npy")]
        return sorted(out)

    def dtype(self, state, name):
        """The partition's true dtype (user.mlfs.dtype), e.g. "bfloat16"."""
        return os.getxattr(self.path(state, name), "user.mlfs.dtype").decode()

    def load(self, state, name, mapped=True):
        """A partition as a torch tensor (one open; copy-on-write mapped unless
        @mapped is False, so nothing is copied until it is written)."""
        path = self.path(state, name)
        arr = read_npy(path, mapped=mapped)
        true = self.dtype(state, name) if arr.dtype in (np.uint16, np.uint8) else None
        return to_torch(arr, true)

    def load_state(self, state, names=None, mapped=True):
        """{name: tensor} for every tensor of this rank (or @names) in @state."""
        return {n: self.load(state, n, mapped) for n in (names or self.tensor_names(state))}

    def save(self, state, name, tensor):
        """Overwrites a partition (numpy.save; visible when closed). A torch tensor or a
        NumPy array of the partition's dtype and shape; MlfsError with the reason if not."""
        arr = from_torch(tensor) if torch is not None and isinstance(tensor, torch.Tensor) \
            else np.ascontiguousarray(tensor)
        try:
            np.save(self.path(state, name), arr)
        except OSError as e:
            raise MlfsError(f"ranks/{self.rank}/{state}/{name}.npy: {e.strerror}: "
                            f"{self.mount.error() or 'no reason given'}") from e

    def saved_step(self):
        """The step this rank saved: the number of steps trained, so the next batch."""
        with open(os.path.join(self.dir, "step"), "rb") as f:
            return int(f.read().decode().strip() or 0)

    def mark_step(self, step):
        self.mount.write(os.path.join("ranks", str(self.rank), "step"), f"{int(step)}\n")

    def save_state(self, states, step):
        """A save: every partition of {state: {name: tensor}}, then `step`."""
        for state, tensors in states.items():
            for name, t in tensors.items():
                self.save(state, name, t)
        self.mark_step(step)

    def data(self, step):
        """(records, ids) of @step's view: this DP rank's slice of the global batch."""
        base = os.path.join(self.dir, "data", str(step))
        return read_npy(base + ".npy"), read_npy(base + ".ids.npy")

    def window(self, start, end):
        """(records [end-start, local_batch, ...], ids [end-start, local_batch]) of steps
        start..end-1 in two opens (at most 64 steps, all with the same local batch)."""
        base = os.path.join(self.dir, "data", f"{start}-{end}")
        return read_npy(base + ".npy"), read_npy(base + ".ids.npy")
