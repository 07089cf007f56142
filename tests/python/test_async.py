# SPDX-License-Identifier: MIT
"""test_async.py — AsyncThrottle: admissions and waits as coroutines that
never block the event loop and take no thread per waiting task; a
cancelled task gives its place back at once; 1,000 waiting tasks; the
same contracts as Throttle (one probe, the cap, never early) against
other processes.  Plain asyncio (the standard library)."""

import asyncio
import os
import subprocess
import threading
import time

import pytest

import libthrottle
from conftest import BUILD

KEY = "hotdata:ws1/orders"


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def at(t):
    return libthrottle.AsyncThrottle(t)


def test_async_admit_report_and_await_forms(at, t):
    async def main():
        async with at.admit(KEY, timeout=5) as adm:
            assert adm.held and t.info(KEY)["in_flight"] == 1
            out = adm.report(200, {}, b"{}")
        assert out.kind == "ok" and not adm.held
        adm = await at.admit(KEY, klass="backfill")
        adm.leave()
        assert await at.try_admit(KEY) is not None  # dropped: given back
    run(main())
    assert t.info(KEY)["in_flight"] == 0 and t.info(KEY)["admitted"] == 3


def test_async_wait_does_not_block_the_loop(at, t):
    """A task waiting out a back-off lets the loop run other tasks (a
    blocking wait() held the loop for the whole back-off) and starts no
    thread.  The back-off is cleared by the other task, so the test waits
    on the loop's progress, not on a clock."""
    t.backoff(KEY, 60)
    threads = threading.active_count()

    async def main():
        waiter = asyncio.ensure_future(at.wait(KEY, timeout=120))
        ticks = 0
        while ticks < 50:  # the loop runs while the waiter waits
            await asyncio.sleep(0.001)
            ticks += 1
        assert not waiter.done()
        assert threading.active_count() == threads
        await at.clear(KEY)
        return await waiter
    assert run(main()) is True


def test_async_wait_timeout_and_open_key(at, t):
    async def main():
        assert await at.wait("open-key", timeout=0) is True
        t.backoff(KEY, 30)
        assert await at.wait(KEY, timeout=1) is False  # at once: 30 > 1
    run(main())


def test_async_admit_timeout_is_etimedout(at, t):
    t.backoff(KEY, 30)

    async def main():
        with pytest.raises(libthrottle.ETIMEDOUT):
            await at.admit(KEY, timeout=0.5)
        with pytest.raises(TimeoutError):
            await at.admit(KEY, timeout=0.5)
    run(main())


def test_async_thousand_waiting_tasks_all_admitted_in_order(at, t):
    """1,000 tasks queue behind one holder, on one thread, and are admitted
    one at a time (cap 1) in the order they came."""
    t.set_max_parallel(KEY, 1)
    holder = t.try_admit(KEY)
    threads = threading.active_count()
    order = []

    async def task(i):
        async with at.admit(KEY, timeout=300) as adm:
            order.append(i)
            assert t.info(KEY)["in_flight"] == 1
            adm.leave("ok")

    async def main():
        tasks = [asyncio.ensure_future(task(i)) for i in range(1000)]
        while at.waiting(KEY) < 1000:
            await asyncio.sleep(0.001)
        assert threading.active_count() == threads
        holder.leave("ok")
        await asyncio.gather(*tasks)
    run(main())
    assert order == list(range(1000))
    assert t.info(KEY)["in_flight"] == 0


def test_async_cancel_gives_the_place_back_at_once(at, t):
    t.set_max_parallel(KEY, 1)
    holder = t.try_admit(KEY)
    got = []

    async def task(name):
        async with at.admit(KEY, timeout=60) as adm:
            got.append(name)
            adm.leave("ok")

    async def main():
        a = asyncio.ensure_future(task("a"))
        b = asyncio.ensure_future(task("b"))
        c = asyncio.ensure_future(task("c"))
        while at.waiting(KEY) < 3:
            await asyncio.sleep(0.001)
        a.cancel()  # the head: b becomes head
        with pytest.raises(asyncio.CancelledError):
            await a
        assert at.waiting(KEY) == 2
        b.cancel()
        await asyncio.gather(b, return_exceptions=True)
        assert at.waiting(KEY) == 1
        holder.leave("ok")
        await c
    run(main())
    assert got == ["c"] and t.info(KEY)["in_flight"] == 0


def test_async_close_ends_every_wait_with_throttle_closed(segment):
    async def main():
        at = libthrottle.AsyncThrottle(segment=segment)
        at.throttle.backoff(KEY, 60)
        tasks = [asyncio.ensure_future(at.admit(KEY).__aenter__())
                 for _ in range(3)]
        tasks.append(asyncio.ensure_future(at.wait(KEY)))
        while at.waiting(KEY) < 3:
            await asyncio.sleep(0.001)
        await at.close()
        res = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, libthrottle.ThrottleClosed) for r in res)
        assert at.throttle.closed  # it made it, it closed it
    run(main())


def test_async_one_probe_and_never_early_after_another_process(at, t):
    """Another process (throttlectl) publishes a back-off; the tasks wait
    it out, none is admitted early, and the first admitted is the probe
    while the others wait for its answer (I1, I3)."""
    ctl = os.path.join(BUILD, "throttlectl")
    subprocess.run([ctl, "backoff", KEY, "1"], check=True)
    until_ms = time.monotonic() + t.remaining(KEY)
    admitted = []

    async def task():
        async with at.admit(KEY, timeout=30) as adm:
            admitted.append((time.monotonic(), adm.probe))
            await asyncio.sleep(0.01)
            adm.report(200, {}, b"{}")

    async def main():
        await asyncio.gather(*[task() for _ in range(5)])
    run(main())
    assert len(admitted) == 5
    assert admitted[0][1] is True  # the first after the back-off probes
    assert all(not probe for _, probe in admitted[1:])
    assert admitted[0][0] >= until_ms - 0.002  # remaining() is whole ms


def test_async_requeue_goes_to_the_front(at, t):
    t.set_max_parallel(KEY, 1)
    got = []

    async def first():
        adm = await at.admit(KEY)
        while at.waiting(KEY) < 1:
            await asyncio.sleep(0.001)
        await adm.requeue("transient", None, timeout=30)
        got.append("first again")
        adm.leave("ok")

    async def second():
        while t.info(KEY)["in_flight"] == 0:  # first holds it
            await asyncio.sleep(0.001)
        async with at.admit(KEY, timeout=30) as adm:
            got.append("second")
            adm.leave("ok")

    async def main():
        await asyncio.gather(first(), second())
    run(main())
    assert got == ["first again", "second"]


def test_async_has_every_call_of_throttle(at):
    """Every public call of Throttle is on AsyncThrottle; the ones that
    are calls there are coroutines here."""
    import inspect
    for name, member in inspect.getmembers(libthrottle.Throttle):
        if name.startswith("_") or name == "close":
            continue
        assert hasattr(libthrottle.AsyncThrottle, name), name
        if inspect.isfunction(member) and name != "admit":
            assert inspect.iscoroutinefunction(
                getattr(libthrottle.AsyncThrottle, name)), name

    async def main():
        await at.backoff(KEY, 2)
        assert 1 < await at.remaining(KEY) <= 2
        await at.set_max_parallel(KEY, 3)
        assert (await at.info(KEY))["cap"] == 3
        await at.pause(KEY)
        assert await at.try_admit(KEY) is None
        await at.resume(KEY)
        await at.clear(KEY)
        assert at.shared and at.backend == "shm" and at.open_error is None
        assert (await at.stats())["used"] >= 1
    run(main())
