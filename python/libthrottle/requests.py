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

Only the standard library is needed to import libthrottle; this module
needs `requests` (Debian: python3-requests).  Rejected: a urllib3 Retry
subclass (it sees neither the admission nor the other processes, and
urllib3 sleeps on its own clock).
"""

import requests as _requests
from requests.adapters import HTTPAdapter

from ._http import TransportError, run
from ._base import _BY_NAME, _key

EKEY = _BY_NAME["EKEY"]

__all__ = ["ThrottleAdapter", "session"]


class ThrottleAdapter(HTTPAdapter):
    """A requests transport adapter that admits, sends, reports and
    retries each request under a throttle key.

    key: the key (str or bytes), or a callable(PreparedRequest) -> key.
    throttle: a libthrottle.Throttle (default: the process's shared one).
    retries, timeout, klass, locked_codes: as libthrottle.request()
    (timeout bounds the whole call, waiting included; requests' own
    timeout= still bounds each attempt).  Other keywords go to
    HTTPAdapter."""

    def __init__(self, key, throttle=None, retries=10, timeout=300,
                 klass="live", locked_codes=None, **kwargs):
        if not callable(key) and not 1 <= len(_key(key)) <= 255:
            # a bad key fails here, not at the first request
            raise EKEY("key must be 1 to 255 bytes: %r" % (key,))
        self.throttle_key = key
        self.throttle = throttle
        self.throttle_retries = retries
        self.throttle_timeout = timeout
        self.throttle_klass = klass
        self.throttle_locked_codes = locked_codes
        super().__init__(**kwargs)

    def send(self, request, **kwargs):
        key = self.throttle_key(request) if callable(self.throttle_key) \
            else self.throttle_key
        last = {}

        def attempt(_left):
            try:
                resp = super(ThrottleAdapter, self).send(request, **kwargs)
            except (_requests.ConnectionError, _requests.Timeout) as e:
                last["error"] = e
                raise TransportError(str(e)) from e
            # the body is read here, before the slot is given back: the
            # classification needs it, and a stream is not re-readable
            body = resp.content
            last["response"] = resp
            return resp.status_code, resp.headers, body

        status, _, _, out, attempts = run(
            key, attempt, self.throttle, self.throttle_retries,
            self.throttle_timeout, self.throttle_klass,
            self.throttle_locked_codes, give_up=False)
        if status is None:  # no answer, ever: requests' own exception
            raise last["error"]
        resp = last["response"]
        resp.throttle_outcome = out
        resp.throttle_attempts = attempts
        return resp


def session(key, throttle=None, retries=10, timeout=300, klass="live",
            locked_codes=None, prefixes=("http://", "https://")):
    """A requests.Session whose http and https requests go through a
    ThrottleAdapter for key."""
    s = _requests.Session()
    adapter = ThrottleAdapter(key, throttle, retries, timeout, klass,
                              locked_codes)
    for p in prefixes:
        s.mount(p, adapter)
    return s
