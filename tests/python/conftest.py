# SPDX-License-Identifier: MIT
"""conftest.py — the Python suite's harness: the package and the library
under test, a fresh segment per test, one fixture per mock server, and
one way to start worker processes (tests/python/worker.py).

Run by tests/test_python.sh (make check) with Debian's /usr/bin/python3:
  LIBTHROTTLE_LIBRARY=build/libthrottle.so.1 PYTHONPATH=python \\
      /usr/bin/python3 -m pytest tests/python
B (the build directory) names where throttlectl and examples/loader are.
"""

import itertools
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
sys.path.insert(0, os.path.join(TOP, "python"))

import libthrottle  # noqa: E402

BUILD = os.environ.get("B", "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(TOP, BUILD)
WORKER = os.path.join(TOP, "tests", "python", "worker.py")
_names = itertools.count()


def child_env(**extra):
    """The environment of a child process: this package, this library."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(TOP, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def spawn(*args, stdin=False, **env):
    """A worker process (worker.py COMMAND ARGS...), its output a pipe."""
    return subprocess.Popen(
        [sys.executable, WORKER] + [str(a) for a in args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        env=child_env(**env), text=True)


def spawn_ctl_hold(key, name, log, secs, **env):
    """A C process holding key for secs: `throttlectl run KEY -- sh -c`
    appending "start NAME" and "end NAME" to log (as worker.py hold)."""
    ctl = os.path.join(BUILD, "throttlectl")
    if not os.path.exists(ctl):
        pytest.fail("%s is missing (make)" % ctl)
    script = ('echo "start %s" >> "%s"; sleep %s; echo "end %s" >> "%s"'
              % (name, log, secs, name, log))
    return subprocess.Popen(
        [ctl, "run", key, "--timeout", "60", "--", "sh", "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=child_env(**env))


def one_at_a_time(names):
    """The log of holders that went one at a time, in the order names."""
    return [w for n in names for w in ("start " + n, "end " + n)]


def _call_in_child(adm, name, args, q):
    try:
        getattr(adm, name)(*args)
        q.put("done")
    except libthrottle.EINVAL as e:
        q.put("EINVAL: %s" % e)


def in_fork_child(adm, name, *args):
    """adm.name(*args) in a forked child: "done", or "EINVAL: message"."""
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_call_in_child, args=(adm, name, args, q))
    p.start()
    p.join(60)
    return q.get(timeout=10)


def start_together(procs):
    """Release load workers (worker.py load) once all are ready."""
    for p in procs:
        expect_line(p, "ready")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()  # communicate() closes it


def expect_line(p, prefix, timeout=20):
    """The next line of p's output, which must start with prefix."""
    line = p.stdout.readline().strip()
    assert line.startswith(prefix), (line, p.stderr.read()
                                     if p.poll() is not None else "")
    return line


def until(cond, timeout=20, what="condition"):
    """Poll cond() until true (a state another process reaches)."""
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out waiting for " + what
        time.sleep(0.01)


def field(t, key, name):
    """A field of key's snapshot, 0 while the key has no record yet (a
    waiter that has not reached the segment yet)."""
    try:
        return t.info(key)[name]
    except libthrottle.ENOKEY:
        return 0


@pytest.fixture
def segment(monkeypatch):
    """A segment of the test's own, named in THROTTLE_SEGMENT for the
    test's children, removed afterwards."""
    name = "/tt-%spy-%d-%d" % (os.environ.get("TH_TEST_TAG", ""),
                                os.getpid(), next(_names))
    monkeypatch.setenv("THROTTLE_SEGMENT", name)
    yield name
    try:
        libthrottle.unlink(name)
    except libthrottle.ENOKEY:
        pass


@pytest.fixture
def t(segment):
    with libthrottle.Throttle(segment=segment) as th:
        yield th


def early(st):
    """Requests that reached a table after a not-before could have been
    published (I1).  The mock also counts as early a request that arrived
    within its race window of the refusal that set the time: one admitted
    before the refused process could publish, which I1 allows (a fleet
    with a cap above 1 has such requests in flight)."""
    return st["early"] - st["early_race"]


class Mock:
    """The mock Hotdata server (tests/mock_server.py, or script: another
    dialect of it, such as tests/hotdata_mock.py) in a process."""

    def __init__(self, *options, script="mock_server.py"):
        self.dir = tempfile.mkdtemp(prefix="tt-py-mock-")
        port_file = os.path.join(self.dir, "port")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(TOP, "tests", script),
             "--port", "0", "--port-file", port_file] + list(options))
        until(lambda: os.path.exists(port_file), what="the mock server")
        with open(port_file) as f:
            self.url = "http://127.0.0.1:%d" % int(f.read())

    def admin(self, what, obj=None):
        req = urllib.request.Request(
            "%s/admin/%s" % (self.url, what),
            data=json.dumps(obj or {}).encode(), method="POST")
        return json.load(urllib.request.urlopen(req, timeout=10))

    def stats(self):
        return json.load(urllib.request.urlopen(self.url + "/stats",
                                                timeout=10))

    def load_url(self, table="orders"):
        return "%s/v1/tables/%s/load" % (self.url, table)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def mock_server():
    m = Mock("--service-ms", "20", "--retry-after", "1")
    yield m
    m.stop()


@pytest.fixture
def mock(mock_server):
    """The mock server (20 ms per load, Retry-After: 1), counters zeroed."""
    mock_server.admin("reset")
    return mock_server


@pytest.fixture
def files(tmp_path):
    """make(n): n small files to load, in a directory of their own."""
    def make(n, name="files"):
        d = tmp_path / name
        d.mkdir()
        for i in range(1, n + 1):
            (d / ("part-%02d" % i)).write_text("row %d\n" % i)
        return sorted(str(p) for p in d.iterdir())
    return make


# ---- the PyPI suite ----------------------------------------------------------
# tests/python/test_pypi_*.py need packages from PyPI (httpx, aiohttp,
# urllib3 2, tenacity, mypy, pip's build isolation): tests/test_python.sh
# runs them with the venv's python (tools/venv.sh, python/requirements-*.txt)
# and LIBTHROTTLE_PYPI=1; the run with Debian's python3 skips them.
IN_PYPI_VENV = os.environ.get("LIBTHROTTLE_PYPI") == "1"


def pypi_only():
    """Skip the calling module unless it runs in the PyPI venv."""
    if not IN_PYPI_VENV:
        pytest.skip("needs the PyPI venv: run by tests/test_python.sh with "
                    "tools/venv.sh's python", allow_module_level=True)
