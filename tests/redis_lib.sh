# SPDX-License-Identifier: MIT
# redis_lib.sh — sourced by the shell tests that need Redis: a throw-away
# redis-server on a unix socket in a temporary directory (never a TCP
# port, never 6379), stopped by its pid.
#
#   redis_start DIR      start one; sets REDIS_SOCK, REDIS_PID, REDIS_URL
#   redis_stop           stop it (by pid) and wait for it
#   redis_kill9          kill -9 it (a crash); redis_start DIR restarts it
#   rcli ARGS...         redis-cli on that socket
#   redis_skip_unless_installed   exit 77 (skip) without redis-server

redis_skip_unless_installed() {
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "SKIP: redis-server is not installed (make deps)"
    exit 77
  fi
}

redis_start() {
  mkdir -p "$1"
  REDIS_SOCK="$1/redis.sock"
  rm -f "$REDIS_SOCK"
  redis-server --port 0 --unixsocket "$REDIS_SOCK" --unixsocketperm 700 \
    --save '' --appendonly no --enable-debug-command local \
    --dir "$1" --logfile "$1/redis.log" \
    --daemonize no >/dev/null 2>&1 &
  REDIS_PID=$!
  REDIS_URL="unix://$REDIS_SOCK"
  i=0
  while ! redis-cli -s "$REDIS_SOCK" ping >/dev/null 2>&1; do
    i=$((i + 1))
    if [ "$i" -gt 100 ] || ! kill -0 "$REDIS_PID" 2>/dev/null; then
      echo "redis-server did not start:"; cat "$1/redis.log" 2>/dev/null
      return 1
    fi
    sleep 0.05
  done
  export REDIS_SOCK REDIS_PID REDIS_URL
}

redis_stop() {
  [ -n "${REDIS_PID:-}" ] || return 0
  kill "$REDIS_PID" 2>/dev/null
  wait "$REDIS_PID" 2>/dev/null
  REDIS_PID=""
}

redis_kill9() {
  [ -n "${REDIS_PID:-}" ] || return 0
  kill -9 "$REDIS_PID" 2>/dev/null
  wait "$REDIS_PID" 2>/dev/null
  REDIS_PID=""
}

rcli() { redis-cli -s "$REDIS_SOCK" "$@"; }
