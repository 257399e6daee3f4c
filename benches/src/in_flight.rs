//! `in-flight-checkpoint`: how long an aligned checkpoint takes to pass through a
//! backpressured pipeline, with channels of a fixed capacity or with bounded in-flight
//! data.
//!
//! An unthrottled generator → rebalance → key_by (1,000 keys) → running sum per key →
//! rebalance → a sink throttled to `--sink-rate` records/s, checkpointing (aligned,
//! exactly-once) every `--checkpoint-interval-ms`. After `--seconds` the job's checkpoint
//! history is read from its REST API and the job is cancelled. One JSON line: checkpoint
//! duration and alignment percentiles, checkpoints completed, records the sink took and the
//! in-flight target.

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir::prelude::*;

#[derive(clap::Args, Debug, Clone)]
pub struct InFlightArgs {
    /// The in-flight target in milliseconds (0: channels of a fixed capacity).
    #[arg(long, default_value_t = 1000)]
    pub in_flight_target_ms: u64,
    /// Records per second the sink takes, at most.
    #[arg(long, default_value_t = 5_000)]
    pub sink_rate: u64,
    /// How long the job runs.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Parallelism of every operator.
    #[arg(long, default_value_t = 1)]
    pub parallelism: usize,
    /// Checkpoint interval in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub checkpoint_interval_ms: u64,
}

/// Takes at most `rate` records per second (per subtask), pacing every 100 records.
struct Throttled {
    rate: u64,
    started: Option<Instant>,
    seen: u64,
    taken: Arc<AtomicU64>,
}

impl SinkFunction<(u64, i64)> for Throttled {
    fn invoke(&mut self, _: (u64, i64), _: Timestamp) -> weir::Result<()> {
        let started = *self.started.get_or_insert_with(Instant::now);
        self.seen += 1;
        self.taken.fetch_add(1, Ordering::Relaxed);
        if self.seen.is_multiple_of(100) {
            let due = started + Duration::from_secs_f64(self.seen as f64 / self.rate as f64);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
        Ok(())
    }
}

fn get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<serde_json::Value> {
    let mut c = std::net::TcpStream::connect(addr)?;
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: weir\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    c.read_to_string(&mut response)?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .ok_or_else(|| anyhow::anyhow!("not an HTTP response"))?;
    Ok(serde_json::from_str(body)?)
}

fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Some(sorted[i])
}

/// Runs the job once; returns its JSON line.
pub fn run(a: &InFlightArgs) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(
        a.sink_rate > 0 && a.seconds > 0 && a.parallelism > 0,
        "--sink-rate, --seconds and --parallelism must be at least 1"
    );
    let dir = tempfile::tempdir()?;
    let target = (a.in_flight_target_ms > 0).then(|| Duration::from_millis(a.in_flight_target_ms));
    let env = Env::new()
        .parallelism(a.parallelism)
        .in_flight_target(target)
        .web_address("127.0.0.1:0")
        .checkpoints(
            CheckpointConfig::new(dir.path())
                .interval(Duration::from_millis(a.checkpoint_interval_ms)),
        );
    let taken = Arc::new(AtomicU64::new(0));
    let (rate, t) = (a.sink_rate, taken.clone());
    env.from_iter(0u64..)
        .rebalance()
        .map(|v| (v % 1_000, 1i64))
        .key_by(|(k, _)| *k)
        .reduce(|(k, a), (_, b)| (k, a + b))
        .rebalance()
        .sink("throttled", move || Throttled {
            rate,
            started: None,
            seen: 0,
            taken: t.clone(),
        });
    let handle = env.execute_async("in-flight-checkpoint")?;
    let addr = handle
        .web_address()
        .ok_or_else(|| anyhow::anyhow!("no REST API"))?;
    std::thread::sleep(Duration::from_secs(a.seconds));
    let checkpoints = get(addr, "/v1/checkpoints")?;
    let ops = get(addr, "/v1/operators")?;
    handle.cancel();
    let _ = handle.join();
    let completed: Vec<&serde_json::Value> = checkpoints["history"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["status"] == "COMPLETED")
        .collect();
    let mut durations: Vec<u64> = completed
        .iter()
        .filter_map(|c| c["duration_ms"].as_u64())
        .collect();
    let mut alignments: Vec<u64> = completed
        .iter()
        .filter_map(|c| c["alignment_ms"].as_u64())
        .collect();
    durations.sort_unstable();
    alignments.sort_unstable();
    let queued: u64 = ops["operators"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o["records_queued_in"].as_u64())
        .sum();
    Ok(serde_json::json!({
        "job": "in-flight-checkpoint",
        "in_flight_target_ms": a.in_flight_target_ms,
        "parallelism": a.parallelism,
        "sink_rate": a.sink_rate,
        "seconds": a.seconds,
        "checkpoints_completed": checkpoints["counts"]["completed"],
        "checkpoints_in_history": durations.len(),
        "checkpoint_p50_ms": percentile(&durations, 0.5),
        "checkpoint_p99_ms": percentile(&durations, 0.99),
        "checkpoint_max_ms": durations.last(),
        "alignment_p50_ms": percentile(&alignments, 0.5),
        "alignment_max_ms": alignments.last(),
        "records_queued_in_at_end": queued,
        "sink_records": taken.load(Ordering::Relaxed),
    }))
}
