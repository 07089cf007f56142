#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""naive_loader.py — a loader that backs off on its own, as loaders do today.

    python3 tools/naive_loader.py --strategy fixed|linear [--tries 6]
        [--scale 1.0] URL TABLE FILE...

POSTs each FILE to URL/v1/tables/TABLE/load, one after the other, and on
a 409 decides alone when to try again, telling nobody:

  fixed    sleeps a fixed 5 s x scale on any 409 and gives up after
           --tries attempts (the shell loader's habit);
  linear   sleeps 1.5 s x attempt x scale, ignores Retry-After, and treats
           every 409 (CONFLICT included) as transient, giving up after
           --tries attempts (the Python client's habit).

Neither reads Retry-After.  Eight of them on one table are refused, sleep
on their own clocks, wake together into the same lock and are refused
again: the behaviour libthrottle exists to replace.  It is used by
`make demo` (tools/demo.sh) for the "before" column.

Prints one line per file, like examples/loader.c; exit status 0 when
every file loaded, 75 when any gave up, 1 on any other failure.
Python 3 standard library only.
"""

import argparse
import sys
import time
import urllib.error
import urllib.request


def post(url, data, timeout):
    req = urllib.request.Request(
        url, data=data, method="POST",
        headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code


def load(args, url, path):
    with open(path, "rb") as f:
        data = f.read()
    start = time.monotonic()
    for attempt in range(1, args.tries + 1):
        try:
            status = post(url, data, args.timeout)
        except (urllib.error.URLError, OSError) as e:
            print("%s: failed (%s)" % (path, e), flush=True)
            return 1
        if 200 <= status < 300:
            print("%s: ok (HTTP %d, %d attempt%s, %.2f s)"
                  % (path, status, attempt, "" if attempt == 1 else "s",
                     time.monotonic() - start), flush=True)
            return 0
        if status != 409:
            print("%s: failed (HTTP %d)" % (path, status), flush=True)
            return 1
        if attempt == args.tries:
            break
        if args.strategy == "fixed":
            time.sleep(5.0 * args.scale)
        else:
            time.sleep(1.5 * attempt * args.scale)
    print("%s: gave up (HTTP 409 after %d attempts, %.2f s)"
          % (path, args.tries, time.monotonic() - start), flush=True)
    return 75


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strategy", choices=("fixed", "linear"),
                    default="fixed")
    ap.add_argument("--tries", type=int, default=6)
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply every sleep by this (the demo uses a "
                         "shorter clock than production)")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds per request")
    ap.add_argument("url")
    ap.add_argument("table")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    url = "%s/v1/tables/%s/load" % (args.url.rstrip("/"), args.table)
    worst = 0
    for path in args.files:
        rc = load(args, url, path)
        if rc == 1 or (rc == 75 and worst == 0):
            worst = rc
    return worst


if __name__ == "__main__":
    sys.exit(main())
