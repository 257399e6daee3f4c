#!/usr/bin/env bash
# scripts/postgres.sh: a real PostgreSQL server on loopback for weir's apply-once sink, its
# tests and the payments_apply_once example. Nothing is faked: the sink's guarantees rest on
# PostgreSQL's transactions, unique keys and row locks, so the tests run against the server.
#
# Usage:
#   scripts/postgres.sh start     initdb once, start the server, print its URL (last stdout line)
#   scripts/postgres.sh stop      stop it (fast shutdown) and remove its data unless --keep
#   scripts/postgres.sh status    "running ..." (exit 0) or "not running" (exit 1)
#   scripts/postgres.sh env       print `export WEIR_POSTGRES_URL=postgres://...`
#   scripts/postgres.sh psql ...  psql connected to the server's database
#
#   eval "$(scripts/postgres.sh env)"     # after start: sets WEIR_POSTGRES_URL
#
# The server binaries come from Debian's `postgresql` package (any major version); if they
# are missing and this runs as root, `start` installs the package with apt-get.
# initdb refuses to run as root, so as root the server runs as the `postgres` system user
# (created by the package). Authentication is `trust` on 127.0.0.1 only: a development
# and test server, never a production one.
#
# Environment:
#   WEIR_POSTGRES_DIR        state dir (default ${TMPDIR:-/tmp}/weir-postgres): data/, server.log, url
#   WEIR_POSTGRES_PORT       port (default: the first free one from 15432 up, below the kernel's
#                            ephemeral range so no outgoing connection holds it)
#   WEIR_POSTGRES_DB         database name (default weir)
#   WEIR_POSTGRES_USER       role the URL names (default weir, a superuser of this server)
#   WEIR_POSTGRES_START_TIMEOUT  seconds to wait for the server to accept connections (default 60)
#
# Only stdout's last line of `start` is the URL; progress goes to stderr.
set -euo pipefail

DIR="${WEIR_POSTGRES_DIR:-${TMPDIR:-/tmp}/weir-postgres}"
DB="${WEIR_POSTGRES_DB:-weir}"
ROLE="${WEIR_POSTGRES_USER:-weir}"
START_TIMEOUT="${WEIR_POSTGRES_START_TIMEOUT:-60}"
DIR="${DIR%/}"
[[ "$DIR" == /* ]] || DIR="$PWD/$DIR"
DATA="$DIR/data"
LOG="$DIR/server.log"
URLFILE="$DIR/url"

say() { printf 'postgres.sh: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

# The newest installed server's bin directory (Debian keeps them under /usr/lib/postgresql/N).
bindir() {
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
  if [[ -n "$d" && -x "$d/postgres" ]]; then
    echo "$d"
  elif command -v pg_ctl >/dev/null && command -v initdb >/dev/null && command -v postgres >/dev/null; then
    dirname "$(command -v postgres)"
  fi
}

ensure_installed() {
  [[ -n "$(bindir)" ]] && return 0
  if [[ "$(id -u)" -ne 0 ]]; then
    die "no PostgreSQL server binaries found; install Debian's 'postgresql' package (apt-get install postgresql)"
  fi
  say "installing Debian's postgresql package"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends postgresql >&2
  [[ -n "$(bindir)" ]] || die "postgresql installed, but no server binaries found under /usr/lib/postgresql"
}

# Runs a server command as the owner of the data directory: the `postgres` user when root.
as_owner() {
  if [[ "$(id -u)" -eq 0 ]]; then
    getent passwd postgres >/dev/null || die "running as root needs the 'postgres' system user (from the postgresql package)"
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pick_port() {
  if [[ -n "${WEIR_POSTGRES_PORT:-}" ]]; then
    echo "$WEIR_POSTGRES_PORT"
    return
  fi
  local p=15432
  while port_in_use "$p"; do p=$((p + 1)); done
  echo "$p"
}

running() {
  local b
  b="$(bindir)"
  [[ -n "$b" && -f "$DATA/postmaster.pid" ]] && as_owner "$b/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

url() { cat "$URLFILE"; }

cmd_start() {
  ensure_installed
  local b port
  b="$(bindir)"
  mkdir -p "$DIR"
  if running; then
    say "already running"
    url
    return 0
  fi
  if [[ "$(id -u)" -eq 0 ]]; then
    chown postgres: "$DIR"
    runuser -u postgres -- test -w "$DIR" \
      || die "the postgres user cannot write to $DIR (a parent directory is closed to it); set WEIR_POSTGRES_DIR to a directory under /tmp"
  fi
  if [[ ! -f "$DATA/PG_VERSION" ]]; then
    say "initdb in $DATA"
    as_owner "$b/initdb" -D "$DATA" -A trust -U postgres -E UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1 \
      || { cat "$DIR/initdb.log" >&2; die "initdb failed (log above)"; }
  fi
  port="$(sed -n 's/^port = \([0-9]*\).*/\1/p' "$DATA/postgresql.auto.conf" 2>/dev/null | tail -n 1)"
  if [[ -z "$port" ]] || port_in_use "$port"; then
    port="$(pick_port)"
    as_owner sh -c "printf 'port = %s\nlisten_addresses = %s\nunix_socket_directories = %s\nmax_connections = 100\nfsync = on\n' \
      '$port' \"'127.0.0.1'\" \"'$DATA'\" >>'$DATA/postgresql.auto.conf'"
  fi
  say "starting on 127.0.0.1:$port"
  if ! as_owner "$b/pg_ctl" -D "$DATA" -l "$LOG" -w -t "$START_TIMEOUT" start >&2; then
    tail -n 30 "$LOG" >&2 || true
    die "the server did not start (log above, full log in $LOG)"
  fi
  local psql=("$b/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -qAt)
  if [[ "$("${psql[@]}" -c "SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'")" != 1 ]]; then
    "${psql[@]}" -c "CREATE ROLE \"$ROLE\" LOGIN SUPERUSER" >&2
  fi
  if [[ "$("${psql[@]}" -c "SELECT 1 FROM pg_database WHERE datname = '$DB'")" != 1 ]]; then
    "${psql[@]}" -c "CREATE DATABASE \"$DB\" OWNER \"$ROLE\"" >&2
  fi
  echo "postgres://$ROLE@127.0.0.1:$port/$DB" >"$URLFILE"
  url
}

cmd_stop() {
  local keep=0
  [[ "${1:-}" == "--keep" ]] && keep=1
  local b
  b="$(bindir)"
  if [[ -n "$b" ]] && running; then
    as_owner "$b/pg_ctl" -D "$DATA" -m fast -w stop >&2 || die "pg_ctl stop failed"
  fi
  if [[ $keep -eq 0 && -d "$DIR" ]]; then rm -rf "$DIR"; fi
}

cmd_status() {
  if running; then
    echo "running at $(url)"
  else
    echo "not running"
    return 1
  fi
}

cmd_psql() {
  running || die "not running; start it with: scripts/postgres.sh start"
  psql "$(url)" "$@"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) shift; cmd_stop "$@" ;;
  status) cmd_status ;;
  env) running || die "not running"; echo "export WEIR_POSTGRES_URL=$(url)" ;;
  psql) shift; cmd_psql "$@" ;;
  *) usage ;;
esac
