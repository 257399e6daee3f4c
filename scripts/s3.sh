#!/usr/bin/env bash
# scripts/s3.sh: a real S3-compatible server on loopback (S3Proxy on its filesystem
# provider) for weir's object-storage work and its tests: PUT, GET, LIST, DELETE and
# multipart uploads over plain HTTP with AWS v4 signatures. It ignores conditional writes
# (If-None-Match), so correctness must never rest on them.
#
# Usage:
#   scripts/s3.sh start              fetch the jar once, start the server, print its endpoint
#                                    (last stdout line)
#   scripts/s3.sh stop [--keep]      stop it (TERM, then KILL); remove its data unless --keep
#   scripts/s3.sh kill               SIGKILL it (a crash), keep its data; `start` brings it back
#                                    on the same port and data
#   scripts/s3.sh status             "running ..." (exit 0) or "not running" (exit 1)
#   scripts/s3.sh env                print the `export AWS_...` lines a client needs
#   scripts/s3.sh mb BUCKET          create a bucket (a directory of the filesystem provider)
#   scripts/s3.sh fetch              only fetch the jar into the cache
#
#   eval "$(scripts/s3.sh env)"      # after start: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
#                                    # AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ALLOW_HTTP=true
#
# Environment:
#   WEIR_S3_VERSION         S3Proxy version (default 2.6.0; Maven Central org.gaul:s3proxy)
#   WEIR_S3_CACHE           jar cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/weir/s3proxy-VERSION)
#   WEIR_S3_DIR             state dir (default ${TMPDIR:-/tmp}/weir-s3): data/ (one directory
#                           per bucket), s3proxy.conf, server.log, server.pid, endpoint
#   WEIR_S3_PORT            port (default: the first free one from 19000 up, below the kernel's
#                           ephemeral range so no outgoing connection holds it; kept across restarts)
#   WEIR_S3_START_TIMEOUT   seconds to wait for the server to answer (default 60)
#   WEIR_S3_STOP_TIMEOUT    seconds between TERM and KILL (default 10)
#   JAVA_HOME               Java 17+; otherwise `java` on PATH
#
# The credentials are fixed test ones (weir / weir-secret-key): a development and test
# server, never a production one. Only stdout's last line of `start` is the endpoint;
# progress goes to stderr.
set -euo pipefail

VERSION="${WEIR_S3_VERSION:-2.6.0}"
CACHE="${WEIR_S3_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/weir/s3proxy-$VERSION}"
DIR="${WEIR_S3_DIR:-${TMPDIR:-/tmp}/weir-s3}"
START_TIMEOUT="${WEIR_S3_START_TIMEOUT:-60}"
STOP_TIMEOUT="${WEIR_S3_STOP_TIMEOUT:-10}"
ACCESS_KEY=weir
SECRET_KEY=weir-secret-key
REGION=us-east-1
if [[ -n "${JAVA_HOME:-}" ]]; then JAVA="$JAVA_HOME/bin/java"; else JAVA=java; fi

DIR="${DIR%/}"
[[ "$DIR" == /* ]] || DIR="$PWD/$DIR"
JAR="$CACHE/s3proxy-$VERSION-jar-with-dependencies.jar"
PIDFILE="$DIR/server.pid"
LOG="$DIR/server.log"
CONF="$DIR/s3proxy.conf"
ENDPOINT_FILE="$DIR/endpoint"

say() { printf 's3.sh: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

cmd_fetch() {
  [[ -f "$JAR" ]] && return 0
  command -v mvn >/dev/null || die "Maven is needed to fetch S3Proxy (bash scripts/setup.sh installs it)"
  mkdir -p "$CACHE"
  say "fetching org.gaul:s3proxy:$VERSION from Maven Central"
  mvn -q dependency:copy \
    -Dartifact="org.gaul:s3proxy:$VERSION:jar:jar-with-dependencies" \
    -DoutputDirectory="$CACHE" >&2 \
    || die "could not fetch S3Proxy $VERSION (is Maven Central reachable?)"
  [[ -f "$JAR" ]] || die "Maven ran, but $JAR is missing"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pick_port() {
  if [[ -n "${WEIR_S3_PORT:-}" ]]; then
    echo "$WEIR_S3_PORT"
    return
  fi
  local p=19000
  while port_in_use "$p"; do p=$((p + 1)); done
  echo "$p"
}

running() {
  [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

endpoint() { cat "$ENDPOINT_FILE"; }

# Answers any HTTP (S3Proxy answers an anonymous GET / with an S3 error document).
answers() {
  local port="$1"
  (exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && head -c 12 <&3 | grep -q '^HTTP/') 2>/dev/null
}

cmd_start() {
  cmd_fetch
  mkdir -p "$DIR/data"
  if running; then
    say "already running"
    endpoint
    return 0
  fi
  local port=""
  [[ -f "$ENDPOINT_FILE" ]] && port="$(sed -n 's#^http://127.0.0.1:\([0-9]*\)$#\1#p' "$ENDPOINT_FILE")"
  if [[ -z "$port" ]] || port_in_use "$port"; then port="$(pick_port)"; fi
  cat >"$CONF" <<EOF
s3proxy.endpoint=http://127.0.0.1:$port
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity=$ACCESS_KEY
s3proxy.credential=$SECRET_KEY
jclouds.provider=filesystem
jclouds.filesystem.basedir=$DIR/data
EOF
  say "starting S3Proxy $VERSION on 127.0.0.1:$port (data in $DIR/data)"
  nohup "$JAVA" -Xmx256m -jar "$JAR" --properties "$CONF" >"$LOG" 2>&1 &
  echo $! >"$PIDFILE"
  local waited=0
  until answers "$port"; do
    if ! running; then
      tail -n 30 "$LOG" >&2 || true
      die "S3Proxy exited (log above, full log in $LOG)"
    fi
    if (( waited >= START_TIMEOUT * 10 )); then
      tail -n 30 "$LOG" >&2 || true
      die "S3Proxy did not answer within ${START_TIMEOUT}s (log above)"
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  echo "http://127.0.0.1:$port" >"$ENDPOINT_FILE"
  endpoint
}

cmd_stop() {
  local keep=0
  [[ "${1:-}" == "--keep" ]] && keep=1
  if running; then
    local pid waited=0
    pid="$(cat "$PIDFILE")"
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do
      if (( waited >= STOP_TIMEOUT * 10 )); then
        kill -KILL "$pid" 2>/dev/null || true
        break
      fi
      sleep 0.1
      waited=$((waited + 1))
    done
  fi
  rm -f "$PIDFILE"
  if [[ $keep -eq 0 && -d "$DIR" ]]; then rm -rf "$DIR"; fi
}

cmd_kill() {
  running || die "not running"
  local pid
  pid="$(cat "$PIDFILE")"
  kill -KILL "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  rm -f "$PIDFILE"
}

cmd_status() {
  if running; then
    echo "running at $(endpoint) (pid $(cat "$PIDFILE"))"
  else
    echo "not running"
    return 1
  fi
}

cmd_env() {
  running || die "not running; start it with: scripts/s3.sh start"
  cat <<EOF
export AWS_ENDPOINT_URL=$(endpoint)
export AWS_ACCESS_KEY_ID=$ACCESS_KEY
export AWS_SECRET_ACCESS_KEY=$SECRET_KEY
export AWS_REGION=$REGION
export AWS_ALLOW_HTTP=true
EOF
}

cmd_mb() {
  local bucket="${1:-}"
  [[ "$bucket" =~ ^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$ ]] || die "'$bucket' is not a valid bucket name"
  running || die "not running; start it with: scripts/s3.sh start"
  # The filesystem provider keeps a bucket as a directory of its base directory.
  mkdir -p "$DIR/data/$bucket"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) shift; cmd_stop "$@" ;;
  kill) cmd_kill ;;
  status) cmd_status ;;
  env) cmd_env ;;
  mb) shift; cmd_mb "$@" ;;
  fetch) cmd_fetch ;;
  *) usage ;;
esac
