#!/usr/bin/env bash
# benches/cluster.sh: keyed-sum at parallelism 2 in one process against the same job on two
# worker processes of one slot each, and on one worker of two slots (the figures in
# docs/performance.md#cluster-network-exchange), heap state, without checkpoints and with a
# checkpoint every second.
#
#   bash benches/cluster.sh [EVENTS] [RUNS]   # defaults: 200000000 events, 5 runs
#
# The six configurations run in turn, RUNS rounds, so that a busy spell of the machine
# hits all of them alike. Prints one JSON line per run on stderr and, per configuration,
# the median and range of events/s and of CPU nanoseconds per event (all processes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

EVENTS="${1:-200000000}"
RUNS="${2:-5}"

cargo build --release -p weir-bench >&2
# A copy, so that a rebuild during the series cannot swap the binary under it (the
# workers are started from the coordinator's own executable).
BIN="$(mktemp -d)/weir-bench"
cp "${CARGO_TARGET_DIR:-target}/release/weir-bench" "$BIN"
OUT="$(mktemp)"
trap 'rm -rf "$(dirname "$BIN")" "$OUT"' EXIT

# One worker with two slots runs in cluster mode with every channel inside its process:
# against one process it shows the cost of cluster mode without the network.
CONFIGS=("one process|" "1 worker x 2 slots|--workers 1" "2 workers x 1 slot|--workers 2")
for round in $(seq "$RUNS"); do
    for ck in 0 1000; do
        for c in "${CONFIGS[@]}"; do
            name="${c%%|*}"
            read -r -a extra <<<"${c#*|}"
            args=(keyed-sum --events "$EVENTS" --keys 100000 --parallelism 2 --state memory
                --checkpoint-interval-ms "$ck")
            dir=""
            if [ "$ck" -gt 0 ]; then
                dir="$(mktemp -d)"
                args+=(--checkpoint-dir "$dir/ck")
            fi
            line="$("$BIN" "${args[@]}" "${extra[@]}" 2>/dev/null)"
            [ -n "$dir" ] && rm -rf "$dir"
            echo "round $round: $name: $line" >&2
            printf '%s|%s|%s\n' "$name" "$ck" "$line" >>"$OUT"
        done
    done
done

python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = {}
for l in open(sys.argv[1]):
    name, ck, line = l.rstrip("\n").split("|", 2)
    rows.setdefault((int(ck), name), []).append(json.loads(line))
print("| configuration | checkpoints | events/s, median (range) | CPU ns/event, median (range) | results |")
print("|---|---|---|---|---|")
for (ck, name), runs in sorted(rows.items(), key=lambda kv: (kv[0][0], ["one process", "1 worker x 2 slots"].index(kv[0][1]) if kv[0][1] in ("one process", "1 worker x 2 slots") else 2)):
    eps = [r["events_per_sec"] for r in runs]
    ns = [r["cpu_s"] * 1e9 / r["events"] for r in runs if r.get("cpu_s") is not None]
    res = sorted({r["results"] for r in runs})
    cks = "none" if ck == 0 else f"every {ck} ms"
    nsf = f"{statistics.median(ns):.0f} ({min(ns):.0f}–{max(ns):.0f})" if ns else "—"
    print(f"| {name} | {cks} | {statistics.median(eps)/1e6:.2f}M ({min(eps)/1e6:.2f}M–{max(eps)/1e6:.2f}M) | {nsf} | {', '.join(map(str, res))} |")
EOF
