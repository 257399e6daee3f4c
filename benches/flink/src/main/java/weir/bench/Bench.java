package weir.bench;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Stream;

import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

import org.apache.flink.configuration.ConfigOption;
import org.apache.flink.configuration.ConfigOptions;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.MemorySize;
import org.apache.flink.configuration.TaskManagerOptions;

/**
 * What the Flink side of weir's benchmarks share: the working directory, the RocksDB backend's
 * configuration under one memory budget, and the process's measurements (peak RSS, CPU time,
 * bytes on disk while the job runs).
 */
final class Bench {
    private Bench() {}

    /**
     * The flags both jobs take, as weir-bench's: {@code --keys}, {@code --events} (-1 until
     * given), {@code --value-bytes}, {@code --parallelism}, {@code --budget-mib},
     * {@code --checkpoint-interval-ms} and {@code --dir} (required). A bad flag prints
     * {@code why} and the usage line, and exits with status 2.
     */
    static final class Flags {
        long keys;
        long events = -1;
        int valueBytes = 100;
        int parallelism = 1;
        long budgetMib = 200;
        long intervalMs = 1000;
        String dir;
        private final String usage;

        Flags(long keys, String usage, String[] args) {
            this.keys = keys;
            this.usage = usage;
            for (int i = 0; i < args.length; i++) {
                if (i + 1 >= args.length) {
                    fail("missing value for " + args[i]);
                }
                String v = args[++i];
                switch (args[i - 1]) {
                    case "--keys" -> this.keys = Long.parseLong(v);
                    case "--events" -> events = Long.parseLong(v);
                    case "--value-bytes" -> valueBytes = Integer.parseInt(v);
                    case "--parallelism" -> parallelism = Integer.parseInt(v);
                    case "--budget-mib" -> budgetMib = Long.parseLong(v);
                    case "--checkpoint-interval-ms" -> intervalMs = Long.parseLong(v);
                    case "--dir" -> dir = v;
                    default -> fail("unknown flag " + args[i - 1]);
                }
            }
            if (dir == null) {
                fail("--dir is required");
            }
        }

        void fail(String why) {
            System.err.println(why);
            System.err.println(usage);
            System.exit(2);
        }

        /** The working directory, prepared; a directory that is not empty is a bad flag. */
        Dirs dirs() throws IOException {
            try {
                return prepare(dir);
            } catch (IllegalArgumentException e) {
                fail(e.getMessage());
                throw e;
            }
        }
    }

    /** What one run of a job measured. */
    record Measured(double netS, double wallS, double cpuS, long stateBytes, long checkpointBytes) {}

    /** Runs the job built in {@code env}, measuring its time, CPU and bytes on disk. */
    static Measured execute(StreamExecutionEnvironment env, Dirs dirs, String name) throws Exception {
        double cpu0 = cpuSeconds();
        long t0 = System.nanoTime();
        JobExecutionResult r;
        long stateBytes;
        long checkpointBytes;
        try (SizePoller sizes = new SizePoller(dirs)) {
            r = env.execute(name);
            stateBytes = sizes.stateBytes.get();
            checkpointBytes = sizes.checkpointBytes.get();
        }
        double wall = (System.nanoTime() - t0) / 1e9;
        return new Measured(r.getNetRuntime() / 1000.0, wall, cpuSeconds() - cpu0, stateBytes, checkpointBytes);
    }

    /** The benchmark's working directory and the three directories Flink gets inside it. */
    record Dirs(Path local, Path checkpoints, Path tmp) {}

    /** Creates local/, checkpoints/ and tmp/ in {@code dirArg}, which must be new or empty. */
    static Dirs prepare(String dirArg) throws IOException {
        Path dir = Paths.get(dirArg).toAbsolutePath();
        if (Files.isDirectory(dir)) {
            try (Stream<Path> s = Files.list(dir)) {
                if (s.findAny().isPresent()) {
                    throw new IllegalArgumentException(
                            dir + " is not empty; give the benchmark a new directory");
                }
            }
        }
        Dirs d = new Dirs(dir.resolve("local"), dir.resolve("checkpoints"), dir.resolve("tmp"));
        Files.createDirectories(d.local());
        Files.createDirectories(d.checkpoints());
        Files.createDirectories(d.tmp());
        return d;
    }

    private static ConfigOption<String> option(String key) {
        return ConfigOptions.key(key).stringType().noDefaultValue();
    }

    /**
     * RocksDB with incremental checkpoints into {@code d.checkpoints()}, its memory managed
     * within {@code budgetMib} (Flink's managed memory, split evenly over the P slots).
     */
    static Configuration rocksdb(Dirs d, long budgetMib, int parallelism) {
        Configuration conf = new Configuration();
        conf.set(option("state.backend.type"), "rocksdb");
        conf.set(option("execution.checkpointing.incremental"), "true");
        conf.set(option("execution.checkpointing.dir"), d.checkpoints().toUri().toString());
        conf.set(option("state.backend.rocksdb.localdir"), d.local().toString());
        conf.set(option("state.backend.rocksdb.memory.managed"), "true");
        // Timers in RocksDB (Flink's default for this backend, named here to be explicit).
        conf.set(option("state.backend.rocksdb.timer-service.factory"), "ROCKSDB");
        conf.set(option("io.tmp.dirs"), d.tmp().toString());
        conf.set(TaskManagerOptions.MANAGED_MEMORY_SIZE, MemorySize.ofMebiBytes(budgetMib));
        conf.set(TaskManagerOptions.NUM_TASK_SLOTS, parallelism);
        return conf;
    }

    /** The peak resident set of this process (VmHWM), in KiB; -1 if unknown. */
    static long peakRssKib() {
        try (Stream<String> lines = Files.lines(Paths.get("/proc/self/status"))) {
            return lines.filter(l -> l.startsWith("VmHWM:"))
                    .map(l -> l.substring(6).trim().replace("kB", "").trim())
                    .mapToLong(Long::parseLong)
                    .findFirst()
                    .orElse(-1);
        } catch (IOException | RuntimeException e) {
            return -1;
        }
    }

    /** CPU time (user + system) of this process so far, all threads, in seconds. */
    static double cpuSeconds() {
        try {
            String stat = Files.readString(Paths.get("/proc/self/stat"));
            String[] f = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
            // Fields 14 and 15 of stat (utime, stime) are 12 and 13 after the command name,
            // in clock ticks of 1/100 s on Linux.
            return (Long.parseLong(f[11]) + Long.parseLong(f[12])) / 100.0;
        } catch (IOException | RuntimeException e) {
            return -1;
        }
    }

    static long dirBytes(Path dir) {
        try (Stream<Path> s = Files.walk(dir)) {
            return s.filter(Files::isRegularFile).mapToLong(p -> {
                try {
                    return Files.size(p);
                } catch (IOException e) {
                    return 0; // removed while walking
                }
            }).sum();
        } catch (IOException | RuntimeException e) {
            return 0;
        }
    }

    /**
     * The largest sizes the state and checkpoint directories reach, polled while the job
     * runs: the backend removes its files (and, without retained checkpoints, the checkpoint
     * directory's contents) when the job ends.
     */
    static final class SizePoller implements AutoCloseable {
        final AtomicLong stateBytes = new AtomicLong();
        final AtomicLong checkpointBytes = new AtomicLong();
        private final Thread thread;

        SizePoller(Dirs d) {
            thread = new Thread(() -> {
                while (!Thread.currentThread().isInterrupted()) {
                    stateBytes.accumulateAndGet(dirBytes(d.local()), Math::max);
                    checkpointBytes.accumulateAndGet(dirBytes(d.checkpoints()), Math::max);
                    try {
                        Thread.sleep(1500);
                    } catch (InterruptedException e) {
                        return;
                    }
                }
            }, "state-size-poller");
            thread.setDaemon(true);
            thread.start();
        }

        @Override
        public void close() {
            thread.interrupt();
        }
    }
}
