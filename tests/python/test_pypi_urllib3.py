# SPDX-License-Identifier: MIT
"""test_pypi_urllib3.py — libthrottle.urllib3 against the mock server,
with urllib3 2 from PyPI: ThrottlePoolManager and throttle_pool() on a
PoolManager made elsewhere (as an openapi-generator SDK's
RESTClientObject makes one, with a Retry of its own that must not re-send
inside an admission), bodies sent whole, the response as the caller asked
for it."""

import pytest

from conftest import early, pypi_only

pypi_only()

import urllib3  # noqa: E402
from urllib3.util.retry import Retry  # noqa: E402

import libthrottle  # noqa: E402
import libthrottle.urllib3 as lu  # noqa: E402

KEY = "hotdata:127.0.0.1/orders"


def test_urllib3_pool_manager_waits_out_a_lock(t, mock):
    mock.admin("hold", {"table": "orders", "ms": 1200})
    http = lu.ThrottlePoolManager(KEY, throttle=t)
    r = http.request("POST", mock.load_url(), body=b"abcd")
    assert r.status == 200 and r.json()["loaded"] == 4
    assert r.throttle_outcome.kind == "ok" and r.throttle_attempts >= 2
    st = mock.stats()
    assert early(st) == 0 and st["refused"] <= 3


def test_urllib3_sdk_pool_with_its_own_retry_is_neutralised(t, mock):
    """The pool an SDK made retries 409 five times by itself (urllib3
    Retry, status_forcelist): wrapped, urllib3 sends each attempt once and
    the loop waits out the lock; nothing early."""
    sdk_pool = urllib3.PoolManager(num_pools=4, retries=Retry(
        total=5, status_forcelist=[409], backoff_factor=0,
        allowed_methods=None))
    lu.throttle_pool(sdk_pool, lambda method, url: KEY, throttle=t)
    mock.admin("hold", {"table": "orders", "ms": 1200})
    # as openapi-generator's rest.py calls it
    r = sdk_pool.request("POST", mock.load_url(), body=b'{"rows": 1}',
                         preload_content=False, timeout=10,
                         headers={"Content-Type": "application/json"})
    assert r.status == 200 and r.data == r.data and b"loaded" in r.data
    st = mock.stats()
    assert early(st) == 0 and st["refused"] <= 3
    assert r.throttle_attempts == st["requests"]


def test_urllib3_generator_body_sent_whole_on_the_retry(t, mock):
    mock.admin("hold", {"table": "orders", "ms": 800})
    http = lu.ThrottlePoolManager(KEY, throttle=t)
    r = http.request("POST", mock.load_url(),
                     body=(b"row %04d\n" % i for i in range(100)),
                     chunked=True)
    assert r.status == 200 and r.json()["loaded"] == 900


def test_urllib3_permanent_and_errors(t, mock):
    http = lu.ThrottlePoolManager(KEY, throttle=t, throttle_retries=1)
    http.request("POST", mock.url + "/v1/tables", json={"name": "o"})
    r = http.request("POST", mock.url + "/v1/tables", json={"name": "o"})
    assert r.status == 409 and r.throttle_outcome.kind == "permanent"
    assert mock.stats()["requests"] == 2
    with pytest.raises(urllib3.exceptions.HTTPError):
        http.request("POST", "http://127.0.0.1:9/x", body=b"x")
    with pytest.raises(ValueError):
        http.request("POST", "http://:99/x", body=b"x")
    with pytest.raises(TypeError):
        lu.throttle_pool(object(), KEY)
