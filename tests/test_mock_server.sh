#!/bin/sh
# SPDX-License-Identifier: MIT
# test_mock_server.sh — the mock Hotdata server keeps its own contract:
# per-table write lock with 409 RESOURCE_LOCKED + Retry-After, CONFLICT on
# a second create, injected 429/503, external holds, the "early" counter,
# reset, and a clean exit on /admin/shutdown and on SIGTERM; tables that
# admit N writes at once (set at start and by /admin/concurrency), with
# their own and their workspace's most-at-once counters; workspace-wide
# overload windows (429 OVERLOADED) and the workspace's "early" counter;
# early requests within the race window counted apart.
# Needs python3 and the curl command.  Exit 0 when every check passes.
set -u
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
srv=""
. "$here/check_lib.sh"
. "$here/mock_lib.sh"
trap 'mock_stop; rm -rf "$tmp"' EXIT
start() { # mock options...
  mock_start "$here" "$tmp" "$@" || { echo "FAIL the server did not start"; exit 1; }
}
post() { curl -s -o "$tmp/body" -D "$tmp/head" -w '%{http_code}' -X POST "$U$1" ${2:+-d "$2"}; }
header() { tr -d '\r' <"$tmp/head" | sed -n "s/^$1: //Ip"; }
code() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["error"]["code"])' "$tmp/body"; }
# Poll /stats (every 20 ms, at most 10 s) until the expression is true.
until_true() {
  i=0
  while [ "$(mock_stat "bool($1)")" != True ]; do
    i=$((i + 1)); [ $i -gt 500 ] && { echo "FAIL waiting for $1"; exit 1; }
    sleep 0.02
  done
}

# A load is in service for 4 s: long enough to see it in service and send
# another request meanwhile on a loaded machine (the helpers run the system
# Python, check_lib.sh: a version manager's shim on PATH can take seconds
# to start each one).  Retry-After 30 s: longer than that service, so a
# load right after it is still early.
start --service-ms 4000 --retry-after 30
check "create" 201 "$(post /v1/tables '{"name":"orders"}')"
check "create again" 409 "$(post /v1/tables '{"name":"orders"}')"
check "create again: CONFLICT" CONFLICT "$(code)"
check "create: bad body" 400 "$(post /v1/tables 'nope')"

# A load holds the lock; a second load meanwhile is refused.
curl -s -o /dev/null -X POST "$U/v1/tables/orders/load" -d abc &
bg=$!
until_true 'tables.get("orders", {}).get("in_service")'
check "load while locked" 409 "$(post /v1/tables/orders/load x)"
check "load while locked: RESOURCE_LOCKED" RESOURCE_LOCKED "$(code)"
check "load while locked: Retry-After" 30 "$(header Retry-After)"
wait $bg
# Told to come back in 30 s, coming back now is early (and still refused
# only if locked; the lock is free, so it loads).
check "early load" 200 "$(post /v1/tables/orders/load abcd)"
check "early load: body" '{"loaded": 4, "table": "orders"}' "$(cat "$tmp/body")"
check "early counted" 1 "$(mock_stat early)"
check "refused counted" 1 "$(mock_stat refused)"
check "loads_ok counted" 2 "$(mock_stat loads_ok)"
check "other table not early" 200 "$(post /v1/tables/other/load x)"
check "early unchanged" 1 "$(mock_stat early)"

check "inject 429" 200 "$(post /admin/fail '{"status":429,"count":2}')"
check "429 #1" 429 "$(post /v1/tables/a/load x)"
check "429: OVERLOADED" OVERLOADED "$(code)"
check "429: Retry-After" 30 "$(header Retry-After)"
check "429 #2" 429 "$(post /v1/tables/b/load x)"
check "then ok" 200 "$(post /v1/tables/c/load x)"
check "inject 503 without Retry-After" 200 \
  "$(post /admin/fail '{"status":503,"count":1,"retry_after":null}')"
check "503" 503 "$(post /v1/tables/d/load x)"
check "503: SERVICE_UNAVAILABLE" SERVICE_UNAVAILABLE "$(code)"
check "503: no Retry-After" "" "$(header Retry-After)"
check "inject: bad status" 400 "$(post /admin/fail '{"status":418}')"
check "counters" "2 1" "$(mock_stat 'f"{rate_limited} {unavailable}"')"

check "hold" 200 "$(post /admin/hold '{"table":"h","ms":300}')"
check "held" 409 "$(post /v1/tables/h/load x)"
i=0
while [ "$(post /v1/tables/h/load x)" = 409 ] && [ $i -lt 500 ]; do
  sleep 0.02; i=$((i + 1))
done
check "hold over" 200 "$(sed -n '1s/^HTTP[^ ]* \([0-9]*\).*/\1/p' "$tmp/head")"

check "reset" 200 "$(post /admin/reset '{}')"
check "reset: counters" "0 0 0" "$(mock_stat 'f"{loads_ok} {refused} {early}"')"
check "reset: tables" 201 "$(post /v1/tables '{"name":"orders"}')"
check "unknown route" 404 "$(post /v1/nothing x)"

check "shutdown" 200 "$(post /admin/shutdown '{}')"
wait "$srv"
check "shutdown: exit status" 0 $?
srv=""

# ---- tables that admit N loads at once -----------------------------------
# Loads are in service for 6 s, so the ones started in the background are
# all in service together however slowly curl starts; Retry-After 30 s, so
# a load right after a refusal is early; every early request counts as a
# race too (--early-race-ms 60000).
bg=""
bgload() { curl -s -o /dev/null -X POST "$U$1" -d x & bg="$bg $!"; }
bgwait() { for p in $bg; do wait "$p"; done; bg=""; }
start --service-ms 6000 --retry-after 30 --concurrency 3 --early-race-ms 60000 \
  --table-concurrency solo=1 --table-concurrency ws2/pair=2
bgload /v1/tables/wide/load; bgload /v1/tables/wide/load
bgload /v1/tables/wide/load; bgload /v1/tables/solo/load
bgload /v1/workspaces/ws2/tables/pair/load
bgload /v1/workspaces/ws2/tables/pair/load
bgload /v1/workspaces/ws2/tables/other/load
until_true 'tables.get("wide", {}).get("in_service") == 3 and
  tables.get("solo", {}).get("in_service") == 1 and
  workspaces.get("ws2", {}).get("in_service") == 3'
check "3 at once: 4th refused" 409 "$(post /v1/tables/wide/load x)"
check "3 at once: RESOURCE_LOCKED" RESOURCE_LOCKED "$(code)"
check "3 at once: Retry-After" 30 "$(header Retry-After)"
check "own concurrency 1: 2nd refused" 409 "$(post /v1/tables/solo/load x)"
check "workspace table, 2 at once: 3rd refused" 409 \
  "$(post /v1/workspaces/ws2/tables/pair/load x)"
bgwait
check "per table: max in service, refused, concurrency" \
  "3 1 3 | 1 1 1 | 2 1 2 | 1 0 3" \
  "$(mock_stat '" | ".join("%d %d %d" % (t["max_in_service"], t["refused"], t["concurrency"])
     for t in (tables["wide"], tables["solo"], tables["ws2/pair"], tables["ws2/other"]))')"
check "workspace: most in service at once" "3 4 0" \
  "$(mock_stat '"%d %d %d" % tuple(workspaces["ws2"][k] for k in ("max_in_service", "requests", "early"))')"
check "default workspace: most in service at once" 4 \
  "$(mock_stat 'workspaces["default"]["max_in_service"]')"
# wide refused with Retry-After 30 s a few seconds ago: this load is early
# (and admitted: it has free slots).
bgload /v1/tables/wide/load
until_true 'tables["wide"]["early"] == 1'
check "early for the table that was told" "1 0 1" \
  "$(mock_stat '"%d %d %d" % (early, tables["solo"]["early"], tables["wide"]["in_service"])')"
check "early within the race window" "1 1 0" \
  "$(mock_stat '"%d %d %d" % (early_race, tables["wide"]["early_race"], workspaces["default"]["early_race"])')"
bgwait

check "concurrency: bad n" 400 "$(post /admin/concurrency '{"n":0}')"
check "concurrency: n not a number" 400 "$(post /admin/concurrency '{"n":"2"}')"
check "concurrency: one table" 200 "$(post /admin/concurrency '{"table":"wide","n":1}')"
check "concurrency: the default" 200 "$(post /admin/concurrency '{"n":2}')"
bgload /v1/tables/wide/load; bgload /v1/tables/fresh/load
bgload /v1/tables/fresh/load
until_true 'tables.get("wide", {}).get("in_service") == 1 and
  tables.get("fresh", {}).get("in_service") == 2'
check "changed to 1: 2nd refused" 409 "$(post /v1/tables/wide/load x)"
check "new default 2: 3rd refused" 409 "$(post /v1/tables/fresh/load x)"
check "own concurrency kept" "1 2 1" \
  "$(mock_stat '" ".join(str(tables[t]["concurrency"]) for t in ("wide", "fresh", "solo"))')"
bgwait
check "reset" 200 "$(post /admin/reset '{}')"
check "reset: concurrencies of the command line" "solo=1 ws2/pair=2" \
  "$(mock_stat '" ".join("%s=%d" % (n, t["concurrency"]) for n, t in tables.items())')"
check "shutdown" 200 "$(post /admin/shutdown '{}')"
wait "$srv"
srv=""

# ---- workspace-wide overload windows --------------------------------------
# --early-race-ms 0: no early request is a race.
start --service-ms 50 --retry-after 3 --overload-s 60 --early-race-ms 0
check "overload window: 429" 429 "$(post /v1/tables/t/load x)"
check "overload window: OVERLOADED" OVERLOADED "$(code)"
check "overload window: Retry-After" 3 "$(header Retry-After)"
check "overload window: every workspace" 429 \
  "$(post /v1/workspaces/w/tables/u/load x)"
check "overload window: again, early" 429 "$(post /v1/tables/v/load x)"
# The window is the workspace's: the early request is the workspace's,
# not the (other) table's.
check "overload: counters" "3 1 1 0 0" \
  "$(mock_stat '"%d %d %d %d %d" % (rate_limited, early, workspaces["default"]["early"], tables["v"]["early"], refused)')"
check "overload: no race" "0 0" \
  "$(mock_stat '"%d %d" % (early_race, workspaces["default"]["early_race"])')"
check "reset ends the window" 200 "$(post /admin/reset '{}')"
check "after the window" 200 "$(post /v1/tables/t/load x)"
check "overload: bad seconds" 400 "$(post /admin/overload '{"seconds":"x"}')"
check "overload one workspace" 200 \
  "$(post /admin/overload '{"workspace":"w","seconds":60,"retry_after":2}')"
check "overloaded workspace: 429" 429 "$(post /v1/workspaces/w/tables/t/load x)"
check "overloaded workspace: Retry-After" 2 "$(header Retry-After)"
check "other workspace: served" 200 "$(post /v1/tables/t/load x)"
check "overload one workspace: counters" "1 1 0" \
  "$(mock_stat '"%d %d %d" % (rate_limited, workspaces["w"]["rate_limited"], workspaces["default"]["rate_limited"])')"
kill -TERM "$srv"
wait "$srv"
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
