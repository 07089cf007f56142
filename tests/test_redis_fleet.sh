#!/bin/sh
# SPDX-License-Identifier: MIT
# test_redis_fleet.sh — fleets of `throttlectl http` processes on two
# "hosts" (each group with its own segment) that share only a throw-away
# Redis, against the mock Hotdata server:
#   - 2 x 12 processes loading 96 files into one table: every file
#     loaded, none early, at most 3 refused;
#   - an external hold: about one refused request per Retry-After in all,
#     not one per host; the second host's processes run an hour ahead
#     (faketime) and still send nothing early: Redis is the only clock;
#   - kill -9 of redis-server in the middle of a fleet run, restarted 2 s
#     later: every load completes, none early within a host (a host
#     returns to Redis key by key, once its segment's gate is empty);
#   - a Python process (ctypes, the shared library as installed) and C
#     processes of another host see each other's back-off and clear.  While Redis
#     is away each host's segment serves alone, so one host may well send
#     within a Retry-After the server gave the other: to see "within a
#     host", each host loads its own table there (both under one key).
# Skipped (exit 0, saying so) without redis-server or an `http` command.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
case "$B" in /*) ;; *) B="$top/$B" ;; esac
ctl="$B/throttlectl"
. "$top/tests/redis_lib.sh"
. "$top/tests/check_lib.sh"
. "$top/tests/mock_lib.sh"

if ! command -v redis-server >/dev/null 2>&1; then
  echo "SKIP test_redis_fleet: redis-server is not installed (make deps)"
  exit 0
fi
if ! "$ctl" http --help >/dev/null 2>&1; then
  echo "SKIP test_redis_fleet: this build's throttlectl has no 'http' command"
  exit 0
fi

tmp=$(mktemp -d)
srv=""
pids=""
segA="tt-${TH_TEST_TAG:-}rf-a-$$"
segB="tt-${TH_TEST_TAG:-}rf-b-$$"
# The host an hour ahead has a segment of its own: faketime shifts the
# wall clock of the processes it runs (the library reads CLOCK_BOOTTIME
# from the kernel, past faketime, as every process of a host shares it).
segC="tt-${TH_TEST_TAG:-}rf-c-$$"
cleanup() {
  for p in $pids; do kill "$p" 2>/dev/null; done
  mock_stop
  redis_stop
  rm -f "/dev/shm/$segA" "/dev/shm/$segB" "/dev/shm/$segC"
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

redis_start "$tmp/redis" || { echo "FAIL redis-server did not start"; exit 1; }
export THROTTLE_BACKEND="$REDIS_URL"
export THROTTLE_BACKEND_MODULE="$B/libthrottle-redis.so.1"

mock_start "$top/tests" "$tmp" --service-ms 20 --retry-after 1 ||
  { echo "FAIL the mock server did not start"; exit 1; }
KEY="hotdata:127.0.0.1/orders"

mkdir "$tmp/files"
n=1
while [ $n -le 96 ]; do
  printf 'row %d\n' $n >"$tmp/files/part-$n"
  n=$((n + 1))
done

# One worker of a host: `throttlectl http` for each of its files in turn.
# WRAP (e.g. "faketime -f +1h") runs it under another clock.
worker() { # segment out-prefix wrap table files...
  seg=$1 out=$2 wrap=$3 table=$4
  shift 4
  rc=0
  for f in "$@"; do
    THROTTLE_SEGMENT="/$seg" $wrap "$ctl" http "$KEY" -X POST \
      --data-binary "@$f" -o /dev/null "$U/v1/tables/$table/load" 2>>"$out.err"
    r=$?
    [ $r -ne 0 ] && [ $rc -eq 0 ] && rc=$r
  done
  return $rc
}
# Two hosts of n workers each, `per` files a worker; host B under $2 and
# on table $TABLE_B (default: the same table as host A).
TABLE_B=orders
fleet() { # name wrapB n per
  pids=""
  w=0
  while [ $w -lt $((2 * $3)) ]; do
    files=""
    k=1
    while [ $k -le "$4" ]; do
      files="$files $tmp/files/part-$((w * $4 + k))"
      k=$((k + 1))
    done
    if [ $((w % 2)) -eq 0 ]; then seg=$segA wrap="" table=orders
    elif [ -n "$2" ]; then seg=$segC wrap=$2 table=$TABLE_B
    else seg=$segB wrap="" table=$TABLE_B; fi
    # shellcheck disable=SC2086
    worker "$seg" "$tmp/$1.$w" "$wrap" "$table" $files &
    pids="$pids $!"
    w=$((w + 1))
  done
}
collect() {
  bad=0
  for p in $pids; do wait "$p" || bad=$((bad + 1)); done
  pids=""
}

# ---- 2 x 12 processes, 96 files, one table --------------------------------
fleet fleet "" 12 4
collect
check "2x12 loads: every process exits 0" 0 "$bad"
check "2x12 loads: loads_ok" 96 "$(mock_stat loads_ok)"
check "2x12 loads: early" 0 "$(mock_stat early)"
check_le "2x12 loads: refused" 3 "$(mock_stat refused)"

# ---- an external hold; host B an hour ahead --------------------------------
HOLD_MS=3000
wrapB=""
if command -v faketime >/dev/null 2>&1; then
  wrapB="faketime -f +1h"
else
  echo "note: faketime is not installed; host B runs on the real clock"
fi
mock_admin reset '{}'
"$ctl" reset >/dev/null 2>&1
mock_admin hold "{\"table\": \"orders\", \"ms\": $HOLD_MS}"
fleet hold "$wrapB" 4 1
collect
check "hold: every process exits 0" 0 "$bad"
check "hold: loads_ok" 8 "$(mock_stat loads_ok)"
check "hold: early (host B an hour ahead)" 0 "$(mock_stat early)"
check_le "hold: refused, in all hosts" $((HOLD_MS / 1000 + 3)) "$(mock_stat refused)"

# ---- kill -9 of redis-server mid-run, back 2 s later -----------------------
mock_admin reset '{}'
"$ctl" reset >/dev/null 2>&1
mock_admin hold "{\"table\": \"orders\", \"ms\": 1500}"
mock_admin hold "{\"table\": \"orders_b\", \"ms\": 1500}"
TABLE_B=orders_b
fleet crash "" 6 2
sleep 0.5
redis_kill9
sleep 2
redis_start "$tmp/redis" || { echo "FAIL redis-server did not restart"; exit 1; }
collect
check "redis killed: every process exits 0" 0 "$bad"
check "redis killed: loads_ok" 24 "$(mock_stat loads_ok)"
# While Redis comes back, a host's callers still admitted or queued in its
# segment keep the key there: the host's new callers queue behind them and
# return to Redis once the segment's gate is empty, so there is one gate
# per host at any time and nothing goes early within a host.
check "redis killed: early within host A" 0 "$(mock_stat "tables['orders']['early']")"
check "redis killed: early within host B" 0 "$(mock_stat "tables['orders_b']['early']")"
echo "redis killed: refused $(mock_stat refused), early across hosts $(mock_stat early)"

# ---- a Python process (ctypes on libthrottle.so.1) and C processes -----------
# The shared library, not relinked, loads the module from its own directory.
pyk="py:ws/table"
pyrem() { # prints throttle_remaining() of $pyk as Python sees it
  THROTTLE_SEGMENT="/$segA" env -u THROTTLE_BACKEND_MODULE "$PY" -c '
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
h = ctypes.c_void_p()
rc = lib.throttle_open(None, ctypes.byref(h))
if sys.argv[3] == "backoff":
    rc = rc or lib.throttle_backoff(h, sys.argv[2].encode(), ctypes.c_uint64(60000))
ms = ctypes.c_uint64(0)
rc = rc or lib.throttle_remaining(h, sys.argv[2].encode(), ctypes.byref(ms))
lib.throttle_close(h)
print(ms.value if rc == 0 else "error %d" % rc)' "$B/libthrottle.so.1" "$pyk" "$1"
}
left=$(pyrem backoff)
check "python: published through Redis" yes "$([ "$left" -gt 50000 ] 2>/dev/null && echo yes || echo "$left")"
left=$(THROTTLE_SEGMENT="/$segB" "$ctl" show "$pyk" --json | "$PY" -c 'import json, sys
print(json.load(sys.stdin)["remaining_ms"])')
check "C on another host: sees it" yes "$([ "$left" -gt 50000 ] 2>/dev/null && echo yes || echo "$left")"
THROTTLE_SEGMENT="/$segB" "$ctl" clear "$pyk"
check "python: sees the clear from C" 0 "$(pyrem peek)"

[ "$fails" -eq 0 ]
