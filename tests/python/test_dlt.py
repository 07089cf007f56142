# SPDX-License-Identifier: MIT
"""test_dlt.py — libthrottle.dlt with real dlt against the mock server:

  - a pipeline through libthrottle.dlt.destination() with LOAD__WORKERS=8
    loads every batch of one table, none early;
  - a locked table is dlt's DestinationTransientException (dlt's own
    class) and the back-off is published; not admitted in time is too;
  - a permanent answer is DestinationTerminalException, and a pipeline
    whose table answers it ends with the job failed, sent once;
  - write_batch_retrying's GaveUp is transient;
  - two pipeline processes writing one table share the gate.

Run by tests/test_dlt.sh with the dlt venv; skipped where dlt is not
installed."""

import subprocess
import sys

import pytest

pytest.importorskip("dlt", reason="dlt is not installed here "
                    "(tests/test_dlt.sh runs this in its venv)")

from dlt.common.destination.exceptions import (  # noqa: E402
    DestinationTerminalException, DestinationTransientException)

import libthrottle.dlt as ld  # noqa: E402
from conftest import child_env, early  # noqa: E402

ROWS = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]

PIPELINE = r"""
import os, sys, dlt, libthrottle.dlt as ld
url, table, name, n, d = sys.argv[1:6]
# "-": the URL from dlt's configuration (DESTINATION__THROTTLED__API_URL)
dest = ld.destination(api_url=None if url == "-" else url, batch_size=5)
p = dlt.pipeline(name, destination=dest, pipelines_dir=os.path.join(d, "p"))
info = p.run([{"id": i, "who": name} for i in range(int(n))],
             table_name=table)
jobs = [j for pkg in info.load_packages for j in pkg.jobs["failed_jobs"]]
print("failed", len(jobs))
"""


def run_pipeline(tmp_path, mock, name, rows, url=None, **env):
    d = tmp_path / name
    d.mkdir()
    return subprocess.Popen(
        [sys.executable, "-c", PIPELINE, url or mock.url, "orders", name,
         str(rows),
         str(d)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=child_env(DLT_DATA_DIR=str(d / "data"), LOAD__WORKERS="8",
                      RUNTIME__DLTHUB_TELEMETRY="false",
                      DATA_WRITER__FILE_MAX_ITEMS="5", **env),
        cwd=str(d))


def test_dlt_exceptions_are_dlts():
    assert ld.DestinationTransientException is DestinationTransientException
    assert ld.DestinationTerminalException is DestinationTerminalException


def test_dlt_write_batch_lock_is_transient_and_published(t, mock):
    assert ld.write_batch(ROWS, "orders", mock.url, t=t).kind == "ok"
    mock.admin("hold", {"table": "orders", "ms": 60000})
    with pytest.raises(DestinationTransientException, match="locked"):
        ld.write_batch(ROWS, "orders", mock.url, t=t)
    assert t.remaining(ld.key_of(mock.url, "orders")) > 0
    with pytest.raises(DestinationTransientException,
                       match="not admitted"):
        ld.write_batch(ROWS, "orders", mock.url, timeout=0.2, t=t)
    assert mock.stats()["tables"]["orders"]["refused"] == 1


def test_dlt_write_batch_permanent_is_terminal(t, mock):
    with pytest.raises(DestinationTerminalException, match="not retried"):
        ld.write_batch(ROWS, "no/such", mock.url, t=t)
    with pytest.raises(DestinationTerminalException):
        ld.write_batch_retrying(ROWS, "no/such", mock.url, t=t)


def test_dlt_write_batch_retrying_gave_up_is_transient(t, mock):
    mock.admin("hold", {"table": "orders", "ms": 60000})
    with pytest.raises(DestinationTransientException, match="retry after"):
        ld.write_batch_retrying(ROWS, "orders", mock.url, retries=1,
                                timeout=3, t=t)
    assert early(mock.stats()) == 0


def test_dlt_destination_rejects_a_bad_class():
    with pytest.raises(ValueError):
        ld.destination(api_url="http://x", klass="urgent")


def test_dlt_pipeline_loads_every_batch(mock, segment, tmp_path):
    p = run_pipeline(tmp_path, mock, "one", 100)
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0 and "failed 0" in out, err[-3000:]
    st = mock.stats()
    assert st["tables"]["orders"]["loads_ok"] == 20  # 100 rows, 5 a batch
    assert early(st) == 0


def test_dlt_pipeline_url_from_dlt_config(mock, segment, tmp_path):
    p = run_pipeline(tmp_path, mock, "conf", 10, url="-",
                     DESTINATION__THROTTLED__API_URL=mock.url)
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0 and "failed 0" in out, err[-3000:]
    assert mock.stats()["tables"]["orders"]["loads_ok"] == 2


def test_dlt_pipeline_permanent_answer_fails_the_job(mock, t, tmp_path):
    # a base URL the API does not know: 404, permanent
    p = run_pipeline(tmp_path, mock, "perm", 5, url=mock.url + "/nope")
    out, err = p.communicate(timeout=240)
    # dlt raises on a terminal job (the pipeline fails), having sent the
    # batch once
    assert p.returncode != 0 and "DestinationTerminalException" in err
    info = t.info(ld.key_of(mock.url, "orders"))
    assert (info["admitted"], info["permanent"]) == (1, 1)


def test_dlt_two_pipelines_share_one_table(mock, segment, tmp_path):
    mock.admin("hold", {"table": "orders", "ms": 1500})
    ps = [run_pipeline(tmp_path, mock, n, 60) for n in ("p1", "p2")]
    for p in ps:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0 and "failed 0" in out, err[-3000:]
    st = mock.stats()
    assert st["tables"]["orders"]["loads_ok"] == 24 and early(st) == 0
