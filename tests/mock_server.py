#!/usr/bin/env python3
"""mock_server.py — a stand-in for the Hotdata HTTP API, for tests and demos.

It serialises writes per table the way the real API does and counts how
clients behave, in particular whether any request arrived before the time
the server had told someone to come back ("early", contract I1).

    python3 tests/mock_server.py --port 0 --port-file PATH
        [--host 127.0.0.1] [--service-ms 20] [--retry-after 1]
        [--date-retry-after] [--early-tolerance-ms 5] [--verbose]

--port 0 picks a free port; the port is written to PATH (atomically, once
the server listens) so callers can wait for the file and read it.

API
  POST /v1/tables/{t}/load   holds t's write lock for --service-ms, then
                             200 {"loaded": <request bytes>, "table": t}.
                             While t is locked: 409 RESOURCE_LOCKED with
                             Retry-After.
  POST /v1/tables            {"name": t}: 201, or 409 CONFLICT if t exists.
  GET  /stats                counters (below) as JSON.
  POST /admin/fail           {"status": 429|503|500|502|504|408, "count": N,
                              "retry_after": S | null}: the next N load
                             requests fail with that status (429 OVERLOADED,
                             503 SERVICE_UNAVAILABLE, ...).  retry_after
                             defaults to --retry-after; null sends none.
  POST /admin/hold           {"table": t, "ms": N}: lock t for N ms from now
                             (answers at once).
  POST /admin/reset          zero the counters, forget tables, holds, failures.
  POST /admin/shutdown       answer, then stop.  SIGTERM / SIGINT stop too.

Retry-After is whole seconds (at least 1), or with --date-retry-after an
IMF-fixdate rounded up to the next whole second.

Counters in /stats
  requests        requests to /v1/...
  loads_ok        loads that ran (200)
  refused         409 RESOURCE_LOCKED answers
  early           requests for a table that arrived before the latest
                  not-before the server had advertised for it (to anyone),
                  less --early-tolerance-ms
  conflicts       409 CONFLICT answers
  rate_limited    429 answers
  unavailable     503 answers
  failed          other injected failures (500, 502, 504, 408)
  max_concurrent  most /v1 requests in progress at once
  tables          per table: loads_ok, refused, early, max_concurrent,
                  in_service (a load holds the lock now)
"""

import argparse
import email.utils
import json
import math
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ERROR_NAMES = {
    408: ("REQUEST_TIMEOUT", "request timed out"),
    429: ("OVERLOADED", "the service is overloaded, slow down"),
    500: ("INTERNAL", "internal error"),
    502: ("BAD_GATEWAY", "bad gateway"),
    503: ("SERVICE_UNAVAILABLE", "the service is unavailable"),
    504: ("GATEWAY_TIMEOUT", "gateway timed out"),
}


class Table:
    def __init__(self):
        self.exists = False
        self.active = False  # a load is in service
        self.held_until = 0.0  # monotonic; /admin/hold
        self.not_before = 0.0  # monotonic; latest advertised come-back time
        self.in_flight = 0
        self.loads_ok = 0
        self.refused = 0
        self.early = 0
        self.max_concurrent = 0


class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.tables = {}
        self.fail_status = 0
        self.fail_count = 0
        self.fail_retry_after = self.args.retry_after
        self.in_flight = 0
        self.c = dict(requests=0, loads_ok=0, refused=0, early=0, conflicts=0,
                      rate_limited=0, unavailable=0, failed=0,
                      max_concurrent=0)

    def table(self, name):
        t = self.tables.get(name)
        if t is None:
            t = self.tables[name] = Table()
        return t

    def stats(self):
        out = dict(self.c)
        out["tables"] = {
            n: dict(loads_ok=t.loads_ok, refused=t.refused, early=t.early,
                    max_concurrent=t.max_concurrent, in_service=t.active)
            for n, t in sorted(self.tables.items())}
        return out


def retry_after_value(args, seconds):
    """The header value for `seconds`, and the monotonic not-before it
    promises (never earlier than what a client can compute from it)."""
    seconds = max(1, int(math.ceil(seconds)))
    now_wall, now_mono = time.time(), time.monotonic()
    if args.date_retry_after:
        target = math.ceil(now_wall + seconds)
        return (email.utils.formatdate(target, usegmt=True),
                now_mono + (target - now_wall))
    return str(seconds), now_mono + seconds


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mock-hotdata/1"

    # ---- plumbing ---------------------------------------------------------

    def log_message(self, fmt, *a):
        if self.server.args.verbose:
            sys.stderr.write("mock: %s %s\n" % (self.address_string(),
                                                fmt % a))

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            data = b""
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n",
                                                             b""):
                        pass  # trailers
                    return data
                data += self.rfile.read(size)
                self.rfile.readline(3)  # CRLF after the chunk
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def answer(self, status, obj, headers=()):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, code, message, headers=()):
        self.answer(status, {"error": {"code": code, "message": message}},
                    headers)

    def json_body(self, raw):
        try:
            obj = json.loads(raw or b"{}")
            return obj if isinstance(obj, dict) else None
        except ValueError:
            return None

    # ---- routes -----------------------------------------------------------

    def do_GET(self):
        self.read_body()
        st = self.server.state
        if self.path == "/stats":
            with st.lock:
                s = st.stats()
            return self.answer(200, s)
        self.error(404, "NOT_FOUND", "no route for GET %s" % self.path)

    def do_POST(self):
        raw = self.read_body()
        p = self.path.split("?")[0].rstrip("/")
        parts = p.split("/")
        if p == "/v1/tables":
            return self.v1(None, lambda: self.create(raw))
        if len(parts) == 5 and parts[:3] == ["", "v1", "tables"] and \
                parts[4] == "load" and parts[3]:
            return self.v1(parts[3], lambda: self.load(parts[3], raw))
        if p.startswith("/admin/"):
            return self.admin(p[len("/admin/"):], raw)
        self.error(404, "NOT_FOUND", "no route for POST %s" % self.path)

    def v1(self, table, fn):
        st = self.server.state
        with st.lock:
            st.c["requests"] += 1
            st.in_flight += 1
            st.c["max_concurrent"] = max(st.c["max_concurrent"], st.in_flight)
            t = None
            if table is not None:
                t = st.table(table)
                t.in_flight += 1
                t.max_concurrent = max(t.max_concurrent, t.in_flight)
                tol = st.args.early_tolerance_ms / 1000.0
                if time.monotonic() < t.not_before - tol:
                    st.c["early"] += 1
                    t.early += 1
        try:
            fn()
        finally:
            with st.lock:
                st.in_flight -= 1
                if t is not None:
                    t.in_flight -= 1

    def create(self, raw):
        st = self.server.state
        obj = self.json_body(raw)
        name = obj.get("name") if obj else None
        if not isinstance(name, str) or not name:
            return self.error(400, "BAD_REQUEST", 'expected {"name": "..."}')
        with st.lock:
            t = st.table(name)
            existed, t.exists = t.exists, True
            if existed:
                st.c["conflicts"] += 1
        if existed:
            return self.error(409, "CONFLICT",
                              "table '%s' already exists" % name)
        self.answer(201, {"name": name})

    def load(self, name, raw):
        st, args = self.server.state, self.server.args
        with st.lock:
            t = st.table(name)
            now = time.monotonic()
            if st.fail_count > 0:
                st.fail_count -= 1
                status, ra = st.fail_status, st.fail_retry_after
                key = {429: "rate_limited", 503: "unavailable"}.get(status,
                                                                    "failed")
                st.c[key] += 1
                headers = []
                if ra is not None:
                    value, nb = retry_after_value(args, ra)
                    t.not_before = max(t.not_before, nb)
                    headers.append(("Retry-After", value))
                fail = (status, headers)
            elif t.active or t.held_until > now:
                fail = None
                st.c["refused"] += 1
                t.refused += 1
                value, nb = retry_after_value(args, args.retry_after)
                t.not_before = max(t.not_before, nb)
                locked_headers = [("Retry-After", value)]
            else:
                fail = False
                t.active = True
        if fail is None:
            return self.error(
                409, "RESOURCE_LOCKED",
                "table '%s' is locked by another operation" % name,
                locked_headers)
        if fail:
            status, headers = fail
            code, msg = ERROR_NAMES[status]
            return self.error(status, code, msg, headers)
        try:
            time.sleep(args.service_ms / 1000.0)
        finally:
            with st.lock:
                t.active = False
                t.loads_ok += 1
                st.c["loads_ok"] += 1
        self.answer(200, {"loaded": len(raw), "table": name})

    def admin(self, what, raw):
        st = self.server.state
        obj = self.json_body(raw)
        if obj is None:
            return self.error(400, "BAD_REQUEST", "expected a JSON object")
        if what == "fail":
            status, count = obj.get("status"), obj.get("count", 1)
            ra = obj.get("retry_after", st.args.retry_after)
            if status not in ERROR_NAMES or not isinstance(count, int) or \
                    count < 0 or not (ra is None or isinstance(ra, (int, float))):
                return self.error(400, "BAD_REQUEST",
                                  "status must be one of %s, count >= 0"
                                  % sorted(ERROR_NAMES))
            with st.lock:
                st.fail_status, st.fail_count = status, count
                st.fail_retry_after = ra
            return self.answer(200, {"status": status, "count": count})
        if what == "hold":
            name, ms = obj.get("table"), obj.get("ms")
            if not isinstance(name, str) or not name or \
                    not isinstance(ms, (int, float)) or ms < 0:
                return self.error(400, "BAD_REQUEST",
                                  'expected {"table": "...", "ms": N}')
            with st.lock:
                t = st.table(name)
                t.held_until = max(t.held_until, time.monotonic() + ms / 1000.0)
            return self.answer(200, {"table": name, "ms": ms})
        if what == "reset":
            with st.lock:
                st.reset()
            return self.answer(200, {"reset": True})
        if what == "shutdown":
            self.answer(200, {"shutdown": True})
            self.close_connection = True
            # shutdown() waits for serve_forever() to return: not from here.
            threading.Thread(target=self.server.shutdown, daemon=True).start()
            return None
        self.error(404, "NOT_FOUND", "no admin command %r" % what)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--service-ms", type=float, default=20.0)
    ap.add_argument("--retry-after", type=float, default=1.0,
                    help="seconds advertised in Retry-After (rounded up, "
                         "at least 1)")
    ap.add_argument("--date-retry-after", action="store_true",
                    help="send Retry-After as an HTTP-date")
    ap.add_argument("--early-tolerance-ms", type=float, default=5.0)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()

    srv = Server((args.host, args.port), Handler)
    srv.args = args
    srv.state = State(args)

    def stop(signum, frame):
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    port = srv.server_address[1]
    if args.port_file:
        tmp = "%s.tmp.%d" % (args.port_file, os.getpid())
        with open(tmp, "w") as f:
            f.write("%d\n" % port)
        os.rename(tmp, args.port_file)
    if args.verbose:
        sys.stderr.write("mock: listening on %s:%d\n" % (args.host, port))
    try:
        srv.serve_forever(poll_interval=0.1)
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
