#!/bin/sh
# SPDX-License-Identifier: MIT
# test_ctl_exit.sh — the exit statuses scripts rely on (DESIGN.md): 75 for
# every end that a later try may mend (a transport error re-sent for, a
# wait's deadline), 64 for what the caller got wrong (a URL that is no
# http(s) URL), told before anything is sent or any segment created.  The
# README's `xargs` recipe lists again whatever exited 75: a file whose
# upload hit a refused connection must be among them.  (A held segment
# mutex exiting 75 is test_throttlectl's lock_timeout_exits_75; 429, 503
# and lock answers are test_ctl_http's.)
. "$(dirname "$0")/ctl_lib.sh"
ctl=$T
# A port nothing listens on: bound, then closed.
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

timeout -s KILL 60 "$ctl" http k --retries 1 "http://127.0.0.1:$port/x" \
  >/dev/null 2>"$tmp/err"
check "connection refused, retries spent: exit 75" 75 $?
check_true "  said as still transient" grep -q 'gave up, still transient: transport error' "$tmp/err"
check_true "  after 2 attempts" grep -q '2 attempts' "$tmp/err"

timeout -s KILL 60 "$ctl" http k --retries 0 "http://127.0.0.1:$port/x" \
  >/dev/null 2>&1
check "connection refused, no retries: exit 75" 75 $?

"$ctl" rm >/dev/null 2>&1
for u in notaurl 'ftp://127.0.0.1/x' 'http://' '://x' ''; do
  timeout -s KILL 60 "$ctl" http k "$u" >/dev/null 2>"$tmp/err"
  check "http k '$u': usage error" 64 $?
done
timeout -s KILL 60 "$ctl" http k notaurl >/dev/null 2>"$tmp/err"
check_true "  the message names the URL" grep -q "'notaurl' is not a URL" "$tmp/err"
check_true "  no segment was created for them" sh -c "! [ -e /dev/shm$SEG ]"

# A permanent transport error stays 1: nothing a later try mends.
printf x >"$tmp/file"
timeout -s KILL 60 "$ctl" http k -o "$tmp/file/below" "http://127.0.0.1:$port/x" \
  >/dev/null 2>&1
check "-o in a directory that cannot exist: exit 1" 1 $?

# wait: its deadline is transient.
"$ctl" backoff w 30 >/dev/null
"$ctl" wait w --timeout 0.1 >/dev/null 2>&1
check "wait past --timeout: exit 75" 75 $?

finish
