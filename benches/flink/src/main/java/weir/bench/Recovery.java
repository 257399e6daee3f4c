package weir.bench;

import java.io.DataInputStream;
import java.io.File;
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Locale;
import java.util.Optional;
import java.util.stream.Stream;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.PrimitiveArrayTypeInfo;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.configuration.ConfigOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.runtime.checkpoint.Checkpoints;
import org.apache.flink.runtime.checkpoint.metadata.CheckpointMetadata;
import org.apache.flink.runtime.state.FunctionInitializationContext;
import org.apache.flink.runtime.state.FunctionSnapshotContext;
import org.apache.flink.streaming.api.checkpoint.CheckpointedFunction;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.streaming.api.functions.source.legacy.RichParallelSourceFunction;
import org.apache.flink.util.Collector;

/**
 * weir-bench's {@code recovery} benchmark on Apache Flink's RocksDB backend: how long a keyed
 * job with large state takes from process start to its first record processed after a crash.
 *
 * <p>A child JVM (phase {@code build}, a local MiniCluster) fills RocksDB with {@code --keys}
 * keys of {@code --value-bytes} incompressible bytes, with incremental checkpoints every second
 * that are retained, and is killed with SIGKILL once a checkpoint taken after its last key is
 * complete. A second child JVM (phase {@code restore}, at {@code --restore-parallelism})
 * starts the same job from that checkpoint ({@code execution.state-recovery.path}); its keyed
 * subtasks note the time of their first record. Prints one JSON line with the same fields as
 * weir-bench's.
 *
 * <p>Flink's local recovery is not measured: it serves a task restarted inside a running
 * cluster (same job), and a new process submits a new job, which restores from checkpoint
 * storage.
 */
public final class Recovery {
    private Recovery() {}

    static final String USAGE = "usage: Recovery --dir NEW_DIR [--keys 10000000] [--value-bytes 100]"
            + " [--parallelism 2] [--restore-parallelism P] [--budget-mib 200] [--keep] [--again] [--cold]"
            + " [--conf KEY=VALUE]...";

    /** The flags of the benchmark and of its children. */
    static final class Flags {
        String phase;
        long keys = 10_000_000L;
        int valueBytes = 100;
        int parallelism = 2;
        int restoreParallelism = -1;
        long budgetMib = 200;
        boolean keep;
        boolean again;
        boolean cold;
        String dir;
        String from;
        /** Flink settings for both children, as KEY=VALUE. */
        final List<String> conf = new ArrayList<>();

        Flags(String[] args) {
            for (int i = 0; i < args.length; i++) {
                String flag = args[i];
                switch (flag) {
                    case "--keep" -> keep = true;
                    case "--again" -> again = true;
                    case "--cold" -> cold = true;
                    default -> {
                        if (i + 1 >= args.length) {
                            fail("missing value for " + flag);
                        }
                        String v = args[++i];
                        switch (flag) {
                            case "--phase" -> phase = v;
                            case "--keys" -> keys = Long.parseLong(v);
                            case "--value-bytes" -> valueBytes = Integer.parseInt(v);
                            case "--parallelism" -> parallelism = Integer.parseInt(v);
                            case "--restore-parallelism" -> restoreParallelism = Integer.parseInt(v);
                            case "--budget-mib" -> budgetMib = Long.parseLong(v);
                            case "--dir" -> dir = v;
                            case "--from" -> from = v;
                            case "--conf" -> {
                                if (!v.contains("=")) {
                                    fail("--conf takes KEY=VALUE, not " + v);
                                }
                                conf.add(v);
                            }
                            default -> fail("unknown flag " + flag);
                        }
                    }
                }
            }
            if (dir == null) {
                fail("--dir is required");
            }
            if (valueBytes < 16) {
                fail("--value-bytes must be at least 16");
            }
            if (restoreParallelism < 0) {
                restoreParallelism = parallelism;
            }
            keep |= again;
        }

        static void fail(String why) {
            System.err.println(why);
            System.err.println(USAGE);
            System.exit(2);
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length > 0 && args[0].equals("child")) {
            child(new Flags(java.util.Arrays.copyOfRange(args, 1, args.length)));
            return;
        }
        Flags f = new Flags(args);
        Path dir = Paths.get(f.dir).toAbsolutePath();
        Path from = dir.resolve("restore-from");
        if (f.again) {
            if (!Files.exists(from)) {
                Flags.fail(dir + " holds no built checkpoint; --again restarts from the kept directory"
                        + " of an earlier run (--keep)");
            }
        } else {
            try {
                Bench.prepare(f.dir);
            } catch (IllegalArgumentException e) {
                Flags.fail(e.getMessage());
            }
        }
        String line;
        try {
            line = measure(f, dir, from);
        } finally {
            if (!f.keep) {
                removeAll(dir);
            }
        }
        System.out.println(line);
        System.exit(0);
    }

    static String measure(Flags f, Path dir, Path from) throws Exception {
        long started = System.nanoTime();
        Double buildS = null;
        if (!f.again) {
            Process build = spawn(f, dir, "build", f.parallelism, null);
            long limit = 600 + f.keys / 20_000;
            wait(build, dir, "build", limit, () -> marked(dir, "built-", f.parallelism));
            long last = latestComplete(dir).map(Recovery::checkpointId).orElse(0L);
            wait(build, dir, "build", limit,
                    () -> latestComplete(dir).map(Recovery::checkpointId).orElse(0L) >= last + 2);
            build.destroyForcibly(); // SIGKILL
            build.waitFor();
            buildS = (System.nanoTime() - started) / 1e9;
            Files.writeString(from, latestComplete(dir).orElseThrow().toString());
        }
        Path checkpoint = Paths.get(Files.readString(from).trim());
        // What a crashed process leaves that a new one does not use: RocksDB's working
        // copies (a new job restores from checkpoint storage), the other runs' checkpoints.
        removeAll(dir.resolve("local"));
        Files.createDirectories(dir.resolve("local"));
        try (Stream<Path> jobs = Files.list(dir.resolve("checkpoints"))) {
            for (Path job : jobs.toList()) {
                if (!checkpoint.startsWith(job)) {
                    removeAll(job);
                }
            }
        }
        for (int s = 0; s < 64; s++) {
            Files.deleteIfExists(dir.resolve("first-" + s));
        }
        long stateBytes = Bench.dirBytes(checkpoint.getParent().resolve("shared"));
        long checkpointBytes = fullBytes(checkpoint);
        if (f.cold) {
            dropPageCache();
        }
        Instant t0 = Instant.now();
        Process restore = spawn(f, dir, "restore", f.restoreParallelism, checkpoint);
        try {
            wait(restore, dir, "restore", 900, () -> marked(dir, "first-", f.restoreParallelism));
        } finally {
            restore.destroyForcibly();
            restore.waitFor();
        }
        double first = Double.MAX_VALUE;
        double all = 0;
        long t0Nanos = t0.getEpochSecond() * 1_000_000_000L + t0.getNano();
        for (int s = 0; s < f.restoreParallelism; s++) {
            long at = Long.parseLong(Files.readString(dir.resolve("first-" + s)).trim());
            double secs = Math.max(0, at - t0Nanos) / 1e9;
            first = Math.min(first, secs);
            all = Math.max(all, secs);
        }
        return String.format(Locale.ROOT,
                "{\"job\":\"flink-recovery\",\"flink_version\":\"%s\",\"keys\":%d,\"value_bytes\":%d,"
                        + "\"parallelism\":%d,\"restore_parallelism\":%d,\"local_recovery\":false,"
                        + "\"managed_memory_mib\":%d,\"conf\":%s,\"state_bytes\":%d,\"checkpoint_bytes\":%d,\"build_s\":%s,"
                        + "\"again\":%b,\"cold\":%b,\"first_record_s\":%.3f,\"all_subtasks_s\":%.3f}",
                org.apache.flink.runtime.util.EnvironmentInformation.getVersion(), f.keys, f.valueBytes,
                f.parallelism, f.restoreParallelism, f.budgetMib, jsonStrings(f.conf), stateBytes, checkpointBytes,
                buildS == null ? "null" : String.format(Locale.ROOT, "%.3f", buildS), f.again, f.cold,
                first, all);
    }

    /** {@code xs} as a JSON array of strings (settings hold no quotes or backslashes). */
    static String jsonStrings(List<String> xs) {
        return xs.stream().map(x -> "\"" + x + "\"").collect(java.util.stream.Collectors.joining(",", "[", "]"));
    }

    /** Starts a child JVM for {@code phase} with this JVM's flags, its output in PHASE.log. */
    static Process spawn(Flags f, Path dir, String phase, int parallelism, Path from) throws IOException {
        List<String> cmd = new ArrayList<>();
        cmd.add(Paths.get(System.getProperty("java.home"), "bin", "java").toString());
        cmd.addAll(ManagementFactory.getRuntimeMXBean().getInputArguments());
        cmd.add("-cp");
        cmd.add(System.getProperty("java.class.path"));
        cmd.add(Recovery.class.getName());
        cmd.addAll(List.of("child", "--phase", phase, "--keys", Long.toString(f.keys),
                "--value-bytes", Integer.toString(f.valueBytes), "--parallelism", Integer.toString(parallelism),
                "--budget-mib", Long.toString(f.budgetMib), "--dir", dir.toString()));
        if (from != null) {
            cmd.addAll(List.of("--from", from.toString()));
        }
        for (String c : f.conf) {
            cmd.addAll(List.of("--conf", c));
        }
        File log = dir.resolve(phase + ".log").toFile();
        return new ProcessBuilder(cmd).redirectErrorStream(true)
                .redirectOutput(ProcessBuilder.Redirect.to(log))
                .redirectInput(ProcessBuilder.Redirect.from(new File("/dev/null")))
                .start();
    }

    /** Whether every subtask of {@code n} has written its mark {@code prefix + subtask}. */
    static boolean marked(Path dir, String prefix, int n) {
        for (int s = 0; s < n; s++) {
            if (!Files.exists(dir.resolve(prefix + s))) {
                return false;
            }
        }
        return true;
    }

    interface Check {
        boolean done() throws IOException;
    }

    /** Polls {@code done} every 20 ms; fails when the child exits first or after {@code limitS}. */
    static void wait(Process child, Path dir, String phase, long limitS, Check done) throws Exception {
        long deadline = System.nanoTime() + limitS * 1_000_000_000L;
        while (!done.done()) {
            if (!child.isAlive() || System.nanoTime() > deadline) {
                child.destroyForcibly();
                List<String> log = Files.readAllLines(dir.resolve(phase + ".log"));
                String tail = String.join("\n", log.subList(Math.max(0, log.size() - 30), log.size()));
                throw new IllegalStateException("the " + phase + " process "
                        + (child.isAlive() ? "took over " + limitS + " s" : "ended (" + child.exitValue() + ")")
                        + ":\n" + tail);
            }
            Thread.sleep(20);
        }
    }

    /** The newest complete checkpoint (chk-N holding _metadata) under the checkpoint directory. */
    static Optional<Path> latestComplete(Path dir) throws IOException {
        try (Stream<Path> s = Files.walk(dir.resolve("checkpoints"), 2)) {
            return s.filter(p -> p.getFileName().toString().startsWith("chk-"))
                    .filter(p -> Files.exists(p.resolve("_metadata")))
                    .max(Comparator.comparingLong(Recovery::checkpointId));
        } catch (java.io.UncheckedIOException e) {
            return Optional.empty(); // a checkpoint removed while walking: poll again
        }
    }

    static long checkpointId(Path chk) {
        return Long.parseLong(chk.getFileName().toString().substring(4));
    }

    /** The full size of the state the checkpoint references, by its metadata. */
    static long fullBytes(Path checkpoint) throws IOException {
        try (DataInputStream in = new DataInputStream(Files.newInputStream(checkpoint.resolve("_metadata")))) {
            CheckpointMetadata m = Checkpoints.loadCheckpointMetadata(in, Recovery.class.getClassLoader(),
                    checkpoint.toString());
            return m.getOperatorStates().stream().mapToLong(o -> o.getStateSize()).sum();
        }
    }

    static void dropPageCache() throws Exception {
        int synced = new ProcessBuilder("sync").inheritIO().start().waitFor();
        if (synced != 0) {
            throw new IllegalStateException("sync failed: " + synced);
        }
        try {
            Files.writeString(Paths.get("/proc/sys/vm/drop_caches"), "3");
        } catch (IOException e) {
            throw new IOException("--cold drops the page cache by writing /proc/sys/vm/drop_caches,"
                    + " which needs root: " + e, e);
        }
    }

    static void removeAll(Path p) throws IOException {
        if (!Files.exists(p)) {
            return;
        }
        try (Stream<Path> s = Files.walk(p)) {
            for (Path q : s.sorted(Comparator.reverseOrder()).toList()) {
                Files.deleteIfExists(q);
            }
        }
    }

    /** One phase, in the child JVM: runs until killed. */
    static void child(Flags f) throws Exception {
        Path dir = Paths.get(f.dir);
        Bench.Dirs dirs = new Bench.Dirs(dir.resolve("local"), dir.resolve("checkpoints"), dir.resolve("tmp"));
        Configuration conf = Bench.rocksdb(dirs, f.budgetMib, f.parallelism);
        conf.set(ConfigOptions.key("execution.checkpointing.externalized-checkpoint-retention")
                .stringType().noDefaultValue(), "RETAIN_ON_CANCELLATION");
        // A failure ends the process (and the benchmark, with the log's tail).
        conf.set(ConfigOptions.key("restart-strategy.type").stringType().noDefaultValue(), "none");
        for (String c : f.conf) {
            int eq = c.indexOf('=');
            conf.set(ConfigOptions.key(c.substring(0, eq)).stringType().noDefaultValue(), c.substring(eq + 1));
        }
        boolean restore = f.phase.equals("restore");
        if (restore) {
            conf.set(ConfigOptions.key("execution.state-recovery.path").stringType().noDefaultValue(), f.from);
        }
        StreamExecutionEnvironment env = StreamExecutionEnvironment.createLocalEnvironment(f.parallelism, conf);
        env.enableCheckpointing(1000);
        env.setMaxParallelism(128);
        env.addSource(new Feed(f.keys, dir.toString()), "feed", Types.TUPLE(Types.LONG, Types.LONG))
                .uid("feed")
                .keyBy(t -> t.f0, Types.LONG)
                .process(new Fill(f.valueBytes, restore ? dir.toString() : null))
                .uid("fill")
                .returns(Types.LONG)
                .sinkTo(new DiscardingSink<>());
        env.execute("flink-recovery");
    }

    /**
     * Emits its share of the keys once (then notes that it is done and idles); restored, it
     * emits a few records at a time forever, over every key range.
     */
    public static final class Feed extends RichParallelSourceFunction<Tuple2<Long, Long>>
            implements CheckpointedFunction {
        private final long keys;
        private final String dir;
        private transient ListState<Long> state;
        private transient boolean restored;
        private transient long next;
        private transient long step;
        private transient int subtask;
        private volatile boolean running = true;

        Feed(long keys, String dir) {
            this.keys = keys;
            this.dir = dir;
        }

        @Override
        public void initializeState(FunctionInitializationContext ctx) throws Exception {
            state = ctx.getOperatorStateStore().getUnionListState(new ListStateDescriptor<>("next", Long.class));
            restored = ctx.isRestored();
        }

        @Override
        public void open(OpenContext ctx) {
            subtask = getRuntimeContext().getTaskInfo().getIndexOfThisSubtask();
            step = getRuntimeContext().getTaskInfo().getNumberOfParallelSubtasks();
            next = subtask;
        }

        @Override
        public void run(SourceContext<Tuple2<Long, Long>> out) throws Exception {
            boolean marked = false;
            while (running) {
                if (restored) {
                    synchronized (out.getCheckpointLock()) {
                        for (long i = 0; i < 64; i++) {
                            out.collect(Tuple2.of((next + i * (keys / 64)) % keys, -1L));
                        }
                        next++;
                    }
                    Thread.sleep(5);
                } else if (next >= keys) {
                    if (!marked) {
                        Files.writeString(Paths.get(dir, "built-" + subtask), "");
                        marked = true;
                    }
                    Thread.sleep(100);
                } else {
                    synchronized (out.getCheckpointLock()) {
                        for (int i = 0; i < 1024 && next < keys; i++) {
                            out.collect(Tuple2.of(next, next));
                            next += step;
                        }
                    }
                }
            }
        }

        @Override
        public void cancel() {
            running = false;
        }

        @Override
        public void snapshotState(FunctionSnapshotContext ctx) throws Exception {
            state.update(List.of(next));
        }
    }

    /** Keeps a {@code len}-byte value per key; restored, notes when its first record came. */
    public static final class Fill extends KeyedProcessFunction<Long, Tuple2<Long, Long>, Long> {
        private final int len;
        private final String marks;
        private transient ValueState<byte[]> state;
        private transient Path first;

        Fill(int len, String marks) {
            this.len = len;
            this.marks = marks;
        }

        @Override
        public void open(OpenContext ctx) {
            state = getRuntimeContext().getState(
                    new ValueStateDescriptor<>("value", PrimitiveArrayTypeInfo.BYTE_PRIMITIVE_ARRAY_TYPE_INFO));
            if (marks != null) {
                first = Paths.get(marks, "first-" + getRuntimeContext().getTaskInfo().getIndexOfThisSubtask());
            }
        }

        @Override
        public void processElement(Tuple2<Long, Long> e, Context ctx, Collector<Long> out) throws Exception {
            if (first != null) {
                Instant now = Instant.now();
                Path part = first.resolveSibling(first.getFileName() + ".part");
                Files.writeString(part, Long.toString(now.getEpochSecond() * 1_000_000_000L + now.getNano()));
                Files.move(part, first, StandardCopyOption.ATOMIC_MOVE);
                first = null;
            }
            if (e.f1 < 0) {
                // A record of the restored run: the state must be there.
                if (state.value() == null) {
                    throw new IllegalStateException("key " + e.f0 + " lost its state");
                }
                return;
            }
            byte[] v = KeyedSumLarge.WideSum.initial(e.f0, len);
            for (int i = 0; i < 8; i++) {
                v[i] = (byte) (e.f1 >>> (8 * i));
            }
            state.update(v);
        }
    }
}
