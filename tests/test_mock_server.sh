#!/bin/sh
# test_mock_server.sh — the mock Hotdata server keeps its own contract:
# per-table write lock with 409 RESOURCE_LOCKED + Retry-After, CONFLICT on
# a second create, injected 429/503, external holds, the "early" counter,
# reset, and a clean exit on /admin/shutdown and on SIGTERM.
# Needs python3 and the curl command.  Exit 0 when every check passes.
set -u
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
srv=""
trap '[ -n "$srv" ] && kill "$srv" 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
check() { # name expected actual
  if [ "$2" = "$3" ]; then echo "ok   $1"; else
    echo "FAIL $1: expected [$2], got [$3]"; fails=$((fails + 1)); fi
}

start() { # mock options...
  rm -f "$tmp/port"
  python3 "$here/mock_server.py" --port 0 --port-file "$tmp/port" "$@" &
  srv=$!
  i=0
  while [ ! -s "$tmp/port" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
  [ -s "$tmp/port" ] || { echo "FAIL the server did not start"; exit 1; }
  U="http://127.0.0.1:$(cat "$tmp/port")"
}
post() { curl -s -o "$tmp/body" -D "$tmp/head" -w '%{http_code}' -X POST "$U$1" ${2:+-d "$2"}; }
header() { tr -d '\r' <"$tmp/head" | sed -n "s/^$1: //Ip"; }
code() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["error"]["code"])' "$tmp/body"; }
stat() { curl -s "$U/stats" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1], {}, d))' "$1"; }
# Poll /stats (every 20 ms, at most 10 s) until the expression is true.
until_true() {
  i=0
  while [ "$(stat "bool($1)")" != True ]; do
    i=$((i + 1)); [ $i -gt 500 ] && { echo "FAIL waiting for $1"; exit 1; }
    sleep 0.02
  done
}

start --service-ms 400 --retry-after 2
check "create" 201 "$(post /v1/tables '{"name":"orders"}')"
check "create again" 409 "$(post /v1/tables '{"name":"orders"}')"
check "create again: CONFLICT" CONFLICT "$(code)"
check "create: bad body" 400 "$(post /v1/tables 'nope')"

# A load holds the lock for 400 ms; a second load meanwhile is refused.
curl -s -o /dev/null -X POST "$U/v1/tables/orders/load" -d abc &
bg=$!
until_true 'tables.get("orders", {}).get("in_service")'
check "load while locked" 409 "$(post /v1/tables/orders/load x)"
check "load while locked: RESOURCE_LOCKED" RESOURCE_LOCKED "$(code)"
check "load while locked: Retry-After" 2 "$(header Retry-After)"
wait $bg
# Told to come back in 2 s, coming back now is early (and still refused
# only if locked; the lock is free, so it loads).
check "early load" 200 "$(post /v1/tables/orders/load abcd)"
check "early load: body" '{"loaded": 4, "table": "orders"}' "$(cat "$tmp/body")"
check "early counted" 1 "$(stat early)"
check "refused counted" 1 "$(stat refused)"
check "loads_ok counted" 2 "$(stat loads_ok)"
check "other table not early" 200 "$(post /v1/tables/other/load x)"
check "early unchanged" 1 "$(stat early)"

check "inject 429" 200 "$(post /admin/fail '{"status":429,"count":2}')"
check "429 #1" 429 "$(post /v1/tables/a/load x)"
check "429: OVERLOADED" OVERLOADED "$(code)"
check "429: Retry-After" 2 "$(header Retry-After)"
check "429 #2" 429 "$(post /v1/tables/b/load x)"
check "then ok" 200 "$(post /v1/tables/c/load x)"
check "inject 503 without Retry-After" 200 \
  "$(post /admin/fail '{"status":503,"count":1,"retry_after":null}')"
check "503" 503 "$(post /v1/tables/d/load x)"
check "503: SERVICE_UNAVAILABLE" SERVICE_UNAVAILABLE "$(code)"
check "503: no Retry-After" "" "$(header Retry-After)"
check "inject: bad status" 400 "$(post /admin/fail '{"status":418}')"
check "counters" "2 1" "$(stat 'f"{rate_limited} {unavailable}"')"

check "hold" 200 "$(post /admin/hold '{"table":"h","ms":300}')"
check "held" 409 "$(post /v1/tables/h/load x)"
i=0
while [ "$(post /v1/tables/h/load x)" = 409 ] && [ $i -lt 500 ]; do
  sleep 0.02; i=$((i + 1))
done
check "hold over" 200 "$(cat "$tmp/head" | sed -n '1s/^HTTP[^ ]* \([0-9]*\).*/\1/p')"

check "reset" 200 "$(post /admin/reset '{}')"
check "reset: counters" "0 0 0" "$(stat 'f"{loads_ok} {refused} {early}"')"
check "reset: tables" 201 "$(post /v1/tables '{"name":"orders"}')"
check "unknown route" 404 "$(post /v1/nothing x)"

check "shutdown" 200 "$(post /admin/shutdown '{}')"
wait "$srv"
check "shutdown: exit status" 0 $?
srv=""

# HTTP-date Retry-After, and SIGTERM.
start --date-retry-after
check "date form: hold" 200 "$(post /admin/hold '{"table":"t","ms":60000}')"
check "date form: 409" 409 "$(post /v1/tables/t/load x)"
case "$(header Retry-After)" in
  ???,\ [0-9][0-9]\ ???\ [0-9][0-9][0-9][0-9]\ [0-9][0-9]:[0-9][0-9]:[0-9][0-9]\ GMT)
    check "date form: IMF-fixdate" yes yes ;;
  *) check "date form: IMF-fixdate" "an IMF-fixdate" "$(header Retry-After)" ;;
esac
kill -TERM "$srv"
wait "$srv"
check "SIGTERM: exit status" 0 $?
srv=""

[ "$fails" -eq 0 ] && echo "mock server: all checks passed"
[ "$fails" -eq 0 ]
