# SPDX-License-Identifier: MIT
"""libthrottle — share "come back later" between the processes of a host.

A Python binding (ctypes, standard library only) of the libthrottle C
library: a Retry-After seen by one process holds back every process that
writes the same key; admissions are capped per key, first come first
served, live before backfill.

    import libthrottle

    t = libthrottle.Throttle()
    with t.admit("hotdata:ws1/orders", klass="live", timeout=30) as adm:
        status, headers, body = send()
        out = adm.report(status, headers, body)   # classify, publish, release

    libthrottle.request("hotdata:ws1/orders", url, data=b"...")  # the loop

Errors: every THROTTLE_E* code is a subclass of libthrottle.Error named
after it (libthrottle.EFULL, libthrottle.ETIMEDOUT, ...); request() raises
PermanentError and GaveUp.  The module layout: _capi (finding the library,
the prototypes), _errors (the exceptions), _base (argument checks),
_answers (classification, Retry-After), _throttle (Throttle), _admission (Admission),
_http (the retry loop, request), _replay (bodies a retry sends again),
_async (AsyncThrottle), requests (an adapter for requests), httpx,
aiohttp, urllib3, tenacity (the clients' integrations; each needs its
client, the rest of the package only the standard library).
"""

from typing import Optional, Union

from ._errors import Error, GaveUp, PermanentError, RequestError
from ._errors import (  # written out, so that type checkers see them
    EINVAL, ENOMEM, EKEY, ESHM, ENOSPC, EMAGIC, EVERSION, EFINGERPRINT, ESIZE,
    EOWNER, EMODE, EINITTIMEOUT, ELOCKTIMEOUT, ECORRUPT, EFULL, ENOKEY,
    ETIMEDOUT, EWOULDBLOCK, ECANCELED, ESYS, ESYMLINK, EINTR, ESTALE,
    EREADONLY, EBACKEND, ThrottleClosed, BodyNotReplayable)
from ._answers import (Classifier, Outcome, classify, classify_response,
                       parse_retry_after)
from ._base import ERRORS, HAVE_INTERRUPT, _core, _text, error
from ._admission import Admission, StaleAdmissionWarning
from ._throttle import FallbackWarning, Throttle
from ._http import TransportError, check_url, default_throttle, request, run
from ._replay import REPLAY_LIMIT, ReplayableBody
from ._async import (AsyncAdmission, AsyncThrottle, arun,
                     default_async_throttle)
from . import instrument  # a module, and called: instrument.instrument()
from .instrument import NotAdmitted, Rule, uninstrument

# One module attribute per C error code: libthrottle.EFULL, ... (the
# written ones above, and any a newer library added)
globals().update({cls.__name__: cls for cls in ERRORS.values()})

__version__: str = _text(_core.throttle_version_string())


def version() -> str:
    """The loaded C library's version string, e.g. "1.0.0"."""
    return _text(_core.throttle_version_string())


def unlink(segment: Optional[Union[str, bytes]] = None) -> None:
    """Remove a segment (None: the default name); processes that have it
    open keep their mapping.  Raises ENOKEY when there is none."""
    raw = None
    if segment is not None:
        if not isinstance(segment, (str, bytes)):
            raise TypeError("segment must be str or bytes")
        raw = segment.encode() if isinstance(segment, str) else segment
    rc = _core.throttle_unlink(raw)
    if rc != 0:
        raise error(rc, "%s: %s" % (segment or "default segment",
                                    _text(_core.throttle_strerror(rc))))


__all__ = [
    "Throttle", "Admission", "Outcome", "Error", "PermanentError", "GaveUp",
    "RequestError", "FallbackWarning", "StaleAdmissionWarning",
    "TransportError", "classify", "parse_retry_after", "request", "run",
    "default_throttle", "unlink", "version", "ERRORS", "HAVE_INTERRUPT",
    "ThrottleClosed", "BodyNotReplayable", "AsyncThrottle", "AsyncAdmission",
    "Classifier", "classify_response", "ReplayableBody", "REPLAY_LIMIT",
    "check_url", "arun", "default_async_throttle", "EINVAL", "ENOMEM", "EKEY", "ESHM", "ENOSPC", "EMAGIC",
    "EVERSION", "EFINGERPRINT", "ESIZE", "EOWNER", "EMODE", "EINITTIMEOUT",
    "ELOCKTIMEOUT", "ECORRUPT", "EFULL", "ENOKEY", "ETIMEDOUT", "EWOULDBLOCK",
    "ECANCELED", "ESYS", "ESYMLINK", "EINTR", "ESTALE", "EREADONLY",
    "EBACKEND", "instrument", "uninstrument", "Rule", "NotAdmitted"]
# and the class of any code a newer C library added
__all__ += [c.__name__ for c in ERRORS.values() if c.__name__ not in __all__]
