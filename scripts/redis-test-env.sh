#!/usr/bin/env bash
# Starts (up) or stops (down) the Redis servers shardlock's tests run against:
# one standalone server and a 3-master, 3-replica cluster, all on 127.0.0.1.
#
#   scripts/redis-test-env.sh up     # install redis-server if missing, start, wait until ready
#   scripts/redis-test-env.sh down   # stop every server started by 'up'
#   scripts/redis-test-env.sh env    # print the export lines the tests read
#   scripts/redis-test-env.sh restart PORT   # start a killed cluster node again
#
# Ports: standalone 16379 (watched by a Sentinel on 16380 as master "shardlock"),
# cluster 17001-17006 (bus ports 27001-27006), fault cluster 17101-17106.
# Data, logs and pid files go to $SHARDLOCK_TEST_DIR (default: .redis-test in the repo).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
dir=${SHARDLOCK_TEST_DIR:-$repo/.redis-test}
standalone_port=16379
sentinel_port=16380
cluster_ports=(17001 17002 17003 17004 17005 17006)
# A second cluster that only the fault tests touch (they kill, fail over and
# migrate): faults there cannot disturb the tests that share the first.
fault_ports=(17101 17102 17103 17104 17105 17106)
node_timeout=2000

log() { printf 'redis-test-env: %s\n' "$*" >&2; }

ensure_redis() {
  if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
    return
  fi
  log "redis-server not found; installing Debian's redis-server and redis-tools"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server redis-tools >/dev/null
}

start_server() { # port, extra args...
  local port=$1; shift
  mkdir -p "$dir/$port"
  redis-server --port "$port" --bind 127.0.0.1 --protected-mode yes \
    --dir "$dir/$port" --save "" --appendonly no \
    --daemonize yes --pidfile "$dir/$port/redis.pid" --logfile "$dir/$port/redis.log" \
    --enable-debug-command local "$@"
}

wait_ping() { # port
  local i
  for i in $(seq 1 100); do
    if [ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = "PONG" ]; then return 0; fi
    sleep 0.1
  done
  log "server on port $1 did not answer PING"; return 1
}

join_addrs() { local a=(); for p in "$@"; do a+=("127.0.0.1:$p"); done; (IFS=,; echo "${a[*]}"); }

print_env() {
  echo "export SHARDLOCK_REDIS_ADDR=127.0.0.1:$standalone_port"
  echo "export SHARDLOCK_SENTINEL_ADDR=127.0.0.1:$sentinel_port"
  echo "export SHARDLOCK_CLUSTER_ADDRS=$(join_addrs "${cluster_ports[@]}")"
  echo "export SHARDLOCK_FAULT_CLUSTER_ADDRS=$(join_addrs "${fault_ports[@]}")"
  echo "export SHARDLOCK_TEST_DIR=$dir"
}

# make_cluster creates a 3-master, 3-replica cluster of the given ports and
# waits until every node reports ok and every replica has synced.
make_cluster() {
  local ports=("$@") p
  for p in "${ports[@]}"; do
    start_server "$p" --cluster-enabled yes --cluster-config-file "$dir/$p/nodes.conf" \
      --cluster-node-timeout "$node_timeout"
  done
  for p in "${ports[@]}"; do wait_ping "$p"; done
  local addrs=()
  for p in "${ports[@]}"; do addrs+=("127.0.0.1:$p"); done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create-${ports[0]}.log" 2>&1 || {
    cat "$dir/create-${ports[0]}.log" >&2; return 1; }
  local i ok
  for i in $(seq 1 300); do
    ok=1
    for p in "${ports[@]}"; do
      redis-cli -p "$p" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || ok=0
      if redis-cli -p "$p" info replication 2>/dev/null | grep -q 'role:slave'; then
        redis-cli -p "$p" info replication | grep -q 'master_link_status:up' || ok=0
      fi
    done
    [ "$ok" = 1 ] && return 0
    sleep 0.1
  done
  log "cluster ${ports[0]}.. did not become ready"; return 1
}

up() {
  ensure_redis
  down >/dev/null 2>&1 || true
  rm -rf "$dir"; mkdir -p "$dir"
  start_server "$standalone_port"
  mkdir -p "$dir/$sentinel_port"
  cat >"$dir/$sentinel_port/sentinel.conf" <<CONF
port $sentinel_port
bind 127.0.0.1
daemonize yes
pidfile $dir/$sentinel_port/redis.pid
logfile $dir/$sentinel_port/redis.log
dir $dir/$sentinel_port
sentinel monitor shardlock 127.0.0.1 $standalone_port 1
CONF
  wait_ping "$standalone_port"
  redis-server "$dir/$sentinel_port/sentinel.conf" --sentinel
  wait_ping "$sentinel_port"
  make_cluster "${cluster_ports[@]}"
  make_cluster "${fault_ports[@]}"
  print_env >"$dir/env"
  log "ready: standalone 127.0.0.1:$standalone_port, clusters 127.0.0.1:${cluster_ports[0]}-${cluster_ports[5]} and ${fault_ports[0]}-${fault_ports[5]}"
  log "environment: source $dir/env"
}

down() {
  local p pidfile
  for p in "$standalone_port" "$sentinel_port" "${cluster_ports[@]}" "${fault_ports[@]}"; do
    pidfile="$dir/$p/redis.pid"
    if [ -f "$pidfile" ]; then
      kill "$(cat "$pidfile")" 2>/dev/null || true
    fi
    redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true
  done
}

# restart PORT starts a cluster node again with its config and nodes.conf
# (after a fault test killed it).
restart() {
  local p=$1
  start_server "$p" --cluster-enabled yes --cluster-config-file "$dir/$p/nodes.conf" \
    --cluster-node-timeout "$node_timeout"
  wait_ping "$p"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  restart) restart "$2" ;;
  env) print_env ;;
  *) echo "usage: $0 up|down|env|restart PORT" >&2; exit 2 ;;
esac
