# SPDX-License-Identifier: MIT
"""_admission.py — Admission, one throttle_enter() until its
throttle_leave(): given back exactly once, by report() (an HTTP answer
classified by the C rules), leave() (an outcome by name), or the end of a
with block; requeue() (throttle_requeue) reports and waits again in the
same place.  Kept apart from the handle (_throttle.py), which makes them.

requeue() blocks on the handle the admission was made on (its ticket is
that handle's): when that is the main thread's interruptible handle, only
the main thread may requeue it, since that handle's interrupt callback is
a generator, which runs in one thread at a time.
"""

import ctypes
import os
import threading
import warnings
from typing import Any, Optional, Sequence

from ._answers import Classifier, Outcome, outcome_of
from ._base import OUTCOMES, _EINTR, _ESTALE, Seconds, _core, _invalid, \
    _ms, _number, _text, error
from ._errors import Error, ThrottleClosed


class StaleAdmissionWarning(RuntimeWarning):
    """An admission was reported after the library had taken it back from
    a holder that looked hung (its lease lapsed)."""


class Admission:
    """An admission (throttle_enter), given back exactly once: by
    report() (an HTTP answer), leave() (an outcome by name), or on leaving
    the with block: as "transient" (FAILED) when an exception left it, as
    "abandoned" when nothing was reported.  .probe is True for the probe
    of a lock episode.  Belongs to the process that made it."""

    def __init__(self, owner: Any, handle: Any, ticket: int,
                 key: Any) -> None:
        self._owner = owner
        self._handle = handle  # kept alive with its ticket
        self._ticket = ticket
        self._pid = os.getpid()
        self.key = key
        self.probe: bool = bool(_core.throttle_ticket_is_probe(ticket))
        self.outcome: Optional[Outcome] = None
        owner._busy_add()

    @property
    def held(self) -> bool:
        return self._ticket is not None

    def report(self, status: int, headers: Any = None, body: Any = b"",
               locked_codes: Optional[Sequence[str]] = None,
               classifier: Optional[Classifier] = None) -> Outcome:
        """Classify the answer (the C library's rules), publish what it
        asks for (lock, 429, 503: its Retry-After for every process) and
        give the slot back.  Returns the Outcome.  classifier: a callable
        (status, headers, body) -> an outcome kind, an Outcome, or None
        for the default reading (see libthrottle.classify_response)."""
        self._check()
        out = outcome_of(status, headers, body, locked_codes, classifier)
        self._leave(out.kind, out.retry_after)
        self.outcome = out
        return out

    def leave(self, kind: str = "ok",
              retry_after: Optional[Seconds] = None) -> Outcome:
        """Give the slot back with an outcome by name (OUTCOMES) and, for
        "locked", "rate_limited" and "unavailable", the seconds to publish
        (None: the library's default)."""
        self._check()
        secs = _outcome_args(kind, retry_after)  # a timedelta: seconds
        self._leave(kind, secs)
        self.outcome = Outcome(kind, secs)
        return self.outcome

    def requeue(self, kind: str = "transient",
                retry_after: Optional[Seconds] = None,
                timeout: Optional[Seconds] = None) -> "Admission":
        """Report a transient outcome as leave() does (a back-off is
        published, the probe answered), then wait to send again in this
        admission's original place in the queue, ahead of everyone who
        came after it (throttle_requeue).  Returns self, admitted again
        (.probe says whether as a lock episode's probe).  timeout: seconds
        (None: as long as it takes).  On any error the place is given back,
        the admission is over (held is False) and the error is raised:
        ETIMEDOUT, ECANCELED, ESTALE (it had been taken back already)...
        Ctrl-C gives the place up and raises KeyboardInterrupt."""
        self._check()
        retry_after = _outcome_args(kind, retry_after)  # seconds
        ms = _ms(timeout, "timeout", none_is_forever=True)
        h, owner = self._handle, self._owner
        if h.gen is not None and \
                threading.current_thread() is not threading.main_thread():
            raise _invalid("this admission was made by the main thread: "
                           "requeue it there")
        ticket = ctypes.c_void_p(self._ticket)
        self._ticket = None  # C's until it hands it back
        self.outcome = Outcome(kind, retry_after)
        over = False
        try:
            if h.gen is not None:
                owner._pending = None
            rc = _core.throttle_requeue(h.ptr, ctypes.byref(ticket),
                                        OUTCOMES[kind], _retry_ms(retry_after),
                                        ms)
            self._ticket = ticket.value
            msg = _text(_core.throttle_errmsg(h.ptr)) if rc != 0 else ""
            if h.gen is not None and owner._pending is not None:
                exc, owner._pending = owner._pending, None
                raise exc
        except BaseException:
            # an exception just after the call: the place goes back
            self._ticket = self._ticket or ticket.value
            if self._ticket is not None:
                self._leave("abandoned", None)
            else:
                owner._done()
            over = True
            raise
        finally:
            if not over and self._ticket is None:
                owner._done()  # the admission is over
        if rc == 0:
            self.probe = bool(_core.throttle_ticket_is_probe(self._ticket))
            return self
        if rc == _EINTR and owner._closed:
            raise ThrottleClosed("the Throttle was closed during the call")
        raise error(rc, msg)

    def _check(self):
        if self._ticket is None:
            raise _invalid("this admission was already given back")
        if self._pid != os.getpid():
            raise _invalid("this admission belongs to process %d" % self._pid)

    def _leave(self, kind, retry_after):
        ticket, self._ticket = self._ticket, None
        ms = _retry_ms(retry_after)
        try:
            rc = _core.throttle_leave(self._handle.ptr, ticket,
                                      OUTCOMES[kind], ms)
            if rc == _ESTALE:
                # taken back already (the lease lapsed): the answer still
                # counts (a back-off was published), nothing to give back
                warnings.warn(StaleAdmissionWarning(
                    "%s: the admission was taken back before it was "
                    "reported (set the lease above the longest request)"
                    % self.key), stacklevel=3)
            elif rc != 0:
                raise error(rc, _text(_core.throttle_errmsg(
                    self._handle.ptr)))
        finally:
            self._owner._done()

    def __enter__(self) -> "Admission":
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        if self._ticket is not None and self._pid == os.getpid():
            kind = "transient" if isinstance(ev, Exception) else "abandoned"
            try:
                self._leave(kind, None)
            except Error:
                if et is None:
                    raise

    def __del__(self):
        # dropped without being given back: give the slot back now rather
        # than hold it until the lease lapses
        if getattr(self, "_ticket", None) is not None and \
                self._pid == os.getpid():
            try:
                self._leave("abandoned", None)
            except Exception:
                pass

    def __reduce__(self):
        raise TypeError("an Admission belongs to the process that made it")

    def __repr__(self):
        return "<Admission %r%s%s>" % (
            self.key, " probe" if self.probe else "",
            "" if self._ticket is not None else " (given back)")


def _outcome_args(kind, retry_after):
    if not isinstance(kind, str):
        raise TypeError("kind must be a str")
    if kind not in OUTCOMES:
        raise _invalid("unknown outcome %r (one of %s)"
                       % (kind, ", ".join(sorted(OUTCOMES))))
    return None if retry_after is None else _number(retry_after,
                                                     "retry_after")


def _retry_ms(retry_after):
    """Seconds to publish -> the ms throttle_leave() takes."""
    if retry_after is None:
        return 0  # the library's default delay
    # an explicit "Retry-After: 0" is 1 ms: 0 means the default
    return max(1, _ms(retry_after, "retry_after"))
