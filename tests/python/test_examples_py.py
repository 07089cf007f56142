# SPDX-License-Identifier: MIT
"""test_examples_py.py — examples/loader.py (a process pool loading a
directory) and examples/dlt_destination.py (its write functions and the
exceptions dlt retries on, skipped where dlt is not installed: the dlt
suite, tests/test_dlt.sh, runs them in its venv) against the mock
server."""

import importlib.util
import os
import subprocess
import sys

import pytest

import libthrottle
from conftest import TOP, child_env, early

LOADER = os.path.join(TOP, "examples", "loader.py")


def run_loader(mock, directory, *opts, table="orders"):
    return subprocess.run(
        [sys.executable, LOADER] + list(opts) + [mock.url, table, directory],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=child_env(), timeout=300)


def test_loader_py_loads_a_directory(mock, segment, files):
    paths = files(24)
    out = run_loader(mock, os.path.dirname(paths[0]), "--processes", "8")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(": ok (HTTP 200)") == 24
    assert "loader: 24 of 24 files loaded, 0 failed, 0 to retry later" \
        in out.stdout
    st = mock.stats()
    assert st["loads_ok"] == 24 and early(st) == 0 and st["refused"] <= 3


def test_loader_py_exit_codes(mock, segment, files):
    paths = files(1)
    d = os.path.dirname(paths[0])
    out = run_loader(mock, d, table="no/such")
    assert out.returncode == 1 and "permanent (HTTP 404 NOT_FOUND)" \
        in out.stdout
    mock.admin("hold", {"table": "held", "ms": 60000})
    out = run_loader(mock, d, "--timeout", "2", table="held")
    assert out.returncode == 75
    assert "gave up (HTTP 409 RESOURCE_LOCKED" in out.stdout
    assert mock.stats()["early"] == 0


@pytest.fixture
def dltdest():
    pytest.importorskip("dlt", reason="dlt is not installed here "
                        "(tests/test_dlt.sh runs these in its venv)")
    spec = importlib.util.spec_from_file_location(
        "dlt_destination", os.path.join(TOP, "examples", "dlt_destination.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ROWS = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]


def test_dlt_destination_writes_a_batch(dltdest, t, mock):
    out = dltdest.write_batch(ROWS, "orders", mock.url, t=t)
    assert out.kind == "ok"
    assert mock.stats()["loads_ok"] == 1
    assert t.info("hotdata:127.0.0.1/orders")["admitted"] == 1


def test_dlt_destination_lock_is_transient_and_published(dltdest, t, mock):
    mock.admin("hold", {"table": "orders", "ms": 60000})
    with pytest.raises(dltdest.DestinationTransientException):
        dltdest.write_batch(ROWS, "orders", mock.url, t=t)
    assert t.remaining("hotdata:127.0.0.1/orders") > 0  # for every process
    # the next try is not sent before the published time: not admitted
    with pytest.raises(dltdest.DestinationTransientException,
                       match="not admitted"):
        dltdest.write_batch(ROWS, "orders", mock.url, timeout=0.2, t=t)
    assert mock.stats()["requests"] == 1


def test_dlt_destination_conflict_is_terminal(dltdest, t, mock):
    with pytest.raises(dltdest.DestinationTerminalException):
        dltdest.write_batch(ROWS, "no/such", mock.url, t=t)


def test_dlt_destination_gave_up_is_transient(dltdest, t, mock):
    mock.admin("hold", {"table": "orders", "ms": 60000})
    with pytest.raises(dltdest.DestinationTransientException) as e:
        dltdest.write_batch_retrying(ROWS, "orders", mock.url, retries=1,
                                     t=t)
    assert isinstance(e.value.__cause__, libthrottle.GaveUp)
    assert mock.stats()["early"] == 0
