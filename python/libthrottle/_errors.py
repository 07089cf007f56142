# SPDX-License-Identifier: MIT
"""_errors.py — the exceptions: one Error subclass per THROTTLE_E* code,
the outcomes of request() that are not C errors (PermanentError, GaveUp),
ThrottleClosed, and BodyNotReplayable.

The classes of the C codes are written out below, so that a type checker
(mypy) sees libthrottle.ETIMEDOUT and an `except libthrottle.EFULL:` is
checked like any other; at import, make_classes() walks the C library's
own table (throttle_err_name() for 0, -1, -2, ... until it answers
THROTTLE_UNKNOWN), gives each written class its description, and makes a
class for a code appended to the C table after this file was written
(never renumbered), so a newer library's code is still its own class.
tests/python/test_errors.py fails when the written list and the header's
table differ.  Each class is named after its code without the prefix
(THROTTLE_EFULL -> libthrottle.EFULL, like Python's errno names), and has
.code, .name and .description; an instance carries the handle's message
(throttle_errmsg) as its text.  A few also derive from the built-in
exception a Python caller would catch for that condition (an invalid
argument or key is a ValueError, a missing key a KeyError, a timeout a
TimeoutError).

Rejected: CamelCase names made from the codes (EINITTIMEOUT and
ELOCKTIMEOUT have no reliable word breaks, and the C names are the ones in
the docs, logs and throttle_errmsg texts).
"""

from typing import Any, Callable, Dict, Optional, Tuple, Type

class Error(Exception):
    """A libthrottle C error.  .code is the THROTTLE_E* value (negative),
    .name its name ("THROTTLE_EFULL"), str() the message with context."""

    code: int = 0
    name: str = ""
    description: str = ""

    def __init__(self, message: Optional[str] = None,
                 code: Optional[int] = None) -> None:
        if code is not None:
            self.code = code
        if message is None or message == "":
            message = self.description or "libthrottle error %s" % self.code
        self.message = message
        # ValueError and TimeoutError take the message as their one arg
        super().__init__(message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> Tuple[Any, ...]:  # picklable across processes
        return (type(self), (self.message, self.code))


# ---- one class per THROTTLE_E* code (include/throttle.h's table) ------------

class EINVAL(Error, ValueError):
    code = -1
    name = "THROTTLE_EINVAL"


class ENOMEM(Error):
    code = -2
    name = "THROTTLE_ENOMEM"


class EKEY(Error, ValueError):
    code = -3
    name = "THROTTLE_EKEY"


class ESHM(Error):
    code = -4
    name = "THROTTLE_ESHM"


class ENOSPC(Error):
    code = -5
    name = "THROTTLE_ENOSPC"


class EMAGIC(Error):
    code = -6
    name = "THROTTLE_EMAGIC"


class EVERSION(Error):
    code = -7
    name = "THROTTLE_EVERSION"


class EFINGERPRINT(Error):
    code = -8
    name = "THROTTLE_EFINGERPRINT"


class ESIZE(Error):
    code = -9
    name = "THROTTLE_ESIZE"


class EOWNER(Error):
    code = -10
    name = "THROTTLE_EOWNER"


class EMODE(Error):
    code = -11
    name = "THROTTLE_EMODE"


class EINITTIMEOUT(Error):
    code = -12
    name = "THROTTLE_EINITTIMEOUT"


class ELOCKTIMEOUT(Error):
    code = -13
    name = "THROTTLE_ELOCKTIMEOUT"


class ECORRUPT(Error):
    code = -14
    name = "THROTTLE_ECORRUPT"


class EFULL(Error):
    code = -15
    name = "THROTTLE_EFULL"


class ENOKEY(Error, KeyError):
    code = -16
    name = "THROTTLE_ENOKEY"


class ETIMEDOUT(Error, TimeoutError):
    code = -17
    name = "THROTTLE_ETIMEDOUT"


class EWOULDBLOCK(Error):
    code = -18
    name = "THROTTLE_EWOULDBLOCK"


class ECANCELED(Error):
    code = -19
    name = "THROTTLE_ECANCELED"


class ESYS(Error):
    code = -20
    name = "THROTTLE_ESYS"


class ESYMLINK(Error):
    code = -21
    name = "THROTTLE_ESYMLINK"


class EINTR(Error):
    code = -22
    name = "THROTTLE_EINTR"


class ESTALE(Error):
    code = -23
    name = "THROTTLE_ESTALE"


class EREADONLY(Error):
    code = -24
    name = "THROTTLE_EREADONLY"


class EBACKEND(Error):
    code = -25
    name = "THROTTLE_EBACKEND"


# written above: name -> class
WRITTEN: Dict[str, Type[Error]] = {
    cls.__name__: cls for cls in Error.__subclasses__()}


class ThrottleClosed(EINVAL):
    """The Throttle was closed while (or before) this call waited: close()
    from another thread ends every wait and admission in progress on it
    with this exception, which is how a pool of waiting threads is
    stopped.  Also an EINVAL (and so a ValueError), as before."""



def make_classes(err_name: Callable[[int], str],
                 strerror: Callable[[int], str]) -> Dict[int, Type[Error]]:
    """{code: class} for every code the library knows: the written class,
    or one made now for a code newer than this file."""
    classes: Dict[int, Type[Error]] = {}
    code = -1
    while True:
        name = err_name(code)
        if name == "THROTTLE_UNKNOWN" or code < -4096:
            break
        short = name[len("THROTTLE_"):]
        desc = strerror(code)
        doc = "%s (%d): %s" % (name, code, desc)
        cls = WRITTEN.get(short)
        if cls is not None and cls.code == code:
            cls.description = desc
            cls.__doc__ = doc
        else:
            cls = type(short, (Error,), {
                "code": code, "name": name, "description": desc,
                "__module__": "libthrottle", "__doc__": doc})
        classes[code] = cls
        code -= 1
    return classes


class RequestError(Exception):
    """A request's final answer was not a success.  .status, .headers,
    .body (bytes) and .code (the body's error.code, "" when none) describe
    the last answer; .attempts counts the requests sent."""

    def __init__(self, message: str, status: Optional[int] = None,
                 headers: Any = None, body: bytes = b"", code: str = "",
                 attempts: int = 0,
                 retry_after: Optional[float] = None) -> None:
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


class BodyNotReplayable(ValueError):
    """A request body that a retry could not send again byte for byte (a
    generator or unseekable stream larger than the replay buffer, or with
    buffering turned off), refused before anything was sent."""


for _cls in list(WRITTEN.values()) + [ThrottleClosed]:
    _cls.__module__ = "libthrottle"  # shown and pickled as libthrottle.EFULL
