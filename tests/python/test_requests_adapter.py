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


# ---- bodies: every attempt sends the first attempt's bytes ------------------

def _rows(n):
    for i in range(n):
        yield b"row %04d\n" % i


def test_requests_generator_body_is_sent_whole_on_the_retry(t, mock):
    """A generator body refused once (409) is sent again in full: it went
    out empty on the retry, and the server loaded 0 bytes."""
    mock.admin("hold", {"table": "orders", "ms": 800})
    s = lr.session(KEY, throttle=t)
    r = s.post(mock.load_url(), data=_rows(100), timeout=10)
    assert r.status_code == 200 and r.throttle_attempts >= 2
    assert r.json()["loaded"] == 900


def test_requests_file_body_is_sent_whole_on_the_retry(t, mock, tmp_path):
    """A file body is sent again from where it started: the retry sent a
    Content-Length and no bytes (the file was at its end) and waited for
    the read timeout."""
    p = tmp_path / "part"
    p.write_bytes(b"x" * 5000)
    mock.admin("hold", {"table": "orders", "ms": 800})
    s = lr.session(KEY, throttle=t)
    with open(str(p), "rb") as f:
        f.read(1000)  # a caller may hand over a file it has read into
        r = s.post(mock.load_url(), data=f, timeout=5)
    assert r.status_code == 200 and r.throttle_attempts >= 2
    assert r.json()["loaded"] == 4000


def test_requests_stream_beyond_the_replay_limit_is_refused_unsent(t, mock):
    s = lr.session(KEY, throttle=t, replay_limit=500)
    with pytest.raises(libthrottle.BodyNotReplayable):
        s.post(mock.load_url(), data=_rows(100), timeout=10)
    assert mock.stats()["requests"] == 0
    assert t.info(KEY)["in_flight"] == 0 if _known(t) else True
    r = s.post(mock.load_url(), data=_rows(10), timeout=10)  # 90 bytes fit
    assert r.json()["loaded"] == 90


def _known(t):
    try:
        t.info(KEY)
        return True
    except libthrottle.ENOKEY:
        return False


def test_requests_adapter_refuses_its_own_urllib3_retries(t):
    """urllib3's Retry inside one admission re-sent refused requests on its
    own clock (early, uncounted): the adapter refuses it."""
    from urllib3.util.retry import Retry
    with pytest.raises(ValueError):
        lr.ThrottleAdapter(KEY, throttle=t, max_retries=Retry(
            total=5, status_forcelist=[409], backoff_factor=0))
    with pytest.raises(ValueError):
        lr.ThrottleAdapter(KEY, throttle=t, max_retries=3)
    a = lr.ThrottleAdapter(KEY, throttle=t)
    with pytest.raises(ValueError):
        a.max_retries = Retry(3)
    assert a.max_retries.total == 0  # urllib3 never retries by itself
    lr.ThrottleAdapter(KEY, throttle=t, max_retries=0)  # the default: fine


def test_requests_malformed_url_is_a_value_error_unsent(t, mock):
    s = lr.session(KEY, throttle=t)
    for url in ("http://:80/x", "http://127.0.0.1:99999/x"):
        with pytest.raises(ValueError):
            s.post(url, data=b"x")
    assert not _known(t) or t.info(KEY)["admitted"] == 0


def test_requests_throttle_session_mounts_on_a_session_made_elsewhere(t,
                                                                      mock):
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry
    s = requests.Session()
    s.mount("http://", HTTPAdapter(max_retries=Retry(5, status_forcelist=[
        409], backoff_factor=0)))  # as a library set it up
    assert lr.throttle_session(s, KEY, throttle=t) is s
    mock.admin("hold", {"table": "orders", "ms": 800})
    r = s.post(mock.load_url(), data=b"x", timeout=10)
    assert r.status_code == 200 and r.throttle_attempts >= 2
    assert early(mock.stats()) == 0
