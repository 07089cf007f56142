# SPDX-License-Identifier: MIT
"""_admission.py — Admission, one throttle_enter() until its
throttle_leave(): given back exactly once, by report() (an HTTP answer
classified by the C rules), leave() (an outcome by name), or the end of a
with block.  Kept apart from the handle (_throttle.py), which makes them.
"""

import os
import warnings

from ._answers import Outcome, outcome_of
from ._base import OUTCOMES, _ESTALE, _core, _invalid, _ms, _number, \
    _text, error
from ._errors import Error


class StaleAdmissionWarning(RuntimeWarning):
    """An admission was reported after the library had taken it back from
    a holder that looked hung (its lease lapsed)."""


class Admission:
    """An admission (throttle_enter), given back exactly once: by
    report() (an HTTP answer), leave() (an outcome by name), or on leaving
    the with block: as "transient" (FAILED) when an exception left it, as
    "abandoned" when nothing was reported.  .probe is True for the probe
    of a lock episode.  Belongs to the process that made it."""

    def __init__(self, owner, handle, ticket, key):
        self._owner = owner
        self._handle = handle  # kept alive with its ticket
        self._ticket = ticket
        self._pid = os.getpid()
        self.key = key
        self.probe = bool(_core.throttle_ticket_is_probe(ticket))
        self.outcome = None
        owner._busy_add()

    @property
    def held(self):
        return self._ticket is not None

    def report(self, status, headers=None, body=b"", locked_codes=None):
        """Classify the answer (the C library's rules), publish what it
        asks for (lock, 429, 503: its Retry-After for every process) and
        give the slot back.  Returns the Outcome."""
        self._check()
        out = outcome_of(status, headers, body, locked_codes)
        self._leave(out.kind, out.retry_after)
        self.outcome = out
        return out

    def leave(self, kind="ok", retry_after=None):
        """Give the slot back with an outcome by name (OUTCOMES) and, for
        "locked", "rate_limited" and "unavailable", the seconds to publish
        (None: the library's default)."""
        self._check()
        if not isinstance(kind, str):
            raise TypeError("kind must be a str")
        if kind not in OUTCOMES:
            raise _invalid("unknown outcome %r (one of %s)"
                           % (kind, ", ".join(sorted(OUTCOMES))))
        if retry_after is not None:
            _number(retry_after, "retry_after")
        self._leave(kind, retry_after)
        self.outcome = Outcome(kind, retry_after)
        return self.outcome

    def _check(self):
        if self._ticket is None:
            raise _invalid("this admission was already given back")
        if self._pid != os.getpid():
            raise _invalid("this admission belongs to process %d" % self._pid)

    def _leave(self, kind, retry_after):
        ticket, self._ticket = self._ticket, None
        if retry_after is None:
            ms = 0  # the library's default delay
        else:
            # an explicit "Retry-After: 0" is 1 ms: 0 means the default
            ms = max(1, _ms(retry_after, "retry_after"))
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

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if self._ticket is not None and self._pid == os.getpid():
            kind = "transient" if isinstance(ev, Exception) else "abandoned"
            try:
                self._leave(kind, None)
            except Error:
                if et is None:
                    raise
        return False

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
