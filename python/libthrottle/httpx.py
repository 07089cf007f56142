# SPDX-License-Identifier: MIT
"""libthrottle.httpx — the admit / send / classify / retry loop as httpx
transports, one for httpx.Client and one for httpx.AsyncClient.

    import httpx, libthrottle.httpx as lh

    client = httpx.Client(transport=lh.ThrottleTransport("hotdata:ws1/orders"))
    r = client.post("https://api.example/v1/tables/orders/load",
                    content=b"...")

    async with httpx.AsyncClient(transport=lh.AsyncThrottleTransport(
            "hotdata:ws1/orders")) as client:
        r = await client.post(url, content=b"...")

Each request is admitted under its key (a str, or a callable(httpx.Request)
-> key), sent by the wrapped transport (default httpx.HTTPTransport() /
httpx.AsyncHTTPTransport(); pass your own for proxies, TLS, HTTP/2),
classified by the C library (or classifier=), reported, and sent again
while it is transient, as libthrottle.request() does; the async transport
admits through an AsyncThrottle (libthrottle._async), so a waiting request
never blocks the event loop.  The transport returns the final response,
its body read: a 2xx, a permanent answer (sent once), or the last
transient answer when the budget ran out (r.raise_for_status() as
usual); r.extensions["libthrottle"] is {"outcome": Outcome, "attempts": n}.
A request that never got an answer raises httpx's own exception for the
last attempt.  Bodies are sent whole on every attempt: a streamed body is
read first, up to replay_limit bytes (libthrottle._replay).

Needs httpx (pip install libthrottle[httpx]).
"""

from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import httpx

from ._answers import Classifier
from ._async import AsyncThrottle, arun
from ._base import Key, Seconds
from ._http import TransportError, check_url, run
from ._replay import REPLAY_LIMIT, ReplayableBody, replayable_async
from ._throttle import Throttle

__all__ = ["ThrottleTransport", "AsyncThrottleTransport"]

KeyOf = Union[Key, Callable[[httpx.Request], Key]]


class _Settings:
    def __init__(self, key: KeyOf, retries: int, timeout: Optional[Seconds],
                 klass: str, locked_codes: Optional[Sequence[str]],
                 classifier: Optional[Classifier], replay_limit: int) -> None:
        ReplayableBody(None, replay_limit)  # checks the value
        self.key, self.retries, self.timeout = key, retries, timeout
        self.klass, self.locked_codes = klass, locked_codes
        self.classifier, self.replay_limit = classifier, replay_limit

    def key_of(self, request: httpx.Request) -> Key:
        # a malformed URL is not retried
        check_url(str(request.url), any_scheme=True)
        return self.key(request) if callable(self.key) else self.key

    def loop_args(self) -> Dict[str, Any]:
        return dict(retries=self.retries, timeout=self.timeout,
                    klass=self.klass, locked_codes=self.locked_codes,
                    give_up=False, classifier=self.classifier)


def _replace_stream(request: httpx.Request, data: bytes) -> None:
    """Send data (a stream read into memory) with a Content-Length."""
    request.stream = httpx.ByteStream(data)
    request.headers.pop("Transfer-Encoding", None)
    request.headers["Content-Length"] = str(len(data))


def _answer(request: httpx.Request, resp: httpx.Response,
            raw: bytes) -> httpx.Response:
    """A response of raw (as received, encoded) whose .content is read."""
    out = httpx.Response(resp.status_code, headers=resp.headers,
                         stream=httpx.ByteStream(raw),
                         extensions=dict(resp.extensions), request=request)
    out.read()
    return out


def _finish(status: Any, out: Any, attempts: int,
            last: Dict[str, Any]) -> httpx.Response:
    if status is None:  # no answer, ever: httpx's own exception
        raise last["error"]
    resp: httpx.Response = last["response"]
    resp.extensions["libthrottle"] = {"outcome": out, "attempts": attempts}
    return resp


class ThrottleTransport(httpx.BaseTransport):
    """An httpx transport for httpx.Client: admits, sends (through
    transport), reports and retries each request under key.  throttle: a
    libthrottle.Throttle (default: the process's shared one); retries,
    timeout, klass, locked_codes, classifier: as libthrottle.request();
    replay_limit: the most bytes of a streamed body kept to send again."""

    def __init__(self, key: KeyOf,
                 transport: Optional[httpx.BaseTransport] = None,
                 throttle: Optional[Throttle] = None, retries: int = 10,
                 timeout: Optional[Seconds] = 300, klass: str = "live",
                 locked_codes: Optional[Sequence[str]] = None,
                 classifier: Optional[Classifier] = None,
                 replay_limit: int = REPLAY_LIMIT) -> None:
        self.settings = _Settings(key, retries, timeout, klass, locked_codes,
                                  classifier, replay_limit)
        self.transport = transport if transport is not None \
            else httpx.HTTPTransport()
        self.throttle = throttle

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = self.settings.key_of(request)
        if not isinstance(request.stream, httpx.ByteStream):
            body = ReplayableBody(request.stream, self.settings.replay_limit)
            _replace_stream(request, body.data)
        last: Dict[str, Any] = {}

        def attempt(_left: Optional[float]) -> Tuple[int, Any, bytes]:
            try:
                resp = self.transport.handle_request(request)
                try:
                    raw = b"".join(resp.stream)
                finally:
                    resp.close()
            except httpx.TransportError as e:
                last["error"] = e
                raise TransportError(str(e)) from e
            out = last["response"] = _answer(request, resp, raw)
            return out.status_code, out.headers, out.content

        status, _, _, out, attempts = run(key, attempt, self.throttle,
                                          **self.settings.loop_args())
        return _finish(status, out, attempts, last)

    def close(self) -> None:
        self.transport.close()


class AsyncThrottleTransport(httpx.AsyncBaseTransport):
    """ThrottleTransport for httpx.AsyncClient: the same, admitted through
    an AsyncThrottle (throttle: an AsyncThrottle or a Throttle to wrap;
    default: the process's shared one), so that waiting never blocks the
    event loop."""

    def __init__(self, key: KeyOf,
                 transport: Optional[httpx.AsyncBaseTransport] = None,
                 throttle: Union[AsyncThrottle, Throttle, None] = None,
                 retries: int = 10, timeout: Optional[Seconds] = 300,
                 klass: str = "live",
                 locked_codes: Optional[Sequence[str]] = None,
                 classifier: Optional[Classifier] = None,
                 replay_limit: int = REPLAY_LIMIT) -> None:
        self.settings = _Settings(key, retries, timeout, klass, locked_codes,
                                  classifier, replay_limit)
        self.transport = transport if transport is not None \
            else httpx.AsyncHTTPTransport()
        self.throttle = AsyncThrottle(throttle) \
            if isinstance(throttle, Throttle) else throttle

    async def handle_async_request(self, request: httpx.Request
                                   ) -> httpx.Response:
        key = self.settings.key_of(request)
        if not isinstance(request.stream, httpx.ByteStream):
            body = await replayable_async(request.stream,
                                          self.settings.replay_limit)
            _replace_stream(request, body.data)
        last: Dict[str, Any] = {}

        async def attempt(_left: Optional[float]) -> Tuple[int, Any, bytes]:
            try:
                resp = await self.transport.handle_async_request(request)
                try:
                    raw = b"".join([c async for c in resp.stream])
                finally:
                    await resp.aclose()
            except httpx.TransportError as e:
                last["error"] = e
                raise TransportError(str(e)) from e
            out = last["response"] = _answer(request, resp, raw)
            return out.status_code, out.headers, out.content

        status, _, _, out, attempts = await arun(
            key, attempt, self.throttle, **self.settings.loop_args())
        return _finish(status, out, attempts, last)

    async def aclose(self) -> None:
        await self.transport.aclose()
