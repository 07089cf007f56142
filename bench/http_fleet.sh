#!/bin/sh
# SPDX-License-Identifier: MIT
# http_fleet.sh — fleets of real `throttlectl http` processes loading one
# table of the mock API (tests/mock_server.py), as a user would run them,
# each row printed as a ratio to the ideal makespan MEASURED IN THE SAME RUN.
#
# A fleet of N processes and J jobs is `xargs -P N` over the jobs: each job
# is one `throttlectl http` process (one POST of one file), so N loaders are
# alive at any time and each takes the next job when its own is done, as
# the `xargs -P 8` backfill in docs/throttlectl.md does.  Every run has its
# own table and its own fresh segment, so no run sees another's learned
# state, except the "warm" rows: the same fleet again, on the segment (and
# the key) the run above it left, as a loader meets a table it has written
# to before (the learned cap survives in the segment).
#
# Rows (full size; BENCH_QUICK=1 runs fewer jobs where that keeps the row
# meaningful):
#   serialised   table admits 1 write at once, Retry-After 1 s, 150 ms per
#                write, 48 processes, 200 jobs: learned (auto) cap, and an
#                operator's --max-parallel 1
#   ra5          serialised, Retry-After 5 s, 200 ms, 12 processes, 48 jobs,
#                auto cap (a failed raise of the cap idles the table 5 s)
#   par4         table admits 4 at once, 150 ms, 16 processes, 200 jobs:
#                auto cap, and processes that each honour Retry-After alone
#                (curl in a loop: no shared state; the reference the learned
#                cap must beat)
#   hold         serialised, the table held by somebody else for 5 s from
#                the start, 8 processes, 24 jobs, 150 ms, auto cap (about
#                one refused request per Retry-After is the floor)
#   uncontended  throttle_enter + throttle_leave with nobody else on the
#                key: bench/bench_admit's ratio to clock_gettime and its
#                system calls per pair (run again here for the row)
#
# "before (quoted)": the learned-cap and uncontended figures as they were
# measured before the learner's rules and the cheap uncontended path, a
# quotation for comparison, not measured in this run.
#
# The ideal.  For each server shape the same jobs are first sent by one
# curl process with exactly C transfers at once (curl --parallel-max C, C =
# what the table admits at once): never refused, no gap between one write
# and the next but the server's own, so it measures what the server can do
# on this machine now (its sleeps overshoot under load).  "x ideal" is a
# fleet's makespan over that measured makespan (plus the hold for the hold
# row); "x calc" over jobs x S / C.  Rejected: running the ideal as C
# sequential `throttlectl http` processes: each job's process start-up then
# shows as idle server time, which a larger fleet hides (its next process is
# already waiting), so a fleet beat its own "ideal".
# refused / early / race / max: the mock's per-table 409 count, requests
# that came before the Retry-After the table had been given (contract I1),
# those of them that came within 50 ms of the refusal that set the time
# (most likely admitted before the refused process could publish it), and
# the most writes it had in service at once.
#
#   B=build [BENCH_QUICK=1] sh bench/http_fleet.sh
#
# Full: about 4 minutes (mostly the serialised rows: 4 x 30 s of ideal
# work); quick: about 2 minutes.  Needs python3 and curl; builds nothing.
# Prints the table; exits 1 only when the benchmark itself could not run.
set -u

top=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
case "$B" in /*) ;; *) B="$top/$B" ;; esac
CTL="$B/throttlectl"
QUICK=${BENCH_QUICK:-0}
[ "$QUICK" = 0 ] || [ "$QUICK" = 1 ] || { echo "BENCH_QUICK must be 0 or 1" >&2; exit 64; }

"$CTL" http --help >/dev/null 2>&1 || {
  echo "http_fleet: $CTL http is not available (run make)" >&2; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "http_fleet: needs python3" >&2; exit 1; }
command -v curl >/dev/null 2>&1 || { echo "http_fleet: needs curl" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/http-fleet.XXXXXX")
srv=""
segs=""
cleanup() {
  if [ -n "$srv" ]; then kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null; fi
  for s in $segs; do "$CTL" --segment "$s" rm >/dev/null 2>&1; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now() { date +%s.%N; }

# ---- the mock server --------------------------------------------------------------

. "$top/tests/mock_lib.sh"
server_start() { # mock options...
  mock_start "$top/tests" "$tmp" "$@" || {
    echo "http_fleet: the mock server did not start" >&2; exit 1; }
  URL=$U
}
server_stop() {
  kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null
  srv=""
}
admin() { # what json
  curl -sf -o /dev/null -X POST -d "$2" "$URL/admin/$1" || {
    echo "http_fleet: admin $1 failed" >&2; exit 1; }
}

# ---- the clients ------------------------------------------------------------------

# Processes that each honour Retry-After alone: curl in a loop, no shared
# state, no jitter (each sleeps exactly what it was told).
cat >"$tmp/alone.sh" <<'EOF'
url=$1 tries=0
while [ $tries -lt 1000 ]; do
  out=$(curl -s -o /dev/null -X POST -d x -w '%{http_code} %header{retry-after}' "$url")
  case $out in
    2*) exit 0 ;;
    409\ *|429\ *|503\ *) ra=${out#* }; sleep "${ra:-1}" ;;
    *) exit 1 ;;
  esac
  tries=$((tries + 1))
done
exit 75
EOF

# One fleet: N processes, J jobs, of client CLIENT (auto | capN
# (--max-parallel N) | alone | ideal: one curl, N transfers at once) on
# table TABLE.  Writes "$tmp/NAME.time" (start and end times and the
# parameters) and "$tmp/NAME.stats" (/stats after the run).
fleet() { # name client procs jobs table [hold_ms]
  name=$1 client=$2 procs=$3 jobs=$4 table=$5 hold=${6:-0}
  seg="/thr-hfleet-$$-$table" # one segment per table: warm runs reuse it
  case " $segs " in
    *" $seg "*) ;;
    *) segs="$segs $seg"; "$CTL" --segment "$seg" rm >/dev/null 2>&1 ;;
  esac
  key="hotdata:ws1/$table"
  url="$URL/v1/tables/$table/load"
  case $client in
    auto) cmd="$CTL --segment $seg http $key --max-parallel auto" ;;
    cap*) cmd="$CTL --segment $seg http $key --max-parallel ${client#cap}" ;;
    alone) cmd="sh $tmp/alone.sh" ;;
    ideal) ;;
    *) echo "http_fleet: unknown client $client" >&2; exit 1 ;;
  esac
  case $client in
    alone|ideal) ;;
    *) cmd="$cmd -X POST -d x -o /dev/null --retries 1000 --timeout 600" ;;
  esac
  admin reset '{}'
  [ "$hold" -gt 0 ] && admin hold "{\"table\": \"$table\", \"ms\": $hold}"
  if [ "$client" = ideal ]; then
    seq "$jobs" | sed "s|.*|url = \"$url\"|" >"$tmp/$name.urls"
    t0=$(now)
    curl -s --no-progress-meter -X POST -d x --parallel --parallel-max "$procs" -K "$tmp/$name.urls" \
      >/dev/null 2>"$tmp/$name.err"
    t1=$(now)
  else
    t0=$(now)
    # shellcheck disable=SC2086 # cmd is split on purpose
    seq "$jobs" | xargs -P "$procs" -I{} $cmd "$url" 2>"$tmp/$name.err"
    t1=$(now)
  fi
  curl -sf "$URL/stats" >"$tmp/$name.stats" || {
    echo "http_fleet: /stats failed" >&2; exit 1; }
  echo "$t0 $t1 $procs $jobs $table $client $hold" >"$tmp/$name.time"
}

# ---- the runs ---------------------------------------------------------------------

if [ "$QUICK" = 1 ]; then SER_JOBS=60 PAR_JOBS=100; else SER_JOBS=200 PAR_JOBS=200; fi
RA5_JOBS=48 HOLD_JOBS=24 HOLD_MS=5000
start=$(now)

echo "http fleets: throttlectl http processes against tests/mock_server.py" \
  "($( [ "$QUICK" = 1 ] && echo "BENCH_QUICK=1, fewer jobs" || echo full))"

server_start --service-ms 150 --retry-after 1
fleet ser.ideal ideal 1 "$SER_JOBS" ser_ideal
fleet ser.auto auto 48 "$SER_JOBS" ser_auto
fleet ser.warm auto 48 "$SER_JOBS" ser_auto
fleet ser.cap1 cap1 48 "$SER_JOBS" ser_cap1
fleet hold.ideal ideal 1 "$HOLD_JOBS" hold_ideal
fleet hold.auto auto 8 "$HOLD_JOBS" hold_auto "$HOLD_MS"
server_stop

server_start --service-ms 200 --retry-after 5
fleet ra5.ideal ideal 1 "$RA5_JOBS" ra5_ideal
fleet ra5.auto auto 12 "$RA5_JOBS" ra5_auto
fleet ra5.warm auto 12 "$RA5_JOBS" ra5_auto
server_stop

server_start --service-ms 150 --retry-after 1 --concurrency 4
fleet par4.ideal ideal 4 "$PAR_JOBS" par4_ideal
fleet par4.auto auto 16 "$PAR_JOBS" par4_auto
fleet par4.warm auto 16 "$PAR_JOBS" par4_auto
fleet par4.alone alone 16 "$PAR_JOBS" par4_alone
server_stop

# The uncontended row of the same table: bench_admit's figures of this run
# (make bench builds it), its ratio and system calls per pair.
admit=""
if [ -x "$B/bench/bench_admit" ]; then
  admit=$("$B/bench/bench_admit" 2>/dev/null | sed -n \
    -e 's/^  CPU time: .* = \([0-9.]*\) x clock_gettime.*/\1x clock_gettime (CPU time)/p' \
    -e 's/^syscalls per pair: \([0-9.]*\) .*/\1 syscalls/p' \
    -e 's/^syscalls per pair: unknown.*/syscalls unknown/p' | paste -sd, -)
fi

python3 - "$tmp" "$admit" <<'EOF' || exit 1
import json, sys
tmp = sys.argv[1]
admit = sys.argv[2].replace(",", ", ")

def run(name):
    t0, t1, procs, jobs, table, client, hold = \
        open("%s/%s.time" % (tmp, name)).read().split()
    st = json.load(open("%s/%s.stats" % (tmp, name)))
    t = st["tables"].get(table, {})
    return dict(makespan=float(t1) - float(t0), procs=int(procs),
                jobs=int(jobs), client=client, hold=int(hold) / 1000.0,
                ok=t.get("loads_ok", 0), refused=t.get("refused", 0),
                early=t.get("early", 0), race=t.get("early_race", 0),
                max=t.get("max_in_service", 0),
                conc=t.get("concurrency", 1))

# (label, fleet run, its ideal run, service s, Retry-After s, before, goal)
# before: the learned-cap rows as measured before the learner's rules and
# the cheap uncontended path (quoted, not measured here).
rows = [
    ("serialised, auto cap", "ser.auto", "ser.ideal", 0.150, 1,
     "1.10x, 3 ref", "<= 1.05x, <= 3 refused, 0 early"),
    ("  the same again, warm", "ser.warm", "ser.ideal", 0.150, 1,
     "", "(learned state kept)"),
    ("serialised, operator cap 1", "ser.cap1", "ser.ideal", 0.150, 1,
     "", "0 refused, 0 early"),
    ("serialised, Retry-After 5 s, auto", "ra5.auto", "ra5.ideal", 0.200, 5,
     "1.5x, 1 ref", "<= 1.20x, 0 early"),
    ("  the same again, warm", "ra5.warm", "ra5.ideal", 0.200, 5,
     "", "(learned state kept)"),
    ("admits 4 at once, auto cap", "par4.auto", "par4.ideal", 0.150, 1,
     "1.9x", "<= 1.20x, <= 5 refused, 0 early"),
    ("  the same again, warm", "par4.warm", "par4.ideal", 0.150, 1,
     "", "(learned state kept)"),
    ("admits 4, each alone (curl loop)", "par4.alone", "par4.ideal", 0.150, 1,
     "", "(reference)"),
    ("held 5 s externally, auto cap", "hold.auto", "hold.ideal", 0.150, 1,
     "", "~1 refused per Retry-After, 0 early"),
]
hdr = ("scenario", "N", "jobs", "C", "RA", "makespan", "ideal", "x ideal",
       "x calc", "refused", "early", "race", "failed", "max", "before (quoted)",
       "goal")
fmt = "%-34s %3s %4s %2s %2s %8s %7s %7s %6s %7s %5s %4s %6s %3s  %-15s  %s"
print()
print(fmt % hdr)
for label, name, ideal_name, s, ra, before, goal in rows:
    r, i = run(name), run(ideal_name)
    ideal = i["makespan"] + r["hold"]
    calc = r["jobs"] * s / r["conc"] + r["hold"]
    print(fmt % (label, r["procs"], r["jobs"], r["conc"], ra,
                 "%.2f s" % r["makespan"], "%.2f" % ideal,
                 "%.2f" % (r["makespan"] / ideal),
                 "%.2f" % (r["makespan"] / calc), r["refused"], r["early"],
                 r["race"], r["jobs"] - r["ok"], r["max"], before, goal))
if admit:
    print("%-34s %s  before (quoted): ~40x clock_gettime, 4 syscalls  goal: "
          "<= 8x, 0 syscalls" % ("uncontended enter + leave", admit))
print()
print("ideal: the same jobs sent by one curl, C at once (never refused), "
      "measured in the same run;")
print("  x calc: over jobs x S / C (no per-process cost); N processes, C "
      "writes the table admits at once,")
print("  RA Retry-After s; refused = 409s; early = before the table's "
      "Retry-After (I1); max = most in service")
print("  race: of the early, those within 50 ms of the refusal that set the "
      "time (most likely admitted\n  before the refused process could "
      "publish it: in flight, not a wrong wait)")
ideals = ["ser.ideal", "ra5.ideal", "par4.ideal", "hold.ideal"]
print("  measured ideals: " + ", ".join(
    "%s %.2f s (%d jobs)" % (n.split(".")[0], run(n)["makespan"], run(n)["jobs"])
    for n in ideals))
EOF
for f in "$tmp"/*.err; do
  [ -s "$f" ] && { echo "stderr of $(basename "$f" .err):"; head -n 5 "$f"; }
done
printf 'total runtime %.0f s\n' "$(python3 -c "print($(now) - $start)")"
