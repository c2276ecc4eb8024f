#!/usr/bin/env bash
# Runs the fault suite's live slot migration case RUNS times in a row (20 by
# default), each on a slot of its own, against the fault cluster that
# scripts/redis-test-env.sh starts. It stops at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-20}"
if [[ ! -f .redis-test/env ]]; then
	scripts/redis-test-env.sh up
fi
# shellcheck source=/dev/null
source .redis-test/env
SHARDLOCK_REQUIRE_REDIS=1 go test ./internal/faults -count=1 -failfast -v \
	-run 'TestFaults/slot_migration' -migrations="$RUNS" 2>&1 | grep -E '^\s*(---|ok|FAIL|PASS)|faults_test'
