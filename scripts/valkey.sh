#!/usr/bin/env bash
# Installs Valkey 9 (Debian testing's valkey-tools and the C library it
# needs) under $SHARDLOCK_VALKEY_DIR (default: .cache/valkey in the repo)
# without touching the system, and prints the directory of wrappers named
# redis-server, redis-cli, valkey-server and valkey-cli that run it through
# that C library's own dynamic loader. Put that directory first on PATH and
# scripts/redis-test-env.sh starts Valkey wherever it starts Redis.
#
#   PATH="$(scripts/valkey.sh):$PATH" scripts/redis-test-env.sh up
#
# The archive is the one this machine's apt already uses (the first URIs:
# line of its Debian sources). The suite's versions move: the script checks
# what the server says and fails on anything older than Valkey 9.0.
#
# SHARDLOCK_VALKEY=8 fetches Valkey 8.0 from bookworm-backports instead
# (into .cache/valkey8; it runs on bookworm's own C library) and checks
# that it is an 8.x.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
server=valkey
if [ "${SHARDLOCK_VALKEY:-9}" = 8 ]; then
  dir=${SHARDLOCK_VALKEY_DIR:-$repo/.cache/valkey8}
  suites=bookworm-backports
  min_major=8 max_major=8
  packages=(valkey-tools) # the system's C library is the one it needs
else
  dir=${SHARDLOCK_VALKEY_DIR:-$repo/.cache/valkey}
  suites=${SHARDLOCK_VALKEY_SUITE:-forky}
  min_major=9 max_major=999
  packages=(valkey-tools libc6)
fi
# shellcheck source=scripts/debian-server.sh
source "$repo/scripts/debian-server.sh"

ensure_libs
if [ ! -x "$dir/bin/valkey-server" ] || ! "$dir/bin/valkey-server" --version >/dev/null 2>&1; then
  fetch
  for name in redis-server valkey-server; do
    wrapper "$name" valkey-check-rdb valkey-server # valkey-server picks its mode from argv[0]
  done
  for name in redis-cli valkey-cli; do
    wrapper "$name" valkey-cli valkey-cli
  done
fi
log "Valkey $(check_major "$dir/bin/valkey-server" "$min_major" "$max_major") in $dir"
echo "$dir/bin"
