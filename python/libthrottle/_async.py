# SPDX-License-Identifier: MIT
"""_async.py — AsyncThrottle: Throttle's calls as coroutines for asyncio,
with waiting that never blocks the event loop and takes no thread.

    t = libthrottle.AsyncThrottle()
    async with t.admit("hotdata:ws1/orders", timeout=30) as adm:
        status, headers, body = await send()
        adm.report(status, headers, body)
    await t.wait("hotdata:ws1/orders", timeout=10)

How a task waits.  A blocking throttle_enter() would hold the loop (or a
thread per waiter).  Instead the tasks of one AsyncThrottle that wait for
the same key and class form a FIFO queue in the process; only its head
asks the library, with the non-blocking throttle_try_enter(), and sleeps
on the loop (call_later) for the wait the library hints (the back-off or
rate left), or, when the wait is for a slot (hint 0), for POLL_MIN_S
doubling to POLL_MAX_S.  An admission of this AsyncThrottle given back
wakes every sleeping head at once, so a slot passes between the tasks of
one process with no delay; a slot given back by another process is seen
within POLL_MAX_S.  When the head is admitted the next task becomes head.
So the library is asked at most 1 / POLL_MIN_S times a second per waiting
key, whatever the number of waiting tasks, and a call takes microseconds
(no mutex is held between calls: a waiting task holds nothing, I4).

Cancelling a waiting task (task.cancel(), asyncio.timeout, wait_for) takes
it out of the queue at once and makes the next task head; nothing of it is
left in the library, which never saw it.  close() ends every wait with
ThrottleClosed.

arun() is libthrottle.run()'s loop for asyncio (the httpx and aiohttp
integrations use it).

Costs, and what was rejected.  The queue places of a process's tasks are
its own: in the key's FIFO queue across processes, a process that blocks
in throttle_enter() holds a place, and a polling head takes the slot only
when the library would give it to a new caller (after the older blocking
waiters) — first come, first served holds within the process and between
AsyncThrottles, and blocking waiters of other processes may go first.
throttle_cancel() ends blocking waiters; polling heads do not see it (use
task.cancel()).  Rejected: a thread per waiting task blocked in
throttle_enter() (1,000 tasks, 1,000 threads), and one helper thread
blocked for the head of each key (a cancelled head would hold its place
in the library until its interrupt check ran, up to 50 ms later; the
thread, not the loop, would own the queue place).  With a Redis backend
each call is a round trip to Redis made on the loop's thread.
"""

import asyncio
import collections
from typing import (Any, Awaitable, Callable, Deque, Dict, List, Optional,
                    Sequence, Set, Tuple, Union)

from ._admission import Admission
from ._answers import Classifier, Outcome
from ._base import (_ETIMEDOUT, FOREVER, Key, Seconds, _key, _klass, _ms,
                    error)
from ._errors import ETIMEDOUT, Error, ThrottleClosed
from ._http import Loop, TransportError, _Done, default_throttle
from ._throttle import Throttle

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
        """Report a transient outcome as leave() does, then wait to send
        again at the front of this process's queue for the key (ahead of
        its tasks that came later).  Returns self, admitted again; on an
        error (ETIMEDOUT, cancellation) the admission is over."""
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
            q.remove(me)
            if q:
                _wake(q[0])  # the next task is head now
            else:
                self._queues.pop((k, cls), None)

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
        adm = self.throttle.try_admit(key, klass)
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
    try:
        answer = await send(loop.send_timeout())
    except TransportError as e:
        loop.no_answer(adm, e)
    else:
        loop.sent(adm, answer)
