# SPDX-License-Identifier: MIT
"""test_request.py — libthrottle.request() and classification against the
mock Hotdata server, in this process and in fleets of real processes:
none early, few refused, a CONFLICT sent once, an external hold costing
about one refused request per Retry-After, fail open."""

import os
import time

import pytest

import libthrottle
from conftest import early, BUILD, expect_line, spawn, start_together

KEY = "hotdata:127.0.0.1/orders"
LOCKED = b'{"error": {"code": "RESOURCE_LOCKED", "message": "locked"}}'


def fleet(mock, files, n, key=KEY, table="orders"):
    """n worker processes, the files dealt out among them; waits for all.
    Returns (exit codes, output lines, seconds)."""
    procs = [spawn("load", key, mock.load_url(table), *files[i::n],
                   stdin=True) for i in range(n)]
    start = time.monotonic()
    start_together(procs)
    outs = [p.communicate(timeout=300) for p in procs]
    elapsed = time.monotonic() - start
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    return ([p.returncode for p in procs],
            [line for out, _ in outs for line in out.splitlines()], elapsed)


# ---- classification and Retry-After (the C library's) -------------------------------

@pytest.mark.parametrize("status,body,kind", [
    (200, b"", "ok"), (201, b"{}", "ok"), (204, None, "ok"),
    (409, LOCKED, "locked"),
    (409, b'{"error": {"code": "CONFLICT"}}', "permanent"),
    (409, b"not json", "permanent"), (409, b"", "permanent"),
    (429, b"", "rate_limited"), (503, b"", "unavailable"),
    (500, b"", "transient"), (502, b"", "transient"), (408, b"", "transient"),
    (501, b"", "permanent"), (404, b"", "permanent"), (302, b"", "permanent"),
    (409, LOCKED.decode(), "locked"),
])
def test_classify_table(status, body, kind):
    assert libthrottle.classify(status, body) == kind


def test_classify_errors():
    for bad in ("409", 409.0, None, True):
        with pytest.raises(TypeError):
            libthrottle.classify(bad, b"")
    with pytest.raises(TypeError):
        libthrottle.classify(409, 12)
    for status in (99, 1000, -1):
        with pytest.raises(libthrottle.EINVAL):
            libthrottle.classify(status, b"")


@pytest.mark.parametrize("value,seconds", [
    ("5", 5.0), (" 7\t", 7.0), ("0", 0.0), (b"3", 3.0),
    ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0),  # in the past
    ("soon", None), ("-1", None), ("1.5", None), ("", None), ("5, 6", None),
    ("Sun, 06 Nov 1994", None), ("5\0", None),
])
def test_parse_retry_after(value, seconds):
    assert libthrottle.parse_retry_after(value) == seconds


def test_parse_retry_after_date_against_now():
    now = 784111777  # Sun, 06 Nov 1994 08:49:37 GMT
    assert libthrottle.parse_retry_after("Sun, 06 Nov 1994 08:49:47 GMT",
                                         now=now) == 10.0
    assert libthrottle.parse_retry_after("Sunday, 06-Nov-94 08:49:47 GMT",
                                         now=now) == 10.0
    assert libthrottle.parse_retry_after("Sun Nov  6 08:49:47 1994",
                                         now=now) == 10.0
    for bad in (5, None, ["5"]):
        with pytest.raises(TypeError):
            libthrottle.parse_retry_after(bad)
    with pytest.raises(TypeError):
        libthrottle.parse_retry_after("5", now="now")


# ---- one process ------------------------------------------------------------------

def test_request_ok_returns_the_answer(t, mock):
    status, headers, body = libthrottle.request(KEY, mock.load_url(),
                                                data=b"abc", throttle=t)
    assert status == 200 and b'"loaded": 3' in body
    assert headers["Content-Type"] == "application/json"
    assert mock.stats()["loads_ok"] == 1


def test_request_conflict_is_permanent_and_sent_once(t, mock):
    url = mock.url + "/v1/tables"
    libthrottle.request(KEY, url, data='{"name": "orders"}', throttle=t)
    with pytest.raises(libthrottle.PermanentError) as e:
        libthrottle.request(KEY, url, data='{"name": "orders"}', throttle=t)
    assert (e.value.status, e.value.code, e.value.attempts) == (409,
                                                                 "CONFLICT", 1)
    st = mock.stats()
    assert (st["conflicts"], st["requests"]) == (1, 2)
    assert t.remaining(KEY) == 0.0  # nothing published


def test_request_conflict_from_a_process_exits_1_sent_once(mock, segment,
                                                          tmp_path):
    url = mock.url + "/v1/tables"
    libthrottle.request(KEY, url, data='{"name": "orders"}')
    body = tmp_path / "create.json"
    body.write_text('{"name": "orders"}')
    p = spawn("load", KEY, url, str(body), stdin=True)
    expect_line(p, "ready")
    out, err = p.communicate("go\n", timeout=60)
    assert p.returncode == 1, (out, err)
    assert out.split() == ["permanent", "create.json", "409", "CONFLICT"]
    st = mock.stats()
    assert (st["conflicts"], st["requests"]) == (1, 2)


def test_request_transient_5xx_retried_locally(t, mock):
    mock.admin("fail", {"status": 500, "count": 2, "retry_after": None})
    status, _, _ = libthrottle.request(KEY, mock.load_url(), data=b"x",
                                       throttle=t)
    assert status == 200
    st = mock.stats()
    assert (st["failed"], st["loads_ok"], st["requests"]) == (2, 1, 3)
    assert t.info(KEY)["publishes"] == 0  # local back-off, not published


def test_request_429_is_published_and_honoured(t, mock):
    mock.admin("fail", {"status": 429, "count": 1, "retry_after": 1})
    start = time.monotonic()
    status, _, _ = libthrottle.request(KEY, mock.load_url(), data=b"x",
                                       throttle=t)
    assert status == 200 and time.monotonic() - start >= 0.99
    st = mock.stats()
    assert (st["rate_limited"], st["early"], st["loads_ok"]) == (1, 0, 1)
    # a 429 is the workspace's: published on the key's root scope
    assert t.info(KEY.split("/")[0])["publishes"] == 1
    assert t.info(KEY)["publishes"] == 0


def test_request_429_published_on_the_key_when_asked(segment, mock):
    with libthrottle.Throttle(publish={"rate_limited": "key"}) as t:
        mock.admin("fail", {"status": 429, "count": 1, "retry_after": 1})
        status, _, _ = libthrottle.request(KEY, mock.load_url(), data=b"x",
                                           throttle=t)
        assert status == 200
        assert t.info(KEY)["publishes"] == 1
        try:
            root = t.info("hotdata:127.0.0.1")["publishes"]
        except libthrottle.Error:
            root = 0  # no record for the scope at all
        assert root == 0


@pytest.mark.parametrize("bad", [{"teapot": "key"}, {"locked": "nowhere"},
                                 {"locked": 0}, {"locked": True}])
def test_throttle_publish_levels_checked(segment, bad):
    with pytest.raises(libthrottle.Error):
        libthrottle.Throttle(publish=bad)


def test_throttle_publish_must_be_a_dict(segment):
    with pytest.raises(TypeError):
        libthrottle.Throttle(publish=["locked"])


def test_request_gives_up_at_the_timeout(t, mock):
    mock.admin("hold", {"table": "orders", "ms": 60000})
    with pytest.raises(libthrottle.GaveUp) as e:
        libthrottle.request(KEY, mock.load_url(), data=b"x", timeout=2,
                            throttle=t)
    assert e.value.status == 409 and e.value.code == "RESOURCE_LOCKED"
    assert e.value.retry_after is not None and e.value.retry_after > 0
    st = mock.stats()
    assert st["early"] == 0 and st["refused"] <= 3


def test_request_gives_up_at_the_retry_budget(t, mock):
    mock.admin("hold", {"table": "orders", "ms": 60000})
    with pytest.raises(libthrottle.GaveUp) as e:
        libthrottle.request(KEY, mock.load_url(), data=b"x", retries=1,
                            throttle=t)
    assert e.value.attempts == 2
    assert mock.stats()["refused"] == 2 and mock.stats()["early"] == 0


def test_request_transport_error_gives_up(t):
    # a port nobody listens on: refused at once, retried, then GaveUp
    with pytest.raises(libthrottle.GaveUp) as e:
        libthrottle.request(KEY, "http://127.0.0.1:9/x", retries=2,
                            throttle=t)
    assert e.value.status is None and e.value.attempts == 3


def test_request_argument_errors(t, mock):
    for kw in (dict(data=5), dict(headers=[("a", "b")]),
               dict(headers={"a": 1}), dict(retries="3"), dict(timeout="1"),
               dict(throttle=object()), dict(method=5)):
        with pytest.raises(TypeError):
            libthrottle.request(KEY, mock.load_url(), **kw)
    with pytest.raises(TypeError):
        libthrottle.request(KEY, 5)
    with pytest.raises(libthrottle.EKEY):
        libthrottle.request("", mock.load_url(), throttle=t)
    with pytest.raises(libthrottle.EINVAL):
        libthrottle.request(KEY, mock.load_url(), klass="x", throttle=t)
    assert mock.stats()["requests"] == 0


def test_request_fails_open_when_admission_fails(mock, segment):
    # a full key table: admission fails (EFULL), the request is sent
    # without it, and the 429's Retry-After is slept here, not skipped
    with libthrottle.Throttle(segment=segment, keys=1) as full:
        full.backoff("another key", 60)
        with pytest.raises(libthrottle.EFULL):
            full.admit(KEY, timeout=0)
        mock.admin("fail", {"status": 429, "count": 1, "retry_after": 1})
        start = time.monotonic()
        status, _, _ = libthrottle.request(KEY, mock.load_url(), data=b"x",
                                           throttle=full)
        assert status == 200 and time.monotonic() - start >= 0.99
    st = mock.stats()
    assert (st["rate_limited"], st["loads_ok"], st["early"]) == (1, 1, 0)


def test_request_fails_open_on_an_unusable_segment(mock, segment, tmp_path):
    path = "/dev/shm" + segment
    with open(path, "wb") as f:
        f.write(b"x" * 8192)
    os.chmod(path, 0o600)
    (tmp_path / "f").write_bytes(b"row\n")
    p = spawn("load", KEY, mock.load_url(), str(tmp_path / "f"), stdin=True)
    expect_line(p, "ready")
    out, err = p.communicate("go\n", timeout=60)
    assert p.returncode == 0, err
    assert "FallbackWarning" in err and segment[1:] in err
    assert mock.stats()["loads_ok"] == 1


# ---- fleets of processes ------------------------------------------------------------

def test_request_twelve_processes_48_files_one_table(mock, segment, files,
                                                     capsys):
    paths = files(48)
    _, lines, elapsed = fleet(mock, paths, 12)
    st = mock.stats()
    with capsys.disabled():
        print("\n[figures] 12 Python processes x 4 files, one table, 20 ms "
              "per load: loaded %d/48, requests %d, refused %d, early %d, "
              "makespan %.2f s (ideal 0.96 s)"
              % (st["loads_ok"], st["requests"], st["refused"], st["early"],
                 elapsed))
    assert sum(line.startswith("ok ") for line in lines) == 48
    assert st["loads_ok"] == 48
    assert early(st) == 0
    assert st["refused"] <= 3


def test_request_external_hold_one_refusal_per_retry_after(mock, segment,
                                                           files, capsys):
    hold_ms = 3000
    mock.admin("hold", {"table": "orders", "ms": hold_ms})
    _, lines, elapsed = fleet(mock, files(8), 8)
    st = mock.stats()
    with capsys.disabled():
        print("\n[figures] 8 Python processes, 3 s external hold, "
              "Retry-After 1: refused %d, early %d (race %d), loaded %d, "
              "%.2f s" % (st["refused"], st["early"], st["early_race"],
                          st["loads_ok"], elapsed))
    # requests of the first wave sent before the first refusal could be
    # published are races, which I1 allows; the mock counts them apart
    assert st["loads_ok"] == 8 and early(st) == 0
    # about one refusal per Retry-After (1 s) of the hold, not per process
    assert st["refused"] <= hold_ms // 1000 + 3


def test_request_python_and_c_loaders_share_one_table(mock, segment, files,
                                                      capsys):
    loader = os.path.join(BUILD, "examples", "loader")
    if not os.path.exists(loader):
        pytest.fail("%s is missing (make examples)" % loader)
    import subprocess
    paths = files(48)
    py = [spawn("load", KEY, mock.load_url(), *paths[i:24:6], stdin=True)
          for i in range(6)]
    for p in py:
        expect_line(p, "ready")
    start = time.monotonic()
    c = [subprocess.Popen([loader, mock.url, "orders"] + paths[24 + i::6],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) for i in range(6)]
    for p in py:
        p.stdin.write("go\n")
        p.stdin.flush()  # communicate() closes it
    for p in py + c:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, (out, err)
    st = mock.stats()
    with capsys.disabled():
        print("\n[figures] 6 Python + 6 C loaders, 48 files, one table: "
              "loaded %d, refused %d, early %d, %.2f s"
              % (st["loads_ok"], st["refused"], st["early"],
                 time.monotonic() - start))
    assert st["loads_ok"] == 48 and early(st) == 0 and st["refused"] <= 3
    assert st["tables"]["orders"]["max_concurrent"] >= 1


@pytest.mark.parametrize("url", ["http:///x", "http://:8080/x",
                                 "http://127.0.0.1:99999/x", "ftp://h/x",
                                 "http://[::1/x", "/v1/tables"])
def test_request_malformed_url_is_a_value_error_not_retried(t, url):
    """A malformed URL raises ValueError before anything is admitted (it
    was a transport error: retried with back-off, then GaveUp)."""
    with pytest.raises(ValueError) as e:
        libthrottle.request(KEY, url, data=b"x", retries=2, timeout=20,
                            throttle=t)
    assert not isinstance(e.value, libthrottle.RequestError)
    with pytest.raises(libthrottle.ENOKEY):
        t.info(KEY)  # nothing was admitted


def test_request_classifier_decides_what_it_knows(t, mock):
    """A classifier of the caller's own: a 201 read as permanent here; for
    what it returns None on, the C reading stands."""
    seen = []

    def classifier(status, headers, body):
        seen.append((status, body))
        return "permanent" if status == 201 else None

    with pytest.raises(libthrottle.PermanentError) as e:
        libthrottle.request(KEY, mock.url + "/v1/tables", data=b'{"name": "a"}',
                            throttle=t, classifier=classifier)
    assert e.value.status == 201 and seen[0][0] == 201
    status, _, _ = libthrottle.request(KEY, mock.load_url(), data=b"x",
                                       throttle=t, classifier=classifier)
    assert status == 200 and seen[-1][0] == 200


def test_request_classifier_makes_an_unusual_answer_a_lock(t, mock):
    """A 429 read as a lock of the table by the caller's classifier (the
    default publishes it on the workspace): published on the key, with the
    answer's Retry-After."""
    mock.admin("fail", {"status": 429, "count": 1, "retry_after": 1})

    def classifier(status, headers, body):
        return "locked" if status == 429 else None

    status, _, _ = libthrottle.request(KEY, mock.load_url(), data=b"x",
                                       throttle=t, classifier=classifier)
    assert status == 200
    info = t.info(KEY)
    assert info["publishes"] == 1 and info["last_delay_ms"] == 1000
    with pytest.raises(ValueError):
        libthrottle.request(KEY, mock.load_url(), data=b"x", throttle=t,
                            classifier=lambda s, h, b: "nonsense")
