# SPDX-License-Identifier: MIT
"""test_requeue.py — Admission.requeue() (throttle_requeue): a transient
answer reported and retried in the admission's own place, ahead of those
who came after it; what it publishes; its errors (timeout, cancel, a
closed Throttle, Ctrl-C, wrong arguments), after each of which the place
is given back.  One process and worker processes; orders, never wall clock."""

import signal
import threading

import pytest

import libthrottle
from conftest import expect_line, field, in_fork_child, spawn, until

KEY = "hotdata:ws1/orders"


def queued_worker(t):
    """A worker process queued on KEY (cap 1, held here)."""
    w = spawn("admit", KEY, stdin=True)
    expect_line(w, "ready")
    until(lambda: field(t, KEY, "waiting_live") == 1, what="worker queued")
    return w


def test_requeue_keeps_the_place_ahead_of_later_waiters(t):
    t.set_max_parallel(KEY, 1)
    adm = t.admit(KEY)
    w = queued_worker(t)
    assert adm.requeue("transient") is adm  # admitted again at once
    assert adm.held and t.info(KEY)["in_flight"] == 1
    assert field(t, KEY, "waiting_live") == 1  # the worker still waits
    adm.leave("ok")
    expect_line(w, "admitted")  # then it goes
    w.communicate("\n", timeout=30)
    assert w.returncode == 0


def test_leave_and_admit_again_goes_behind_later_waiters(t):
    # what requeue() spares: a new admit() queues behind the worker
    t.set_max_parallel(KEY, 1)
    adm = t.admit(KEY)
    w = queued_worker(t)
    adm.leave("transient")
    expect_line(w, "admitted")
    with pytest.raises(libthrottle.ETIMEDOUT):
        t.admit(KEY, timeout=0.1)
    w.communicate("\n", timeout=30)


def test_requeue_locked_publishes_and_comes_back_as_the_probe(t):
    with t.admit(KEY) as adm:
        adm.requeue("locked", 0.2, timeout=30)
        assert t.info(KEY)["publishes"] == 1  # the lock was published
        assert adm.probe  # and this one probes the episode
        adm.leave("ok")
    assert t.info(KEY)["lock_episode"] == 0


def test_requeue_beyond_the_timeout_gives_the_place_back(t):
    adm = t.admit(KEY)
    with pytest.raises(libthrottle.ETIMEDOUT):
        adm.requeue("locked", 30, timeout=0.1)
    assert not adm.held and adm.outcome.kind == "locked"
    assert t.info(KEY)["in_flight"] == 0 and t.remaining(KEY) > 25
    with pytest.raises(libthrottle.EINVAL):
        adm.leave()  # over: nothing left to give back


def test_requeue_canceled_gives_the_place_back(t):
    t.set_max_parallel(KEY, 1)
    holder = t.admit(KEY)
    got = []

    def other():
        adm = t.admit(KEY, timeout=30)  # admitted after the holder
        t.pause(KEY)
        try:
            adm.requeue("transient", timeout=30)
        except libthrottle.ECANCELED:
            got.append(adm.held)

    th = threading.Thread(target=other, daemon=True)
    th.start()
    until(lambda: field(t, KEY, "waiting_live") == 1, what="thread queued")
    holder.leave()
    until(lambda: t.info(KEY)["paused"] == 1 and
          t.info(KEY)["waiting_live"] == 1, what="thread requeued")
    t.cancel(KEY)
    th.join(10)
    assert got == [False] and t.info(KEY)["in_flight"] == 0


def test_requeue_closed_throttle_ends_the_wait(segment):
    t = libthrottle.Throttle(segment=segment)
    got = []

    def other():
        adm = t.admit(KEY)
        t.pause(KEY)
        try:
            adm.requeue("transient", timeout=30)
        except libthrottle.EINVAL as e:
            got.append(str(e))

    th = threading.Thread(target=other, daemon=True)
    th.start()
    until(lambda: field(t, KEY, "waiting_live") == 1, what="requeued")
    t.close()
    th.join(10)
    assert len(got) == 1 and "closed" in got[0]
    assert t._h is None  # freed once the requeue had given its place back


def test_requeue_interrupted_gives_the_place_back(t):
    w = spawn("requeue", KEY)
    expect_line(w, "ready")
    expect_line(w, "admitted")
    until(lambda: field(t, KEY, "waiting_live") == 1 and
          t.info(KEY)["in_flight"] == 0, what="requeued behind its 60 s lock")
    w.send_signal(signal.SIGINT)
    expect_line(w, "KI")
    w.communicate(timeout=30)
    assert w.returncode == 130
    info = t.info(KEY)
    assert (info["waiting_live"], info["in_flight"], info["reclaims"]) == (
        0, 0, 0)
    assert t.remaining(KEY) > 50  # the lock it reported still holds


def test_requeue_argument_checks(t):
    adm = t.admit(KEY)
    with pytest.raises(libthrottle.EINVAL):
        adm.requeue("later")
    with pytest.raises(TypeError):
        adm.requeue(3)
    with pytest.raises(TypeError):
        adm.requeue("locked", "soon")
    with pytest.raises(ValueError):
        adm.requeue("transient", timeout=-1)
    assert adm.held  # a refused argument leaves the admission as it was
    adm.leave()
    with pytest.raises(libthrottle.EINVAL):
        adm.requeue()


def test_requeue_main_thread_admission_from_another_thread_is_einval(t):
    adm = t.admit(KEY)  # on the main thread's interruptible handle
    got = []
    th = threading.Thread(target=lambda: got.append(
        pytest.raises(libthrottle.EINVAL, adm.requeue)), daemon=True)
    th.start()
    th.join(10)
    assert len(got) == 1 and adm.held
    adm.leave()


def test_requeue_in_a_fork_child_is_einval(t):
    adm = t.admit(KEY)
    assert in_fork_child(adm, "requeue").startswith(
        "EINVAL: this admission belongs")
    assert adm.held  # still the parent's
    adm.leave()
