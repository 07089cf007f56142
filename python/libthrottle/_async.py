# SPDX-License-Identifier: MIT
"""_async.py — AsyncThrottle: Throttle's calls as coroutines for asyncio,
with waiting that never blocks the event loop and takes no thread per
waiting task.

    t = libthrottle.AsyncThrottle()
    async with t.admit("hotdata:ws1/orders", timeout=30) as adm:
        status, headers, body = await send()
        adm.report(status, headers, body)
    await t.wait("hotdata:ws1/orders", timeout=10)

How a task waits.  A blocking throttle_enter() on the loop's thread
would hold the loop, and one thread per waiting task does not scale.
Instead the tasks of one AsyncThrottle that wait for the same key and
class form a FIFO queue in the process, and only its head waits in the
library: in throttle_enter(), made by a helper thread of its own, so that
the process holds its place in the key's queue across processes (first
come, first served; live before backfill; throttle_cancel() reaches it).
The thread hands the admission to the loop (call_soon_threadsafe) and
ends; the next task becomes head.  So a process has one such thread per
key (and class) it waits for, whatever the number of waiting tasks, and
the loop never blocks.  throttle_cancel() on the key ends the head's wait
with ECANCELED, and with it the waits of the tasks queued behind it.

Cancelling a waiting task (task.cancel(), asyncio.timeout, wait_for) takes
it out of the queue at once and makes the next task head; a cancelled
head's thread gives its place in the library back within the interrupt
period (50 ms: the handle's interrupt check sees the task's stop event),
and an admission it got meanwhile is given back at once.  close() ends
every wait with ThrottleClosed.

With a library without throttle_config_set_interrupt() (an older one) the
head polls instead: the non-blocking throttle_try_enter() and its wait
hint (the back-off or rate left), or POLL_MIN_S doubling to POLL_MAX_S
while the wait is for a slot; an admission given back in the process
wakes it at once.  A polling head holds no place in the key's queue:
blocking waiters of other processes go first.

arun() is libthrottle.run()'s loop for asyncio (the httpx and aiohttp
integrations use it).

Rejected: a thread per waiting task blocked in throttle_enter() (1,000
tasks, 1,000 threads); polling with throttle_try_enter() alone (measured:
a process of asyncio tasks beside processes blocked in throttle_enter()
got its slots only after theirs, as it held no place in the queue).
With a Redis backend each non-waiting call is a round trip to Redis made
on the loop's thread.
"""

import asyncio
import collections
import threading
from typing import (Any, Awaitable, Callable, Deque, Dict, List, Optional,
                    Sequence, Set, Tuple, Union)

from ._admission import Admission
from ._answers import Classifier, Outcome
from ._base import (_ETIMEDOUT, FOREVER, HAVE_INTERRUPT, Key, Seconds, _key,
                    _klass, _ms, error)
from ._errors import ECANCELED, EINTR, ETIMEDOUT, Error, ThrottleClosed
from ._http import (SENDING, Loop, TransportError, _Done,
                    default_throttle)
from ._throttle import Throttle, _calling

POLL_MIN_S = 0.002
POLL_MAX_S = 0.025
WAIT_SLICE_S = 0.5  # wait(): a clear() elsewhere is seen within this


def _wake(f: "asyncio.Future[None]") -> None:
    if not f.done():
        f.set_result(None)


class AsyncAdmission:
    """An admission made by AsyncThrottle.admit(): Admission's report(),
    leave() and probe, given back on leaving the `async with` block as
    Admission's with block does; requeue() is a coroutine.  Giving it back
    wakes this AsyncThrottle's waiting tasks."""

    def __init__(self, owner: "AsyncThrottle", adm: Admission,
                 klass: str) -> None:
        self._owner = owner
        self._adm = adm
        self._klass = klass
        self.key = adm.key

    @property
    def probe(self) -> bool:
        return self._adm.probe

    @property
    def held(self) -> bool:
        return self._adm.held

    @property
    def outcome(self) -> Optional[Outcome]:
        return self._adm.outcome

    @property
    def admission(self) -> Admission:
        """The underlying (synchronous) Admission."""
        return self._adm

    def report(self, status: int, headers: Any = None, body: Any = b"",
               locked_codes: Optional[Sequence[str]] = None,
               classifier: Optional[Classifier] = None) -> Outcome:
        """As Admission.report() (it does not block)."""
        try:
            return self._adm.report(status, headers, body, locked_codes,
                                    classifier)
        finally:
            self._owner._kick()

    def leave(self, kind: str = "ok",
              retry_after: Optional[Seconds] = None) -> Outcome:
        """As Admission.leave() (it does not block)."""
        try:
            return self._adm.leave(kind, retry_after)
        finally:
            self._owner._kick()

    async def requeue(self, kind: str = "transient",
                      retry_after: Optional[Seconds] = None,
                      timeout: Optional[Seconds] = None) -> "AsyncAdmission":
        """As Admission.requeue(): report a transient outcome as leave()
        does, then wait to send again in this admission's place in the
        key's queue, ahead of everyone who came after it (in a helper
        thread, as admit() waits).  Returns self, admitted again; on an
        error (ETIMEDOUT, cancellation) the admission is over.  (With a
        library without the interrupt hook: at the front of this process's
        queue for the key.)"""
        if HAVE_INTERRUPT:
            adm = self._adm
            try:
                await self._owner._in_thread(
                    lambda: adm.requeue(kind, retry_after, timeout))
            finally:
                self._owner._kick()
            return self
        self.leave(kind, retry_after)
        self._adm = await self._owner._enter(self.key, self._klass, timeout,
                                             front=True)
        return self

    async def __aenter__(self) -> "AsyncAdmission":
        return self

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> None:
        try:
            self._adm.__exit__(et, ev, tb)
        finally:
            self._owner._kick()

    def __repr__(self) -> str:
        return "<AsyncAdmission %r%s%s>" % (
            self.key, " probe" if self.probe else "",
            "" if self.held else " (given back)")


class _Admit:
    """What admit() returns: await it for the AsyncAdmission, or use it as
    `async with t.admit(...) as adm`."""

    def __init__(self, owner: "AsyncThrottle", key: Key, klass: str,
                 timeout: Optional[Seconds]) -> None:
        self._args = (owner, key, klass, timeout)
        self._adm: Optional[AsyncAdmission] = None

    async def _get(self) -> AsyncAdmission:
        owner, key, klass, timeout = self._args
        adm = await owner._enter(key, klass, timeout)
        return AsyncAdmission(owner, adm, klass)

    def __await__(self) -> Any:
        return self._get().__await__()

    async def __aenter__(self) -> AsyncAdmission:
        self._adm = await self._get()
        return self._adm

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> None:
        assert self._adm is not None
        await self._adm.__aexit__(et, ev, tb)


class AsyncThrottle:
    """Throttle for asyncio: AsyncThrottle(throttle=None, **settings)
    wraps a Throttle (made from settings, as Throttle(**settings), when
    none is given; a given one stays the caller's to close).  The calls
    that wait (admit, wait, requeue) never block the event loop (see the
    top of the file); every other call of Throttle is here as a coroutine
    too (they do not wait: a call into shared memory).  Use it from one
    event loop at a time."""

    def __init__(self, throttle: Optional[Throttle] = None,
                 **settings: Any) -> None:
        if throttle is not None and settings:
            raise TypeError("give a Throttle or its settings, not both")
        if throttle is not None and not isinstance(throttle, Throttle):
            raise TypeError("throttle must be a libthrottle.Throttle")
        self._own = throttle is None
        self.throttle: Throttle = throttle if throttle is not None \
            else Throttle(**settings)
        self._queues: Dict[Tuple[bytes, int],
                           Deque["asyncio.Future[None]"]] = {}
        self._sleepers: Set["asyncio.Future[None]"] = set()
        self._stops: Set[threading.Event] = set()  # the helper threads'
        self._canceled: Set["asyncio.Future[None]"] = set()
        self._closed = False

    # -- waiting

    def _kick(self) -> None:
        """Wake every sleeping head: a slot or a pause may have changed."""
        for f in list(self._sleepers):
            _wake(f)

    async def _nap(self, seconds: float) -> None:
        """Sleep on the loop until seconds pass or _kick()."""
        loop = asyncio.get_running_loop()
        f: "asyncio.Future[None]" = loop.create_future()
        self._sleepers.add(f)
        h = loop.call_later(max(0.0, seconds), _wake, f)
        try:
            await f
        finally:
            h.cancel()
            self._sleepers.discard(f)

    def _check_open(self) -> None:
        if self._closed or self.throttle.closed:
            raise ThrottleClosed("the AsyncThrottle was closed")

    async def _enter(self, key: Key, klass: str, timeout: Optional[Seconds],
                     front: bool = False) -> Admission:
        self._check_open()
        k, cls = _key(key), _klass(klass)
        ms = _ms(timeout, "timeout", none_is_forever=True)
        loop = asyncio.get_running_loop()
        deadline = None if ms == FOREVER else loop.time() + ms / 1000.0
        q = self._queues.setdefault((k, cls), collections.deque())
        me: "asyncio.Future[None]" = loop.create_future()
        if front:
            q.appendleft(me)
        else:
            q.append(me)
        try:
            if q[0] is not me:  # wait to be the head (a promotion wakes us)
                while not me.done():
                    self._check_open()
                    left = None if deadline is None else deadline - loop.time()
                    if left is not None and left <= 0:
                        raise error(_ETIMEDOUT, "%s: not admitted within %s s"
                                    % (key, timeout))
                    await asyncio.wait([me], timeout=left)
                if me in self._canceled:
                    raise error(ECANCELED.code, "%s: canceled" % (key,))
            if HAVE_INTERRUPT:
                self._check_open()
                left = None if deadline is None else max(
                    0.0, deadline - loop.time())
                try:
                    return await self._blocking_admit(key, klass, left)
                except ECANCELED:
                    # throttle_cancel() ends every waiter of the key: the
                    # tasks queued behind this one too
                    for f in q:
                        if f is not me:
                            self._canceled.add(f)
                            _wake(f)
                    raise
            poll = POLL_MIN_S
            while True:
                self._check_open()
                adm, hint = self.throttle.try_admit(key, klass, hint=True)
                if adm is not None:
                    return adm
                if hint > 0:
                    delay, poll = hint, POLL_MIN_S
                else:
                    delay, poll = poll, min(poll * 2, POLL_MAX_S)
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0 or (hint > 0 and hint > left):
                        raise error(_ETIMEDOUT, "%s: not admitted within %s s"
                                    % (key, timeout))
                    delay = min(delay, left)
                await self._nap(delay)
        finally:
            self._canceled.discard(me)
            q.remove(me)
            if q:
                _wake(q[0])  # the next task is head now
            else:
                self._queues.pop((k, cls), None)

    async def _blocking_admit(self, key: Key, klass: str,
                              timeout: Optional[float]) -> Admission:
        """Throttle.admit() in a helper thread of its own; cancelling the
        awaiting task stops it (see the top of the file)."""
        t = self.throttle
        return await self._in_thread(
            lambda: t.admit(key, klass, timeout=timeout))

    async def _in_thread(self, call: Callable[[], Admission]) -> Admission:
        """call() (a blocking admission) in a helper thread; the task
        awaits it.  Cancelled, the call is stopped and an admission it
        made anyway is given back."""
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[Admission]" = loop.create_future()
        stop = threading.Event()

        def deliver(adm: Optional[Admission],
                    exc: Optional[BaseException]) -> None:
            if fut.done():  # the task went away: give the place back
                if adm is not None and adm.held:
                    adm.leave("abandoned")
                    self._kick()
            elif exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(adm)

        def work() -> None:
            _calling.stop = stop
            adm: Optional[Admission] = None
            exc: Optional[BaseException] = None
            try:
                adm = call()
            except BaseException as e:  # handed to the task
                exc = e
            finally:
                _calling.stop = None
            try:
                loop.call_soon_threadsafe(deliver, adm, exc)
            except RuntimeError:  # the loop is closed: nobody to give it to
                if adm is not None and adm.held:
                    adm.leave("abandoned")

        self._stops.add(stop)
        threading.Thread(target=work, name="libthrottle-admit",
                         daemon=True).start()
        try:
            return await fut
        except asyncio.CancelledError:
            stop.set()
            raise
        except EINTR:
            if self.closed:  # close() stopped the helper
                raise ThrottleClosed("the AsyncThrottle was closed") from None
            raise
        finally:
            self._stops.discard(stop)

    def admit(self, key: Key, klass: str = "live",
              timeout: Optional[Seconds] = None) -> _Admit:
        """As Throttle.admit(), without blocking the loop: `async with
        t.admit(key) as adm:` or `adm = await t.admit(key)`.  Raises
        ETIMEDOUT (a TimeoutError) when not admitted within timeout
        seconds, ThrottleClosed on close(); cancelling the task gives its
        place up at once."""
        return _Admit(self, key, klass, timeout)

    async def try_admit(self, key: Key, klass: str = "live"
                        ) -> Optional[AsyncAdmission]:
        """As Throttle.try_admit(): admitted now, or None."""
        self._check_open()
        adm = self.throttle.try_admit(key, klass, _any_thread=True)
        return None if adm is None else AsyncAdmission(self, adm, klass)

    async def wait(self, key: Key, timeout: Optional[Seconds] = None) -> bool:
        """As Throttle.wait(): True once key is open; False when it would
        open only after timeout seconds."""
        ms = _ms(timeout, "timeout", none_is_forever=True)
        loop = asyncio.get_running_loop()
        deadline = None if ms == FOREVER else loop.time() + ms / 1000.0
        while True:
            self._check_open()
            left = self.throttle.remaining(key)
            if left <= 0:
                return True
            room = None if deadline is None else deadline - loop.time()
            if room is not None and left > room:
                return False
            await self._nap(min(left, WAIT_SLICE_S))

    def waiting(self, key: Key, klass: str = "live") -> int:
        """Tasks of this AsyncThrottle waiting to be admitted for key."""
        return len(self._queues.get((_key(key), _klass(klass)), ()))

    # -- the rest of Throttle, as coroutines

    async def backoff(self, key: Key, delay: Union[Seconds, str, bytes]
                      ) -> None:
        self.throttle.backoff(key, delay)

    async def remaining(self, key: Key) -> float:
        return self.throttle.remaining(key)

    async def clear(self, key: Key) -> None:
        self.throttle.clear(key)
        self._kick()

    async def reset(self) -> None:
        self.throttle.reset()
        self._kick()

    async def set_max_parallel(self, key: Key, n: Union[int, str]) -> None:
        self.throttle.set_max_parallel(key, n)
        self._kick()

    async def set_max_parallel_auto(self, key: Key, max: int = 0) -> None:
        self.throttle.set_max_parallel_auto(key, max)
        self._kick()

    async def set_rate(self, key: Key, n: int, period: Seconds) -> None:
        self.throttle.set_rate(key, n, period)
        self._kick()

    async def set_backfill_share(self, key: Key, share: float) -> None:
        self.throttle.set_backfill_share(key, share)
        self._kick()

    async def pause(self, key: Key) -> None:
        """As Throttle.pause()."""
        self.throttle.pause(key)

    async def resume(self, key: Key) -> None:
        """As Throttle.resume()."""
        self.throttle.resume(key)
        self._kick()

    async def cancel(self, key: Key) -> None:
        """As Throttle.cancel() (blocking waiters; tasks of an AsyncThrottle
        are ended with task.cancel())."""
        self.throttle.cancel(key)

    async def info(self, key: Key) -> Dict[str, Any]:
        return self.throttle.info(key)

    async def keys(self) -> List[Dict[str, Any]]:
        return self.throttle.keys()

    async def beneath(self, scope: Key) -> Dict[str, int]:
        return self.throttle.beneath(scope)

    async def stats(self) -> Dict[str, int]:
        return self.throttle.stats()

    async def set_publish_level(self, kind: str,
                                level: Union[str, int]) -> None:
        self.throttle.set_publish_level(kind, level)

    async def segment_max_delay(self) -> float:
        """Throttle.segment_max_delay (a property there)."""
        return self.throttle.segment_max_delay

    async def set_segment_max_delay(self, seconds: Seconds) -> None:
        self.throttle.set_segment_max_delay(seconds)

    @property
    def shared(self) -> bool:
        return self.throttle.shared

    @property
    def backend(self) -> str:
        return self.throttle.backend

    @property
    def segment(self) -> str:
        return self.throttle.segment

    @property
    def open_error(self) -> Optional[Error]:
        return self.throttle.open_error

    @property
    def closed(self) -> bool:
        return self._closed or self.throttle.closed

    async def close(self) -> None:
        """End every wait with ThrottleClosed; close the Throttle if this
        AsyncThrottle made it."""
        self._closed = True
        for stop in list(self._stops):
            stop.set()  # each helper's call ends with EINTR
        self._kick()
        for q in self._queues.values():
            for f in q:
                _wake(f)
        if self._own:
            self.throttle.close()

    async def __aenter__(self) -> "AsyncThrottle":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


# ---- the retry loop, for asyncio -------------------------------------------

_default: Optional[AsyncThrottle] = None

# send(seconds left or None) -> awaitable (status, headers, body)
AsyncSender = Callable[[Optional[float]], Awaitable[Tuple[int, Any, bytes]]]


def default_async_throttle() -> AsyncThrottle:
    """The process's shared AsyncThrottle, over default_throttle()."""
    global _default
    t = default_throttle()
    if _default is None or _default.throttle is not t or _default.closed:
        _default = AsyncThrottle(t)
    return _default


async def arun(key: Key, send: AsyncSender,
               throttle: Optional[AsyncThrottle] = None, retries: int = 10,
               timeout: Optional[Seconds] = 300, klass: str = "live",
               locked_codes: Optional[Sequence[str]] = None,
               give_up: bool = True, classifier: Optional[Classifier] = None
               ) -> Tuple[Any, Any, bytes, Outcome, int]:
    """libthrottle.run() for asyncio: the same loop (_http.Loop) with
    AsyncThrottle's admissions, an awaited send(seconds_left) and
    asyncio.sleep() for the local back-off."""
    at = throttle if throttle is not None else default_async_throttle()
    if not isinstance(at, AsyncThrottle):
        raise TypeError("throttle must be a libthrottle.AsyncThrottle")
    loop = Loop(key, at, retries, timeout, klass, locked_codes, give_up,
                classifier)
    try:
        while True:
            adm: Optional[AsyncAdmission] = None
            if loop.gate:
                try:
                    adm = await at.admit(key, klass, timeout=loop.left())
                except Error as e:
                    loop.not_admitted(e, at.throttle.remaining(key)
                                      if isinstance(e, ETIMEDOUT) else 0.0)
            if adm is not None:
                async with adm:
                    await _attempt(loop, adm, send)
            else:
                await _attempt(loop, None, send)
            delay = loop.next(adm)
            if delay > 0:
                await asyncio.sleep(delay)
    except _Done as d:
        return d.result


async def _attempt(loop: Loop, adm: Optional[AsyncAdmission],
                   send: AsyncSender) -> None:
    sending = SENDING.set(True)
    try:
        answer = await send(loop.send_timeout())
    except TransportError as e:
        loop.no_answer(adm, e)
    else:
        loop.sent(adm, answer)
    finally:
        SENDING.reset(sending)
