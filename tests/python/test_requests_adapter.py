# SPDX-License-Identifier: MIT
"""test_requests_adapter.py — libthrottle.requests against the mock
server.  Needs Debian's python3-requests; skipped, saying so, without."""

import pytest

requests = pytest.importorskip(
    "requests", reason="python3-requests is not installed: the requests "
    "adapter is not tested")

import libthrottle  # noqa: E402
import libthrottle.requests as lr  # noqa: E402
from conftest import early  # noqa: E402

KEY = "hotdata:127.0.0.1/orders"


def test_requests_session_loads(t, mock):
    s = lr.session(KEY, throttle=t)
    r = s.post(mock.load_url(), data=b"abcd")
    assert r.status_code == 200 and r.json()["loaded"] == 4
    assert r.throttle_outcome.kind == "ok" and r.throttle_attempts == 1
    assert t.info(KEY)["admitted"] == 1


def test_requests_conflict_returned_once(t, mock):
    s = lr.session(KEY, throttle=t)
    s.post(mock.url + "/v1/tables", json={"name": "orders"})
    r = s.post(mock.url + "/v1/tables", json={"name": "orders"})
    assert r.status_code == 409 and r.throttle_outcome.kind == "permanent"
    assert r.throttle_attempts == 1
    assert mock.stats()["requests"] == 2
    with pytest.raises(requests.HTTPError):
        r.raise_for_status()


def test_requests_lock_is_published_and_waited_out(t, mock):
    mock.admin("hold", {"table": "orders", "ms": 1500})
    s = lr.session(KEY, throttle=t)
    r = s.post(mock.load_url(), data=b"x")
    assert r.status_code == 200 and r.throttle_attempts >= 2
    st = mock.stats()
    assert early(st) == 0 and st["refused"] <= 3
    assert t.info(KEY)["publishes"] >= 1


def test_requests_budget_returns_the_last_transient_answer(t, mock):
    mock.admin("hold", {"table": "orders", "ms": 60000})
    s = lr.session(KEY, throttle=t, retries=1)
    r = s.post(mock.load_url(), data=b"x")
    assert r.status_code == 409 and r.throttle_outcome.kind == "locked"
    assert r.throttle_attempts == 2 and mock.stats()["early"] == 0


def test_requests_key_per_request(t, mock):
    seen = []

    def key(req):
        seen.append(req.url)
        return "hotdata:127.0.0.1/" + req.url.rsplit("/", 2)[-2]

    s = requests.Session()
    s.mount(mock.url, lr.ThrottleAdapter(key, throttle=t))
    assert s.post(mock.load_url("users"), data=b"x").status_code == 200
    assert seen and t.info("hotdata:127.0.0.1/users")["admitted"] == 1


def test_requests_connection_refused_raises_requests_error(t):
    s = lr.session(KEY, throttle=t, retries=1)
    with pytest.raises(requests.ConnectionError):
        s.post("http://127.0.0.1:9/x", data=b"x")
    assert t.info(KEY)["in_flight"] == 0


def test_requests_bad_key_fails_at_once():
    with pytest.raises(libthrottle.EKEY):
        lr.ThrottleAdapter("")
    with pytest.raises(TypeError):
        lr.ThrottleAdapter(5)
