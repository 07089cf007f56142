# SPDX-License-Identifier: MIT
"""libthrottle.tenacity — a retry/wait pair for tenacity that shares the
back-off with every process of the host (and, with a Redis backend, of
every host):

    import tenacity, libthrottle, libthrottle.tenacity as lt

    t = libthrottle.Throttle()
    KEY = "hotdata:ws1/orders"

    @tenacity.retry(retry=lt.retry_if_transient(t, KEY),
                    wait=lt.wait_throttle(t, KEY),
                    before=lt.before_attempt(t, KEY),
                    stop=tenacity.stop_after_attempt(10), reraise=True)
    def load(data):
        r = requests.post(url, data=data)
        r.raise_for_status()
        return r

retry_if_transient reads the last attempt's answer — a response returned,
or the response of the exception raised (requests.HTTPError,
httpx.HTTPStatusError, libthrottle.RequestError; anything with
.response) — with the C library's classifier (or classifier=): a lock, 429
or 503 is published on key with its Retry-After (every process then waits
it out), and it retries what is transient; a permanent answer (409
CONFLICT, other 4xx) and a success are not retried.  An exception without
an answer is retried when it is a transport failure (OSError, which covers
requests' ConnectionError and Timeout, TimeoutError, httpx.TransportError,
urllib3's HTTPError, aiohttp's ClientConnectionError), not otherwise.
wait_throttle waits until key's published not-before (every process's),
else the answer's own Retry-After, else fallback (default: full jitter,
0.2 s doubling to 20 s).  before_attempt blocks in Throttle.wait(key)
right before every attempt, the first included: tenacity sleeps the wait
it computed, and another process may have published a later not-before
meanwhile (without it, those attempts go early); it blocks the thread, so
it is for synchronous code (with asyncio, use AsyncThrottle's admission).

What it is: back-off shared, without admission.  Every waiting process
wakes when the not-before passes and sends at once, so a fleet herds into
the lock again (the README's figures); the admission of
Throttle.admit(), the requests adapter or the httpx transport sends one
probe and holds the others until it is answered.  Use this pair where a
call is already wrapped in tenacity and cannot be moved into an admission.

Needs tenacity (pip install libthrottle[tenacity]).
"""

from typing import Any, Optional, Sequence, Tuple

import tenacity
from tenacity.wait import wait_base

from ._answers import Classifier, Outcome, outcome_of
from ._base import Key
from ._errors import RequestError
from ._http import DEFAULT_DELAY_S, TransportError, default_throttle
from ._throttle import Throttle

__all__ = ["retry_if_transient", "wait_throttle", "before_attempt"]

_PUBLISHED = ("locked", "rate_limited", "unavailable")


def _transport_errors() -> Tuple[type, ...]:
    """The exceptions of the installed clients that mean "no answer"."""
    out: list = [OSError, TimeoutError, TransportError]
    for mod, name in (("httpx", "TransportError"),
                      ("urllib3.exceptions", "HTTPError"),
                      ("aiohttp", "ClientConnectionError")):
        try:
            m = __import__(mod, fromlist=[name])
            out.append(getattr(m, name))
        except (ImportError, AttributeError):
            pass
    return tuple(out)


def _body(resp: Any) -> bytes:
    for attr in ("content", "data", "_body"):
        try:
            b = getattr(resp, attr)
        except Exception:  # httpx: a stream not read
            continue
        if isinstance(b, (bytes, bytearray)):
            return bytes(b)
    return b""


def answer_of(obj: Any) -> Optional[Tuple[int, Any, bytes]]:
    """(status, headers, body) of a response of requests, httpx, urllib3
    or aiohttp, of an exception that carries one, or of a
    libthrottle.RequestError; None when obj is none of those."""
    if isinstance(obj, RequestError):
        if obj.status is None:
            return None
        return obj.status, obj.headers, obj.body or b""
    resp = getattr(obj, "response", None) if isinstance(obj, BaseException) \
        else obj
    if resp is None:
        return None
    status = getattr(resp, "status_code", None)
    if status is None:
        status = getattr(resp, "status", None)
    if not isinstance(status, int):
        return None
    return status, getattr(resp, "headers", None), _body(resp)


class retry_if_transient(tenacity.retry_base):
    """tenacity retry=: publish what the answer says on key, retry while
    it is transient (see the top of the file)."""

    def __init__(self, throttle: Optional[Throttle] = None,
                 key: Key = "", classifier: Optional[Classifier] = None,
                 locked_codes: Optional[Sequence[str]] = None) -> None:
        self.throttle, self.key = throttle, key
        self.classifier, self.locked_codes = classifier, locked_codes
        self._no_answer = _transport_errors()

    def __call__(self, retry_state: "tenacity.RetryCallState") -> bool:
        outcome = retry_state.outcome
        if outcome is None:
            return False
        if outcome.failed:
            exc = outcome.exception()
            answer = answer_of(exc)
            if answer is None:
                return isinstance(exc, self._no_answer)
        else:
            answer = answer_of(outcome.result())
            if answer is None:
                return False
        out = outcome_of(answer[0], answer[1], answer[2], self.locked_codes,
                         self.classifier)
        retry_state.libthrottle_outcome = out  # type: ignore[attr-defined]
        if out.kind in _PUBLISHED:
            t = self.throttle if self.throttle is not None \
                else default_throttle()
            t.backoff(self.key, out.retry_after
                      if out.retry_after is not None else DEFAULT_DELAY_S)
        return out.retryable


class wait_throttle(wait_base):
    """tenacity wait=: until key's shared not-before, else the answer's
    Retry-After, else fallback(retry_state)."""

    def __init__(self, throttle: Optional[Throttle] = None, key: Key = "",
                 fallback: Optional[Any] = None) -> None:
        self.throttle, self.key = throttle, key
        self.fallback = fallback if fallback is not None else \
            tenacity.wait_random_exponential(multiplier=0.2, max=20)

    def __call__(self, retry_state: "tenacity.RetryCallState") -> float:
        t = self.throttle if self.throttle is not None else default_throttle()
        left = t.remaining(self.key)
        if left > 0:
            return left
        out: Optional[Outcome] = getattr(retry_state, "libthrottle_outcome",
                                         None)
        if out is not None and out.retry_after is not None:
            return out.retry_after
        return float(self.fallback(retry_state))


class before_attempt:
    """tenacity before=: wait (Throttle.wait) until key's shared
    not-before, re-read when it wakes, right before each attempt."""

    def __init__(self, throttle: Optional[Throttle] = None,
                 key: Key = "") -> None:
        self.throttle, self.key = throttle, key

    def __call__(self, retry_state: "tenacity.RetryCallState") -> None:
        t = self.throttle if self.throttle is not None else default_throttle()
        t.wait(self.key)
