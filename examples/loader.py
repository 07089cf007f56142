#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""loader.py — load a directory of files into one table of the Hotdata
API with a pool of processes, politely: the Python twin of loader.c.

    python3 examples/loader.py [--processes N] [--key KEY]
        [--class live|backfill] [--retries N] [--timeout SEC]
        URL TABLE DIR

POSTs each file of DIR to URL/v1/tables/TABLE/load, N files at a time
(default 8 processes), each through libthrottle.request(): the processes
share what the server says, so one "409 RESOURCE_LOCKED, Retry-After: 5"
holds all of them back for 5 s, then one probes and the others follow once
it got in; a 409 CONFLICT is never retried.  Loaders started by other
programs on this host (loader.c, `throttlectl http`, other pools) take part
in the same queue when they use the same key.

Prints one line per file ("part-01: ok (HTTP 200, 1 attempt)", "...:
permanent (HTTP 409 CONFLICT)", "...: gave up (HTTP 409 RESOURCE_LOCKED;
retry after 5.0 s)") and a summary.  Exit status: 0 when every file
loaded, 1 when any was refused for good, else 75 (EX_TEMPFAIL) when any
was still refused for now: run it again later for those.

The fork rule, shown here: the Throttle is opened once, in the parent,
before the pool; forked workers use it as it is (the handle and its
mapping are valid across fork()), and under the "spawn" start method the
pickled Throttle opens the same segment again in each worker.  An
Admission never crosses a process boundary: admit and report in the same
process.  THROTTLE_SEGMENT selects another segment.

Needs the libthrottle package: PYTHONPATH=python after `make`, or `make
install`.
"""

import argparse
import multiprocessing
import os
import sys
import urllib.parse

import libthrottle

EX_TEMPFAIL = 75

_throttle = None  # each worker's, set by _init


def _init(throttle):
    global _throttle
    _throttle = throttle


def load_one(job):
    """Load one file; (file, result line, status) where status is "ok",
    "permanent" or "retry"."""
    key, url, path, klass, retries, timeout = job
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return name, "%s: cannot read (%s)" % (name, e.strerror), "permanent"
    try:
        status, _, _ = libthrottle.request(
            key, url, method="POST", data=data,
            headers={"Content-Type": "application/octet-stream"},
            retries=retries, timeout=timeout, klass=klass,
            throttle=_throttle)
        return name, "%s: ok (HTTP %d)" % (name, status), "ok"
    except libthrottle.PermanentError as e:
        what = "HTTP %s %s" % (e.status, e.code) if e.status else str(e)
        return name, "%s: permanent (%s)" % (name, what.strip()), "permanent"
    except libthrottle.GaveUp as e:
        what = "HTTP %s %s" % (e.status, e.code) if e.status else str(e)
        later = "; retry after %.1f s" % e.retry_after if e.retry_after \
            else ""
        return name, "%s: gave up (%s%s)" % (name, what.strip(), later), \
            "retry"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--key", help="default: hotdata:HOST/TABLE")
    ap.add_argument("--class", dest="klass", default="live",
                    choices=("live", "backfill"))
    ap.add_argument("--retries", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds per file, waiting included")
    ap.add_argument("url")
    ap.add_argument("table")
    ap.add_argument("dir")
    a = ap.parse_args(argv)

    host = urllib.parse.urlsplit(a.url).hostname or "localhost"
    key = a.key or "hotdata:%s/%s" % (host, a.table)
    url = "%s/v1/tables/%s/load" % (a.url.rstrip("/"),
                                    urllib.parse.quote(a.table, safe="/"))
    files = sorted(os.path.join(a.dir, f) for f in os.listdir(a.dir)
                   if os.path.isfile(os.path.join(a.dir, f)))

    throttle = libthrottle.Throttle()  # before the pool: see the fork rule
    if not throttle.shared:
        print("loader: warning: %s" % throttle.open_error, file=sys.stderr)
    jobs = [(key, url, f, a.klass, a.retries, a.timeout) for f in files]
    counts = {"ok": 0, "permanent": 0, "retry": 0}
    pool = multiprocessing.Pool(a.processes, _init, (throttle,))
    try:
        for _, line, status in pool.imap_unordered(load_one, jobs):
            print(line, flush=True)
            counts[status] += 1
        pool.close()
    except KeyboardInterrupt:
        pool.terminate()  # the workers' admissions end with them
        print("loader: interrupted", file=sys.stderr)
        return 130
    finally:
        pool.join()
    print("loader: %d of %d files loaded, %d failed, %d to retry later"
          % (counts["ok"], len(files), counts["permanent"], counts["retry"]))
    if counts["permanent"]:
        return 1
    return EX_TEMPFAIL if counts["retry"] else 0


if __name__ == "__main__":
    sys.exit(main())
