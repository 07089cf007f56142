# SPDX-License-Identifier: MIT
"""test_throttle.py — Throttle and Admission, one process: every method,
every argument check, every error path (wrong types, bad keys, a closed
handle, an invalid or unusable segment).  No wall-clock assertions
beyond "not before the published time"."""

import math
import os
import subprocess
import threading
import time
import warnings

import pytest

import libthrottle
from libthrottle import _throttle

from conftest import BUILD, child_env

KEY = "hotdata:ws1/orders"
LOCKED = b'{"error": {"code": "RESOURCE_LOCKED", "message": "locked"}}'
CONFLICT = b'{"error": {"code": "CONFLICT", "message": "exists"}}'


# ---- keys -------------------------------------------------------------------------

def test_keys_str_and_bytes_name_the_same_key(t):
    t.backoff("hotdata:ws1/ördersé", 30)
    assert t.remaining("hotdata:ws1/ördersé".encode()) > 29
    assert t.remaining(bytearray("hotdata:ws1/ördersé".encode())) > 29
    assert t.remaining(memoryview("hotdata:ws1/ördersé".encode())) > 29
    assert [k["key"] for k in t.keys()] == ["hotdata:ws1/ördersé"]


@pytest.mark.parametrize("key", [None, 5, 1.5, ["k"], object()])
def test_keys_wrong_type_is_a_type_error(t, key):
    for call in (lambda: t.backoff(key, 1), lambda: t.remaining(key),
                 lambda: t.wait(key, 0), lambda: t.admit(key),
                 lambda: t.try_admit(key), lambda: t.clear(key),
                 lambda: t.info(key), lambda: t.pause(key),
                 lambda: t.set_max_parallel(key, 1), lambda: t.cancel(key)):
        with pytest.raises(TypeError):
            call()


def test_keys_not_utf8_named_by_key_bytes(t):
    # two keys that differ only in bytes that are not UTF-8 read alike in
    # "key"; "key_bytes" names each, for a call on it
    for k in (b"ws/t\xff", b"ws/t\xfe"):
        t.backoff(k, 30)
    snaps = t.keys()
    assert [s["key"] for s in snaps] == ["ws/t\ufffd", "ws/t\ufffd"]
    assert sorted(s["key_bytes"] for s in snaps) == [b"ws/t\xfe", b"ws/t\xff"]
    assert t.beneath(b"ws/t\xff") == {"keys": 0, "in_flight": 0, "waiting": 0}
    t.backoff(b"ws\xff/a", 30)
    t.backoff(b"ws\xfe/b", 30)
    assert t.beneath(b"ws\xff")["keys"] == 1
    for s in snaps:
        assert t.info(s["key_bytes"])["key_bytes"] == s["key_bytes"]
        t.clear(s["key_bytes"])
        assert t.remaining(s["key_bytes"]) == 0


@pytest.mark.parametrize("key", ["", b"", "x" * 256, "a\0b", b"\0",
                                 "\udcff"])
def test_keys_bad_key_is_ekey(t, key):
    for call in (lambda: t.backoff(key, 1), lambda: t.remaining(key),
                 lambda: t.wait(key, 0), lambda: t.admit(key, timeout=0),
                 lambda: t.clear(key), lambda: t.set_rate(key, 1, 1)):
        with pytest.raises(libthrottle.EKEY):
            call()
    assert t.keys() == []  # no key was made, in particular not "a"


def test_keys_longest_key_is_255_bytes(t):
    t.backoff("k" * 255, 5)
    assert t.remaining("k" * 255) > 4


# ---- back-off ---------------------------------------------------------------------

def test_backoff_seconds_int_and_float(t):
    t.backoff(KEY, 2)
    assert 1.9 < t.remaining(KEY) <= 2.0
    t.backoff(KEY, 7.5)
    assert 7.4 < t.remaining(KEY) <= 7.5
    t.backoff(KEY, 1)  # only ever later
    assert t.remaining(KEY) > 7


def test_backoff_rounds_up_to_the_millisecond(t):
    t.backoff(KEY, 0.0001)
    assert t.info(KEY)["last_delay_ms"] == 1


def test_backoff_retry_after_strings(t):
    t.backoff(KEY, "3")
    assert 2.9 < t.remaining(KEY) <= 3
    future = time.strftime("%a, %d %b %Y %H:%M:%S GMT",
                           time.gmtime(time.time() + 60))
    t.backoff("other", future)
    assert 55 < t.remaining("other") <= 61


@pytest.mark.parametrize("delay", ["soon", "-1", "1.5", "", b"5, 6"])
def test_backoff_bad_retry_after_string_is_einval(t, delay):
    with pytest.raises(libthrottle.EINVAL):
        t.backoff(KEY, delay)


@pytest.mark.parametrize("delay", [None, [1], True, object()])
def test_backoff_wrong_delay_type_is_a_type_error(t, delay):
    with pytest.raises(TypeError):
        t.backoff(KEY, delay)


@pytest.mark.parametrize("delay", [-1, -0.5, math.nan])
def test_backoff_negative_or_nan_delay_is_a_value_error(t, delay):
    with pytest.raises(ValueError):
        t.backoff(KEY, delay)


def test_backoff_is_clamped_to_max_delay(segment):
    with libthrottle.Throttle(segment=segment, max_delay=10) as t:
        t.backoff(KEY, math.inf)
        assert t.remaining(KEY) <= 10


def test_remaining_open_key_is_zero(t):
    assert t.remaining("never-seen") == 0.0
    assert isinstance(t.remaining("never-seen"), float)


def test_remaining_loop_over_names_sees_the_one_held(t, segment):
    # another process backs one table off; a loop over the names (each a
    # new str of the same length, often at the same address) sees it
    ctl = os.path.join(BUILD, "throttlectl")
    subprocess.run([ctl, "--segment", segment, "backoff", "ws1/tbl-7", "10"],
                   check=True, env=child_env())
    for _ in range(3):
        for i in range(10):
            key = "ws1/tbl-%d" % i
            if i == 7:
                assert t.remaining(key) > 5
                assert not t.wait(key, 0)
            else:
                assert t.remaining(key) == 0
                assert t.wait(key, 0)


def test_clear_opens_and_unknown_key_is_enokey(t):
    t.backoff(KEY, 30)
    t.clear(KEY)
    assert t.remaining(KEY) == 0.0
    with pytest.raises(libthrottle.ENOKEY):
        t.clear("never-seen")


def test_reset_opens_every_key(t):
    t.backoff("a", 30)
    t.backoff("b", 30)
    t.reset()
    assert t.remaining("a") == t.remaining("b") == 0.0


# ---- wait -------------------------------------------------------------------------

def test_wait_open_key_is_true(t):
    assert t.wait(KEY) is True
    assert t.wait(KEY, timeout=0) is True


def test_wait_returns_not_before_the_published_time(t):
    t.backoff(KEY, 0.2)
    start = time.monotonic()
    assert t.wait(KEY) is True
    assert time.monotonic() - start >= 0.19


def test_wait_beyond_the_timeout_is_false_at_once(t):
    t.backoff(KEY, 30)
    start = time.monotonic()
    assert t.wait(KEY, timeout=1) is False
    assert time.monotonic() - start < 1  # said so at once, did not sleep


@pytest.mark.parametrize("timeout", ["1", [], True])
def test_wait_wrong_timeout_type_is_a_type_error(t, timeout):
    with pytest.raises(TypeError):
        t.wait(KEY, timeout)


def test_wait_negative_timeout_is_a_value_error(t):
    with pytest.raises(ValueError):
        t.wait(KEY, -1)


def test_wait_wakes_on_clear_from_another_thread(t):
    t.backoff(KEY, 60)
    threading.Timer(0.1, t.clear, (KEY,)).start()
    assert t.wait(KEY, timeout=120) is True


# ---- admission --------------------------------------------------------------------

def test_admit_and_report_ok(t):
    with t.admit(KEY, klass="live", timeout=5) as adm:
        assert adm.held and adm.key == KEY
        assert t.info(KEY)["in_flight"] == 1
        out = adm.report(200, {"Content-Type": "text/plain"}, b"fine")
    assert (out.kind, out.retry_after, out.retryable) == ("ok", None, False)
    assert not adm.held
    info = t.info(KEY)
    assert info["in_flight"] == 0 and info["admitted"] == 1


def test_admit_report_locked_publishes_retry_after(t):
    with t.admit(KEY) as adm:
        out = adm.report(409, [("Retry-After", "4")], LOCKED)
    assert (out.kind, out.retry_after, out.retryable) == ("locked", 4.0, True)
    assert out.code == "RESOURCE_LOCKED"
    assert 3.9 < t.remaining(KEY) <= 4
    assert t.info(KEY)["locked"] == 1


def test_admit_report_conflict_is_permanent_and_publishes_nothing(t):
    with t.admit(KEY) as adm:
        out = adm.report(409, {}, CONFLICT)
    assert (out.kind, out.retryable, out.code) == ("permanent", False,
                                                     "CONFLICT")
    assert t.remaining(KEY) == 0.0
    assert t.info(KEY)["permanent"] == 1


def test_admit_report_reads_headers_of_any_shape(t):
    import email.message
    import http.client
    msg = http.client.HTTPMessage()
    msg["retry-after"] = "2"
    em = email.message.Message()
    em["Retry-After"] = "3"
    for headers, want in ((msg, 2.0), (em, 3.0), ({"RETRY-AFTER": "5"}, 5.0),
                          ([(b"Retry-After", b"6")], 6.0), (None, None)):
        with t.admit("shape") as adm:
            assert adm.report(429, headers, b"").retry_after == want
        t.clear("shape")


def test_admit_report_date_retry_after_is_read_against_the_date_header(t):
    # a server whose clock is an hour behind ours: its Retry-After date is
    # 10 s after its own Date, so 10 s, not "in the past"
    server_now = time.time() - 3600
    fmt = "%a, %d %b %Y %H:%M:%S GMT"
    headers = {"Date": time.strftime(fmt, time.gmtime(server_now)),
               "Retry-After": time.strftime(fmt, time.gmtime(server_now + 10))}
    with t.admit(KEY) as adm:
        out = adm.report(503, headers, b"")
    assert out.kind == "unavailable" and 9 <= out.retry_after <= 11


def test_admit_report_twice_is_einval(t):
    adm = t.admit(KEY)
    adm.report(200)
    with pytest.raises(libthrottle.EINVAL):
        adm.report(200)
    with pytest.raises(libthrottle.EINVAL):
        adm.leave("ok")


def test_admit_report_wrong_types(t):
    with t.admit(KEY) as adm:
        with pytest.raises(TypeError):
            adm.report("200")
        with pytest.raises(TypeError):
            adm.report(200, None, 12)
        with pytest.raises(TypeError):
            adm.report(200, 5, b"")
        with pytest.raises(libthrottle.EINVAL):
            adm.report(99)
        assert adm.held  # none of those gave the slot back
        adm.report(200)


def test_admit_exception_in_block_gives_slot_back_as_failed(t):
    with pytest.raises(ZeroDivisionError):
        with t.admit(KEY) as adm:
            1 / 0
    assert not adm.held
    assert t.info(KEY)["in_flight"] == 0
    again = t.try_admit(KEY)
    assert again is not None
    again.leave()


def test_admit_leaving_block_without_report_abandons(t):
    t.set_max_parallel(KEY, 1)
    with t.admit(KEY) as adm:
        pass
    assert not adm.held
    assert t.info(KEY)["in_flight"] == 0
    second = t.try_admit(KEY)
    assert second is not None
    second.leave("ok")


def test_admit_dropped_admission_gives_slot_back(t):
    t.set_max_parallel(KEY, 1)
    t.admit(KEY)  # dropped at once
    adm = t.try_admit(KEY)
    assert adm is not None
    adm.leave()


def test_admit_leave_by_name(t):
    for kind in ("ok", "locked", "rate_limited", "unavailable", "permanent",
                 "transient", "abandoned"):
        t.clear(KEY) if t.keys() else None
        adm = t.admit(KEY)
        out = adm.leave(kind, 1 if kind in ("locked", "rate_limited",
                                            "unavailable") else None)
        assert out.kind == kind
    with t.admit("other") as adm:
        with pytest.raises(libthrottle.EINVAL):
            adm.leave("nonsense")
        with pytest.raises(TypeError):
            adm.leave(3)
        with pytest.raises(ValueError):
            adm.leave("locked", -1)


def test_admit_class_checks(t):
    with pytest.raises(libthrottle.EINVAL):
        t.admit(KEY, klass="urgent")
    with pytest.raises(TypeError):
        t.admit(KEY, klass=0)
    with t.admit(KEY, klass="backfill") as adm:
        assert t.info(KEY)["holders"][0]["klass"] == "backfill"
        adm.leave()


def test_admit_timeout_is_etimedout(t):
    t.backoff(KEY, 30)
    with pytest.raises(libthrottle.ETIMEDOUT) as e:
        t.admit(KEY, timeout=0.5)
    assert isinstance(e.value, TimeoutError)


def test_try_admit_full_cap_is_none(t):
    t.set_max_parallel(KEY, 1)
    first = t.try_admit(KEY)
    assert first is not None
    assert t.try_admit(KEY) is None
    first.leave()


def test_admit_probe_after_a_back_off(t):
    with t.admit(KEY) as adm:
        adm.report(409, {"Retry-After": "1"}, LOCKED)
    with t.admit(KEY, timeout=10) as adm:
        assert adm.probe  # the one probe of the lock episode
        adm.report(200)


def test_admit_cancel_ends_waiters(t):
    t.set_max_parallel(KEY, 1)
    holder = t.admit(KEY)
    got = []

    def waiter():
        try:
            t.admit(KEY, timeout=30)
        except libthrottle.ECANCELED as e:
            got.append(e)

    th = threading.Thread(target=waiter)
    th.start()
    deadline = time.monotonic() + 10
    while t.info(KEY)["waiting_live"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    t.cancel(KEY)
    th.join(10)
    assert len(got) == 1
    holder.leave()


def test_admit_pause_holds_and_resume_releases(t):
    t.pause(KEY)
    assert t.try_admit(KEY) is None
    with pytest.raises(libthrottle.ETIMEDOUT):
        t.admit(KEY, timeout=0.2)
    t.resume(KEY)
    t.admit(KEY, timeout=5).leave()


def test_admit_threads_share_the_cap(t):
    # eight threads, cap 2: never more than two admitted at once
    t.set_max_parallel(KEY, 2)
    lock = threading.Lock()
    state = {"now": 0, "most": 0, "done": 0}

    def worker():
        for _ in range(5):
            with t.admit(KEY, timeout=60) as adm:
                with lock:
                    state["now"] += 1
                    state["most"] = max(state["most"], state["now"])
                time.sleep(0.005)
                with lock:
                    state["now"] -= 1
                    state["done"] += 1
                adm.report(200)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert state["done"] == 40
    assert state["most"] == 2
    assert t.info(KEY)["admitted"] == 40


# ---- settings and inspection ------------------------------------------------------

def test_settings_ranges(t):
    t.set_max_parallel(KEY, 3)
    assert t.info(KEY)["cap"] == 3 and t.info(KEY)["cap_auto"] == 0
    t.set_max_parallel(KEY, "auto")
    assert t.info(KEY)["cap_auto"] == 1
    with pytest.raises(libthrottle.EINVAL):
        t.set_max_parallel(KEY, 33)
    with pytest.raises(libthrottle.EINVAL):
        t.set_max_parallel(KEY, -1)
    with pytest.raises(TypeError):
        t.set_max_parallel(KEY, 2.5)
    t.set_rate(KEY, 10, 60)
    assert (t.info(KEY)["rate_n"], t.info(KEY)["rate_period_ms"]) == (10,
                                                                      60000)
    t.set_backfill_share(KEY, 0.5)
    assert t.info(KEY)["backfill_share_permille"] == 500
    with pytest.raises(libthrottle.EINVAL):
        t.set_backfill_share(KEY, 1.5)
    with pytest.raises(TypeError):
        t.set_backfill_share(KEY, "half")


def test_info_unknown_key_is_enokey(t):
    with pytest.raises(libthrottle.ENOKEY):
        t.info("never-seen")


def test_info_holders_and_stats(t):
    with t.admit(KEY) as adm:
        (h,) = t.info(KEY)["holders"]
        assert h["pid"] == os.getpid() and h["klass"] == "live"
        adm.leave()
    st = t.stats()
    # the key, and its workspace: the scope its 429s and 503s go to
    assert st["used"] == 2 and st["capacity"] > 0
    assert t.segment == t.segment  # a str, stable
    assert t.shared is True


def test_info_waiters_in_arrival_order(t):
    t.pause(KEY)
    done = []

    def wait(klass):
        with t.admit(KEY, klass=klass, timeout=10):
            done.append(klass)

    threads = []
    for klass in ("backfill", "live"):
        th = threading.Thread(target=wait, args=(klass,))
        th.start()
        threads.append(th)
        deadline = time.monotonic() + 10
        while t.info(KEY)["waiting_" + klass] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    ws = t.info(KEY)["waiters"]
    assert [w["klass"] for w in ws] == ["backfill", "live"]
    for w in ws:
        assert w["pid"] == os.getpid() and w["age_ms"] >= 0
        assert w["host"] == "" and "probe" not in w
    t.resume(KEY)
    for th in threads:
        th.join(10)
    assert sorted(done) == ["backfill", "live"]
    assert t.info(KEY)["waiters"] == []


def test_keys_callback_error_does_not_cross_into_c(t, monkeypatch):
    t.backoff(KEY, 5)

    def boom(info):
        raise RuntimeError("boom")
    monkeypatch.setattr(_throttle, "_snapshot", boom)
    with pytest.raises(RuntimeError):
        t.keys()


# ---- handles ----------------------------------------------------------------------

def test_closed_handle_every_call_is_einval(segment):
    t = libthrottle.Throttle(segment=segment)
    t.close()
    t.close()  # twice is fine
    assert t.closed
    for call in (lambda: t.backoff(KEY, 1), lambda: t.remaining(KEY),
                 lambda: t.wait(KEY), lambda: t.admit(KEY),
                 lambda: t.try_admit(KEY), lambda: t.clear(KEY),
                 lambda: t.reset(), lambda: t.info(KEY), lambda: t.keys(),
                 lambda: t.stats(), lambda: t.pause(KEY),
                 lambda: t.set_rate(KEY, 1, 1), lambda: t.segment,
                 lambda: t.backend, lambda: t.beneath("hotdata:ws1"),
                 lambda: t.set_max_parallel_auto(KEY, 4),
                 lambda: t.set_publish_level("locked", "root")):
        with pytest.raises(libthrottle.EINVAL, match="closed"):
            call()


def test_closed_handle_admission_still_given_back(segment):
    with libthrottle.Throttle(segment=segment) as t:
        adm = t.admit(KEY)
    assert t.closed
    adm.report(200)  # the handle was kept for it
    with libthrottle.Throttle(segment=segment) as t2:
        assert t2.info(KEY)["in_flight"] == 0


def test_close_ends_a_wait_in_another_thread(t):
    t.backoff(KEY, 60)
    got = []

    def waiter():
        try:
            t.wait(KEY)
        except libthrottle.Error as e:
            got.append(e)
    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.2)
    t.close()
    th.join(10)
    assert not th.is_alive() and isinstance(got[0], libthrottle.EINVAL)


@pytest.mark.parametrize("name", ["a/b", "", "/", "x" * 201, "a\0b"])
def test_invalid_segment_name_is_einval(name):
    with pytest.raises(libthrottle.EINVAL):
        libthrottle.Throttle(segment=name)


@pytest.mark.parametrize("kw", [dict(segment=5), dict(max_delay="1"),
                                dict(keys=1.5), dict(lease=[]),
                                dict(lock_timeout="2")])
def test_wrong_setting_type_is_a_type_error(kw):
    with pytest.raises(TypeError):
        libthrottle.Throttle(**kw)


@pytest.mark.parametrize("kw", [dict(max_delay=0), dict(keys=0),
                                dict(lease=0), dict(lock_timeout=0),
                                dict(keys=2 ** 40)])
def test_out_of_range_setting_is_einval(kw, segment):
    with pytest.raises(libthrottle.EINVAL):
        libthrottle.Throttle(segment=segment, **kw)


def test_unusable_segment_falls_back_with_a_warning(segment):
    path = "/dev/shm" + segment
    with open(path, "wb") as f:
        f.write(b"x" * 8192)
    os.chmod(path, 0o600)
    with pytest.warns(libthrottle.FallbackWarning, match=segment[1:]):
        t = libthrottle.Throttle(segment=segment)
    with t:
        assert t.shared is False
        assert isinstance(t.open_error, libthrottle.EMAGIC)
        t.backoff(KEY, 5)  # works, in private memory
        assert t.remaining(KEY) > 4
        with t.admit("k2", timeout=5) as adm:
            adm.report(200)
    with open(path, "rb") as f:
        assert f.read() == b"x" * 8192  # left as it was
    with pytest.raises(libthrottle.EMAGIC):
        libthrottle.Throttle(segment=segment, no_fallback=True)


def test_no_create_absent_segment_is_eshm(segment):
    with pytest.raises(libthrottle.ESHM):
        libthrottle.Throttle(segment=segment, no_create=True,
                             no_fallback=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with libthrottle.Throttle(segment=segment):
            pass


def test_unlink_and_version(segment):
    libthrottle.Throttle(segment=segment).close()
    libthrottle.unlink(segment)
    with pytest.raises(libthrottle.ENOKEY):
        libthrottle.unlink(segment)
    with pytest.raises(TypeError):
        libthrottle.unlink(5)
    assert libthrottle.version() == libthrottle.__version__
    assert libthrottle.version().count(".") == 2


def test_environment_names_the_segment(segment):
    # THROTTLE_SEGMENT is set by the fixture
    with libthrottle.Throttle() as t:
        assert t.segment == segment


# ---- without the interrupt hook ---------------------------------------------------

def test_without_hook_wait_and_admit_still_work(t, monkeypatch):
    # a library older than throttle_config_set_interrupt(): sliced calls
    monkeypatch.setattr(_throttle, "HAVE_INTERRUPT", False)
    t.backoff(KEY, 0.3)
    assert t.wait(KEY, timeout=0.1) is False
    start = time.monotonic()
    assert t.wait(KEY) is True
    assert time.monotonic() - start >= 0.15
    t.set_max_parallel(KEY, 1)
    holder = t.admit(KEY)
    threading.Timer(0.3, holder.leave).start()
    start = time.monotonic()
    with t.admit(KEY, timeout=10) as adm:
        assert time.monotonic() - start >= 0.25
        adm.report(200)
    holder2 = t.admit(KEY)
    with pytest.raises(libthrottle.ETIMEDOUT):
        t.admit(KEY, timeout=0.3)
    holder2.leave()


def test_admit_exception_just_after_the_grant_gives_the_slot_back(
        t, monkeypatch):
    # a signal is checked as soon as the C call returns: an exception then,
    # before the Admission exists, must not leave the slot taken
    t.set_max_parallel(KEY, 1)
    real = _throttle.Admission.__init__

    def interrupted(self, *a):
        raise KeyboardInterrupt

    monkeypatch.setattr(_throttle.Admission, "__init__", interrupted)
    with pytest.raises(KeyboardInterrupt):
        t.admit(KEY)
    monkeypatch.setattr(_throttle.Admission, "__init__", real)
    info = t.info(KEY)
    assert info["in_flight"] == 0 and info["admitted"] == 1
    t.admit(KEY, timeout=0).leave()


def test_segment_max_delay(t):
    t.set_segment_max_delay(30)
    assert t.segment_max_delay == 30.0
    t.backoff(KEY, 600)
    assert t.remaining(KEY) <= 30
    with pytest.raises(libthrottle.EINVAL):
        t.set_segment_max_delay(0)
    with pytest.raises(TypeError):
        t.set_segment_max_delay("30")


def test_admission_taken_back_by_its_lease_reports_with_a_warning(segment):
    with libthrottle.Throttle(segment=segment, lease=0.1) as t:
        t.set_max_parallel(KEY, 1)
        hung = t.admit(KEY)
        time.sleep(0.2)
        # the next caller takes the slot back from the "hung" holder
        with t.admit(KEY, timeout=10) as adm:
            assert t.info(KEY)["reclaims"] == 1
            with pytest.warns(libthrottle.StaleAdmissionWarning):
                out = hung.report(409, {"Retry-After": "2"}, LOCKED)
            assert out.kind == "locked"
            adm.leave()
        assert t.remaining(KEY) > 1  # its answer was still published


def test_throttle_repr(segment):
    t = libthrottle.Throttle(segment=segment)
    assert repr(t) == "<libthrottle.Throttle %s>" % segment
    t.close()
    assert repr(t) == "<libthrottle.Throttle (closed)>"


def test_throttle_try_admit_returns_the_wait_hint(t):
    """try_admit(hint=True): the library's hint (throttle_try_enter's
    wait_ms): the back-off left, 0 when the wait is for a slot."""
    t.backoff(KEY, 5)
    adm, wait = t.try_admit(KEY, hint=True)
    assert adm is None and 4 < wait <= 5
    t.clear(KEY)
    t.set_max_parallel(KEY, 1)
    held, wait = t.try_admit(KEY, hint=True)
    assert held is not None and wait == 0.0
    adm, wait = t.try_admit(KEY, hint=True)
    assert adm is None and wait == 0.0  # a slot, not a time
    held.leave("ok")
    assert t.try_admit(KEY) is not None  # the plain form is unchanged


def test_throttle_timedelta_is_accepted_for_every_delay(t):
    import datetime
    t.backoff(KEY, datetime.timedelta(seconds=3))
    assert 2 < t.remaining(KEY) <= 3
    assert t.wait(KEY, timeout=datetime.timedelta(milliseconds=10)) is False
    with pytest.raises(ValueError):
        t.backoff(KEY, datetime.timedelta(seconds=-1))
    t.set_rate(KEY, 10, datetime.timedelta(minutes=1))
    assert t.info(KEY)["rate_period_ms"] == 60000


def test_throttle_leave_takes_a_timedelta_retry_after(t):
    import datetime
    adm = t.admit(KEY)
    out = adm.leave("locked", datetime.timedelta(seconds=2))
    assert out.retry_after == 2.0
    assert 1 < t.remaining(KEY) <= 2
