#!/bin/sh
# SPDX-License-Identifier: MIT
# test_dlt.sh — the dlt suite: real dlt and the real hotdata-dlt-destination
# (pinned in python/requirements-dlt.txt, installed by tools/venv.sh into
# $B/venv) against the mock servers: libthrottle.dlt (tests/python/test_dlt.py,
# with examples/dlt_destination.py's functions), libthrottle.instrument and
# python -m libthrottle.run (test_dlt_instrument.py), and whole pipelines
# through the unmodified destination (test_dlt_hotdata.py).  Skipped, saying
# so, only when PyPI cannot be reached to make the venv.
# Run from the top of the tree; B names the build directory.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
case "$B" in /*) ;; *) B="$top/$B" ;; esac
lib="$B/libthrottle.so.1"
[ -f "$lib" ] || { echo "FAIL $lib is missing (make)"; exit 1; }

py=$(B="$B" sh "$top/tools/venv.sh")
rc=$?
if [ "$rc" -eq 3 ]; then
  echo "SKIP: PyPI is not reachable, so dlt cannot be installed (tools/venv.sh)"
  exit 0
fi
[ "$rc" -eq 0 ] || { echo "FAIL tools/venv.sh exited $rc"; exit 1; }

export B LIBTHROTTLE_LIBRARY="$lib" PYTHONPATH="$top/python" \
  PYTHONDONTWRITEBYTECODE=1 RUNTIME__DLTHUB_TELEMETRY=false
cd "$top" || exit 1
"$py" -m pytest -q -rs -p no:cacheprovider \
  tests/python/test_dlt.py tests/python/test_dlt_instrument.py \
  tests/python/test_dlt_hotdata.py tests/python/test_examples_py.py
