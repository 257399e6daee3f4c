#!/usr/bin/env bash
# benches/object_storage.sh: what checkpoints on object storage cost against a local
# directory: keyed-sum on RocksDB with incremental checkpoints every second, parallelism 2,
# checkpoints into a local directory and into an S3-compatible server (S3Proxy on this
# machine, started here by scripts/s3.sh) in turn for RUNS rounds. Prints, per run, the
# throughput and the checkpoints' durations as the job logged them
# and the CPU time of the job and of the server (docs/performance.md#checkpoints-on-object-storage).
#
#   bash benches/object_storage.sh [EVENTS] [RUNS]   # defaults: 20000000 events, 3 runs
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

EVENTS="${1:-20000000}"
RUNS="${2:-3}"

cargo build --release -p weir-bench >&2
WORK="$(mktemp -d)"
export WEIR_S3_DIR="$WORK/s3"
trap 'bash scripts/s3.sh stop >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
BIN="$WORK/weir-bench"
cp "${CARGO_TARGET_DIR:-target}/release/weir-bench" "$BIN"

bash scripts/s3.sh start >/dev/null
bash scripts/s3.sh mb bench
eval "$(bash scripts/s3.sh env)"

# CPU seconds the S3 server (a Java process on this same machine) has used so far: on a
# machine of 2 cores it competes with the job, which a remote store would not.
server_cpu() {
    local pid
    pid="$(cat "$WEIR_S3_DIR/server.pid")"
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$pid/stat"
}

printf '%-6s %-5s %14s %12s %16s %16s %10s %12s\n' storage run events_per_s checkpoints mean_ckpt_ms max_ckpt_ms job_cpu_s server_cpu_s
for round in $(seq "$RUNS"); do
    for mode in local s3; do
        if [ "$mode" = local ]; then dir="$WORK/ck-$round"; else dir="s3://bench/ck-$round"; fi
        cpu_before="$(server_cpu)"
        line="$("$BIN" keyed-sum --events "$EVENTS" --keys 100000 --parallelism 2 --state rocksdb \
            --checkpoint-interval-ms 1000 --checkpoint-dir "$dir" 2>"$WORK/log")"
        server="$(awk -v a="$cpu_before" -v b="$(server_cpu)" 'BEGIN { printf "%.2f", b - a }')"
        rate="$(printf '%s' "$line" | sed -n 's/.*"events_per_sec":\([0-9]*\).*/\1/p')"
        cpu="$(printf '%s' "$line" | sed -n 's/.*"cpu_s":\([0-9.]*\).*/\1/p')"
        # "checkpoint N complete (B bytes in D ms)" lines of the job's log.
        read -r count mean max < <(sed -n 's/.*checkpoint [0-9]* complete ([0-9]* bytes in \([0-9]*\) ms).*/\1/p' "$WORK/log" |
            awk '{ n++; s += $1; if ($1 > m) m = $1 } END { if (n) printf "%d %.0f %d\n", n, s / n, m; else print "0 0 0" }')
        printf '%-6s %-5s %14s %12s %16s %16s %10s %12s\n' "$mode" "$round" "$rate" "$count" "$mean" "$max" "$cpu" "$server"
    done
done
