# SPDX-License-Identifier: MIT
"""dlt_bench.py — real dlt pipelines through the real
hotdata-dlt-destination into the Hotdata mock (tests/hotdata_mock.py),
plain and under `python -m libthrottle.run --rule hotdata`, on three
scenarios (`make dlt-bench`; run with the dlt venv's python, from the top
of the tree, B naming the build directory):

  workers8       one pipeline, LOAD__WORKERS=8, JOBS load jobs into one
                 table;
  live_backfill  a backfill pipeline (8 workers, BACKFILL jobs; class
                 backfill under libthrottle) and, in another process, a
                 live one loading one job every LIVE_EVERY s into the same
                 table: the live jobs' latency (the makespan and ratio are
                 the backfill's);
  two_hosts      two pipelines (8 workers, JOBS/2 jobs each) on two
                 simulated hosts: a segment each, joined by one Redis
                 (THROTTLE_BACKEND) that this script starts.

The mock serialises the table's writes (SERVICE ms each; 409
RESOURCE_LOCKED with Retry-After: RA for the others).  Every ratio is to
the ideal of the same run: the table's serialised write time (its loads
x SERVICE) plus the fixed cost of one pipeline's load step, measured
first in the same run (one job, nothing contended); the makespan runs
from the first load step's start to the last one's end.  "early" counts
requests that reached the table before a Retry-After the server had given
anyone for it, less the ones within the mock's race window of that answer
(sent before the refused client could have told anyone; the mock reports
both).  A live job's latency is its run's load step, bookkeeping
included.

Prints a table, then one JSON line per scenario and mode:
{"scenario", "mode", "refused", "early", "failed_jobs", "ratio",
 "live_p50_s" (live_backfill only), "dlt", "destination"}.
"""

import argparse
import importlib.metadata
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPELINE = os.path.join(TOP, "tests", "python", "dlt_pipeline.py")
MOCK = os.path.join(TOP, "tests", "hotdata_mock.py")
B = os.path.abspath(os.environ.get("B", os.path.join(TOP, "build")))
TABLE = "ws1/orders"


sys.path.insert(0, os.path.dirname(PIPELINE))
from dlt_pipeline import declared  # noqa: E402
from mockproc import MockProcess  # noqa: E402  (bench/ is sys.path[0])


def start_mock(service_ms, ra):
    """The Hotdata mock; database db1 and its tables exist, as after a
    first run (two first runs at once race to declare them)."""
    return MockProcess(MOCK, ["--database", "db1", "--service-ms",
                              str(service_ms), "--retry-after", str(ra)] +
                       [a for t in declared() for a in ("--declare", t)],
                       what="the mock")


def wait_for(cond, what, timeout=30):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise SystemExit("dlt_bench: %s did not start" % what)
        time.sleep(0.05)


class Redis:
    """A throw-away redis-server on a unix socket, stopped by its pid."""

    def __init__(self, tmp):
        self.sock = os.path.join(tmp, "redis.sock")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", self.sock,
             "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
             "--dir", tmp], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        wait_for(self.pong, "redis-server")
        self.url = "unix://" + self.sock

    def pong(self):
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(self.sock)
                s.sendall(b"PING\r\n")
                return s.recv(7) == b"+PONG\r\n"
        except OSError:
            return False

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


class Run:
    """Pipeline processes of one scenario and mode, each in a directory
    of its own; they share the run's segment (one host) unless given
    another (a host of their own)."""

    def __init__(self, tmp, mock, mode):
        self.tmp, self.mock, self.mode = tmp, mock, mode
        self.procs = []
        self.segments = ["/tt-dltbench-%d-%s" % (os.getpid(), mode)]

    def start(self, name, *args, rule="hotdata", segment=None, **env):
        d = os.path.join(self.tmp, "%s-%s" % (self.mode, name))
        os.makedirs(d)
        cmd = [sys.executable, PIPELINE, "--url", self.mock.url,
               "--database", "db1", "--name", name, "--dir", d] + \
            [str(a) for a in args]
        if self.mode == "libthrottle":
            cmd = [sys.executable, "-m", "libthrottle.run", "--rule",
                   rule, "--"] + cmd
        seg = segment or self.segments[0]
        self.segments.append(seg)
        e = dict(os.environ, THROTTLE_SEGMENT=seg,
                 PYTHONPATH=os.path.join(TOP, "python"),
                 LIBTHROTTLE_LIBRARY=os.path.join(B, "libthrottle.so.1"))
        e.update(env)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=e,
                             cwd=d)
        self.procs.append(p)
        return p

    def results(self):
        out = []
        for p in self.procs:
            o, err = p.communicate(timeout=3600)
            lines = o.strip().splitlines()
            if not lines:
                raise SystemExit("dlt_bench: a pipeline printed nothing "
                                 "(exit %s):\n%s" % (p.returncode,
                                                     err[-3000:]))
            out.append(json.loads(lines[-1]))
        for seg in set(self.segments):
            try:
                os.unlink("/dev/shm" + seg)
            except OSError:
                pass
        return out


def counters(mock):
    st = mock.stats()
    t = st["tables"].get(TABLE, {})
    return dict(refused=t.get("refused", 0),
                early=t.get("early", 0) - t.get("early_race", 0),
                early_race=t.get("early_race", 0),
                loads=t.get("loads_ok", 0))


def fixed_cost(tmp, mock):
    """One pipeline's load step with one job, nothing contended."""
    mock.admin("reset")
    r = Run(tmp, mock, "fixed")
    r.start("fixed", "--jobs", 1, "--workers", 1)
    return r.results()[0]["load_s"][0]


def scenario(tmp, mock, name, mode, launch, ideal_of):
    mock.admin("reset")
    run = Run(os.path.join(tmp, name), mock, mode)
    os.makedirs(run.tmp, exist_ok=True)
    launch(run)
    res = run.results()
    c = counters(mock)
    # the live pipeline keeps its own schedule: the makespan is the rest's
    timed = [r for r in res if r["name"] != "live"]
    span = max(r["end"] for r in timed) - min(r["start"] for r in timed)
    failed = sum(r["failed"] for r in res)
    out = dict(scenario=name, mode=mode, refused=c["refused"],
               early=c["early"], failed_jobs=failed,
               ratio=round(span / ideal_of(sum(r["jobs"] for r in timed)),
                           2))
    extra = dict(makespan_s=span, loads=c["loads"], race=c["early_race"],
                 errors=[r["error"] for r in res if r["error"]])
    live = [r for r in res if r["name"] == "live"]
    if live:
        lat = live[0]["load_s"]
        out["live_p50_s"] = round(statistics.median(lat), 2)
        extra["live_max_s"] = max(lat)
    return out, extra


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--backfill", type=int, default=120)
    ap.add_argument("--live-runs", type=int, default=8)
    ap.add_argument("--live-every", type=float, default=3.0)
    ap.add_argument("--service-ms", type=float, default=100.0)
    ap.add_argument("--retry-after", type=float, default=5.0)
    ap.add_argument("--only", action="append", default=[],
                    help="workers8, live_backfill or two_hosts "
                         "(repeatable; default all)")
    a = ap.parse_args()
    svc = a.service_ms / 1000.0
    versions = dict(dlt=importlib.metadata.version("dlt"),
                    destination=importlib.metadata.version(
                        "hotdata-dlt-destination"))
    tmp = tempfile.mkdtemp(prefix="tt-dltbench-")
    mock = start_mock(a.service_ms, a.retry_after)
    redis = None
    rows = []
    try:
        t0 = fixed_cost(tmp, mock)

        def ideal(loads):
            return loads * svc + t0

        def workers8(run):
            run.start("w8", "--jobs", a.jobs, "--workers", 8)

        def live_backfill(run):
            run.start("backfill", "--jobs", a.backfill, "--workers", 8,
                      rule="hotdata class=backfill")
            time.sleep(2 * a.live_every)  # the backfill is loading
            run.start("live", "--jobs", 1, "--workers", 1, "--runs",
                      a.live_runs, "--every", a.live_every)

        def two_hosts(run):
            for h in ("a", "b"):
                run.start("host" + h, "--jobs", a.jobs // 2, "--workers", 8,
                          segment="%s-%s" % (run.segments[0], h),
                          THROTTLE_BACKEND=redis.url)

        todo = [("workers8", workers8), ("live_backfill", live_backfill),
                ("two_hosts", two_hosts)]
        for name, launch in todo:
            if a.only and name not in a.only:
                continue
            if name == "two_hosts":
                if shutil.which("redis-server") is None or not os.path.exists(
                        os.path.join(B, "libthrottle-redis.so.1")):
                    print("two_hosts: skipped (no redis-server or no "
                          "libthrottle-redis.so.1)")
                    continue
                redis = redis or Redis(tmp)
            for mode in ("plain", "libthrottle"):
                out, extra = scenario(tmp, mock, name, mode, launch, ideal)
                out.update(versions)
                rows.append((out, extra))
                sys.stderr.write("dlt_bench: %s %s done (%.0f s)\n"
                                 % (name, mode, extra["makespan_s"]))
    finally:
        mock.stop()
        if redis is not None:
            redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    report(rows, a, t0, versions)
    return 0


def report(rows, a, t0, versions):
    print("dlt %s, hotdata-dlt-destination %s; the table serialises "
          "writes, %g ms each, Retry-After %g s; fixed load-step cost "
          "%.2f s" % (versions["dlt"], versions["destination"],
                      a.service_ms, a.retry_after, t0))
    fmt = "%-14s %-12s %8s %6s %6s %7s %9s %7s %s"
    print(fmt % ("scenario", "mode", "refused", "early", "failed",
                 "loads", "makespan", "ratio", "live p50 / max"))
    for out, x in rows:
        live = ("%.2f / %.2f s" % (out["live_p50_s"], x["live_max_s"])
                if "live_p50_s" in out else "")
        print(fmt % (out["scenario"], out["mode"], out["refused"],
                     out["early"], out["failed_jobs"], x["loads"],
                     "%.1f s" % x["makespan_s"], "%.2f" % out["ratio"],
                     live))
        for e in x["errors"]:
            print("    %s %s: %s" % (out["scenario"], out["mode"], e))
    print("goal: ≤ 1 refused per lock episode, 0 early, 0 failed jobs, "
          "ratio ≤ 1.15; live p50 ≤ one backfill job + one Retry-After "
          "(%.1f s)" % (a.service_ms / 1000.0 + a.retry_after))
    for out, _ in rows:
        print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
