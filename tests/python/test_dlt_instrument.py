# SPDX-License-Identifier: MIT
"""test_dlt_instrument.py — libthrottle.instrument() and
`python -m libthrottle.run` against the mock server, through urllib3,
requests and httpx (where installed) as a program that does not know
about libthrottle sends them:

  - rules: presets, templates, options, and the errors of bad ones;
  - retry: a locked answer is not returned, the request is sent again
    after the shared back-off (never early) with the same body (bytes, a
    rewound file object), and the client sees the 200;
  - surface: the 409 comes back to the client, its body readable as
    urllib3, requests and httpx read it, the back-off published for the
    others; a 429 holds every table of the workspace;
  - a body that cannot be replayed (a generator) is sent once;
  - not admitted in time is NotAdmitted, a TimeoutError, nothing sent; no
    answer at all is the client's own error, the slot given back;
  - a request no rule matches is not admitted;
  - the launcher instruments a child program, and refuses a bad rule.

Runs wherever urllib3 is installed (Debian's python3-urllib3 1.26 in
tests/test_python.sh, the dlt venv's urllib3 2 in tests/test_dlt.sh)."""

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import threading

import pytest

urllib3 = pytest.importorskip("urllib3")

import libthrottle  # noqa: E402
from conftest import TOP, child_env, early, field, until  # noqa: E402

LOAD = "/v1/tables/{table}/load"
KEY = "hotdata:{host}/{table}"
ORDERS = "hotdata:127.0.0.1/orders"


@contextlib.contextmanager
def locked_once(mock, t):
    """Table orders held until a refusal of it has been reported to the
    gate (by this process or a child on the same segment), then free: a
    lock episode of exactly one refusal, however slow the machine."""
    held = {"table": "orders"}
    mock.admin("hold", dict(held, ms=600000))
    done = threading.Event()

    def release():
        try:
            until(lambda: field(t, ORDERS, "locked") >= 1, timeout=120,
                  what="a refusal")
        finally:
            mock.admin("release", held)
            done.set()
    th = threading.Thread(target=release, daemon=True)
    th.start()
    try:
        yield
    finally:
        done.wait(130)


@pytest.fixture
def instrumented(t):
    """instrument(rules) on the test's Throttle, undone afterwards."""
    def make(*rules):
        return libthrottle.instrument(list(rules), throttle=t)
    yield make
    libthrottle.uninstrument()


def post(mock, table="orders", body=b"row\n", pool=None, **kw):
    pool = pool or urllib3.PoolManager()
    return pool.request("POST", mock.load_url(table), body=body, **kw)


def test_dlt_instrument_rules_parse():
    r = libthrottle.Rule.parse("hotdata class=backfill")
    assert (r.method, r.klass, r.cap, r.pool, r.retry) == (
        "POST", "backfill", 1, 1, True)
    r2 = libthrottle.Rule.parse("hotdata cap=auto pool=0 surface")
    assert (r2.cap, r2.pool, r2.retry) == ("auto", None, False)
    assert r.match("POST", "https", "api.hotdata.dev", 443,
                   "/v1/connections/c1/schemas/public/tables/orders/loads",
                   {"X-Workspace-Id": "ws7"}) == "hotdata:ws7/c1/orders"
    # no workspace header: the rule does not apply
    assert r.match("POST", "https", "h", 443,
                   "/v1/connections/c1/schemas/public/tables/orders/loads",
                   {}) is None
    r = libthrottle.Rule.parse("* %s %s surface cap=2 retries=3 timeout=9 "
                               "host=example:8080" % (LOAD, KEY))
    assert (r.method, r.retry, r.cap, r.retries, r.timeout) == \
        ("*", False, 2, 3, 9.0)
    assert r.match("PUT", "http", "example", 8080, "/v1/tables/t1/load?x=1",
                   None) == "hotdata:example/t1"
    assert r.match("PUT", "http", "other", 8080, "/v1/tables/t1/load",
                   None) is None
    assert r.match("PUT", "http", "example", 8080, "/v1/tables/a/b/load",
                   None) is None
    # a path segment that cannot be part of a key: not matched, not an error
    assert r.match("PUT", "http", "example", 8080, "/v1/tables/%s/load"
                   % ("x" * 300), None) is None
    for bad in ("", "nopreset", "%s %s frobnicate" % (LOAD, KEY),
                "%s hotdata:{nothing}" % LOAD, "%s %s cap=99" % (LOAD, KEY),
                "%s %s class=urgent" % (LOAD, KEY),
                "%s %s retries=-1" % (LOAD, KEY),
                "/v1/{t}/{t} hotdata:{t}", "/v1/{t} k:{t} pool=1",
                "hotdata pool=33"):
        with pytest.raises(ValueError):
            libthrottle.Rule.parse(bad)


def test_dlt_instrument_retry_returns_the_answer_after_the_lock(
        mock, t, instrumented):
    stats = instrumented("%s %s" % (LOAD, KEY))
    with locked_once(mock, t):
        r = post(mock, body=b"0123456789")
    assert r.status == 200
    assert json.loads(r.data)["loaded"] == 10  # the whole body, again
    st = mock.stats()
    assert st["tables"]["orders"]["refused"] == 1
    assert early(st) == 0 and st["loads_ok"] == 1
    assert stats["resent"] >= 1 and stats["admitted"] >= 1


def test_dlt_instrument_retry_rewinds_a_file_body(mock, t, instrumented):
    instrumented("%s %s" % (LOAD, KEY))
    f = io.BytesIO(b"skip" + b"x" * 100)
    f.seek(4)
    with locked_once(mock, t):
        r = post(mock, body=f, headers={"Content-Length": "100"})
    assert r.status == 200 and json.loads(r.data)["loaded"] == 100
    assert mock.stats()["tables"]["orders"]["refused"] == 1


def chunks(*parts):
    """A generator body: consumed by sending it once."""
    for p in parts:
        yield p


@pytest.mark.parametrize("client", ["urllib3", "requests", "httpx"])
def test_dlt_instrument_retry_replays_a_generator_body(mock, t, instrumented,
                                                       client):
    """A generator body is buffered before the first attempt and the retry
    after the lock sends the same bytes (it used to be sent once and its
    409 returned)."""
    lib = pytest.importorskip(client)  # before the lock: a skip is quick
    if client == "requests":
        import inspect
        if "low_conn" in inspect.getsource(lib.adapters.HTTPAdapter.send):
            pytest.skip("this requests (%s) sends a chunked body itself, "
                        "around urllib3's urlopen" % lib.__version__)
    stats = instrumented("%s %s" % (LOAD, KEY))
    body = (b"abc", b"defg", b"h" * 1000)
    with locked_once(mock, t):
        if client == "requests":
            r = lib.post(mock.load_url(), data=chunks(*body), timeout=30)
            status, data = r.status_code, r.content
        elif client == "httpx":
            with lib.Client(timeout=30) as c:
                r = c.post(mock.load_url(), content=chunks(*body))
                status, data = r.status_code, r.content
        else:
            r = post(mock, body=chunks(*body), chunked=True)
            status, data = r.status, r.data
    assert status == 200, data
    assert json.loads(data)["loaded"] == 1007  # every byte, on the retry
    st = mock.stats()
    assert st["tables"]["orders"]["refused"] == 1 and st["loads_ok"] == 1
    assert st["requests"] == 2 and early(st) == 0
    assert stats["resent"] == 1 and stats["buffered"] == 1


def test_dlt_instrument_stream_beyond_the_replay_limit_is_refused_unsent(
        mock, t, instrumented):
    instrumented("%s %s replay_limit=100" % (LOAD, KEY))
    with pytest.raises(libthrottle.BodyNotReplayable):
        post(mock, body=chunks(b"x" * 60, b"y" * 60), chunked=True)
    assert mock.stats()["requests"] == 0
    assert field(t, ORDERS, "admitted") == 0  # refused before admission
    r = post(mock, body=chunks(b"x" * 60, b"y" * 40), chunked=True)
    assert r.status == 200 and json.loads(r.data)["loaded"] == 100


def test_dlt_instrument_surface_sends_a_stream_as_it_is(mock, t,
                                                        instrumented):
    """surface sends once: a stream is streamed, not buffered."""
    stats = instrumented("%s %s surface" % (LOAD, KEY))
    mock.admin("hold", {"table": "orders", "ms": 60000})
    r = post(mock, body=chunks(b"abc", b"def"), chunked=True)
    assert r.status == 409 and b"RESOURCE_LOCKED" in r.data
    assert mock.stats()["requests"] == 1 and stats["buffered"] == 0
    assert t.remaining(ORDERS) > 0  # published


@pytest.mark.parametrize("client", ["urllib3", "requests", "httpx"])
def test_dlt_instrument_surface_returns_the_409(mock, t, instrumented,
                                                client):
    instrumented("%s %s surface" % (LOAD, KEY))
    mock.admin("hold", {"table": "orders", "ms": 60000})
    if client == "requests":
        requests = pytest.importorskip("requests")
        r = requests.post(mock.load_url(), data=b"row\n", timeout=30)
        status, body = r.status_code, r.content
    elif client == "httpx":
        httpx = pytest.importorskip("httpx")
        with httpx.Client(timeout=30) as c:
            r = c.post(mock.load_url(), content=b"row\n")
            status, body = r.status_code, r.content
    else:
        r = post(mock)
        status, body = r.status, r.data
    assert status == 409
    assert json.loads(body)["error"]["code"] == "RESOURCE_LOCKED"
    assert mock.stats()["requests"] == 1
    assert 0 < t.remaining("hotdata:127.0.0.1/orders") <= 1.0


def test_dlt_instrument_requests_retry(mock, t, instrumented):
    requests = pytest.importorskip("requests")
    instrumented("%s %s" % (LOAD, KEY))
    with locked_once(mock, t):
        r = requests.post(mock.load_url(), data=b"abcdef", timeout=30)
    assert r.status_code == 200 and r.json()["loaded"] == 6
    st = mock.stats()
    assert st["tables"]["orders"]["refused"] == 1 and early(st) == 0


def test_dlt_instrument_httpx_retry(mock, t, instrumented):
    httpx = pytest.importorskip("httpx")
    stats = instrumented("%s %s" % (LOAD, KEY))
    with httpx.Client(timeout=30) as c, locked_once(mock, t):
        r = c.post(mock.load_url(), content=b"abcdef")
        assert r.status_code == 200 and r.json()["loaded"] == 6
        assert mock.stats()["tables"]["orders"]["refused"] == 1
    assert early(mock.stats()) == 0 and stats["resent"] == 1


async def achunks(*parts):
    """An async generator body."""
    for p in parts:
        yield p


def test_dlt_instrument_async_httpx_waits_off_the_loop(mock, t,
                                                       instrumented):
    """httpx.AsyncClient: the locked load is sent again, its async
    generator body whole, and while it waits for the shared back-off the
    event loop runs: a task of the same loop sees the request waiting in
    the gate and ends the lock (a wait that blocked the loop would let
    that task run only after the request had given up)."""
    httpx = pytest.importorskip("httpx")
    stats = instrumented("%s %s" % (LOAD, KEY))
    held = {"table": "orders"}
    mock.admin("hold", dict(held, ms=600000))
    seen = {}

    async def main():
        loop = asyncio.get_running_loop()
        async with httpx.AsyncClient(timeout=30) as c:
            req = asyncio.ensure_future(c.post(
                mock.load_url(), content=achunks(b"abc", b"d" * 500)))
            deadline = loop.time() + 120
            while not req.done() and field(t, ORDERS, "waiting_live") < 1:
                assert loop.time() < deadline, "no wait in the gate"
                await asyncio.sleep(0.005)
            seen["waiting_while_pending"] = not req.done()
            seen["refused_then"] = mock.stats()["tables"]["orders"][
                "refused"]
            mock.admin("release", held)
            return await req
    try:
        r = asyncio.run(main())
    finally:
        mock.admin("release", held)
    assert seen["waiting_while_pending"] and seen["refused_then"] >= 1
    assert r.status_code == 200 and r.json()["loaded"] == 503
    st = mock.stats()
    assert early(st) == 0 and st["loads_ok"] == 1
    assert stats["admitted"] == 1 and stats["resent"] >= 1
    assert stats["buffered"] == 1


def test_dlt_instrument_async_httpx_many_tasks_one_table(mock, t,
                                                         instrumented):
    """Tasks of one loop loading one table under cap 1: one at a time,
    each sent again after its lock answer, every load 200, never early."""
    httpx = pytest.importorskip("httpx")
    instrumented("%s %s cap=1" % (LOAD, KEY))

    async def main():
        async with httpx.AsyncClient(timeout=60) as c:
            return await asyncio.gather(*[
                c.post(mock.load_url(), content=b"x" * (i + 1))
                for i in range(20)])
    with locked_once(mock, t):
        rs = asyncio.run(main())
    assert sorted(r.json()["loaded"] for r in rs) == list(range(1, 21))
    st = mock.stats()
    assert st["tables"]["orders"]["refused"] == 1 and early(st) == 0
    assert st["loads_ok"] == 20 and st["max_concurrent"] <= 1


@pytest.mark.parametrize("mode", ["surface", "timeout"])
def test_dlt_instrument_async_httpx_surface_and_not_admitted(
        mock, t, instrumented, mode):
    httpx = pytest.importorskip("httpx")

    async def post_async():
        async with httpx.AsyncClient(timeout=30) as c:
            return await c.post(mock.load_url(), content=achunks(b"ab"))
    if mode == "surface":
        stats = instrumented("%s %s surface" % (LOAD, KEY))
        mock.admin("hold", {"table": "orders", "ms": 60000})
        r = asyncio.run(post_async())
        assert r.status_code == 409 and stats["buffered"] == 0
        assert mock.stats()["requests"] == 1
        assert 0 < t.remaining(ORDERS) <= 1.0  # published
    else:
        stats = instrumented("%s %s timeout=0.3" % (LOAD, KEY))
        t.pause(ORDERS)
        with pytest.raises(libthrottle.NotAdmitted):
            asyncio.run(post_async())
        assert stats["not_admitted"] == 1 and mock.stats()["requests"] == 0


def test_dlt_instrument_async_unmatched_requests_pass(mock, t, instrumented):
    httpx = pytest.importorskip("httpx")
    stats = instrumented("%s %s" % ("/v1/tables/{table}/other", KEY))

    async def post_async():
        async with httpx.AsyncClient(timeout=30) as c:
            return await c.post(mock.load_url(), content=b"ab")
    assert asyncio.run(post_async()).status_code == 200
    assert stats["admitted"] == 0


@pytest.mark.parametrize("client", ["requests", "urllib3", "httpx",
                                    "httpx-async"])
def test_dlt_instrument_leaves_the_packages_own_clients_alone(
        mock, t, instrumented, client):
    """A request sent by one of libthrottle's own clients (the requests
    session, the urllib3 pool manager, the httpx transports) is admitted
    by that client; instrument does not admit it a second time, inside
    the first admission (under cap 1 that waited for the slot the same
    request held, until the rule's timeout)."""
    stats = instrumented("%s %s cap=1 timeout=5" % (LOAD, KEY))
    if client == "requests":
        pytest.importorskip("requests")
        import libthrottle.requests as lr
        r = lr.session(ORDERS, throttle=t).post(mock.load_url(),
                                                data=b"abc", timeout=30)
        status = r.status_code
    elif client == "urllib3":
        lu = pytest.importorskip("libthrottle.urllib3")
        r = lu.ThrottlePoolManager(ORDERS, throttle=t).request(
            "POST", mock.load_url(), body=b"abc")
        status = r.status
    else:
        lh = pytest.importorskip("libthrottle.httpx")
        httpx = pytest.importorskip("httpx")
        if client == "httpx":
            with httpx.Client(transport=lh.ThrottleTransport(
                    ORDERS, throttle=t)) as c:
                status = c.post(mock.load_url(), content=b"abc").status_code
        else:
            async def main():
                async with httpx.AsyncClient(
                        transport=lh.AsyncThrottleTransport(
                            ORDERS, throttle=t)) as c:
                    r = await c.post(mock.load_url(), content=b"abc")
                    return r.status_code
            status = asyncio.run(main())
    assert status == 200
    assert t.info(ORDERS)["admitted"] == 1 and stats["admitted"] == 0
    assert stats["not_admitted"] == 0


def test_dlt_instrument_not_admitted_in_time(mock, t, instrumented):
    stats = instrumented("%s %s timeout=0.3" % (LOAD, KEY))
    t.pause(ORDERS)
    with pytest.raises(libthrottle.NotAdmitted) as e:
        post(mock)
    # a TimeoutError: what clients (the hotdata SDK) retry as transient
    assert isinstance(e.value, TimeoutError) and ORDERS in str(e.value)
    assert stats["not_admitted"] == 1 and mock.stats()["requests"] == 0


def test_dlt_instrument_no_answer_raises_the_clients_error(t, instrumented):
    instrumented("%s %s" % (LOAD, KEY))
    import socket
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = "http://127.0.0.1:%d/v1/tables/orders/load" % s.getsockname()[1]
        with pytest.raises(urllib3.exceptions.HTTPError):
            urllib3.PoolManager().request("POST", url, body=b"x",
                                          retries=False)
    key = "hotdata:127.0.0.1/orders"
    # admitted once, given back as failed, nothing published
    assert t.info(key)["admitted"] == 1 and t.info(key)["in_flight"] == 0
    assert t.remaining(key) == 0


def test_dlt_instrument_429_holds_the_workspace(mock, t, instrumented):
    instrumented("%s %s surface" % (LOAD, KEY))
    mock.admin("overload", {"seconds": 60})
    assert post(mock).status == 429
    # published on the key's scope: every table of the workspace waits
    assert t.remaining("hotdata:127.0.0.1/other") > 0
    assert t.remaining("hotdata:127.0.0.1") > 0


def test_dlt_instrument_unmatched_requests_pass(mock, t, instrumented):
    stats = instrumented("%s %s" % ("/v1/tables/{table}/other", KEY))
    mock.admin("hold", {"table": "orders", "ms": 60000})
    assert post(mock).status == 409
    assert stats["admitted"] == 0
    assert t.remaining("hotdata:127.0.0.1/orders") == 0


def run_under(rules, code, **env):
    return subprocess.run(
        [sys.executable, "-m", "libthrottle.run"] +
        [a for r in rules for a in ("--rule", r)] +
        ["--", sys.executable, "-c", code],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=child_env(**env), timeout=120, cwd=TOP)


def test_dlt_instrument_launcher_instruments_the_child(mock, t):
    code = ("import urllib3, sys\n"
            "r = urllib3.PoolManager().request('POST', %r, body=b'abc')\n"
            "print(r.status, r.data.decode())\n" % mock.load_url())
    with locked_once(mock, t):
        out = run_under(["%s %s" % (LOAD, KEY)], code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("200 ")
    st = mock.stats()
    assert st["tables"]["orders"]["refused"] == 1 and early(st) == 0


def test_dlt_instrument_launcher_refuses_a_bad_rule():
    out = run_under(["/v1/x hotdata:{nope}"], "print('ran')")
    assert out.returncode == 64 and "ran" not in out.stdout
    assert "does not capture" in out.stderr
    out = subprocess.run([sys.executable, "-m", "libthrottle.run", "--rule",
                          "hotdata", "--"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env=child_env(), timeout=60)
    assert out.returncode == 64 and "no command" in out.stderr


def test_dlt_instrument_launcher_keeps_the_environment(segment):
    code = ("import os, sys, libthrottle.instrument as i\n"
            "print(os.environ['LIBTHROTTLE_RULES'])\n"
            "print(i._state['rules'])\n")
    out = run_under(["hotdata", "hotdata class=backfill"], code,
                    EXTRA_MARK="kept")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0:2] == ["hotdata", "hotdata class=backfill"]
    assert "class=backfill" in lines[2] and "class=live" in lines[2]
    assert os.path.join(TOP, "python") in child_env()["PYTHONPATH"]


def test_dlt_instrument_launcher_installed(tmp_path, segment):
    """make install installs the launcher's sitecustomize too: the
    installed package instruments a child with no environment but the
    segment's name."""
    from test_install import make
    venv = str(tmp_path / "venv")
    # the system's packages: urllib3 for the child to be instrumented
    if subprocess.run([sys.executable, "-m", "venv", "--without-pip",
                       "--system-site-packages", venv]).returncode != 0:
        pytest.skip("no venv module")
    py = os.path.join(venv, "bin", "python3")
    make("install", venv, py)
    code = "import libthrottle.instrument as i; print(i._state['rules'])"
    out = subprocess.run([py, "-m", "libthrottle.run", "--rule", "hotdata",
                          "--", py, "-c", code], env={
                              "THROTTLE_SEGMENT": segment,
                              "PATH": os.environ["PATH"]}, cwd="/",
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Rule(POST /v1/connections/" in out.stdout, out.stderr
