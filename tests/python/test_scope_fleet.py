# SPDX-License-Identifier: MIT
"""test_scope_fleet.py — scopes and pools with real Python processes
(tests/python/worker.py) against the mock server's workspaces
(tests/mock_server.py: a workspace-wide overload window, and per
workspace the loads in service at once and the requests that came before
its advertised time):

  - 4 tables of one workspace, 16 processes, the workspace answering 429
    for 3 s: every file loaded, nothing sent to the workspace before the
    time it advertised, few refusals (the 429 is published on the root
    scope, so one request per Retry-After goes for the whole workspace);
  - a pool of 3 over 4 tables: never more than 3 writes in service across
    the workspace; places go first come first served across tables, live
    before backfill;
  - pausing the workspace holds every table, resuming releases them in
    arrival order; cancel on the workspace ends the waiters of every table.

Counts and orders only: no wall-clock assertion.  The figures are printed
([figures] lines in the output of tests/test_python.sh)."""

import os
import time

from conftest import (early, expect_line, field, one_at_a_time, spawn,
                      until)

TABLES = 4


def table_url(mock, ws, table):
    return "%s/v1/workspaces/%s/tables/%s/load" % (mock.url, ws, table)


def load_fleet(mock, ws, files, per_table, before_go=None):
    """per_table processes for each of the 4 tables of ws share files; they
    start together (after before_go(), e.g. opening an overload window)
    and all their outputs are returned once they are done."""
    procs = []
    for i in range(TABLES * per_table):
        table = "t%d" % (i % TABLES)
        mine = files[i::TABLES * per_table]
        procs.append(spawn("load", "hotdata:%s/%s" % (ws, table),
                           table_url(mock, ws, table), *mine, stdin=True))
    for p in procs:
        expect_line(p, "ready")
    if before_go is not None:
        before_go()
    start = time.monotonic()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, (out, err)
        outs.append(out)
    return time.monotonic() - start, outs


def read_log(path):
    with open(path) as f:
        return f.read().splitlines()


def test_workspace_429_holds_every_table(t, mock, files, capsys):
    mock.admin("concurrency", {"n": 4})  # the tables themselves never lock
    jobs = files(32)
    took, _ = load_fleet(mock, "ws1", jobs, 4, before_go=lambda: mock.admin(
        "overload", {"workspace": "ws1", "seconds": 3}))
    w = mock.stats()["workspaces"]["ws1"]
    with capsys.disabled():
        print("\n[figures] 16 Python processes, 4 tables of one workspace, "
              "429 for 3 s, Retry-After 1: loaded %d/32, 429 %d, early %d "
              "(race %d), %.2f s" % (w["loads_ok"], w["rate_limited"],
                                     w["early"], w["early_race"], took))
    assert w["loads_ok"] == 32
    assert early(w) == 0  # nothing before the workspace's advertised time
    # one per Retry-After for the whole workspace (3), 2 more, and the
    # first wave: one per table before any process has heard of it
    assert w["rate_limited"] <= 3 + 2 + TABLES - 1
    assert t.info("hotdata:ws1")["publishes"] >= 1  # on the root scope
    assert all(t.info("hotdata:ws1/t%d" % i)["publishes"] == 0
               for i in range(TABLES))


def test_pool_of_3_bounds_the_workspace(t, mock, files, capsys):
    mock.admin("concurrency", {"n": 4})
    t.set_max_parallel("hotdata:ws4", 3)
    for i in range(TABLES):
        t.set_max_parallel("hotdata:ws4/t%d" % i, 8)
    took, _ = load_fleet(mock, "ws4", files(32), 4)
    w = mock.stats()["workspaces"]["ws4"]
    with capsys.disabled():
        print("\n[figures] pool of 3 over 4 tables, 16 Python processes: "
              "loaded %d/32, at most %d in service across the workspace, "
              "429 %d, %.2f s" % (w["loads_ok"], w["max_in_service"],
                                  w["rate_limited"], took))
    assert w["loads_ok"] == 32
    assert w["max_in_service"] <= 3
    assert t.info("hotdata:ws4")["in_flight"] == 0


def queue_holders(t, log, order, ws):
    """Start one `worker.py hold` per (name, table, klass) of order, each
    queued (seen waiting in the segment) before the next starts."""
    procs = []
    waiting = {}
    for name, table, klass in order:
        key = "hotdata:%s/%s" % (ws, table)
        procs.append(spawn("hold", key, name, log, 0.02, klass))
        which = "waiting_" + klass
        waiting[(key, which)] = waiting.get((key, which), 0) + 1
        for (k, f), n in waiting.items():
            until(lambda k=k, f=f, n=n: field(t, k, f) == n,
                  what="%s queued on %s" % (name, k))
    return procs


def finish(procs):
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, (out, err)


def test_pool_live_ahead_of_backfill_and_fifo_across_tables(t, tmp_path):
    ws = "hotdata:ws6"
    t.set_max_parallel(ws, 1)
    holder = t.admit(ws + "/t0")  # the pool's one place, taken
    log = str(tmp_path / "log")
    order = [("bf1", "t1", "backfill"), ("bf2", "t2", "backfill"),
             ("bf0", "t0", "backfill"), ("live3", "t3", "live"),
             ("live1", "t1", "live")]
    procs = queue_holders(t, log, order, "ws6")
    assert not os.path.exists(log)  # the pool held every one of them
    holder.leave()
    finish(procs)
    starts = [line.split()[1] for line in read_log(log)
              if line.startswith("start")]
    # live first (in arrival order), then backfill in arrival order, one
    # at a time whatever table each is for
    assert starts == ["live3", "live1", "bf1", "bf2", "bf0"]
    assert read_log(log) == one_at_a_time(starts)


def test_workspace_pause_holds_every_table_resume_in_arrival_order(
        t, tmp_path):
    ws = "hotdata:ws5"
    t.set_max_parallel(ws, 1)  # one at a time: the order shows
    t.pause(ws)
    log = str(tmp_path / "log")
    order = [("a", "t2", "live"), ("b", "t0", "live"), ("c", "t3", "live"),
             ("d", "t1", "live")]
    procs = queue_holders(t, log, order, "ws5")
    assert not os.path.exists(log)  # paused: no table went
    assert t.beneath(ws)["waiting"] == 4
    t.resume(ws)
    finish(procs)
    assert [line.split()[1] for line in read_log(log)
            if line.startswith("start")] == ["a", "b", "c", "d"]


def test_workspace_pause_holds_loads_to_the_mock(t, mock, files):
    ws = "hotdata:ws7"
    t.pause(ws)
    procs = [spawn("load", "%s/t%d" % (ws, i),
                   table_url(mock, "ws7", "t%d" % i), f, stdin=True)
             for i, f in enumerate(files(TABLES))]
    for p in procs:
        expect_line(p, "ready")
        p.stdin.write("go\n")
        p.stdin.flush()
    until(lambda: t.beneath(ws)["waiting"] == TABLES,
          what="every table's loader waiting")
    assert mock.stats()["workspaces"].get("ws7", {}).get("requests", 0) == 0
    t.resume(ws)
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, (out, err)
    assert mock.stats()["workspaces"]["ws7"]["loads_ok"] == TABLES


def test_workspace_cancel_reaches_waiters_of_every_table(t):
    ws = "hotdata:ws8"
    t.pause(ws)
    procs = []
    for i in range(TABLES):
        procs.append(spawn("admit", "%s/t%d" % (ws, i), stdin=True))
        expect_line(procs[-1], "ready")
    until(lambda: t.beneath(ws)["waiting"] == TABLES,
          what="a waiter on every table")
    t.cancel(ws)
    for p in procs:
        expect_line(p, "canceled")
        p.communicate(timeout=30)
        assert p.returncode == 3
    # counted where each waiter waited: on its table
    assert [t.info("%s/t%d" % (ws, i))["canceled"]
            for i in range(TABLES)] == [1] * TABLES
    t.resume(ws)
    t.admit(ws + "/t0", timeout=5).leave()  # later callers are not affected
