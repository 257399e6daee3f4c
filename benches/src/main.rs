//! weir-bench: whole-job benchmarks with the job shapes of the performance brief.
//!
//! ```text
//! cargo run --release -p weir-bench -- keyed-sum --events 20000000 --keys 100000 \
//!     --parallelism 1 --state memory --checkpoint-interval-ms 0
//! ```
//! prints one JSON line per run. `results` proves the work was done: for `keyed-sum` the
//! number of emitted (key, sum) records (one per 1000 records a subtask processes), for
//! `window-count` the total of all window counts (equal to `events`), for
//! `broadcast-rules` (keyed-sum's shape, each record also checked against one of 1000
//! thresholds in broadcast state) the number of emitted alert counts (one per 1000
//! records a subtask processes). `cpu_s` is the CPU
//! seconds (user + system, all threads) the process used during the run (Linux only).
//!
//! ```text
//! cargo run --release -p weir-bench -- keyed-sum --events 200000000 --parallelism 2 --workers 2
//! ```
//! runs keyed-sum as a cluster: this process is the coordinator and starts `--workers`
//! worker processes of its own executable on this machine (`--slots` each, by default the
//! parallelism divided by the workers, rounded up), which exchange records over loopback
//! TCP. The JSON line adds `workers`, `slots_per_worker`, `startup_s` (the workers' start-up,
//! left out of `elapsed_s`) and `restarts`; `results` sums the workers' sinks, and `cpu_s`
//! (CPU seconds, as for a single process) adds up the coordinator's and the workers'.
//!
//! ```text
//! cargo run --release -p weir-bench -- nexmark --query q5 --events 10000000 \
//!     [--parallelism P] [--state memory|rocksdb] [--checkpoint-interval-ms MS]
//! ```
//! runs one Nexmark query over a bounded generated stream (see `docs/nexmark.md`) and
//! prints events, elapsed, events_per_sec, the CPU seconds the process used (generator
//! included), events per core-second, and `results` (records the query emitted).
//!
//! ```text
//! cargo run --release -p weir-bench -- interval-join --events 5000000 [--upper-ms 10] \
//!     [--watermark-delay-ms 10] [--parallelism P] [--state memory|rocksdb]
//! cargo run --release -p weir-bench -- temporal-join --events 5000000 [--parallelism P] ...
//! ```
//! runs a Nexmark-shaped join by event time (bids with auctions; see `time_joins.rs`) and
//! prints the same fields as `keyed-sum`; `results` is the number of joined records.
//!
//! ```text
//! cargo run --release -p weir-bench -- upsert-postgres --postgres URL --events 2000000 \
//!     --keys 100000 [--parallelism P] [--checkpoint-interval-ms MS] [--at-least-once]
//! ```
//! writes generated changes into a fresh PostgreSQL table through the upsert sink
//! (exactly-once unless `--at-least-once`) and prints events per second, the rows and
//! transactions written, and `results` (the table's rows at the end: `--keys`).
//!
//! ```text
//! cargo run --release -p weir-bench -- backpressure --checkpoint-mode aligned|aligned-timeout|unaligned \
//!     [--parallelism P] [--seconds S] [--rate R] [--state rocksdb|memory] [--no-throttle]
//! ```
//! runs a keyed running sum whose sink writes a tenth of the source's rate for S seconds,
//! checkpointing every second, and prints the checkpoints' duration (p50, p99), alignment,
//! median size and count, read from their manifests; `--no-throttle` reports records/s
//! without backpressure (see `backpressure.rs`).
//!
//! ```text
//! cargo run --release -p weir-bench -- latency --rate 100000 [--parallelism P] \
//!     [--seconds S] [--flush-interval-ms MS] [--checkpoint-interval-ms MS] [--state S]
//! ```
//! runs a keyed job fed at a fixed rate and prints source-to-sink latency percentiles
//! (see `latency.rs`).
//!
//! ```text
//! cargo run --release -p weir-bench -- state-collections --sizes 1000,100000,1000000 [--ops 100000]
//! ```
//! times list appends and map puts on the RocksDB backend against one key whose list and
//! map already hold each size, checkpoints included, and prints one JSON line per size
//! (see `collections.rs`).

mod async_io;
mod backpressure;
mod broadcast_rules;
mod cluster;
mod collections;
mod in_flight;
mod jobs;
mod large_state;
mod latency;
mod recovery;
mod time_joins;
mod upsert;

use clap::{Parser, Subcommand, ValueEnum};

/// jemalloc serves every allocation of the process, RocksDB's included (decision 0053):
/// glibc's per-thread arenas keep what one thread frees for that thread, and RocksDB's
/// blocks come and go from several threads, so with glibc a process held up to half its
/// memory budget again as free memory.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The allocator this binary was built with, reported beside peak RSS.
pub const ALLOCATOR_NAME: &str = if cfg!(feature = "jemalloc") {
    "jemalloc"
} else {
    "glibc"
};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "weir-bench",
    about = "Runs weir benchmark jobs and prints one JSON line per run"
)]
struct Cli {
    #[command(subcommand)]
    job: Job,
}

#[derive(Subcommand, Debug, Clone)]
enum Job {
    /// generator → key_by → running sum in keyed value state → every 1000th record emitted.
    KeyedSum(KeyedSumArgs),
    /// generator with watermarks → key_by → tumbling event-time windows of 1000 → count.
    WindowCount(Args),
    /// generator → table of the latest value per key → group_by (key mod 100) → sum with
    /// retractions → the number of changes counted.
    TableSum(Args),
    /// keyed-sum's shape connected with 1000 broadcast rules (thresholds in broadcast
    /// state), read on every record.
    BroadcastRules(Args),
    /// Recovery time: builds `--keys` keys of `--value-bytes` each in RocksDB, checkpoints,
    /// then measures a restart that restores them (start → state loaded and running).
    Recovery(recovery::RecoveryArgs),
    /// One phase of `recovery`, in its own process.
    #[command(hide = true)]
    RecoveryChild(recovery::ChildArgs),
    /// One Nexmark query over a bounded generated stream (q0-q9, q11, q14, q17-q22).
    Nexmark(NexmarkArgs),
    /// generator → map_async against a service with a fixed latency → count: throughput
    /// next to the capacity bound (capacity × parallelism ÷ latency).
    AsyncIo(AsyncIoArgs),
    /// Nexmark auctions interval-joined with their bids of the first `--upper-ms` → count.
    IntervalJoin(JoinArgs),
    /// Nexmark bids temporal-joined with their auction's row at the bid's time → count.
    TemporalJoin(JoinArgs),
    /// generator → changes → the PostgreSQL upsert sink (a table of `--keys` rows).
    UpsertPostgres(upsert::UpsertArgs),
    /// source → key_by → running sum → a sink throttled to a tenth of the source's rate,
    /// checkpointing every second in `--checkpoint-mode`: checkpoint duration, alignment and
    /// size under backpressure (`--no-throttle`: records/s without it).
    Backpressure(backpressure::BackpressureArgs),
    /// paced source (fixed rate) → key_by → count per key → sink: source-to-sink latency
    /// percentiles, and the largest latency of records that crossed a checkpoint.
    Latency(latency::LatencyArgs),
    /// Aligned checkpoint time through a backpressured pipeline (sink throttled), with
    /// fixed-capacity channels (`--in-flight-target-ms 0`) or bounded in-flight data.
    InFlightCheckpoint(in_flight::InFlightArgs),
    /// List appends and map puts on RocksDB against one key whose collections already
    /// hold each of `--sizes` elements: the cost per operation as a collection grows.
    StateCollections(CollectionsArgs),
    /// keyed-sum with `--value-bytes` of state per key on RocksDB under one memory budget
    /// (state far larger than memory): records/s, checkpoint p50/p99, peak RSS, state size.
    KeyedSumLarge(large_state::LargeStateArgs),
    /// Sliding event-time windows (1 h, sliding by 1 min) counting per key on RocksDB.
    SlidingWindow(large_state::LargeStateArgs),
    /// A worker of `keyed-sum --workers N`, started by the coordinating weir-bench.
    #[command(hide = true)]
    ClusterWorker(WorkerArgs),
}

#[derive(clap::Args, Debug, Clone)]
struct KeyedSumArgs {
    #[command(flatten)]
    job: Args,
    /// Run as a cluster of this many worker processes, started from this executable, with
    /// this process as the coordinator (0 = everything in this process).
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Slots per worker (default: the parallelism divided by the workers, rounded up).
    #[arg(long)]
    slots: Option<usize>,
    /// Address the coordinator listens on (default: a free port on 127.0.0.1).
    #[arg(long)]
    listen: Option<String>,
}

#[derive(clap::Args, Debug, Clone)]
struct AsyncIoArgs {
    /// Requests in flight per subtask, at most.
    #[arg(long, default_value_t = 1000)]
    capacity: usize,
    /// The service's answer time in milliseconds.
    #[arg(long, default_value_t = 10)]
    latency_ms: u64,
    /// Records to send through.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Subtasks of the async operator.
    #[arg(long, default_value_t = 1)]
    parallelism: usize,
    /// Emit results as they complete instead of in input order.
    #[arg(long)]
    unordered: bool,
    /// The service: in this process on the runtime's timer, or HTTP on loopback.
    #[arg(long, value_enum, default_value_t = async_io::Service::Local)]
    service: async_io::Service,
}

#[derive(clap::Args, Debug, Clone)]
struct JoinArgs {
    #[command(flatten)]
    job: Args,
    /// The interval join's upper bound: bids up to this many ms after the auction opened.
    #[arg(long, default_value_t = 10)]
    upper_ms: i64,
    /// How far the watermark trails the largest event time (ms).
    #[arg(long, default_value_t = 10)]
    watermark_delay_ms: i64,
}

impl JoinArgs {
    fn job(&self) -> time_joins::JoinJob {
        time_joins::JoinJob {
            events: self.job.events,
            upper_ms: self.upper_ms,
            watermark_delay_ms: self.watermark_delay_ms,
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
struct WorkerArgs {
    /// The coordinator's address.
    #[arg(long)]
    coordinator: String,
    /// Slots this worker offers.
    #[arg(long)]
    slots: usize,
    /// How long to try to reach the coordinator.
    #[arg(long, default_value_t = 30_000)]
    join_timeout_ms: u64,
}

#[derive(clap::Args, Debug, Clone)]
struct NexmarkArgs {
    /// The query: q0 to q9, q11, q14, q17, q18, q19, q20, q21 or q22.
    #[arg(long)]
    query: String,
    /// Events generated in all (persons, auctions and bids).
    #[arg(long, default_value_t = 10_000_000)]
    events: u64,
    /// Parallelism of every operator.
    #[arg(long, default_value_t = 1)]
    parallelism: usize,
    /// Generator timelines (Nexmark's numEventGenerators); default: the parallelism.
    #[arg(long)]
    generators: Option<u64>,
    /// Events per second of wall clock (0 = as fast as possible, with event times spaced
    /// as at 10 M events/s like Flink's benchmark).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Keyed state backend.
    #[arg(long, value_enum, default_value_t = State::Memory)]
    state: State,
    /// Checkpoint interval in milliseconds (0 = no checkpoints).
    #[arg(long, default_value_t = 0)]
    checkpoint_interval_ms: u64,
    /// Checkpoint directory (must be new or empty; default: a fresh temporary directory,
    /// removed after the run).
    #[arg(long)]
    checkpoint_dir: Option<std::path::PathBuf>,
    /// Records per channel batch.
    #[arg(long, default_value_t = 1024)]
    batch_size: usize,
}

#[derive(clap::Args, Debug, Clone)]
struct CollectionsArgs {
    /// Elements in the list and entries in the map before the timed operations.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000,10000,100000,1000000"
    )]
    sizes: Vec<u64>,
    /// Timed appends, and timed puts.
    #[arg(long, default_value_t = 100_000)]
    ops: u64,
}

/// Keyed state backend of the job.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Typed heap tables.
    Memory,
    /// RocksDB with a write-back cache flushed at each checkpoint.
    Rocksdb,
}

#[derive(clap::Args, Debug, Clone)]
struct Args {
    /// Number of generated events.
    #[arg(long, default_value_t = 20_000_000)]
    events: u64,
    /// Number of distinct keys.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Parallelism of every operator.
    #[arg(long, default_value_t = 1)]
    parallelism: usize,
    /// Keyed state backend.
    #[arg(long, value_enum, default_value_t = State::Memory)]
    state: State,
    /// Checkpoint interval in milliseconds (0 = no checkpoints).
    #[arg(long, default_value_t = 0)]
    checkpoint_interval_ms: u64,
    /// Checkpoint directory.
    #[arg(long)]
    checkpoint_dir: Option<std::path::PathBuf>,
    /// Records per channel batch.
    #[arg(long, default_value_t = 1024)]
    batch_size: usize,
    /// Serve the REST API and metrics on this address while the job runs (operators then
    /// count their records): for measuring what the API costs. Not handed to workers.
    #[arg(long)]
    web: Option<String>,
    /// Send a latency marker from each source subtask this many milliseconds apart (latency
    /// tracking on): for measuring what latency tracking costs.
    #[arg(long)]
    latency_tracking_ms: Option<u64>,
    /// The time of data a channel holds, in milliseconds (bounded in-flight data; 0:
    /// channels of a fixed capacity; default: weir's, 1 s).
    #[arg(long)]
    in_flight_target_ms: Option<u64>,
}

impl State {
    fn flag(self) -> &'static str {
        match self {
            State::Memory => "memory",
            State::Rocksdb => "rocksdb",
        }
    }
}

impl Args {
    /// The flags that give these arguments, for a cluster's workers to build the same job.
    fn flags(&self) -> Vec<String> {
        let mut v: Vec<String> = [
            ("--events", self.events.to_string()),
            ("--keys", self.keys.to_string()),
            ("--parallelism", self.parallelism.to_string()),
            ("--state", self.state.flag().to_string()),
            (
                "--checkpoint-interval-ms",
                self.checkpoint_interval_ms.to_string(),
            ),
            ("--batch-size", self.batch_size.to_string()),
        ]
        .into_iter()
        .flat_map(|(f, v)| [f.to_string(), v])
        .collect();
        if let Some(d) = &self.checkpoint_dir {
            v.push("--checkpoint-dir".into());
            v.push(d.display().to_string());
        }
        if let Some(ms) = self.latency_tracking_ms {
            v.push("--latency-tracking-ms".into());
            v.push(ms.to_string());
        }
        if let Some(ms) = self.in_flight_target_ms {
            v.push("--in-flight-target-ms".into());
            v.push(ms.to_string());
        }
        v
    }

    fn setup(&self) -> jobs::Setup {
        jobs::Setup {
            parallelism: self.parallelism,
            batch_size: self.batch_size,
            state: backend(self.state),
            checkpoint: (self.checkpoint_interval_ms > 0)
                .then(|| {
                    self.checkpoint_dir
                        .clone()
                        .map(|d| (d, self.checkpoint_interval_ms))
                })
                .flatten(),
            cluster: None,
            web: self.web.clone(),
            latency_tracking_ms: self.latency_tracking_ms,
            in_flight_target_ms: self.in_flight_target_ms,
        }
    }
}

fn backend(state: State) -> weir::BackendKind {
    match state {
        State::Memory => weir::BackendKind::Memory,
        State::Rocksdb => weir::BackendKind::RocksDb(Default::default()),
    }
}

/// True when `dir` exists and holds something.
fn non_empty(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

fn nexmark(a: &NexmarkArgs) -> ExitCode {
    use weir_bench::nexmark::run;
    if !run::QUERIES.contains(&a.query.as_str()) {
        eprintln!(
            "weir-bench: unknown Nexmark query {:?}; choose one of {}",
            a.query,
            run::QUERIES.join(", ")
        );
        return ExitCode::from(2);
    }
    if a.events == 0 || a.parallelism == 0 {
        eprintln!("weir-bench: --events and --parallelism must be at least 1");
        return ExitCode::from(2);
    }
    let mut temp_dir = None;
    let checkpoint = if a.checkpoint_interval_ms > 0 {
        let dir = match &a.checkpoint_dir {
            Some(d) if non_empty(d) => {
                eprintln!(
                    "weir-bench: {} is not empty; a benchmark starts from scratch, give it a new directory",
                    d.display()
                );
                return ExitCode::from(2);
            }
            Some(d) => d.clone(),
            None => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0);
                let d = std::env::temp_dir()
                    .join(format!("weir-nexmark-{}-{nanos}", std::process::id()));
                temp_dir = Some(d.clone());
                d
            }
        };
        Some((
            dir,
            std::time::Duration::from_millis(a.checkpoint_interval_ms),
        ))
    } else {
        None
    };
    let cfg = run::RunConfig {
        query: a.query.clone(),
        events: a.events,
        parallelism: a.parallelism,
        generators: a.generators,
        rate: a.rate,
        state: backend(a.state),
        checkpoint,
        batch_size: a.batch_size,
    };
    let outcome = run::run(&cfg);
    if let Some(d) = temp_dir {
        let _ = std::fs::remove_dir_all(d);
    }
    match outcome {
        Ok(r) => {
            let line = serde_json::json!({
                "job": "nexmark",
                "query": a.query,
                "events": a.events,
                "parallelism": a.parallelism,
                "generators": a.generators.unwrap_or(a.parallelism as u64),
                "state": cfg.state.name(),
                "checkpoint_interval_ms": a.checkpoint_interval_ms,
                "elapsed_s": (r.elapsed_s * 1000.0).round() / 1000.0,
                "events_per_sec": (a.events as f64 / r.elapsed_s).round() as u64,
                "cpu_s": (r.cpu_s * 100.0).round() / 100.0,
                "cores": ((r.cpu_s / r.elapsed_s) * 100.0).round() / 100.0,
                "events_per_core_sec": (a.events as f64 / r.cpu_s).round() as u64,
                "checkpoints_completed": r.checkpoints,
                "results": r.results,
            });
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("weir-bench: nexmark {} failed: {e}", a.query);
            ExitCode::FAILURE
        }
    }
}

/// A worker of `keyed-sum --workers N`: the job comes from the coordinator's flags.
fn cluster_worker(w: &WorkerArgs) -> ExitCode {
    let setup_from = |flags: &[String]| {
        let cli =
            Cli::try_parse_from(std::iter::once("weir-bench".to_string()).chain(flags.to_vec()))?;
        match cli.job {
            Job::KeyedSum(a) if a.workers == 0 => Ok((a.job.events, a.job.keys, a.job.setup())),
            other => anyhow::bail!("a worker runs keyed-sum without --workers, not {other:?}"),
        }
    };
    match cluster::worker(
        &w.coordinator,
        w.slots,
        std::time::Duration::from_millis(w.join_timeout_ms),
        setup_from,
    ) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weir-bench: cluster worker failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (name, args) = match &cli.job {
        Job::KeyedSum(a) => ("keyed-sum", &a.job),
        Job::WindowCount(a) => ("window-count", a),
        Job::IntervalJoin(a) => ("interval-join", &a.job),
        Job::TemporalJoin(a) => ("temporal-join", &a.job),
        Job::TableSum(a) => ("table-sum", a),
        Job::BroadcastRules(a) => ("broadcast-rules", a),
        Job::Nexmark(n) => return nexmark(n),
        Job::ClusterWorker(w) => return cluster_worker(w),
        Job::Latency(l) => {
            return match latency::run(l) {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("weir-bench: latency failed: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Job::UpsertPostgres(u) => {
            return match upsert::run(u) {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("weir-bench: upsert-postgres failed: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Job::Backpressure(b) => {
            return match backpressure::run(b) {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("weir-bench: backpressure failed: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Job::InFlightCheckpoint(a) => {
            return match in_flight::run(a) {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("weir-bench: in-flight-checkpoint failed: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Job::AsyncIo(a) => {
            if a.capacity == 0 || a.latency_ms == 0 || a.parallelism == 0 {
                eprintln!(
                    "weir-bench: --capacity, --latency-ms and --parallelism must be at least 1"
                );
                return ExitCode::from(2);
            }
            return match async_io::run(
                a.records,
                a.capacity,
                a.latency_ms,
                a.parallelism,
                a.unordered,
                a.service,
            ) {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("weir-bench: async-io failed: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Job::StateCollections(c) => {
            if c.ops == 0 {
                eprintln!("weir-bench: --ops must be at least 1");
                return ExitCode::from(2);
            }
            for &size in &c.sizes {
                match collections::run(size, c.ops) {
                    Ok(line) => println!("{line}"),
                    Err(e) => {
                        eprintln!("weir-bench: state-collections failed at size {size}: {e:#}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            return ExitCode::SUCCESS;
        }
        Job::KeyedSumLarge(a) | Job::SlidingWindow(a) => {
            let large = matches!(cli.job, Job::KeyedSumLarge(_));
            let run = if large {
                large_state::keyed_sum(a)
            } else {
                large_state::sliding_window(a)
            };
            return match run {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("weir-bench: failed: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Job::Recovery(r) => {
            return match recovery::run(r) {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("weir-bench: recovery failed: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Job::RecoveryChild(c) => {
            return match recovery::run_child(c) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("weir-bench: recovery-child failed: {e}");
                    ExitCode::FAILURE
                }
            };
        }
    };
    if args.checkpoint_interval_ms > 0 && args.checkpoint_dir.is_none() {
        eprintln!(
            "weir-bench: --checkpoint-interval-ms needs --checkpoint-dir DIR (an empty or new directory)"
        );
        return ExitCode::from(2);
    }
    let setup = args.setup();
    if let Some((dir, _)) = &setup.checkpoint
        && non_empty(dir)
    {
        eprintln!(
            "weir-bench: {} is not empty; a benchmark starts from scratch, give it a new directory",
            dir.display()
        );
        return ExitCode::from(2);
    }
    let state = setup.state.name();
    let mut extra = None;
    let mut workers_cpu_s = Some(0.0);
    let cpu_before = weir_bench::nexmark::run::process_cpu_seconds();
    let run = match cli.job {
        Job::KeyedSum(ref a) if a.workers > 0 => {
            let slots = a.slots.unwrap_or(a.job.parallelism.div_ceil(a.workers));
            if slots == 0 || slots * a.workers < a.job.parallelism {
                eprintln!(
                    "weir-bench: {} worker(s) with {slots} slot(s) each cannot run parallelism {}",
                    a.workers, a.job.parallelism
                );
                return ExitCode::from(2);
            }
            let mut flags = vec!["keyed-sum".to_string()];
            flags.extend(a.job.flags());
            cluster::keyed_sum(
                a.job.events,
                a.job.keys,
                setup,
                a.workers,
                slots,
                a.listen.as_deref(),
                flags,
            )
            .map(|c| {
                workers_cpu_s = c.workers_cpu_s;
                extra = Some(serde_json::json!({
                    "workers": c.workers,
                    "slots_per_worker": c.slots_per_worker,
                    "startup_s": (c.startup_s * 1000.0).round() / 1000.0,
                    "restarts": c.restarts,
                }));
                c.run
            })
        }
        Job::KeyedSum(ref a) => {
            jobs::keyed_sum(a.job.events, a.job.keys, &setup).map_err(Into::into)
        }
        Job::WindowCount(ref a) => jobs::window_count(a.events, a.keys, &setup).map_err(Into::into),
        Job::IntervalJoin(ref a) => time_joins::interval_join(&a.job(), &setup).map_err(Into::into),
        Job::TemporalJoin(ref a) => time_joins::temporal_join(&a.job(), &setup).map_err(Into::into),
        Job::TableSum(ref a) => jobs::table_sum(a.events, a.keys, &setup).map_err(Into::into),
        Job::BroadcastRules(ref a) => {
            broadcast_rules::broadcast_rules(a.events, a.keys, &setup).map_err(Into::into)
        }
        Job::Recovery(_)
        | Job::RecoveryChild(_)
        | Job::KeyedSumLarge(_)
        | Job::SlidingWindow(_)
        | Job::StateCollections(_)
        | Job::Nexmark(_)
        | Job::ClusterWorker(_)
        | Job::AsyncIo(_)
        | Job::Backpressure(_)
        | Job::Latency(_)
        | Job::InFlightCheckpoint(_)
        | Job::UpsertPostgres(_) => {
            unreachable!("handled above")
        }
    };
    let cpu_s = match (cpu_before, weir_bench::nexmark::run::process_cpu_seconds()) {
        (Some(a), Some(b)) => workers_cpu_s.map(|w| b - a + w),
        _ => None,
    };
    match run {
        Ok(r) => {
            let mut line = serde_json::json!({
                "job": name,
                "events": args.events,
                "keys": args.keys,
                "parallelism": args.parallelism,
                "state": state,
                "checkpoint_interval_ms": args.checkpoint_interval_ms,
                "elapsed_s": (r.elapsed_s * 1000.0).round() / 1000.0,
                "events_per_sec": (args.events as f64 / r.elapsed_s).round() as u64,
                "checkpoints_completed": r.checkpoints,
                "results": r.results,
                "cpu_s": cpu_s.map(|c| (c * 100.0).round() / 100.0),
                "peak_rss_kib": large_state::peak_rss_kib(),
                "allocator": ALLOCATOR_NAME,
            });
            if let (Some(line), Some(serde_json::Value::Object(extra))) =
                (line.as_object_mut(), extra)
            {
                line.extend(extra);
            }
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("weir-bench: {name} failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}
