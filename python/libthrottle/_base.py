# SPDX-License-Identifier: MIT
"""_base.py — what every layer of the package shares: the loaded
libraries (see _capi.py), the exceptions made from the C error table, the
names of classes and outcomes, and the checks that turn Python arguments
into C ones.

Arguments are checked here before they reach C, so no Python value can
crash the process: keys are str (UTF-8) or bytes without NUL, times are
seconds (int, float or datetime.timedelta, rounded up to whole
milliseconds: rounding down could admit a request early), and anything else raises TypeError or the
Error subclass of the C code the library would return.
"""

import datetime
import math
import numbers
from typing import Union

from . import _capi
from ._errors import Error, make_classes

_core, _curl, _curl_tried, _missing = _capi.load()

HAVE_INTERRUPT = "throttle_config_set_interrupt" not in _missing
INTERRUPT_PERIOD_MS = 50
SLICE_MS = 100

UINT32_MAX = 2 ** 32 - 1
UINT64_MAX = 2 ** 64 - 1
FOREVER = UINT64_MAX

_GROUP_SHARED, _NO_FALLBACK, _NO_CREATE = 1, 2, 4

CLASSES = {"live": 0, "backfill": 1}
# throttle_outcome_t, by the names report() and Outcome use
OUTCOMES = {"ok": 0, "locked": 1, "rate_limited": 2, "unavailable": 3,
            "permanent": 4, "transient": 5, "abandoned": 6}
KINDS = {v: k for k, v in OUTCOMES.items()}
RETRYABLE = frozenset(["locked", "rate_limited", "unavailable", "transient"])


# The types of the public API's arguments.
Key = Union[str, bytes]
Seconds = Union[int, float, datetime.timedelta]


def _text(b):
    return "" if b is None else b.decode("utf-8", "replace")


ERRORS = make_classes(lambda c: _text(_core.throttle_err_name(c)),
                      lambda c: _text(_core.throttle_strerror(c)))
_BY_NAME = {cls.__name__: cls for cls in ERRORS.values()}
_OK = 0
_ETIMEDOUT = _BY_NAME["ETIMEDOUT"].code
_EWOULDBLOCK = _BY_NAME["EWOULDBLOCK"].code
_EINTR = _BY_NAME["EINTR"].code if "EINTR" in _BY_NAME else None
_ESTALE = _BY_NAME["ESTALE"].code if "ESTALE" in _BY_NAME else None


def error(code, message=None):
    """The Error instance for a THROTTLE_E* code."""
    cls = ERRORS.get(code)
    if cls is None:
        return Error(message or "unknown libthrottle error %d" % code, code)
    return cls(message)


def _invalid(message):
    return _BY_NAME["EINVAL"](message)


# ---- checking arguments --------------------------------------------------

def _key(key):
    if isinstance(key, str):
        try:
            b = key.encode("utf-8")
        except UnicodeEncodeError as e:
            raise _BY_NAME["EKEY"]("key %r is not valid UTF-8: %s" % (key, e))
    elif isinstance(key, (bytes, bytearray, memoryview)):
        b = bytes(key)
    else:
        raise TypeError("key must be str or bytes, not %s"
                        % type(key).__name__)
    if b"\0" in b:  # C would see only the part before it
        raise _BY_NAME["EKEY"]("key %r contains a NUL byte" % (key,))
    return b


def _number(value, what):
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("%s must be a number of seconds or a timedelta, "
                        "not %s"
                        % (what, type(value).__name__))
    v = float(value)
    if math.isnan(v) or v < 0:
        raise ValueError("%s must be >= 0, not %r" % (what, value))
    return v


def _ms(value, what, none_is_forever=False, top=UINT64_MAX - 1):
    """Seconds -> whole milliseconds, rounded up (never early)."""
    if value is None and none_is_forever:
        return FOREVER
    v = _number(value, what)
    if math.isinf(v):
        if none_is_forever:
            return FOREVER
        return top
    return min(int(math.ceil(round(v * 1000.0, 6))), top)


def _uint(value, what, top):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError("%s must be an int, not %s"
                        % (what, type(value).__name__))
    if value < 0 or value > top:
        raise _invalid("%s out of range: %r" % (what, value))
    return int(value)


def _klass(klass):
    if not isinstance(klass, str):
        raise TypeError("klass must be 'live' or 'backfill', not %s"
                        % type(klass).__name__)
    if klass not in CLASSES:
        raise _invalid("klass must be 'live' or 'backfill', not %r" % klass)
    return CLASSES[klass]


def _body(body):
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise TypeError("body must be bytes, str or None, not %s"
                    % type(body).__name__)


def _status(status):
    if isinstance(status, bool) or not isinstance(status, numbers.Integral):
        raise TypeError("status must be an int, not %s"
                        % type(status).__name__)
    return int(status)


