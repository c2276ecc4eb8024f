#!/usr/bin/env bash
# Installs Redis 8 (Debian experimental's redis-tools, and the C and C++
# libraries it needs from unstable) under $SHARDLOCK_REDIS8_DIR (default:
# .cache/redis8 in the repo) without touching the system, and prints the
# directory of wrappers named redis-server and redis-cli that run it
# through that C library's own dynamic loader. Put that directory first on
# PATH and scripts/redis-test-env.sh starts Redis 8 wherever it starts
# Redis.
#
#   PATH="$(scripts/redis8.sh):$PATH" scripts/redis-test-env.sh up
#
# The archive is the one this machine's apt already uses (the first URIs:
# line of its Debian sources). The suites' versions move: the script checks
# what the server says and fails on anything older than Redis 8.4, the
# first with DELEX, SET ... IFEQ and MSETEX.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
server=redis8
dir=${SHARDLOCK_REDIS8_DIR:-$repo/.cache/redis8}
suites="sid experimental"
packages=(redis-tools/experimental libc6 libstdc++6 libgcc-s1)
# shellcheck source=scripts/debian-server.sh
source "$repo/scripts/debian-server.sh"

ensure_libs
if [ ! -x "$dir/bin/redis-server" ] || ! "$dir/bin/redis-server" --version >/dev/null 2>&1; then
  fetch
  wrapper redis-server redis-check-rdb redis-server # redis-server picks its mode from argv[0]
  wrapper redis-cli redis-cli redis-cli
fi
v=$(check_major "$dir/bin/redis-server" 8 999)
minor=${v#*.} minor=${minor%%.*}
if [ "${v%%.*}" -eq 8 ] && [ "$minor" -lt 4 ]; then
  log "the $suites suites gave Redis $v, not 8.4 or later"
  exit 1
fi
log "Redis $v in $dir"
echo "$dir/bin"
