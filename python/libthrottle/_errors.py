# SPDX-License-Identifier: MIT
"""_errors.py — the exceptions: one Error subclass per THROTTLE_E* code,
made from the C library's own table at import, and the two outcomes of
request() that are not C errors (PermanentError, GaveUp).

The classes are generated, not written out: throttle_err_name() is asked
for 0, -1, -2, ... until it answers THROTTLE_UNKNOWN, so a code appended
to the C table (never renumbered) becomes a class here without a change
to this file.  Each class is named after its code without the prefix
(THROTTLE_EFULL -> libthrottle.EFULL, like Python's errno names), and has
.code, .name and .description; an instance carries the handle's message
(throttle_errmsg) as its text.  A few also derive from the built-in
exception a Python caller would catch for that condition (an invalid
argument or key is a ValueError, a timeout a TimeoutError).

Rejected: CamelCase names made from the codes (EINITTIMEOUT and
ELOCKTIMEOUT have no reliable word breaks, and the C names are the ones in
the docs, logs and throttle_errmsg texts).
"""

# Built-in bases for codes a Python caller expects to catch by kind.
_ALSO = {
    "EINVAL": (ValueError,),
    "EKEY": (ValueError,),
    "ETIMEDOUT": (TimeoutError,),
}


class Error(Exception):
    """A libthrottle C error.  .code is the THROTTLE_E* value (negative),
    .name its name ("THROTTLE_EFULL"), str() the message with context."""

    code = None
    name = None
    description = None

    def __init__(self, message=None, code=None):
        if code is not None:
            self.code = code
        if message is None or message == "":
            message = self.description or "libthrottle error %s" % self.code
        self.message = message
        # ValueError and TimeoutError take the message as their one arg
        super().__init__(message)

    def __str__(self):
        return self.message

    def __reduce__(self):  # picklable across multiprocessing
        return (type(self), (self.message, self.code))


def make_classes(err_name, strerror):
    """{code: class} for every code the library knows."""
    classes = {}
    code = -1
    while True:
        name = err_name(code)
        if name == "THROTTLE_UNKNOWN" or code < -4096:
            break
        short = name[len("THROTTLE_"):]
        bases = (Error,) + _ALSO.get(short, ())
        classes[code] = type(short, bases, {
            "code": code, "name": name, "description": strerror(code),
            "__module__": "libthrottle",
            "__doc__": "%s (%d): %s" % (name, code, strerror(code)),
        })
        code -= 1
    return classes


class RequestError(Exception):
    """A request's final answer was not a success.  .status, .headers,
    .body (bytes) and .code (the body's error.code, "" when none) describe
    the last answer; .attempts counts the requests sent."""

    def __init__(self, message, status=None, headers=None, body=b"",
                 code="", attempts=0, retry_after=None):
        super().__init__(message)
        self.status = status
        self.headers = headers
        self.body = body
        self.code = code
        self.attempts = attempts
        self.retry_after = retry_after


class PermanentError(RequestError):
    """The server said no for good (409 CONFLICT, other 4xx, 501, ...).
    The request was sent once and not retried."""


class GaveUp(RequestError):
    """Still transient (locked, 429, 503, 5xx, transport errors) when the
    retry budget or the timeout ran out.  .retry_after is the last delay the
    server asked for, in seconds (None when it named none): hold the
    producer back at least that long before trying again."""
