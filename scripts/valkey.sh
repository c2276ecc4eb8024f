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
if [ "${SHARDLOCK_VALKEY:-9}" = 8 ]; then
  dir=${SHARDLOCK_VALKEY_DIR:-$repo/.cache/valkey8}
  suite=bookworm-backports
  min_major=8 max_major=8
  packages=(valkey-tools) # the system's C library is the one it needs
else
  dir=${SHARDLOCK_VALKEY_DIR:-$repo/.cache/valkey}
  suite=${SHARDLOCK_VALKEY_SUITE:-forky}
  min_major=9 max_major=999
  packages=(valkey-tools libc6)
fi

log() { printf 'valkey: %s\n' "$*" >&2; }

ensure_libs() { # what valkey links from bookworm itself
  local missing=()
  for lib in libjemalloc.so.2 liblzf.so.1; do
    ldconfig -p | grep "$lib" >/dev/null || missing+=("$lib")
  done
  [ ${#missing[@]} -eq 0 ] && return
  log "installing Debian's libjemalloc2 and liblzf1 (missing: ${missing[*]})"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq libjemalloc2 liblzf1 >/dev/null
}

fetch() {
  local uri sources o
  sources=/etc/apt/sources.list.d/debian.sources
  if [ -f "$sources" ]; then
    uri=$(awk '/^URIs:/{print $2; exit}' "$sources")
  else
    uri=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
  fi
  [ -n "$uri" ] || { log "no Debian archive in this machine's apt sources"; exit 1; }
  rm -rf "$dir/apt" "$dir/deb" "$dir/root"
  mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial" "$dir/deb"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite main" >"$dir/apt/sources.list"
  o=(-o "Dir::Etc::sourcelist=$dir/apt/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$dir/apt/lists"
    -o "Dir::Cache=$dir/apt/cache" -o APT::Sandbox::User=root)
  log "downloading ${packages[*]} from $suite"
  apt-get "${o[@]}" update -qq
  (cd "$dir/deb" && apt-get "${o[@]}" download "${packages[@]}" >/dev/null)
  for f in "$dir"/deb/*.deb; do dpkg -x "$f" "$dir/root"; done
}

wrappers() {
  local lib="$dir/root/usr/lib/x86_64-linux-gnu" bin="$dir/bin" name target
  mkdir -p "$bin"
  for name in redis-server valkey-server redis-cli valkey-cli; do
    case "$name" in
      *-server) target=valkey-check-rdb argv0=valkey-server ;; # valkey-server picks its mode from argv[0]
      *) target=valkey-cli argv0=valkey-cli ;;
    esac
    if [ -e "$lib/ld-linux-x86-64.so.2" ]; then
      cat >"$bin/$name" <<EOF
#!/bin/sh
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib:/lib/x86_64-linux-gnu" --argv0 $argv0 "$dir/root/usr/bin/$target" "\$@"
EOF
    else
      cat >"$bin/$name" <<EOF
#!/usr/bin/env bash
exec -a $argv0 "$dir/root/usr/bin/$target" "\$@"
EOF
    fi
    chmod +x "$bin/$name"
  done
}

check_version() {
  local v major
  v=$("$dir/bin/valkey-server" --version | sed -n 's/.*v=\([0-9][0-9.]*\).*/\1/p')
  major=${v%%.*}
  if [ -z "$v" ] || [ "$major" -lt "$min_major" ] || [ "$major" -gt "$max_major" ]; then
    log "the $suite suite gave Valkey '${v:-unknown}', not $min_major.x$([ "$max_major" = 999 ] && echo ' or later')"
    exit 1
  fi
  log "Valkey $v in $dir"
}

ensure_libs
if [ ! -x "$dir/bin/valkey-server" ] || ! "$dir/bin/valkey-server" --version >/dev/null 2>&1; then
  fetch
  wrappers
fi
check_version
echo "$dir/bin"
