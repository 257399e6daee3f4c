package weir.bench;

import java.util.Locale;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.CheckpointListener;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.PrimitiveArrayTypeInfo;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.util.Collector;

/**
 * weir's keyed-sum-large job on Apache Flink's RocksDB state backend, in a local MiniCluster.
 *
 * <p>Event {@code i} for {@code i in 0..N} has key {@code i % K} and value {@code i}; key_by(key);
 * the state per key is a {@code value-bytes}-long byte array whose first 8 bytes (little-endian)
 * hold the running sum and whose other bytes are the same xorshift filler weir's bench writes
 * (incompressible); every 1000th record a subtask processes emits (key, sum) into a discarding
 * sink. Prints one JSON line; events/s is N divided by Flink's net runtime of the job.
 */
public final class KeyedSumLarge {
    static final AtomicLong EMITTED = new AtomicLong();
    static final Set<Long> COMPLETED = ConcurrentHashMap.newKeySet();

    /** The running sum in the first 8 bytes of a wide value, as weir-bench's WideSum. */
    public static final class WideSum
            extends KeyedProcessFunction<Long, Tuple2<Long, Long>, Tuple2<Long, Long>>
            implements CheckpointListener {
        private final int len;
        private transient ValueState<byte[]> state;
        private transient long seen;

        public WideSum(int len) {
            this.len = len;
        }

        @Override
        public void open(OpenContext ctx) {
            state = getRuntimeContext().getState(
                    new ValueStateDescriptor<>("sum", PrimitiveArrayTypeInfo.BYTE_PRIMITIVE_ARRAY_TYPE_INFO));
        }

        static byte[] initial(long k, int len) {
            long x = (k * 0x9E3779B97F4A7C15L) | 1L;
            byte[] v = new byte[len];
            for (int i = 0; i < len; i++) {
                x ^= x << 13;
                x ^= x >>> 7;
                x ^= x << 17;
                v[i] = (byte) x;
            }
            return v;
        }

        @Override
        public void processElement(Tuple2<Long, Long> e, Context ctx, Collector<Tuple2<Long, Long>> out)
                throws Exception {
            long k = e.f0;
            byte[] value = state.value();
            if (value == null) {
                value = initial(k, len);
            }
            long sum = 0;
            for (int i = 7; i >= 0; i--) {
                sum = (sum << 8) | (value[i] & 0xFFL);
            }
            sum += e.f1;
            for (int i = 0; i < 8; i++) {
                value[i] = (byte) (sum >>> (8 * i));
            }
            state.update(value);
            seen++;
            if (seen % 1000 == 0) {
                out.collect(Tuple2.of(k, sum));
                EMITTED.incrementAndGet();
            }
        }

        @Override
        public void notifyCheckpointComplete(long checkpointId) {
            COMPLETED.add(checkpointId);
        }
    }

    static final String NAME = "flink-keyed-sum-large";

    public static void main(String[] args) throws Exception {
        Bench.Flags f = new Bench.Flags(20_000_000L, "usage: KeyedSumLarge --dir NEW_DIR [--keys 20000000] [--events 2*keys]"
                + " [--value-bytes 100] [--parallelism 1] [--budget-mib 200]"
                + " [--checkpoint-interval-ms 1000]", args);
        if (f.events < 0) {
            f.events = 2 * f.keys;
        }
        if (f.valueBytes < 8) {
            f.fail("--value-bytes must be at least 8 (the sum's bytes)");
        }
        Bench.Dirs dirs = f.dirs();
        Configuration conf = Bench.rocksdb(dirs, f.budgetMib, f.parallelism);

        StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(f.parallelism, conf);
        if (f.intervalMs > 0) {
            env.enableCheckpointing(f.intervalMs);
        }
        final long k = f.keys;
        final int len = f.valueBytes;
        env.fromSequence(0, f.events - 1)
                .map(i -> Tuple2.of(i % k, i))
                .returns(Types.TUPLE(Types.LONG, Types.LONG))
                .keyBy(t -> t.f0, Types.LONG)
                .process(new WideSum(len))
                .returns(Types.TUPLE(Types.LONG, Types.LONG))
                .sinkTo(new DiscardingSink<>());

        Bench.Measured m = Bench.execute(env, dirs, NAME);
        System.out.println(String.format(Locale.ROOT,
                "{\"bench\":\"" + NAME + "\",\"flink_version\":\"%s\",\"events\":%d,\"keys\":%d,"
                        + "\"value_bytes\":%d,\"parallelism\":%d,\"state\":\"rocksdb\",\"incremental\":true,"
                        + "\"managed_memory_mib\":%d,\"checkpoint_interval_ms\":%d,\"elapsed_s\":%.3f,"
                        + "\"wall_s\":%.3f,\"cpu_s\":%.2f,\"events_per_sec\":%d,\"checkpoints_completed\":%d,"
                        + "\"peak_rss_kib\":%d,\"state_dir_bytes\":%d,\"checkpoint_dir_bytes\":%d,"
                        + "\"results\":%d}",
                org.apache.flink.runtime.util.EnvironmentInformation.getVersion(), f.events, f.keys, f.valueBytes,
                f.parallelism, f.budgetMib, f.intervalMs, m.netS(), m.wallS(), m.cpuS(),
                Math.round(f.events / m.netS()), COMPLETED.size(),
                Bench.peakRssKib(), m.stateBytes(), m.checkpointBytes(), EMITTED.get()));
        System.exit(0);
    }
}
