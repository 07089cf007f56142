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


async def until(cond, what, timeout=20):
    """Let the loop run until cond() (a state other tasks or processes
    reach); fail, not hang, when it never comes."""
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out waiting for " + what
        await asyncio.sleep(0.001)


@pytest.fixture
def at(t):
    return libthrottle.AsyncThrottle(t)


@pytest.fixture(params=["library", "polling"])
def each_wait(request, t, monkeypatch):
    """An AsyncThrottle whose heads wait in the library (helper thread),
    and one that polls as it does with a library without the interrupt
    hook."""
    if request.param == "polling":
        from libthrottle import _async
        monkeypatch.setattr(_async, "HAVE_INTERRUPT", False)
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


def test_async_admit_timeout_is_etimedout(each_wait, t):
    at = each_wait
    t.backoff(KEY, 30)

    async def main():
        with pytest.raises(libthrottle.ETIMEDOUT):
            await at.admit(KEY, timeout=0.5)
        with pytest.raises(TimeoutError):
            await at.admit(KEY, timeout=0.5)
    run(main())


def test_async_thousand_waiting_tasks_all_admitted_in_order(each_wait, t):
    """1,000 tasks queue behind one holder, on one thread, and are admitted
    one at a time (cap 1) in the order they came."""
    at = each_wait
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
        # one helper thread for the key's head, none per waiting task
        assert threading.active_count() <= threads + 1
        holder.leave("ok")
        await asyncio.gather(*tasks)
    run(main())
    assert order == list(range(1000))
    assert t.info(KEY)["in_flight"] == 0


def test_async_cancel_gives_the_place_back_at_once(each_wait, t):
    at = each_wait
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


def test_async_one_probe_and_never_early_after_another_process(each_wait, t):
    """Another process (throttlectl) publishes a back-off; the tasks wait
    it out, none is admitted early, and the first admitted is the probe
    while the others wait for its answer (I1, I3)."""
    at = each_wait
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


def test_async_task_keeps_its_place_among_other_processes(at, t, tmp_path):
    """First come, first served across processes: a task that queued
    before a C process (throttlectl run) is admitted before it, and one
    that queued after it, after it (a polling task held no place in the
    key's queue: the C process went first either way)."""
    from conftest import field, spawn_ctl_hold
    t.set_max_parallel(KEY, 1)
    holder = t.try_admit(KEY)
    log = str(tmp_path / "log")

    async def task(name):
        async with at.admit(KEY, timeout=60) as adm:
            with open(log, "a") as f:
                f.write("start %s\nend %s\n" % (name, name))
            adm.leave("ok")

    async def main():
        first = asyncio.ensure_future(task("py-first"))
        await until(lambda: field(t, KEY, "waiting_live") == 1,
                    "the task queued in the library")
        ctl = spawn_ctl_hold(KEY, "c", log, 0.05)
        await until(lambda: field(t, KEY, "waiting_live") == 2,
                    "the C process queued")
        last = asyncio.ensure_future(task("py-last"))
        await until(lambda: at.waiting(KEY) == 2, "the second task queued")
        holder.leave("ok")
        await asyncio.gather(first, last)
        return ctl

    ctl = run(main())
    out, err = ctl.communicate(timeout=60)
    assert ctl.returncode == 0, (out, err)
    with open(log) as f:
        starts = [l.split()[1] for l in f if l.startswith("start")]
    assert starts == ["py-first", "c", "py-last"]


def test_async_cancel_of_the_key_ends_every_waiting_task(at, t):
    """throttle_cancel() (here from another process, throttlectl cancel)
    ends every waiter of the key with ECANCELED: the tasks queued behind
    the one waiting in the library too."""
    t.set_max_parallel(KEY, 1)
    holder = t.try_admit(KEY)

    async def main():
        tasks = [asyncio.ensure_future(at.admit(KEY, timeout=60).__aenter__())
                 for _ in range(4)]
        await until(lambda: at.waiting(KEY) == 4, "4 tasks queued")
        await until(lambda: t.info(KEY)["waiting_live"] == 1,
                    "the first waiting in the library")
        subprocess.run([os.path.join(BUILD, "throttlectl"), "cancel", KEY],
                       check=True)
        return await asyncio.gather(*tasks, return_exceptions=True)

    res = run(main())
    assert all(isinstance(r, libthrottle.ECANCELED) for r in res), res
    holder.leave("ok")
    assert t.info(KEY)["in_flight"] == 0
