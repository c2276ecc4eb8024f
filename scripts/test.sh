#!/usr/bin/env bash
# Runs shardlock's whole test suite against real Redis servers:
# starts a standalone server and a 3-master, 3-replica cluster on 127.0.0.1
# (installing redis-server, and Prometheus, promtool and Alertmanager from
# Debian's packages, if they are missing), runs
# go vet, staticcheck (installed with go install at a pinned version) and
# go test -race on every package, and stops the servers however
# the tests end. A test that needs a server fails here rather than skips.
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
scripts/redis-test-env.sh up
trap 'scripts/redis-test-env.sh down' EXIT
# shellcheck disable=SC1091
source "${SHARDLOCK_TEST_DIR:-.redis-test}/env"
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
echo "== go test -race ./..."
go test -race -count=1 -timeout 15m "$@" ./...
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
fi
