# SPDX-License-Identifier: MIT
"""test_pypi_tenacity.py — libthrottle.tenacity's retry/wait pair with
tenacity and requests from PyPI, against the mock server: a lock answer is
published for every process and waited out (never early); a conflict is
not retried; the shared back-off holds a second process's first try."""

import time

import pytest

from conftest import early, pypi_only

pypi_only()

import requests  # noqa: E402
import tenacity  # noqa: E402

import libthrottle  # noqa: E402
import libthrottle.tenacity as lt  # noqa: E402

KEY = "hotdata:127.0.0.1/orders"


def loader(t, calls):
    @tenacity.retry(retry=lt.retry_if_transient(t, KEY),
                    wait=lt.wait_throttle(t, KEY),
                    before=lt.before_attempt(t, KEY),
                    stop=tenacity.stop_after_attempt(10), reraise=True)
    def load(url, data):
        calls.append(time.monotonic())
        r = requests.post(url, data=data, timeout=10)
        r.raise_for_status()
        return r
    return load


def test_tenacity_lock_published_and_waited_out(t, mock):
    mock.admin("hold", {"table": "orders", "ms": 1200})
    calls = []
    r = loader(t, calls)(mock.load_url(), b"abc")
    assert r.json()["loaded"] == 3 and len(calls) >= 2
    assert t.info(KEY)["publishes"] >= 1
    st = mock.stats()
    assert early(st) == 0


def test_tenacity_conflict_is_not_retried(t, mock):
    calls = []
    load = loader(t, calls)
    load(mock.url + "/v1/tables", b'{"name": "o"}')
    with pytest.raises(requests.HTTPError):
        load(mock.url + "/v1/tables", b'{"name": "o"}')
    assert len(calls) == 2 and mock.stats()["requests"] == 2


def test_tenacity_shared_back_off_holds_the_first_try_elsewhere(t, mock):
    """What one loader was told holds another one's retry: its wait reads
    the shared not-before, not its own clock."""
    t.backoff(KEY, 0.5)  # as another process's retry_if_transient did
    mock.admin("fail", {"status": 503, "count": 1, "retry_after": None})
    calls = []
    r = loader(t, calls)(mock.load_url(), b"x")
    assert r.status_code == 200 and len(calls) == 2
    assert early(mock.stats()) == 0


def test_tenacity_transport_error_retried_other_errors_not(t):
    calls = []

    @tenacity.retry(retry=lt.retry_if_transient(t, KEY),
                    wait=tenacity.wait_none(),
                    stop=tenacity.stop_after_attempt(3), reraise=True)
    def f(exc):
        calls.append(1)
        raise exc

    with pytest.raises(requests.ConnectionError):
        f(requests.ConnectionError("refused"))
    assert len(calls) == 3
    with pytest.raises(KeyError):
        f(KeyError("a bug"))
    assert len(calls) == 4


def test_tenacity_before_attempt_waits_out_a_later_not_before(t, mock):
    """Published by another process while this one slept: the attempt
    waits for it (tenacity alone would send on its own computed wait)."""
    calls = []
    load = loader(t, calls)
    t.backoff(KEY, 0.4)  # "another process" was told to come back later
    start = time.monotonic()
    load(mock.load_url(), b"x")
    assert calls[0] - start >= 0.4 - 0.002
