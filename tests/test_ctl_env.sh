#!/bin/sh
# SPDX-License-Identifier: MIT
# test_ctl_env.sh — an honest environment: a THROTTLE_* value that cannot
# be used warns with the variable, its value and the valid range (the
# library's variables and the Redis module's), a THROTTLE_* variable that
# nothing reads warns that it has no effect; `rm` of a segment that
# processes still map says which; `segments` shows an empty object (a
# create that /dev/shm had no room for) with what to do.  (That such a
# create leaves no empty object is test_segment_full.)
. "$(dirname "$0")/ctl_lib.sh"
ctl=$T
"$ctl" backoff k 30 >/dev/null

THROTTLE_GROUP_SHARED=1 "$ctl" ls >/dev/null 2>"$tmp/err"
check "an unknown THROTTLE_ variable: exit 0" 0 $?
check_true "  it is named as having no effect" \
  grep -q 'THROTTLE_GROUP_SHARED is not a variable libthrottle reads' "$tmp/err"

THROTTLE_KEYS=abc "$ctl" backoff k2 1 2>"$tmp/err"
check_true "THROTTLE_KEYS=abc: warns with the range" \
  grep -q "THROTTLE_KEYS='abc' is not a whole number from 1 to 1048576; 4096 is used" "$tmp/err"
THROTTLE_LEASE_MS=-5 THROTTLE_MAX_DELAY_MS=0 "$ctl" ls >/dev/null 2>"$tmp/err"
check_true "ls too, every bad variable: THROTTLE_LEASE_MS" \
  grep -q "THROTTLE_LEASE_MS='-5' is not a whole number from 1 to 86400000" "$tmp/err"
check_true "  and THROTTLE_MAX_DELAY_MS" \
  grep -q "THROTTLE_MAX_DELAY_MS='0' is not a whole number from 1 to" "$tmp/err"

if [ -f "$B/libthrottle-redis.so.1" ]; then
  # The module reads its variables when the handle opens (it connects
  # later), so no server is needed to hear about them.
  THROTTLE_BACKEND_MODULE="$B/libthrottle-redis.so.1" \
    THROTTLE_BACKEND=redis://127.0.0.1:1 THROTTLE_REDIS_TIMEOUT_MS=fast \
    THROTTLE_LIVENESS_MS=5 THROTTLE_REDIS_TTL_MS=1e9 \
    "$ctl" ls >/dev/null 2>"$tmp/err"
  check_true "THROTTLE_REDIS_TIMEOUT_MS=fast: warns with the range" \
    grep -q "THROTTLE_REDIS_TIMEOUT_MS='fast' is not a whole number from 1 to 60000; 250 is used" "$tmp/err"
  check_true "THROTTLE_LIVENESS_MS=5: warns with the range" \
    grep -q "THROTTLE_LIVENESS_MS='5' is not a whole number from 100 to 3600000" "$tmp/err"
  check_true "THROTTLE_REDIS_TTL_MS=1e9: warns" \
    grep -q "THROTTLE_REDIS_TTL_MS='1e9'" "$tmp/err"
else
  echo "skip the Redis variables: no $B/libthrottle-redis.so.1"
fi

# rm while a waiter maps the segment
"$ctl" wait k >/dev/null 2>&1 &
w=$!
i=0
until grep -q "/dev/shm$SEG" "/proc/$w/maps" 2>/dev/null || [ $i -ge 200 ]; do
  sleep 0.05; i=$((i + 1))
done
"$ctl" rm 2>"$tmp/err"
check "rm of a mapped segment: exit 0" 0 $?
check_true "  says it is still mapped, by whom" \
  grep -q "warning: $SEG was still mapped by 1 process ($w throttlectl)" "$tmp/err"
kill "$w" 2>/dev/null; wait "$w" 2>/dev/null
"$ctl" backoff k 1 >/dev/null
"$ctl" rm 2>"$tmp/err"
check "rm of an unmapped segment: nothing said" "" "$(cat "$tmp/err")"

# an empty object, as a create on a full /dev/shm left them
empty="$SEG-empty"
: >"/dev/shm$empty"
cleanup_empty() { rm -f "/dev/shm$empty"; }
cleanup_hooks="$cleanup_hooks cleanup_empty"
"$ctl" segments >"$tmp/out" 2>&1
check_true "segments lists the empty object" grep -q "^$empty .*(empty: never built)" "$tmp/out"
check_true "  with what to do" grep -q "$empty is empty: .*df /dev/shm.*throttlectl --segment $empty rm" "$tmp/out"
"$ctl" segments --json >"$tmp/out"
check_true "  and --json marks it" grep -q "\"name\":\"$empty\",[^}]*\"error\":\"empty\"" "$tmp/out"

finish
