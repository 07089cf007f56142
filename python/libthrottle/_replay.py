# SPDX-License-Identifier: MIT
"""_replay.py — request bodies that a retry sends again byte for byte.

Every retrying path of the package (the requests adapter, the httpx
transports, the aiohttp wrapper, the urllib3 pool manager) sends a body
once per attempt; a body that is consumed by sending it (a generator, an
iterator, a pipe) would go out short or empty on the second attempt, and
the server would load less than was meant (a 409, then 200 {"loaded": 0}),
or wait for bytes that never come.  ReplayableBody takes the body before
the first attempt:

  * bytes, bytearray, memoryview, str, None: kept as they are;
  * a seekable file (seekable() true, tell() works): not read here; each
    attempt starts again from the position it had at the first (its
    length is what the client measured from there);
  * anything else iterable or readable (a generator, an iterator, an
    unseekable file, an async iterator for the async clients): read into
    memory up to `limit` bytes (REPLAY_LIMIT, 64 MiB, by default; the
    clients' replay_limit= changes it) and sent as those bytes, with a
    Content-Length instead of chunked encoding;
  * larger than the limit, or limit=0: BodyNotReplayable, raised before
    anything was sent (what was read of a generator is lost with it: pass
    bytes, a seekable file, or a larger limit).

Rejected: re-calling a generator function (the client has the generator,
not the function), and streaming the first attempt while teeing it to a
buffer (a refusal after the first bytes went out would leave a body half
kept, and the limit could be passed in the middle of a send).
"""

import io
from typing import (Any, AsyncIterable, Dict, Iterable, Optional,
                    Union)

from ._errors import BodyNotReplayable

REPLAY_LIMIT = 64 * 1024 * 1024
CHUNK = 64 * 1024

Bytes = (bytes, bytearray, memoryview)


def _limit(limit):
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise TypeError("replay_limit must be an int >= 0 (bytes)")
    return limit


def _too_big(limit):
    if limit == 0:
        return BodyNotReplayable(
            "the request body is a stream and replay_limit is 0: a retry "
            "could not send it again; nothing was sent")
    return BodyNotReplayable(
        "the request body is a stream of more than %d bytes (replay_limit): "
        "a retry could not send it again; nothing was sent (pass bytes, a "
        "seekable file, or a larger replay_limit)" % limit)


def _seekable(body):
    try:
        if not body.seekable():
            return None
        return body.tell()
    except (AttributeError, OSError, ValueError):
        return None


class ReplayableBody:
    """A request body every attempt can send in full (see the top of the
    file).  .data is the body to send (bytes, or the seekable file, or
    None); .buffered is True when a stream was read into .data; rewind()
    puts a file back where the first attempt started and returns .data."""

    __slots__ = ("data", "buffered", "_start")

    def __init__(self, body: Any, limit: int = REPLAY_LIMIT) -> None:
        limit = _limit(limit)
        self.buffered = False
        self._start: Optional[int] = None
        if body is None or isinstance(body, (str,) + Bytes):
            self.data: Any = body
            return
        start = _seekable(body) if hasattr(body, "read") else None
        if start is not None:
            self.data, self._start = body, start
            return
        self.data = self._read(body, limit)
        self.buffered = True

    @staticmethod
    def _read(body: Any, limit: int) -> bytes:
        buf = io.BytesIO()
        if hasattr(body, "read"):
            def chunks() -> Iterable[Any]:
                while True:
                    c = body.read(CHUNK)
                    if not c:
                        return
                    yield c
            it: Iterable[Any] = chunks()
        elif isinstance(body, Iterable):
            it = body
        else:
            raise TypeError("request body of type %s is neither bytes, a "
                            "file nor an iterable" % type(body).__name__)
        for c in it:
            if isinstance(c, str):
                c = c.encode("utf-8")
            buf.write(c)
            if buf.tell() > limit:
                raise _too_big(limit)
        return buf.getvalue()

    def rewind(self) -> Any:
        if self._start is not None:
            self.data.seek(self._start)
        return self.data

    def __len__(self) -> int:
        if isinstance(self.data, str):
            return len(self.data.encode("utf-8"))
        if isinstance(self.data, Bytes):
            return len(self.data)
        return 0


def sized_headers(headers: Any, length: int) -> Dict[str, Any]:
    """A copy of headers (a mapping, or None) for a body of length bytes
    read into memory: Content-Length, and no Transfer-Encoding."""
    out = {k: v for k, v in dict(headers or {}).items()
           if str(k).lower() not in ("transfer-encoding", "content-length")}
    out["Content-Length"] = str(length)
    return out


async def replayable_async(body: Union[AsyncIterable[Any], Any],
                           limit: int = REPLAY_LIMIT) -> ReplayableBody:
    """ReplayableBody for the async clients: an async iterator is read
    (up to limit) into bytes; anything else as ReplayableBody."""
    if hasattr(body, "__aiter__"):
        limit = _limit(limit)
        buf = io.BytesIO()
        async for c in body:
            if isinstance(c, str):
                c = c.encode("utf-8")
            buf.write(c)
            if buf.tell() > limit:
                raise _too_big(limit)
        out = ReplayableBody(buf.getvalue(), limit)
        out.buffered = True
        return out
    return ReplayableBody(body, limit)
