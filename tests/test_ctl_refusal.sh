#!/bin/sh
# SPDX-License-Identifier: MIT
# test_ctl_refusal.sh — what the server said, kept: the mock Hotdata server
# (tests/mock_server.py) holds a table and answers 409 RESOURCE_LOCKED with
# a message and Retry-After: 5; `throttlectl http` is refused, and `show`,
# `show --json`, `ls --json`, `watch` and `metrics` then carry the server's
# status, code, message and Retry-After, when, and the refused process's
# pid and host.  Hostile words (escape sequences, controls, a message far
# past the bound, bytes that are not UTF-8 through `backoff --message`)
# come out bounded and without a control byte.  `backoff --status` is
# checked like any option.
. "$(dirname "$0")/ctl_lib.sh"
. "$top/tests/mock_lib.sh"
ctl=$T
if ! "$ctl" http --help >/dev/null 2>&1; then
  echo "SKIP test_ctl_refusal: this build's throttlectl has no 'http' command"
  exit 0
fi
cleanup_hooks="$cleanup_hooks mock_stop"
mock_start "$top/tests" "$tmp" --retry-after 5 || { echo "FAIL the mock server did not start"; exit 1; }
host=$(hostname | cut -c1-63)
msg="table orders is locked by another operation"
mock_admin hold "{\"table\": \"orders\", \"ms\": 60000, \"message\": \"$msg\"}"
t0=$(date +%s)
"$ctl" http hotdata:ws1/orders --retries 0 -X POST -d x "$U/v1/tables/orders/load" \
  >"$tmp/out" 2>"$tmp/err" &
p=$!
wait $p
check "http refused with the lock: exit 75" 75 $?
t1=$(date +%s)

"$ctl" show hotdata:ws1/orders >"$tmp/show"
check "show: exit 0" 0 $?
echo "--- throttlectl show hotdata:ws1/orders"
cat "$tmp/show"
echo "---"
check_true "show: the server's words, Retry-After, age, pid and host" \
  grep -Eq "^last refusal: 409 RESOURCE_LOCKED \"$msg\", Retry-After 5, [0-9.]+m?s ago, pid $p( [^ ]+)? \\(host $host\\)\$" "$tmp/show"

"$ctl" show hotdata:ws1/orders --json >"$tmp/show.json"
check "show --json: the last refusal, as the server said it" ok "$("$PY" - "$tmp/show.json" "$p" "$host" "$msg" "$t0" "$t1" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
r = d["last_refusal"]
want = {"status": 409, "code": "RESOURCE_LOCKED", "message": sys.argv[4],
        "retry_after": "5", "pid": int(sys.argv[2]), "host": sys.argv[3]}
bad = {k: r.get(k) for k in want if r.get(k) != want[k]}
t0, t1 = int(sys.argv[5]) * 1000, (int(sys.argv[6]) + 1) * 1000
if not t0 <= r["at_ms"] <= t1:
    bad["at_ms"] = r["at_ms"]
if r["ago_ms"] < 0 or d["publishes"] != 1:
    bad["ago_ms/publishes"] = (r["ago_ms"], d["publishes"])
print("ok" if not bad else bad)
EOF
)"
"$ctl" ls --json >"$tmp/ls.json"
check "ls --json: the same object per key" 409 \
  "$("$PY" -c 'import json, sys
k = [k for k in json.load(open(sys.argv[1]))["keys"] if k["key"] == "hotdata:ws1/orders"]
print(k[0]["last_refusal"]["status"])' "$tmp/ls.json")"

"$ctl" metrics >"$tmp/m"
line=$(grep "^throttle_key_last_refusal_timestamp_seconds{" "$tmp/m")
check_true "metrics: a timestamp gauge labelled with status and code" \
  contains "$line" "{segment=\"$SEG\",key=\"hotdata:ws1/orders\",scope=\"hotdata:ws1\",status=\"409\",code=\"RESOURCE_LOCKED\"} "
ts=${line##* }
ts=${ts%.*}
check_true "  its value is when the refusal came ($t0 <= $ts <= $t1)" \
  test "$ts" -ge "$t0" -a "$ts" -le "$t1"
if command -v promtool >/dev/null 2>&1; then
  promtool check metrics <"$tmp/m" >"$tmp/promtool.out" 2>&1
  check "  promtool accepts it" 0 $?
fi

"$ctl" watch --interval 100ms >"$tmp/watch" 2>/dev/null &
w=$!
i=0
until grep -q "LAST REFUSAL" "$tmp/watch" 2>/dev/null || [ $i -ge 200 ]; do sleep 0.05; i=$((i + 1)); done
sleep 0.2
kill "$w" 2>/dev/null; wait "$w" 2>/dev/null
check_true "watch: a LAST REFUSAL column with the status, code and words" \
  grep -Eq "409 RESOURCE_LOCKED [0-9.]+m?s ago \"table orders is locked by an" "$tmp/watch"

# Hostile words from the server: escape sequences, a bell, a line break,
# and a message far past the bound.
long=$(printf 'A%.0s' $(seq 1 600))
mock_admin hold "{\"table\": \"evil\", \"ms\": 60000, \"message\": \"\\u001b[2J\\u0007red\\nline $long\"}"
"$ctl" http hotdata:ws1/evil --retries 0 -X POST -d x "$U/v1/tables/evil/load" >/dev/null 2>&1
check "http refused on the hostile table: exit 75" 75 $?
"$ctl" show hotdata:ws1/evil >"$tmp/evil"
grep '^last refusal:' "$tmp/evil" >"$tmp/evil.line"
check_true "show: no control byte reaches the terminal" \
  sh -c '! LC_ALL=C grep -q "[[:cntrl:]]" "$1"' - "$tmp/evil.line"
check_true "  the words are there, each control a space" grep -q '^last refusal: 409 RESOURCE_LOCKED " \[2J red line AAAA' "$tmp/evil"
"$ctl" show hotdata:ws1/evil --json >"$tmp/evil.json"
check "show --json: the message bounded (199 bytes) and marked as cut" ok "$("$PY" - "$tmp/evil.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))["last_refusal"]["message"]
b = m.encode()
ok = len(b) <= 199 and m.endswith("...") and not any(c < 0x20 for c in b)
print("ok" if ok else (len(b), m[:20], m[-5:]))
EOF
)"

# Words a script passes: bytes that are not UTF-8 become '?'.
"$ctl" backoff hotdata:ws1/script 5m --status 503 --code SERVICE_UNAVAILABLE \
  --message "$(printf 'down \377\376 \033]0;x\007 now')"
check "backoff --status --code --message: exit 0" 0 $?
"$ctl" show hotdata:ws1/script >"$tmp/script"
check_true "show: the script's words, cleaned, with its Retry-After as given" \
  grep -Eq '^last refusal: 503 SERVICE_UNAVAILABLE "down \?\?  \]0;x  now", Retry-After 5m, ' "$tmp/script"
"$ctl" backoff k 5 --status 99 2>/dev/null
check "backoff --status 99: usage error" 64 $?
"$ctl" backoff k 5 --message hi 2>/dev/null
check "backoff --message without --status: usage error" 64 $?
"$ctl" backoff k 5 2>/dev/null
"$ctl" show k >"$tmp/k"
check_true "a key never refused has no last refusal line" sh -c "! grep -q '^last refusal' \"\$1\"" - "$tmp/k"
"$ctl" show k --json >"$tmp/k.json"
check_true "  and JSON says null" grep -q '"last_refusal":null' "$tmp/k.json"
finish
