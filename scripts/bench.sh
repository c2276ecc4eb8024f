#!/usr/bin/env bash
# Runs the acquire+release benchmarks on the real standalone server and
# cluster, ROUNDS times interleaved (so a slow moment of the machine hits
# every implementation alike), and prints medians and ratios as Markdown.
#
#   scripts/bench.sh            # 5 rounds, 2 s per benchmark, BenchmarkDefaults and BenchmarkAcquireRelease
#   ROUNDS=3 BENCHTIME=1s BENCH=Defaults/cluster scripts/bench.sh
# Raw output: .redis-test/bench.txt
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
benchtime=${BENCHTIME:-2s}

scripts/redis-test-env.sh up
trap 'scripts/redis-test-env.sh down' EXIT
# shellcheck disable=SC1091
source "${SHARDLOCK_TEST_DIR:-.redis-test}/env"
export SHARDLOCK_REQUIRE_REDIS=1

raw="${SHARDLOCK_TEST_DIR:-.redis-test}/bench.txt"
: >"$raw"
go test -c -o "${SHARDLOCK_TEST_DIR:-.redis-test}/manager.test" ./manager
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds" >&2
  "${SHARDLOCK_TEST_DIR:-.redis-test}/manager.test" -test.run '^$' -test.bench "${BENCH:-Defaults|AcquireRelease}" \
    -test.benchtime "$benchtime" -test.benchmem >>"$raw"
done
"${SHARDLOCK_TEST_DIR:-.redis-test}/manager.test" -test.run '^$' -test.bench 'Watchdog10k' -test.benchtime 5x >>"$raw"
go run ./scripts/benchtab <"$raw"
grep Watchdog10k "$raw"
