#!/bin/sh
# SPDX-License-Identifier: MIT
# Run each test binary in its own process (optionally under $RUN, e.g.
# valgrind) and summarise.  Each test uses its own segment names.
set -u
pass=0; fail=0; failed=""
mkdir -p "${B:-build}/tests"
for t in "$@"; do
  name=$(basename "$t")
  log="$t.log"
  case "$t" in
    # shell tests run as they are (never under valgrind); their logs go
    # into the build tree
    *.sh) cmd="sh $t"; log="${B:-build}/tests/$name.log" ;;
    *) cmd="${RUN:-} $t" ;;
  esac
  if $cmd >"$log" 2>&1; then
    pass=$((pass + 1)); echo "PASS $name"
  else
    fail=$((fail + 1)); failed="$failed $name"; echo "FAIL $name (log: $log)"
    tail -n 40 "$log"
  fi
done
echo "tests: $pass passed, $fail failed${failed:+ ($failed )}"
[ "$fail" -eq 0 ]
