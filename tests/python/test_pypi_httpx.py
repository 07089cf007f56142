# SPDX-License-Identifier: MIT
"""test_pypi_httpx.py — libthrottle.httpx's transports (httpx.Client and
httpx.AsyncClient) against the mock server, with httpx from PyPI: a lock
published and waited out (never early, few refusals), a conflict sent
once, a streamed body sent whole on the retry, the async transport's
waits off the event loop, the last transient answer when the budget runs
out, httpx's own exception when nothing answers."""

import asyncio

import pytest

from conftest import early, pypi_only

pypi_only()

import httpx  # noqa: E402

import libthrottle  # noqa: E402
import libthrottle.httpx as lh  # noqa: E402

KEY = "hotdata:127.0.0.1/orders"


def client(t, **kw):
    return httpx.Client(transport=lh.ThrottleTransport(KEY, throttle=t, **kw),
                        timeout=10)


def test_httpx_lock_is_published_and_waited_out(t, mock):
    mock.admin("hold", {"table": "orders", "ms": 1200})
    with client(t) as c:
        r = c.post(mock.load_url(), content=b"abcd")
    assert r.status_code == 200 and r.json()["loaded"] == 4
    ext = r.extensions["libthrottle"]
    assert ext["outcome"].kind == "ok" and ext["attempts"] >= 2
    st = mock.stats()
    assert early(st) == 0 and st["refused"] <= 3
    assert t.info(KEY)["publishes"] >= 1


def test_httpx_conflict_is_returned_once(t, mock):
    with client(t) as c:
        c.post(mock.url + "/v1/tables", json={"name": "orders"})
        r = c.post(mock.url + "/v1/tables", json={"name": "orders"})
    assert r.status_code == 409
    assert r.extensions["libthrottle"]["outcome"].kind == "permanent"
    assert mock.stats()["requests"] == 2
    with pytest.raises(httpx.HTTPStatusError):
        r.raise_for_status()


def test_httpx_streamed_body_is_sent_whole_on_the_retry(t, mock):
    mock.admin("hold", {"table": "orders", "ms": 800})

    def rows():
        for i in range(100):
            yield b"row %04d\n" % i

    with client(t) as c:
        r = c.post(mock.load_url(), content=rows())
    assert r.status_code == 200 and r.json()["loaded"] == 900
    assert r.extensions["libthrottle"]["attempts"] >= 2


def test_httpx_stream_beyond_the_limit_is_refused_unsent(t, mock):
    with client(t, replay_limit=100) as c:
        with pytest.raises(libthrottle.BodyNotReplayable):
            c.post(mock.load_url(), content=iter([b"x" * 60, b"y" * 60]))
    assert mock.stats()["requests"] == 0


def test_httpx_budget_returns_the_last_transient_answer(t, mock):
    mock.admin("hold", {"table": "orders", "ms": 60000})
    with client(t, retries=1) as c:
        r = c.post(mock.load_url(), content=b"x")
    assert r.status_code == 409
    assert r.extensions["libthrottle"]["outcome"].kind == "locked"
    assert r.extensions["libthrottle"]["attempts"] == 2
    assert mock.stats()["early"] == 0


def test_httpx_no_answer_raises_httpx_error_and_malformed_url(t):
    with client(t, retries=1) as c:
        with pytest.raises(httpx.ConnectError):
            c.post("http://127.0.0.1:9/x", content=b"x")
        with pytest.raises(ValueError):
            c.post("http://:99/x", content=b"x")
    assert t.info(KEY)["in_flight"] == 0


def test_httpx_async_transport_waits_off_the_loop(t, mock):
    """Eight requests from one event loop behind a held table: all load,
    none early, and another task of the loop runs while they wait (a
    blocking wait would hold the loop until the lock passed)."""
    mock.admin("hold", {"table": "orders", "ms": 1000})
    at = libthrottle.AsyncThrottle(t)

    async def main():
        ran_while_waiting = 0
        done = False

        async def ticker():
            nonlocal ran_while_waiting
            while not done:
                await asyncio.sleep(0.005)
                if at.waiting(KEY) > 0:
                    ran_while_waiting += 1

        tk = asyncio.ensure_future(ticker())
        tr = lh.AsyncThrottleTransport(KEY, throttle=at)
        async with httpx.AsyncClient(transport=tr, timeout=10) as c:
            rs = await asyncio.gather(*[
                c.post(mock.load_url(), content=b"x" * (i + 1))
                for i in range(8)])
        done = True
        await tk
        return rs, ran_while_waiting

    rs, ran = asyncio.run(main())
    assert sorted(r.json()["loaded"] for r in rs) == list(range(1, 9))
    assert ran > 0
    st = mock.stats()
    assert early(st) == 0 and st["refused"] <= 3
