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
    time (libthrottle.replayable_body() makes them so)."""
    t = throttle if throttle is not None else default_throttle()
    if not isinstance(t, Throttle):
        raise TypeError("throttle must be a libthrottle.Throttle")
    _klass(klass)
    if isinstance(retries, bool) or not isinstance(retries, int):
        raise TypeError("retries must be an int")
    if retries < 0:
        raise ValueError("retries must be >= 0")
    if timeout is not None:
        timeout = _number(timeout, "timeout")
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    attempts = local_fails = 0
    gate = True
    answer = (None, None, b"")
    out = None
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        adm = None
        try:
            if gate:
                adm = t.admit(key, klass, timeout=left)
        except _NOT_FAIL_OPEN as e:
            if not isinstance(e, _BY_NAME["ETIMEDOUT"]):
                raise
            ra = max(t.remaining(key),
                     (out.retry_after or 0) if out is not None else 0)
            return _gave_up(key, answer, out, attempts, ra or None,
                            "not admitted within the timeout", give_up)
        except _SEGMENT_GONE:
            gate = False  # each further try would cost the lock timeout
        except Error:
            pass  # the segment failed: send anyway, honour it here
        attempts += 1
        with adm if adm is not None else contextlib.nullcontext():
            try:
                answer = send(None if deadline is None
                              else max(0.001, deadline - time.monotonic()))
            except TransportError as e:
                if adm is not None:
                    adm.leave("transient")
                out = Outcome("transient")
                answer = (None, None, str(e.__cause__ or e).encode())
            else:
                status, headers, body = answer
                out = (adm.report(status, headers, body, locked_codes,
                                  classifier)
                       if adm is not None else
                       outcome_of(status, headers, body, locked_codes,
                                  classifier))
        if out.kind == "ok":
            return answer + (out, attempts)
        if out.kind == "permanent":
            if not give_up:
                return answer + (out, attempts)
            raise PermanentError(
                "%s: permanent answer HTTP %s%s, not retried"
                % (key, answer[0], " " + out.code if out.code else ""),
                answer[0], answer[1], answer[2], out.code, attempts)
        if attempts > retries:
            return _gave_up(key, answer, out, attempts, out.retry_after,
                            "after %d attempts" % attempts, give_up)
        # published answers make the next admit wait; the rest back off here
        if out.kind in _PUBLISHED and adm is not None:
            continue
        if out.retry_after is not None:
            delay = out.retry_after
        elif out.kind in _PUBLISHED:
            delay = DEFAULT_DELAY_S
        else:
            delay = random.uniform(0, min(LOCAL_CAP_S,
                                          LOCAL_BASE_S * 2 ** local_fails))
            local_fails = min(local_fails + 1, 30)
        if deadline is not None and time.monotonic() + delay > deadline:
            return _gave_up(key, answer, out, attempts, out.retry_after,
                            "the next try would be after the timeout",
                            give_up)
        sleep(delay)


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


def check_url(url: str) -> None:
    """ValueError unless url is an absolute http(s) URL with a host (and a
    valid port): a malformed URL is the caller's mistake, never a
    transport error to retry."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError when out of range
    except ValueError as e:
        raise ValueError("malformed URL %r: %s" % (url, e)) from None
    if parts.scheme.lower() not in ("http", "https"):
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
