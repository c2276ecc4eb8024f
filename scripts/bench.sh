#!/usr/bin/env bash
# Runs the acquire+release benchmarks on the real standalone server and
# cluster, ROUNDS times interleaved (so a slow moment of the machine hits
# every implementation alike), and prints medians and ratios as Markdown.
#
#   scripts/bench.sh            # 5 rounds, 2 s per benchmark: BenchmarkDefaults (and its
#                               # Paired and Alternating forms) and BenchmarkAcquireRelease
#   ROUNDS=3 BENCHTIME=1s BENCH=Defaults/cluster scripts/bench.sh
# Each round also runs the rueidis floor (bench/rueidis, a module of its
# own) unless RUEIDIS=0.
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
dir="$(cd "${SHARDLOCK_TEST_DIR:-.redis-test}" && pwd)"
go test -c -o "$dir/manager.test" ./manager
if [ "${RUEIDIS:-1}" != 0 ]; then
  (cd bench/rueidis && go test -c -o "$dir/rueidis.test" .)
fi
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds" >&2
  "$dir/manager.test" -test.run '^$' -test.bench "${BENCH:-Defaults|AcquireRelease}" \
    -test.benchtime "$benchtime" -test.benchmem >>"$raw"
  if [ "${RUEIDIS:-1}" != 0 ]; then
    "$dir/rueidis.test" -test.run '^$' -test.bench RueidisFloor -test.benchtime "$benchtime" -test.benchmem >>"$raw"
  fi
done
"$dir/manager.test" -test.run '^$' -test.bench 'Watchdog10k' -test.benchtime 5x >>"$raw"
go run ./scripts/benchtab <"$raw"
grep Watchdog10k "$raw"
