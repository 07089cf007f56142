# SPDX-License-Identifier: MIT
"""_http.py — the admit / send / classify / retry loop, and request(), the
loop around one urllib request.  The requests adapter (requests.py) runs
the same loop around its own sender.

The loop mirrors throttle_curl_perform() (include/throttle_curl.h) with
Python doing the sending:

    admit (waits for the not-before, one probe per lock episode, the cap)
    send; classify the answer and read its Retry-After (the C library's
      classifier and parser); report it, which publishes lock, 429 and 503
      answers to every process and gives the slot back
    ok -> return;  permanent -> PermanentError, never re-sent;
    locked, rate_limited, unavailable -> published: loop (the next admit
      waits);  transient (408, 5xx, a transport error) -> local back-off
      (its Retry-After, else "full jitter" 0.2 s x 2^k capped at 20 s),
      not published: loop;
    until `retries` re-sends or `timeout` seconds are spent -> GaveUp.

Fail open (I7): when admission fails because of the segment rather than
the key (anything but ETIMEDOUT, ECANCELED, EINVAL, EKEY, ENOMEM), the
request is sent without admission and whatever back-off the answer asks
for is slept here, so it is still never re-sent early; after ELOCKTIMEOUT
or ECORRUPT the rest of the call does not ask the segment again.

Rejected: following redirects (urllib turns a redirected POST into a GET
without its body; the C loop does not follow them either, and an
unfollowed 3xx is permanent); re-sending file objects (a refused upload
must start again from its first byte: pass bytes).
"""

import contextlib
import contextvars
import http.client
import random
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import (Any, Callable, Dict, Optional, Sequence, Tuple, Union,
                    cast)

from ._errors import Error, GaveUp, PermanentError
from ._answers import Classifier, Outcome, outcome_of
from ._base import SLICE_MS, _BY_NAME, Key, Seconds, _klass, _number
from ._throttle import Throttle

LOCAL_BASE_S = 0.2
LOCAL_CAP_S = 20.0
DEFAULT_DELAY_S = 5.0  # a lock answer without Retry-After, as in C

# Admission errors that are about the key or the call, not the segment.
_NOT_FAIL_OPEN = tuple(_BY_NAME[n] for n in
                       ("ETIMEDOUT", "ECANCELED", "EINVAL", "EKEY", "ENOMEM"))
# After these the segment is not asked again in this call (as in C).
_SEGMENT_GONE = (_BY_NAME["ELOCKTIMEOUT"], _BY_NAME["ECORRUPT"])
_PUBLISHED = ("locked", "rate_limited", "unavailable")

_default = None
_default_lock = threading.Lock()

# True while the loop (run(), arun()) runs a sender: the request it sends
# is admitted already, and libthrottle.instrument lets it through as it is
SENDING: "contextvars.ContextVar[bool]" = contextvars.ContextVar(
    "libthrottle_sending", default=False)


def default_throttle() -> Throttle:
    """The process's shared Throttle (defaults + environment), opened on
    first use; request() uses it unless given another."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = Throttle()
        return _default


class TransportError(Exception):
    """No answer arrived (connection refused or reset, a timeout): worth
    sending again, after a local back-off.  Senders raise it; the loop
    catches it."""


def sleep(seconds: float, deadline: Optional[float] = None) -> None:
    """Sleep in slices of at most 100 ms, so Ctrl-C and signal handlers
    run promptly whatever the platform's sleep does."""
    end = time.monotonic() + seconds
    if deadline is not None:
        end = min(end, deadline)
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, SLICE_MS / 1000.0))


# send(seconds left or None) -> (status, headers, body)
Sender = Callable[[Optional[float]], Tuple[int, Any, bytes]]


class _Done(Exception):
    """The loop is over with this result (give_up=False)."""

    def __init__(self, result: Tuple[Any, Any, bytes, Outcome, int]) -> None:
        super().__init__()
        self.result = result


class Loop:
    """The decisions of the retry loop, shared by run() (threads) and
    arun() (asyncio, _async.py), which do the admitting, sending and
    sleeping each in its own way:

        loop = Loop(key, throttle, retries, timeout, klass, ...)
        while True:
            adm = admit(timeout=loop.left()) if loop.gate else None
                  (an Error from it: loop.not_admitted(e), which raises
                  or returns)
            loop.sent(adm, send(loop.send_timeout()))  or, on a
                  TransportError, loop.no_answer(adm, e)
            delay = loop.next(adm)  (returns the seconds to sleep before
                  the next attempt; raises _Done, PermanentError, GaveUp)
    """

    def __init__(self, key: Key, throttle: Any, retries: int,
                 timeout: Optional[Seconds], klass: str,
                 locked_codes: Optional[Sequence[str]], give_up: bool,
                 classifier: Optional[Classifier]) -> None:
        _klass(klass)
        if isinstance(retries, bool) or not isinstance(retries, int):
            raise TypeError("retries must be an int")
        if retries < 0:
            raise ValueError("retries must be >= 0")
        secs = None if timeout is None else _number(timeout, "timeout")
        self.key, self.throttle, self.retries = key, throttle, retries
        self.klass, self.locked_codes = klass, locked_codes
        self.give_up, self.classifier = give_up, classifier
        self.deadline = None if secs is None else time.monotonic() + secs
        self.attempts = self.local_fails = 0
        self.gate = True
        self.answer: Tuple[Any, Any, bytes] = (None, None, b"")
        self.out: Optional[Outcome] = None

    def left(self) -> Optional[float]:
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def send_timeout(self) -> Optional[float]:
        self.attempts += 1
        if self.deadline is None:
            return None
        return max(0.001, self.deadline - time.monotonic())

    def not_admitted(self, e: Exception, remaining: float) -> None:
        """admit() raised e: raise (a bad key or call), give up (the
        timeout), or go on without admission (the segment failed)."""
        if isinstance(e, _NOT_FAIL_OPEN):
            if not isinstance(e, _BY_NAME["ETIMEDOUT"]):
                raise e
            out = self.out
            ra = max(remaining, (out.retry_after or 0) if out else 0)
            self._gave_up(ra or None, "not admitted within the timeout")
        if isinstance(e, _SEGMENT_GONE):
            self.gate = False  # each further try would cost the lock timeout
        elif not isinstance(e, Error):
            raise e
        # else the segment failed: send anyway, honour the answer here

    def no_answer(self, adm: Any, e: Exception) -> None:
        if adm is not None:
            adm.leave("transient")
        self.out = Outcome("transient")
        self.answer = (None, None, str(e.__cause__ or e).encode())

    def sent(self, adm: Any, answer: Tuple[Any, Any, bytes]) -> None:
        status, headers, body = self.answer = answer
        self.out = (adm.report(status, headers, body, self.locked_codes,
                               self.classifier)
                    if adm is not None else
                    outcome_of(status, headers, body, self.locked_codes,
                               self.classifier))

    def next(self, adm: Any) -> float:
        """Seconds to sleep before the next attempt (0: admit again at
        once, the gate waits), or raise _Done / PermanentError / GaveUp."""
        out, answer = self.out, self.answer
        assert out is not None
        if out.kind == "ok":
            raise _Done(answer + (out, self.attempts))
        if out.kind == "permanent":
            if not self.give_up:
                raise _Done(answer + (out, self.attempts))
            raise PermanentError(
                "%s: permanent answer HTTP %s%s, not retried"
                % (self.key, answer[0], " " + out.code if out.code else ""),
                answer[0], answer[1], answer[2], out.code, self.attempts)
        if self.attempts > self.retries:
            self._gave_up(out.retry_after, "after %d attempts" % self.attempts)
        # published answers make the next admit wait; the rest back off here
        if out.kind in _PUBLISHED and adm is not None:
            return 0.0
        if out.retry_after is not None:
            delay = out.retry_after
        elif out.kind in _PUBLISHED:
            delay = DEFAULT_DELAY_S
        else:
            delay = random.uniform(0, min(
                LOCAL_CAP_S, LOCAL_BASE_S * 2 ** self.local_fails))
            self.local_fails = min(self.local_fails + 1, 30)
        if self.deadline is not None and \
                time.monotonic() + delay > self.deadline:
            self._gave_up(out.retry_after,
                          "the next try would be after the timeout")
        return delay

    def _gave_up(self, retry_after: Optional[float], why: str) -> None:
        raise _Done(_gave_up(self.key, self.answer, self.out, self.attempts,
                             retry_after, why, self.give_up))


def run(key: Key, send: Sender, throttle: Optional[Throttle] = None,
        retries: int = 10, timeout: Optional[Seconds] = 300,
        klass: str = "live", locked_codes: Optional[Sequence[str]] = None,
        give_up: bool = True, classifier: Optional[Classifier] = None
        ) -> Tuple[Any, Any, bytes, Outcome, int]:
    """The loop.  send(seconds_left or None) returns (status, headers,
    body) or raises TransportError.  Returns (status, headers, body,
    outcome, attempts) for a 2xx answer; raises PermanentError and GaveUp
    (unless give_up is False and something was sent: the last answer is
    then returned too, with its outcome) and Error for a bad key or
    class.  classifier: see Admission.report().  send is called once per
    attempt: a sender that sends a body must send the same bytes each
    time (libthrottle.ReplayableBody makes them so)."""
    t = throttle if throttle is not None else default_throttle()
    if not isinstance(t, Throttle):
        raise TypeError("throttle must be a libthrottle.Throttle")
    loop = Loop(key, t, retries, timeout, klass, locked_codes, give_up,
                classifier)
    try:
        while True:
            adm = None
            if loop.gate:
                try:
                    adm = t.admit(key, klass, timeout=loop.left())
                except Error as e:
                    loop.not_admitted(e, t.remaining(key) if isinstance(
                        e, _BY_NAME["ETIMEDOUT"]) else 0.0)
            with adm if adm is not None else contextlib.nullcontext():
                sending = SENDING.set(True)
                try:
                    answer = send(loop.send_timeout())
                except TransportError as e:
                    loop.no_answer(adm, e)
                else:
                    loop.sent(adm, answer)
                finally:
                    SENDING.reset(sending)
            delay = loop.next(adm)
            if delay > 0:
                sleep(delay)
    except _Done as d:
        return d.result


def _gave_up(key, answer, out, attempts, retry_after, why, give_up):
    if not give_up and out is not None:
        return answer + (out, attempts)
    kind = out.kind if out is not None else "not admitted"
    what = "HTTP %s%s" % (answer[0], " " + out.code if out and out.code
                          else "") if answer[0] else kind
    raise GaveUp("%s: still %s (%s) %s%s" % (
        key, kind, what, why,
        "; the server asks for %.1f s" % retry_after if retry_after else ""),
        answer[0], answer[1], answer[2], out.code if out else "", attempts,
        retry_after)


# ---- urllib -----------------------------------------------------------------------

class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # the 3xx comes back as an answer


_opener = urllib.request.build_opener(_NoRedirect)


def _urllib_sender(url, method, data, headers):
    def send(left):
        req = urllib.request.Request(url, data=data, headers=headers,
                                     method=method)
        try:
            with _opener.open(req, timeout=left) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as e:
            try:
                body = e.read()
            except (OSError, http.client.HTTPException):
                body = b""  # cut short: a 409 then reads as permanent
            finally:
                e.close()
            return e.code, e.headers, body
        except ssl.CertificateError:
            raise  # sending again does not mend it
        except (OSError, http.client.HTTPException) as e:
            raise TransportError("%s: %s" % (url, e)) from e
    return send


def check_url(url: str, any_scheme: bool = False) -> None:
    """ValueError unless url is an absolute http(s) URL (any scheme with
    any_scheme: a client's adapter may serve http+unix:// and the like)
    with a host and a valid port: a malformed URL is the caller's mistake,
    never a transport error to retry."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError when out of range
    except ValueError as e:
        raise ValueError("malformed URL %r: %s" % (url, e)) from None
    if not any_scheme and parts.scheme.lower() not in ("http", "https"):
        raise ValueError("malformed URL %r: not http:// or https://" % (url,))
    if not parts.hostname:
        raise ValueError("malformed URL %r: no host" % (url,))


def request(key: Key, url: str, method: str = "POST",
            data: Union[bytes, bytearray, str, None] = None,
            headers: Optional[Dict[str, str]] = None, retries: int = 10,
            timeout: Optional[Seconds] = 300, klass: str = "live",
            throttle: Optional[Throttle] = None,
            locked_codes: Optional[Sequence[str]] = None,
            classifier: Optional[Classifier] = None
            ) -> Tuple[int, http.client.HTTPMessage, bytes]:
    """One HTTP request through urllib, admitted under key and retried
    while the answer is transient (see the loop above).

    data: bytes or str (UTF-8) or None; headers: a dict; retries: re-sends
    allowed after the first attempt; timeout: seconds for the whole call,
    waiting included (None: no limit); klass: "live" or "backfill";
    throttle: a Throttle (default: default_throttle()); locked_codes: the
    error.code values of a lock 409 (default RESOURCE_LOCKED).

    Returns (status, headers, body) for a 2xx answer (headers an
    http.client.HTTPMessage).  Raises PermanentError (sent once), GaveUp
    (.retry_after), Error (a bad key or class), TypeError, and ValueError
    for a malformed URL (before anything is admitted or sent)."""
    if not isinstance(url, str):
        raise TypeError("url must be a str")
    check_url(url)
    if not isinstance(method, str):
        raise TypeError("method must be a str")
    if isinstance(data, str):
        data = data.encode("utf-8")
    elif data is not None and not isinstance(data, (bytes, bytearray)):
        raise TypeError("data must be bytes, str or None (a refused request "
                        "is sent again from its first byte)")
    hdrs = {}
    if headers is not None:
        if not isinstance(headers, dict):
            raise TypeError("headers must be a dict")
        for k, v in headers.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError("header names and values must be str")
            hdrs[k] = v
    status, hdr, body, _, _ = run(
        key, _urllib_sender(url, method.upper(), data, hdrs), throttle,
        retries, timeout, klass, locked_codes, classifier=classifier)
    return cast(int, status), hdr, body


__all__ = ["request", "run", "sleep", "default_throttle", "TransportError",
           "check_url"]
