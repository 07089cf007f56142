# SPDX-License-Identifier: MIT
"""libthrottle.requests — the admit / send / classify / retry loop for the
`requests` package, as a transport adapter.

    import requests, libthrottle.requests

    s = libthrottle.requests.session("hotdata:ws1/orders", retries=10)
    r = s.post("https://api.example/v1/tables/orders/load", data=b"...")

    # or one key per request: key=lambda req: "hotdata:%s" % table_of(req.url)
    s.mount("https://api.example/", libthrottle.requests.ThrottleAdapter(key))

Each request is admitted under its key, sent by requests' own
HTTPAdapter, classified by the C library, reported (a lock, 429 or 503 is
published to every process) and sent again while it is transient, as
libthrottle.request() does.  The adapter returns the final Response, in
the requests way: a 2xx, a permanent answer (sent once: a 409 CONFLICT),
or the last transient answer when the budget ran out; call
raise_for_status() as usual.  response.throttle_outcome is the
libthrottle.Outcome of that answer and response.throttle_attempts the
number of requests sent.  A request that never got an answer (connection
refused every time) raises requests' own exception for the last attempt.

Bodies: every attempt sends the first attempt's bytes.  A generator or
unseekable stream is read into memory first (at most replay_limit bytes,
64 MiB by default; more raises libthrottle.BodyNotReplayable before
anything is sent) and sent with a Content-Length; a seekable file is sent
again from the position it had (libthrottle._replay).  The adapter's
urllib3 never retries by itself (max_retries is 0 and stays so: a Retry of
urllib3 re-sends inside one admission, on its own clock, unseen by the
other processes; giving one raises ValueError).

Only the standard library is needed to import libthrottle; this module
needs `requests` (Debian: python3-requests).  Rejected: a urllib3 Retry
subclass (it sees neither the admission nor the other processes, and
urllib3 sleeps on its own clock).
"""

from typing import Any, Callable, Optional, Sequence, Tuple, Union

import requests as _requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from ._answers import Classifier
from ._base import _BY_NAME, Key, Seconds, _key
from ._http import TransportError, check_url, run
from ._replay import REPLAY_LIMIT, ReplayableBody
from ._throttle import Throttle

EKEY = _BY_NAME["EKEY"]

__all__ = ["ThrottleAdapter", "session", "throttle_session"]


class ThrottleAdapter(HTTPAdapter):
    """A requests transport adapter that admits, sends, reports and
    retries each request under a throttle key.

    key: the key (str or bytes), or a callable(PreparedRequest) -> key.
    throttle: a libthrottle.Throttle (default: the process's shared one).
    retries, timeout, klass, locked_codes, classifier: as
    libthrottle.request() (timeout bounds the whole call, waiting
    included; requests' own timeout= still bounds each attempt).
    replay_limit: the most bytes of a stream body kept to send again (see
    above).  Other keywords go to HTTPAdapter; max_retries other than 0
    raises ValueError."""

    def __init__(self, key: Union[Key, Callable[[Any], Key]],
                 throttle: Optional[Throttle] = None, retries: int = 10,
                 timeout: Optional[Seconds] = 300, klass: str = "live",
                 locked_codes: Optional[Sequence[str]] = None,
                 classifier: Optional[Classifier] = None,
                 replay_limit: int = REPLAY_LIMIT, **kwargs: Any) -> None:
        if not callable(key) and not 1 <= len(_key(key)) <= 255:
            # a bad key fails here, not at the first request
            raise EKEY("key must be 1 to 255 bytes: %r" % (key,))
        self.throttle_key = key
        self.throttle = throttle
        self.throttle_retries = retries
        self.throttle_timeout = timeout
        self.throttle_klass = klass
        self.throttle_locked_codes = locked_codes
        self.throttle_classifier = classifier
        ReplayableBody(None, replay_limit)  # checks the value
        self.replay_limit = replay_limit
        super().__init__(**kwargs)

    # urllib3 must not retry inside an admission: max_retries is always 0
    @property
    def max_retries(self) -> Retry:
        return Retry(0, read=False)

    @max_retries.setter
    def max_retries(self, value: Any) -> None:
        if value in (0, None):
            return
        if isinstance(value, Retry) and _no_retries(value):
            return
        raise ValueError(
            "ThrottleAdapter retries by itself (retries=%r); a urllib3 Retry "
            "(max_retries=%r) would re-send inside one admission, on its own "
            "clock: leave max_retries at 0" % (self.throttle_retries, value))

    def send(self, request: Any, **kwargs: Any) -> Any:
        # a malformed URL is not a transport error
        check_url(request.url, any_scheme=True)
        key = self.throttle_key(request) if callable(self.throttle_key) \
            else self.throttle_key
        body = ReplayableBody(request.body, self.replay_limit)
        if body.buffered:
            request.body = body.data
            request.headers.pop("Transfer-Encoding", None)
            request.headers["Content-Length"] = str(len(body.data))
        last: dict = {}

        def attempt(_left: Optional[float]) -> Tuple[int, Any, bytes]:
            request.body = body.rewind()
            try:
                resp = super(ThrottleAdapter, self).send(request, **kwargs)
            except (_requests.ConnectionError, _requests.Timeout) as e:
                last["error"] = e
                raise TransportError(str(e)) from e
            # the body is read here, before the slot is given back: the
            # classification needs it, and a stream is not re-readable
            content = resp.content
            last["response"] = resp
            return resp.status_code, resp.headers, content

        status, _, _, out, attempts = run(
            key, attempt, self.throttle, self.throttle_retries,
            self.throttle_timeout, self.throttle_klass,
            self.throttle_locked_codes, give_up=False,
            classifier=self.throttle_classifier)
        if status is None:  # no answer, ever: requests' own exception
            raise last["error"]
        resp = last["response"]
        resp.throttle_outcome = out
        resp.throttle_attempts = attempts
        return resp


def _no_retries(r: Retry) -> bool:
    """A Retry that never re-sends (the one HTTPAdapter makes of 0)."""
    counts = (r.total, r.connect, r.read, r.status, r.other)
    return all(c in (0, None, False) for c in counts) and \
        r.total in (0, False) and not r.status_forcelist


def session(key: Union[Key, Callable[[Any], Key]],
            throttle: Optional[Throttle] = None, retries: int = 10,
            timeout: Optional[Seconds] = 300, klass: str = "live",
            locked_codes: Optional[Sequence[str]] = None,
            prefixes: Sequence[str] = ("http://", "https://"),
            classifier: Optional[Classifier] = None,
            replay_limit: int = REPLAY_LIMIT) -> _requests.Session:
    """A requests.Session whose http and https requests go through a
    ThrottleAdapter for key."""
    return throttle_session(_requests.Session(), key, throttle, retries,
                            timeout, klass, locked_codes, prefixes,
                            classifier, replay_limit)


def throttle_session(s: _requests.Session,
                     key: Union[Key, Callable[[Any], Key]],
                     throttle: Optional[Throttle] = None, retries: int = 10,
                     timeout: Optional[Seconds] = 300, klass: str = "live",
                     locked_codes: Optional[Sequence[str]] = None,
                     prefixes: Sequence[str] = ("http://", "https://"),
                     classifier: Optional[Classifier] = None,
                     replay_limit: int = REPLAY_LIMIT) -> _requests.Session:
    """Mount a ThrottleAdapter for key on an existing session (one made
    by a library) for each of prefixes; returns s.  The adapters it had
    there are replaced: their own retries would re-send inside an
    admission."""
    adapter = ThrottleAdapter(key, throttle, retries, timeout, klass,
                              locked_codes, classifier=classifier,
                              replay_limit=replay_limit)
    for p in prefixes:
        s.mount(p, adapter)
    return s
