# SPDX-License-Identifier: MIT
"""test_scopes.py — keys as paths from Python, one process: a back-off,
pause, resume, clear and cancel on a scope reach every key beneath it; a
cap, backfill share and rate on a scope make it a pool over the sum of
its keys; where a reported answer is published (Throttle(publish=...),
set_publish_level); what info() and beneath() say about a scope; the
learned cap with a bound; the backend setting.  The same behaviours with
real processes and the mock server are in test_scope_fleet.py."""

import pickle
import threading
import warnings

import pytest

import libthrottle
from conftest import field, until

WS = "hotdata:ws1"
T0, T1, T2 = WS + "/t0", WS + "/t1", WS + "/t2"
OTHER = "hotdata:ws2/t0"


def answer_workspace(t, key=T0):
    """The workspace's first answer.  Until one comes, a cold scope sends one
    first request and holds the keys beneath (up to 1 s): a test that holds
    several admissions at once starts from a workspace already answered."""
    t.admit(key, timeout=5).leave()


# ---- signals on a scope -----------------------------------------------------------

def test_scope_backoff_holds_every_key_beneath(t):
    t.backoff(WS, 30)
    for key in (T0, T1, WS + "/deeper/t9"):
        assert t.remaining(key) > 25
        assert t.try_admit(key) is None
        assert t.wait(key, timeout=0) is False
    assert t.remaining(OTHER) == 0.0  # another workspace is not beneath
    t.try_admit(OTHER).leave()


def test_cold_scope_sends_one_first_request(t):
    first = t.try_admit(T0)
    assert first is not None
    assert t.try_admit(T1) is None  # nothing known of the workspace yet
    first.leave("rate_limited", 30)  # its 429 holds every table
    assert t.remaining(T1) > 25 and t.try_admit(T2) is None


def test_cold_scope_hold_ends_at_the_answer_or_after_a_second(t):
    first = t.try_admit(T0)
    with t.admit(T1, timeout=10):  # the same caller, nested: no self-wait
        pass
    first.leave()
    a, b = t.try_admit(T1), t.try_admit(T2)  # answered: all go at once
    assert a is not None and b is not None
    a.leave()
    b.leave()


def test_cold_scope_first_request_is_the_probe_and_bounds_a_wait(t):
    first = t.try_admit(T0)
    assert first.probe  # the scope's probe: its answer is the workspace's
    assert t.wait(T1, timeout=10) is True  # nested wait: the 1 s bound
    later = t.try_admit(T1)
    assert later is not None and not later.probe
    later.leave()
    first.leave()


def test_scope_clear_opens_every_key_beneath(t):
    t.backoff(WS, 30)
    t.clear(WS)
    assert t.remaining(T0) == 0.0 and t.remaining(T1) == 0.0
    assert t.wait(T0, timeout=0) is True


def test_scope_pause_holds_every_key_and_resume_releases(t):
    t.pause(WS)
    assert t.info(WS)["paused"] == 1
    for key in (T0, T1):
        assert t.try_admit(key) is None
        with pytest.raises(libthrottle.ETIMEDOUT):
            t.admit(key, timeout=0.1)
    t.try_admit(OTHER).leave()
    t.resume(WS)
    assert t.info(WS)["paused"] == 0
    for key in (T0, T1):
        t.admit(key, timeout=5).leave()


def test_scope_cancel_reaches_waiters_of_every_key(t):
    t.pause(WS)
    got = {}

    def waiter(key):
        try:
            t.admit(key, timeout=30)
            got[key] = "admitted"
        except libthrottle.ECANCELED:
            got[key] = "canceled"

    threads = [threading.Thread(target=waiter, args=(k,), daemon=True)
               for k in (T0, T1)]
    for th in threads:
        th.start()
    until(lambda: all(field(t, k, "waiting_live") == 1 for k in (T0, T1)),
          what="both tables' waiters queued")
    t.cancel(WS)
    for th in threads:
        th.join(10)
    assert got == {T0: "canceled", T1: "canceled"}
    t.resume(WS)
    t.admit(T0, timeout=5).leave()  # later callers are not affected


# ---- pools ------------------------------------------------------------------------

def test_pool_settings_read_back_on_the_scope(t):
    t.set_max_parallel(WS, 3)
    t.set_backfill_share(WS, 0.25)
    t.set_rate(WS, 600, 60)
    info = t.info(WS)
    assert (info["cap"], info["cap_auto"]) == (3, 0)
    assert info["backfill_share_permille"] == 250
    assert (info["rate_n"], info["rate_period_ms"]) == (600, 60000)
    assert info["scope"] is None and info["key"] == WS


def test_pool_bounds_the_sum_of_its_keys(t):
    t.set_max_parallel(WS, 2)
    for key in (T0, T1, T2):
        t.set_max_parallel(key, 8)
    answer_workspace(t)
    a = t.try_admit(T0)
    b = t.try_admit(T1)
    assert a is not None and b is not None
    assert t.try_admit(T2) is None  # each table has room, the pool has not
    assert t.info(WS)["in_flight"] == 2
    assert t.beneath(WS) == {"keys": 3, "in_flight": 2, "waiting": 0}
    a.leave()
    c = t.try_admit(T2)  # the place left on t0 serves t2
    assert c is not None
    b.leave()
    c.leave()
    assert t.info(WS)["in_flight"] == 0


def test_pool_leave_hands_its_place_to_another_table_s_waiter(t):
    t.set_max_parallel(WS, 1)
    holder = t.admit(T0)
    got = []
    th = threading.Thread(target=lambda: got.append(t.admit(T1, timeout=30)),
                          daemon=True)
    th.start()
    until(lambda: field(t, T1, "waiting_live") == 1, what="t1 queued")
    holder.leave()
    th.join(10)
    assert len(got) == 1 and got[0].key == T1
    assert t.beneath(WS)["in_flight"] == 1
    got[0].leave()


def test_pool_backfill_share_keeps_live_ahead(t):
    # a pool of 2 of which backfill may hold 1: a second backfill waits
    # while a live request of another table still gets in
    t.set_max_parallel(WS, 2)
    t.set_backfill_share(WS, 0.5)
    answer_workspace(t)
    b0 = t.try_admit(T0, "backfill")
    assert b0 is not None
    assert t.try_admit(T1, "backfill") is None
    live = t.try_admit(T2, "live")
    assert live is not None
    for adm in (b0, live):
        adm.leave()


# ---- where answers are published --------------------------------------------------

def test_rate_limited_published_on_the_root_scope_by_default(t):
    with t.admit(T0) as adm:
        adm.leave("rate_limited", 30)
    assert t.info(WS)["publishes"] == 1
    assert t.remaining(T1) > 25  # a sibling table waits too
    with t.admit(OTHER) as adm:
        adm.leave("locked", 30)  # a lock is the table's own
    assert t.info(OTHER)["publishes"] == 1
    assert t.remaining("hotdata:ws2/t1") == 0.0


def test_set_publish_level_applies_to_every_handle_of_the_throttle(t):
    # wait() from the main thread opens the Throttle's second (interruptible)
    # handle, which admit() then uses: the level must reach it too
    assert t.wait(T0)
    t.set_publish_level("rate_limited", "key")
    with t.admit(T0) as adm:
        adm.leave("rate_limited", 30)
    assert t.info(T0)["publishes"] == 1
    assert t.remaining(T1) == 0.0
    t.set_publish_level("unavailable", 1)
    t.clear(T0)
    with t.admit(T1) as adm:
        adm.leave("unavailable", 30)
    assert t.info(WS)["publishes"] == 1 and t.remaining(T2) > 25


def test_set_publish_level_before_the_main_thread_s_handle_opens(t):
    t.set_publish_level("rate_limited", "key")
    with t.admit(T0) as adm:  # the main thread's handle opens only now
        adm.leave("rate_limited", 30)
    assert t.info(T0)["publishes"] == 1 and t.remaining(T1) == 0.0


def test_set_publish_level_travels_with_a_pickled_throttle(t):
    # multiprocessing "spawn" pickles the Throttle: the child's keeps it
    t.set_publish_level("rate_limited", "key")
    with pickle.loads(pickle.dumps(t)) as copy:
        with copy.admit(T0) as adm:
            adm.leave("rate_limited", 30)
    assert t.info(T0)["publishes"] == 1 and t.remaining(T1) == 0.0


def test_set_publish_level_reaches_a_thread_s_admission(t):
    t.set_publish_level("rate_limited", "key")
    done = []

    def other():
        with t.admit(T0) as adm:
            adm.leave("rate_limited", 30)
        done.append(1)

    th = threading.Thread(target=other, daemon=True)
    th.start()
    th.join(10)
    assert done == [1] and t.info(T0)["publishes"] == 1
    assert t.remaining(T1) == 0.0


@pytest.mark.parametrize("kind,level", [("ok", "key"), ("permanent", 1),
                                        ("locked", 0), ("locked", 256),
                                        ("locked", "scope"), ("locked", True)])
def test_set_publish_level_checks_its_arguments(t, kind, level):
    with pytest.raises(libthrottle.EINVAL):
        t.set_publish_level(kind, level)


# ---- inspection -------------------------------------------------------------------

def test_info_names_the_key_s_scope_and_holders_host(t):
    with t.admit(WS + "/deeper/t9") as adm:
        info = t.info(WS + "/deeper/t9")
        assert info["scope"] == WS + "/deeper"
        (h,) = info["holders"]
        assert h["host"] == ""  # the segment: every holder is of this host
        adm.leave()
    t.backoff("plain", 1)
    assert t.info("plain")["scope"] is None


def test_info_scope_carries_the_learned_cap_fields(t):
    t.set_max_parallel_auto(T0, 4)
    info = t.info(T0)
    assert (info["cap_auto"], info["cap_max"]) == (1, 4)
    for name in ("cap_good", "cap_fail", "cap_fails", "cap_retry_after_ms",
                  "cap_work_ms", "cap_next_raise_ms", "cap_learned_ago_ms"):
        assert isinstance(info[name], int)
    assert info["cap_learned_ago_ms"] == -1  # no refusal yet: slow start
    t.set_max_parallel_auto(T0)  # no bound
    assert t.info(T0)["cap_max"] == 0


def test_set_max_parallel_auto_checks_its_bound(t):
    with pytest.raises(libthrottle.EINVAL):
        t.set_max_parallel_auto(T0, 33)
    with pytest.raises(libthrottle.EINVAL):
        t.set_max_parallel_auto(T0, -1)
    with pytest.raises(TypeError):
        t.set_max_parallel_auto(T0, "4")


def test_beneath_sums_only_the_keys_under_the_scope(t):
    t.set_max_parallel(T0, 4)
    answer_workspace(t)
    a, b = t.admit(T0), t.admit(T0)
    c = t.admit(OTHER)
    t.backoff(WS + "x/t0", 5)  # a prefix, not a scope of WS
    assert t.beneath(WS) == {"keys": 1, "in_flight": 2, "waiting": 0}
    assert t.beneath("nothing") == {"keys": 0, "in_flight": 0, "waiting": 0}
    for adm in (a, b, c):
        adm.leave()


# ---- the backend ------------------------------------------------------------------

def test_backend_defaults_to_the_segment(t):
    assert t.backend == "shm"


def test_backend_unknown_url_keeps_the_segment_with_a_warning(segment):
    with pytest.warns(libthrottle.FallbackWarning, match="segment alone"):
        t = libthrottle.Throttle(backend="nonsense://x")
    with t:
        assert isinstance(t.open_error, libthrottle.EINVAL)
        assert t.shared and t.backend == "shm"
        t.backoff(T0, 5)
        assert t.remaining(T0) > 4
    with pytest.raises(libthrottle.EINVAL):
        libthrottle.Throttle(backend="nonsense://x", no_fallback=True)


@pytest.mark.parametrize("bad,exc", [(5, TypeError), ("a\0b", ValueError),
                                     ("", ValueError)])
def test_backend_bad_value(segment, bad, exc):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(exc):
            libthrottle.Throttle(backend=bad)


def test_backend_password_is_not_shown(segment):
    # nothing listens there: the handle opens, and serves from the segment
    # while Redis cannot be reached
    with pytest.warns(libthrottle.FallbackWarning) as w:
        t = libthrottle.Throttle(backend="redis://:s3cret@127.0.0.1:1/0")
    with t:
        assert "s3cret" not in t.backend and "***" in t.backend
        # nor in what says Redis cannot be reached
        assert "s3cret" not in str(w[0].message)
        assert "s3cret" not in str(t.open_error)
        assert "***" in str(t.open_error)
