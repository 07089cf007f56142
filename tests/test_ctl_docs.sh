#!/bin/sh
# SPDX-License-Identifier: MIT
# test_ctl_docs.sh — the documentation cannot drift from what is built:
#   - every function the shared libraries export has its entry in
#     libthrottle(3) or throttle_curl(3), and every THROTTLE_EXTERN function
#     of the headers is exported;
#   - throttlectl(1) has an entry for every command and every option that
#     `--help` and `COMMAND --help` show, and for every environment variable
#     --help lists; that list holds every THROTTLE_* variable the library
#     and the Redis module read (their sources);
#   - each man page passes lexgrog (its NAME line is one whatis reads);
#   - the README's apt-get line has every package tools/deps.sh installs;
#   - the README's `ls` legend explains the cold-scope row throttlectl
#     shows.
. "$(dirname "$0")/ctl_lib.sh"
ctl=$T
man1="$top/docs/man/throttlectl.1.scd"
man3="$top/docs/man/libthrottle.3.scd $top/docs/man/throttle_curl.3.scd"

# ---- the C API ----
for so in "$B/libthrottle.so.1" "$B/libthrottle-curl.so.1"; do
  nm -D --defined-only "$so" | awk '$2 == "T" { sub(/@.*/, "", $3); print $3 }'
done | sort -u >"$tmp/exported"
check_true "the libraries export functions" test -s "$tmp/exported"
missing=""
while read -r f; do
  # an entry: a bold line naming f as a function
  grep -q -E "^\*.*[ *]$f\(" $man3 || missing="$missing $f"
done <"$tmp/exported"
check "every exported function has its man page entry" "" "$missing"
cat "$top/include/throttle.h" "$top/include/throttle_curl.h" | tr -s '\n\t' '  ' |
  grep -o -E 'THROTTLE_EXTERN [^;(]*[ *]throttle_[a-z0-9_]*\(' |
  sed 's/.*[ *]\(throttle_[a-z0-9_]*\)($/\1/' | sort -u >"$tmp/declared"
check_true "the headers declare functions" test -s "$tmp/declared"
check "the headers' functions are exactly the exported ones" "" \
  "$(comm -3 "$tmp/declared" "$tmp/exported" | tr -s ' \t\n' ' ' | sed 's/ $//')"

# ---- throttlectl(1) against --help ----
"$ctl" --help >"$tmp/help"
cmds=$(sed -n '/^commands:/,/^$/p' "$tmp/help" | sed -n 's/^  \([a-z][a-z-]*\)\( .*\)\{0,1\}$/\1/p' | sort -u)
check_true "--help lists commands" test -n "$cmds"
missing=""
for c in $cmds; do
  grep -q -E "^\*$c[* ]" "$man1" || missing="$missing $c"
done
check "throttlectl(1) has an entry for every command" "" "$missing"
opts=$( { cat "$tmp/help"; for c in $cmds; do "$ctl" "$c" --help; done; } |
  grep -o -E -- '--[a-z][a-z-]+' | sort -u)
missing=""
for o in $opts; do
  grep -q -E -- "^\*(-[a-zA-Z][^*]*\*, \*)?$o[* ]" "$man1" || missing="$missing $o"
done
check "throttlectl(1) has an entry for every option of --help" "" "$missing"
check_true "  auto:MAX among them" grep -q -E -- '^\*--max-parallel [^*]*auto:MAX' "$man1"
vars=$(sed -n '/^environment:/,/^$/p' "$tmp/help" | sed -n 's/^  \(THROTTLE_[A-Z_]*\) .*/\1/p')
check_true "--help lists the environment" test -n "$vars"
env_section=$(sed -n '/^# ENVIRONMENT/,/^# /p' "$man1")
missing=""
for v in $vars; do
  printf '%s\n' "$env_section" | grep -q "^\*$v\*" || missing="$missing $v"
done
check "throttlectl(1) documents every variable --help lists" "" "$missing"
# What the sources read: getenv("THROTTLE_...") and the number reader.
read_vars=$(grep -h -o -E '(getenv|throttle__env_number)\("THROTTLE_[A-Z_]*"' \
  "$top"/libthrottle/*/*.c | sed 's/.*"\(THROTTLE_[A-Z_]*\)"/\1/' | sort -u)
missing=""
for v in $read_vars; do
  [ "$v" = THROTTLE_CRASH_AT ] && continue # test builds only
  printf '%s\n' "$vars" | grep -q -x "$v" || missing="$missing $v"
done
check "--help lists every variable the library reads" "" "$missing"

# ---- lexgrog ----
make -C "$top" --no-print-directory B="$B" man >/dev/null 2>&1
for m in "$B"/man/*.[13]; do
  out=$(lexgrog "$m" 2>&1)
  check "lexgrog $(basename "$m")" 0 $?
  check_true "  it reads a name and a description" contains "$out" " - "
done

# ---- README ----
pkgs=$(sed -n '/^for p in/,/; do$/p' "$top/tools/deps.sh" | tr ' \\;' '\n\n\n' |
  grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -v -x -E 'for|p|in|do')
check_true "tools/deps.sh lists packages" test -n "$pkgs"
apt=$(sed -n '/sudo apt-get install -y/,/^$/p' "$top/README.md")
missing=""
for p in $pkgs; do
  printf '%s\n' "$apt" | tr ' \\' '\n\n' | grep -q -x -- "$p" || missing="$missing $p"
done
check "README's apt-get line has every build and test dependency" "" "$missing"

# A cold scope as ls shows it: a key beneath a scope nobody set anything
# on, its first request out.
"$ctl" run cold:ws1/t -- sleep 60 >/dev/null 2>&1 &
runner=$!
stop_runner() { kill "$runner" 2>/dev/null; wait "$runner" 2>/dev/null; }
cleanup_hooks="$cleanup_hooks stop_runner"
i=0
until "$ctl" ls 2>/dev/null | grep -q '^cold:ws1 ' || [ $i -ge 200 ]; do
  sleep 0.05; i=$((i + 1))
done
row=$("$ctl" ls | grep '^cold:ws1 ')
state=$(printf '%s\n' "$row" | awk '{print $9}' | cut -d, -f1,2)
check "the cold scope's row reads episode,probe" "episode,probe" "$state"
check_true "README's legend explains that row" grep -q 'cold scope.*row' "$top/README.md"
check_true "  with that STATE" sh -c "tr -s '\n ' '  ' <'$top/README.md' | grep -q 'cold scope.*STATE. .episode,probe.: nothing was refused'"
check_true "throttlectl(1) too" sh -c "tr -s '\n\t ' '   ' <'$man1' | grep -q 'cold scope.*STATE\* \*episode,probe\*: nothing was refused'"
stop_runner

finish
