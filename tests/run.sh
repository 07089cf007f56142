#!/bin/sh
# SPDX-License-Identifier: MIT
# Run each test binary in its own process (optionally under $RUN, e.g.
# valgrind) and summarise.  Each test uses its own segment names.
#
# Every name a test gives a segment carries this run's tag, TH_TEST_TAG
# ("ck<pid of this script>-": tests/helpers.c th_test_tag(), the shell
# libraries, the Python fixtures), so what a test leaves in /dev/shm is
# found, and told from what other runs on the same machine make at the
# same time: after each test, an object of the tag left behind fails it
# (and is removed, so the next test starts clean).
set -u
pass=0; fail=0; failed=""
mkdir -p "${B:-build}/tests"
TH_TEST_TAG=${TH_TEST_TAG:-ck$$-}
export TH_TEST_TAG
left_behind() { # the /dev/shm objects of this run's tag
  ls -A /dev/shm 2>/dev/null | grep -F -- "$TH_TEST_TAG"
}
for t in "$@"; do
  name=$(basename "$t")
  log="$t.log"
  case "$t" in
    # shell tests run as they are (never under valgrind); their logs go
    # into the build tree
    *.sh) cmd="sh $t"; log="${B:-build}/tests/$name.log" ;;
    *) cmd="${RUN:-} $t" ;;
  esac
  $cmd >"$log" 2>&1
  rc=$?
  left=$(left_behind)
  if [ -n "$left" ]; then
    echo "left in /dev/shm by $name:" $left >>"$log"
    for f in $left; do rm -f "/dev/shm/$f"; done
  fi
  if [ $rc -eq 0 ] && [ -z "$left" ]; then
    pass=$((pass + 1)); echo "PASS $name"
  else
    fail=$((fail + 1)); failed="$failed $name"
    echo "FAIL $name (log: $log)${left:+ (left in /dev/shm:$(echo $left | wc -w) objects)}"
    tail -n 40 "$log"
  fi
done
echo "tests: $pass passed, $fail failed${failed:+ ($failed )}"
[ "$fail" -eq 0 ]
