//! weir-bench: whole-job benchmarks with the job shapes of the performance brief.
//!
//! ```text
//! cargo run --release -p weir-bench -- keyed-sum --events 20000000 --keys 100000 \
//!     --parallelism 1 --state memory --checkpoint-interval-ms 0
//! ```
//! prints one JSON line per run. `results` proves the work was done: for `keyed-sum` the
//! number of emitted (key, sum) records (one per 1000 records a subtask processes), for
//! `window-count` the total of all window counts (equal to `events`).
//!
//! ```text
//! cargo run --release -p weir-bench -- nexmark --query q5 --events 10000000 \
//!     [--parallelism P] [--state memory|rocksdb] [--checkpoint-interval-ms MS]
//! ```
//! runs one Nexmark query over a bounded generated stream (see `docs/nexmark.md`) and
//! prints events, elapsed, events_per_sec, the CPU seconds the process used (generator
//! included), events per core-second, and `results` (records the query emitted).

mod jobs;

use clap::{Parser, Subcommand, ValueEnum};
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
    KeyedSum(Args),
    /// generator with watermarks → key_by → tumbling event-time windows of 1000 → count.
    WindowCount(Args),
    /// Recovery time: builds `--keys` keys of `--value-bytes` each in RocksDB, checkpoints,
    /// then measures a restart that restores them (start → state loaded and running).
    Recovery(RecoveryArgs),
    /// One Nexmark query over a bounded generated stream (q0-q9, q11, q14, q17-q22).
    Nexmark(NexmarkArgs),
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
struct RecoveryArgs {
    /// Number of keys (one state entry each).
    #[arg(long, default_value_t = 10_000_000)]
    keys: u64,
    /// Bytes per state value.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Parallelism of both runs.
    #[arg(long, default_value_t = 1)]
    parallelism: usize,
    /// Checkpoint directory (must be new or empty).
    #[arg(long)]
    checkpoint_dir: std::path::PathBuf,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (name, args) = match &cli.job {
        Job::KeyedSum(a) => ("keyed-sum", a),
        Job::WindowCount(a) => ("window-count", a),
        Job::Nexmark(n) => return nexmark(n),
        Job::Recovery(r) => {
            return match jobs::recovery(r.keys, r.value_bytes, r.parallelism, &r.checkpoint_dir) {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("weir-bench: recovery failed: {e}");
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
    let setup = jobs::Setup {
        parallelism: args.parallelism,
        batch_size: args.batch_size,
        state: backend(args.state),
        checkpoint: (args.checkpoint_interval_ms > 0)
            .then(|| {
                args.checkpoint_dir
                    .clone()
                    .map(|d| (d, args.checkpoint_interval_ms))
            })
            .flatten(),
    };
    if let Some((dir, _)) = &setup.checkpoint
        && non_empty(dir)
    {
        eprintln!(
            "weir-bench: {} is not empty; a benchmark starts from scratch, give it a new directory",
            dir.display()
        );
        return ExitCode::from(2);
    }
    let run = match cli.job {
        Job::KeyedSum(ref a) => jobs::keyed_sum(a.events, a.keys, &setup),
        Job::WindowCount(ref a) => jobs::window_count(a.events, a.keys, &setup),
        Job::Recovery(_) | Job::Nexmark(_) => unreachable!("handled above"),
    };
    match run {
        Ok(r) => {
            let line = serde_json::json!({
                "job": name,
                "events": args.events,
                "keys": args.keys,
                "parallelism": args.parallelism,
                "state": setup.state.name(),
                "checkpoint_interval_ms": args.checkpoint_interval_ms,
                "elapsed_s": (r.elapsed_s * 1000.0).round() / 1000.0,
                "events_per_sec": (args.events as f64 / r.elapsed_s).round() as u64,
                "checkpoints_completed": r.checkpoints,
                "results": r.results,
            });
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("weir-bench: {name} failed: {e}");
            ExitCode::FAILURE
        }
    }
}
