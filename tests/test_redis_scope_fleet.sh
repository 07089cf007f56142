#!/bin/sh
# SPDX-License-Identifier: MIT
# test_redis_scope_fleet.sh — tests/test_scope_fleet.sh on two "hosts"
# that share only a throw-away Redis: every other `throttlectl http`
# loader opens a second segment, so what holds the workspace (its 429's
# Retry-After, its one probe, its first request, the pool of 3 over 4
# tables) reaches the loaders of the other host through Redis alone.  The
# same checks: every file loaded, nothing early, 429s at most L/R + 2 for
# the whole workspace, at most 3 writes in service in the pool; then the
# listing, show and metrics of the scope, read from Redis.
# Skipped (exit 0, saying so) without redis-server.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
case "$B" in /*) ;; *) B="$top/$B" ;; esac
. "$top/tests/redis_lib.sh"

if ! command -v redis-server >/dev/null 2>&1; then
  echo "SKIP test_redis_scope_fleet: redis-server is not installed (make deps)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'redis_stop; rm -rf "$tmp"' EXIT
redis_start "$tmp/redis" || { echo "FAIL redis-server did not start"; exit 1; }
THROTTLE_BACKEND="$REDIS_URL" THROTTLE_BACKEND_MODULE="$B/libthrottle-redis.so.1" \
  HOSTS=2 B="$B" sh "$top/tests/test_scope_fleet.sh"
