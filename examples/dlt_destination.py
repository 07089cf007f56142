# SPDX-License-Identifier: MIT
"""dlt_destination.py — a dlt custom destination that writes batches into
tables of the Hotdata API through libthrottle.

dlt calls a function decorated with @dlt.destination once per batch of
items of one table (dlt.destinations.decorators.destination: the function
takes `items` and `table`, keyword arguments are configuration).  Every
pipeline process on the host that writes the same table shares one key,
so a "409 RESOURCE_LOCKED, Retry-After: 5" seen by one holds all of them
back, one probes, and the rest follow; the write below is admitted around
each batch:

    with throttle.admit(key, klass, timeout) as adm:   # waits its turn
        status, headers, body = post(batch)
        out = adm.report(status, headers, body)         # publishes, releases

and the answer becomes what dlt understands:
  ok                                       the batch is done;
  locked, 429, 503, 5xx, not admitted in
  time (libthrottle.GaveUp)                DestinationTransientException:
                                           dlt keeps the load job and
                                           retries it later; by then the
                                           back-off the answer published
                                           has passed for every process;
  CONFLICT and other permanent answers     DestinationTerminalException:
                                           the job fails, not retried.

write_batch() makes one attempt and leaves retrying to dlt's job retry;
write_batch_retrying() runs libthrottle.request()'s own loop (retries and a
timeout) inside the job and turns a GaveUp into the transient exception.

    import dlt, dlt_destination
    pipeline = dlt.pipeline("orders", destination=dlt_destination.hotdata)
    pipeline.run(rows, table_name="orders")

with destination.hotdata.api_url set in dlt's config (or HOTDATA_URL in the
environment).  dlt need not be installed to import this module: without it
the two exception classes are stand-ins with the same names, and `hotdata`
is not defined (tests call write_batch directly).
"""

import json
import os
import urllib.error
import urllib.parse
import urllib.request

import libthrottle

try:
    import dlt
    try:  # dlt >= 1.0
        from dlt.common.destination.exceptions import (
            DestinationTerminalException, DestinationTransientException)
    except ImportError:  # dlt 0.x
        from dlt.destinations.exceptions import (
            DestinationTerminalException, DestinationTransientException)
except ImportError:
    dlt = None

    class DestinationTransientException(Exception):
        """Stand-in for dlt's: the load job is retried later."""

    class DestinationTerminalException(Exception):
        """Stand-in for dlt's: the load job fails for good."""


_throttle = None


def throttle():
    """One Throttle per process, opened on first use (dlt runs load jobs in
    threads or worker processes; a Throttle is shared by threads, and a
    forked worker may use its parent's)."""
    global _throttle
    if _throttle is None or _throttle.closed:
        _throttle = libthrottle.Throttle()
    return _throttle


def key_of(api_url, table_name):
    """The key every writer of this table on this host uses (the same as
    examples/loader.c and loader.py: hotdata:HOST/TABLE)."""
    host = urllib.parse.urlsplit(api_url).hostname or "localhost"
    return "hotdata:%s/%s" % (host, table_name)


def _body(items):
    return b"".join(json.dumps(i, default=str).encode() + b"\n"
                    for i in items)


def _url(api_url, table_name):
    return "%s/v1/tables/%s/load" % (api_url.rstrip("/"),
                                     urllib.parse.quote(table_name, safe="/"))


def _post(url, data, timeout):
    req = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/x-ndjson"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.headers, e.read()


def write_batch(items, table_name, api_url, klass="live", timeout=300.0,
                t=None):
    """Write one batch, admitted: one attempt, dlt retries the job."""
    t = t or throttle()
    key = key_of(api_url, table_name)
    try:
        adm = t.admit(key, klass=klass, timeout=timeout)
    except libthrottle.ETIMEDOUT as e:
        raise DestinationTransientException(
            "%s: not admitted within %.0f s (%s); retry after %.1f s"
            % (key, timeout, e, t.remaining(key))) from e
    with adm:
        try:
            status, headers, body = _post(_url(api_url, table_name),
                                          _body(items), timeout)
        except OSError as e:  # no answer: the with block reports it failed
            raise DestinationTransientException("%s: %s" % (key, e)) from e
        out = adm.report(status, headers, body)
    if out.kind == "ok":
        return out
    if out.retryable:
        raise DestinationTransientException(
            "%s: HTTP %d %s (%s); retry after %s s"
            % (key, status, out.code, out.kind, out.retry_after))
    raise DestinationTerminalException("%s: HTTP %d %s, not retried"
                                       % (key, status, out.code))


def write_batch_retrying(items, table_name, api_url, retries=10,
                         timeout=300.0, klass="live", t=None):
    """Write one batch with libthrottle.request()'s retry loop; a GaveUp
    (still transient after the budget) is dlt's transient exception."""
    key = key_of(api_url, table_name)
    try:
        return libthrottle.request(
            key, _url(api_url, table_name), data=_body(items),
            headers={"Content-Type": "application/x-ndjson"},
            retries=retries, timeout=timeout, klass=klass,
            throttle=t or throttle())
    except libthrottle.GaveUp as e:
        raise DestinationTransientException(
            "%s; retry after %s s" % (e, e.retry_after)) from e
    except libthrottle.PermanentError as e:
        raise DestinationTerminalException(str(e)) from e


if dlt is not None:
    @dlt.destination(batch_size=500, loader_file_format="jsonl",
                     name="hotdata")
    def hotdata(items, table, api_url=dlt.config.value):
        write_batch(items, table["name"],
                    api_url or os.environ.get("HOTDATA_URL", ""))
