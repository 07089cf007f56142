#!/bin/sh
# SPDX-License-Identifier: MIT
# test_redis_cluster.sh — a real 3-node Redis Cluster (no replicas, every
# slot assigned), started here on free ports of 127.0.0.1: opening the
# Redis backend against any of its nodes is refused, with a message that
# says why (THROTTLE_EBACKEND; throttlectl exits 1, not 75: asking again
# will not help), the handle serves from the host's segment, and nothing
# is written to the Cluster, not even a script or a function loaded.  Also where the
# user may not run INFO (an ACL without it): the Cluster is still told at
# open, before any key is touched.  The nodes and their files go at exit,
# whatever happened (ctl_lib.sh's trap).
. "$(dirname "$0")/ctl_lib.sh"
. "$top/tests/redis_lib.sh"
redis_skip_unless_installed
ctl=$T
[ -f "$B/libthrottle-redis.so.1" ] || { echo "FAIL $B/libthrottle-redis.so.1 is missing (make)"; exit 1; }
export THROTTLE_BACKEND_MODULE="$B/libthrottle-redis.so.1"
cleanup_hooks="$cleanup_hooks cluster_stop"
cluster_start "$tmp/cluster" || { echo "FAIL the Redis Cluster did not start"; exit 1; }
echo "Cluster on ports$CLUSTER_PORTS"

# Keys of several roots, so that their slots fall on every node.
KEYS="k hotdata:ws1/orders hotdata:ws2/t hotdata:ws3/t a/b/c x y z q"

# Every command that talks to the backend, against one node's URL: the
# refusal on stderr, with the reason, and exit 1.
refused() { # url label
  for k in $KEYS; do
    "$ctl" --backend "$1" backoff "$k" 30 2>"$tmp/err"
    rc=$?
    [ "$rc" -eq 1 ] || { echo "  backoff $k: exit $rc"; cat "$tmp/err"; return 1; }
  done
  grep -q "a Redis Cluster node" "$tmp/err" &&
    grep -q "slot map" "$tmp/err" &&
    grep -q "Cluster is not supported" "$tmp/err" || { cat "$tmp/err"; return 1; }
  for cmd in "ls" "show k" "wait k --timeout 1" "set k --max-parallel 1" \
             "pause k" "clear k" "reset"; do
    # shellcheck disable=SC2086
    "$ctl" --backend "$1" $cmd >/dev/null 2>"$tmp/err"
    rc=$?
    [ "$rc" -eq 1 ] && grep -q "a Redis Cluster node" "$tmp/err" ||
      { echo "  $cmd: exit $rc"; cat "$tmp/err"; return 1; }
  done
}

for p in $CLUSTER_PORTS; do
  check_true "node $p: refused at open, with the reason, exit 1" \
    refused "redis://127.0.0.1:$p"
done

# `run` fails open (I7): the command runs, admitted by the host's
# segment, and the refusal is said on stderr.
p=$(echo $CLUSTER_PORTS | cut -d' ' -f1)
"$ctl" --backend "redis://127.0.0.1:$p" run k -- true 2>"$tmp/err"
check "run: its command runs all the same (exit 0)" 0 $?
check_true "  and it says the Cluster was refused" \
  grep -q "warning: .*a Redis Cluster node" "$tmp/err"

# The library itself, as a program links it (the Python binding over the
# shared library): throttle_open() says THROTTLE_EBACKEND, the handle
# serves from the segment.
"$PY" - "$B/libthrottle.so.1" "redis://127.0.0.1:$p" "$SEG" >"$tmp/py" 2>&1 <<'EOF'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.throttle_config_new.restype = ctypes.c_void_p
lib.throttle_config_set_backend.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
lib.throttle_config_set_segment.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
lib.throttle_open.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
lib.throttle_errmsg.argtypes = [ctypes.c_void_p]
lib.throttle_errmsg.restype = ctypes.c_char_p
lib.throttle_strerror.restype = ctypes.c_char_p
lib.throttle_backoff.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64]
lib.throttle_close.argtypes = [ctypes.c_void_p]
cfg = lib.throttle_config_new()
lib.throttle_config_set_backend(cfg, sys.argv[2].encode())
lib.throttle_config_set_segment(cfg, sys.argv[3].encode())
h = ctypes.c_void_p()
rc = lib.throttle_open(cfg, ctypes.byref(h))
print("open", lib.throttle_strerror(rc).decode(), lib.throttle_errmsg(h).decode())
print("backoff", lib.throttle_backoff(h, b"k", 30000))
lib.throttle_close(h)
EOF
check_true "throttle_open(): THROTTLE_EBACKEND naming the Cluster" \
  grep -q "^open .*backend.*a Redis Cluster node" "$tmp/py"
check_true "  the handle serves from the segment" grep -q "^backoff 0$" "$tmp/py"

# A user who may not run INFO: the Cluster is told all the same, at open.
for p in $CLUSTER_PORTS; do
  ccli "$p" acl setuser thr on '>pw' '~*' '&*' +@all -info >/dev/null
done
for p in $CLUSTER_PORTS; do
  check_true "node $p, INFO refused to the user: refused at open all the same" \
    refused "redis://thr:pw@127.0.0.1:$p"
done

# Nothing reached the Cluster: no key, no script run or loaded.
for p in $CLUSTER_PORTS; do
  check "node $p: no key written" 0 "$(ccli "$p" dbsize)"
  check "node $p: no script run, no function loaded" "" \
    "$(ccli "$p" info commandstats | grep -E '^cmdstat_(eval|evalsha|script|fcall|function)[^:]*:calls=[1-9]')"
done
finish
