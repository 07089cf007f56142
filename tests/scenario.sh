# SPDX-License-Identifier: MIT
# scenario.sh — shell functions the scenario tests share: a scratch
# directory and segment removed at exit, tests/scenario_server.py started
# on a free port ($U, requests logged to $tmp/requests.log), and checks.
# Sourced with top, ctl and name set; needs python3.
tmp=$(mktemp -d)
srv=""
seg="/tt-$name-$$"
export THROTTLE_SEGMENT="$seg"
cleanup() {
  [ -n "$srv" ] && kill "$srv" 2>/dev/null && wait "$srv" 2>/dev/null
  "$ctl" rm >/dev/null 2>&1
  [ -f "$tmp/hb.pid" ] && kill "$(cat "$tmp/hb.pid")" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fails=0
check() { # name expected actual
  if [ "$2" = "$3" ]; then echo "ok   $1"; else
    echo "FAIL $1: expected [$2], got [$3]"; fails=$((fails + 1)); fi
}
# The bytes of a file as hex, for checks on what reached a "terminal".
hex() { od -An -tx1 -v "$1" | tr '\n' ' ' | tr -s ' '; }
has_hex() { # name file hex-bytes: fails when the file holds them
  case "$(hex "$2")" in *"$3"*) check "$1" absent present ;;
  *) check "$1" absent absent ;; esac
}
# A guard: CMD... killed after 20 s; its status, 137 when it hung.
guard() { timeout -s KILL 20 "$@"; }

python3 "$top/tests/scenario_server.py" --port 0 --port-file "$tmp/port" \
  --log "$tmp/requests.log" &
srv=$!
i=0
while [ ! -s "$tmp/port" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
[ -s "$tmp/port" ] || { echo "FAIL the scenario server did not start"; exit 1; }
U="http://127.0.0.1:$(cat "$tmp/port")"
requests() { grep -c " $1\$\| $1 " "$tmp/requests.log"; }

