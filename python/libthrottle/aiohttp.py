# SPDX-License-Identifier: MIT
"""libthrottle.aiohttp — the admit / send / classify / retry loop around
an aiohttp request, admitted through an AsyncThrottle so that a waiting
request never blocks the event loop.

    import aiohttp, libthrottle.aiohttp as la

    async with aiohttp.ClientSession() as s:
        r = await la.request(s, "hotdata:ws1/orders", "POST", url, data=b"...")
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

Rejected: an aiohttp client middleware (aiohttp >= 3.12), for now: it
sees the request after its body became a payload object, which a retry
cannot always send again; and a ClientSession subclass (aiohttp warns
against inheriting from it, and its public methods all go through one
private one).

Needs aiohttp (pip install libthrottle[aiohttp]).
"""

import asyncio
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import aiohttp

from ._answers import Classifier
from ._async import AsyncThrottle, arun
from ._base import Key, Seconds
from ._http import TransportError, check_url
from ._replay import REPLAY_LIMIT, replayable_async
from ._throttle import Throttle

__all__ = ["request"]

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
    last: Dict[str, Any] = {}

    async def attempt(_left: Optional[float]) -> Tuple[int, Any, bytes]:
        try:
            resp = await session.request(method, url, data=body.rewind(),
                                         **kw)
            try:
                content = await resp.read()
            finally:
                resp.release()
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
