#!/bin/sh
# SPDX-License-Identifier: MIT
# test_ctl_http_edges.sh — `throttlectl http` at the edges a script or an
# operator meets, against tests/scenario_server.py: server text never
# reaches the terminal raw (C0, C1, -v and errors); header names are whole
# tokens; --timeout near 2^64 still sends and a default bounds each
# transfer; -o FILE is created only when a 2xx body arrives, an existing
# FILE is kept when the answer is cut short, nothing temporary is left;
# --compressed decodes like curl's.  Checks are on exit statuses, files,
# bytes and the server's log, never on how fast anything ran.
name=ctl-http-edges
. "$(dirname "$0")/scenario.sh"

# ---- what reaches the terminal ---------------------------------------------
# error.code with ESC ] 0 ; (retitle) and ESC [ 2 J (clear), and a C1 CSI
# both UTF-8-encoded (U+009B) and in the key as a raw byte.
esc="/esc?status=409&code=X%1B%5D0%3Bpwned%07%1B%5B2J%C2%9BY"
guard "$ctl" http -v "k-$(printf '\233')-x" "$U$esc" >"$tmp/out" 2>"$tmp/err"
check "409 with control bytes: exit 1" 1 $?
has_hex "no ESC reaches stderr" "$tmp/err" " 1b "
has_hex "no BEL reaches stderr" "$tmp/err" " 07 "
has_hex "no UTF-8 C1 reaches stderr" "$tmp/err" " c2 9b "
has_hex "no raw C1 reaches stderr" "$tmp/err" " 9b "
grep -q 'X\\x1b\]0;pwned\\x07\\x1b\[2J\\u009bY' "$tmp/err"
check "the code is shown escaped" 0 $?
grep -q 'k-\\x9b-x' "$tmp/err"
check "the key is shown escaped" 0 $?

# A key with a control byte (ESC) is refused; ls and show print keys read
# from shared memory with the same rule as messages (C1 bytes escaped).
"$ctl" backoff "c1-$(printf '\033')]0;t" 30 >/dev/null 2>&1
check "a key with ESC: usage error" 64 $?
"$ctl" backoff "c1-$(printf '\302\233')-$(printf '\233')-]0;t" 30 >/dev/null
"$ctl" ls >"$tmp/ls" 2>&1
has_hex "ls: no ESC" "$tmp/ls" " 1b "
has_hex "ls: no UTF-8 C1" "$tmp/ls" " c2 9b "
has_hex "ls: no raw C1" "$tmp/ls" " 9b "
"$ctl" show "c1-$(printf '\302\233')-$(printf '\233')-]0;t" >"$tmp/show" 2>&1
has_hex "show: no C1 or ESC" "$tmp/show" " 9b "
grep -q 'c1-\\u009b-\\x9b-\]0;t' "$tmp/show"
check "show: the key is shown escaped" 0 $?

# ---- arguments --------------------------------------------------------------
guard "$ctl" http k -H 'X-Bad;Name: v' "$U/hdr?n=0" >/dev/null 2>"$tmp/err"
check "-H with ';' inside the name: usage error" 64 $?
check "  and nothing was sent" 0 "$(requests '/hdr?n=0')"
guard "$ctl" http k -H 'X-Empty;' "$U/hdr2?n=0" >/dev/null 2>&1
check "-H 'Name;' still sends an empty header" 0 $?

guard "$ctl" http k --timeout 18446744073709551 "$U/big?n=0" >"$tmp/out" 2>&1
check "--timeout near 2^64 ms: sent, exit 0" 0 $?
check "  one request" 1 "$(requests '/big?n=0')"

"$ctl" http --help 2>&1 | grep -q '300 s'
check "http --help states the default transfer bound" 0 $?

guard "$ctl" http k --timeout 1 "$U/never?never=1" >/dev/null 2>"$tmp/err"
check "a server that never answers: --timeout ends it, exit 75" 75 $?

# ---- -o FILE ------------------------------------------------------------------
mkdir "$tmp/o"
printf 'old contents\n' >"$tmp/o/keep"
guard "$ctl" http k --retries 0 -o "$tmp/o/keep" \
  "$U/cut200?status=200&text=partial&cut=1" >/dev/null 2>&1
check "-o on a 2xx cut short: exit 1" 1 $?
check "  the existing file is left as it was" "old contents" "$(cat "$tmp/o/keep")"
check "  no temporary file is left" "keep" "$(ls -A "$tmp/o")"

guard "$ctl" http k -o "$tmp/o/keep" "$U/whole?status=200&text=new" >/dev/null 2>&1
check "-o on a whole 2xx: exit 0" 0 $?
check "  the file has the body" "new" "$(cat "$tmp/o/keep")"
check "  and nothing else is left" "keep" "$(ls -A "$tmp/o")"

"$ctl" backoff kheld 30 >/dev/null
guard "$ctl" http kheld -o "$tmp/o/new" "$U/held?n=0" >/dev/null 2>&1 &
p=$!
sleep 0.5
kill -INT $p
wait $p
check "-o while waiting for admission, then ^C: no file" "keep" "$(ls -A "$tmp/o")"
"$ctl" clear kheld >/dev/null

guard "$ctl" http k --compressed "$U/gz?status=200&text=hello&gzip=1" \
  >"$tmp/out" 2>/dev/null
check "--compressed decodes a gzip body" "hello" "$(cat "$tmp/out")"

# ---- a Retry-After beyond the segment's maximum delay -------------------------
# Two answers ask for an hour; the segment's maximum is 1 s, so each is
# stored and waited for as 1 s, and the user is told so once.
"$ctl" max-delay 1 >/dev/null
guard "$ctl" http kbig --retries 3 "$U/clamp?status=429&ra=3600&n=2" \
  >/dev/null 2>"$tmp/err"
check "Retry-After of an hour, maximum 1 s: exit 0 after the retries" 0 $?
check "  said once on stderr" 1 \
  "$(grep -c "warning: kbig: the server's Retry-After 1h00m is out of range; the segment's maximum delay, 1.0s, is used" "$tmp/err")"
check "  three requests" 3 "$(requests '/clamp?status=429&ra=3600&n=2')"
guard "$ctl" http -v kbig2 --retries 3 \
  "$U/clamp2?status=409&code=RESOURCE_LOCKED&ra=3600&n=1" >/dev/null 2>"$tmp/err"
check "a lock's Retry-After, with -v: said once too" 1 \
  "$(grep -c "warning: kbig2: the server's Retry-After" "$tmp/err")"
guard "$ctl" http kone --retries 3 "$U/atmax?status=429&ra=1&n=1" \
  >/dev/null 2>"$tmp/err"
check "a Retry-After at the maximum: nothing said" 0 \
  "$(grep -c "Retry-After" "$tmp/err")"
"$ctl" max-delay 900 >/dev/null

echo "test_ctl_http_edges: $fails failed"
[ "$fails" -eq 0 ]
