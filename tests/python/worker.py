# SPDX-License-Identifier: MIT
"""worker.py — one process of a multi-process test, driven by its
arguments; it reports on standard output, one line per event, with
time.monotonic() stamps (CLOCK_MONOTONIC is the same in every process).

  load KEY URL FILE...     "ready", then a line on standard input starts
                           libthrottle.request() for each file; exit 0 when
                           all loaded, 1 on a permanent answer, 75 when
                           one gave up
  wait KEY                 "ready", then Throttle.wait(KEY)
  admit KEY [KLASS]        "ready", then admit; "admitted T"; a line on
                           standard input gives the slot back as "ok";
                           "canceled T" and exit 3 when the wait is
                           canceled (throttle_cancel on the key or a scope)
  hold KEY NAME LOG SECS [KLASS]
                           admit, append "start NAME" to LOG, sleep SECS,
                           append "end NAME", report ok
  requeue KEY              "ready", admit, "admitted T", then requeue the
                           admission as locked with Retry-After 60: it
                           waits in its own place; "requeued T" after
  held KEY                 admit, "admitted T", then sleep inside the with
                           block until interrupted; after the interrupt
                           "released", then wait for standard input
Ctrl-C (SIGINT) anywhere prints "KI T" and exits 130; SIGUSR1 prints
"usr1 T" and the call goes on waiting.
"""

import os
import signal
import sys
import time

import libthrottle


def now():
    return "%.6f" % time.monotonic()


def say(*words):
    print(*words, flush=True)


def append(path, line):
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def load(key, url, files):
    rc = 0
    for f in files:
        with open(f, "rb") as fh:
            data = fh.read()
        try:
            status, _, _ = libthrottle.request(key, url, data=data,
                                               retries=20, timeout=120)
            say("ok", os.path.basename(f), status)
        except libthrottle.PermanentError as e:
            say("permanent", os.path.basename(f), e.status, e.code)
            rc = rc or 1
        except libthrottle.GaveUp as e:
            say("gaveup", os.path.basename(f), e.status, e.retry_after)
            rc = rc or 75
    return rc


def main(argv):
    cmd, key = argv[0], argv[1]
    if cmd == "load":
        # started together: wait until every process of the fleet is up,
        # so that interpreter start-up does not stretch the fleet's start
        say("ready")
        sys.stdin.readline()
        return load(key, argv[2], argv[3:])
    t = libthrottle.Throttle()
    # a handler that does not raise: it must run while the call waits
    signal.signal(signal.SIGUSR1, lambda *_: say("usr1", now()))
    if cmd == "wait":
        say("ready")
        say("open" if t.wait(key) else "timeout", now())
        return 0
    if cmd == "admit":
        say("ready")
        try:
            adm = t.admit(key, argv[2] if len(argv) > 2 else "live")
        except libthrottle.ECANCELED:
            say("canceled", now())
            return 3
        with adm:
            say("admitted", now())
            sys.stdin.readline()
            adm.leave("ok")
        return 0
    if cmd == "hold":
        name, log, secs = argv[2], argv[3], float(argv[4])
        klass = argv[5] if len(argv) > 5 else "live"
        with t.admit(key, klass, timeout=60) as adm:
            append(log, "start " + name)
            time.sleep(secs)
            append(log, "end " + name)
            adm.leave("ok")
        return 0
    if cmd == "requeue":
        say("ready")
        with t.admit(key) as adm:
            say("admitted", now())
            adm.requeue("locked", 60)
            say("requeued", now())
            adm.leave("ok")
        return 0
    if cmd == "held":
        try:
            with t.admit(key):
                say("admitted", now())
                time.sleep(120)
        except KeyboardInterrupt:
            say("released", now())
            sys.stdin.readline()
            return 130
    raise SystemExit("worker: unknown command %r" % cmd)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        say("KI", now())
        sys.exit(130)
