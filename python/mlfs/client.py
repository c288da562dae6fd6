"""The files of a mount (DESIGN section 6) as Mount and Rank objects.

NumPy only: PyTorch is imported by the methods that return or take torch
tensors (Rank.load, Rank.load_into, Rank.save of a model), so a driver
that only reconfigures does not pay for `import torch`.

Rules this module follows, and a hand-written client must too:
- Read a partition with ONE open (numpy.load(path), or `read_npy` here):
  one open file is one version to its end. numpy.load(mmap_mode="r") opens
  the path twice and can pair one version's header with another's bytes.
- bfloat16 (and fp8) partitions are stored as <u2 (|u1); the true dtype is
  in the extended attribute user.mlfs.dtype.
- A write becomes visible when the file is closed, and a refusal is
  reported at the close: every write here is one open, one write, one
  close in a `with` block, so the error raises instead of being dropped.
- Write every partition first, then `step`: `step` is the rank's promise
  that its state for that step is complete. A reconfiguration needs every
  rank of the current layout to have written the same step.
"""
import errno
import json
import os
import select
import sys
import time

import numpy as np

__all__ = ["Mount", "Rank", "MlfsError", "read_npy"]


class MlfsError(RuntimeError):
    """A refusal of the mount, with status.json's reason when it gives one.
    @errno: the refused call's errno (EBUSY, EINVAL, ...), None when the
    refusal was not a failed system call (a failed reconfiguration)."""

    def __init__(self, message, errno=None):
        super().__init__(message)
        self.errno = errno


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


def _is_torch(x):
    """Whether @x is a torch tensor, without importing torch: if torch is not
    imported yet, nothing can be one."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


class Mount:
    """An mlfs mount point. Reads are not cached: every call reads the file."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.isfile(self.p("status.json")):
            raise MlfsError(f"{self.path}: not an mlfs mount (no status.json)")

    def __repr__(self):
        return f"<mlfs mount {self.path}>"

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

    def _statuses(self, deadline):
        """status.json, again each time it changes, until @deadline (time.monotonic())
        passes: the file stays open and is polled (the mount wakes the poll when the
        state, version or error moved), read again at least every 100 ms (progress
        bytes move without a wake-up) and every 10 ms on a mount whose polls always
        say readable. Yields the parsed status, then None once the deadline passed."""
        prev, woke = None, False
        while True:
            fd = os.open(self.p("status.json"), os.O_RDONLY)
            try:
                text = b""
                while True:
                    chunk = os.read(fd, 1 << 20)
                    if not chunk:
                        break
                    text += chunk
                yield json.loads(text)
                left = deadline - time.monotonic()
                if left <= 0:
                    yield None
                    return
                if woke and text == prev:  # a wake-up with nothing new
                    time.sleep(min(0.01, left))
                    woke = False
                else:
                    p = select.poll()
                    p.register(fd, select.POLLIN | select.POLLPRI)
                    woke = bool(p.poll(min(100, max(1, int(left * 1000)))))
                prev = text
            finally:
                os.close(fd)

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

    def refused(self, name, e):
        """The MlfsError for OSError @e of a write to @name: the call's reason and
        status.json's error, which says why the mount refused it. An EBUSY during a
        reconfiguration (a partition or `step` write) is not noted there: then the
        reconfiguration that refused it is named."""
        try:
            s = self.status()
        except OSError:
            s = {}
        reason = s.get("error")
        if e.errno == errno.EBUSY and s.get("state") not in (None, "idle", "failed"):
            reason = (f"a reconfiguration to version {s.get('target_version')} is in "
                      f"progress ({s['state']})")
        return MlfsError(f"{name}: {e.strerror}: {reason or 'no reason given'}", e.errno)

    def write(self, name, data):
        """Writes a control or job/ file with one open, one write, one close;
        MlfsError with status.json's reason when the mount refuses it (at the
        open, the write or the close: the `with` block raises all three)."""
        data = data.encode() if isinstance(data, str) else data
        try:
            with open(self.p(name), "wb") as f:
                f.write(data)
        except OSError as e:
            raise self.refused(name, e) from e

    def control(self, request):
        """Sends one request ({"op": ...}) to the control file .mlfs-ctl, as `mlfs import`
        does: one open, one write, the reply read back from the same open file. Returns
        the reply; MlfsError with the reply's error (and the write's errno) on refusal."""
        fd = os.open(self.p(".mlfs-ctl"), os.O_RDWR | os.O_CLOEXEC)
        try:
            err = None
            try:
                os.write(fd, json.dumps(request).encode())
            except OSError as e:
                err = e
            try:
                reply = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
            except (OSError, ValueError):
                reply = {}
        finally:
            os.close(fd)
        if err is not None:
            why = reply.get("error") or err.strerror
            raise MlfsError(f"{request.get('op')}: {why}", err.errno) from err
        return reply

    def import_from(self, path, state=None, step=None, names=None, map=None, every_node=False,
                    wait=None):
        """`mlfs import` through the package: the daemon reads @path (a directory of
        full tensors, `<state>/<tensor>.npy` or `<state>.safetensors`, a snapshot, or a
        .safetensors file) and slices it into this node's partitions of the current
        layout, all or nothing, as the saved state of @step (default: 0, or the
        snapshot's). @state: that state only; @names "hf" or @map (a mapping file):
        safetensors named otherwise (docs/formats.md). In a job of many nodes, every
        node imports the partitions it hosts: call it on each node's mount, or once with
        @every_node (`mlfs import --every-node`): every node of the job reads @path (it
        must be on storage they all see) into its own ranks; the call returns once all
        did (the reply's "nodes": {id: "imported"}), within @wait seconds (default
        600), or raises MlfsError naming the node that failed and why."""
        req = {"op": "import", "from": os.path.abspath(os.fspath(path))}
        if every_node:
            req["every_node"] = True
            if wait is not None:
                req["wait"] = int(wait)
        if state is not None:
            req["state"] = state
        if step is not None:
            req["step"] = int(step)
        if names is not None:
            req["names"] = names
        if map is not None:
            req["map"] = os.path.abspath(os.fspath(map))
        return self.control(req)

    def tensors(self, state="model"):
        """The schema's tensors of @state, every {L} template expanded for each layer, in
        the schema's order: [{"name", "dtype" (the state's dtype where it sets one),
        "shape", "split", "tied", ...}]. Tied tensors included (they hold their target's
        data: no import or export file of their own)."""
        schema = self.schema()
        if state not in schema["states"]:
            raise MlfsError(f"the schema has no state {state!r} (it has "
                            f"{sorted(schema['states'])})")
        sdt = (schema["states"][state] or {}).get("dtype")
        out = []
        for t in schema["tensors"]:
            layers = range(schema["num_layers"]) if "{L}" in t["name"] else [None]
            for i in layers:
                e = {k: (v.replace("{L}", str(i)) if isinstance(v, str) and i is not None
                         else v) for k, v in t.items()}
                if sdt:
                    e["dtype"] = sdt
                out.append(e)
        return out

    def wait_writable(self, version, deadline):
        """After a write refused with EBUSY: waits on status.json until the reconfiguration
        that refused it ends or @deadline (time.monotonic()) passes. Returns (True, v)
        when writes are open again at layout version @version (the change was aborted
        or failed: the refused write can be made again), (False, v) when the layout is
        now version v != @version (the change committed: the writer's layout is gone),
        (None, v) at the deadline."""
        v = None
        for s in self._statuses(deadline):
            if s is None:
                return None, v
            v = s.get("version")
            if s.get("state") in ("idle", "failed"):
                return (v == version), v

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

    def reconfigure(self, config, wait=True, timeout=600, progress=None, on_progress=None):
        """Writes a new config.json: the current config updated with @config (the changes,
        e.g. {"tp": 2, "pp": 1, "dp": 2}, with the nodes too in a job of many nodes:
        {"tp": 2, "pp": 1, "dp": 2, "nodes": ["n1", "n2"]}, or a whole config) and, unless
        @config gives one, the next version. Every rank must have saved the same step
        first. With @wait, waits for the new version on this node (wait_version, calling
        @progress(state, bytes_done, bytes_total); @on_progress is its first name) and
        returns status.json's "last" figures (bytes_reused, bytes_copied, bytes_fetched,
        bytes_zeroed, seconds, ...). MlfsError, with status.json's reason, when the config
        is refused (at the close of config.json) or the change fails."""
        cur = self.config()
        new = dict(cur, **config)
        if "version" not in config:
            new["version"] = cur["version"] + 1
        self.write("config.json", json.dumps(new))
        if not wait:
            return None
        return self.wait_version(new["version"], timeout, progress or on_progress)

    def wait_version(self, version, timeout=600, on_progress=None):
        """Waits on status.json (polled: _statuses) until config version @version (or a
        later one) is current on this node and the node is idle, calling on_progress(state, bytes_done,
        bytes_total) as it goes; returns status.json's "last" figures. In a job of many
        nodes every node swaps when it sees the commit, the node where config.json was
        written not necessarily first: wait on each node whose files are read next.
        MlfsError, with the reason, when the change failed."""
        deadline = time.monotonic() + timeout
        last = None
        for s in self._statuses(deadline):
            if s is None:
                raise MlfsError(f"reconfiguration to version {version}: still "
                                f"{last['state']} after {timeout} s")
            last = s
            if s["state"] == "failed":
                raise MlfsError(f"reconfiguration to version {version}: {s.get('error')}")
            if on_progress:
                on_progress(s["state"], s.get("progress_bytes", 0), s.get("progress_total", 0))
            if s["state"] == "idle" and (s["version"] or 0) >= version:
                return s.get("last")


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
        self._states = None

    def __repr__(self):
        return (f"<rank {self.rank}: t{self.t}/{self.tp} p{self.p}/{self.pp} "
                f"d{self.d}/{self.dp} layers {self.layers.start}-{self.layers.stop - 1}>")

    def path(self, state, name):
        return os.path.join(self.dir, state, name + ".npy")

    def where(self, state, name):
        """The partition's name in messages: ranks/<r>/<state>/<name>.npy."""
        return f"ranks/{self.rank}/{state}/{name}.npy"

    def states(self):
        """The schema's state roots ("model", "optim/exp_avg", ...): every rank holds each.
        Read once: a job's schema does not change under a rank."""
        if self._states is None:
            self._states = list(self.mount.schema()["states"])
        return self._states

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

    def read(self, state, name, mapped=False):
        """A partition as the NumPy array the mount stores (bfloat16 as its <u2 bits;
        self.dtype says the true dtype), with one open."""
        return read_npy(self.path(state, name), mapped=mapped)

    def load(self, state, name, mapped=True):
        """A partition as a torch tensor (one open; copy-on-write mapped unless
        @mapped is False, so nothing is copied until it is written)."""
        from .torch import to_torch
        arr = self.read(state, name, mapped=mapped)
        true = self.dtype(state, name) if arr.dtype in (np.uint16, np.uint8) else None
        return to_torch(arr, true)

    def load_state(self, state, names=None, mapped=True):
        """{name: tensor} for every tensor of this rank (or @names) in @state."""
        return {n: self.load(state, n, mapped) for n in (names or self.tensor_names(state))}

    # Seconds a write refused with EBUSY (a reconfiguration is preparing) waits for the
    # reconfiguration to end before it fails; 0: fail at once. See _busy_retry.
    busy_wait = 60.0

    def _busy_retry(self, what, write, wait):
        """Runs @write() (one open, write, checked close); an OSError is MlfsError with
        status.json's reason. A refusal with EBUSY is a reconfiguration in progress:
        for up to @wait seconds (None: self.busy_wait) it waits for the reconfiguration
        to end and then, if it was aborted (or failed) and the layout is still this
        rank's, writes again; if it committed, the layout this rank saves is gone and
        MlfsError (errno ESTALE) says so: the save is lost, the job goes on from the
        step every rank saved before (docs/decisions.md, "A step written during a
        reconfiguration")."""
        wait = self.busy_wait if wait is None else wait
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            self._check_layout(what)
            try:
                return write()
            except OSError as e:
                if e.errno != errno.EBUSY or wait <= 0:
                    raise self.mount.refused(what, e) from e
                err = self.mount.refused(what, e)
                again, v = self.mount.wait_writable(self.version, deadline)
                if again:
                    continue
                if again is None:
                    raise MlfsError(f"{err} (waited {wait:g} s for it)", e.errno) from e
                raise MlfsError(
                    f"{what}: the layout changed from version {self.version} to {v} during "
                    f"this save: rank {self.rank}'s partitions of version {self.version} "
                    "are gone and this save is lost; start again from the new rank.json "
                    "and the step every rank saved", errno.ESTALE) from e

    def _check_layout(self, what):
        """MlfsError (errno ESTALE) when the mount's committed layout is no longer this
        rank's version: a write opened now would land in the new layout's partitions
        (same path, another rank's slice, or the same slice at an older step). The
        daemon refuses a write whose file was opened before a commit (ESTALE at its
        close); this check keeps a writer that opens after one from writing at all.
        The window left is a commit between this check and the open, microseconds
        against the milliseconds of a reconfiguration's prepare, during which every
        write is refused (docs/decisions.md)."""
        try:
            v = self.mount.status().get("version")
        except OSError:
            return  # the write itself says what is wrong with the mount
        if v is not None and v != self.version:
            raise MlfsError(
                f"{what}: the layout is version {v}, not this rank's {self.version}: rank "
                f"{self.rank}'s partitions of version {self.version} are gone and this save "
                "is lost; start again from the new rank.json and the step every rank saved",
                errno.ESTALE)

    def save_tensor(self, state, name, tensor, wait=None):
        """Overwrites a partition (visible when closed): a torch tensor or a NumPy array of
        the partition's dtype and shape, written by one open, one write and a checked
        close; MlfsError with status.json's reason if the mount refuses it. Refused
        with EBUSY (a reconfiguration is preparing), it waits up to @wait seconds
        (default self.busy_wait) for the reconfiguration to end, and writes again if it
        was aborted (_busy_retry)."""
        if _is_torch(tensor):
            from .torch import from_torch
            arr = from_torch(tensor)
        else:
            arr = np.ascontiguousarray(tensor)

        def write():
            with open(self.path(state, name), "wb") as f:
                np.save(f, arr, allow_pickle=False)
        self._busy_retry(self.where(state, name), write, wait)

    def save(self, model, optimizer=None, step=None, names=None, strict=True, wait=None):
        """A save of a PyTorch @model and @optimizer at @step: every partition, then
        `step` (mlfs.torch.save says what is written). With a state name first,
        save(state, name, tensor) overwrites one partition (save_tensor). A write
        refused with EBUSY waits up to @wait seconds (default self.busy_wait) for the
        reconfiguration to end, and goes on if it was aborted."""
        if isinstance(model, str):
            return self.save_tensor(model, optimizer, step, wait=wait)
        from . import torch as mt
        return mt.save(self, model, optimizer, step, names=names, strict=strict, wait=wait)

    def load_into(self, model, optimizer=None, names=None, strict=True):
        """Loads this rank's partitions into a PyTorch @model (and @optimizer's state);
        mlfs.torch.load_into says how."""
        from . import torch as mt
        return mt.load_into(self, model, optimizer, names=names, strict=strict)

    def saved_step(self):
        """The step this rank saved: the number of steps trained, so the next batch."""
        with open(os.path.join(self.dir, "step"), "rb") as f:
            return int(f.read().decode().strip() or 0)

    def mark_step(self, step, wait=None):
        """Writes `step`, the rank's promise that its state of @step is complete; the close
        is checked (a refused step raises MlfsError). Refused with EBUSY, it waits for
        the reconfiguration as save_tensor does."""
        text = f"{int(step)}\n".encode()

        def write():
            with open(os.path.join(self.dir, "step"), "wb") as f:
                f.write(text)
        self._busy_retry(f"ranks/{self.rank}/step", write, wait)

    def save_state(self, states, step, wait=None):
        """A save: every partition of {state: {name: tensor}}, then `step`."""
        for state, tensors in states.items():
            for name, t in tensors.items():
                self.save_tensor(state, name, t, wait=wait)
        self.mark_step(step, wait=wait)

    def data(self, step):
        """(records, ids) of @step's view: this DP rank's slice of the global batch."""
        base = os.path.join(self.dir, "data", str(step))
        return read_npy(base + ".npy"), read_npy(base + ".ids.npy")

    def window(self, start, end):
        """(records [end-start, local_batch, ...], ids [end-start, local_batch]) of steps
        start..end-1 in two opens (at most 64 steps, all with the same local batch)."""
        base = os.path.join(self.dir, "data", f"{start}-{end}")
        return read_npy(base + ".npy"), read_npy(base + ".ids.npy")
