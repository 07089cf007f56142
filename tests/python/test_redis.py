# SPDX-License-Identifier: MIT
"""test_redis.py — Python and C processes sharing keys through Redis
(THROTTLE_BACKEND=unix:///...): each test starts its own throw-away
redis-server on a unix socket in a temporary directory (--port 0
--save '' --appendonly no: never a TCP port, nothing written) and stops
it by its pid.  The Python processes and the C ones (`throttlectl`) each
open a segment of their own, as on two hosts: only Redis joins them.

  - a back-off published by either holds the other;
  - a 429 reported from Python holds the C process on every table of the
    workspace (published on the workspace's record in Redis);
  - a cap of 1 set from Python is never exceeded by Python and C holders
    together, who go in arrival order.

Skipped, saying why, without redis-server or the backend module
(libthrottle-redis.so.1, built when libhiredis-dev is installed)."""

import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

import libthrottle
from conftest import (BUILD, expect_line, field, one_at_a_time, spawn,
                      spawn_ctl_hold, until)

KEY = "hotdata:ws1/orders"


def answers(sock):
    """True when a Redis server answers PING on the unix socket sock."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1)
            s.connect(sock)
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture
def redis():
    """A throw-away redis-server; yields its unix:// URL."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make deps)")
    if not os.path.exists(os.path.join(BUILD, "libthrottle-redis.so.1")):
        pytest.skip("libthrottle-redis.so.1 was not built (libhiredis-dev)")
    d = tempfile.mkdtemp(prefix="tt-py-redis-")  # short: sun_path is 108
    sock = os.path.join(d, "redis.sock")
    proc = subprocess.Popen(
        ["redis-server", "--port", "0", "--unixsocket", sock,
         "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
         "--dir", d, "--logfile", os.path.join(d, "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until(lambda: answers(sock) or proc.poll() is not None,
              what="redis-server")
        assert proc.poll() is None, "redis-server exited at start"
        yield "unix://" + sock
    finally:
        proc.terminate()  # by its pid: only the one this test started
        proc.wait(10)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def hosts(redis, monkeypatch):
    """Environments of two "hosts" on one Redis: (python, c), each with a
    segment of its own, removed afterwards."""
    names = ["/tt-py-redis-%d-%s" % (os.getpid(), h) for h in ("py", "c")]
    monkeypatch.setenv("THROTTLE_BACKEND", redis)
    monkeypatch.setenv("THROTTLE_SEGMENT", names[0])
    yield [dict(THROTTLE_BACKEND=redis, THROTTLE_SEGMENT=n) for n in names]
    for n in names:
        try:
            libthrottle.unlink(n)
        except libthrottle.ENOKEY:
            pass


def ctl(env, *args, check=True):
    """throttlectl ARGS with env (the C "host")."""
    exe = os.path.join(BUILD, "throttlectl")
    if not os.path.exists(exe):
        pytest.fail("%s is missing (make)" % exe)
    out = subprocess.run([exe] + list(args), env=dict(os.environ, **env),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=60)
    if check:
        assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out


def test_redis_python_backoff_holds_a_c_process(hosts):
    py, c = hosts
    with libthrottle.Throttle() as t:
        assert t.backend == py["THROTTLE_BACKEND"]
        t.backoff(KEY, 30)
    # the C process has another segment: only Redis can tell it
    assert ctl(c, "wait", KEY, "--timeout", "0", check=False).returncode == 75
    assert ctl(c, "wait", "hotdata:ws1/other", "--timeout", "0",
               check=False).returncode == 0


def test_redis_c_backoff_holds_a_python_process(hosts):
    py, c = hosts
    start = time.monotonic()
    ctl(c, "backoff", KEY, "1")
    # a Python process of the other "host" waits it out: never before
    waiter = spawn("wait", KEY)
    expect_line(waiter, "ready")
    opened = float(expect_line(waiter, "open").split()[1])
    waiter.communicate(timeout=30)
    assert opened >= start + 1.0
    with libthrottle.Throttle() as t:
        ctl(c, "backoff", KEY, "30")
        assert t.remaining(KEY) > 25
        assert t.try_admit(KEY) is None
        ctl(c, "clear", KEY)
        assert t.remaining(KEY) == 0.0  # the clear crosses too


def test_redis_scope_429_from_python_holds_c_on_every_table(hosts):
    py, c = hosts
    with libthrottle.Throttle() as t:
        with t.admit(KEY) as adm:
            adm.report(429, {"Retry-After": "30"}, b"")
    # published on the workspace: every table of it, for the C "host"
    for table in ("orders", "events"):
        assert ctl(c, "wait", "hotdata:ws1/" + table, "--timeout", "0",
                   check=False).returncode == 75
    assert ctl(c, "wait", "hotdata:ws2/orders", "--timeout", "0",
               check=False).returncode == 0


def test_redis_cap_of_1_holds_across_python_and_c(hosts, tmp_path,
                                                 capsys):
    py, c = hosts
    log = str(tmp_path / "log")
    with libthrottle.Throttle() as t:
        t.set_max_parallel(KEY, 1)
        holder = t.admit(KEY)
        names = ["py0", "c1", "py2", "c3", "c4", "py5"]
        procs = []
        for i, name in enumerate(names):
            if name.startswith("py"):
                p = spawn("hold", KEY, name, log, 0.05)
            else:
                p = spawn_ctl_hold(KEY, name, log, 0.05, **c)
            procs.append(p)
            # queued in this order: the next starts once this one waits
            until(lambda n=i + 1: field(t, KEY, "waiting_live") == n,
                  what="%s queued" % name)
        assert not os.path.exists(log)  # the cap held every one of them
        holder.leave("ok")
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, (out, err)
        assert field(t, KEY, "in_flight") == 0
    with open(log) as f:
        lines = f.read().splitlines()
    with capsys.disabled():
        print("\n[figures] Redis, cap 1, 3 Python + 3 C holders on two "
              "segments: %s" % " ".join(w.split()[1] for w in lines[::2]))
    # one at a time (start, end, start, end...), first come first served
    assert lines == one_at_a_time(names)


def test_redis_unreachable_backend_warns_and_says_so(segment, tmp_path):
    """A Redis that cannot be reached when the Throttle is made: a
    FallbackWarning naming it, .open_error an EBACKEND, and the segment
    serves (it was silent: open_error None, no warning)."""
    url = "unix://%s" % (tmp_path / "nobody-listens.sock")
    with pytest.warns(libthrottle.FallbackWarning) as w:
        t = libthrottle.Throttle(segment=segment, backend=url)
    try:
        assert "nobody-listens.sock" in str(w[0].message)
        assert isinstance(t.open_error, libthrottle.EBACKEND)
        assert "nobody-listens.sock" in str(t.open_error)
        t.backoff(KEY, 5)  # served by the host's segment
        assert 4 < t.remaining(KEY) <= 5 and t.shared
    finally:
        t.close()


def test_redis_reachable_backend_opens_quietly(redis, segment):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with libthrottle.Throttle(segment=segment, backend=redis) as t:
            assert t.open_error is None


def _in_thread(fn, *args):
    """fn(*args) in another thread (whose calls go to the Throttle's
    shared handle, the main thread's to a handle of its own)."""
    import threading
    out = []
    th = threading.Thread(target=lambda: out.append(fn(*args)))
    th.start()
    th.join(60)
    return out[0]


def _fork_child_holds(t, conn, hold):
    def hold_in_thread():
        with t.admit(KEY, timeout=30) as adm:
            conn.send("admitted")
            time.sleep(hold)
            adm.report(200, {}, b"")
        return True
    _in_thread(hold_in_thread)
    with t.admit("child", timeout=30) as adm:  # main thread's
        adm.report(200, {}, b"")
    t.close()
    conn.send("closed")


def test_redis_fork_children_run_admit_and_exit(hosts, monkeypatch):
    """multiprocessing's fork start method with THROTTLE_BACKEND set, after
    the parent has been admitted (its heartbeat runs): a child that makes
    no call exits at once; a child admits (on the shared handle, from a
    thread, and on its main thread's), holds past the liveness bound (kept
    alive: the C "host" sees it in flight, nothing reclaimed, and is
    refused), reports, closes and exits."""
    import json
    import multiprocessing
    py, c = hosts
    monkeypatch.setenv("THROTTLE_LIVENESS_MS", "1000")
    ctx = multiprocessing.get_context("fork")
    with libthrottle.Throttle() as t:
        t.set_max_parallel(KEY, 1)
        mine = t.admit("parent")
        # and one on the shared handle: both handles' heartbeats run
        theirs = _in_thread(t.admit, "parent2")
        time.sleep(0.05)  # its heartbeat is asleep on its wait
        idle = ctx.Process(target=int)
        start = time.monotonic()
        idle.start()
        idle.join(10)
        assert idle.exitcode == 0, "a child that made no call did not end"
        assert time.monotonic() - start < 5
        here, there = ctx.Pipe()
        p = ctx.Process(target=_fork_child_holds, args=(t, there, 3.0))
        p.start()
        try:
            assert here.poll(20), "the child did not run"
            assert here.recv() == "admitted"
            time.sleep(2.5)  # past the liveness bound, the child holding
            assert ctl(c, "wait", KEY, "--timeout", "0",
                       check=False).returncode == 0  # no back-off: open
            refused = ctl(c, "run", KEY, "--timeout", "0", "--", "true",
                          check=False)
            assert refused.returncode == 75, refused  # but the cap is taken
            shown = json.loads(ctl(c, "show", KEY, "--json").stdout)
            assert shown["in_flight"] == 1 and shown["reclaims"] == 0, shown
            assert here.poll(10) and here.recv() == "closed"
            p.join(10)
            assert p.exitcode == 0
        finally:
            if p.is_alive():
                p.kill()
                p.join()
        assert field(t, KEY, "in_flight") == 0
        assert field(t, "parent", "in_flight") == 1
        mine.leave("ok")
        _in_thread(theirs.leave, "ok")
