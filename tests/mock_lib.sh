# SPDX-License-Identifier: MIT
# mock_lib.sh — sourced by shell tests and benchmarks that need a test
# server: tests/mock_server.py (the mock Hotdata API) or
# tests/scenario_server.py, started on a free port, and the mock's admin
# routes and counters.
#
#   . tests/mock_lib.sh
#   mock_start TESTS_DIR TMPDIR [mock options...] || exit 1
#   mock_start_script SCRIPT TMPDIR [options...] || exit 1
#                          any server that takes --port 0 --port-file FILE
#   mock_admin WHAT JSON   POST JSON to $U/admin/WHAT (fails on an error)
#   mock_stat EXPR         print a Python expression over the members of
#                          $U/stats (mock_stat early, mock_stat
#                          'tables["t"]["refused"]')
#   mock_stop              stop the server (SIGTERM) and wait for it
#   mock_rows DIR N        DIR/part-01 ... DIR/part-N, one row each: files
#                          to load
#
# The start functions set srv (the server's pid) and U (its base URL,
# http://127.0.0.1:PORT) and return 1 if the server exited or did not
# listen within 10 s.  Servers and helpers run with $PY (tests/check_lib.sh
# sets it to the system interpreter), python3 when it is not set.

mock_start() { # tests-dir tmp-dir mock-options...
  _mock_py=$1/mock_server.py
  shift
  mock_start_script "$_mock_py" "$@"
}

mock_start_script() { # script tmp-dir options...
  _mock_py=$1 _mock_port=$2/port
  shift 2
  rm -f "$_mock_port"
  "${PY:-python3}" "$_mock_py" --port 0 --port-file "$_mock_port" "$@" &
  srv=$!
  _mock_i=0
  while [ ! -s "$_mock_port" ]; do
    _mock_i=$((_mock_i + 1))
    if [ $_mock_i -gt 200 ] || ! kill -0 "$srv" 2>/dev/null; then
      return 1
    fi
    sleep 0.05
  done
  # shellcheck disable=SC2034 # for the caller
  U="http://127.0.0.1:$(cat "$_mock_port")"
}

mock_admin() { # what json
  "${PY:-python3}" -c 'import sys, urllib.request as u
u.urlopen(u.Request(sys.argv[1], data=sys.argv[2].encode(), method="POST"), timeout=10).read()' \
    "$U/admin/$1" "$2"
}

# The members are the expression's globals, so that a generator in it
# sees them too.
mock_stat() { # expression
  "${PY:-python3}" -c 'import json, sys, urllib.request as u
d = json.load(u.urlopen(sys.argv[1], timeout=10))
print(eval(sys.argv[2], d))' "$U/stats" "$1"
}

mock_stop() {
  [ -n "${srv:-}" ] || return 0
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  srv=""
}

mock_rows() { # dir n
  mkdir -p "$1"
  _mock_i=1
  while [ $_mock_i -le "$2" ]; do
    printf 'row %d\n' $_mock_i >"$1/part-$(printf %02d $_mock_i)"
    _mock_i=$((_mock_i + 1))
  done
}
