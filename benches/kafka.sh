#!/usr/bin/env bash
# benches/kafka.sh: kafka_sum's throughput against the broker's own transactional produce
# rate, measured on the same machine and broker (the figures in docs/performance.md#kafka).
#
#   bash benches/kafka.sh [RECORDS] [RUNS]      # defaults: 2000000 records, 3 runs each
#
# It starts its own broker with scripts/kafka.sh (state in ${TMPDIR:-/tmp}/weir-bench-kafka,
# stopped at the end), fills a 3-partition input topic with RECORDS `key-N`/value records
# over 1000 keys (kafka_load), then measures, RUNS times each, reporting the median:
#   - ProducerPerformance (Kafka's own tool, from the broker's jars): RECORDS records of 16
#     bytes (about the size of kafka_sum's output records), in transactions of 1 s;
#   - kafka_sum --bounded at parallelism 1 and 2 with 1 s checkpoints: read every input
#     record read_committed, keep the running sum per key, write one output record per input
#     record through the exactly-once sink. Its rate is RECORDS / the job's wall time (from
#     job start to the last commit).
# Release builds; nothing else should run on the machine meanwhile.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

RECORDS="${1:-2000000}"
RUNS="${2:-3}"
export WEIR_KAFKA_DIR="${TMPDIR:-/tmp}/weir-bench-kafka"
KAFKA="bash scripts/kafka.sh"

cargo build --release --example kafka_sum --example kafka_load >&2
BIN="${CARGO_TARGET_DIR:-target}/release/examples"

trap '$KAFKA stop >/dev/null 2>&1 || true' EXIT
BROKERS="$($KAFKA start | tail -n 1)"
echo "broker at $BROKERS" >&2

$KAFKA topic create bench-in 3 >/dev/null 2>&1
"$BIN/kafka_load" --brokers "$BROKERS" --topic bench-in --records "$RECORDS" --keys 1000

median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

producer_rate() {
    local i
    for i in $(seq 1 "$RUNS"); do
        $KAFKA topic create "bench-pp-$i" 3 >/dev/null 2>&1
        $KAFKA perf --topic "bench-pp-$i" --num-records "$RECORDS" --record-size 16 \
            --throughput -1 --transactional-id "bench-pp-$i" --transaction-duration-ms 1000 \
            2>/dev/null | tail -n 1 | sed -E 's/.* records sent, ([0-9.]+) records\/sec.*/\1/'
    done
}

kafka_sum_rate() {
    local p="$1" i secs ck
    for i in $(seq 1 "$RUNS"); do
        $KAFKA topic create "bench-out-$p-$i" 3 >/dev/null 2>&1
        ck="$(mktemp -d)"
        secs="$("$BIN/kafka_sum" --brokers "$BROKERS" --input-topic bench-in \
            --output-topic "bench-out-$p-$i" --checkpoint-dir "$ck" --bounded \
            --parallelism "$p" --checkpoint-interval-ms 1000 \
            --transactional-id-prefix "bench-$p-$i" 2>&1 \
            | sed -nE 's/.*records read in ([0-9.]+)s.*/\1/p')"
        rm -rf "$ck"
        awk -v n="$RECORDS" -v s="$secs" 'BEGIN { printf "%.0f\n", n / s }'
    done
}

runs_pp="$(producer_rate | tr '\n' ' ')"
runs_p1="$(kafka_sum_rate 1 | tr '\n' ' ')"
runs_p2="$(kafka_sum_rate 2 | tr '\n' ' ')"
pp="$(echo "$runs_pp" | tr ' ' '\n' | grep . | median)"
p1="$(echo "$runs_p1" | tr ' ' '\n' | grep . | median)"
p2="$(echo "$runs_p2" | tr ' ' '\n' | grep . | median)"
printf '\n%-58s %12s %8s   %s\n' "job ($RECORDS records, median of $RUNS)" "records/s" "ratio" "runs"
printf '%-58s %12.0f %8s   %s\n' "ProducerPerformance, transactional (1 s), 16-byte records" "$pp" "100%" "$runs_pp"
for row in "kafka_sum P=1, 1 s checkpoints, exactly-once:$p1:$runs_p1" "kafka_sum P=2, 1 s checkpoints, exactly-once:$p2:$runs_p2"; do
    IFS=: read -r name rate runs <<<"$row"
    printf '%-58s %12.0f %7.0f%%   %s\n' "$name" "$rate" "$(awk -v a="$rate" -v b="$pp" 'BEGIN { print 100 * a / b }')" "$runs"
done
