# SPDX-License-Identifier: MIT
# mock_lib.sh — sourced by shell tests and benchmarks that need the mock
# API: start tests/mock_server.py on a free port and wait until it listens.
#
#   . tests/mock_lib.sh
#   mock_start TESTS_DIR TMPDIR [mock options...] || exit 1
#
# Sets srv (the server's pid) and U (its base URL, http://127.0.0.1:PORT).
# Returns 1 if the server exited or did not listen within 10 s.  The caller
# stops it (kill "$srv", POST /admin/shutdown).

mock_start() { # tests-dir tmp-dir mock-options...
  _mock_py=$1/mock_server.py _mock_port=$2/port
  shift 2
  rm -f "$_mock_port"
  python3 "$_mock_py" --port 0 --port-file "$_mock_port" "$@" &
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
