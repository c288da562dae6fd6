#!/usr/bin/python3
"""A small threaded HTTP/1.1 file server with single-range support and failure injection.

Serves the regular files under --root (GET and HEAD; "Range: bytes=a-b", "a-" and
"-n" answered with 206 and Content-Range; an unsatisfiable range with 416 and
"Content-Range: bytes */size"; a syntactically bad or multi-range header is ignored
and the whole file sent with 200).

POST to any path (a JSON API's stand-in, e.g. etcd's /v3/kv/range) answers 200
with the JSON {"path", "content_type", "authorization", "body"} of the request (its
body as text, at most 1 MiB, else 413); it counts and fails like a file GET, an
injected status with the body {"error": "injected <code>"}.

Failure injection: each file GET fails with probability --fail-rate (or always with
--fail-always), in a mode drawn from --fail-modes:
  500 (or any 3-digit code)  that status with a short body
  drop          close the connection without a response
  truncate      announce the full length, send half the body, close
  ignore-range  200 with the whole file, whatever Range asked
  short         206 whose Content-Range and Content-Length cover half the range
  badrange      206 for the range shifted by one byte (wrong start, wrong bytes)
  stall         sleep --stall-seconds before answering (to trip client timeouts)
  stall-body    send the headers and half the body, sleep --stall-seconds, send the rest
  slow          send the body in 10 parts, --slow-gap seconds apart (slow but alive)

Control endpoints (never fail, never counted):
  GET /__stats                   {"requests": n, "failed": m, ..., "connections": c}
                                 (file requests and POSTs; connections accepted)
  GET /__set?fail_rate=0.5&modes=500,drop&fail_always=0&reset=1&stall_seconds=60&slow_gap=0.2
                                 changes the failure settings; reset=1 zeroes counters

CLI: rangeserver.py --root DIR [--port 0] ...; prints "PORT <n>" as its first line.
Module: start(root, ...) -> (server, port), serving on a daemon thread; stop with
server.shutdown(); server.server_close().
"""
import argparse
import json
import os
import random
import re
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODES = ("drop", "truncate", "ignore-range", "short", "badrange", "stall", "stall-body", "slow")


def _check_modes(modes):
    modes = tuple(m.strip() for m in modes if m.strip())
    for m in modes:
        if m not in MODES and not re.fullmatch(r"[1-5]\d\d", m):
            raise ValueError(f"unknown failure mode {m!r}")
    return modes or ("500",)


class RangeServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, root, fail_rate=0.0, modes=("500",), seed=1, fail_always=False,
                 stall_seconds=5.0, verbose=False, slow_gap=0.2):
        super().__init__(addr, Handler)
        self.root = os.path.realpath(root)
        self.fail_rate = float(fail_rate)
        self.modes = _check_modes(modes)
        self.fail_always = bool(fail_always)
        self.stall_seconds = stall_seconds
        self.slow_gap = slow_gap
        self.verbose = verbose
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.requests = 0
        self.failed = 0
        self.connections = 0

    def handle_error(self, request, client_address):
        # A client that hangs up mid-reply (it refused a wrong answer) is normal here.
        if self.verbose or not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)

    def draw_failure(self):
        """Counts a file request; returns the failure mode to apply, or None."""
        with self.lock:
            self.requests += 1
            if self.fail_always or (self.fail_rate > 0 and self.rng.random() < self.fail_rate):
                self.failed += 1
                return self.rng.choice(self.modes)
            return None


def parse_range(header, size):
    """(start, end) inclusive for a single satisfiable range, "unsat", or None (ignore)."""
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header or "")
    if not m or (m.group(1) == "" and m.group(2) == ""):
        return None
    a, b = m.group(1), m.group(2)
    if a == "":
        n = int(b)
        if n == 0:
            return "unsat"
        return (max(0, size - n), size - 1) if size else "unsat"
    a = int(a)
    if b != "" and int(b) < a:
        return None
    if a >= size:
        return "unsat"
    b = int(b) if b != "" else size - 1
    return (a, min(b, size - 1))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Headers and body go out in separate writes: without this, Nagle's
        # algorithm and the client's delayed ACK add 40 ms to every reply.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.lock:
            self.server.connections += 1

    def log_message(self, fmt, *args):
        if self.server.verbose:
            sys.stderr.write("rangeserver: " + (fmt % args) + "\n")

    def do_HEAD(self):
        self.serve(head=True)

    def do_GET(self):
        self.serve(head=False)

    def reply(self, code, body=b"", headers=(), head=False):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def control(self, path, query):
        srv = self.server
        q = urllib.parse.parse_qs(query)
        if path == "/__set":
            try:
                with srv.lock:
                    if "fail_rate" in q:
                        srv.fail_rate = float(q["fail_rate"][0])
                    if "modes" in q:
                        srv.modes = _check_modes(q["modes"][0].split(","))
                    if "fail_always" in q:
                        srv.fail_always = q["fail_always"][0] not in ("0", "false", "")
                    if "stall_seconds" in q:
                        srv.stall_seconds = float(q["stall_seconds"][0])
                    if "slow_gap" in q:
                        srv.slow_gap = float(q["slow_gap"][0])
                    if "seed" in q:
                        srv.rng.seed(int(q["seed"][0]))
                    if q.get("reset", ["0"])[0] not in ("0", ""):
                        srv.requests = srv.failed = srv.connections = 0
            except ValueError as e:
                self.reply(400, str(e).encode())
                return
        with srv.lock:
            body = json.dumps({"requests": srv.requests, "failed": srv.failed,
                               "fail_rate": srv.fail_rate, "modes": list(srv.modes),
                               "fail_always": srv.fail_always,
                               "stall_seconds": srv.stall_seconds,
                               "slow_gap": srv.slow_gap,
                               "connections": srv.connections}).encode()
        self.reply(200, body, [("Content-Type", "application/json")])

    def inject(self, mode, json_error=False):
        """Carries out the part of failure `mode` that comes before a reply: a stall
        sleeps, a drop closes, a status code is answered (a JSON error body with
        `json_error`). Returns (done, the mode left for the reply to apply)."""
        if mode == "stall":
            time.sleep(self.server.stall_seconds)
            return False, None
        if mode == "drop":
            self.close_connection = True
            return True, mode
        if mode is not None and re.fullmatch(r"\d\d\d", mode):
            if json_error:
                self.reply(int(mode), json.dumps({"error": f"injected {mode}"}).encode(),
                           [("Content-Type", "application/json")])
            else:
                self.reply(int(mode), f"injected {mode}\n".encode())
            return True, mode
        return False, mode

    def do_POST(self):
        try:
            n = int(self.headers.get("Content-Length", ""))
        except ValueError:
            n = -1
        if n < 0 or n > (1 << 20):
            self.close_connection = True
            self.reply(413 if n > 0 else 411, b"")
            return
        body = self.rfile.read(n)
        done, mode = self.inject(self.server.draw_failure(), json_error=True)
        if done:
            return
        echo = json.dumps({"path": urllib.parse.urlsplit(self.path).path,
                           "content_type": self.headers.get("Content-Type"),
                           "authorization": self.headers.get("Authorization"),
                           "body": body.decode("utf-8", "replace")}).encode()
        self.send_full(200, echo, None, False, mode, "application/json")

    def serve(self, head):
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path)
        if path in ("/__stats", "/__set"):
            self.control(path, url.query)
            return
        full = os.path.realpath(os.path.join(self.server.root, path.lstrip("/")))
        if (not full.startswith(self.server.root + os.sep)) or not os.path.isfile(full):
            with self.server.lock:
                self.server.requests += 1
            self.reply(404, b"not found\n", head=head)
            return
        with open(full, "rb") as f:
            data = f.read()
        size = len(data)
        rng = parse_range(self.headers.get("Range"), size)
        done, mode = self.inject(None if head else self.server.draw_failure())
        if done:
            return
        if mode == "ignore-range" or rng is None:
            self.send_full(200, data, None, head, mode)
            return
        if rng == "unsat":
            self.reply(416, b"", [("Content-Range", f"bytes */{size}")], head=head)
            return
        a, b = rng
        if mode == "short" and b > a:
            b = a + (b - a + 1) // 2 - 1
        elif mode == "badrange":
            if a + 1 < size:
                a, b = a + 1, min(b + 1, size - 1)
            else:
                a = b = max(0, a - 1)
        self.send_full(206, data[a:b + 1], f"bytes {a}-{b}/{size}", head, mode)

    def send_full(self, code, body, content_range, head, mode=None,
                  content_type="application/octet-stream"):
        self.send_response(code)
        self.send_header("Accept-Ranges", "bytes")
        if content_range:
            self.send_header("Content-Range", content_range)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", content_type)
        self.end_headers()
        if head:
            return
        if mode == "truncate":
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if mode == "stall-body":
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            time.sleep(self.server.stall_seconds)
            self.wfile.write(body[len(body) // 2:])
            return
        if mode == "slow":
            for i in range(10):
                if i:
                    time.sleep(self.server.slow_gap)
                self.wfile.write(body[len(body) * i // 10:len(body) * (i + 1) // 10])
                self.wfile.flush()
            return
        self.wfile.write(body)


def start(root, fail_rate=0.0, modes=("500",), seed=1, fail_always=False, stall_seconds=5.0,
          host="127.0.0.1", port=0, slow_gap=0.2):
    """Starts a server for `root` on a daemon thread; returns (server, port)."""
    srv = RangeServer((host, port), root, fail_rate, modes, seed, fail_always, stall_seconds,
                      slow_gap=slow_gap)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--fail-rate", type=float, default=0.0)
    ap.add_argument("--fail-modes", default="500")
    ap.add_argument("--fail-always", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stall-seconds", type=float, default=5.0)
    ap.add_argument("--slow-gap", type=float, default=0.2)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    srv = RangeServer((args.host, args.port), args.root, args.fail_rate,
                      args.fail_modes.split(","), args.seed, args.fail_always,
                      args.stall_seconds, args.verbose, args.slow_gap)
    print(f"PORT {srv.server_address[1]}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
