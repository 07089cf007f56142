# SPDX-License-Identifier: MIT
# ctl_lib.sh — shell functions the throttlectl operator tests share
# (sourced, never run): the build's throttlectl in $T, a scratch directory
# in $tmp, a unique segment in $SEG (removed at exit), checks that count
# failures and the Python that has Debian's modules (tests/check_lib.sh).
# Set before sourcing: nothing; after: T, tmp, SEG, PY, top, B.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
case "$B" in /*) ;; *) B="$top/$B" ;; esac
T="$B/throttlectl"
tmp=$(mktemp -d)
SEG="/tt-${TH_TEST_TAG:-}$(basename "$0" .sh)-$$"
export THROTTLE_SEGMENT="$SEG"
. "$top/tests/check_lib.sh"
cleanup_hooks=""
ctl_cleanup() {
  for h in $cleanup_hooks; do "$h"; done
  "$T" --segment "$SEG" rm >/dev/null 2>&1
  rm -rf "$tmp"
}
trap ctl_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
check_true() { # name command...: the command succeeds
  name=$1; shift
  if "$@"; then echo "ok   $name"; else
    echo "FAIL $name: $*"; fails=$((fails + 1)); fi
}
contains() { # haystack needle
  case "$1" in *"$2"*) return 0 ;; esac; return 1
}
# Lines of file matching the pattern; 0 while the file does not exist yet.
lines() { # pattern file
  n=$(grep -c -- "$1" "$2" 2>/dev/null); echo "${n:-0}"
}
# A background job of a non-interactive shell starts with SIGINT ignored;
# watch installs its own handler before drawing, so send SIGINT only once
# it has drawn (the callers wait for its output first).
finish() {
  [ "$fails" -eq 0 ] && { echo "all checks passed"; exit 0; }
  echo "$fails check(s) failed"; exit 1
}
[ -x "$T" ] || { echo "FAIL $T is missing (make)"; exit 1; }
