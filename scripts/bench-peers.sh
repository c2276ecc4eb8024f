#!/usr/bin/env bash
# Runs BenchmarkPeers (bench/peers: shardlock against redsync,
# bsm/redislock and rueidislock, each at its defaults, alternating in the
# same run) on Redis 7.0 and on Valkey 9, each with its own standalone
# server and cluster, ROUNDS times, and prints each server's medians as a
# Markdown table (scripts/benchtab).
#
#   scripts/bench-peers.sh                                  # 3 rounds of 20,000 pairs, both servers
#   ROUNDS=1 BENCHTIME=5000x SHARDLOCK_SERVERS=valkey scripts/bench-peers.sh
# Raw output: .cache/peers-<server>.txt
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
benchtime=${BENCHTIME:-20000x}
export SHARDLOCK_REQUIRE_REDIS=1

mkdir -p .cache
bin="$PWD/.cache/peers.test"
(cd bench/peers && go test -c -o "$bin" .)

# server NAME DIR: starts the servers on PATH (data under DIR), runs the
# rounds, stops them, prints the table.
server() {
  local name=$1
  export SHARDLOCK_TEST_DIR=$2 SHARDLOCK_SERVER=$1
  scripts/redis-test-env.sh up
  trap 'scripts/redis-test-env.sh down' EXIT
  # shellcheck disable=SC1090
  source "$SHARDLOCK_TEST_DIR/env"
  local raw="$PWD/.cache/peers-$name.txt"
  : >"$raw"
  for r in $(seq 1 "$rounds"); do
    echo "$name: round $r/$rounds" >&2
    (cd bench/peers && "$bin" -test.run '^$' -test.bench Peers -test.benchtime "$benchtime" >>"$raw")
  done
  scripts/redis-test-env.sh down
  trap - EXIT
  echo "### $name ($(redis-server --version | cut -d' ' -f1-3))"
  go run ./scripts/benchtab <"$raw"
}

servers=${SHARDLOCK_SERVERS:-redis valkey}
if [[ " $servers " == *" redis "* ]]; then
  server redis "$PWD/.redis-test"
fi
if [[ " $servers " == *" valkey "* ]]; then
  valkey_bin=$(scripts/valkey.sh)
  PATH="$valkey_bin:$PATH" server valkey "$PWD/.redis-test-valkey"
fi
