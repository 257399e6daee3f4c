//! weir-bench: whole-job benchmarks with the job shapes of the performance brief.
//!
//! ```text
//! cargo run --release -p weir-bench -- keyed-sum --events 20000000 --keys 100000 \
//!     --parallelism 1 --state memory --checkpoint-interval-ms 0
//! ```
//! prints one JSON line per run. `results` proves the work was done: for `keyed-sum` the
//! number of emitted (key, sum) records (one per 1000 records a subtask processes), for
//! `window-count` the total of all window counts (equal to `events`).

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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (name, args) = match &cli.job {
        Job::KeyedSum(a) => ("keyed-sum", a),
        Job::WindowCount(a) => ("window-count", a),
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
        state: match args.state {
            State::Memory => weir::BackendKind::Memory,
            State::Rocksdb => weir::BackendKind::RocksDb(Default::default()),
        },
        checkpoint: (args.checkpoint_interval_ms > 0)
            .then(|| {
                args.checkpoint_dir
                    .clone()
                    .map(|d| (d, args.checkpoint_interval_ms))
            })
            .flatten(),
    };
    if let Some((dir, _)) = &setup.checkpoint
        && dir.exists()
        && std::fs::read_dir(dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
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
        Job::Recovery(_) => unreachable!("handled above"),
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
