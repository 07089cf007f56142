#!/bin/sh
# SPDX-License-Identifier: MIT
# backfill.sh — load every file under a directory into one table, N at a
# time, as backfill work that yields to live loaders of the same table.
#
#   examples/backfill.sh [-P N] [--key KEY] URL TABLE DIR
#
# Each file is one `throttlectl http` request:
#
#   find DIR -type f | xargs -P 8 -n 1 \
#     throttlectl http KEY --class backfill -X POST --data-binary @FILE \
#       URL/v1/tables/TABLE/load
#
# so eight requests are in the air at most, and all of them, and every
# other loader of the table on this host, share what the server says:
# one "409 RESOURCE_LOCKED, Retry-After: 5" holds them all back for 5 s,
# then one probes and the rest follow once it got in.  `--class backfill`
# lets live loaders of the same key go first.
#
# Prints one line per file; exit status 0 when every file loaded, 1 when
# any was refused for good (e.g. 409 CONFLICT, 400) or failed, else 75
# when any was still locked / overloaded at the end of its retries: run
# the script again for those (already loaded files are not skipped; make
# your loads idempotent, or move loaded files away).
#
# THROTTLECTL names the binary (default: throttlectl on PATH);
# THROTTLE_SEGMENT selects another throttle segment.
set -u

ctl=${THROTTLECTL:-throttlectl}
par=8
key=""
usage() { echo "usage: backfill.sh [-P N] [--key KEY] URL TABLE DIR" >&2; exit 64; }
while [ $# -gt 0 ]; do
  case "$1" in
    -P) [ $# -ge 2 ] || usage; par=$2; shift 2 ;;
    --key) [ $# -ge 2 ] || usage; key=$2; shift 2 ;;
    -h|--help) sed -n '2,26s/^# \{0,1\}//p' "$0"; exit 0 ;;
    --) shift; break ;;
    -*) usage ;;
    *) break ;;
  esac
done
[ $# -eq 3 ] || usage
url=${1%/} table=$2 dir=$3
case "$par" in ''|*[!0-9]*|0) usage ;; esac
[ -d "$dir" ] || { echo "backfill.sh: $dir: not a directory" >&2; exit 64; }

# The key every loader of this table on this host uses: hotdata:HOST/TABLE.
if [ -z "$key" ]; then
  host=$(printf '%s\n' "$url" | sed -e 's|^[A-Za-z][A-Za-z0-9+.-]*://||' \
    -e 's|^[^@/]*@||' -e 's|^\(\[[^]]*\]\).*|\1|' -e 's|[:/].*$||')
  key="hotdata:$host/$table"
fi

results=$(mktemp "${TMPDIR:-/tmp}/backfill.XXXXXX") || exit 1
trap 'rm -f "$results"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# One file: its request, and one line (also appended to $results, whole
# lines being atomic on an O_APPEND file) saying what became of it.
# shellcheck disable=SC2016
one='ctl=$1 key=$2 url=$3 results=$4 file=$5
"$ctl" http "$key" --class backfill -X POST --data-binary "@$file" \
  -o /dev/null "$url"
rc=$?
case $rc in
  0) line="$file: ok" ;;
  75) line="$file: gave up (still locked or overloaded; exit 75)" ;;
  *) line="$file: failed (exit $rc)" ;;
esac
echo "$line"
echo "$rc" >>"$results"
exit 0'

find "$dir" -type f -print0 | sort -z |
  xargs -0 -P "$par" -n 1 sh -c "$one" backfill \
    "$ctl" "$key" "$url/v1/tables/$table/load" "$results"

total=$(wc -l <"$results")
ok=$(grep -c '^0$' "$results")
tempfail=$(grep -c '^75$' "$results")
failed=$((total - ok - tempfail))
echo "backfill: $ok of $total files loaded, $failed failed, $tempfail to retry later"
[ "$failed" -gt 0 ] && exit 1
[ "$tempfail" -gt 0 ] && exit 75
exit 0
