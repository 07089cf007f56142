#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""mock_server.py — a stand-in for the Hotdata HTTP API, for tests and demos.

It admits a fixed number of writes at once per table (one by default: the
real API serialises them) and counts how clients behave, in particular
whether any request arrived before the time the server had told someone to
come back ("early", contract I1).

    python3 tests/mock_server.py --port 0 --port-file PATH
        [--host 127.0.0.1] [--service-ms 20] [--retry-after 1]
        [--date-retry-after] [--early-tolerance-ms 5] [--early-race-ms 50]
        [--verbose]
        [--concurrency N] [--table-concurrency [WS/]TABLE=N]...
        [--overload-s S]

--concurrency N: every table admits N loads at once (default 1);
--table-concurrency sets one table's own N (repeatable; WS/ names a table
of another workspace than "default").  --overload-s S: for the first S
seconds after start, every load of every workspace is answered 429
OVERLOADED with Retry-After (--retry-after), as a workspace-wide overload.

--port 0 picks a free port; the port is written to PATH (atomically, once
the server listens) so callers can wait for the file and read it.

API
  POST /v1/tables/{t}/load   takes one of t's write slots for --service-ms,
                             then 200 {"loaded": <request bytes>, "table": t}.
                             While all of t's slots are taken (or t is held):
                             409 RESOURCE_LOCKED with Retry-After.  During
                             the workspace's overload window: 429 OVERLOADED
                             with Retry-After.
  POST /v1/tables            {"name": t}: 201, or 409 CONFLICT if t exists.
  POST /v1/workspaces/{ws}/tables/{t}/load, POST /v1/workspaces/{ws}/tables:
                             the same in workspace ws (the two routes above
                             are workspace "default").
  GET  /stats                counters (below) as JSON.
  POST /admin/fail           {"status": 429|503|500|502|504|408, "count": N,
                              "retry_after": S | null}: the next N load
                             requests fail with that status (429 OVERLOADED,
                             503 SERVICE_UNAVAILABLE, ...).  retry_after
                             defaults to --retry-after; null sends none.
  POST /admin/hold           {"table": t, "ms": N} (optional "workspace"):
                             lock t for N ms from now (answers at once);
                             optional "message": the 409's error.message
                             while it holds (any string, controls too).
  POST /admin/release        {"table": t} (optional "workspace"): end t's
                             hold now.
  POST /admin/concurrency    {"n": N}: tables without their own admit N loads
                             at once; {"table": t, "n": N} (optional
                             "workspace": ws): t admits N.  N >= 1.  Loads in
                             service are not cut short when N shrinks.
  POST /admin/overload       {"seconds": S} (optional "workspace": ws, else
                             every workspace; optional "retry_after": R,
                             default --retry-after): every load of the
                             workspace is 429 OVERLOADED for S s from now.
  POST /admin/reset          zero the counters, forget tables, holds,
                             failures and overload windows; concurrencies
                             go back to the command line's.
  POST /admin/shutdown       answer, then stop.  SIGTERM / SIGINT stop too.

Retry-After is whole seconds (at least 1), or with --date-retry-after an
IMF-fixdate rounded up to the next whole second.

Counters in /stats
  requests        requests to /v1/...
  loads_ok        loads that ran (200)
  refused         409 RESOURCE_LOCKED answers
  early           requests for a table that arrived before the latest
                  not-before the server had advertised for it or for its
                  workspace (to anyone), less --early-tolerance-ms
  early_race      of those, the ones that arrived less than --early-race-ms
                  after the answer that set that time: most likely sent
                  before the client told could have shared the time with
                  the others (a client's race, not a wrong wait)
  conflicts       409 CONFLICT answers
  rate_limited    429 answers (injected and overload windows)
  unavailable     503 answers
  failed          other injected failures (500, 502, 504, 408)
  max_concurrent  most /v1 requests in progress at once
  tables          per table ("t" in workspace default, "ws/t" in
                  another): loads_ok, refused, early and early_race (before
                  the table's own not-before: refusals and injected
                  failures), max_concurrent
                  (/v1 requests in progress), in_service (loads in service
                  now), max_in_service (most loads in service at once),
                  concurrency (loads it admits at once)
  workspaces      per workspace: requests, loads_ok, rate_limited (its
                  overload answers), early and early_race (before the
                  workspace's not-before, set by its overload answers),
                  in_service,
                  max_in_service (most loads in service at once over all
                  its tables)
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


DEFAULT_WS = "default"


class Scope:
    """What a table and a workspace both count: loads in service now and at
    most, loads done, and requests that came before its not-before."""

    def __init__(self):
        self.not_before = 0.0  # monotonic; latest advertised come-back time
        self.advertised_at = 0.0  # when not_before was last moved later
        self.in_service = 0
        self.max_in_service = 0
        self.loads_ok = 0
        self.early = 0
        self.early_race = 0

    def advertise(self, nb, now):
        if nb > self.not_before:
            self.not_before, self.advertised_at = nb, now

    def is_early(self, now, tol, race):
        """Count a request arriving at now if it is early; returns (early,
        within race of the answer that set the time)."""
        if now >= self.not_before - tol:
            return False, False
        self.early += 1
        raced = now - self.advertised_at < race
        self.early_race += raced
        return True, raced

    def start_load(self):
        self.in_service += 1
        self.max_in_service = max(self.max_in_service, self.in_service)

    def end_load(self):
        self.in_service -= 1
        self.loads_ok += 1


class Table(Scope):
    def __init__(self, ws):
        super().__init__()
        self.ws = ws  # its Workspace
        self.exists = False
        self.concurrency = None  # its own N; None: the server's default
        self.held_until = 0.0  # monotonic; /admin/hold
        self.hold_message = None  # /admin/hold's "message"; None: default
        self.in_flight = 0
        self.refused = 0
        self.max_concurrent = 0


class Workspace(Scope):
    """Its not-before is set by its overload answers (429s)."""

    def __init__(self):
        super().__init__()
        self.overload_until = 0.0  # monotonic; 429 OVERLOADED until then
        self.overload_retry_after = None
        self.requests = 0
        self.rate_limited = 0


def split_table(spec):
    """"ws/t" -> ("ws", "t"); "t" -> (DEFAULT_WS, "t")."""
    ws, _, name = spec.rpartition("/")
    return (ws or DEFAULT_WS), name


class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.reset()
        if args.overload_s > 0:
            self.overload(None, args.overload_s, args.retry_after)

    def reset(self):
        self.tables = {}  # (workspace name, table name) -> Table
        self.workspaces = {}
        self.default_concurrency = self.args.concurrency
        for (ws, name), n in self.args.table_concurrency:
            self.table(ws, name).concurrency = n
        self.overload_all_until = 0.0  # every workspace, also new ones
        self.overload_all_retry_after = None
        self.fail_status = 0
        self.fail_count = 0
        self.fail_retry_after = self.args.retry_after
        self.in_flight = 0
        self.c = dict(requests=0, loads_ok=0, refused=0, early=0,
                      early_race=0, conflicts=0,
                      rate_limited=0, unavailable=0, failed=0,
                      max_concurrent=0)

    def workspace(self, name):
        w = self.workspaces.get(name)
        if w is None:
            w = self.workspaces[name] = Workspace()
        return w

    def table(self, ws, name):
        t = self.tables.get((ws, name))
        if t is None:
            t = self.tables[(ws, name)] = Table(self.workspace(ws))
        return t

    def concurrency(self, t):
        return t.concurrency if t.concurrency is not None else \
            self.default_concurrency

    def overload(self, ws, seconds, retry_after):
        until = time.monotonic() + seconds
        if ws is None:
            self.overload_all_until = until
            self.overload_all_retry_after = retry_after
        else:
            w = self.workspace(ws)
            w.overload_until, w.overload_retry_after = until, retry_after

    def overloaded(self, w, now):
        """The Retry-After of w's overload window open at now, else None."""
        if w.overload_until > now:
            return w.overload_retry_after
        if self.overload_all_until > now:
            return self.overload_all_retry_after
        return None

    def stats(self):
        out = dict(self.c)
        out["tables"] = {
            (n if ws == DEFAULT_WS else "%s/%s" % (ws, n)): dict(
                loads_ok=t.loads_ok, refused=t.refused, early=t.early,
                early_race=t.early_race, max_concurrent=t.max_concurrent, in_service=t.in_service,
                max_in_service=t.max_in_service,
                concurrency=self.concurrency(t))
            for (ws, n), t in sorted(self.tables.items())}
        out["workspaces"] = {
            n: dict(requests=w.requests, loads_ok=w.loads_ok,
                    rate_limited=w.rate_limited, early=w.early,
                    early_race=w.early_race, in_service=w.in_service, max_in_service=w.max_in_service)
            for n, w in sorted(self.workspaces.items())}
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
    # The headers and the body are two writes: with Nagle on, the body waits
    # for the client's delayed ACK of the headers (about 40 ms) on every
    # request of a kept-alive connection but the first, which is as slow as
    # the service time itself.
    disable_nagle_algorithm = True

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
        if p.startswith("/admin/"):
            return self.admin(p[len("/admin/"):], raw)
        parts = p.split("/")
        ws = DEFAULT_WS
        if len(parts) >= 5 and parts[:3] == ["", "v1", "workspaces"] and \
                parts[3] and parts[4] == "tables":
            ws, parts = parts[3], ["", "v1"] + parts[4:]
        if parts == ["", "v1", "tables"]:
            return self.v1(ws, None, lambda: self.create(ws, raw))
        if len(parts) == 5 and parts[:3] == ["", "v1", "tables"] and \
                parts[4] == "load" and parts[3]:
            return self.v1(ws, parts[3], lambda t: self.load(t, parts[3], raw))
        self.error(404, "NOT_FOUND", "no route for POST %s" % self.path)

    def v1(self, ws, table, fn):
        st = self.server.state
        with st.lock:
            st.c["requests"] += 1
            st.in_flight += 1
            st.c["max_concurrent"] = max(st.c["max_concurrent"], st.in_flight)
            w = st.workspace(ws)
            w.requests += 1
            t = None
            if table is not None:
                t = st.table(ws, table)
                t.in_flight += 1
                t.max_concurrent = max(t.max_concurrent, t.in_flight)
                now = time.monotonic()
                tol = st.args.early_tolerance_ms / 1000.0
                race = st.args.early_race_ms / 1000.0
                t_early, t_race = t.is_early(now, tol, race)
                w_early, w_race = w.is_early(now, tol, race)
                if t_early or w_early:
                    st.c["early"] += 1
                    # a race only if every time it came early for was new
                    st.c["early_race"] += (t_race or not t_early) and \
                        (w_race or not w_early)
        try:
            if t is None:
                fn()
            else:
                fn(t)
        finally:
            with st.lock:
                st.in_flight -= 1
                if t is not None:
                    t.in_flight -= 1

    def create(self, ws, raw):
        st = self.server.state
        obj = self.json_body(raw)
        name = obj.get("name") if obj else None
        if not isinstance(name, str) or not name or "/" in name:
            return self.error(400, "BAD_REQUEST", 'expected {"name": "..."}')
        with st.lock:
            t = st.table(ws, name)
            existed, t.exists = t.exists, True
            if existed:
                st.c["conflicts"] += 1
        if existed:
            return self.error(409, "CONFLICT",
                              "table '%s' already exists" % name)
        self.answer(201, {"name": name})

    def load(self, t, name, raw):
        st, args = self.server.state, self.server.args
        w = t.ws
        with st.lock:
            now = time.monotonic()
            ra = st.overloaded(w, now)
            if st.fail_count > 0:
                st.fail_count -= 1
                status, ra = st.fail_status, st.fail_retry_after
                key = {429: "rate_limited", 503: "unavailable"}.get(status,
                                                                    "failed")
                st.c[key] += 1
                headers = []
                if ra is not None:
                    value, nb = retry_after_value(args, ra)
                    t.advertise(nb, now)
                    headers.append(("Retry-After", value))
                fail = (status, headers)
            elif ra is not None:
                # A workspace-wide overload: the signal is the workspace's,
                # so its not-before is the workspace's, not the table's.
                st.c["rate_limited"] += 1
                w.rate_limited += 1
                value, nb = retry_after_value(args, ra)
                w.advertise(nb, now)
                fail = (429, [("Retry-After", value)])
            elif t.in_service >= st.concurrency(t) or t.held_until > now:
                fail = None
                st.c["refused"] += 1
                t.refused += 1
                value, nb = retry_after_value(args, args.retry_after)
                t.advertise(nb, now)
                locked_headers = [("Retry-After", value)]
            else:
                fail = False
                t.start_load()
                w.start_load()
        if fail is None:
            return self.error(
                409, "RESOURCE_LOCKED",
                t.hold_message if t.hold_message is not None else
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
                t.end_load()
                w.end_load()
                st.c["loads_ok"] += 1
        self.load_done(t, name, raw)

    def load_done(self, t, name, raw):
        """The answer to a load that ran (a subclass speaking another
        dialect of the API answers in its own shape)."""
        self.answer(200, {"loaded": len(raw), "table": name})

    def admin(self, what, raw):
        st = self.server.state
        obj = self.json_body(raw)
        if obj is None:
            return self.error(400, "BAD_REQUEST", "expected a JSON object")
        ws = obj.get("workspace", DEFAULT_WS)
        if not isinstance(ws, str) or not ws or "/" in ws:
            return self.error(400, "BAD_REQUEST",
                              '"workspace" must be a name without "/"')
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
                    not is_number(ms) or ms < 0:
                return self.error(400, "BAD_REQUEST",
                                  'expected {"table": "...", "ms": N}')
            message = obj.get("message")
            if message is not None and not isinstance(message, str):
                return self.error(400, "BAD_REQUEST",
                                  '"message" must be a string')
            with st.lock:
                t = st.table(ws, name)
                t.held_until = max(t.held_until, time.monotonic() + ms / 1000.0)
                t.hold_message = message
            return self.answer(200, {"table": name, "ms": ms})
        if what == "release":
            name = obj.get("table")
            if not isinstance(name, str) or not name:
                return self.error(400, "BAD_REQUEST",
                                  'expected {"table": "..."}')
            with st.lock:
                st.table(ws, name).held_until = 0.0
            return self.answer(200, {"table": name})
        if what == "concurrency":
            name, n = obj.get("table"), obj.get("n")
            if not (name is None or (isinstance(name, str) and name)) or \
                    not isinstance(n, int) or isinstance(n, bool) or n < 1:
                return self.error(400, "BAD_REQUEST",
                                  'expected {"n": N >= 1} and optionally '
                                  '"table": "..."')
            with st.lock:
                if name is None:
                    st.default_concurrency = n
                else:
                    st.table(ws, name).concurrency = n
            return self.answer(200, {"table": name, "n": n})
        if what == "overload":
            secs = obj.get("seconds")
            ra = obj.get("retry_after", st.args.retry_after)
            if not is_number(secs) or secs < 0 or not is_number(ra) or ra < 0:
                return self.error(400, "BAD_REQUEST",
                                  'expected {"seconds": S >= 0} and '
                                  'optionally "workspace", "retry_after"')
            with st.lock:
                st.overload(obj.get("workspace"), secs, ra)
            return self.answer(200, {"workspace": obj.get("workspace"),
                                     "seconds": secs})
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


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def table_concurrency(spec):
    """argparse type of --table-concurrency: "[WS/]TABLE=N"."""
    table, sep, n = spec.rpartition("=")
    ws, name = split_table(table)
    if not sep or not name or not n.isdigit() or int(n) < 1:
        raise argparse.ArgumentTypeError("expected [WS/]TABLE=N, N >= 1")
    return (ws, name), int(n)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True


def main(handler=None, options=None, doc=None, setup=None):
    """Parse the command line and serve.  handler: the request handler
    class (default Handler); options(ap): adds a dialect's own options;
    setup(server): gives the server a dialect's own state; doc: the
    module docstring --help starts with."""
    handler = handler or Handler
    ap = argparse.ArgumentParser(description=(doc or __doc__).split("\n")[0])
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
    ap.add_argument("--early-race-ms", type=float, default=50.0,
                    help="early requests this soon after the answer that "
                         "set the time are also counted as early_race")
    ap.add_argument("--concurrency", type=int, default=1,
                    help="loads each table admits at once (default 1)")
    ap.add_argument("--table-concurrency", type=table_concurrency,
                    action="append", default=[], metavar="[WS/]TABLE=N",
                    help="one table's own concurrency (repeatable)")
    ap.add_argument("--overload-s", type=float, default=0.0,
                    help="answer every load 429 OVERLOADED for the first S "
                         "seconds")
    ap.add_argument("--verbose", action="store_true")
    if options is not None:
        options(ap)
    args = ap.parse_args()
    if args.concurrency < 1:
        ap.error("--concurrency must be at least 1")

    srv = Server((args.host, args.port), handler)
    srv.args = args
    srv.state = State(args)
    if setup is not None:
        setup(srv)

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
