#!/bin/sh
# SPDX-License-Identifier: MIT
# test_ctl_max_delay.sh — `throttlectl max-delay`: the segment's maximum
# delay, the most any publisher stores for everyone, shown and changed by
# an operator; a process's own THROTTLE_MAX_DELAY_MS bounds only what that
# process honours and never what it stores for the others.
. "$(dirname "$0")/ctl_lib.sh"
ctl=$T
unset THROTTLE_MAX_DELAY_MS
left_ms() {
  "$ctl" show "$1" --json | tr ',{' '\n\n' | sed -n 's/^"remaining_ms"://p' | head -n 1
}

check "the default: 15 min" "900.000" "$("$ctl" max-delay)"
check "set to 2 s" "2.000" "$("$ctl" max-delay 2)"
check "shown again" "2.000" "$("$ctl" max-delay)"
"$ctl" backoff k 60 2>/dev/null
ms=$(left_ms k)
check "a 60 s back-off is stored as at most 2 s" yes "$([ "$ms" -le 2000 ] && echo yes || echo "no ($ms)")"

"$ctl" max-delay 600 >/dev/null
"$ctl" backoff k 60 2>/dev/null
# A loosely configured process peeks: what is stored stays as it was.
THROTTLE_MAX_DELAY_MS=1000 "$ctl" show k >/dev/null
ms=$(left_ms k)
check "a process's own 1 s maximum leaves the stored 60 s" yes \
  "$([ "$ms" -gt 50000 ] && echo yes || echo "no ($ms)")"

"$ctl" max-delay 0 >/dev/null 2>&1; check "0 is a usage error" 64 $?
"$ctl" max-delay 1e3 >/dev/null 2>&1; check "not a number: usage error" 64 $?
"$ctl" max-delay 604801 >/dev/null 2>&1; check "past 7 days: usage error" 64 $?
check "unchanged by the refusals" "600.000" "$("$ctl" max-delay)"

finish
