#!/bin/sh
# SPDX-License-Identifier: MIT
# test_examples.sh — the programs in examples/ do their job against the
# mock Hotdata server: eight examples/loader processes load every file of
# one table with no early request and few refusals, the loader's exit
# codes (0 / 1 / 75) and its fail-open warning, and examples/backfill.sh
# loads a directory through `throttlectl http` (skipped, saying so, when
# this build's throttlectl has no `http` command).
# Needs python3.  Run from the top of the tree; B names the build directory.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
case "$B" in /*) ;; *) B="$top/$B" ;; esac
loader="$B/examples/loader"
tmp=$(mktemp -d)
srv=""
export THROTTLE_SEGMENT="/tt-${TH_TEST_TAG:-}examples-$$"
. "$top/tests/check_lib.sh"
. "$top/tests/mock_lib.sh"
cleanup() {
  mock_stop
  "$B/throttlectl" rm >/dev/null 2>&1
  rm -f "/dev/shm/tt-${TH_TEST_TAG:-}examples-$$" "/dev/shm/tt-${TH_TEST_TAG:-}examples-bad-$$"
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

[ -x "$loader" ] || { echo "FAIL $loader is missing (make examples)"; exit 1; }

mock_rows "$tmp/files" 24
files_of() { # worker index 0..7: its three files
  echo "$tmp/files/part-$(printf %02d $(($1 * 3 + 1)))" \
       "$tmp/files/part-$(printf %02d $(($1 * 3 + 2)))" \
       "$tmp/files/part-$(printf %02d $(($1 * 3 + 3)))"
}

mock_start "$top/tests" "$tmp" --service-ms 20 --retry-after 1 ||
  { echo "FAIL the mock server did not start"; exit 1; }

# ---- eight loaders, one table -------------------------------------------------
pids=""
for w in 0 1 2 3 4 5 6 7; do
  # shellcheck disable=SC2046
  "$loader" "$U" orders $(files_of $w) >"$tmp/loader.$w" 2>&1 &
  pids="$pids $!"
done
bad=0
for p in $pids; do wait "$p" || bad=$((bad + 1)); done
check "8 loaders: every process exits 0" 0 "$bad"
check "8 loaders: 24 lines 'ok'" 24 "$(cat "$tmp"/loader.? | grep -c ': ok (HTTP 200')"
check "8 loaders: loads_ok" 24 "$(mock_stat loads_ok)"
check "8 loaders: early" 0 "$(mock_stat early)"
check_le "8 loaders: refused" 3 "$(mock_stat refused)"
# the key, and its workspace: the scope its 429s and 503s go to
check "8 loaders: one key and its scope in the segment" \
  "hotdata:127.0.0.1 hotdata:127.0.0.1/orders" \
  "$("$B/throttlectl" ls --json | "$PY" -c 'import json, sys
print(" ".join(k["key"] for k in json.load(sys.stdin)["keys"]))')"

# ---- exit codes ---------------------------------------------------------------------
mock_admin reset '{}'
"$loader" "$U" orders "$tmp/nonexistent" >"$tmp/out" 2>&1
check "unreadable file: exit 1" 1 $?
check "unreadable file: says so" 1 "$(grep -c 'nonexistent: cannot read' "$tmp/out")"

"$loader" "$U" 'no/such' "$tmp/files/part-01" >"$tmp/out" 2>&1
check "404 is permanent: exit 1" 1 $?
check "404 is permanent: line" 1 "$(grep -c 'permanent (HTTP 404 NOT_FOUND' "$tmp/out")"

mock_admin reset '{}'
mock_admin hold '{"table": "held", "ms": 60000}'
"$loader" --timeout 2 "$U" held "$tmp/files/part-01" >"$tmp/out" 2>&1
check "held past the timeout: exit 75" 75 $?
check "held past the timeout: line" 1 "$(grep -c 'gave up (HTTP 409 RESOURCE_LOCKED' "$tmp/out")"
check "held past the timeout: early" 0 "$(mock_stat early)"

# ---- fail open: a segment that is not one ------------------------------------------
mock_admin reset '{}'
bad_seg="/dev/shm/tt-${TH_TEST_TAG:-}examples-bad-$$"
head -c 8192 /dev/zero | tr '\0' 'x' >"$bad_seg"
chmod 0600 "$bad_seg"
THROTTLE_SEGMENT="/tt-${TH_TEST_TAG:-}examples-bad-$$" "$loader" "$U" orders "$tmp/files/part-01" \
  >"$tmp/out" 2>"$tmp/err"
check "unusable segment: exit 0" 0 $?
check "unusable segment: loaded" 1 "$(mock_stat loads_ok)"
check "unusable segment: warning on stderr" 1 "$(grep -c 'warning' "$tmp/err")"

# ---- backfill.sh through `throttlectl http` -----------------------------------------
if ! "$B/throttlectl" http --help >/dev/null 2>&1; then
  echo "SKIP backfill.sh: this build's throttlectl has no 'http' command"
else
  mock_admin reset '{}'
  THROTTLECTL="$B/throttlectl" sh "$top/examples/backfill.sh" "$U" orders \
    "$tmp/files" >"$tmp/backfill.out" 2>&1
  rc=$?
  check "backfill: exit 0" 0 $rc
  [ $rc -eq 0 ] || cat "$tmp/backfill.out"
  check "backfill: 24 lines 'ok'" 24 "$(grep -c ': ok$' "$tmp/backfill.out")"
  check "backfill: summary" 1 "$(grep -c '^backfill: 24 of 24 files loaded, 0 failed, 0 to retry later$' "$tmp/backfill.out")"
  check "backfill: loads_ok" 24 "$(mock_stat loads_ok)"
  check "backfill: early" 0 "$(mock_stat early)"
  check_le "backfill: refused" 3 "$(mock_stat refused)"
fi

[ "$fails" -eq 0 ] && echo "examples: all checks passed"
[ "$fails" -eq 0 ]
