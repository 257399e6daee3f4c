//! The `weir-bench nexmark` runner: one query over a bounded generated stream, measured in
//! wall time and in CPU time of the whole process (generator included).

use super::*;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use weir::BackendKind;

/// The queries the runner knows, in order.
pub const QUERIES: &[&str] = &[
    "q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8", "q9", "q11", "q14", "q17", "q18", "q19",
    "q20", "q21", "q22",
];

/// How to run a query.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// One of [`QUERIES`].
    pub query: String,
    /// Events generated in all (persons, auctions and bids).
    pub events: u64,
    /// Parallelism of every operator.
    pub parallelism: usize,
    /// Generator timelines (Nexmark's `numEventGenerators`); `None` = the parallelism.
    pub generators: Option<u64>,
    /// Events per second: 0 emits as fast as possible with event times spaced as at
    /// 10 M events/s (Flink's benchmark setting); otherwise the source is paced to it.
    pub rate: u64,
    /// Keyed state backend.
    pub state: BackendKind,
    /// Checkpoint directory and interval.
    pub checkpoint: Option<(PathBuf, Duration)>,
    /// Records per exchange batch.
    pub batch_size: usize,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// Wall time from job start to end of input.
    pub elapsed_s: f64,
    /// CPU time (user + system) of the whole process over the run.
    pub cpu_s: f64,
    /// Records the query emitted (for an updating query: changelog entries).
    pub results: u64,
    /// Checkpoints that completed during the run.
    pub checkpoints: u64,
}

/// Event-time rate when the source runs unpaced (Flink's Nexmark `TPS` setting).
pub const UNPACED_EVENT_RATE: u64 = 10_000_000;

/// Builds `query` over `events`, its output counted into `counter`.
///
/// # Errors
/// For an unknown query name.
pub fn build(query: &str, events: &Stream<Event>, counter: &Arc<AtomicU64>) -> Result<(), String> {
    match query {
        "q0" => count(q0::query(events), counter),
        "q1" => count(q1::query(events), counter),
        "q2" => count(q2::query(events), counter),
        "q3" => count(q3::query(events), counter),
        "q4" => count(q4::query(events), counter),
        "q5" => count(q5::query(events), counter),
        "q6" => count(q6::query(events), counter),
        "q7" => count(q7::query(events), counter),
        "q8" => count(q8::query(events), counter),
        "q9" => count(q9::query(events), counter),
        "q11" => count(q11::query(events), counter),
        "q14" => count(q14::query(events), counter),
        "q17" => count(q17::query(events), counter),
        "q18" => count(q18::query(events), counter),
        "q19" => count(q19::query(events), counter),
        "q20" => count(q20::query(events), counter),
        "q21" => count(q21::query(events), counter),
        "q22" => count(q22::query(events), counter),
        other => {
            return Err(format!(
                "unknown query {other:?}; weir implements {}",
                QUERIES.join(", ")
            ));
        }
    }
    Ok(())
}

/// Runs one query to the end of its bounded input.
///
/// # Errors
/// An unknown query, or the job's failure.
pub fn run(cfg: &RunConfig) -> Result<RunReport, String> {
    let mut env = Env::new()
        .parallelism(cfg.parallelism)
        .exchange(cfg.batch_size, 16)
        .state_backend(cfg.state.clone());
    if let Some((dir, interval)) = &cfg.checkpoint {
        env = env.checkpoints(CheckpointConfig::new(dir).interval(*interval));
    }
    let config = NexmarkConfig {
        num_events: cfg.events,
        num_event_generators: cfg.generators.unwrap_or(cfg.parallelism as u64).max(1),
        first_event_rate: if cfg.rate == 0 {
            UNPACED_EVENT_RATE
        } else {
            cfg.rate
        },
        ..Default::default()
    };
    let counter = Arc::new(AtomicU64::new(0));
    build(
        &cfg.query,
        &events_paced(&env, config, cfg.rate > 0),
        &counter,
    )?;
    let cpu_before = process_cpu_seconds();
    let result = env
        .execute(&format!("nexmark-{}", cfg.query))
        .map_err(|e| e.to_string())?;
    let cpu_s = match (cpu_before, process_cpu_seconds()) {
        (Some(a), Some(b)) => b - a,
        _ => f64::NAN,
    };
    Ok(RunReport {
        elapsed_s: result.elapsed.as_secs_f64(),
        cpu_s,
        results: counter.load(Ordering::SeqCst),
        checkpoints: result.checkpoints_completed,
    })
}

/// User + system CPU seconds of this process, all threads, from `/proc/self/stat` (Linux;
/// `None` elsewhere). Times there are in USER_HZ ticks, which Linux fixes at 100 per second.
pub fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

fn count<T: Data>(stream: Stream<T>, counter: &Arc<AtomicU64>) {
    let total = counter.clone();
    stream.sink("count", move || {
        crate::Counting::new(total.clone(), |_: &T| 1)
    });
}
