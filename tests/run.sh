#!/bin/sh
# Run each test binary in its own process (optionally under $RUN, e.g.
# valgrind) and summarise.  Each test uses its own segment names.
set -u
pass=0; fail=0; failed=""
for t in "$@"; do
  name=$(basename "$t")
  if ${RUN:-} "$t" >"$t.log" 2>&1; then
    pass=$((pass + 1)); echo "PASS $name"
  else
    fail=$((fail + 1)); failed="$failed $name"; echo "FAIL $name (log: $t.log)"
    tail -n 40 "$t.log"
  fi
done
echo "tests: $pass passed, $fail failed${failed:+ ($failed )}"
[ "$fail" -eq 0 ]
