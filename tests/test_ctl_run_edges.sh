#!/bin/sh
# SPDX-License-Identifier: MIT
# test_ctl_run_edges.sh — `throttlectl run` with real processes and real
# signals: a FIFO for the Retry-After file does not hang it; CMD leads a
# process group of its own, and a process-group SIGTERM or timeout(1)
# reaches it once; the admission lasts until CMD's children are gone, and
# they do not outlive a kill -9 of run; --segment reaches CMD; a CMD that
# exits 75 after a forwarded signal publishes nothing.  Hang guards only,
# no timing assertions.
name=ctl-run-edges
. "$(dirname "$0")/scenario.sh"

# ---- run --------------------------------------------------------------------
guard "$ctl" run --retries 0 kf -- sh -c \
  'rm -f "$THROTTLE_RETRY_AFTER_FILE"; mkfifo "$THROTTLE_RETRY_AFTER_FILE"; exit 75' \
  >/dev/null 2>&1
check "run: a FIFO for the Retry-After file does not hang it" 75 $?
"$ctl" clear kf >/dev/null

out=$("$ctl" --segment /tt-${TH_TEST_TAG:-}edges-other-$$ run ks -- sh -c 'echo "$THROTTLE_SEGMENT"')
check "run --segment reaches CMD as THROTTLE_SEGMENT" "/tt-${TH_TEST_TAG:-}edges-other-$$" "$out"
"$ctl" --segment /tt-${TH_TEST_TAG:-}edges-other-$$ rm >/dev/null 2>&1

# Structurally: CMD leads a process group of its own, so that no signal to
# run's group reaches it directly (a second one would come from run).
out=$(setsid "$ctl" run kp -- python3 -c \
  'import os; print(os.getpgrp() != os.getpgid(os.getppid()))')
check "run: CMD runs in a process group of its own" True "$out"

# CMD counts every SIGTERM delivered to it (the wakeup fd gets a byte per
# delivery, where a shell's trap would merge two that come close together),
# says it is ready once its handler is in place, and ends 1.5 s after the
# first SIGTERM (or after 20 s).
cat >"$tmp/count.py" <<'EOF'
import os, signal, sys, time
r, w = os.pipe()
os.set_blocking(r, False)
os.set_blocking(w, False)
signal.signal(signal.SIGTERM, lambda *a: None)
signal.set_wakeup_fd(w)
open(sys.argv[1] + ".ready", "w").close()
n, end = 0, time.monotonic() + 20
while time.monotonic() < end:
    time.sleep(0.05)
    try:
        got = len(os.read(r, 100))
    except BlockingIOError:
        got = 0
    if got and n == 0:
        end = time.monotonic() + 1.5
    n += got
open(sys.argv[1], "w").write("%d\n" % n)
EOF
ready() { # file: wait for it (at most 20 s)
  i=0
  while [ ! -e "$1" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done
}
setsid "$ctl" run kg -- python3 "$tmp/count.py" "$tmp/terms" >/dev/null 2>&1 &
p=$!
ready "$tmp/terms.ready"
env kill -TERM -- -$p
wait $p
check "a SIGTERM to run's process group reaches CMD once" 1 "$(cat "$tmp/terms")"

# timeout(1) signals run, then its own group: once to CMD all the same.
rm -f "$tmp/terms" "$tmp/terms.ready"
timeout -s TERM 4 "$ctl" run kt -- python3 "$tmp/count.py" "$tmp/terms" \
  >/dev/null 2>&1
check "timeout(1) reaches CMD once" 1 "$(cat "$tmp/terms")"

# The admission lasts until CMD's children are gone.
: >"$tmp/kids"
guard "$ctl" run --max-parallel 1 kc -- sh -c \
  '(sleep 1; echo child-done >>"$0") & exit 0' "$tmp/kids" >/dev/null 2>&1
check "run returns after CMD's background child" "child-done" "$(cat "$tmp/kids")"

# A grandchild beats on a file; kill -9 of run: the beat stops.
setsid "$ctl" run --max-parallel 1 kk -- sh -c \
  'echo $$ >"$0.pid"; (while :; do echo b >>"$0"; sleep 0.1; done) & wait' \
  "$tmp/hb" >/dev/null 2>&1 &
p=$!
i=0
while [ ! -s "$tmp/hb" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
kill -KILL $p
wait $p 2>/dev/null
sleep 2.5 # the keeper's grace is 1 s
a=$(wc -l <"$tmp/hb")
sleep 0.6
b=$(wc -l <"$tmp/hb")
check "kill -9 of run: CMD's children do not outlive it" "$a" "$b"
check "  the slot is free for the next run" 0 \
  "$(guard "$ctl" run --timeout 5 kk -- true >/dev/null 2>&1; echo $?)"
g=$(cat "$tmp/hb.pid" 2>/dev/null) && env kill -KILL -- -"$g" 2>/dev/null

# CMD told to stop exits 75: nothing is published.
setsid "$ctl" run kx -- sh -c 'trap "exit 75" TERM; : >"$0"; sleep 20 & wait' \
  "$tmp/kx.ready" >/dev/null 2>"$tmp/err" &
p=$!
ready "$tmp/kx.ready"
kill -TERM $p
wait $p
check "CMD exiting 75 after a forwarded SIGTERM: run exits 75" 75 $?
"$ctl" wait kx --timeout 0 >/dev/null 2>&1
check "  and no back-off was published" 0 $?

# CMD asks for an hour twice, then succeeds; the segment's maximum is 1 s:
# told once, and each retry waits the 1 s that is stored.
"$ctl" max-delay 1 >/dev/null
guard "$ctl" run --retries 3 kbig -- sh -c \
  'n=$(cat "$0" 2>/dev/null || echo 0); echo $((n + 1)) >"$0"
   [ "$n" -ge 2 ] && exit 0; echo 3600 >"$THROTTLE_RETRY_AFTER_FILE"; exit 75' \
  "$tmp/kbig.n" >/dev/null 2>"$tmp/err"
check "CMD's Retry-After of an hour, maximum 1 s: exit 0" 0 $?
check "  said once on stderr" 1 \
  "$(grep -c "warning: kbig: CMD's Retry-After 1h00m is out of range; the segment's maximum delay, 1.0s, is used" "$tmp/err")"
check "  each retry waits the maximum" 2 "$(grep -c 'retrying after 1.0s$' "$tmp/err")"
"$ctl" max-delay 900 >/dev/null

echo "test_ctl_run_edges: $fails failed"
[ "$fails" -eq 0 ]
