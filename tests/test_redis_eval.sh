#!/bin/sh
# SPDX-License-Identifier: MIT
# test_redis_eval.sh — the Redis backend on a server without Functions (as
# before Redis 7; here FCALL and FUNCTION renamed away: TH_REDIS_NO_FUNCTIONS,
# tests/redis_helpers.c): the scripts then go by EVALSHA, built from the
# same sources as the Functions library, and the tests of the backend's
# rules run again on that path: the contract cases, the learned cap,
# scopes and pools.  Each test starts and removes its own servers.
# Skipped without redis-server.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-build}
case "$B" in /*) ;; *) B="$top/$B" ;; esac
. "$top/tests/redis_lib.sh"
redis_skip_unless_installed
TH_REDIS_NO_FUNCTIONS=1
export TH_REDIS_NO_FUNCTIONS
rc=0
for t in test_redis test_contract_redis test_redis_learn test_redis_scope \
         test_redis_pool; do
  log="$B/tests/$t.eval.log"
  if "$B/tests/$t" >"$log" 2>&1; then
    echo "PASS $t, scripts by EVALSHA"
  else
    echo "FAIL $t, scripts by EVALSHA (log: $log)"
    rc=1
  fi
done
exit $rc
