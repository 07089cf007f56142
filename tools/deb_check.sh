#!/bin/sh
# SPDX-License-Identifier: MIT
# deb_check.sh — the Debian packages (make deb) as installed: throttlectl
# runs and is linked against libthrottle.so.1 (not a static copy), finds
# the Redis module in its private directory, whose symbol is versioned;
# the Python package imports and works against the installed library; the
# demo runs with the installed throttlectl.
#
#   sh tools/deb_check.sh            after apt-get install ./build/debian/*.deb
#   ROOT=DIR sh tools/deb_check.sh   the packages unpacked into DIR
#                                    (dpkg -x), nothing installed
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${ROOT:-}
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
lib="$ROOT/usr/lib/$ma"
ctl="$ROOT/usr/bin/throttlectl"
if [ -n "$ROOT" ]; then
  LD_LIBRARY_PATH="$lib"; export LD_LIBRARY_PATH
  LIBTHROTTLE_LIBRARY="$lib/libthrottle.so.1"; export LIBTHROTTLE_LIBRARY
fi
. "$top/tests/check_lib.sh"
check_true() { # name command...: the command succeeds
  name=$1; shift
  if "$@" >/dev/null 2>&1; then echo "ok   $name"; else
    echo "FAIL $name: $*"; fails=$((fails + 1)); fi
}
seg="/tt-debcheck-$$"
trap '"$ctl" --segment "$seg" rm >/dev/null 2>&1' EXIT

check_true "throttlectl runs" "$ctl" --version
check_true "throttlectl is linked against libthrottle.so.1" sh -c \
  "objdump -p '$ctl' | grep -q 'NEEDED *libthrottle.so.1'"
check_true "  and libthrottle-curl.so.1" sh -c \
  "objdump -p '$ctl' | grep -q 'NEEDED *libthrottle-curl.so.1'"
mod="$lib/libthrottle/libthrottle-redis.so.1"
check_true "the Redis module is in its private directory" test -f "$mod"
check_true "  its symbol is versioned" sh -c \
  "objdump -T '$mod' | grep -q 'LIBTHROTTLE_REDIS_1 *throttle_backend_v1'"
# The module is found without THROTTLE_BACKEND_MODULE; it connects lazily,
# so no server is needed to see that it loaded.
out=$(env -u THROTTLE_BACKEND_MODULE THROTTLE_BACKEND=redis://127.0.0.1:1 \
  "$ctl" --segment "$seg" backoff k 1 2>&1)
check "throttlectl loads the module from there" "" \
  "$(printf '%s\n' "$out" | grep 'cannot load')"
check "the Python package imports and sees the segment" "ok" "$(
  cd / && PYTHONPATH="$ROOT/usr/lib/python3/dist-packages" THROTTLE_SEGMENT="$seg" \
    /usr/bin/python3 -c '
import libthrottle
t = libthrottle.Throttle()
print("ok" if t.remaining("k") >= 0 else "no")' 2>&1)"
THROTTLECTL="$ctl" DEMO_CLIENT=throttlectl sh "$top/tools/demo.sh" >/tmp/deb-demo.$$ 2>&1
rc=$?
[ $rc -eq 0 ] || tail -20 /tmp/deb-demo.$$
check "the demo runs with the installed throttlectl" 0 $rc
rm -f /tmp/deb-demo.$$
[ "$fails" -eq 0 ] && { echo "deb check: all checks passed"; exit 0; }
echo "deb check: $fails check(s) failed"; exit 1
