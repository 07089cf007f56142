#!/bin/sh
# SPDX-License-Identifier: MIT
# test_ctl_backend.sh — whether the backend is up, as an operator reads it
# during an outage: ls, ls --json, show, show --json, segments (text and
# --json), watch's header and metrics say
# "up" while Redis answers; with redis-server stopped they say it is
# unreachable, since when, and how many calls this host's segment served
# meanwhile; with it back, up again.  A real redis-server on a unix
# socket in the scratch directory (tests/redis_lib.sh).
. "$(dirname "$0")/ctl_lib.sh"
. "$top/tests/redis_lib.sh"
redis_skip_unless_installed
ctl=$T
[ -f "$B/libthrottle-redis.so.1" ] || { echo "FAIL $B/libthrottle-redis.so.1 is missing (make)"; exit 1; }
export THROTTLE_BACKEND_MODULE="$B/libthrottle-redis.so.1"
cleanup_hooks="$cleanup_hooks redis_stop"
redis_start "$tmp/redis" || { echo "FAIL redis-server did not start"; exit 1; }
export THROTTLE_BACKEND="$REDIS_URL"

"$ctl" backoff k 30
check "backoff through Redis: exit 0" 0 $?
"$ctl" ls >"$tmp/ls" 2>&1
check_true "ls: the backend is up" grep -q "^backend $REDIS_URL: up;" "$tmp/ls"
"$ctl" ls --json >"$tmp/ls.json"
check_true "ls --json: backend_up true" grep -q '"backend_up":true,"backend_down_ms":0,' "$tmp/ls.json"
"$ctl" show k --json >"$tmp/show.json"
check_true "show --json: backend_up true" grep -q "\"backend\":\"$REDIS_URL\",\"backend_up\":true," "$tmp/show.json"
"$ctl" segments >"$tmp/segs" 2>&1
check_true "segments: the backend is up" grep -q "^backend $REDIS_URL: up;" "$tmp/segs"
"$ctl" segments --json >"$tmp/segs.json"
check_true "segments --json: backend_up true" grep -q "^{\"schema\":1,\"backend\":\"$REDIS_URL\",\"backend_up\":true," "$tmp/segs.json"
"$ctl" metrics >"$tmp/m"
check_true "metrics: throttle_backend_up 1" \
  grep -q "^throttle_backend_up{segment=\"$SEG\",backend=\"$REDIS_URL\"} 1\$" "$tmp/m"

redis_stop
"$ctl" backoff k2 30 2>"$tmp/err"
check "backoff with Redis down: exit 0 (the segment holds it)" 0 $?
check_true "  says on stderr that the backend is down and which segment served" \
  grep -q "^throttlectl: backend $REDIS_URL is unreachable: this host's segment $SEG served instead" "$tmp/err"
"$ctl" ls >"$tmp/ls" 2>&1
check "ls with Redis down: exit 0 (the segment serves)" 0 $?
check_true "  says it is unreachable, since when, and what the segment served" \
  grep -q "^backend $REDIS_URL: UNREACHABLE for [0-9.]*m\{0,1\}s; this host's segment served [1-9][0-9]* calls\{0,1\} meanwhile" "$tmp/ls"
"$ctl" ls --json >"$tmp/ls.json" 2>/dev/null
check_true "ls --json: backend_up false" grep -q '"backend_up":false,"backend_down_ms":[0-9]*,"backend_served_meanwhile":[1-9]' "$tmp/ls.json"
"$ctl" show k >"$tmp/show" 2>/dev/null
check_true "show: the same line" grep -q "^backend $REDIS_URL: UNREACHABLE" "$tmp/show"
"$ctl" show k --json >"$tmp/show.json" 2>/dev/null
check_true "show --json: backend_up false, since when, what the segment served" \
  grep -q '"backend_up":false,"backend_down_ms":[0-9]*,"backend_served_meanwhile":[1-9]' "$tmp/show.json"
"$ctl" segments >"$tmp/segs" 2>/dev/null
check_true "segments: the same line" grep -q "^backend $REDIS_URL: UNREACHABLE for" "$tmp/segs"
"$ctl" segments --json >"$tmp/segs.json" 2>/dev/null
check_true "segments --json: backend_up false" grep -q '"backend_up":false,"backend_down_ms":[0-9]*,' "$tmp/segs.json"
"$ctl" metrics >"$tmp/m" 2>/dev/null
check_true "metrics: throttle_backend_up 0" \
  grep -q "^throttle_backend_up{segment=\"$SEG\",backend=\"$REDIS_URL\"} 0\$" "$tmp/m"
"$ctl" watch --interval 100ms >"$tmp/watch" 2>/dev/null &
w=$!
i=0
until grep -q "backend" "$tmp/watch" 2>/dev/null || [ $i -ge 200 ]; do sleep 0.05; i=$((i + 1)); done
kill "$w" 2>/dev/null; wait "$w" 2>/dev/null
check_true "watch's header says so" grep -q "; backend $REDIS_URL UNREACHABLE for" "$tmp/watch"

redis_start "$tmp/redis" || { echo "FAIL redis-server did not restart"; exit 1; }
"$ctl" ls >"$tmp/ls" 2>&1
check_true "with Redis back: up" grep -q "^backend $REDIS_URL: up;" "$tmp/ls"
finish
