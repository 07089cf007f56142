#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""scenario_server.py — an HTTP server that answers the awkward way on
request, for the tests of the http layer and of `throttlectl http`.

Where mock_server.py plays a well-behaved API (tables, locks, counters),
this one plays the edges a real server or proxy produces: an answer cut
short after its headers, a Retry-After sent twice, a gzip-compressed lock
answer, a BOM before the JSON, a text/plain body, an answer that never
comes.  Each request is logged with the time it arrived, so a test can
check that a retry came no earlier than the server asked.

    python3 tests/scenario_server.py --port 0 --port-file PATH --log PATH

--port 0 picks a free port; it is written to --port-file (atomically,
once the server listens).  --log gets one line per request, written and
flushed when the request line and headers have arrived:

    <CLOCK_MONOTONIC ms> <method> <path and query> <request body bytes>

(time.monotonic() is CLOCK_MONOTONIC on Linux, the clock of the C tests.)

The answer is described by the query string; every request to the same
path and query is counted, and the first n of them (default 1) get the
described answer, later ones 200 "ok\\n":

  n=N          how many requests get the scenario (0: none, -1: all)
  status=S     the status (default 429)
  ra=V         a Retry-After field; repeat for several header lines.
               "date:+S" is an IMF-fixdate S seconds from now,
               "date850:+S" the RFC 850 shape with a four-digit year
               ("Thursday, 19-Apr-2007 16:00:00 GMT").
  code=C       body {"error": {"code": C, "message": "m"}} (application/json)
  text=T       body T as text/plain instead
  ctype=T      the Content-Type to send
  bom=1        a UTF-8 byte order mark before the body
  gzip=1       the body gzip-compressed, with Content-Encoding: gzip
  cut=1        announce 100 more bytes than are sent, then close
  cutat=N      send only the first N bytes of the body (with cut=1)
  never=1      read the request, then never answer (until shutdown)

Nothing here is shared between tests: each test starts its own server.
"""

import argparse
import email.utils
import gzip
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

STOP = threading.Event()


def mono_ms():
    return time.monotonic_ns() // 1000000


def http_date(spec):
    """The value of a Retry-After "date:+S" or "date850:+S"."""
    kind, _, rest = spec.partition(":")
    when = time.time() + float(rest)
    if kind == "date":
        return email.utils.formatdate(when, usegmt=True)
    return time.strftime("%A, %d-%b-%Y %H:%M:%S GMT", time.gmtime(when))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: the log file says enough
        pass

    def answer(self):
        body_in = self.read_body()
        srv = self.server
        with srv.lock:
            srv.log.write("%d %s %s %d\n" % (mono_ms(), self.command,
                                              self.path, len(body_in)))
            srv.log.flush()
            seen = srv.counts.get(self.path, 0)
            srv.counts[self.path] = seen + 1
        q = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        one = lambda k, d=None: q[k][-1] if k in q else d
        n = int(one("n", "1"))
        if n >= 0 and seen >= n:
            self.send(200, b"ok\n", "text/plain", [])
            return
        if one("never") == "1":
            STOP.wait()
            self.close_connection = True
            return
        status = int(one("status", "429"))
        if "text" in q:
            body, ctype = one("text").encode(), "text/plain"
        elif "code" in q:
            body = json.dumps({"error": {"code": one("code"),
                                         "message": "m"}}).encode()
            ctype = "application/json"
        else:
            body, ctype = b"", "text/plain"
        ctype = one("ctype", ctype)
        if one("bom") == "1":
            body = b"\xef\xbb\xbf" + body
        extra = []
        if one("gzip") == "1":
            body = gzip.compress(body)
            extra.append(("Content-Encoding", "gzip"))
        for v in q.get("ra", []):
            extra.append(("Retry-After",
                          http_date(v) if v.startswith("date") else v))
        if "cutat" in q:
            body = body[:int(one("cutat"))]
        self.send(status, body, ctype, extra, cut=one("cut") == "1")

    def read_body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or ""):
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def send(self, status, body, ctype, extra, cut=False):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body) + (100 if cut else 0)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        if cut:
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = answer


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--log", required=True)
    args = ap.parse_args()
    srv = Server((args.host, args.port), Handler)
    srv.lock = threading.Lock()
    srv.counts = {}
    srv.log = open(args.log, "a")

    def stop(*_):
        STOP.set()
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.port_file:
        tmp = "%s.tmp.%d" % (args.port_file, os.getpid())
        with open(tmp, "w") as f:
            f.write("%d\n" % srv.server_address[1])
        os.rename(tmp, args.port_file)
    srv.serve_forever()
    srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
