# SPDX-License-Identifier: MIT
"""_answers.py — reading an HTTP answer with the C library's rules:
classify() and parse_retry_after() (libthrottle-curl: throttle_classify,
throttle_parse_retry_after), headers of any shape, and the Outcome that
Admission.report() returns.  Nothing here reimplements the C rules: the
table in include/throttle_curl.h is the one source of truth.

A classifier of the caller's own (classifier=, everywhere an answer is
read: report(), request(), run(), the client integrations) is a callable
(status, headers, body) -> an outcome kind ("locked", "permanent", ...),
an Outcome, or None to keep the C library's reading; for a kind, the
Retry-After is read from the headers as usual.
"""

import ctypes
import numbers
import threading
import time
from typing import Any, Callable, Optional, Sequence, Union

from . import _capi
from ._base import (KINDS, RETRYABLE, _BY_NAME, _body, _curl, _curl_tried,
                    _invalid, _status, _text, error)

def _need_curl():
    if _curl is None:
        raise ImportError(
            "libthrottle: %s is needed for classification and Retry-After, "
            "and was not found; looked at: %s" % (_capi.CURL_SONAME,
                                                  "; ".join(_curl_tried)))
    return _curl


def parse_retry_after(value: Union[str, bytes],
                      now: Optional[float] = None) -> Optional[float]:
    """A Retry-After field value (delta-seconds or an HTTP-date, RFC 9110)
    in seconds from now (a float), or None when it is not a usable value.
    now: the time the answer was made (its Date header as seconds since the
    epoch), default time.time()."""
    lib = _need_curl()
    if isinstance(value, str):
        raw = value.encode("utf-8", "replace")
    elif isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
    else:
        raise TypeError("Retry-After value must be str or bytes, not %s"
                        % type(value).__name__)
    if b"\0" in raw:
        return None
    if now is None:
        now = time.time()
    elif isinstance(now, bool) or not isinstance(now, numbers.Real):
        raise TypeError("now must be seconds since the epoch")
    ms = ctypes.c_uint64()
    if lib.throttle_parse_retry_after(raw, int(now), ctypes.byref(ms)) != 0:
        return None
    return ms.value / 1000.0


_policies = {}
_policies_lock = threading.Lock()


def _policy(locked_codes):
    """A classification policy for a set of locked codes (None: default),
    made once per set and kept for the life of the process."""
    if locked_codes is None:
        return None
    codes = tuple(locked_codes)
    with _policies_lock:
        p = _policies.get(codes)
        if p is None:
            lib = _need_curl()
            out = ctypes.c_void_p()
            rc = lib.throttle_curl_policy_new(ctypes.byref(out))
            if rc != 0:
                raise error(rc)
            raw = []
            for c in codes:
                if not isinstance(c, str):
                    raise TypeError("locked codes must be str")
                raw.append(c.encode("utf-8"))
            arr = (ctypes.c_char_p * max(len(raw), 1))(*raw)
            rc = lib.throttle_curl_policy_set_locked_codes(out, arr, len(raw))
            if rc != 0:
                lib.throttle_curl_policy_free(out)
                raise error(rc, "invalid locked codes %r" % (codes,))
            p = _policies[codes] = out
        return p


def classify_answer(status, body=b"", locked_codes=None):
    """(kind, error code) of an HTTP answer, by the C classifier."""
    lib = _need_curl()
    st, raw = _status(status), _body(body)
    pol = _policy(locked_codes)
    outcome = ctypes.c_int()
    code = ctypes.create_string_buffer(256)
    if st < 100 or st > 999:
        raise _invalid("status must be 100 to 999, not %d" % st)
    rc = lib.throttle_classify(pol, st, raw, len(raw), ctypes.byref(outcome),
                               code, len(code))
    if rc != 0 and rc != _BY_NAME["ENOMEM"].code:
        raise error(rc)
    return KINDS[outcome.value], _text(code.value)


def classify(status: int, body: Union[bytes, str, None] = b"") -> str:
    """The kind of an HTTP answer: "ok", "locked", "permanent",
    "rate_limited", "unavailable" or "transient" (see throttle_curl.h)."""
    return classify_answer(status, body)[0]


def _header(headers, name):
    """A header's value from a dict, a list of pairs, or a message object
    (http.client, email, requests), matched without regard to case."""
    if headers is None:
        return None
    get = getattr(headers, "get", None)
    if get is not None and not isinstance(headers, dict):
        return get(name)  # HTTPMessage, requests' CaseInsensitiveDict
    items = headers.items() if isinstance(headers, dict) else headers
    try:
        for k, v in items:
            if isinstance(k, bytes):
                k = k.decode("latin-1")
            if k.lower() == name.lower():
                return v
    except (TypeError, ValueError):
        raise TypeError("headers must be a mapping or (name, value) pairs")
    return None


def _answer_time(headers):
    """The answer's Date (seconds since the epoch), else now: a date in
    Retry-After is read against it, which cancels clock skew."""
    import email.utils
    date = _header(headers, "Date")
    if date:
        try:
            return email.utils.parsedate_to_datetime(str(date)).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            pass
    return time.time()


class Outcome:
    """What report() made of an answer.  kind: "ok", "locked",
    "permanent", "rate_limited", "unavailable", "transient"; retry_after:
    seconds the server asked for (None when it named none); retryable:
    whether sending again later may succeed; status and code (the body's
    error.code, "" when none) as read."""

    __slots__ = ("kind", "retry_after", "retryable", "status", "code")

    def __init__(self, kind: str, retry_after: Optional[float] = None,
                 status: Optional[int] = None, code: str = "") -> None:
        if kind not in KINDS.values():
            raise _invalid("unknown outcome %r" % (kind,))
        self.kind = kind
        self.retry_after = retry_after
        self.retryable = kind in RETRYABLE
        self.status = status
        self.code = code

    def __repr__(self) -> str:
        return "Outcome(kind=%r, retry_after=%r, status=%r, code=%r)" % (
            self.kind, self.retry_after, self.status, self.code)


# (status, headers, body) -> kind, Outcome, or None for the default
Classifier = Callable[[int, Any, bytes], Union[None, str, "Outcome"]]


def classify_response(status: int, headers: Any = None, body: Any = b"",
                      locked_codes: Optional[Sequence[str]] = None
                      ) -> "Outcome":
    """The C library's reading of an answer, as an Outcome: its kind (the
    classifier of include/throttle_curl.h), its Retry-After in seconds,
    the status and the body's error.code.  A classifier of one's own can
    call it for the answers it does not decide itself."""
    return outcome_of(status, headers, body, locked_codes)


def _retry_after(headers):
    ra = None
    value = _header(headers, "Retry-After")
    if value is not None:
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        ra = parse_retry_after(str(value), _answer_time(headers))
    return ra


def outcome_of(status, headers=None, body=b"", locked_codes=None,
               classifier=None):
    """Classify an answer and read its Retry-After: classifier's reading
    when it gives one, else the C library's rules."""
    if classifier is not None:
        got = classifier(_status(status), headers, _body(body))
        if isinstance(got, Outcome):
            return got
        if got is not None:
            if not isinstance(got, str) or got not in RETRYABLE | {
                    "ok", "permanent"}:
                raise _invalid("classifier returned %r: not an Outcome, None "
                               "or one of ok, locked, rate_limited, "
                               "unavailable, transient, permanent" % (got,))
            return Outcome(got, _retry_after(headers), _status(status), "")
    kind, code = classify_answer(status, body, locked_codes)
    return Outcome(kind, _retry_after(headers), _status(status), code)
