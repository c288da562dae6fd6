"""A TCP proxy for fault tests (issue 17): it sits in front of one daemon's peer port
and delays, holds or cuts that node's replies, switched at run time.

    p = Proxy(target_port)          listens on a free port of 127.0.0.1 (p.port) and
                                    forwards each connection to 127.0.0.1:target_port
    p.passthrough()                 forwards both ways as they come (the start)
    p.delay(0.05)                   every reply chunk (one recv() of at most p.chunk
                                    bytes from the daemon) is sent D seconds late
    p.stall()                       replies are held: nothing more reaches the client
                                    until the mode changes (then held bytes go on) or
                                    the client hangs up
    p.drop(after=N, count=None)     a reply is cut after N of its bytes (status line and
                                    headers included): the proxy closes both sockets
                                    (FIN; reset=True: RST); count=K: only the next K
                                    replies, then it passes through again
    p.flip(at=N, count=None)        the lowest bit of byte N of a reply's body (counted
                                    after its headers' blank line) is flipped, the rest
                                    passes as it is; count=K: only the next K replies
                                    (each reply at most once), then it passes through
    p.swallow()                     requests are not forwarded: the daemon never sees
                                    them (nor anything after them on that connection),
                                    and the client waits until it hangs up: a node cut
                                    off from this port while others reach it
    match=b"/v1/part"               (any mode) only replies to requests whose request
                                    line contains these bytes; others pass through
    p.close()                       closes every socket and joins every thread

Requests (client to daemon) pass through untouched but in swallow mode; the proxy notes each one's
request line (curl reuses connections but never pipelines, so a reply follows the last
request line seen on its connection). Counters, all under p.lock: bytes_up, bytes_down,
connections (accepted), open (now), held (replies held right now), holds (replies
ever held), swallowed (requests never forwarded), delayed (chunks delayed), cuts (replies cut), flips (replies with a bit flipped), requests (request lines, in
order), hangups ((time.monotonic(), request line) of each held reply whose connection
closed, the client giving up); p.held_requests(): the request lines of the replies held
now.
"""
import socket
import threading
import time

METHODS = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ")


class _Conn:
    """One client connection and its upstream connection, pumped by two threads."""

    def __init__(self, client, server):
        self.client = client
        self.server = server
        self.request = b""  # the request line being answered
        self.reply = 0  # bytes of the current reply sent to the client
        self.closed = False
        self.swallowing = False  # swallow mode took one of its requests: none goes on
        self.closed_at = None  # time.monotonic() of the first close, by either side
        self.reset = False  # close the client's socket with RST
        self.reply_cut = False  # the current chunk ends the connection
        self.head = b""  # the current reply's bytes before its body, while incomplete
        self.body = -1  # body bytes of the current reply passed so far; -1: in headers
        self.flipped = False  # the current reply had its bit flipped
        self.threads = []
        self.left = 2  # pump threads still running; the last one closes the sockets


class Proxy:
    def __init__(self, target_port, host="127.0.0.1", avoid=(), chunk=65536):
        self.target = (host, target_port)
        self.chunk = chunk
        self.lock = threading.Condition()
        self.mode, self.seconds, self.after, self.count, self.match = "pass", 0.0, 0, None, None
        self.bytes_up = self.bytes_down = 0
        self.connections = self.open = self.held = self.holds = self.delayed = self.cuts = 0
        self.flips = self.swallowed = 0
        self.requests = []
        self.hangups = []  # (time.monotonic(), request line): held replies closed on
        self._conns = set()
        self._holding = set()  # connections whose reply is held now
        self._closing = threading.Event()
        avoid = set(avoid) | {target_port}
        for _ in range(100):
            s = socket.socket()
            s.bind((host, 0))
            if s.getsockname()[1] not in avoid:
                break
            s.close()
        s.listen(64)
        self._listener = s
        self.port = s.getsockname()[1]
        self.addr = f"{host}:{self.port}"
        self._acceptor = threading.Thread(target=self._accept, name=f"proxy-{self.port}",
                                          daemon=True)
        self._acceptor.start()

    def __repr__(self):
        return (f"<proxy :{self.port} -> :{self.target[1]} {self.mode} connections "
                f"{self.connections} open {self.open} held {self.held} up {self.bytes_up} "
                f"down {self.bytes_down} delayed {self.delayed} cuts {self.cuts}>")

    # ---------------------------------------------------------------- modes

    def _set(self, mode, seconds=0.0, after=0, count=None, match=None, reset=False):
        with self.lock:
            self.mode, self.seconds, self.after, self.count = mode, seconds, after, count
            self.match, self.reset = match, reset
            self.lock.notify_all()

    def passthrough(self):
        self._set("pass")

    def delay(self, seconds, match=None):
        self._set("delay", seconds=seconds, match=match)

    def stall(self, match=None):
        self._set("stall", match=match)

    def swallow(self, match=None):
        self._set("swallow", match=match)

    def drop(self, after, count=None, match=None, reset=False):
        self._set("drop", after=after, count=count, match=match, reset=reset)

    def flip(self, at, count=None, match=None):
        self._set("flip", after=at, count=count, match=match)

    def stats(self):
        with self.lock:
            return {k: getattr(self, k) for k in ("mode", "connections", "open", "held",
                                                  "holds", "bytes_up", "bytes_down",
                                                  "delayed", "cuts", "flips", "swallowed")}

    def held_requests(self):
        """The request lines of the replies held now."""
        with self.lock:
            return sorted(c.request.decode("latin-1") for c in self._holding)

    def _applies(self, conn):
        """Whether the mode acts on @conn's current reply (under the lock)."""
        return self.mode != "pass" and (self.match is None or self.match in conn.request)

    # -------------------------------------------------------------- threads

    def _accept(self):
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()  # the daemon is not there: the client sees a close
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(client, server)
            conn.threads = [
                threading.Thread(target=self._pump_up, args=(conn,), daemon=True,
                                 name=f"proxy-{self.port}-up"),
                threading.Thread(target=self._pump_down, args=(conn,), daemon=True,
                                 name=f"proxy-{self.port}-down")]
            with self.lock:
                if self._closing.is_set():
                    client.close()
                    server.close()
                    return
                self._conns.add(conn)
                self.connections += 1
                self.open += 1
            for t in conn.threads:  # close() joins them after this thread ends
                t.start()

    def _shut(self, conn):
        """Wakes both pumps of @conn (their recv returns); they close the sockets."""
        with self.lock:
            if not conn.closed:
                conn.closed, conn.closed_at = True, time.monotonic()
            self.lock.notify_all()
        for s, how in ((conn.server, socket.SHUT_RDWR),
                       (conn.client, socket.SHUT_RD if conn.reset else socket.SHUT_RDWR)):
            try:
                s.shutdown(how)
            except OSError:
                pass

    def _done(self, conn):
        with self.lock:
            conn.left -= 1
            last = conn.left == 0
            if last:
                self._conns.discard(conn)
                self.open -= 1
        if last:
            if conn.reset:
                conn.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       b"\x01\x00\x00\x00\x00\x00\x00\x00")
            conn.client.close()
            conn.server.close()

    def _pump_up(self, conn):
        """Client to daemon: requests, untouched; notes each request line."""
        try:
            while True:
                data = conn.client.recv(self.chunk)
                if not data:
                    break
                if data.startswith(METHODS) and not conn.swallowing:
                    with self.lock:
                        conn.request = data.split(b"\r\n", 1)[0]
                        conn.reply = 0
                        conn.head, conn.body, conn.flipped = b"", -1, False
                        self.requests.append(conn.request.decode("latin-1"))
                        if self._applies(conn) and self.mode == "swallow":
                            conn.swallowing = True
                            self.swallowed += 1
                if conn.swallowing:
                    continue  # this connection's requests never reach the daemon
                conn.server.sendall(data)
                with self.lock:
                    self.bytes_up += len(data)
        except OSError:
            pass
        finally:
            self._shut(conn)
            self._done(conn)

    def _pump_down(self, conn):
        """Daemon to client: replies, delayed, held or cut as the mode says."""
        try:
            while True:
                data = conn.server.recv(self.chunk)
                if not data:
                    break
                data = self._gate(conn, data)
                if data is None:
                    break
                conn.client.sendall(data)
                with self.lock:
                    self.bytes_down += len(data)
                    conn.reply += len(data)
                    if conn.reply_cut:
                        break
        except OSError:
            pass
        finally:
            self._shut(conn)
            self._done(conn)

    def _gate(self, conn, data):
        """What of @data to send now (after a delay or a hold), or None: stop."""
        conn.reply_cut = False
        with self.lock:
            if self._applies(conn) and self.mode == "stall":
                self.held += 1
                self.holds += 1
                self._holding.add(conn)
                try:
                    while (self._applies(conn) and self.mode == "stall" and not conn.closed
                           and not self._closing.is_set()):
                        self.lock.wait(0.2)
                finally:
                    self.held -= 1
                    self._holding.discard(conn)
                    if conn.closed and not self._closing.is_set():
                        self.hangups.append((conn.closed_at,
                                             conn.request.decode("latin-1")))
            if conn.closed or self._closing.is_set():
                return None
            if not self._applies(conn):
                return data
            if self.mode == "flip":
                return self._flip(conn, data)
            if self.mode == "delay":
                seconds = self.seconds
                self.delayed += 1
            elif self.mode == "drop":
                allow = self.after - conn.reply
                if allow >= len(data):
                    return data
                self.cuts += 1
                if self.count is not None:
                    self.count -= 1
                    if self.count <= 0:
                        self.mode = "pass"
                conn.reset = self.reset
                conn.reply_cut = True
                return data[:max(allow, 0)]
            else:
                return data
        if self._closing.wait(seconds):
            return None
        return data

    def _flip(self, conn, data):
        """@data with the bit of flip mode flipped when it holds that body byte (under
        the lock)."""
        start = 0
        if conn.body < 0:  # still in the headers: find their end
            conn.head += data
            end = conn.head.find(b"\r\n\r\n")
            if end < 0:
                return data
            start = len(data) - (len(conn.head) - (end + 4))
            conn.body, conn.head = 0, b""
        at = self.after - conn.body  # the byte's offset in this chunk's body part
        n = len(data) - start
        conn.body += n
        if conn.flipped or not 0 <= at < n:
            return data
        conn.flipped = True
        self.flips += 1
        if self.count is not None:
            self.count -= 1
            if self.count <= 0:
                self.mode = "pass"
        b = bytearray(data)
        b[start + at] ^= 1
        return bytes(b)

    # ------------------------------------------------------------- teardown

    def close(self, timeout=10):
        """Closes the listener and every connection; joins every thread. Fails when a
        thread is still alive after @timeout seconds."""
        self._closing.set()
        with self.lock:
            self.lock.notify_all()
            conns = list(self._conns)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for c in conns:
            self._shut(c)
        deadline = time.monotonic() + timeout
        alive = []
        for t in [self._acceptor] + [t for c in conns for t in c.threads]:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                alive.append(t.name)
        with self.lock:
            left = len(self._conns)
        assert not alive and not left, f"{self}: threads {alive} alive, {left} connections"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
