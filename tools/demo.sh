#!/bin/sh
# SPDX-License-Identifier: MIT
# demo.sh — `make demo`: the main job, on a local mock of the API, twice.
#
# Eight loader processes load 24 files into ONE table of a mock Hotdata
# server that serialises writes per table (each load holds the table's
# lock for 200 ms; anyone else meanwhile gets 409 RESOURCE_LOCKED with
# "Retry-After: 1").
#
#   1. naive: today's loaders, each backing off on its own (half sleep a
#      fixed 1 s on any 409, half 1.5 s x attempt; none reads Retry-After;
#      each gives up after 6 tries) — tools/naive_loader.py;
#   2. libthrottle: `throttlectl http` per file (or examples/loader with
#      DEMO_CLIENT=loader), all sharing one throttle segment.
#
# Then prints what the server saw, side by side.  Needs python3 (standard
# library only) and the binaries `make` built; builds nothing itself.
# Takes under a minute and leaves nothing running or behind.
#
#   B=build DEMO_CLIENT=throttlectl|loader sh tools/demo.sh
set -u

top=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
case "$B" in /*) ;; *) B="$top/$B" ;; esac
# THROTTLECTL=/usr/bin/throttlectl: the demo against an installed one (the
# Debian packages in CI).
ctl=${THROTTLECTL:-$B/throttlectl}
PROCS=8
PER_PROC=3
SERVICE_MS=200
RETRY_AFTER=1
TABLE=demo
FILES=$((PROCS * PER_PROC))

# ---- which libthrottle client ------------------------------------------------

client=${DEMO_CLIENT:-}
if [ -z "$client" ]; then
  client=throttlectl
  if ! "$ctl" http --help >/dev/null 2>&1; then
    echo "note: this build's throttlectl has no 'http' command yet;" \
         "using build/examples/loader instead" >&2
    client=loader
  fi
fi
case "$client" in
  throttlectl)
    "$ctl" http --help >/dev/null 2>&1 || {
      echo "demo: $ctl http is not available (run make)" >&2; exit 1; } ;;
  loader)
    [ -x "$B/examples/loader" ] || {
      echo "demo: $B/examples/loader is missing (run make examples)" >&2; exit 1; } ;;
  *) echo "demo: DEMO_CLIENT must be throttlectl or loader" >&2; exit 64 ;;
esac
command -v python3 >/dev/null 2>&1 || { echo "demo: needs python3" >&2; exit 1; }

# ---- cleanup: nothing left running, no segment left behind -------------------

tmp=$(mktemp -d "${TMPDIR:-/tmp}/throttle-demo.XXXXXX")
seg=/libthrottle-demo-$$
srv=""
workers=""
cleanup() {
  for p in $workers; do kill "$p" 2>/dev/null; done
  for p in $workers; do wait "$p" 2>/dev/null; done
  if [ -n "$srv" ]; then
    kill "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
  fi
  "$ctl" --segment "$seg" rm >/dev/null 2>&1
  rm -f "/dev/shm$seg"
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- the mock server -----------------------------------------------------------

python3 "$top/tests/mock_server.py" --port 0 --port-file "$tmp/port" \
  --service-ms "$SERVICE_MS" --retry-after "$RETRY_AFTER" &
srv=$!
i=0
while [ ! -s "$tmp/port" ]; do
  i=$((i + 1))
  if [ $i -gt 200 ] || ! kill -0 "$srv" 2>/dev/null; then
    echo "demo: the mock server did not start" >&2; exit 1
  fi
  sleep 0.05
done
URL="http://127.0.0.1:$(cat "$tmp/port")"
KEY="hotdata:127.0.0.1/$TABLE"

# POST to the mock's admin routes; GET /stats into a file.
admin() { # what json
  python3 -c 'import sys, urllib.request as u
u.urlopen(u.Request(sys.argv[1], data=sys.argv[2].encode(), method="POST"), timeout=10).read()' \
    "$URL/admin/$1" "$2"
}
stats_to() { # file
  python3 -c 'import sys, urllib.request as u
sys.stdout.write(u.urlopen(sys.argv[1], timeout=10).read().decode())' "$URL/stats" >"$1"
}
now() { python3 -c 'import time; print("%.3f" % time.time())'; }

# The files: 24 small payloads, three per process.
mkdir "$tmp/files"
n=1
while [ $n -le $FILES ]; do
  printf 'id,value\n%d,%d\n' "$n" $((n * 7)) >"$tmp/files/part-$(printf %02d $n).csv"
  n=$((n + 1))
done
files_of() { # process index (0-based): its files
  k=1
  while [ $k -le $PER_PROC ]; do
    printf '%s ' "$tmp/files/part-$(printf %02d $(($1 * PER_PROC + k))).csv"
    k=$((k + 1))
  done
}

# ---- the workers ------------------------------------------------------------------

# One naive loader process per worker.
naive_worker() { # index
  if [ $(($1 % 2)) -eq 0 ]; then how="--strategy fixed --scale 0.2"  # 1 s
  else how="--strategy linear"; fi                                     # 1.5 s x n
  # shellcheck disable=SC2086,SC2046 # word splitting wanted
  exec python3 "$top/tools/naive_loader.py" $how "$URL" "$TABLE" $(files_of "$1")
}

# One `throttlectl http` per file, one file after the other.  A TERM ends
# the request in flight too.
ctl_worker() { # index
  cur=""
  trap '[ -n "$cur" ] && kill "$cur" 2>/dev/null; exit 143' TERM
  rc=0
  for f in $(files_of "$1"); do
    "$ctl" http "$KEY" -X POST --data-binary "@$f" -o /dev/null \
      "$URL/v1/tables/$TABLE/load" &
    cur=$!
    if wait "$cur"; then echo "$f: ok"; else rc=$?; echo "$f: exit $rc"; fi
    cur=""
  done
  exit $rc
}

loader_worker() { # index
  # shellcheck disable=SC2046 # word splitting wanted
  exec "$B/examples/loader" --key "$KEY" "$URL" "$TABLE" $(files_of "$1")
}

# Run PROCS workers of one kind at once; write the leg's stats and makespan.
leg() { # name worker-function
  admin reset '{}'
  echo "== $1: $PROCS processes, $FILES files, one table"
  t0=$(now)
  workers=""
  p=0
  while [ $p -lt $PROCS ]; do
    ( "$2" $p ) >"$tmp/$1.$p.out" 2>&1 &
    workers="$workers $!"
    p=$((p + 1))
  done
  fails=0
  for w in $workers; do wait "$w" || fails=$((fails + 1)); done
  workers=""
  t1=$(now)
  stats_to "$tmp/$1.stats"
  echo "$t0 $t1 $fails" >"$tmp/$1.time"
  # every file that did not load, and why
  cat "$tmp/$1".*.out | grep -v ': ok' | sed 's|^.*/part-|   part-|' | sort
  printf '   done in %.1f s\n' "$(python3 -c "print($t1 - $t0)")"
}

leg naive naive_worker
export THROTTLE_SEGMENT="$seg"
"$ctl" rm >/dev/null 2>&1 # a fresh segment
case "$client" in
  throttlectl) leg libthrottle ctl_worker ;;
  loader) leg libthrottle loader_worker ;;
esac
unset THROTTLE_SEGMENT

# ---- the table ------------------------------------------------------------------

python3 - "$tmp" "$FILES" "$SERVICE_MS" "$client" <<'EOF'
import json, sys
tmp, files, service_ms, client = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def leg(name):
    s = json.load(open("%s/%s.stats" % (tmp, name)))
    t0, t1, fails = open("%s/%s.time" % (tmp, name)).read().split()
    return s, float(t1) - float(t0)
ideal = files * service_ms / 1000.0
cols = [("naive (own back-off)",) + leg("naive"),
        ("libthrottle (%s)" % ("throttlectl http" if client == "throttlectl"
                               else "examples/loader"),) + leg("libthrottle")]
rows = [
    ("loads ok / failed", lambda s, m: "%d / %d" % (s["loads_ok"], files - s["loads_ok"])),
    ("409s (refused)", lambda s, m: "%d" % s["refused"]),
    ("early requests", lambda s, m: "%d" % s["early"]),
    ("requests sent", lambda s, m: "%d" % s["requests"]),
    ("makespan", lambda s, m: "%.1f s" % m),
    ("ideal (%d x %d ms)" % (files, service_ms), lambda s, m: "%.1f s" % ideal),
    ("makespan / ideal", lambda s, m: "%.2f" % (m / ideal)),
]
w0 = max(len(r[0]) for r in rows) + 2
w = max(len(c[0]) for c in cols) + 2
print()
print("".ljust(w0) + "".join(c[0].rjust(w) for c in cols))
for label, fn in rows:
    print(label.ljust(w0) + "".join(fn(s, m).rjust(w) for _, s, m in cols))
print()
print("early: requests that reached the table before the time the server had")
print("told some client to come back (Retry-After); libthrottle keeps it at 0.")
EOF
