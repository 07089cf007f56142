#!/bin/sh
# SPDX-License-Identifier: MIT
# test_scope_fleet.sh — scopes with real processes: 16 `throttlectl http`
# processes load 32 files into 4 tables of one workspace of the mock API
# (tests/mock_server.py) while the workspace answers 429 OVERLOADED
# (Retry-After 1 s) for its first 3 s.  The 429 is the workspace's, so it is
# published on the key's root scope ("hotdata:ws1" for
# "hotdata:ws1/t0"), and one probe goes for the whole workspace per
# Retry-After, the first one included: a workspace nothing is known of yet
# sends one request, and the others follow its answer.  Checks: every file
# loaded; no request reached the workspace before the time it had
# advertised (early, counted by the mock, with no allowance); 429s at most
# L/R + 2 for the whole workspace.
#
#   B=build sh tests/test_scope_fleet.sh [--publish 429=key]
#
# Extra arguments go to every `throttlectl http` (the bench compares
# per-table signals); the checks apply only without them.  Prints one line
# of figures.  HOSTS=2 (test_redis_scope_fleet.sh, with THROTTLE_BACKEND
# set) runs every other loader on a second segment: a second "host" that
# shares only the backend with the first.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
case "$B" in /*) ;; *) B="$top/$B" ;; esac
CTL="$B/throttlectl"
command -v python3 >/dev/null 2>&1 || { echo "SKIP: needs python3"; exit 77; }
"$CTL" http --help >/dev/null 2>&1 || { echo "SKIP: no throttlectl http"; exit 77; }

L=3 R=1 TABLES=4 PROCS=16 JOBS=32
tmp=$(mktemp -d "${TMPDIR:-/tmp}/scope-fleet.XXXXXX")
seg="/tt-${TH_TEST_TAG:-}scope-fleet-$$"
HOSTS=${HOSTS:-1}
srv=""
cleanup() {
  [ -n "$srv" ] && { kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null; }
  "$CTL" --segment "$seg" rm >/dev/null 2>&1
  "$CTL" --segment "$seg-b" rm >/dev/null 2>&1
  rm -rf "$tmp"
}
trap cleanup EXIT
. "$top/tests/mock_lib.sh"
mock_start "$top/tests" "$tmp" --retry-after "$R" --service-ms 50 \
  --concurrency 4 || { echo "FAIL: mock server did not start"; exit 1; }

i=0
while [ $i -lt $JOBS ]; do
  echo "row $i" >"$tmp/f$i"
  echo "$i t$((i % TABLES))"
  i=$((i + 1))
done >"$tmp/jobs"
cat >"$tmp/job.sh" <<JOB
#!/bin/sh
seg="$seg"
[ \$((\$1 % $HOSTS)) = 1 ] && seg="$seg-b"
exec "$CTL" --segment "\$seg" http "hotdata:\$3/\$2" --timeout 60 $* \
  --data-binary @"$tmp/f\$1" -o /dev/null \
  "$U/v1/workspaces/\$3/tables/\$2/load"
JOB
post() { # path json
  python3 -c "import sys, urllib.request as u; u.urlopen(u.Request('$U' + sys.argv[1], data=sys.argv[2].encode()))" "$1" "$2"
}
post /admin/overload "{\"workspace\": \"ws1\", \"seconds\": $L}"
t0=$(date +%s.%N)
sed 's/$/ ws1/' "$tmp/jobs" | xargs -P $PROCS -L 1 sh "$tmp/job.sh" 2>"$tmp/err"
rc=$?
t1=$(date +%s.%N)
python3 - "$U" "$rc" "$t0" "$t1" "$L" "$R" "$TABLES" "$JOBS" "$#" <<'PY'
import json, sys, urllib.request
u, rc, t0, t1, L, R, T, J, extra = sys.argv[1:]
s = json.load(urllib.request.urlopen(u + "/stats"))
w = s["workspaces"]["ws1"]
ok = s["loads_ok"]
# one per Retry-After, +2 (the window's edges), for the whole workspace
limit = int(L) // int(R) + 2
print("scope fleet%s: %d loaded of %s, 429 %d (bound %d), early %d "
      "(race %d), max in service %d, %.2f s" % (
          " (per-table signals)" if extra != "0" else "", ok, J,
          w["rate_limited"], limit, w["early"], w["early_race"],
          w["max_in_service"], float(t1) - float(t0)))
bad = []
if ok != int(J) or rc != "0":
    bad.append("not every file loaded (xargs %s)" % rc)
if extra == "0":
    if w["rate_limited"] > limit:
        bad.append("more 429s than one per Retry-After")
    if w["early"] > 0:
        bad.append("requests before the workspace's advertised time")
for b in bad:
    print("FAIL: " + b)
sys.exit(1 if bad else 0)
PY
st=$?
[ $st -eq 0 ] || sed -n 1,20p "$tmp/err"

# Where one 429 goes: the root scope by default, the key with
# --publish 429=key (a sibling table stays open).
for ws in ws2 ws3; do
  post /admin/overload "{\"workspace\": \"$ws\", \"seconds\": 30}"
done
one() { # ws, extra options: one request, refused, no retry
  _ws=$1
  shift
  "$CTL" --segment "$seg" http "hotdata:$_ws/t0" --retries 0 --timeout 10 \
    "$@" -d x -o /dev/null "$U/v1/workspaces/$_ws/tables/t0/load" 2>/dev/null
}
sibling_open() { "$CTL" --segment "$seg" wait "hotdata:$1/t1" --timeout 0 \
  >/dev/null 2>&1; }
one ws2 --publish 429=key
if ! sibling_open ws2; then
  echo "FAIL: --publish 429=key held a sibling table"; st=1
fi
one ws3
if sibling_open ws3; then
  echo "FAIL: a 429 did not hold the workspace's other tables"; st=1
fi

# A pool of 3 over the 4 tables of ws4 (each table admits 4 at once, each
# key is capped at 8): 16 processes, 32 files; the workspace never has
# more than 3 writes in service at once.
"$CTL" --segment "$seg" set hotdata:ws4 --max-parallel 3 >/dev/null || st=1
i=0
while [ $i -lt $TABLES ]; do
  "$CTL" --segment "$seg" set "hotdata:ws4/t$i" --max-parallel 8 >/dev/null || st=1
  i=$((i + 1))
done
sed 's/$/ ws4/' "$tmp/jobs" | xargs -P $PROCS -L 1 sh "$tmp/job.sh" 2>"$tmp/err"
rc=$?
python3 - "$U" "$rc" "$JOBS" <<'PY' || st=1
import json, sys, urllib.request
u, rc, J = sys.argv[1:]
w = json.load(urllib.request.urlopen(u + "/stats"))["workspaces"]["ws4"]
print("pool of 3 over 4 tables: %d loaded of %s, at most %d in service "
      "across the workspace" % (w["loads_ok"], J, w["max_in_service"]))
bad = w["loads_ok"] != int(J) or rc != "0" or w["max_in_service"] > 3
if bad:
    print("FAIL: the pool did not hold")
sys.exit(1 if bad else 0)
PY

# ls shows the tree: the pool, its 4 tables indented beneath it, the sums.
"$CTL" --segment "$seg" ls >"$tmp/ls" || st=1
grep -q '^hotdata:ws4 .*4 keys beneath: 0 in flight, 0 waiting' "$tmp/ls" &&
  [ "$(grep -c '^  hotdata:ws4/t[0-3] ' "$tmp/ls")" = 4 ] ||
  { echo "FAIL: ls does not show the tree"; cat "$tmp/ls"; st=1; }
"$CTL" --segment "$seg" ls --json | python3 -c '
import json, sys
k = {x["key"]: x for x in json.load(sys.stdin)["keys"]}
assert k["hotdata:ws4/t0"]["scope"] == "hotdata:ws4"
assert k["hotdata:ws4"]["scope"] is None
assert k["hotdata:ws4"]["beneath"]["keys"] == 4
' || { echo "FAIL: ls --json does not carry the scope"; st=1; }
{ "$CTL" --segment "$seg" show hotdata:ws4 --json &&
  "$CTL" --segment "$seg" show hotdata:ws4/t2 --json; } | python3 -c '
import json, sys
pool, key = (json.loads(line) for line in sys.stdin)
assert pool["scope"] is None and pool["beneath"]["keys"] == 4, pool
assert key["scope"] == "hotdata:ws4" and key["beneath"]["keys"] == 0, key
' || { echo "FAIL: show --json does not carry the scope"; st=1; }
"$CTL" --segment "$seg" show hotdata:ws4 |
  grep -q '^beneath: 4 keys, 0 in flight, 0 waiting$' ||
  { echo "FAIL: show SCOPE does not sum the keys beneath"; st=1; }

# metrics carry the scope: a label on every key's samples, and sums per
# scope; one admission held on hotdata:ws4/t1 shows in the pool's own row
# and in the sum beneath it.
"$CTL" --segment "$seg" run hotdata:ws4/t1 -- sh -c "touch '$tmp/in'; sleep 30" &
held=$!
i=0
while [ ! -e "$tmp/in" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
"$CTL" --segment "$seg" metrics >"$tmp/m.txt" || st=1
kill "$held" 2>/dev/null
wait "$held" 2>/dev/null
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3 # Debian's modules
"$PY" - "$tmp/m.txt" <<'PY' || { echo "FAIL: metrics do not carry the scope"; st=1; }
import sys
from prometheus_client.parser import text_string_to_metric_families
fams = {f.name: f for f in text_string_to_metric_families(open(sys.argv[1]).read())}
def value(fam, **labels):
    for s in fams[fam].samples:
        if all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError((fam, labels))
assert value("throttle_key_in_flight", key="hotdata:ws4/t1", scope="hotdata:ws4") == 1
assert value("throttle_key_in_flight", key="hotdata:ws4") == 1  # the pool's place
assert all("scope" not in s.labels for s in fams["throttle_key_cap"].samples
           if s.labels["key"] == "hotdata:ws4")  # a root: no scope label
assert value("throttle_key_cap", key="hotdata:ws4") == 3
assert value("throttle_scope_keys", scope="hotdata:ws4") == 4
assert value("throttle_scope_in_flight", scope="hotdata:ws4") == 1
assert value("throttle_scope_waiting", scope="hotdata:ws4", **{"class": "live"}) == 0
print("metrics: scope label and per-scope sums")
PY
if command -v promtool >/dev/null 2>&1; then
  promtool check metrics <"$tmp/m.txt" || { echo "FAIL: promtool"; st=1; }
fi
exit $st
