#!/bin/sh
# SPDX-License-Identifier: MIT
# test_redis_lean.sh — the lean path of the enter and leave scripts
# (common.lua lean_enter, lean_leave) makes exactly the writes and the
# reply the whole script makes, on a throw-away redis-server: 8,000 random
# states and calls, each made through both at the same instant of a clock
# the test sets, everything stored afterwards compared (tests/redis_lean.py;
# it fails too when the corpus does not take the lean path often and miss
# it often).  Runs the system interpreter (/usr/bin/python3, standard
# library only) when there is one.  Skipped without redis-server.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/tests/redis_lib.sh"
redis_skip_unless_installed
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'redis_stop; rm -rf "$tmp"' EXIT
redis_start "$tmp/redis" || { echo "FAIL redis-server did not start"; exit 1; }
"$PY" "$top/tests/redis_lean.py" "$REDIS_SOCK" "$top/libthrottle/redis" 8000
