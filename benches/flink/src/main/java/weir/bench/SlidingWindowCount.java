package weir.bench;

import java.time.Duration;
import java.util.Locale;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.AggregateFunction;
import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.api.common.state.CheckpointListener;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.streaming.api.windowing.assigners.SlidingEventTimeWindows;

/**
 * weir's sliding-window job on Apache Flink's RocksDB state backend (window contents and
 * timers in RocksDB), in a local MiniCluster.
 *
 * <p>Event {@code i} for {@code i in 0..N} has key {@code i % K} and event time
 * {@code i * 60000 / 1000000} ms (a million events per minute of event time); watermarks
 * bounded by 100 ms of out-of-orderness, emitted every 20 ms; key_by(key); event-time windows
 * of 1 h sliding by 1 min; a count per key per window; the sink sums the counts (each event
 * is counted once per window it falls in, so the sum is 60 N when every window fires).
 * Prints one JSON line; events/s is N divided by Flink's net runtime of the job.
 */
public final class SlidingWindowCount {
    static final AtomicLong TOTAL = new AtomicLong();
    static final AtomicLong WINDOWS = new AtomicLong();
    static final Set<Long> COMPLETED = ConcurrentHashMap.newKeySet();

    /** Counts the events of one key's window, as weir's {@code Count} aggregate. */
    public static final class Count implements AggregateFunction<Tuple2<Long, Long>, Long, Long> {
        @Override
        public Long createAccumulator() {
            return 0L;
        }

        @Override
        public Long add(Tuple2<Long, Long> e, Long acc) {
            return acc + 1;
        }

        @Override
        public Long getResult(Long acc) {
            return acc;
        }

        @Override
        public Long merge(Long a, Long b) {
            return a + b;
        }
    }

    /** Adds each fired window's count to the total (the sink side of weir-bench's job). */
    public static final class Sum implements MapFunction<Long, Long>, CheckpointListener {
        @Override
        public Long map(Long c) {
            TOTAL.addAndGet(c);
            WINDOWS.incrementAndGet();
            return c;
        }

        @Override
        public void notifyCheckpointComplete(long checkpointId) {
            COMPLETED.add(checkpointId);
        }
    }

    static final String NAME = "flink-sliding-window-count";

    public static void main(String[] args) throws Exception {
        Bench.Flags f = new Bench.Flags(1_000_000L, "usage: SlidingWindowCount --dir NEW_DIR [--keys 1000000] [--events 10*keys]"
                + " [--parallelism 1] [--budget-mib 200] [--checkpoint-interval-ms 1000]", args);
        if (f.events < 0) {
            f.events = 10 * f.keys;
        }
        Bench.Dirs dirs = f.dirs();
        Configuration conf = Bench.rocksdb(dirs, f.budgetMib, f.parallelism);

        StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(f.parallelism, conf);
        env.getConfig().setAutoWatermarkInterval(20);
        if (f.intervalMs > 0) {
            env.enableCheckpointing(f.intervalMs);
        }
        final long k = f.keys;
        env.fromSequence(0, f.events - 1)
                .map(i -> Tuple2.of(i % k, i))
                .returns(Types.TUPLE(Types.LONG, Types.LONG))
                .assignTimestampsAndWatermarks(WatermarkStrategy
                        .<Tuple2<Long, Long>>forBoundedOutOfOrderness(Duration.ofMillis(100))
                        .withTimestampAssigner((e, ts) -> e.f1 * 60_000L / 1_000_000L))
                .keyBy(t -> t.f0, Types.LONG)
                .window(SlidingEventTimeWindows.of(Duration.ofHours(1), Duration.ofMinutes(1)))
                .aggregate(new Count(), Types.LONG, Types.LONG)
                .map(new Sum())
                .returns(Types.LONG)
                .sinkTo(new DiscardingSink<>());

        Bench.Measured m = Bench.execute(env, dirs, NAME);
        System.out.println(String.format(Locale.ROOT,
                "{\"bench\":\"" + NAME + "\",\"flink_version\":\"%s\",\"events\":%d,\"keys\":%d,"
                        + "\"parallelism\":%d,\"state\":\"rocksdb\",\"timers\":\"rocksdb\",\"incremental\":true,"
                        + "\"managed_memory_mib\":%d,\"checkpoint_interval_ms\":%d,\"elapsed_s\":%.3f,"
                        + "\"wall_s\":%.3f,\"cpu_s\":%.2f,\"events_per_sec\":%d,\"checkpoints_completed\":%d,"
                        + "\"peak_rss_kib\":%d,\"state_dir_bytes\":%d,\"checkpoint_dir_bytes\":%d,"
                        + "\"windows_fired\":%d,\"results\":%d}",
                org.apache.flink.runtime.util.EnvironmentInformation.getVersion(), f.events, f.keys, f.parallelism,
                f.budgetMib, f.intervalMs, m.netS(), m.wallS(), m.cpuS(), Math.round(f.events / m.netS()), COMPLETED.size(),
                Bench.peakRssKib(), m.stateBytes(), m.checkpointBytes(), WINDOWS.get(), TOTAL.get()));
        System.exit(0);
    }
}
