#!/usr/bin/env bash
# Runs shardlock's whole test suite against real servers, four times: on
# Redis 7.0 (Debian's redis-server, the oldest server shardlock supports),
# on Redis 8 (scripts/redis8.sh fetches it from Debian's experimental
# suite without touching the system: DELEX, SET ... IFEQ and MSETEX), on
# Valkey 9 (scripts/valkey.sh, from Debian's testing suite: DELIFEQ, SET
# ... IFEQ and MSETEX) and on Valkey 8.0 (SHARDLOCK_VALKEY=8
# scripts/valkey.sh: bookworm-backports, no conditional commands, the Lua
# paths on Valkey). For each it starts a standalone
# server, a Sentinel and two 3-master, 3-replica clusters on 127.0.0.1
# (installing redis-server, and Prometheus, promtool and Alertmanager from
# Debian's packages, if they are missing), runs go test -race on every
# package, and stops the servers however the tests end; before them it
# runs gofmt, go vet and staticcheck (installed with go install at a pinned
# version), and after the Redis row the fuzz target and every benchmark
# once. A test that needs a server fails here rather than skips.
# SHARDLOCK_SERVERS=redis (or redis8, valkey, valkey8, or several) runs those
# rows only.
#
#   scripts/test.sh                 # everything
#   scripts/test.sh -run Stress     # extra arguments go to go test
set -euo pipefail
cd "$(dirname "$0")/.."
STATICCHECK_VERSION=v0.8.2

if ! command -v promtool >/dev/null || ! command -v prometheus-alertmanager >/dev/null; then
  echo "promtool or alertmanager not found; installing Debian's prometheus and prometheus-alertmanager" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq prometheus prometheus-alertmanager >/dev/null
fi
servers=${SHARDLOCK_SERVERS:-redis redis8 valkey valkey8}
export SHARDLOCK_REQUIRE_REDIS=1 SHARDLOCK_REQUIRE_TOOLS=1

echo "== gofmt -l ."
unformatted="$(gofmt -l .)"
if [ -n "$unformatted" ]; then
  echo "not gofmt-formatted:" >&2
  echo "$unformatted" >&2
  exit 1
fi
echo "== go vet ./..."
go vet ./...
echo "== staticcheck ./... (honnef.co/go/tools $STATICCHECK_VERSION)"
staticcheck="$(go env GOPATH)/bin/staticcheck"
if ! "$staticcheck" -version 2>/dev/null | grep -q "$STATICCHECK_VERSION"; then
  go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
fi
"$staticcheck" ./...
(cd bench/rueidis && "$staticcheck" ./...)
(cd bench/peers && "$staticcheck" ./...)
# row NAME DIR: starts the servers on PATH (their data under DIR) and runs
# the tests on them, SHARDLOCK_SERVER telling the tests which they are.
row() {
  local name=$1
  export SHARDLOCK_TEST_DIR=$2 SHARDLOCK_SERVER=$1
  scripts/redis-test-env.sh up
  trap 'scripts/redis-test-env.sh down' EXIT
  # shellcheck disable=SC1090
  source "$SHARDLOCK_TEST_DIR/env"
  echo "== go test -race ./... on $name ($(redis-server --version | cut -d' ' -f1-3))"
  go test -race -count=1 -timeout 15m "${@:3}" ./...
}

if [[ " $servers " == *" redis "* ]]; then
  row redis "$PWD/.redis-test" "$@"
  if [ $# -eq 0 ]; then
    # A count, not a duration: Go 1.26's fuzz coordinator can report its own
    # -fuzztime deadline as a failure ("context deadline exceeded", no input
    # written) when a worker is mid-input as the time runs out
    # (golang/go#75804); a count stops without that deadline.
    echo "== fuzz the public API (go test -fuzz FuzzPublicAPI, ${FUZZTIME:-5000x})"
    go test -run '^$' -fuzz '^FuzzPublicAPI$' -fuzztime "${FUZZTIME:-5000x}" ./manager
    echo "== benchmarks compile and run once (go test -bench . -benchtime 1x)"
    go test -run '^$' -bench . -benchtime 1x -timeout 10m ./... >/dev/null
    echo "== the rueidis floor's module (bench/rueidis): vet, and its benchmark once"
    (cd bench/rueidis && go vet ./... && go test -run '^$' -bench . -benchtime 1x -timeout 5m ./... >/dev/null)
    echo "== the peers' module (bench/peers): vet, and its benchmark once"
    (cd bench/peers && go vet ./... && go test -run '^$' -bench . -benchtime 1x -timeout 5m ./... >/dev/null)
  fi
  scripts/redis-test-env.sh down
  trap - EXIT
fi

if [[ " $servers " == *" redis8 "* ]]; then
  redis8_bin=$(scripts/redis8.sh)
  PATH="$redis8_bin:$PATH" row redis8 "$PWD/.redis-test-redis8" "$@"
  PATH="$redis8_bin:$PATH" scripts/redis-test-env.sh down
  trap - EXIT
fi

if [[ " $servers " == *" valkey "* ]]; then
  valkey_bin=$(scripts/valkey.sh)
  PATH="$valkey_bin:$PATH" row valkey "$PWD/.redis-test-valkey" "$@"
  PATH="$valkey_bin:$PATH" scripts/redis-test-env.sh down
  trap - EXIT
fi

if [[ " $servers " == *" valkey8 "* ]]; then
  valkey_bin=$(SHARDLOCK_VALKEY=8 scripts/valkey.sh)
  PATH="$valkey_bin:$PATH" row valkey8 "$PWD/.redis-test-valkey8" "$@"
  PATH="$valkey_bin:$PATH" scripts/redis-test-env.sh down
  trap - EXIT
fi
