#!/bin/sh
# SPDX-License-Identifier: MIT
# test_e2e_http.sh — end to end with real processes: `throttlectl http`
# against the mock Hotdata server.
#   - eight processes loading one table finish every file, none early, at
#     most 3 refused;
#   - a CONFLICT is sent once and exits 1;
#   - an external hold makes them all wait; they complete after it with
#     about one refused request per Retry-After;
#   - with no usable segment they still complete (fail open), exit 0 and
#     say so on stderr.
# Skipped, saying so, when this build's throttlectl has no `http` command.
# Needs python3.  Run from the top of the tree; B names the build directory.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
case "$B" in /*) ;; *) B="$top/$B" ;; esac
ctl="$B/throttlectl"

if ! "$ctl" http --help >/dev/null 2>&1; then
  echo "SKIP test_e2e_http: this build's throttlectl has no 'http' command"
  exit 0
fi

tmp=$(mktemp -d)
srv=""
pids=""
seg_name="tt-${TH_TEST_TAG:-}e2e-$$"
bad_name="tt-${TH_TEST_TAG:-}e2e-bad-$$"
export THROTTLE_SEGMENT="/$seg_name"
. "$top/tests/check_lib.sh"
. "$top/tests/mock_lib.sh"
cleanup() {
  for p in $pids; do kill "$p" 2>/dev/null; done
  mock_stop
  "$ctl" rm >/dev/null 2>&1
  rm -f "/dev/shm/$seg_name" "/dev/shm/$bad_name"
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mock_rows "$tmp/files" 24

# One worker: `throttlectl http` for each of its files in turn; exits
# with the first failing status.
worker() { # out-prefix files...
  out=$1
  shift
  rc=0
  for f in "$@"; do
    "$ctl" http "$KEY" -X POST --data-binary "@$f" -o /dev/null \
      "$U/v1/tables/orders/load" 2>>"$out.err"
    r=$?
    echo "$r" >>"$out.rc"
    [ $r -ne 0 ] && [ $rc -eq 0 ] && rc=$r
  done
  return $rc
}
# Start n workers, each with `per` files from the pool, and wait for them
# all; $bad is then how many exited non-zero.
fleet() { # name n per
  pids=""
  w=0
  while [ $w -lt "$2" ]; do
    files=""
    k=1
    while [ $k -le "$3" ]; do
      files="$files $tmp/files/part-$(printf %02d $((w * $3 + k)))"
      k=$((k + 1))
    done
    # shellcheck disable=SC2086
    worker "$tmp/$1.$w" $files &
    pids="$pids $!"
    w=$((w + 1))
  done
  bad=0
  for p in $pids; do wait "$p" || bad=$((bad + 1)); done
  pids=""
}

mock_start "$top/tests" "$tmp" --service-ms 20 --retry-after 1 ||
  { echo "FAIL the mock server did not start"; exit 1; }
KEY="hotdata:127.0.0.1/orders"

# ---- eight processes, one table ------------------------------------------------
fleet fleet 8 3
check "8 x 3 loads: every process exits 0" 0 "$bad"
check "8 x 3 loads: loads_ok" 24 "$(mock_stat loads_ok)"
check "8 x 3 loads: early" 0 "$(mock_stat early)"
check_le "8 x 3 loads: refused" 3 "$(mock_stat refused)"

# ---- a CONFLICT is sent once ------------------------------------------------------
mock_admin reset '{}'
"$ctl" http "$KEY" -X POST -d '{"name": "orders"}' -o /dev/null "$U/v1/tables" \
  2>"$tmp/create.err"
check "create: exit 0" 0 $?
"$ctl" http "$KEY" -X POST -d '{"name": "orders"}' -o /dev/null "$U/v1/tables" \
  2>"$tmp/conflict.err"
check "CONFLICT: exit 1" 1 $?
check "CONFLICT: answered once" 1 "$(mock_stat conflicts)"
check "CONFLICT: sent once (2 requests in all)" 2 "$(mock_stat requests)"
check "CONFLICT: nothing published" "-" \
  "$("$ctl" show "$KEY" --json | "$PY" -c 'import json, sys
d = json.load(sys.stdin); print("-" if d["remaining_ms"] == 0 else d["remaining_ms"])')"

# ---- an external hold ----------------------------------------------------------------
HOLD_MS=3000
mock_admin reset '{}'
mock_admin hold "{\"table\": \"orders\", \"ms\": $HOLD_MS}"
fleet hold 8 1
check "hold: every process exits 0" 0 "$bad"
check "hold: loads_ok" 8 "$(mock_stat loads_ok)"
check "hold: early" 0 "$(mock_stat early)"
# about one refusal per Retry-After (1 s) of the hold, not one per process
check_le "hold: refused" $((HOLD_MS / 1000 + 3)) "$(mock_stat refused)"

# ---- no usable segment: fail open ----------------------------------------------------
mock_admin reset '{}'
head -c 8192 /dev/zero | tr '\0' 'x' >"/dev/shm/$bad_name"
chmod 0600 "/dev/shm/$bad_name"
THROTTLE_SEGMENT="/$bad_name"
export THROTTLE_SEGMENT
fleet bad 4 1
check "unusable segment: every process exits 0" 0 "$bad"
check "unusable segment: loads_ok" 4 "$(mock_stat loads_ok)"
warned=0
for w in 0 1 2 3; do
  grep "warning" "$tmp/bad.$w.err" 2>/dev/null | grep -q "$bad_name" &&
    warned=$((warned + 1))
done
check "unusable segment: each process warns, naming it" 4 "$warned"
[ "$warned" -eq 4 ] || cat "$tmp"/bad.*.err
check "unusable segment: left as it was" 8192 "$(wc -c <"/dev/shm/$bad_name")"
THROTTLE_SEGMENT="/$seg_name"

[ "$fails" -eq 0 ] && echo "e2e http: all checks passed"
[ "$fails" -eq 0 ]
