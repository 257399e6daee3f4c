#!/usr/bin/env bash
# benches/cluster_tls.sh: what TLS (and the secret's handshake) costs the cluster exchange:
# keyed-sum at parallelism 2 on two worker processes of one slot each, heap state, no
# checkpoints, plain text against TLS (a CA and certificates made here with openssl), in
# turn for RUNS rounds (docs/performance.md#cluster-tls-and-the-secret).
#
#   bash benches/cluster_tls.sh [EVENTS] [RUNS]   # defaults: 100000000 events, 5 runs
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

EVENTS="${1:-100000000}"
RUNS="${2:-5}"

cargo build --release -p weir-bench >&2
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
BIN="$WORK/weir-bench"
cp "${CARGO_TARGET_DIR:-target}/release/weir-bench" "$BIN"

# A CA of its own and one certificate every process uses.
mkdir "$WORK/tls"
(
    cd "$WORK/tls"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
        -subj /CN=weir-bench-ca -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=weir \
        -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout tls.key -out tls.csr 2>/dev/null
    openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
        -copy_extensions copy -out tls.crt 2>/dev/null
)
printf 'bench-secret-0123456789abcdef\n' >"$WORK/secret"

OUT="$WORK/runs"
for round in $(seq "$RUNS"); do
    for mode in plain tls; do
        args=(keyed-sum --events "$EVENTS" --keys 100000 --parallelism 2 --state memory --workers 2)
        if [ "$mode" = tls ]; then
            line="$(WEIR_TLS_DIR="$WORK/tls" WEIR_SECRET_FILE="$WORK/secret" "$BIN" "${args[@]}" 2>/dev/null)"
        else
            line="$(env -u WEIR_TLS_DIR -u WEIR_SECRET_FILE "$BIN" "${args[@]}" 2>/dev/null)"
        fi
        echo "round $round: $mode: $line" >&2
        printf '%s|%s\n' "$mode" "$line" >>"$OUT"
    done
done

python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = {}
for l in open(sys.argv[1]):
    mode, line = l.rstrip("\n").split("|", 1)
    rows.setdefault(mode, []).append(json.loads(line))
print("| exchange | events/s, median (range) | CPU ns/event, median (range) | results |")
print("|---|---|---|---|")
for mode in ("plain", "tls"):
    runs = rows.get(mode, [])
    if not runs:
        continue
    eps = [r["events_per_sec"] for r in runs]
    ns = [r["cpu_s"] * 1e9 / r["events"] for r in runs if r.get("cpu_s") is not None]
    res = sorted({r["results"] for r in runs})
    print(f"| {mode} | {statistics.median(eps)/1e6:.2f}M ({min(eps)/1e6:.2f}–{max(eps)/1e6:.2f}M) | "
          f"{statistics.median(ns):.0f} ({min(ns):.0f}–{max(ns):.0f}) | {', '.join(map(str, res))} |" if ns else
          f"| {mode} | {statistics.median(eps)/1e6:.2f}M | - | {res} |")
if rows.get("plain") and rows.get("tls"):
    p = statistics.median(r["events_per_sec"] for r in rows["plain"])
    t = statistics.median(r["events_per_sec"] for r in rows["tls"])
    print(f"\nTLS throughput / plain: {t/p:.3f} ({(1-t/p)*100:+.1f}% cost)")
PY
