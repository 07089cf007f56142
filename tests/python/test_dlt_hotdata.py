# SPDX-License-Identifier: MIT
"""test_dlt_hotdata.py — real dlt pipelines loading through the real
hotdata-dlt-destination (from PyPI, unmodified) into the Hotdata mock
(tests/hotdata_mock.py), shared through `python -m libthrottle.run`:

  - 200 load jobs into one table with LOAD__WORKERS=8: every job
    completes, no request is early, one refusal per lock episode;
  - surface mode returns the 409 to the destination (which publishes
    it through the gate) and leaves retrying to the destination's own
    loop, whose next tries wait at admission: none early;
  - a live pipeline and a backfill one in two processes on one table:
    with the key paused, eight backfill jobs queue first and one live
    job after them; on resume the live job goes first;
  - two pipelines loading two tables of one database, which the API
    locks as one: the preset's pool keeps them from refusing each other;
  - two pipelines on two simulated hosts (a segment each) sharing one
    Redis: as one host, no early request, one refusal per episode.

Run by tests/test_dlt.sh with the dlt venv (tools/venv.sh); skipped where
dlt is not installed.  Figures (plain vs libthrottle, makespans, the live
jobs' latency) are bench/dlt_bench.py's, not asserted here."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("dlt", reason="dlt is not installed here "
                    "(tests/test_dlt.sh runs this in its venv)")
pytest.importorskip("hotdata_dlt_destination")

import libthrottle  # noqa: E402
from conftest import TOP, Mock, child_env, early, field, until  # noqa: E402
from test_redis import redis  # noqa: E402,F401  (the fixture)
from dlt_pipeline import declared  # noqa: E402

PIPELINE = os.path.join(TOP, "tests", "python", "dlt_pipeline.py")
KEY = "hotdata:ws1/conn_db1/orders"  # the preset's: workspace/database/table


def hotdata_mock(*options):
    """The Hotdata mock with database db1, its tables declared (as after
    a first run: two first runs at once race to declare them)."""
    decl = [a for t in declared() for a in ("--declare", t)]
    return Mock("--database", "db1", *decl, *options,
                script="hotdata_mock.py")


@pytest.fixture(scope="module")
def hd_server():
    m = hotdata_mock("--service-ms", "20", "--retry-after", "2")
    yield m
    m.stop()


@pytest.fixture
def hd(hd_server):
    hd_server.admin("reset")
    return hd_server


def start(mock, tmp_path, name, *args, rules=None, **env):
    """A pipeline process (dlt_pipeline.py), under libthrottle.run when
    rules are given."""
    d = tmp_path / name
    d.mkdir()
    cmd = [sys.executable, PIPELINE, "--url", mock.url, "--database", "db1",
           "--name", name, "--dir", str(d)] + [str(a) for a in args]
    if rules:
        cmd = [sys.executable, "-m", "libthrottle.run"] + \
            [a for r in rules for a in ("--rule", r)] + ["--"] + cmd
    return subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=child_env(**env), cwd=str(d))


def result(p, timeout=240):
    out, err = p.communicate(timeout=timeout)
    lines = out.strip().splitlines()
    assert lines, "no result: exit %s\n%s" % (p.returncode, err[-3000:])
    r = json.loads(lines[-1])
    r["stderr"] = err
    return r


def orders(mock):
    return mock.stats()["tables"]["ws1/orders"]


def test_dlt_hotdata_workers8_one_table(hd, segment, tmp_path):
    r = result(start(hd, tmp_path, "w8", "--jobs", 200, "--workers", 8,
                     rules=["hotdata"]))
    assert r["error"] is None, r["stderr"][-3000:]
    assert (r["jobs"], r["completed"], r["failed"]) == (200, 200, 0)
    st = hd.stats()
    o = orders(hd)
    assert o["loads_ok"] == 200
    assert early(st) == 0
    # the first jobs start together before any answer came back: at most
    # that first lock episode is refused more than once
    assert o["refused"] <= 2, o
    assert st["hotdata"]["unknown"] == 0


def test_dlt_hotdata_surface_leaves_retry_to_the_destination(
        hd, t, tmp_path):
    held = {"table": "orders", "workspace": "ws1"}
    hd.admin("hold", dict(held, ms=600000))
    p = start(hd, tmp_path, "surf", "--jobs", 16, "--workers", 8,
              rules=["hotdata surface"], HOTDATA_RETRY_BACKOFF_SECONDS="0.1")
    # the destination saw the 409 itself and published it; then the table
    # is free again and its own retries (at admission) get in
    until(lambda: field(t, KEY, "locked") >= 1, timeout=180,
          what="a refused load")
    hd.admin("release", held)
    r = result(p)
    assert r["error"] is None, r["stderr"][-3000:]
    assert (r["completed"], r["failed"]) == (16, 0)
    st = hd.stats()
    assert early(st) == 0 and orders(hd)["refused"] >= 1


def test_dlt_hotdata_live_goes_ahead_of_backfill(segment, tmp_path):
    m = hotdata_mock("--service-ms", "600", "--retry-after", "1")
    t = libthrottle.Throttle(segment=segment)
    procs = []
    try:
        t.pause(KEY)
        bf = start(m, tmp_path, "backfill", "--jobs", 16, "--workers", 8,
                   rules=["hotdata class=backfill"])
        procs.append(bf)
        until(lambda: t.info(KEY)["waiting_backfill"] == 8, timeout=180,
              what="eight backfill jobs queued")
        live = start(m, tmp_path, "live", "--jobs", 1, "--workers", 1,
                     rules=["hotdata"])
        procs.append(live)
        until(lambda: t.info(KEY)["waiting_live"] == 1, timeout=180,
              what="the live job queued behind them")
        t.resume(KEY)
        rl = result(live)
        # the live job was admitted first: only the backfill loads that
        # ran while it finished its bookkeeping came before its exit, far
        # fewer than the eight queued ahead of it
        done_before = orders(m)["loads_ok"]
        rb = result(bf)
        assert rl["error"] is None and rl["completed"] == 1, rl["stderr"]
        assert rb["error"] is None, rb["stderr"][-3000:]
        assert (rb["completed"], rb["failed"]) == (16, 0)
        assert done_before <= 5, done_before
        assert orders(m)["loads_ok"] == 17 and early(m.stats()) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        t.close()
        m.stop()


def test_dlt_hotdata_database_lock_is_shared_by_its_tables(segment,
                                                           tmp_path):
    # the API locks a database's loads together: two pipelines loading
    # two tables of one database share its pool, none refused
    m = hotdata_mock("--service-ms", "20", "--retry-after", "2",
                     "--catalog-lock", "--declare", "public.items")
    try:
        ps = [start(m, tmp_path, name, "--table", table, "--jobs", 40,
                    "--workers", 8, rules=["hotdata"])
              for name, table in (("a", "orders"), ("b", "items"))]
        for p in ps:
            r = result(p)
            assert r["error"] is None, r["stderr"][-3000:]
            assert (r["completed"], r["failed"]) == (40, 0)
        st = m.stats()
        db = st["tables"]["ws1/conn_db1"]
        assert db["loads_ok"] >= 80 and db["max_in_service"] == 1
        assert db["refused"] == 0 and early(st) == 0
    finally:
        m.stop()


def test_dlt_hotdata_two_hosts_share_redis(hd, redis, tmp_path):  # noqa: F811
    names = ["/tt-dlt-redis-%d-%s" % (os.getpid(), h) for h in ("a", "b")]
    try:
        ps = [start(hd, tmp_path, "host" + h, "--jobs", 60, "--workers", 8,
                    rules=["hotdata"], THROTTLE_BACKEND=redis,
                    THROTTLE_SEGMENT=n)
              for h, n in zip("ab", names)]
        rs = [result(p) for p in ps]
        for r in rs:
            assert r["error"] is None, r["stderr"][-3000:]
            assert (r["completed"], r["failed"]) == (60, 0)
        st = hd.stats()
        assert orders(hd)["loads_ok"] == 120 and early(st) == 0
        assert orders(hd)["refused"] <= 3, orders(hd)
    finally:
        for n in names:
            try:
                libthrottle.unlink(n)
            except libthrottle.ENOKEY:
                pass
