# SPDX-License-Identifier: MIT
"""test_interrupt.py — Ctrl-C (SIGINT) reaches a process blocked in the
library: wait() on a 60 s back-off and admit() in a queue end with
KeyboardInterrupt at once, and a queue place or slot is given back (the
next waiter is admitted).  Real processes; the bound asserted (0.5 s
against a 60 s wait) is two orders of magnitude above what is measured."""

import signal
import time

import pytest

import libthrottle
from conftest import expect_line, spawn, start_together, until

KEY = "hotdata:ws1/orders"


def blocked(p):
    """p's one thread sleeps in the kernel (a futex or a timed sleep)."""
    try:
        with open("/proc/%d/wchan" % p.pid) as f:
            return f.read() not in ("", "0")
    except OSError:
        return False


def interrupt(p):
    """SIGINT p; (seconds from the signal to the KeyboardInterrupt, exit
    code, seconds to the exit).  It must have exited within 0.5 s."""
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    line = expect_line(p, "KI")
    p.communicate(timeout=30)
    exited = time.monotonic() - sent
    assert exited < 0.5, "exited %.3f s after SIGINT" % exited
    return float(line.split()[1]) - sent, p.returncode, exited


def test_interrupt_wait_on_a_60s_back_off(t, capsys):
    t.backoff(KEY, 60)
    p = spawn("wait", KEY)
    expect_line(p, "ready")
    until(lambda: blocked(p), what="the child asleep in wait()")
    latency, rc, exited = interrupt(p)
    with capsys.disabled():
        print("\n[figures] SIGINT to KeyboardInterrupt, wait() on a 60 s "
              "back-off: %.1f ms (process exited after %.1f ms)"
              % (latency * 1000, exited * 1000))
    assert rc == 130
    assert latency < 0.5
    assert t.remaining(KEY) > 50  # nothing changed for the others


def test_interrupt_signal_handler_runs_during_the_wait(t):
    # a handler that returns normally runs while the wait goes on
    t.backoff(KEY, 60)
    p = spawn("wait", KEY)
    expect_line(p, "ready")
    until(lambda: blocked(p), what="the child asleep in wait()")
    sent = time.monotonic()
    p.send_signal(signal.SIGUSR1)
    ran = float(expect_line(p, "usr1").split()[1])
    assert ran - sent < 0.5
    until(lambda: blocked(p), what="the child asleep again")
    assert p.poll() is None  # still waiting
    latency, rc, _ = interrupt(p)
    assert rc == 130 and latency < 0.5


def test_interrupt_admit_gives_the_queue_place_to_the_next(t, capsys):
    t.set_max_parallel(KEY, 1)
    holder = t.admit(KEY)
    first = spawn("admit", KEY, stdin=True)
    expect_line(first, "ready")
    until(lambda: t.info(KEY)["waiting_live"] == 1, what="first in queue")
    second = spawn("admit", KEY, stdin=True)
    expect_line(second, "ready")
    until(lambda: t.info(KEY)["waiting_live"] == 2, what="second in queue")
    latency, rc, exited = interrupt(first)
    with capsys.disabled():
        print("\n[figures] SIGINT to KeyboardInterrupt, admit() queued "
              "behind a holder: %.1f ms (process exited after %.1f ms)"
              % (latency * 1000, exited * 1000))
    assert rc == 130 and latency < 0.5
    assert t.info(KEY)["waiting_live"] == 1  # its place was given back
    holder.leave("ok")
    # the next waiter is admitted at once, not after a lease
    line = expect_line(second, "admitted")
    assert float(line.split()[1]) >= 0
    second.communicate("\n", timeout=30)
    assert second.returncode == 0
    info = t.info(KEY)
    assert info["in_flight"] == 0 and info["reclaims"] == 0


def test_interrupt_inside_the_with_block_gives_the_slot_back(t):
    t.set_max_parallel(KEY, 1)
    p = spawn("held", KEY, stdin=True)
    expect_line(p, "admitted")
    assert t.info(KEY)["in_flight"] == 1
    p.send_signal(signal.SIGINT)
    expect_line(p, "released")
    # still alive, and the slot is free: given back by the with block
    assert p.poll() is None
    assert t.info(KEY)["in_flight"] == 0
    adm = t.try_admit(KEY)
    assert adm is not None
    adm.leave()
    p.communicate("\n", timeout=30)


@pytest.mark.parametrize("status", [429, 500])
def test_interrupt_retry_wait_in_request(t, tmp_path, status):
    # 429 + Retry-After: 60 is published, and request() waits in admit();
    # 500 + Retry-After: 60 is not, and request() sleeps it locally.
    # SIGINT ends either at once.
    import http.server
    import threading

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Retry-After", "60")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        (tmp_path / "f").write_bytes(b"x")
        p = spawn("load", KEY, "http://127.0.0.1:%d/v1/tables/orders/load"
                  % srv.server_address[1], str(tmp_path / "f"), stdin=True)
        start_together([p])
        until(lambda: t.keys() and t.info(KEY)["admitted"] == 1 and
              t.info(KEY)["in_flight"] == 0 and blocked(p),
              what="the answer reported, the child asleep")
        assert (t.remaining(KEY) > 50) == (status == 429)
        latency, rc, _ = interrupt(p)
        assert rc == 130 and latency < 0.5
        assert t.info(KEY)["in_flight"] == 0
    finally:
        srv.shutdown()
        srv.server_close()


def test_interrupt_hook_is_used():
    # the library has the hook: blocking calls are made whole, not sliced
    assert libthrottle.HAVE_INTERRUPT


def test_close_stops_a_thread_pool_of_waiters(segment):
    """close() from another thread ends every thread blocked in admit()
    or wait() with ThrottleClosed (how a pool of waiters is stopped), and
    their queue places are given back."""
    import concurrent.futures
    th = libthrottle.Throttle(segment=segment)
    th.backoff(KEY, 60)

    def admit():
        with th.admit(KEY):
            return "admitted"

    with libthrottle.Throttle(segment=segment) as watcher:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futs = [pool.submit(admit) for _ in range(3)]
            futs.append(pool.submit(th.wait, KEY))
            until(lambda: watcher.info(KEY)["waiting_live"] == 3,
                  what="3 threads queued")
            th.close()
            for f in futs:
                with pytest.raises(libthrottle.ThrottleClosed):
                    f.result(timeout=30)
        assert watcher.info(KEY)["waiting_live"] == 0
