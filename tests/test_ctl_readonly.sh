#!/bin/sh
# SPDX-License-Identifier: MIT
# test_ctl_readonly.sh — root inspects a segment made by another user
# (nobody) with ls, show, watch and metrics: it is opened read-only and
# left byte-for-byte as it was; a command that would change it is refused
# without advice to remove it; a user without read permission is told how
# to read it (as root), not to remove it.  Needs root and setpriv
# (util-linux); skipped, saying so, otherwise.
. "$(dirname "$0")/ctl_lib.sh"
if [ "$(id -u)" -ne 0 ] || ! command -v setpriv >/dev/null; then
  echo "SKIP needs root and setpriv (running as uid $(id -u))"; exit 0
fi
# nobody must be able to run the binary: a copy in a directory it can read.
chmod 755 "$tmp"
cp "$T" "$tmp/throttlectl"
as() { # user group command...
  u=$1; g=$2; shift 2
  setpriv --reuid="$u" --regid="$g" --clear-groups "$@"
}
nobody_group=$(id -gn nobody)
rm_as_nobody() { as nobody "$nobody_group" "$tmp/throttlectl" --segment "$SEG" rm >/dev/null 2>&1; }
cleanup_hooks="rm_as_nobody"

as nobody "$nobody_group" "$tmp/throttlectl" --segment "$SEG" backoff orders 60
check "nobody creates its segment" 0 $?
as nobody "$nobody_group" "$tmp/throttlectl" --segment "$SEG" set orders --max-parallel 2
file="/dev/shm${SEG}"
check "the segment is nobody's" "nobody 600" "$(stat -c '%U %a' "$file")"
cp "$file" "$tmp/before"

out=$("$T" --segment "$SEG" ls 2>"$tmp/err")
check "root: ls exits 0" 0 $?
check_true "root: ls shows nobody's key" contains "$out" "orders"
check "root: ls says nothing on stderr" "" "$(cat "$tmp/err")"
"$T" --segment "$SEG" ls --json | "$PY" -c '
import json, sys
d = json.load(sys.stdin)
assert d["readonly"] is True and d["keys"][0]["key"] == "orders"
assert d["keys"][0]["cap"] == 2'
check "root: ls --json says read-only" 0 $?
"$T" --segment "$SEG" show orders >/dev/null
check "root: show exits 0" 0 $?
"$T" --segment "$SEG" metrics | grep -q "^throttle_key_cap{segment=\"$SEG\",key=\"orders\"} 2$"
check "root: metrics shows the key" 0 $?
"$T" --segment "$SEG" watch --interval 0.1 >"$tmp/watch.txt" 2>&1 &
w=$!
i=0
while [ "$(lines '^orders ' "$tmp/watch.txt")" -lt 3 ] && [ $i -lt 200 ]; do
  sleep 0.05; i=$((i + 1)); done
kill -INT $w; wait $w
check "root: watch exits 0" 0 $?
check_true "root: watch says read-only" contains "$(cat "$tmp/watch.txt")" "(read-only)"
"$T" --segment "$SEG" segments >/dev/null 2>&1
cmp "$tmp/before" "$file"
check "the segment is byte-for-byte unchanged by ls/show/watch/metrics" 0 $?

# A change is refused, and the message does not tell root to remove it.
"$T" --segment "$SEG" clear orders 2>"$tmp/err"
check "root: clear on nobody's segment fails" 1 $?
check_true "root: the refusal names the owner" contains "$(cat "$tmp/err")" "owned by uid"
cmp "$tmp/before" "$file"
check "the segment is unchanged after the refused clear" 0 $?

# Another user, who may not read it, is told how to read it.
out=$(as daemon "$(id -gn daemon)" "$tmp/throttlectl" --segment "$SEG" ls 2>&1)
check "daemon: ls fails" 1 $?
check_true "daemon: told how to read it" contains "$out" "sudo throttlectl --segment $SEG ls"
if contains "$out" "throttlectl rm" || contains "$out" "remove"; then
  echo "FAIL daemon: advised to remove it: $out"; fails=$((fails + 1))
else echo "ok   daemon: not advised to remove it"; fi

# Group read permission is enough: daemon in nobody's group, mode 0640.
chmod 640 "$file"
cp "$file" "$tmp/before"
as daemon "$nobody_group" "$tmp/throttlectl" --segment "$SEG" ls >"$tmp/out" 2>&1
check "a reader by group permission: ls exits 0" 0 $?
check_true "a reader by group permission sees the key" contains "$(cat "$tmp/out")" "orders"
cmp "$tmp/before" "$file"
check "the segment is unchanged by the group reader" 0 $?
finish
