# SPDX-License-Identifier: MIT
"""test_pypi_aiohttp.py — libthrottle.aiohttp.request() against the mock
server, with aiohttp from PyPI: many requests of one event loop behind a
held table (none early, few refusals, every body whole), a conflict sent
once, an async generator body sent whole on the retry, aiohttp's own
exception when nothing answers."""

import asyncio

import pytest

from conftest import early, pypi_only

pypi_only()

import aiohttp  # noqa: E402

import libthrottle  # noqa: E402
import libthrottle.aiohttp as la  # noqa: E402

KEY = "hotdata:127.0.0.1/orders"


def test_aiohttp_many_requests_wait_out_a_lock(t, mock):
    mock.admin("hold", {"table": "orders", "ms": 1000})

    async def main():
        at = libthrottle.AsyncThrottle(t)
        async with aiohttp.ClientSession() as s:
            rs = await asyncio.gather(*[
                la.request(s, KEY, "POST", mock.load_url(),
                           data=b"x" * (i + 1), throttle=at)
                for i in range(8)])
            return [(r.status, (await r.json())["loaded"]) for r in rs]

    got = asyncio.run(main())
    assert sorted(got) == [(200, i + 1) for i in range(8)]
    st = mock.stats()
    assert early(st) == 0 and st["refused"] <= 3


def test_aiohttp_async_generator_body_sent_whole(t, mock):
    mock.admin("hold", {"table": "orders", "ms": 800})

    async def rows():
        for i in range(100):
            yield b"row %04d\n" % i

    async def main():
        async with aiohttp.ClientSession() as s:
            r = await la.request(s, KEY, "POST", mock.load_url(),
                                 data=rows(), throttle=t)
            return r.status, await r.json(), r.throttle_attempts

    status, body, attempts = asyncio.run(main())
    assert status == 200 and body["loaded"] == 900 and attempts >= 2


def test_aiohttp_conflict_once_and_errors(t, mock):
    async def main():
        async with aiohttp.ClientSession() as s:
            await la.request(s, KEY, "POST", mock.url + "/v1/tables",
                             json={"name": "o"}, throttle=t)
            r = await la.request(s, KEY, "POST", mock.url + "/v1/tables",
                                 json={"name": "o"}, throttle=t)
            assert r.status == 409
            assert r.throttle_outcome.kind == "permanent"
            with pytest.raises(aiohttp.ClientConnectionError):
                await la.request(s, KEY, "POST", "http://127.0.0.1:9/x",
                                 data=b"x", throttle=t, retries=1)
            with pytest.raises(ValueError):
                await la.request(s, KEY, "POST", "http://:99/x", throttle=t)
    asyncio.run(main())
    assert mock.stats()["requests"] == 2


def test_aiohttp_middleware_waits_out_a_lock_with_whole_bodies(t, mock):
    """The client middleware: every request of the session admitted and
    retried; an async generator body (a payload by then) sent whole."""
    mock.admin("hold", {"table": "orders", "ms": 1000})

    async def rows(n):
        for i in range(n):
            yield b"row %04d\n" % i

    async def main():
        mw = la.middleware(KEY, throttle=t)
        async with aiohttp.ClientSession(middlewares=(mw,)) as s:
            async def one(i):
                async with s.post(mock.load_url(), data=rows(i + 1)) as r:
                    return r.status, (await r.json())["loaded"]
            return await asyncio.gather(*[one(i) for i in range(6)])

    got = asyncio.run(main())
    assert sorted(got) == [(200, 9 * (i + 1)) for i in range(6)]
    st = mock.stats()
    assert early(st) == 0 and st["refused"] <= 3


def test_aiohttp_middleware_refuses_a_body_beyond_the_limit(t, mock):
    async def big():
        yield b"x" * 20

    async def main():
        mw = la.middleware(KEY, throttle=t, replay_limit=10)
        async with aiohttp.ClientSession(middlewares=(mw,)) as s:
            with pytest.raises(libthrottle.BodyNotReplayable):
                await s.post(mock.load_url(), data=big())
            async with s.post(mock.load_url(), data=b"y" * 20) as r:
                assert (await r.json())["loaded"] == 20  # bytes: kept as is
    asyncio.run(main())
    assert mock.stats()["requests"] == 1  # the bytes body only
