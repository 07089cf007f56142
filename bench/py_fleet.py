#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""py_fleet.py — Python fleets against the mock server, side by side in
one run (`make bench`): 8 processes x 3 loads into one table while an
outside operation holds the table's lock for 3 s, the server answering
409 RESOURCE_LOCKED with Retry-After: 2 (and serving one load at a time,
100 ms each); and one process of 64 asyncio tasks, one load each, behind
the same hold.  Rows:

  urllib3 Retry          PoolManager(retries=Retry(10, status_forcelist=
                         [409, 429, 503], Retry-After honoured))
  tenacity               @retry on 409/429/503, wait: the answer's
                         Retry-After, else exponential with jitter
  backoff()/wait() pair  t.wait(key), send, t.backoff(key, Retry-After):
                         the shared back-off without admission
  libthrottle.tenacity   libthrottle.tenacity's retry/wait pair (the same)
  libthrottle requests   libthrottle.requests.session(key)
  libthrottle httpx      httpx.Client(transport=ThrottleTransport(key))
  AsyncThrottle x64      httpx.AsyncClient(transport=AsyncThrottleTransport)
                         in one process, 64 tasks

Printed per row: loads ok, refused (409s), early (requests that reached
the table before a not-before the server had advertised, less the mock's
race window: see tests/python/conftest.py's early()), requests sent,
makespan / ideal (ideal: the 3 s hold + every load served back to back),
and for the asyncio row the event loop's largest stall (a 1 ms ticker's
longest gap beyond its 1 ms).  Needs the PyPI venv (tools/venv.sh):
httpx, tenacity, urllib3 2, requests.

    python bench/py_fleet.py [--quick]   (B= names the build directory)
"""

import asyncio
import os
import subprocess
import sys
import time

from mockproc import MockProcess  # noqa: E402  (bench/ is sys.path[0])

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "hotdata:127.0.0.1/orders"
HOLD_S = 3.0
RETRY_AFTER = 2
SERVICE_MS = 100
PROCS, LOADS = 8, 3
TASKS = 64


# ---- the workers (run as: py_fleet.py worker STRATEGY URL N) ------------

def _urllib3(url, n):
    import urllib3
    from urllib3.util.retry import Retry
    http = urllib3.PoolManager(retries=Retry(
        total=10, status_forcelist=[409, 429, 503], allowed_methods=None,
        backoff_factor=0.5, respect_retry_after_header=True,
        raise_on_status=False))
    return [http.request("POST", url, body=b"x" * 100).status
            for _ in range(n)]


def _tenacity(url, n):
    import requests
    import tenacity

    def retry_after(state):
        r = state.outcome.result()
        ra = r.headers.get("Retry-After")
        if ra is not None and ra.isdigit():
            return float(ra)
        return tenacity.wait_exponential_jitter(initial=0.5, max=10)(state)

    @tenacity.retry(retry=tenacity.retry_if_result(
        lambda r: r.status_code in (409, 429, 503)), wait=retry_after,
        stop=tenacity.stop_after_attempt(10))
    def load():
        return requests.post(url, data=b"x" * 100, timeout=30)
    return [load().status_code for _ in range(n)]


def _lt_backoff(url, n):
    import requests
    import libthrottle
    t = libthrottle.Throttle()
    statuses = []
    for _ in range(n):
        for _ in range(10):
            t.wait(KEY)
            r = requests.post(url, data=b"x" * 100, timeout=30)
            if r.status_code not in (409, 429, 503):
                break
            t.backoff(KEY, r.headers.get("Retry-After", "5"))
        statuses.append(r.status_code)
    return statuses


def _lt_tenacity(url, n):
    import requests
    import tenacity
    import libthrottle
    import libthrottle.tenacity as lt
    t = libthrottle.Throttle()

    @tenacity.retry(retry=lt.retry_if_transient(t, KEY),
                    wait=lt.wait_throttle(t, KEY),
                    before=lt.before_attempt(t, KEY),
                    stop=tenacity.stop_after_attempt(10))
    def load():
        r = requests.post(url, data=b"x" * 100, timeout=30)
        r.raise_for_status()
        return r
    return [load().status_code for _ in range(n)]


def _lt_requests(url, n):
    import libthrottle.requests as lr
    s = lr.session(KEY)
    return [s.post(url, data=b"x" * 100, timeout=30).status_code
            for _ in range(n)]


def _lt_httpx(url, n):
    import httpx
    import libthrottle.httpx as lh
    with httpx.Client(transport=lh.ThrottleTransport(KEY), timeout=30) as c:
        return [c.post(url, content=b"x" * 100).status_code
                for _ in range(n)]


def _lt_async_setup(url):
    """Made before the go, as a program makes them at start: the
    AsyncThrottle (opening the segment) and a client that has connected
    once (httpx imports its HTTP machinery on first use)."""
    import httpx
    import libthrottle
    import libthrottle.httpx as lh
    at = libthrottle.AsyncThrottle()
    stats = url.split("/v1/")[0] + "/stats"

    async def warm():
        c = httpx.AsyncClient(transport=lh.AsyncThrottleTransport(
            KEY, throttle=at), timeout=60)
        await c.get(stats)
        return c
    loop = asyncio.new_event_loop()
    return loop, loop.run_until_complete(warm())


def _lt_async(url, n, setup):
    loop, c = setup

    async def main():
        stall = 0.0
        done = False

        async def ticker():
            nonlocal stall
            last = time.monotonic()
            while not done:
                await asyncio.sleep(0.001)
                now = time.monotonic()
                stall = max(stall, now - last - 0.001)
                last = now

        tk = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)  # the ticker runs before the tasks start
        rs = await asyncio.gather(*[c.post(url, content=b"x" * 100)
                                    for _ in range(n)])
        await c.aclose()
        done = True
        await tk
        return [r.status_code for r in rs], stall
    statuses, stall = loop.run_until_complete(main())
    loop.close()
    print("stall %.6f" % stall)
    return statuses


WORKERS = {"urllib3": _urllib3, "tenacity": _tenacity,
           "lt-backoff": _lt_backoff, "lt-tenacity": _lt_tenacity,
           "lt-requests": _lt_requests, "lt-httpx": _lt_httpx,
           "lt-async": _lt_async}
SETUP = {"lt-async": _lt_async_setup}


def worker(strategy, url, n):
    # imported and opened before the go, as a running loader has them
    # (importing requests or httpx takes longer than a load)
    import httpx  # noqa: F401
    import requests  # noqa: F401
    import tenacity  # noqa: F401
    import urllib3  # noqa: F401
    import libthrottle
    import libthrottle.httpx  # noqa: F401
    import libthrottle.requests  # noqa: F401
    import libthrottle.tenacity  # noqa: F401
    libthrottle.default_throttle()
    setup = SETUP[strategy](url) if strategy in SETUP else None
    print("ready", flush=True)
    sys.stdin.readline()  # go
    statuses = WORKERS[strategy](url, int(n), *(
        [setup] if setup is not None else []))
    print("end %.6f ok %d" % (time.monotonic(),
                              sum(1 for s in statuses if s == 200)),
          flush=True)


# ---- the bench ------------------------------------------------------------

def start_mock():
    return MockProcess(os.path.join(TOP, "tests", "mock_server.py"),
                       ["--service-ms", str(SERVICE_MS),
                        "--retry-after", str(RETRY_AFTER)])


def fleet(mock, strategy, procs, loads, seg):
    mock.admin("reset")
    env = dict(os.environ, THROTTLE_SEGMENT=seg)
    env["PYTHONPATH"] = os.path.join(TOP, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    ps = [subprocess.Popen([sys.executable, os.path.abspath(__file__),
                            "worker", strategy,
                            mock.url + "/v1/tables/orders/load", str(loads)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True, env=env) for _ in range(procs)]
    try:
        for p in ps:
            if p.stdout.readline().strip() != "ready":
                sys.exit("py_fleet: a %s worker did not start" % strategy)
        mock.admin("hold", {"table": "orders", "ms": int(HOLD_S * 1000)})
        t0 = time.monotonic()
        for p in ps:
            p.stdin.write("go\n")
            p.stdin.flush()
        end, ok, stall = t0, 0, None
        for p in ps:
            out, _ = p.communicate(timeout=600)
            for line in out.splitlines():
                w = line.split()
                if w[0] == "end":
                    end, ok = max(end, float(w[1])), ok + int(w[3])
                elif w[0] == "stall":
                    stall = float(w[1])
            if p.returncode != 0:
                sys.exit("py_fleet: a %s worker failed" % strategy)
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
                p.wait()
        if os.path.exists("/dev/shm" + seg):
            os.unlink("/dev/shm" + seg)
    st = mock.stats()
    ideal = HOLD_S + procs * loads * SERVICE_MS / 1000.0
    return dict(ok=ok, n=procs * loads, refused=st["refused"],
                early=st["early"] - st["early_race"], race=st["early_race"],
                requests=st["requests"], makespan=end - t0,
                ratio=(end - t0) / ideal, stall=stall)


ROWS = [("urllib3 Retry", "urllib3", PROCS, LOADS),
        ("tenacity", "tenacity", PROCS, LOADS),
        ("backoff()/wait() pair", "lt-backoff", PROCS, LOADS),
        ("libthrottle.tenacity", "lt-tenacity", PROCS, LOADS),
        ("libthrottle requests", "lt-requests", PROCS, LOADS),
        ("libthrottle httpx", "lt-httpx", PROCS, LOADS),
        ("AsyncThrottle x%d" % TASKS, "lt-async", 1, TASKS)]


def main():
    mock = start_mock()
    try:
        print("Python fleets, one table, a %.0f s outside lock, Retry-After: "
              "%d, %d ms per load (%s, %d cores)" % (
                  HOLD_S, RETRY_AFTER, SERVICE_MS,
                  time.strftime("%Y-%m-%d"), os.cpu_count() or 0))
        print("%-22s %9s %8s %6s %9s %9s %11s %10s" % (
            "", "procs", "loads", "ok", "refused", "early", "makespan/ideal",
            "loop stall"))
        for i, (name, strategy, procs, loads) in enumerate(ROWS):
            seg = "/tt-pyfleet-%d-%d" % (os.getpid(), i)
            r = fleet(mock, strategy, procs, loads, seg)
            print("%-22s %9s %8d %6d %9d %9d %8.2f (%4.1f s) %10s" % (
                name, "%d x %d" % (procs, 1 if procs == 1 else loads),
                r["n"], r["ok"], r["refused"], r["early"], r["ratio"],
                r["makespan"],
                "%.1f ms" % (r["stall"] * 1000) if r["stall"] is not None
                else "-"), flush=True)
    finally:
        mock.stop()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(*sys.argv[2:5])
    else:
        main()
