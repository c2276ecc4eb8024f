#!/usr/bin/env bash
# Runs the fault suite's live slot migration case RUNS times in a row (20 by
# default), each on a slot of its own, and the redis-cli reshard case
# (TestReshard, with redis-cli's defaults and with --cluster-pipeline 1)
# RESHARDS times (10 by default), against the fault cluster that
# scripts/redis-test-env.sh starts. It stops at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-20}"
RESHARDS="${RESHARDS:-10}"
if [[ ! -f .redis-test/env ]]; then
	scripts/redis-test-env.sh up
fi
# shellcheck source=/dev/null
source .redis-test/env
SHARDLOCK_REQUIRE_REDIS=1 go test ./internal/faults -count=1 -failfast -v \
	-run 'TestFaults/slot_migration|TestReshard' -migrations="$RUNS" -reshards="$RESHARDS" 2>&1 |
	grep -E '^\s*(---|ok|FAIL|PASS)|(faults|reshard)_test'
