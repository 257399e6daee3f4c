#!/usr/bin/env bash
# benches/nexmark.sh: every implemented Nexmark query at parallelism 1 and 2, with memory
# state and with RocksDB state, checkpointing every second (the figures in
# docs/performance.md#nexmark).
#
#   bash benches/nexmark.sh [EVENTS] [QUERIES...]   # defaults: 10000000 events, all queries
#
# Prints a Markdown table row per (query, configuration): events per second of wall time
# and events per core-second (all generated events / CPU seconds of the whole process,
# generator included), and the JSON lines on stderr. Release build; nothing else should
# run on the machine meanwhile.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

EVENTS="${1:-10000000}"
shift || true
QUERIES=("$@")
if [ ${#QUERIES[@]} -eq 0 ]; then
    QUERIES=(q0 q1 q2 q3 q4 q5 q6 q7 q8 q9 q11 q14 q17 q18 q19 q20 q21 q22)
fi

cargo build --release -p weir-bench >&2
BIN="${CARGO_TARGET_DIR:-target}/release/weir-bench"

field() { sed -E "s/.*\"$1\":([0-9.]+).*/\1/"; }

echo "| query | P | state | events/s | events/core·s | cores | results |"
echo "|---|---|---|---|---|---|---|"
for q in "${QUERIES[@]}"; do
    for p in 1 2; do
        for state in memory rocksdb; do
            args=(nexmark --query "$q" --events "$EVENTS" --parallelism "$p" --state "$state"
                --checkpoint-interval-ms 1000)
            line="$("$BIN" "${args[@]}")"
            echo "$line" >&2
            printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$q" "$p" "$state" \
                "$(field events_per_sec <<<"$line")" "$(field events_per_core_sec <<<"$line")" \
                "$(field cores <<<"$line")" "$(field results <<<"$line")"
        done
    done
done
