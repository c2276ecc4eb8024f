# Sourced by scripts/valkey.sh and scripts/redis8.sh: fetches a server's
# Debian packages from a suite newer than this machine's into $dir, without
# touching the system, and writes wrappers that run its binaries through
# the fetched C library's own dynamic loader where one was fetched.
#
# The caller sets: dir (where everything goes), suites (the archive suites,
# e.g. "forky" or "sid experimental"), packages (apt-get download
# arguments: "name" or "name/suite"), and server (its name in messages).

log() { printf '%s: %s\n' "$server" "$*" >&2; }

ensure_libs() { # what the servers link from bookworm itself
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
  local uri sources o suite
  sources=/etc/apt/sources.list.d/debian.sources
  if [ -f "$sources" ]; then
    uri=$(awk '/^URIs:/{print $2; exit}' "$sources")
  else
    uri=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
  fi
  [ -n "$uri" ] || { log "no Debian archive in this machine's apt sources"; exit 1; }
  rm -rf "$dir/apt" "$dir/deb" "$dir/root"
  mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial" "$dir/deb"
  for suite in $suites; do
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite main"
  done >"$dir/apt/sources.list"
  o=(-o "Dir::Etc::sourcelist=$dir/apt/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$dir/apt/lists"
    -o "Dir::Cache=$dir/apt/cache" -o APT::Sandbox::User=root)
  log "downloading ${packages[*]} from $suites"
  apt-get "${o[@]}" update -qq
  (cd "$dir/deb" && apt-get "${o[@]}" download "${packages[@]}" >/dev/null)
  for f in "$dir"/deb/*.deb; do dpkg -x "$f" "$dir/root"; done
}

# wrapper NAME TARGET ARGV0: $dir/bin/NAME runs $dir/root/usr/bin/TARGET as
# ARGV0 (the servers pick their mode from argv[0]).
wrapper() {
  local name=$1 target=$2 argv0=$3 lib="$dir/root/usr/lib/x86_64-linux-gnu" bin="$dir/bin"
  mkdir -p "$bin"
  if [ -e "$lib/ld-linux-x86-64.so.2" ]; then
    cat >"$bin/$name" <<WRAP
#!/bin/sh
exec "$lib/ld-linux-x86-64.so.2" --library-path "$lib:/lib/x86_64-linux-gnu" --argv0 $argv0 "$dir/root/usr/bin/$target" "\$@"
WRAP
  else
    cat >"$bin/$name" <<WRAP
#!/usr/bin/env bash
exec -a $argv0 "$dir/root/usr/bin/$target" "\$@"
WRAP
  fi
  chmod +x "$bin/$name"
}

# check_major BINARY MIN MAX: the version BINARY --version reports has a
# major version in [MIN, MAX]; it prints the version.
check_major() {
  local v major
  v=$("$1" --version | sed -n 's/.*v=\([0-9][0-9.]*\).*/\1/p')
  major=${v%%.*}
  if [ -z "$v" ] || [ "$major" -lt "$2" ] || [ "$major" -gt "$3" ]; then
    log "the $suites suites gave $server '${v:-unknown}', not $2.x$([ "$3" = 999 ] && echo ' or later')"
    exit 1
  fi
  echo "$v"
}
