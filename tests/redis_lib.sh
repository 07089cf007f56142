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
#   cluster_start DIR    a 3-node Redis Cluster (no replicas) on free TCP
#                        ports of 127.0.0.1, every slot assigned; sets
#                        CLUSTER_PORTS and CLUSTER_PIDS
#   cluster_stop         stop its nodes (by pid) and wait for them
#   ccli PORT ARGS...    redis-cli on one of its nodes

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

# ---- a Redis Cluster ----------------------------------------------------

ccli() { p=$1; shift; redis-cli -h 127.0.0.1 -p "$p" "$@"; }

cluster_stop() {
  for p in ${CLUSTER_PIDS:-}; do kill "$p" 2>/dev/null; done
  for p in ${CLUSTER_PIDS:-}; do wait "$p" 2>/dev/null; done
  CLUSTER_PIDS=""
}

# Three nodes on ports BASE..BASE+2 (cluster bus at +10000, Redis's
# default); 1 when one of them did not come up (its port, or its bus
# port, was taken), and the nodes started are stopped again.
cluster_try() { # dir base
  CLUSTER_PORTS="" CLUSTER_PIDS=""
  for p in $2 $(($2 + 1)) $(($2 + 2)); do
    mkdir -p "$1/$p"
    (cd "$1/$p" && exec redis-server --port "$p" --bind 127.0.0.1 \
      --cluster-enabled yes --cluster-config-file nodes.conf \
      --save '' --appendonly no --dir "$1/$p" --logfile "$1/$p/redis.log" \
      --daemonize no) >/dev/null 2>&1 &
    CLUSTER_PIDS="$CLUSTER_PIDS $!"
    CLUSTER_PORTS="$CLUSTER_PORTS $p"
  done
  for p in $CLUSTER_PORTS; do
    i=0
    until ccli "$p" ping >/dev/null 2>&1; do
      i=$((i + 1))
      if [ "$i" -gt 100 ]; then cluster_stop; return 1; fi
      sleep 0.05
    done
  done
  for pid in $CLUSTER_PIDS; do
    kill -0 "$pid" 2>/dev/null || { cluster_stop; return 1; }
  done
}

cluster_start() { # dir
  tries=0
  while :; do
    tries=$((tries + 1))
    # a base in 20000..44999 (its bus ports stay below 65536)
    base=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
    base=$((20000 + base % 25000))
    cluster_try "$1/$tries" "$base" && break
    if [ "$tries" -ge 8 ]; then
      echo "no free ports for a Redis Cluster after $tries tries"; return 1
    fi
  done
  nodes=""
  for p in $CLUSTER_PORTS; do nodes="$nodes 127.0.0.1:$p"; done
  # shellcheck disable=SC2086
  if ! redis-cli --cluster create $nodes --cluster-replicas 0 \
      --cluster-yes >"$1/create.log" 2>&1; then
    echo "redis-cli --cluster create failed:"; cat "$1/create.log"
    return 1
  fi
  i=0
  for p in $CLUSTER_PORTS; do
    until ccli "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; do
      i=$((i + 1))
      if [ "$i" -gt 400 ]; then echo "the Cluster is not ok after 20 s"; return 1; fi
      sleep 0.05
    done
  done
  export CLUSTER_PORTS CLUSTER_PIDS
}
