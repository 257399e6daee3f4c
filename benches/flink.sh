#!/usr/bin/env bash
# benches/flink.sh: Apache Flink 2.3's RocksDB backend on weir-bench's jobs over state larger
# than memory, for the side-by-side figures in docs/performance-large-state.md: keyed-sum-large (20M
# keys, 100-byte values, incremental checkpoints every second; the default) and
# sliding-window (1 h windows sliding by 1 min over 1M keys, window contents and timers in
# RocksDB), and recovery (process start to first record after a SIGKILL, restoring from a
# retained incremental checkpoint). A manual benchmark: needs Java 17 and Maven; not part of CI.
#
#   bash benches/flink.sh [keyed-sum-large] --dir NEW_DIR [--keys 20000000] [--events N] \
#       [--value-bytes 100] [--parallelism 1] [--budget-mib 200] [--checkpoint-interval-ms 1000]
#   bash benches/flink.sh sliding-window --dir NEW_DIR [--keys 1000000] [--events N] \
#       [--parallelism 1] [--budget-mib 200] [--checkpoint-interval-ms 1000]
#   bash benches/flink.sh recovery --dir NEW_DIR [--keys 10000000] [--value-bytes 100] \
#       [--parallelism 2] [--restore-parallelism P] [--budget-mib 200] [--keep] [--again] [--cold] \
#       [--conf FLINK_KEY=VALUE]...
#
# The flags are weir-bench's for the same job (recovery adds --conf, a Flink setting for
# both of its processes); --budget-mib is Flink's managed memory (the
# RocksDB backend's memory, split evenly over the P slots). Prints one JSON line. The JVM's
# heap is FLINK_BENCH_HEAP (default 1g). NEW_DIR must be new or empty; delete it afterwards.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/flink"

if [ ! -f target/classpath.txt ] || [ pom.xml -nt target/classpath.txt ] \
    || [ -n "$(find src -newer target/classpath.txt -print -quit)" ]; then
    mvn -B -q package -DskipTests >&2
    mvn -B -q dependency:build-classpath -Dmdep.outputFile=target/classpath.txt >&2
fi

main=weir.bench.KeyedSumLarge
case "${1:-}" in
    keyed-sum-large) shift ;;
    sliding-window) main=weir.bench.SlidingWindowCount; shift ;;
    recovery) main=weir.bench.Recovery; shift ;;
esac

exec java -Xms"${FLINK_BENCH_HEAP:-1g}" -Xmx"${FLINK_BENCH_HEAP:-1g}" \
    --add-opens=java.base/java.lang=ALL-UNNAMED \
    --add-opens=java.base/java.util=ALL-UNNAMED \
    --add-opens=java.base/java.nio=ALL-UNNAMED \
    --add-opens=java.base/sun.nio.ch=ALL-UNNAMED \
    -Dlog4j2.level=WARN \
    -cp "target/flink-keyed-sum-large-0.1.0.jar:$(cat target/classpath.txt)" \
    "$main" "$@"
