# SPDX-License-Identifier: MIT
"""_throttle.py — the Pythonic layer over the C API: Throttle, a handle
(throttle_open) and its calls, named after the C functions; admit() makes
the Admissions of _admission.py.

Arguments are checked (_base.py) before they reach C; answers are read
by the C library's rules (_answers.py).

Interrupting a blocking call.  ctypes releases the GIL around a C call,
and Python runs signal handlers (KeyboardInterrupt) only between bytecodes
of the main thread, so a thread blocked in throttle_wait() or
throttle_enter() cannot be interrupted by Ctrl-C.  When the library has
throttle_config_set_interrupt(), the wait calls back into Python every
INTERRUPT_PERIOD_MS; a pending signal then runs its handler inside the
callback, whose exception is kept, the callback returns 1, the C call
gives up its queue place and returns THROTTLE_EINTR, and the exception is
raised again here.  The callback is a generator's send(): a plain function
would meet the signal on its very first instruction, before any try block,
and ctypes would print the KeyboardInterrupt and drop it; a resumed
generator meets it inside its try.  A generator may run in one thread at a
time, so the main thread (the only one that runs signal handlers) blocks on
a handle of its own, opened on first use; other threads block on the main
handle, whose callback only checks whether the Throttle was closed.
Without the hook (an older library), blocking calls are made in slices of
SLICE_MS: throttle_wait() and throttle_enter() with short timeouts, and
short sleeps in Python between them.  The cost: a caller that gives up a
slice leaves the FIFO queue of the key and joins it again at the back.

Fork.  The handle's mapping is shared with fork() children; locks are made
new in the child (os.register_at_fork), admissions are per process (a
child cannot report its parent's admission).  With Redis as the backend
the child's copy of the handle is its own (no heartbeat, none of the
parent's connections, until its first call: include/throttle.h, fork), so
the child's main-thread handle closed at the fork returns at once.  A Throttle pickled for a
spawned process (multiprocessing "spawn") opens the same segment again with
the same settings in the child.
"""

import ctypes
import numbers
import os
import signal
import threading
import time
import warnings
import weakref
from typing import (TYPE_CHECKING, Any, Dict, List, Mapping, Optional,
                    Tuple, Union, overload)

if TYPE_CHECKING:
    from typing import Literal

from . import _capi
from ._admission import Admission
from ._answers import parse_retry_after
from ._base import (_GROUP_SHARED, _NO_CREATE, _NO_FALLBACK, FOREVER,
                    HAVE_INTERRUPT, INTERRUPT_PERIOD_MS, OUTCOMES, SLICE_MS,
                    UINT32_MAX, _EINTR, _ETIMEDOUT, _EWOULDBLOCK, _core,
                    _BY_NAME, Key, Seconds, _invalid, _key, _klass, _ms,
                    _text, _uint, error)
from ._errors import Error, ThrottleClosed


# ---- the handle -----------------------------------------------------------------

_live = weakref.WeakSet()  # every open Throttle, for fork
# per thread: .stop, a threading.Event that ends the thread's blocking
# call within INTERRUPT_PERIOD_MS when set (AsyncThrottle's helper
# threads; see _async.py)
_calling = threading.local()


def _after_fork_in_child():
    for t in list(_live):
        t._lock = threading.Lock()
        t._busy = 0
        t._pid = os.getpid()
        if t._main is not None:
            # the main-thread handle's generator may have been running in
            # another thread of the parent: close this copy (it unmaps the
            # child's mapping only) and open a new one on first use
            _core.throttle_close(t._main.ptr)
            t._main = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

if HAVE_INTERRUPT:
    _CHECK = _capi.ctype_of("int ( * ) ( void * )")


class _Handle:
    """One throttle_t and the callback that keeps it interruptible."""

    __slots__ = ("ptr", "check", "gen", "shared", "__weakref__")

    def __init__(self, ptr, check, gen):
        self.ptr, self.check, self.gen = ptr, check, gen
        self.shared = bool(_core.throttle_is_shared(ptr))


def _signal_checker(owner_ref):
    """The main thread's interrupt callback, as a generator (see the top of
    the file): yields 1 to abandon the wait, 0 to go on."""
    result = 0
    while True:
        try:
            yield result
            # run the handlers of pending signals now, inside the try,
            # whatever bytecode the interpreter checks them at:
            # pthread_sigmask calls PyErr_CheckSignals()
            signal.pthread_sigmask(signal.SIG_BLOCK, ())
            owner = owner_ref()
            result = 1 if owner is None or owner._closed else 0
        except GeneratorExit:
            return
        except BaseException as e:  # KeyboardInterrupt, SystemExit, ...
            owner = owner_ref()
            if owner is not None:
                owner._pending = e
            result = 1


_LEVELS = {"key": 0, "root": -1}


def _publish_level(kind, level):
    """(outcome, level) for one entry of publish={kind: level}."""
    if kind not in ("locked", "rate_limited", "unavailable"):
        raise _invalid("publish: %r is not locked, rate_limited or "
                       "unavailable" % (kind,))
    if isinstance(level, str) and level in _LEVELS:
        return OUTCOMES[kind], _LEVELS[level]
    if isinstance(level, int) and not isinstance(level, bool) \
            and 1 <= level <= 255:
        return OUTCOMES[kind], level
    raise _invalid("publish: level %r for %s is not \"key\", "
                   "\"root\" or 1 to 255" % (level, kind))


def _publish_levels(publish):
    """[(outcome, level)] from Throttle(publish={kind: level})."""
    if publish is None:
        return []
    if not isinstance(publish, dict):
        raise TypeError("publish must be a dict, not %s"
                        % type(publish).__name__)
    return [_publish_level(kind, level) for kind, level in publish.items()]


class Throttle:
    """A handle on a libthrottle segment (throttle_open).

    Throttle(segment=None, max_delay=None, *, keys=None, lock_timeout=None,
             lease=None, group_shared=False, no_fallback=False,
             no_create=False, publish=None, backend=None)

    Unset settings come from the environment (THROTTLE_SEGMENT, ...) and
    then the library's defaults; times are in seconds.  When the segment
    cannot be used, the Throttle still works on process-private memory
    (fail open): .shared is False, .open_error says why, and a
    FallbackWarning is issued; no_fallback=True raises instead.  A
    backend that cannot be reached when the Throttle is made (Redis down)
    gives a FallbackWarning too, and .open_error is an EBACKEND naming the
    cause: the host's segment serves until Redis answers again.  Use it as a
    context manager, or call close().  publish says where a reported
    back-off goes, per kind: {"locked": "key", "rate_limited": "root",
    "unavailable": "root"} is the default (a table's lock is the table's,
    a 429 or 503 the workspace's); a level is "key", "root" or N (the key's
    first N parts).  backend shares keys across hosts:
    "redis://[:PASSWORD@]HOST[:PORT][/DB]", "unix:///PATH/redis.sock[?db=N]"
    or "shm" (default: $THROTTLE_BACKEND, else "shm"); while Redis cannot
    be reached the host's segment serves.  One Throttle may be shared by
    threads, and by processes forked after it was made."""

    def __init__(self, segment: Optional[Union[str, bytes]] = None,
                 max_delay: Optional[Seconds] = None, *,
                 keys: Optional[int] = None,
                 lock_timeout: Optional[Seconds] = None,
                 lease: Optional[Seconds] = None, group_shared: bool = False,
                 no_fallback: bool = False, no_create: bool = False,
                 publish: Optional[Mapping[str, Union[str, int]]] = None,
                 backend: Optional[Union[str, bytes]] = None) -> None:
        self._publish = _publish_levels(publish)  # checks every value
        self._settings = dict(segment=segment, max_delay=max_delay, keys=keys,
                              lock_timeout=lock_timeout, lease=lease,
                              group_shared=group_shared,
                              no_fallback=no_fallback, no_create=no_create,
                              publish=dict(publish or {}), backend=backend)
        self._closed = False
        self._lock = threading.Lock()
        self._busy = 0
        self._pid = os.getpid()
        self._main = None
        self._pending = None
        self._h = None
        self._cfg = self._config(**{k: v for k, v in self._settings.items()
                                    if k != "publish"})  # checks each value
        try:
            self._h, rc, msg = self._open(interruptible=False)
        except BaseException:
            _core.throttle_config_free(self._cfg)
            self._cfg = None
            raise
        self.open_error: Optional[Error] = error(rc, msg) if rc != 0 \
            else None
        if rc == 0 and self.backend != "shm":
            msg = self._backend_reached()
            if msg:
                self.open_error = _BY_NAME["EBACKEND"](msg)
        if self.open_error is not None:
            # a refused or unreachable backend leaves the segment working
            warnings.warn(FallbackWarning("libthrottle: %s; continuing %s" % (
                self.open_error, "on this host's segment alone"
                if self.shared else "with process-private back-off")),
                stacklevel=2)
        _live.add(self)

    def _backend_reached(self) -> str:
        """"" when the backend answers a read, else why not: opening does
        not connect, so a Redis that cannot be reached would be seen only
        by the first call (served by the segment, silently)."""
        left = ctypes.c_uint64()
        h = self._h
        rc = _core.throttle_remaining(h.ptr, b"libthrottle:reach",
                                      ctypes.byref(left))
        msg = _text(_core.throttle_errmsg(h.ptr))
        if rc != 0 and not msg:
            msg = _text(_core.throttle_strerror(rc))
        # the message names the URL as given: show it as .backend does,
        # its password hidden
        url = self._settings["backend"] or os.environ.get("THROTTLE_BACKEND")
        if url:
            if isinstance(url, bytes):
                url = url.decode("utf-8", "replace")
            msg = msg.replace(url, self.backend)
        return msg

    # -- opening and closing

    @staticmethod
    def _config(segment, max_delay, keys, lock_timeout, lease, group_shared,
                no_fallback, no_create, backend):
        cfg = _core.throttle_config_new()
        if not cfg:
            raise MemoryError("throttle_config_new")
        try:
            def setting(rc, what, value):
                if rc != 0:
                    raise error(rc, "%s: %r: %s" % (
                        what, value, _text(_core.throttle_strerror(rc))))
            if segment is not None:
                setting(_core.throttle_config_set_segment(
                    cfg, _cstring(segment, "segment")), "segment", segment)
            if backend is not None:
                setting(_core.throttle_config_set_backend(
                    cfg, _cstring(backend, "backend")), "backend", backend)
            if max_delay is not None:
                setting(_core.throttle_config_set_max_delay(
                    cfg, _ms(max_delay, "max_delay")), "max_delay", max_delay)
            if keys is not None:
                setting(_core.throttle_config_set_capacity(
                    cfg, _uint(keys, "keys", UINT32_MAX)), "keys", keys)
            if lock_timeout is not None:
                setting(_core.throttle_config_set_lock_timeout(
                    cfg, _ms(lock_timeout, "lock_timeout", top=UINT32_MAX)),
                    "lock_timeout", lock_timeout)
            if lease is not None:
                setting(_core.throttle_config_set_lease(
                    cfg, _ms(lease, "lease", top=UINT32_MAX)), "lease", lease)
            flags = ((_GROUP_SHARED if group_shared else 0) |
                     (_NO_FALLBACK if no_fallback else 0) |
                     (_NO_CREATE if no_create else 0))
            setting(_core.throttle_config_set_flags(cfg, flags), "flags", flags)
        except BaseException:
            _core.throttle_config_free(cfg)
            raise
        return cfg

    def _open(self, interruptible):
        """(handle, rc, message): a handle whose interrupt callback is the
        signal checker (the main thread's) or the closed check (others)."""
        check = gen = None
        if HAVE_INTERRUPT:
            ref = weakref.ref(self)
            if interruptible:
                gen = _signal_checker(ref)
                next(gen)
                check = _CHECK(gen.send)
            else:
                def closed(_arg, ref=ref):
                    owner = ref()
                    if owner is None or owner._closed:
                        return 1
                    # a call made for an asyncio task that was cancelled
                    stop = getattr(_calling, "stop", None)
                    return 1 if stop is not None and stop.is_set() else 0
                check = _CHECK(closed)
            rc = _core.throttle_config_set_interrupt(
                self._cfg, check, None, INTERRUPT_PERIOD_MS)
            if rc != 0:
                raise error(rc)
        out = ctypes.c_void_p()
        rc = _core.throttle_open(self._cfg, ctypes.byref(out))
        if not out.value:
            raise error(rc, _text(_core.throttle_errmsg(None)))
        msg = _text(_core.throttle_errmsg(out)) if rc != 0 else ""
        for outcome, level in self._publish:
            prc = _core.throttle_set_publish_level(out, outcome, level)
            if prc != 0:
                _core.throttle_close(out)
                raise error(prc, "publish level %d for outcome %d"
                            % (level, outcome))
        return _Handle(out.value, check, gen), rc, msg

    def close(self) -> None:
        """Close the Throttle: no new calls.  Blocking calls of other
        threads end with EINVAL; the C handle is freed once the calls in
        progress have returned and the admissions still held have been
        given back.  Closing twice is allowed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            free = self._busy == 0
        if free:
            self._free()

    def _free(self):
        for h in (self._main, self._h):
            if h is not None and os.getpid() == self._pid:
                _core.throttle_close(h.ptr)
        self._main = self._h = None
        if self._cfg is not None:
            _core.throttle_config_free(self._cfg)
            self._cfg = None
        _live.discard(self)

    def __del__(self):
        if getattr(self, "_h", None) is not None:
            try:
                self.close()
            except Exception:
                pass

    def __enter__(self) -> "Throttle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __reduce__(self):
        # multiprocessing "spawn": the child opens the same segment anew,
        # by the name this handle resolved (not the child's environment)
        settings = dict(self._settings)
        if self.shared:
            settings["segment"] = self.segment
        return (_reopen, (settings,))

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self):
        if self._closed:
            return "<libthrottle.Throttle (closed)>"
        return "<libthrottle.Throttle %s%s>" % (
            self.segment, "" if self.shared else " (private memory)")

    # -- calls

    def _use(self, blocking=False):
        """Mark a call in progress and choose the handle it runs on."""
        with self._lock:
            if self._closed:
                raise ThrottleClosed("operation on a closed Throttle")
            self._busy += 1
            h = self._h
            if (blocking and HAVE_INTERRUPT and h.shared and
                    threading.current_thread() is threading.main_thread()):
                if self._main is None:
                    try:
                        main, rc, _ = self._open(interruptible=True)
                        if rc != 0:  # unusable now: keep to the one handle
                            _core.throttle_close(main.ptr)
                        else:
                            self._main = main
                    except Error:
                        pass
                if self._main is not None:
                    h = self._main
            return h

    def _busy_add(self):
        """An admission keeps the handle it was made on from being freed."""
        with self._lock:
            self._busy += 1

    def _done(self):
        with self._lock:
            self._busy -= 1
            free = self._closed and self._busy == 0
        if free:
            self._free()

    def _call(self, fn, *args):
        """fn(handle, *args) -> 0, or raise its Error with the message."""
        h = self._use()
        try:
            rc = fn(h.ptr, *args)
            if rc != 0:
                raise error(rc, _text(_core.throttle_errmsg(h.ptr)))
        finally:
            self._done()

    def _blocking(self, fn, *args, key=None):
        """fn(handle, *args) for a call that may block: (rc, message,
        Admission or None).  With key, fn is throttle_enter() and gets a
        ticket out pointer as its last argument; a granted ticket becomes an
        Admission here, so that an exception arriving just after the call
        returned (a signal is checked as soon as a call returns) cannot
        lose it: it is given back instead.  Re-raises what interrupted the
        wait."""
        h = self._use(blocking=True)
        ticket = ctypes.c_void_p() if key is not None else None
        if ticket is not None:
            args += (ctypes.byref(ticket),)
        adm = None
        try:
            if h.gen is not None:  # the main thread's handle
                self._pending = None
            rc = fn(h.ptr, *args)
            if key is not None and ticket.value:
                adm = Admission(self, h, ticket.value, key)
            msg = _text(_core.throttle_errmsg(h.ptr)) if rc != 0 else ""
            if h.gen is not None and self._pending is not None:
                exc, self._pending = self._pending, None
                raise exc
            if rc != 0 and rc == _EINTR and self._closed:
                raise ThrottleClosed("the Throttle was closed during the call")
            return rc, msg, adm
        except BaseException:
            if adm is not None:
                adm._leave("abandoned", None)
            elif ticket is not None and ticket.value:
                _core.throttle_leave(h.ptr, ticket, OUTCOMES["abandoned"], 0)
            raise
        finally:
            self._done()

    @property
    def shared(self) -> bool:
        """True when the segment is shared; False on private memory."""
        return self._h is not None and self._h.shared

    def _string(self, fn):
        """fn(handle): a string the handle owns, as str."""
        h = self._use()
        try:
            return _text(fn(h.ptr))
        finally:
            self._done()

    @property
    def backend(self) -> str:
        """What keys are shared through: "shm" (this host's segment), or
        the Redis URL with any password shown as "***"."""
        return self._string(_core.throttle_backend)

    def set_publish_level(self, kind: str, level: Union[str, int]) -> None:
        """Where this Throttle publishes a reported back-off of kind
        ("locked", "rate_limited", "unavailable"): "key", "root" or N (the
        key's first N parts), as Throttle(publish=...).  Per Throttle,
        not shared with other processes."""
        outcome, n = _publish_level(kind, level)
        with self._lock:
            if self._closed:
                raise ThrottleClosed("operation on a closed Throttle")
            handles = [h for h in (self._h, self._main) if h is not None]
            for h in handles:
                rc = _core.throttle_set_publish_level(h.ptr, outcome, n)
                if rc != 0:
                    raise error(rc, _text(_core.throttle_errmsg(h.ptr)))
            # for a main-thread handle opened later, and a spawned child
            self._publish = [p for p in self._publish if p[0] != outcome]
            self._publish.append((outcome, n))
            self._settings["publish"][kind] = level

    @property
    def segment(self) -> str:
        return self._string(_core.throttle_segment_name)

    # -- back-off

    def backoff(self, key: Key, delay: Union[Seconds, str, bytes]) -> None:
        """Publish "key: not before now + delay".  delay: seconds (int or
        float), or a Retry-After value (delta-seconds or an HTTP-date)."""
        k = _key(key)
        if isinstance(delay, (str, bytes)):
            secs = parse_retry_after(delay)
            if secs is None:
                raise _invalid("not a Retry-After value: %r" % (delay,))
            ms = _ms(secs, "delay")
        else:
            ms = _ms(delay, "delay")
        self._call(_core.throttle_backoff, k, ms)

    def remaining(self, key: Key) -> float:
        """Seconds until key's back-off passes (0.0 when open)."""
        k = _key(key)
        left = ctypes.c_uint64()
        self._call(_core.throttle_remaining, k, ctypes.byref(left))
        return left.value / 1000.0

    def wait(self, key: Key, timeout: Optional[Seconds] = None) -> bool:
        """Block until key is open: True; False when it would open only
        after timeout seconds (None: as long as it takes).  Ctrl-C and
        signal handlers run within about 100 ms."""
        k = _key(key)
        ms = _ms(timeout, "timeout", none_is_forever=True)
        if HAVE_INTERRUPT:
            rc, msg, _ = self._blocking(_core.throttle_wait, k, ms)
            if rc == _ETIMEDOUT:
                return False
            if rc != 0:
                raise error(rc, msg)
            return True
        deadline = None if ms == FOREVER else time.monotonic() + ms / 1000.0
        if deadline is not None and self.remaining(key) * 1000 > ms:
            return False
        while True:
            left = SLICE_MS if deadline is None else min(
                SLICE_MS, max(0, int((deadline - time.monotonic()) * 1000)))
            rc, msg, _ = self._blocking(_core.throttle_wait, k, left)
            if rc == 0:
                return True
            if rc != _ETIMEDOUT:
                raise error(rc, msg)
            if deadline is not None and time.monotonic() >= deadline:
                return False
            _nap(min(self.remaining(key), SLICE_MS / 1000.0), deadline)

    def clear(self, key: Key) -> None:
        """Drop key's back-off and wake its waiters (ENOKEY: never seen)."""
        self._call(_core.throttle_clear, _key(key))

    def reset(self) -> None:
        """Drop every key's back-off."""
        self._call(_core.throttle_reset)

    # -- admission

    def admit(self, key: Key, klass: str = "live",
              timeout: Optional[Seconds] = None) -> Admission:
        """Block until a request for key may be sent (not-before passed,
        one probe per lock episode, a free slot under the cap, first come
        first served, live before backfill) and return the Admission, a
        context manager.  Raises ETIMEDOUT (also a TimeoutError) when not
        admitted within timeout seconds, ECANCELED on throttle_cancel().
        Ctrl-C gives the queue place up and raises KeyboardInterrupt."""
        k = _key(key)
        cls = _klass(klass)
        ms = _ms(timeout, "timeout", none_is_forever=True)
        if HAVE_INTERRUPT:
            rc, msg, adm = self._blocking(_core.throttle_enter, k, cls, ms,
                                          key=key)
            if rc != 0:
                raise error(rc, msg)
            return adm
        deadline = None if ms == FOREVER else time.monotonic() + ms / 1000.0
        while True:
            left = SLICE_MS if deadline is None else min(
                SLICE_MS, max(0, int((deadline - time.monotonic()) * 1000)))
            rc, msg, adm = self._blocking(_core.throttle_enter, k, cls,
                                          left, key=key)
            if rc == 0:
                return adm
            if rc != _ETIMEDOUT:
                raise error(rc, msg)
            if deadline is not None and time.monotonic() >= deadline:
                raise error(rc, "%s: not admitted within %s s"
                            % (key, timeout))
            _nap(min(self.remaining(key), SLICE_MS / 1000.0), deadline)

    @overload
    def try_admit(self, key: Key, klass: str = "live") -> Optional[Admission]:
        ...

    @overload
    def try_admit(self, key: Key, klass: str = "live", *,
                  hint: "Literal[True]") -> Tuple[Optional[Admission], float]:
        ...

    def try_admit(self, key: Key, klass: str = "live", *,
                  hint: bool = False, _any_thread: bool = False) -> Any:
        """Admit at once, or return None (not admitted now).  With
        hint=True, (Admission or None, seconds): the library's hint of how
        long to wait before trying again (throttle_try_enter()'s wait_ms:
        the back-off or rate left; 0.0 when the wait is for a slot, which
        comes when a holder leaves)."""
        k = _key(key)
        cls = _klass(klass)
        ticket = ctypes.c_void_p()
        wait_ms = ctypes.c_uint64()
        # the main thread's admissions live on its interruptible handle,
        # where a later requeue() can be interrupted (_any_thread: on the
        # handle of the other threads, which may requeue it: AsyncThrottle)
        h = self._use(blocking=not _any_thread)
        try:
            rc = _core.throttle_try_enter(h.ptr, k, cls, ctypes.byref(ticket),
                                          ctypes.byref(wait_ms))
            if rc == _EWOULDBLOCK:
                return (None, wait_ms.value / 1000.0) if hint else None
            if rc != 0:
                raise error(rc, _text(_core.throttle_errmsg(h.ptr)))
            adm = Admission(self, h, ticket.value, key)
            return (adm, 0.0) if hint else adm
        finally:
            self._done()

    # -- key settings

    def set_max_parallel(self, key: Key, n: Union[int, str]) -> None:
        """Cap concurrent admissions of key at n (1 to 32), or "auto" / 0
        to learn the cap from the server's lock answers."""
        if n == "auto":
            n = 0
        self._call(_core.throttle_set_max_parallel, _key(key),
                   _uint(n, "n", UINT32_MAX))

    def set_max_parallel_auto(self, key: Key, max: int = 0) -> None:
        """Learn key's cap from the server's answers, never above max
        (1 to 32; 0: no bound but the library's 32)."""
        self._call(_core.throttle_set_max_parallel_auto, _key(key),
                   _uint(max, "max", UINT32_MAX))

    def set_rate(self, key: Key, n: int, period: Seconds) -> None:
        """At most n admissions per period seconds (n = 0: no rate)."""
        self._call(_core.throttle_set_rate, _key(key),
                   _uint(n, "n", UINT32_MAX), _ms(period, "period"))

    def set_backfill_share(self, key: Key, share: float) -> None:
        """Backfill may hold at most share (0.0 to 1.0) of the cap."""
        if isinstance(share, bool) or not isinstance(share, numbers.Real):
            raise TypeError("share must be a number")
        self._call(_core.throttle_set_backfill_share, _key(key), float(share))

    def pause(self, key: Key) -> None:
        """Hold new admissions of key (a scope: of every key beneath it),
        for every process, until resume(): callers of admit() wait (their
        timeout still runs), admissions already held finish and report as
        usual.  Back-off (wait(), remaining()) is not affected."""
        self._call(_core.throttle_pause, _key(key))

    def resume(self, key: Key) -> None:
        """End a pause(): the waiters of key are admitted again in their
        order (first come, first served, live before backfill)."""
        self._call(_core.throttle_resume, _key(key))

    def cancel(self, key: Key) -> None:
        """End every current waiter of key with ECANCELED."""
        self._call(_core.throttle_cancel, _key(key))

    @property
    def segment_max_delay(self) -> float:
        """The segment's maximum delay in seconds: the longest back-off any
        process may publish (this process honours at most its own
        max_delay)."""
        ms = ctypes.c_uint64()
        self._call(_core.throttle_segment_max_delay, ctypes.byref(ms))
        return ms.value / 1000.0

    def set_segment_max_delay(self, seconds: Seconds) -> None:
        """Change the segment's maximum delay, for every process."""
        self._call(_core.throttle_set_segment_max_delay,
                   _ms(seconds, "seconds"))

    # -- inspection

    def info(self, key: Key) -> Dict[str, Any]:
        """A snapshot of one key: a dict with the fields of
        throttle_field_name() ("remaining_ms", "in_flight", "cap", ...),
        "key", "key_bytes" (its exact bytes: a key that is not UTF-8 has
        U+FFFD for such bytes in "key", and only "key_bytes" names it),
        "scope" (the key's own scope: its prefix at the last '/', or
        None), "holders" (pid, age_ms, klass, probe, and host: "" on
        the segment, the holder's host on Redis) and "waiters" (the same
        but probe, in arrival order, the first 32).  A scope's snapshot is
        its own record (its back-off, pause, pool cap and in_flight);
        beneath() sums its keys.  ENOKEY when nothing was ever set or
        published on it."""
        out = ctypes.c_void_p()
        self._call(_core.throttle_info, _key(key), ctypes.byref(out))
        try:
            return _snapshot(out.value)
        finally:
            _core.throttle_info_free(out)

    def keys(self) -> List[Dict[str, Any]]:
        """Snapshots (as info()) of every key, in key order."""
        found, failure = [], []

        def each(info, _arg):
            try:
                found.append(_snapshot(info))
                return 0
            except BaseException as e:  # never let it cross into C
                failure.append(e)
                return 1

        cb = _capi.ctype_of("int ( * ) ( const throttle_info_t * , void * )")(
            each)
        h = self._use()
        try:
            rc = _core.throttle_foreach(h.ptr, cb, None)
            if failure:
                raise failure[0]
            if rc != 0:
                raise error(rc, _text(_core.throttle_errmsg(h.ptr)))
        finally:
            self._done()
        return found

    def beneath(self, scope: Key) -> Dict[str, int]:
        """What the keys beneath scope do, as `throttlectl show SCOPE`:
        {"keys": n, "in_flight": n, "waiting": n} summed over every key
        whose name starts with scope + "/"."""
        prefix = _key(scope) + b"/"  # bytes: two scopes not UTF-8 differ
        out = {"keys": 0, "in_flight": 0, "waiting": 0}
        for k in self.keys():
            if k["key_bytes"].startswith(prefix):
                out["keys"] += 1
                out["in_flight"] += k["in_flight"]
                out["waiting"] += k["waiting_live"] + k["waiting_backfill"]
        return out

    def stats(self) -> Dict[str, int]:
        """Segment-wide figures: capacity, used, evictions, repairs."""
        v = [ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_uint64(),
             ctypes.c_uint64()]
        self._call(_core.throttle_stats, *[ctypes.byref(x) for x in v])
        return dict(zip(("capacity", "used", "evictions", "repairs"),
                        (x.value for x in v)))


class FallbackWarning(RuntimeWarning):
    """The segment (back-off then holds within this process only) or the
    backend (then within this host only) could not be used.  The message
    names the cause and the fix."""


def _reopen(settings):
    return Throttle(**settings)


def _nap(seconds, deadline):
    """Sleep at most seconds (and not past deadline), in Python, so that
    signal handlers run."""
    if deadline is not None:
        seconds = min(seconds, deadline - time.monotonic())
    if seconds > 0:
        time.sleep(seconds)


def _cstring(value, what):
    """A str or bytes setting as the C string it is (no NUL inside)."""
    if not isinstance(value, (str, bytes)):
        raise TypeError("%s must be str or bytes, not %s"
                        % (what, type(value).__name__))
    raw = value.encode() if isinstance(value, str) else value
    if b"\0" in raw:
        raise _invalid("%s %r contains a NUL byte" % (what, value))
    return raw


_FIELDS = []
while True:
    _field = _core.throttle_field_name(len(_FIELDS))
    if _field is None:
        break
    _FIELDS.append(_text(_field))


def _snapshot(info):
    raw = _core.throttle_info_key(info)
    key = _text(raw)
    # the key's own scope, its prefix at the last '/' (as throttlectl's JSON);
    # key_bytes names it exactly when it is not UTF-8 (key then has U+FFFD)
    d = {"key": key, "key_bytes": bytes(raw or b""),
         "scope": key.rpartition("/")[0] or None}
    for i, name in enumerate(_FIELDS):
        d[name] = _core.throttle_info_get(info, i)
    holders = []
    pid, age = ctypes.c_int64(), ctypes.c_int64()
    cls, probe = ctypes.c_int(), ctypes.c_int()
    while _core.throttle_info_holder(info, len(holders), ctypes.byref(pid),
                                     ctypes.byref(age), ctypes.byref(cls),
                                     ctypes.byref(probe)) == 0:
        holders.append({"pid": pid.value, "age_ms": age.value,
                        "klass": "backfill" if cls.value else "live",
                        "probe": bool(probe.value),
                        "host": _text(_core.throttle_info_holder_host(
                            info, len(holders)))})
    d["holders"] = holders
    waiters = []
    while _core.throttle_info_waiter(info, len(waiters), ctypes.byref(pid),
                                     ctypes.byref(age),
                                     ctypes.byref(cls)) == 0:
        waiters.append({"pid": pid.value, "age_ms": age.value,
                        "klass": "backfill" if cls.value else "live",
                        "host": _text(_core.throttle_info_waiter_host(
                            info, len(waiters)))})
    d["waiters"] = waiters
    return d
