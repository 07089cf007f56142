# SPDX-License-Identifier: MIT
"""libthrottle.instrument — put the HTTP requests of code you do not change
through the gate: the requests of urllib3 (and so of `requests` and of
every SDK built on urllib3, such as `hotdata`) and of httpx (httpx.Client
and httpx.AsyncClient), where installed, whose method and URL match a
rule are admitted under a key made from the URL, their answers are
classified and published (a lock, a 429, a 503 holds back every process
of the host, or of every host on one Redis), and per rule either

  retry    a transient answer is not returned: the request is sent again
           (its body replayed from its first byte) once the shared
           back-off has passed, until an answer that is not transient or
           the rule's budget (retries, timeout) runs out; the client sees
           only that answer; or
  surface  the request is sent once and its answer returned as it is, so
           the client's own error (and its own retry) takes over; its next
           try waits for the shared back-off at admission.

    import libthrottle
    libthrottle.instrument(["hotdata"])            # the Hotdata preset
    libthrottle.instrument([libthrottle.Rule(
        "/v1/tables/{table}/load", "hotdata:{host}/{table}", cap="auto")])

or, without touching the program: python -m libthrottle.run --rule hotdata
-- python my_pipeline.py (libthrottle/run.py).

A rule, as a string (the launcher's --rule):
    [METHOD] PATH KEY [OPTION]...        or a preset: NAME [OPTION]...
PATH is the URL's path, "{name}" matching one segment ("*" any method,
default POST); KEY a template of the path's {names}, {host}, {port} and
{header:NAME} (a request header; a request without it is not matched).
OPTIONS: retry (default) | surface, class=live|backfill, cap=N|auto (the
key's concurrency cap, set on the key's first use in each process: auto
learns it from the server's lock answers), pool=N (a cap on the scope
just above the key, shared by every key beneath it; 0: none), retries=N (re-sends,
default 10), timeout=S (seconds for the whole call, waiting included;
default 300), host=HOST[:PORT] (only this host), replay_limit=BYTES (the
most bytes of a stream body kept to send again; see Bodies).
Presets: "hotdata" — the Hotdata API's table loads,
POST /v1/connections/{connection}/schemas/{schema}/tables/{table}/loads
under hotdata:{header:X-Workspace-Id}/{connection}/{table}, retry, cap=1,
pool=1: one load at a time per table, and per database (the connection
is the database's), whose loads the API locks together.  "hotdata
pool=0" keeps the tables of a database apart; "hotdata cap=auto pool=0"
learns each table's cap from its lock answers instead, at the cost of one
refusal and one Retry-After the first time.  Its
429s and 503s hold the whole workspace (the key's root scope,
hotdata:WORKSPACE).

Bodies (retry rules): every attempt sends the bytes of the first
(libthrottle._replay).  bytes, str and memoryview are sent again as they
are; a file object that can seek is rewound to where it stood; any other
body (a generator, an iterator, a pipe, httpx's content= iterator or
async iterator) is read into memory before the request is admitted, up
to the rule's replay_limit (bytes; REPLAY_LIMIT, 64 MiB, by default), and
sent as those bytes with a Content-Length instead of chunked encoding.  A
stream larger than that raises libthrottle.BodyNotReplayable (a
ValueError) before anything was admitted or sent; what was read of it is
lost: pass bytes, a seekable file, or a larger replay_limit=.  surface
rules (and retries=0) send the body once, as given: a stream is streamed.
A request that got no answer (a connection error, a read timeout) is
reported transient and its exception raised: whether it may be sent
again is the client's to decide.  A request not admitted within the
rule's timeout raises NotAdmitted (a TimeoutError).

Where: urllib3's HTTPConnectionPool.urlopen, so redirects and urllib3's
own retries of one admitted request happen inside its admission (a
requests that sends a chunked body itself, around urlopen, as 2.28 does,
is not instrumented for such bodies; 2.32 sends them through urlopen);
httpx.HTTPTransport.handle_request (httpx.Client); and
httpx.AsyncHTTPTransport.handle_async_request (httpx.AsyncClient), which
waits through a libthrottle.AsyncThrottle (one per event loop, over the
same Throttle): a request waiting for the shared back-off, the key's cap
or its queue never blocks the event loop, and takes no thread of its own
(libthrottle._async).  A client whose transport is of another class (a
transport of its own, httpx.MockTransport) is not instrumented.  A
request sent by one of the package's own clients (libthrottle.requests,
libthrottle.urllib3, libthrottle.httpx) is admitted by that client, under
its own key, and passed through here as it is.
"""

import inspect
import io
import weakref
import re
import sys
import threading
import types

from ._base import _key
from ._errors import Error, GaveUp
from ._http import SENDING, default_throttle, run
from ._replay import (REPLAY_LIMIT, ReplayableBody, replayable_async,
                      sized_headers)
from ._throttle import Throttle

__all__ = ["Rule", "NotAdmitted", "instrument", "uninstrument", "PRESETS",
           "parse_rules"]


class NotAdmitted(TimeoutError):
    """An instrumented request was not admitted within its rule's
    timeout (the key stayed locked, paused or full)."""


PRESETS = {
    "hotdata": ("POST",
                "/v1/connections/{connection}/schemas/{schema}/tables/"
                "{table}/loads",
                "hotdata:{header:X-Workspace-Id}/{connection}/{table}",
                {"cap": 1, "pool": 1}),
}

_SEGMENT = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_FIELD = re.compile(r"\{([^{}]+)\}")


class Rule:
    """Which requests go through the gate, and how (see the module's
    documentation for the fields)."""

    def __init__(self, path, key, method="POST", *, retry=True,
                 klass="live", cap=None, pool=None, retries=10,
                 timeout=300.0, host=None, locked_codes=None,
                 replay_limit=REPLAY_LIMIT):
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError("path must be a str starting with '/': %r"
                             % (path,))
        if not isinstance(key, str) or not key:
            raise ValueError("key must be a non-empty str template")
        if klass not in ("live", "backfill"):
            raise ValueError("class must be live or backfill: %r" % (klass,))
        if cap is not None and cap != "auto" and \
                (isinstance(cap, bool) or not isinstance(cap, int) or
                 not 1 <= cap <= 32):
            raise ValueError("cap must be 1 to 32 or 'auto': %r" % (cap,))
        if pool is not None and (isinstance(pool, bool) or
                                 not isinstance(pool, int) or
                                 not 1 <= pool <= 32):
            raise ValueError("pool must be 1 to 32: %r" % (pool,))
        if pool is not None and "/" not in key:
            raise ValueError("pool needs a key with a scope above it "
                             "(a '/' in %r)" % (key,))
        self.pool = pool
        self.path, self.key, self.method = path, key, method.upper()
        self.retry, self.klass, self.cap = bool(retry), klass, cap
        self.retries, self.timeout = int(retries), timeout
        self.host = host.lower() if host else None
        self.locked_codes = locked_codes
        ReplayableBody(None, replay_limit)  # checks the value
        self.replay_limit = replay_limit
        if isinstance(self.retries, bool) or self.retries < 0:
            raise ValueError("retries must be an int >= 0: %r" % (retries,))
        if timeout is not None and not timeout > 0:
            raise ValueError("timeout must be > 0 seconds: %r" % (timeout,))
        # odd items are the {names}: each matches one path segment
        parts = _SEGMENT.split(path)
        names = parts[1::2]
        if len(set(names)) != len(names):
            raise ValueError("path %r names a segment twice" % (path,))
        self._rx = re.compile("".join(
            re.escape(p) if i % 2 == 0 else "(?P<%s>[^/]+)" % p
            for i, p in enumerate(parts)) + "/?$")
        for f in _FIELD.findall(key):
            if f not in names and f not in ("host", "port") and \
                    not f.startswith("header:"):
                raise ValueError("key %r names {%s}, which the path %r "
                                 "does not capture" % (key, f, path))

    @classmethod
    def parse(cls, spec):
        """A rule from its string form (the module's documentation)."""
        words = spec.split()
        if not words:
            raise ValueError("an empty rule")
        opts = {}
        if words[0] in PRESETS:
            method, path, key, opts = PRESETS[words[0]]
            opts, rest = dict(opts), words[1:]
        else:
            if words[0].startswith("/"):
                method, words = "POST", words
            else:
                method, words = words[0], words[1:]
            if len(words) < 2:
                raise ValueError("a rule is [METHOD] PATH KEY [OPTION]... "
                                 "or a preset (%s): %r"
                                 % (", ".join(sorted(PRESETS)), spec))
            path, key, rest = words[0], words[1], words[2:]
        for w in rest:
            name, eq, value = w.partition("=")
            if w in ("retry", "surface"):
                opts["retry"] = w == "retry"
            elif eq and name in ("class", "klass"):
                opts["klass"] = value
            elif eq and name == "cap":
                opts["cap"] = value if value == "auto" else int(value)
            elif eq and name == "pool":
                opts["pool"] = int(value) or None  # 0: no pool
            elif eq and name == "retries":
                opts["retries"] = int(value)
            elif eq and name == "timeout":
                opts["timeout"] = float(value)
            elif eq and name == "host":
                opts["host"] = value
            elif eq and name == "replay_limit":
                opts["replay_limit"] = int(value)
            else:
                raise ValueError("unknown rule option %r in %r" % (w, spec))
        return cls(path, key, method, **opts)

    def match(self, method, scheme, host, port, path, headers):
        """The key for this request, or None when the rule does not
        apply."""
        if self.method not in ("*", method.upper()):
            return None
        if self.host is not None and self.host not in (
                host.lower(), "%s:%s" % (host.lower(), port)):
            return None
        m = self._rx.match(path.split("?", 1)[0])
        if m is None:
            return None
        values = m.groupdict()
        values.update(host=host, port=str(port))

        def field(f):
            if f.startswith("header:"):
                v = _header(headers, f[len("header:"):])
            else:
                v = values.get(f)
            if not v:
                raise LookupError(f)
            return v
        try:
            key = _FIELD.sub(lambda mm: field(mm.group(1)), self.key)
            ok = 1 <= len(_key(key)) <= 255
        except (LookupError, Error):  # a part missing, or not a key
            return None
        return key if ok else None

    def __repr__(self):
        return "Rule(%s %s -> %s, %s, class=%s%s%s)" % (
            self.method, self.path, self.key,
            "retry" if self.retry else "surface", self.klass,
            ", cap=%s" % self.cap if self.cap is not None else "",
            ", pool=%s" % self.pool if self.pool is not None else "")


def _header(headers, name):
    if not headers:
        return None
    name = name.lower()
    for k, v in headers.items():
        k = k.decode("latin-1") if isinstance(k, bytes) else k
        if k.lower() == name:
            return v.decode("latin-1") if isinstance(v, bytes) else str(v)
    return None


def parse_rules(rules):
    """A list of Rule from Rules, rule strings or preset names."""
    if isinstance(rules, (str, Rule)):
        rules = [rules]
    return [r if isinstance(r, Rule) else Rule.parse(r) for r in rules]


# ---- the urllib3 patch ----------------------------------------------------------

_state = {"rules": [], "throttle": None, "orig": None, "caps": set(),
          "stats": None}
_lock = threading.Lock()


def instrument(rules, throttle=None):
    """Route the matching requests of urllib3 (requests, the hotdata SDK,
    ...) and of httpx's transports (httpx.Client; httpx.AsyncClient,
    waiting without blocking the event loop) through the gate, in this
    process, from now on.  rules: Rule objects, rule strings or preset
    names (see the module); throttle: a Throttle (default: the process's
    shared one, opened on first use).  Calling it again replaces the
    rules.  Returns a dict of counters (admitted, resent, buffered: stream
    bodies read into memory to be sent again, not_admitted) that grows as
    requests go through, new with each call.  Raises ImportError when
    neither urllib3 nor httpx is installed.  A matching request whose
    stream body is larger than its rule's replay_limit raises
    BodyNotReplayable, unsent."""
    rules = parse_rules(rules)
    if throttle is not None and not isinstance(throttle, Throttle):
        raise TypeError("throttle must be a libthrottle.Throttle")
    try:
        import urllib3.connectionpool as cp
    except ImportError:
        cp = None
    try:
        import httpx
    except ImportError:
        httpx = None
    if cp is None and httpx is None:
        raise ImportError("libthrottle.instrument: neither urllib3 nor httpx "
                          "is installed: nothing to instrument")
    with _lock:
        _state["rules"], _state["throttle"] = rules, throttle
        _state["caps"] = set()
        _state["stats"] = dict(admitted=0, resent=0, buffered=0,
                               not_admitted=0)
        if cp is not None and _state["orig"] is None:
            orig = cp.HTTPConnectionPool.urlopen
            _state["orig"] = orig
            _state["sig"] = inspect.signature(orig)
            cp.HTTPConnectionPool.urlopen = _urlopen
        if httpx is not None and _state.get("httpx") is None:
            _state["httpx"] = httpx.HTTPTransport.handle_request
            httpx.HTTPTransport.handle_request = _httpx_handle
            _state["httpx_async"] = \
                httpx.AsyncHTTPTransport.handle_async_request
            httpx.AsyncHTTPTransport.handle_async_request = \
                _httpx_handle_async
        return _state["stats"]


def uninstrument():
    """Put urllib3 (and httpx) back as they were."""
    with _lock:
        if _state["orig"] is not None:
            import urllib3.connectionpool as cp
            cp.HTTPConnectionPool.urlopen = _state["orig"]
            _state["orig"] = None
        if _state.get("httpx") is not None:
            import httpx
            httpx.HTTPTransport.handle_request = _state["httpx"]
            httpx.AsyncHTTPTransport.handle_async_request = \
                _state["httpx_async"]
            _state["httpx"] = _state["httpx_async"] = None
        _state["rules"] = []


def _match(pool, method, url, headers):
    if url.startswith(("http://", "https://")):  # through a proxy
        import urllib3.util
        u = urllib3.util.parse_url(url)
        scheme, host, port, path = u.scheme, u.host, u.port, \
            u.request_uri
    else:
        scheme, host, port, path = pool.scheme, pool.host, pool.port, url
    port = port or (443 if scheme == "https" else 80)
    for rule in _state["rules"]:
        key = rule.match(method, scheme, host or "", port, path, headers)
        if key is not None:
            return rule, key
    return None, None


def _urlopen(pool, method, url, *args, **kwargs):
    orig = _state["orig"]
    if SENDING.get() or not _state["rules"]:  # admitted already, or no rule
        return orig(pool, method, url, *args, **kwargs)
    bound = _state["sig"].bind(pool, method, url, *args, **kwargs)
    call = dict(bound.arguments)
    call.update(call.pop("response_kw", {}))
    del call["self"]
    rule, key = _match(pool, method, url, call.get("headers"))
    if rule is None:
        return orig(pool, **call)
    return _admitted(pool, rule, key, orig, call)


def _httpx_match(request):
    """(rule, key) for an httpx request, or (None, None): no rule matches
    it, or it is sent by the loop of one of the package's own clients,
    which admitted it already."""
    if SENDING.get() or not _state["rules"]:
        return None, None
    u = request.url
    port = u.port or (443 if u.scheme == "https" else 80)
    path = u.raw_path.decode("ascii", "replace")
    for r in _state["rules"]:
        key = r.match(request.method, u.scheme, u.host, port, path,
                      request.headers)
        if key is not None:
            return r, key
    return None, None


def _resends(rule):
    return rule.retry and rule.retries > 0


def _httpx_handle(transport, request):
    """httpx.HTTPTransport.handle_request, through the gate."""
    orig = _state["httpx"]
    rule, key = _httpx_match(request)
    if rule is None:
        return orig(transport, request)
    import httpx
    from .httpx import _replace_stream
    if _resends(rule) and not isinstance(request.stream, httpx.ByteStream):
        # a stream (a generator, a file): read first, sent whole each time
        body = ReplayableBody(request.stream, rule.replay_limit)
        _replace_stream(request, body.data)
        _state["stats"]["buffered"] += 1

    def attempt():
        resp = orig(transport, request)
        body = b""
        if resp.status_code >= 400:
            body = resp.read()  # kept: the client reads it again
        return resp, resp.status_code, resp.headers, body
    return _through_gate(rule, key, attempt, lambda resp: resp.close())


async def _httpx_handle_async(transport, request):
    """httpx.AsyncHTTPTransport.handle_async_request, through the gate:
    admitted by an AsyncThrottle, so that waiting never blocks the event
    loop."""
    orig = _state["httpx_async"]
    rule, key = _httpx_match(request)
    if rule is None:
        return await orig(transport, request)
    import httpx
    from .httpx import _replace_stream
    if _resends(rule) and not isinstance(request.stream, httpx.ByteStream):
        body = await replayable_async(request.stream, rule.replay_limit)
        _replace_stream(request, body.data)
        _state["stats"]["buffered"] += 1

    async def attempt():
        resp = await orig(transport, request)
        body = b""
        if resp.status_code >= 400:
            body = await resp.aread()  # kept: the client reads it again
        return resp, resp.status_code, resp.headers, body

    async def discard(resp):
        await resp.aclose()
    from ._async import arun
    t = _async_throttle(_gate(rule, key))
    last = {"resp": None}

    async def send(_left):
        if last["resp"] is not None:
            await discard(last["resp"])
            last["resp"] = None
        last["resp"], status, headers, body = await attempt()
        return status, headers, body
    try:
        result = await arun(key, send, t, rule.retries if rule.retry else 0,
                            rule.timeout, rule.klass, rule.locked_codes,
                            give_up=False)
    except GaveUp as e:
        raise _not_admitted(rule, key, e) from e
    return _sent(last, result)


# the AsyncThrottle of each event loop over the gate's Throttle: an
# AsyncThrottle serves one loop at a time
_async_throttles = weakref.WeakKeyDictionary()


def _async_throttle(t):
    import asyncio
    from ._async import AsyncThrottle
    loop = asyncio.get_running_loop()
    with _lock:
        at = _async_throttles.get(loop)
        if at is None or at.throttle is not t or at.closed:
            at = _async_throttles[loop] = AsyncThrottle(t)
        return at


def _admitted(pool, rule, key, orig, call):
    body = None
    if _resends(rule):
        # bytes as they are, a seekable file rewound, a stream read first
        body = ReplayableBody(call.get("body"), rule.replay_limit)
        if body.buffered:
            call["body"] = body.data
            call["headers"] = sized_headers(
                call.get("headers") or pool.headers, len(body.data))
            call["chunked"] = False
            _state["stats"]["buffered"] += 1

    def attempt():
        if body is not None and "body" in call:
            call["body"] = body.rewind()
        resp = orig(pool, **call)
        resp, data = _readable(resp, call)
        return resp, resp.status, resp.headers, data
    return _through_gate(rule, key, attempt, lambda resp: resp.release_conn())


def _gate(rule, key):
    """The Throttle for rule's key, its cap and pool set on first use."""
    t = _state["throttle"] or default_throttle()
    if key not in _state["caps"]:
        _state["caps"].add(key)
        try:  # fail open: the gate still admits, uncapped
            if rule.cap is not None:
                t.set_max_parallel(key, rule.cap)
            if rule.pool is not None:
                t.set_max_parallel(key.rsplit("/", 1)[0], rule.pool)
        except Exception:
            pass
    return t


def _not_admitted(rule, key, e):
    _state["stats"]["not_admitted"] += 1
    return NotAdmitted("%s: not admitted within %s s (%s)"
                       % (key, rule.timeout, e))


def _sent(last, result):
    stats = _state["stats"]
    stats["admitted"] += 1
    stats["resent"] += result[4] - 1
    return last["resp"]


def _through_gate(rule, key, attempt, discard):
    """Admit, send (attempt() -> (response, status, headers, body)),
    report, and per rule send again while transient; returns the last
    response.  discard(response) for a transient answer nobody will
    see."""
    t = _gate(rule, key)
    last = {"resp": None}

    def send(_left):
        if last["resp"] is not None:
            discard(last["resp"])
            last["resp"] = None
        last["resp"], status, headers, body = attempt()
        return status, headers, body

    try:
        result = run(key, send, t, rule.retries if rule.retry else 0,
                     rule.timeout, rule.klass, rule.locked_codes,
                     give_up=False)
    except GaveUp as e:  # nothing was sent: never admitted in time
        raise _not_admitted(rule, key, e) from e
    return _sent(last, result)


def _readable(resp, call):
    """(the response to hand back, the body to classify).  A 2xx or 3xx is
    handed back untouched and classified on its status; an error's body is
    read (the class of a 409 is in it) and the response handed back reads
    the same bytes again."""
    if resp.status < 400:
        return resp, b""
    if call.get("preload_content", True):
        return resp, resp.data or b""
    import urllib3
    raw = resp.read(decode_content=False)
    resp.release_conn()
    again = urllib3.HTTPResponse(
        body=io.BytesIO(raw), headers=resp.headers, status=resp.status,
        version=resp.version, reason=resp.reason, preload_content=False,
        decode_content=call.get("decode_content", True),
        original_response=getattr(resp, "_original_response", None),
        retries=resp.retries, enforce_content_length=False,
        request_method=call.get("method"), request_url=call.get("url"))
    body = raw
    if resp.headers.get("Content-Encoding"):
        body = urllib3.HTTPResponse(
            body=io.BytesIO(raw), headers=resp.headers, status=resp.status,
            preload_content=True, decode_content=True).data
    return again, body


def _from_environment():
    """The launcher's hook (libthrottle/run.py): instrument with the rules
    in LIBTHROTTLE_RULES (one per line), if any."""
    import os
    spec = os.environ.get("LIBTHROTTLE_RULES", "")
    rules = [r for r in spec.splitlines() if r.strip()]
    if rules:
        instrument(rules)


class _Module(types.ModuleType):
    """libthrottle.instrument is this module and, called, instrument():
    `libthrottle.instrument(["hotdata"])` and
    `import libthrottle.instrument as i; i.Rule` both work."""

    def __call__(self, rules, throttle=None):
        return instrument(rules, throttle)


sys.modules[__name__].__class__ = _Module
