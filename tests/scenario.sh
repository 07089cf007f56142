# SPDX-License-Identifier: MIT
# scenario.sh — shell functions the scenario tests share: a scratch
# directory and segment removed at exit, tests/scenario_server.py started
# on a free port ($U, requests logged to $tmp/requests.log), and checks
# (tests/check_lib.sh).
# Sourced with name set; sets top, B (the build directory, absolute) and
# ctl (its throttlectl).  Skips the test (exit 0, saying so) without
# python3.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
case "$B" in /*) ;; *) B="$top/$B" ;; esac
ctl="$B/throttlectl"
command -v python3 >/dev/null 2>&1 || { echo "SKIP: no python3"; exit 0; }
tmp=$(mktemp -d)
srv=""
seg="/tt-${TH_TEST_TAG:-}$name-$$"
export THROTTLE_SEGMENT="$seg"
. "$top/tests/check_lib.sh"
. "$top/tests/mock_lib.sh"
cleanup() {
  mock_stop
  "$ctl" rm >/dev/null 2>&1
  [ -f "$tmp/hb.pid" ] && kill "$(cat "$tmp/hb.pid")" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# The bytes of a file as hex, for checks on what reached a "terminal".
hex() { od -An -tx1 -v "$1" | tr '\n' ' ' | tr -s ' '; }
has_hex() { # name file hex-bytes: fails when the file holds them
  case "$(hex "$2")" in *"$3"*) check "$1" absent present ;;
  *) check "$1" absent absent ;; esac
}
# A guard: CMD... killed after 20 s; its status, 137 when it hung.
guard() { timeout -s KILL 20 "$@"; }

mock_start_script "$top/tests/scenario_server.py" "$tmp" \
  --log "$tmp/requests.log" ||
  { echo "FAIL the scenario server did not start"; exit 1; }
requests() { grep -c " $1\$\| $1 " "$tmp/requests.log"; }
