# SPDX-License-Identifier: MIT
"""libthrottle.aiohttp — the admit / send / classify / retry loop around
an aiohttp request, admitted through an AsyncThrottle so that a waiting
request never blocks the event loop.

    import aiohttp, libthrottle.aiohttp as la

    async with aiohttp.ClientSession() as s:
        r = await la.request(s, "hotdata:ws1/orders", "POST", url, data=b"...")
        print(r.status, await r.json())

    # aiohttp >= 3.12: every request of a session, as a client middleware
    async with aiohttp.ClientSession(middlewares=(
            la.middleware("hotdata:ws1/orders"),)) as s:
        async with s.post(url, data=b"...") as r:
            print(r.status, await r.json())

request() takes session.request()'s arguments (data=, json=, headers=,
timeout= of aiohttp for each attempt, ...) plus the loop's (throttle, an
AsyncThrottle or a Throttle to wrap; retries, total_timeout (the whole
call, waiting included), klass, locked_codes, classifier, replay_limit),
and returns the final ClientResponse with its body read and released (a
2xx, a permanent answer sent once, or the last transient answer when the
budget ran out; raise_for_status() as usual); r.throttle_outcome and
r.throttle_attempts describe it.  A request that never got an answer
raises aiohttp's own exception for the last attempt.  Bodies are sent
whole on every attempt (libthrottle._replay: an async or sync generator
or a pipe is read first, up to replay_limit bytes; a seekable file is
rewound).

middleware(key, ...) (aiohttp >= 3.12) runs the same loop around the
session's handler: the request's body, by then an aiohttp payload, is
read into memory first unless it is bytes (at most replay_limit bytes;
a payload of unknown or larger size is refused with BodyNotReplayable
before anything is sent, once it is read), and each attempt sends those
bytes.  key may be a callable(aiohttp.ClientRequest) -> key.

Rejected: a ClientSession subclass (aiohttp warns against inheriting from
it, and its public methods all go through one private one).

Needs aiohttp (pip install libthrottle[aiohttp]).
"""

import asyncio
from typing import (Any, Awaitable, Callable, Dict, Optional, Sequence,
                    Tuple, Union)

import aiohttp

from ._answers import Classifier
from ._async import AsyncThrottle, arun
from ._base import Key, Seconds
from ._http import TransportError, check_url
from ._errors import BodyNotReplayable
from ._replay import REPLAY_LIMIT, replayable_async
from ._throttle import Throttle

__all__ = ["request", "middleware"]

_NO_ANSWER = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError,
              asyncio.TimeoutError)


async def request(session: aiohttp.ClientSession, key: Key, method: str,
                  url: str, *,
                  throttle: Union[AsyncThrottle, Throttle, None] = None,
                  retries: int = 10, total_timeout: Optional[Seconds] = 300,
                  klass: str = "live",
                  locked_codes: Optional[Sequence[str]] = None,
                  classifier: Optional[Classifier] = None,
                  replay_limit: int = REPLAY_LIMIT, data: Any = None,
                  **kw: Any) -> aiohttp.ClientResponse:
    """One aiohttp request through the loop (see the top of the file)."""
    check_url(str(url))  # a malformed URL is not a transport error
    at = AsyncThrottle(throttle) if isinstance(throttle, Throttle) \
        else throttle
    body = await replayable_async(data, replay_limit)
    async def send() -> Tuple[aiohttp.ClientResponse, bytes]:
        resp = await session.request(method, url, data=body.rewind(), **kw)
        try:
            return resp, await resp.read()
        finally:
            resp.release()

    return await _loop(send, key, at, retries, total_timeout, klass,
                       locked_codes, classifier)


async def _loop(send: Callable[[], Awaitable[Tuple[aiohttp.ClientResponse,
                                                   bytes]]],
                key: Key, at: Optional[AsyncThrottle], retries: int,
                total_timeout: Optional[Seconds], klass: str,
                locked_codes: Optional[Sequence[str]],
                classifier: Optional[Classifier]) -> aiohttp.ClientResponse:
    """arun() around send() (one attempt: the response and its body): the
    final response, or aiohttp's own exception when nothing answered."""
    last: Dict[str, Any] = {}

    async def attempt(_left: Optional[float]) -> Tuple[int, Any, bytes]:
        try:
            resp, content = await send()
        except _NO_ANSWER as e:
            last["error"] = e
            raise TransportError(str(e) or type(e).__name__) from e
        last["response"] = resp
        return resp.status, resp.headers, content

    status, _, _, out, attempts = await arun(
        key, attempt, at, retries, total_timeout, klass, locked_codes,
        give_up=False, classifier=classifier)
    if status is None:  # no answer, ever: aiohttp's own exception
        raise last["error"]
    resp = last["response"]
    resp.throttle_outcome = out
    resp.throttle_attempts = attempts
    return resp


def middleware(key: Union[Key, Callable[[Any], Key]],
               throttle: Union[AsyncThrottle, Throttle, None] = None,
               retries: int = 10, total_timeout: Optional[Seconds] = 300,
               klass: str = "live",
               locked_codes: Optional[Sequence[str]] = None,
               classifier: Optional[Classifier] = None,
               replay_limit: int = REPLAY_LIMIT) -> Any:
    """An aiohttp client middleware (ClientSession(middlewares=(...,)),
    aiohttp >= 3.12) that runs every request of the session through the
    loop (see the top of the file)."""
    at = AsyncThrottle(throttle) if isinstance(throttle, Throttle) \
        else throttle

    async def throttled(req: Any, handler: Any) -> aiohttp.ClientResponse:
        check_url(str(req.url), any_scheme=True)
        k = key(req) if callable(key) else key
        body = req.body
        if not isinstance(body, (bytes, aiohttp.payload.BytesPayload)):
            # a stream or a file by now: kept in memory to send again
            if body.size is not None and body.size > replay_limit:
                raise BodyNotReplayable(
                    "the request body (%d bytes) is larger than "
                    "replay_limit (%d): a retry could not send it again; "
                    "nothing was sent" % (body.size, replay_limit))
            data = await body.as_bytes()
            if len(data) > replay_limit:
                raise BodyNotReplayable(
                    "the request body is a stream of more than %d bytes "
                    "(replay_limit): nothing was sent" % replay_limit)
            await req.update_body(data)
        async def send() -> Tuple[aiohttp.ClientResponse, bytes]:
            resp = await handler(req)
            return resp, await resp.read()

        return await _loop(send, k, at, retries, total_timeout, klass,
                           locked_codes, classifier)

    return throttled
