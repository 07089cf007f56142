# SPDX-License-Identifier: MIT
"""libthrottle.dlt — a dlt custom destination that writes batches into
tables of an HTTP API (POST {api_url}/v1/tables/{table}/load, one
JSON-lines batch a request) through the gate, and the mapping of the
answers to what dlt's loader understands.  Needs dlt (tested with 1.28).

    import dlt
    import libthrottle.dlt

    pipeline = dlt.pipeline("orders", destination=libthrottle.dlt.destination(
        api_url="https://api.example", klass="live"))
    pipeline.run(rows, table_name="orders")

Every pipeline process of the host (or of every host on one Redis,
THROTTLE_BACKEND) writing one table uses one key, hotdata:HOST/TABLE, so
a "409 RESOURCE_LOCKED, Retry-After: 5" seen by one holds all of them
back, one probes, and the rest follow; live batches go ahead of backfill
ones.  Each batch is admitted, sent, classified and reported:

  ok                                      the batch is done;
  locked, 429, 503, 5xx, no answer, or
  not admitted in time                    DestinationTransientException:
                                          dlt keeps the load job and runs
                                          it again later, by when the
                                          back-off has passed for every
                                          process;
  CONFLICT and other permanent answers    DestinationTerminalException:
                                          the job fails, never retried.

retries=0 (the default) makes one attempt per job and leaves retrying to
dlt; retries=N retries inside the job (libthrottle.request()'s loop) and
raises the transient exception only when the budget is spent.

For a destination you do not write yourself (hotdata-dlt-destination),
use `python -m libthrottle.run --rule hotdata -- python pipeline.py` or
libthrottle.instrument(["hotdata"]) instead: see libthrottle.instrument.
"""

import json
import os
import urllib.error
import urllib.parse
import urllib.request

import dlt
from dlt.common.destination.exceptions import (
    DestinationTerminalException, DestinationTransientException)

from ._errors import GaveUp, PermanentError
from ._http import default_throttle, request
from ._base import _BY_NAME

__all__ = ["destination", "write_batch", "write_batch_retrying", "key_of",
           "DestinationTransientException", "DestinationTerminalException"]

ETIMEDOUT = _BY_NAME["ETIMEDOUT"]


def key_of(api_url, table_name):
    """The key every writer of this table uses: hotdata:HOST/TABLE (as
    examples/loader.c and loader.py)."""
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
    """Write one batch, admitted: one attempt; dlt retries the job on a
    DestinationTransientException.  Returns the Outcome."""
    t = t or default_throttle()
    key = key_of(api_url, table_name)
    try:
        adm = t.admit(key, klass=klass, timeout=timeout)
    except ETIMEDOUT as e:
        raise DestinationTransientException(
            "%s: not admitted within %.1f s (%s); retry after %.1f s"
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
    (still transient after the budget) is dlt's transient exception, a
    permanent answer its terminal one."""
    key = key_of(api_url, table_name)
    try:
        return request(
            key, _url(api_url, table_name), data=_body(items),
            headers={"Content-Type": "application/x-ndjson"},
            retries=retries, timeout=timeout, klass=klass,
            throttle=t or default_throttle())
    except GaveUp as e:
        raise DestinationTransientException(
            "%s; retry after %s s" % (e, e.retry_after)) from e
    except PermanentError as e:
        raise DestinationTerminalException(str(e)) from e


def destination(api_url=None, klass="live", retries=0, timeout=300.0,
                batch_size=500, name="throttled", throttle=None):
    """A dlt destination writing each batch (batch_size items of one
    table) with write_batch (retries=0) or write_batch_retrying.
    api_url: the API's base URL; None takes destination.NAME.api_url from
    dlt's configuration (config.toml, DESTINATION__THROTTLED__API_URL for
    the default name; not "hotdata", which hotdata-dlt-destination's
    configuration uses), then HOTDATA_URL.  klass: "live" or "backfill"; timeout: seconds a batch
    may wait and be sent; throttle: a Throttle (default: the process's)."""
    if klass not in ("live", "backfill"):
        raise ValueError("klass must be live or backfill: %r" % (klass,))

    @dlt.destination(batch_size=batch_size, loader_file_format="typed-jsonl",
                     name=name, skip_dlt_columns_and_tables=True)
    def sink(items, table, api_url=dlt.config.value):
        url = api_url or os.environ.get("HOTDATA_URL")
        if not url:
            raise DestinationTerminalException(
                "no API URL: pass api_url, set destination.%s.api_url or "
                "HOTDATA_URL" % name)
        if retries:
            write_batch_retrying(items, table["name"], url, retries,
                                 timeout, klass, throttle)
        else:
            write_batch(items, table["name"], url, klass, timeout, throttle)

    return sink(api_url=api_url) if api_url else sink()
