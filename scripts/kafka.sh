#!/usr/bin/env bash
# scripts/kafka.sh: a real single-node Apache Kafka 4.x broker (KRaft, combined
# broker+controller) for weir's tests and for development. Stand-in brokers get
# transactions and fencing wrong, so every exactly-once test runs against this.
#
# Usage:
#   scripts/kafka.sh start              fetch jars once, start the broker, print HOST:PORT (last stdout line)
#   scripts/kafka.sh stop [--keep]      stop it (TERM, then KILL); remove its state unless --keep
#   scripts/kafka.sh kill               SIGKILL it (a crash), keep its state; `start` brings it back
#                                       (that start takes ~13 s: the controller first waits out the
#                                       dead incarnation's broker.session.timeout.ms, 9 s)
#   scripts/kafka.sh restart            stop --keep, then start on the same data and ports
#   scripts/kafka.sh status             "running ..." (exit 0) or "not running" (exit 1)
#   scripts/kafka.sh env                print `export WEIR_KAFKA_BROKERS=127.0.0.1:PORT`
#   scripts/kafka.sh fetch              only fetch the jars into the cache
#   scripts/kafka.sh topic create NAME PARTITIONS [TopicCommand args...]
#   scripts/kafka.sh topic list | describe [NAME] | delete NAME
#   scripts/kafka.sh perf ARGS...       org.apache.kafka.tools.ProducerPerformance against the broker
#   scripts/kafka.sh consume TOPIC [ConsoleConsumer args...]
#                                       read_committed, from the beginning, keys printed, stops
#                                       after WEIR_KAFKA_CONSUME_TIMEOUT_MS (10000) without records;
#                                       args may override --isolation-level/--timeout-ms/--offset.
#                                       It ends by logging "ERROR ... TimeoutException" and
#                                       "Processed a total of N messages" on stderr, exit code 0.
#   scripts/kafka.sh tool CLASS ARGS... any other Kafka tool class on the broker's classpath
#
#   eval "$(scripts/kafka.sh env)"      # after start: sets WEIR_KAFKA_BROKERS
#   scripts/kafka.sh perf --topic t --num-records 200000 --record-size 100 --throughput -1 \
#       --transactional-id x --transaction-duration-ms 1000
#   (perf and consume point the tool at the running broker themselves; `perf` adds
#    `--producer.config` with bootstrap.servers unless you pass one.)
#
# Environment:
#   WEIR_KAFKA_VERSION              Kafka version (default 4.1.1)
#   WEIR_KAFKA_CACHE                jar cache (default ${XDG_CACHE_HOME:-$HOME/.cache}/weir/kafka-VERSION);
#                                   filled once by `mvn dependency:copy-dependencies` on a generated pom
#   WEIR_KAFKA_DIR                  state dir (default ${TMPDIR:-/tmp}/weir-kafka): server.properties,
#                                   data/, broker.log, broker.pid, bootstrap (HOST:PORT)
#   WEIR_KAFKA_TXN_MAX_TIMEOUT_MS   broker transaction.max.timeout.ms (default 900000)
#   WEIR_KAFKA_START_TIMEOUT        seconds to wait for the broker to answer (default 90)
#   WEIR_KAFKA_CONSUME_TIMEOUT_MS   `consume` stops after this long without a record (default 10000)
#   WEIR_KAFKA_STOP_TIMEOUT         seconds between TERM and KILL (default 30)
#   WEIR_KAFKA_HEAP                 broker heap flags (default "-Xmx512m -Xms256m")
#   WEIR_KAFKA_LOG_LEVEL            broker root log level in broker.log (default INFO)
#   WEIR_KAFKA_EXTRA_PROPS          extra server.properties lines, newline- or space-separated k=v
#   WEIR_KAFKA_SLF4J_BINDING        group:artifact:version of the SLF4J binding fetched with the jars
#                                   (default org.apache.logging.log4j:log4j-slf4j-impl:2.24.3, which
#                                   matches Kafka 4.1's slf4j-api 1.7 and log4j-core 2.24)
#   JAVA_HOME                       Java 17+ (Kafka 4.x needs it); otherwise `java` on PATH
#
# Only stdout's last line of `start` is the address; progress goes to stderr.
set -euo pipefail

VERSION="${WEIR_KAFKA_VERSION:-4.1.1}"
CACHE="${WEIR_KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/weir/kafka-$VERSION}"
DIR="${WEIR_KAFKA_DIR:-${TMPDIR:-/tmp}/weir-kafka}"
TXN_MAX_TIMEOUT_MS="${WEIR_KAFKA_TXN_MAX_TIMEOUT_MS:-900000}"
START_TIMEOUT="${WEIR_KAFKA_START_TIMEOUT:-90}"
STOP_TIMEOUT="${WEIR_KAFKA_STOP_TIMEOUT:-30}"
HEAP="${WEIR_KAFKA_HEAP:--Xmx512m -Xms256m}"
LOG_LEVEL="${WEIR_KAFKA_LOG_LEVEL:-INFO}"
EXTRA_PROPS="${WEIR_KAFKA_EXTRA_PROPS:-}"
SLF4J_BINDING="${WEIR_KAFKA_SLF4J_BINDING:-org.apache.logging.log4j:log4j-slf4j-impl:2.24.3}"
CONSUME_TIMEOUT_MS="${WEIR_KAFKA_CONSUME_TIMEOUT_MS:-10000}"
if [[ -n "${JAVA_HOME:-}" ]]; then JAVA="$JAVA_HOME/bin/java"; else JAVA=java; fi

DIR="${DIR%/}"
[[ "$DIR" == /* ]] || DIR="$PWD/$DIR"
PIDFILE="$DIR/broker.pid"
LOG="$DIR/broker.log"
PROPS="$DIR/server.properties"
BOOTFILE="$DIR/bootstrap"
MARKER="$DIR/.weir-kafka"
LOCK="$DIR.lock"

say() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

# One start/stop at a time per state dir (tests may call start in parallel).
take_lock() {
  mkdir -p "$(dirname "$DIR")"
  exec 9>"$LOCK"
  if command -v flock >/dev/null 2>&1; then
    flock -w 300 9 || die "timed out waiting for $LOCK"
  fi
}

# ---------------------------------------------------------------- jars

fetch_jars() {
  [[ -f "$CACHE/.complete" ]] && return 0
  command -v mvn >/dev/null 2>&1 || die "mvn not found: needed once to fetch Kafka $VERSION into $CACHE"
  mkdir -p "$(dirname "$CACHE")"
  exec 8>"$CACHE.lock"
  if command -v flock >/dev/null 2>&1; then flock -w 900 8 || die "timed out waiting for $CACHE.lock"; fi
  if [[ -f "$CACHE/.complete" ]]; then exec 8>&-; return 0; fi

  local b_group b_artifact b_version work t0
  IFS=: read -r b_group b_artifact b_version <<<"$SLF4J_BINDING"
  [[ -n "$b_group" && -n "$b_artifact" && -n "$b_version" ]] \
    || die "WEIR_KAFKA_SLF4J_BINDING must be group:artifact:version, got '$SLF4J_BINDING'"
  work="$(mktemp -d "${TMPDIR:-/tmp}/weir-kafka-fetch.XXXXXX")"
  # connect-runtime (Jetty, Jersey, ...) comes with kafka-tools only for the Connect
  # plugin tool; none of the tools used here needs it.
  cat >"$work/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>weir.local</groupId>
  <artifactId>weir-kafka-jars</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>$VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka-tools</artifactId>
      <version>$VERSION</version>
      <exclusions>
        <exclusion>
          <groupId>org.apache.kafka</groupId>
          <artifactId>connect-runtime</artifactId>
        </exclusion>
      </exclusions>
    </dependency>
    <dependency>
      <groupId>$b_group</groupId>
      <artifactId>$b_artifact</artifactId>
      <version>$b_version</version>
    </dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>3.8.1</version>
      </plugin>
    </plugins>
  </build>
</project>
EOF
  say "fetching Kafka $VERSION jars into $CACHE (once) ..."
  t0=$SECONDS
  if ! (cd "$work" && mvn -q -B dependency:copy-dependencies \
          -DincludeScope=runtime -DoutputDirectory="$work/jars") >"$work/mvn.log" 2>&1; then
    tail -n 40 "$work/mvn.log" >&2
    rm -rf "$work"
    die "could not fetch org.apache.kafka:kafka_2.13:$VERSION (is WEIR_KAFKA_VERSION a released 4.x?)"
  fi
  compgen -G "$work/jars/kafka_2.13-*.jar" >/dev/null || { rm -rf "$work"; die "fetch produced no kafka_2.13 jar"; }
  cp "$work/pom.xml" "$work/jars/fetch-pom.xml"
  touch "$work/jars/.complete"
  rm -rf "$CACHE"
  mv "$work/jars" "$CACHE"
  rm -rf "$work"
  say "fetched $(find "$CACHE" -name '*.jar' | wc -l) jars in $((SECONDS - t0)) s"
  exec 8>&-
}

# ---------------------------------------------------------------- process

read_pid() { [[ -f "$PIDFILE" ]] && tr -dc '0-9' <"$PIDFILE"; }

# True if the pid file names a live kafka.Kafka that was started with our server.properties.
running() {
  local pid
  pid="$(read_pid)" || return 1
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
  local args
  if [[ -r "/proc/$pid/cmdline" ]]; then
    args="$(tr '\0' ' ' <"/proc/$pid/cmdline")"
  else
    args="$(ps -p "$pid" -o args= 2>/dev/null)" || return 1
  fi
  [[ "$args" == *"kafka.Kafka $PROPS"* ]]
}

prop() { sed -n "s/^$1=//p" "$PROPS" 2>/dev/null | tail -n 1; }
broker_port() { prop listeners | sed -n 's/.*PLAINTEXT:\/\/[^:,]*:\([0-9]*\).*/\1/p'; }
controller_port() { prop listeners | sed -n 's/.*CONTROLLER:\/\/[^:,]*:\([0-9]*\).*/\1/p'; }

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Two distinct free loopback ports below the ephemeral range, so that no outgoing
# connection grabs them between this check and the broker's bind.
pick_ports() {
  if command -v python3 >/dev/null 2>&1 && python3 -c '' 2>/dev/null; then
    python3 - <<'EOF'
import random, socket
held, ports = [], []
for _ in range(2000):
    p = random.randint(20000, 32000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        s.close()
        continue
    held.append(s)
    ports.append(p)
    if len(ports) == 2:
        break
print(*ports)
EOF
    return
  fi
  local p ports=() tries=0
  while ((${#ports[@]} < 2 && tries++ < 2000)); do
    p=$((20000 + RANDOM % 12000))
    [[ " ${ports[*]} " == *" $p "* ]] && continue
    port_in_use "$p" || ports+=("$p")
  done
  echo "${ports[@]}"
}

# A real Kafka request over bash's /dev/tcp: Metadata v4 for no topics. A broker
# that answers it with itself in the broker list has caught up and is unfenced.
probe() {
  local port="$1" out
  # shellcheck disable=SC2016 # expanded by the inner bash
  out="$(timeout 5 bash -c '
      exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
      # size=19 | api_key=3 | api_version=4 | correlation_id=1 | client_id="weir" | topics=[] | allow_auto_create=false
      printf "\x00\x00\x00\x13\x00\x03\x00\x04\x00\x00\x00\x01\x00\x04weir\x00\x00\x00\x00\x00" >&3
      head -c 16 <&3 | od -An -v -tu1' _ "$port" 2>/dev/null)" || return 1
  # shellcheck disable=SC2206 # word-split od's numbers on purpose
  local b=($out)
  ((${#b[@]} == 16)) || return 1
  # bytes 4..7 correlation id (1), 8..11 throttle_time_ms, 12..15 broker count
  ((b[7] == 1)) || return 1
  (((b[12] << 24 | b[13] << 16 | b[14] << 8 | b[15]) >= 1))
}

java_tool_opts() {
  printf '%s\n' -Xmx256m -XX:+UseSerialGC -Djava.awt.headless=true \
    "-Dlog4j2.configurationFile=$DIR/tools-log4j2.properties"
}

write_configs() {
  local port="$1" cport="$2"
  cat >"$PROPS" <<EOF
# Written by scripts/kafka.sh: single-node KRaft broker+controller for weir's tests.
process.roles=broker,controller
node.id=1
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
controller.quorum.bootstrap.servers=127.0.0.1:$cport
log.dirs=$DIR/data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false
delete.topic.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
transaction.max.timeout.ms=$TXN_MAX_TIMEOUT_MS
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
transaction.remove.expired.transaction.cleanup.interval.ms=60000
log.retention.hours=24
log.retention.bytes=-1
log.segment.bytes=67108864
log.retention.check.interval.ms=60000
log.cleaner.dedupe.buffer.size=33554432
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
EOF
  if [[ -n "$EXTRA_PROPS" ]]; then
    printf '# WEIR_KAFKA_EXTRA_PROPS\n' >>"$PROPS"
    tr ' ' '\n' <<<"$EXTRA_PROPS" | sed '/^$/d' >>"$PROPS"
  fi
  cat >"$DIR/log4j2.properties" <<EOF
# Broker logging: everything to stdout, which start sends to broker.log.
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = $LOG_LEVEL
rootLogger.appenderRef.out.ref = OUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.requestchannel.name = kafka.network.RequestChannel\$
logger.requestchannel.level = WARN
EOF
  cat >"$DIR/tools-log4j2.properties" <<'EOF'
# Kafka tools run by scripts/kafka.sh: warnings and errors only, to stderr.
status = warn
appender.err.type = Console
appender.err.name = ERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = ERR
EOF
}

# base64url of 16 random bytes, 22 characters: what `kafka-storage.sh random-uuid` prints.
cluster_id() {
  local id
  while :; do
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    [[ "$id" != -* ]] && { echo "$id"; return; }
  done
}

fail_start() {
  say "error: $*"
  if [[ -f "$LOG" ]]; then
    say "last lines of $LOG:"
    tail -n 40 "$LOG" >&2
  fi
  local pid
  pid="$(read_pid || true)"
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$PIDFILE" "$BOOTFILE"
  exit 1
}

cmd_start() {
  take_lock
  if running; then
    local port
    port="$(broker_port)"
    if probe "$port"; then
      say "already running (pid $(read_pid))"
      echo "127.0.0.1:$port"
      return 0
    fi
    say "pid $(read_pid) is up but not answering yet; waiting"
    wait_ready "$port" "$(read_pid)"
    echo "127.0.0.1:$port" >"$BOOTFILE"
    echo "127.0.0.1:$port"
    return 0
  fi

  "$JAVA" -version >/dev/null 2>&1 || die "java not found (Kafka $VERSION needs Java 17+; set JAVA_HOME)"
  fetch_jars

  local port cport reuse=0
  if [[ -f "$MARKER" && -f "$PROPS" && -f "$DIR/data/meta.properties" ]]; then
    # State kept by `stop --keep` or `kill`: start on the same data and ports.
    reuse=1
    port="$(broker_port)"
    cport="$(controller_port)"
    [[ -n "$port" && -n "$cport" ]] || die "cannot read ports from $PROPS; run '$0 stop' to reset"
    for p in "$port" "$cport"; do
      port_in_use "$p" && die "port $p (from kept state in $DIR) is taken; run '$0 stop' to reset"
    done
    say "restarting on kept state in $DIR"
  else
    if [[ -e "$DIR" ]]; then
      if [[ -f "$MARKER" ]]; then
        rm -rf "$DIR"
      elif [[ -n "$(ls -A "$DIR" 2>/dev/null)" ]]; then
        die "$DIR exists, is not empty and was not made by this script; set WEIR_KAFKA_DIR elsewhere"
      fi
    fi
    mkdir -p "$DIR/data"
    touch "$MARKER"
    read -r port cport < <(pick_ports)
    [[ -n "${port:-}" && -n "${cport:-}" ]] || die "could not find two free ports on 127.0.0.1"
    write_configs "$port" "$cport"
  fi
  rm -f "$BOOTFILE" "$PIDFILE"

  if ((reuse == 0)); then
    local cid
    cid="$(cluster_id)"
    # shellcheck disable=SC2046
    if ! "$JAVA" $(java_tool_opts) -cp "$CACHE/*" kafka.tools.StorageTool \
        format --standalone -t "$cid" -c "$PROPS" >"$DIR/format.log" 2>&1; then
      cat "$DIR/format.log" >&2
      die "kafka.tools.StorageTool format failed"
    fi
  fi

  say "starting Kafka $VERSION on 127.0.0.1:$port (controller $cport), state in $DIR"
  # setsid + nohup: the broker outlives this shell and its caller's session.
  # It keeps no descriptor but 0-2, so no caller's pipe (nor our lock) stays open.
  # shellcheck disable=SC2086 # HEAP holds several flags
  # shellcheck disable=SC2016 # expanded by the inner bash
  setsid nohup bash -c 'echo $$ >"$1"; shift
      for fd in /proc/self/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] && eval "exec $fd>&-"; done
      exec "$@"' _ "$PIDFILE" \
    "$JAVA" $HEAP -XX:+UseSerialGC -Djava.awt.headless=true \
    "-Dlog4j2.configurationFile=$DIR/log4j2.properties" \
    -cp "$CACHE/*" kafka.Kafka "$PROPS" </dev/null >>"$LOG" 2>&1 9>&- &
  local launcher=$! t=0
  while [[ ! -s "$PIDFILE" ]] && ((t++ < 50)); do sleep 0.1; done
  [[ -s "$PIDFILE" ]] || fail_start "the broker process did not start"
  wait_ready "$port" "$(read_pid)"
  disown "$launcher" 2>/dev/null || true
  echo "127.0.0.1:$port" >"$BOOTFILE"
  say "ready in $((SECONDS - START_T0)) s (pid $(read_pid), log $LOG)"
  echo "127.0.0.1:$port"
}

wait_ready() {
  local port="$1" pid="$2" deadline=$((SECONDS + START_TIMEOUT))
  while ((SECONDS < deadline)); do
    kill -0 "$pid" 2>/dev/null || fail_start "the broker exited during startup"
    if probe "$port"; then return 0; fi
    sleep 0.5
  done
  fail_start "the broker did not answer on 127.0.0.1:$port within $START_TIMEOUT s"
}

cmd_stop() {
  local keep=0
  case "${1:-}" in
    --keep) keep=1 ;;
    "") ;;
    *) die "stop takes only --keep" ;;
  esac
  take_lock
  local pid
  pid="$(read_pid || true)"
  if running; then
    say "stopping pid $pid"
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      say "still up after $STOP_TIMEOUT s; sending KILL"
      kill -KILL "$pid" 2>/dev/null || true
      while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
    say "stopped"
  else
    say "not running"
  fi
  rm -f "$PIDFILE" "$BOOTFILE"
  if ((keep == 0)) && [[ -e "$DIR" ]]; then
    if [[ -f "$MARKER" ]]; then
      rm -rf "$DIR"
    else
      say "left $DIR alone: it was not made by this script"
    fi
  fi
}

cmd_kill() {
  take_lock
  local pid
  pid="$(read_pid || true)"
  running || { say "not running"; return 0; }
  kill -KILL "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  rm -f "$PIDFILE" "$BOOTFILE"
  say "killed pid $pid; state kept in $DIR"
}

# Address of the running broker, or die.
address() {
  running || die "no broker running for $DIR (run: $0 start)"
  local port
  port="$(broker_port)"
  [[ -n "$port" ]] || die "cannot read the port from $PROPS"
  echo "127.0.0.1:$port"
}

cmd_status() {
  if running; then
    local port
    port="$(broker_port)"
    if probe "$port"; then
      echo "running: pid $(read_pid), 127.0.0.1:$port, Kafka $VERSION, state $DIR"
    else
      echo "running but not answering: pid $(read_pid), 127.0.0.1:$port, state $DIR"
    fi
    return 0
  fi
  echo "not running (state $DIR)"
  return 1
}

run_tool() {
  local class="$1"
  shift
  [[ -f "$CACHE/.complete" ]] || die "no jars in $CACHE (run: $0 start)"
  # shellcheck disable=SC2046
  exec "$JAVA" $(java_tool_opts) -cp "$CACHE/*" "$class" "$@"
}

cmd_topic() {
  local addr sub="${1:-}"
  addr="$(address)"
  shift || true
  case "$sub" in
    create)
      (($# >= 2)) || die "usage: $0 topic create NAME PARTITIONS [args...]"
      local name="$1" parts="$2"
      shift 2
      run_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$addr" \
        --create --topic "$name" --partitions "$parts" --replication-factor 1 "$@" ;;
    list) run_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$addr" --list "$@" ;;
    describe)
      if (($# >= 1)) && [[ "$1" != -* ]]; then
        local name="$1"
        shift
        set -- --topic "$name" "$@"
      fi
      run_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$addr" --describe "$@" ;;
    delete)
      (($# >= 1)) || die "usage: $0 topic delete NAME"
      run_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$addr" --delete --topic "$@" ;;
    *) die "usage: $0 topic create NAME PARTITIONS | list | describe [NAME] | delete NAME" ;;
  esac
}

cmd_perf() {
  local addr
  addr="$(address)"
  local a has_bootstrap=0
  for a in "$@"; do
    case "$a" in
      --producer.config | --command-config | --bootstrap-server | bootstrap.servers=*) has_bootstrap=1 ;;
    esac
  done
  if ((has_bootstrap == 0)); then
    printf 'bootstrap.servers=%s\n' "$addr" >"$DIR/perf-producer.properties"
    set -- "$@" --producer.config "$DIR/perf-producer.properties"
  fi
  run_tool org.apache.kafka.tools.ProducerPerformance "$@"
}

cmd_consume() {
  (($# >= 1)) || die "usage: $0 consume TOPIC [ConsoleConsumer args...]"
  local addr topic="$1" a isolation=1 timeout=1 beginning=1
  shift
  addr="$(address)"
  # The console consumer refuses an option given twice, so a default is added
  # only where the caller's args do not set it.
  for a in "$@"; do
    case "$a" in
      --isolation-level) isolation=0 ;;
      --timeout-ms) timeout=0 ;;
      --offset | --from-beginning) beginning=0 ;;
    esac
  done
  local defaults=()
  ((isolation)) && defaults+=(--isolation-level read_committed)
  ((beginning)) && defaults+=(--from-beginning)
  ((timeout)) && defaults+=(--timeout-ms "$CONSUME_TIMEOUT_MS")
  run_tool org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$addr" \
    --topic "$topic" --property print.key=true "${defaults[@]}" "$@"
}

START_T0=$SECONDS
cmd="${1:-}"
shift || true
case "$cmd" in
  start) cmd_start ;;
  stop) cmd_stop "$@" ;;
  kill) cmd_kill ;;
  restart) cmd_stop --keep; exec 9>&-; cmd_start ;;
  status) cmd_status ;;
  env)
    addr="$(address)"
    echo "export WEIR_KAFKA_BROKERS=$addr" ;;
  fetch) fetch_jars; echo "$CACHE" ;;
  topic) cmd_topic "$@" ;;
  perf) cmd_perf "$@" ;;
  consume) cmd_consume "$@" ;;
  tool)
    (($# >= 1)) || die "usage: $0 tool CLASS [args...]"
    run_tool "$@" ;;
  -h | --help | help) usage ;;
  *) usage ;;
esac
