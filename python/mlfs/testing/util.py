"""What every part of mlfs.testing shares: the binaries it runs, its error, free ports
and waiting with a bound."""
import errno
import os
import random
import shutil
import socket
import threading
import time

_TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
# The source tree this package was imported from (<ROOT>/python/mlfs/testing), or None.
ROOT = _TREE if os.path.isfile(os.path.join(_TREE, "python", "pyproject.toml")) else None
ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def find_mlfs():
    """The mlfs binary to run: $MLFS, else <source tree>/$BUILD/mlfs when this package is
    imported from the source tree and that binary is built, else `mlfs` on the PATH."""
    if os.environ.get("MLFS"):
        return os.environ["MLFS"]
    built = os.path.join(ROOT, os.environ.get("BUILD", "build"), "mlfs") if ROOT else None
    if built and os.path.isfile(built):
        return built
    return shutil.which("mlfs") or built or "mlfs"


MLFS = find_mlfs()


class ClusterError(AssertionError):
    """A daemon, etcd or a wait of the harness failed. An AssertionError, so that a test
    runner reports it as a failed check; the message shows what was seen."""


def _ephemeral():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = map(int, f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


_EPHEMERAL = _ephemeral()


def free_port():
    """A TCP port of 127.0.0.1 that nothing listens on (now), below the ephemeral range
    the kernel gives outgoing connections (32768 and up): a port of that range free now
    may be a connection's (etcd's, a daemon's, gloo's) a moment later, before the daemon
    or etcd that was to listen on it starts; one below it is taken only by another
    listener. Random, so that jobs started side by side do not pick the same ports."""
    lo = 10000
    hi = _EPHEMERAL[0] - 1000 if _EPHEMERAL[0] > lo + 2000 else 65535  # room for port + k
    for _ in range(1000):
        port = random.randrange(lo, hi)
        if _EPHEMERAL[0] <= port <= _EPHEMERAL[1]:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # the whole range is taken: any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, fn, timeout=30):
    """Polls fn() until it returns something true, which is returned; ClusterError
    naming @what after @timeout seconds."""
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > end:
            raise ClusterError(f"timed out waiting for {what}")
        time.sleep(0.05)


def holders(path):
    """What keeps the mount at @path busy: "pid (comm): what" for every process whose
    cwd, root, open file or mapping is under it, from /proc (readlink and maps never
    enter the mount, so a hung daemon cannot hang this). "" when none is found: then a
    mount under it, or a request still in the kernel, is the likelier cause. The caller
    is among them when it holds the mount (a NumPy memory map of the test's)."""
    prefix = os.path.realpath(path).rstrip("/") + "/"
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        base = f"/proc/{pid}"
        seen = []
        try:
            links = [("cwd", f"{base}/cwd"), ("root", f"{base}/root")]
            links += [(f"fd {fd}", f"{base}/fd/{fd}") for fd in os.listdir(f"{base}/fd")]
            for what, link in links:
                try:
                    t = os.readlink(link)
                except OSError:
                    continue
                if (t + "/").startswith(prefix):
                    seen.append(f"{what} {t}")
            with open(f"{base}/maps") as f:
                fields = (ln.split(None, 5) for ln in f)
                mapped = {fl[5].strip() for fl in fields if len(fl) == 6}
            seen += sorted(f"map {m}" for m in mapped if (m + "/").startswith(prefix))
            if seen:
                with open(f"{base}/comm") as f:
                    comm = f.read().strip()
                out.append(f"{pid} ({comm}): " + ", ".join(seen[:4]))
        except OSError:
            continue  # gone, or not ours to read
    return "; ".join(out)


def timed(fn, timeout=10):
    """fn() on a daemon thread; raises TimeoutError when it does not return in time (a
    FUSE request to a hung daemon never returns, and must not hang the caller)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: B902 - handed to the caller
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"no answer in {timeout} s")
    if "error" in out:
        raise out["error"]
    return out["value"]


def expect_oserror(codes, fn, *args, **kw):
    """fn(...) fails with one of the errno values @codes; returns the OSError. Raises
    ClusterError when it succeeds or fails with another errno (any other exception goes
    through)."""
    codes = (codes,) if isinstance(codes, int) else tuple(codes)
    want = "/".join(errno.errorcode[c] for c in codes)
    name = getattr(fn, "__name__", fn)
    try:
        fn(*args, **kw)
    except OSError as e:
        if e.errno not in codes:
            raise ClusterError(f"{name}: {e!r}, expected {want}") from e
        return e
    raise ClusterError(f"{name}: no error, expected OSError {want}")
