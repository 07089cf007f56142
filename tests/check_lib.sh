# SPDX-License-Identifier: MIT
# check_lib.sh — the checks every shell test shares (sourced, never run):
# each prints "ok   NAME" or "FAIL NAME: ..." and counts failures in
# $fails; and PY, the Python to run helpers and test servers with.
#
#   check NAME EXPECTED ACTUAL     the two strings are equal
#   check_le NAME MAX ACTUAL       the integer ACTUAL is at most MAX
fails=0
check() { # name expected actual
  if [ "$2" = "$3" ]; then echo "ok   $1"; else
    echo "FAIL $1: expected [$2], got [$3]"; fails=$((fails + 1)); fi
}
check_le() { # name max actual
  if [ "$3" -le "$2" ]; then echo "ok   $1 ($3 <= $2)"; else
    echo "FAIL $1: $3 > $2"; fails=$((fails + 1)); fi
}
# The system interpreter, where Debian's modules
# (python3-prometheus-client) live: a version manager may shadow it on
# PATH, and its shim can add seconds to every start on a busy machine,
# more than some tests give a server's state to be seen.
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
