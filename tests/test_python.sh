#!/bin/sh
# SPDX-License-Identifier: MIT
# test_python.sh — the Python package: its pytest suite (tests/python) run
# by Debian's /usr/bin/python3 (which sees python3-pytest and
# python3-requests); then the PyPI suite (tests/python/test_pypi_*.py:
# pip install and wheel, mypy --strict, httpx, aiohttp, urllib3, tenacity,
# requests from PyPI) run by the venv's python that tools/venv.sh makes
# from python/requirements-*.txt (skipped, saying so, only when PyPI
# cannot be reached); then an import-and-use test with whatever python3 is
# first on PATH, from another directory, standard library only.
# Run from the top of the tree; B names the build directory.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
case "$B" in /*) ;; *) B="$top/$B" ;; esac
PY=${PYTEST_PYTHON:-/usr/bin/python3}
lib="$B/libthrottle.so.1"
export B LIBTHROTTLE_LIBRARY="$lib" PYTHONDONTWRITEBYTECODE=1

[ -f "$lib" ] || { echo "FAIL $lib is missing (make)"; exit 1; }
if ! "$PY" -c 'import pytest' 2>/dev/null; then
  echo "FAIL $PY cannot import pytest: install python3-pytest (make deps)"
  exit 1
fi

fails=0
PYTHONPATH="$top/python" "$PY" -m pytest -q -rs -p no:cacheprovider \
  "$top/tests/python" || fails=$((fails + 1))

# The PyPI suite, in the venv (tools/venv.sh reuses it while the
# requirement files are unchanged).
venv_py=$(B="$B" sh "$top/tools/venv.sh")
rc=$?
if [ "$rc" -eq 3 ]; then
  echo "SKIP the PyPI suite (tests/python/test_pypi_*.py): PyPI is not reachable"
elif [ "$rc" -ne 0 ] || [ -z "$venv_py" ]; then
  echo "FAIL tools/venv.sh exited $rc: no venv for the PyPI suite"
  fails=$((fails + 1))
else
  echo "PyPI suite with $venv_py"
  LIBTHROTTLE_PYPI=1 PYTHONPATH="$top/python" "$venv_py" -m pytest -q -rs \
    -p no:cacheprovider "$top"/tests/python/test_pypi_*.py ||
    fails=$((fails + 1))
fi

# The python3 first on PATH may be a separately installed interpreter that
# does not see Debian's python3-* packages: the package must still import
# and work with the standard library alone.
first=$(command -v python3)
seg="/tt-${TH_TEST_TAG:-}py-import-$$"
if (cd / && PYTHONPATH="$top/python" THROTTLE_SEGMENT="$seg" python3 -c '
import sys, libthrottle as L
t = L.Throttle()
t.backoff("k", 5)
assert 4 < t.remaining("k") <= 5 and t.shared
assert L.classify(409, b"{\"error\": {\"code\": \"RESOURCE_LOCKED\"}}") == "locked"
t.close()
L.unlink()
print("import ok:", sys.executable, sys.version.split()[0], L.version())
'); then
  echo "ok   import with $first"
else
  echo "FAIL import with $first"
  fails=$((fails + 1))
  rm -f "/dev/shm$seg"
fi

[ "$fails" -eq 0 ] && echo "python: all checks passed"
[ "$fails" -eq 0 ]
