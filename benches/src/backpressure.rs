//! `weir-bench backpressure`: what checkpoints cost in each checkpoint mode when a slow sink
//! fills every channel upstream, and what each mode costs without backpressure.
//!
//! The job: a rate-limited source (`--rate` records/s in all, `(key, 1)` over `--keys` keys)
//! → key_by → running sum per key in keyed value state → a sink that lets each subtask write
//! at most a tenth of the source's rate (`--rate / 10 / P` records/s per subtask), sleeping
//! when it is ahead, so the keyed exchange stays full. Checkpoints every
//! `--checkpoint-interval-ms` (1 s) into a checkpoint directory, in `--checkpoint-mode`;
//! the job runs `--seconds` and is then cancelled. Every completed checkpoint's statistics
//! come from its manifest (`_metadata`: the figures `/v1/checkpoints` shows, without
//! serving the REST API during the run): duration (trigger to last acknowledgement),
//! alignment, bytes written. `--no-throttle` runs the same job with neither the source nor
//! the sink limited and reports the records/s the sink saw, to measure what a mode costs
//! without backpressure.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir::prelude::*;

#[derive(clap::Args, Debug, Clone)]
pub(crate) struct BackpressureArgs {
    /// aligned, unaligned, aligned-timeout (200 ms) or aligned-timeout:MS.
    #[arg(long, default_value = "aligned")]
    pub(crate) checkpoint_mode: String,
    /// Parallelism of every operator.
    #[arg(long, default_value_t = 1)]
    pub(crate) parallelism: usize,
    /// How long the job runs before it is cancelled.
    #[arg(long, default_value_t = 30)]
    pub(crate) seconds: u64,
    /// Records per second the source emits at most, all subtasks together; the sink writes
    /// a tenth of it.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) rate: u64,
    /// Distinct keys.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) keys: u64,
    /// Keyed state backend (RocksDB by default: checkpoints write SST files).
    #[arg(long, value_enum, default_value_t = crate::State::Rocksdb)]
    pub(crate) state: crate::State,
    /// Checkpoint interval in milliseconds.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) checkpoint_interval_ms: u64,
    /// Checkpoint directory (must be new or empty; default: a fresh temporary directory,
    /// removed after the run).
    #[arg(long)]
    pub(crate) checkpoint_dir: Option<PathBuf>,
    /// Neither the source nor the sink is limited: report records/s instead.
    #[arg(long)]
    pub(crate) no_throttle: bool,
}

/// `(key, 1)` records, keys spread by a multiplicative hash; at most `per_sec` a second
/// (`None`: as fast as the job takes them). Its position is checkpointed.
struct RateSource {
    per_sec: Option<u64>,
    keys: u64,
    subtask: u64,
    parallelism: u64,
    emitted: u64,
    start: Option<Instant>,
}

impl SourceFunction<(u64, i64)> for RateSource {
    fn poll(&mut self, out: &mut SourceOutput<'_, (u64, i64)>) -> weir::Result<SourceStatus> {
        let start = *self.start.get_or_insert_with(Instant::now);
        let batch = match self.per_sec {
            None => 1024,
            Some(r) => {
                let due = (start.elapsed().as_secs_f64() * r as f64) as u64;
                due.saturating_sub(self.emitted).min(1024)
            }
        };
        if batch == 0 {
            return Ok(SourceStatus::Idle(1));
        }
        for _ in 0..batch {
            let n = self.emitted * self.parallelism + self.subtask;
            let key = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) % self.keys;
            out.emit((key, 1))?;
            self.emitted += 1;
        }
        Ok(SourceStatus::More)
    }

    fn snapshot(&mut self) -> weir::Result<Option<(Vec<u8>, String)>> {
        Ok(Some((
            self.emitted.to_le_bytes().to_vec(),
            format!("{} records emitted", self.emitted),
        )))
    }
}

/// Running sum per key, emitted for every record.
#[derive(Default)]
struct RunningSum {
    sum: Option<ValueState<i64>>,
}

impl KeyedProcessFunction<u64, (u64, i64), (u64, i64)> for RunningSum {
    fn open(&mut self, state: &mut StateContext<u64>) -> weir::Result<()> {
        self.sum = Some(state.value_state("sum")?);
        Ok(())
    }

    fn process(
        &mut self,
        (key, value): (u64, i64),
        ctx: &mut KeyedContext<'_, u64, (u64, i64)>,
    ) -> weir::Result<()> {
        let sum = self.sum.as_mut().expect("opened");
        let next = sum.get()?.unwrap_or(0) + value;
        sum.set(next)?;
        ctx.emit((key, next));
        Ok(())
    }
}

/// Counts what it receives into a shared total (every 256 records) and, with a rate, writes
/// at most `per_sec` records a second: a slow sink.
struct SlowSink {
    per_sec: Option<u64>,
    total: Arc<AtomicU64>,
    unpublished: u64,
    start: Option<Instant>,
    passed: u64,
}

impl SinkFunction<(u64, i64)> for SlowSink {
    fn invoke(&mut self, _value: (u64, i64), _ts: Timestamp) -> weir::Result<()> {
        if let Some(r) = self.per_sec {
            let now = Instant::now();
            let start = *self.start.get_or_insert(now);
            let due = start + Duration::from_secs_f64(self.passed as f64 / r as f64);
            if due > now + Duration::from_millis(1) {
                std::thread::sleep(due - now);
            } else if now > due + Duration::from_millis(100) {
                // Behind (the job stalled): a slow sink does not make up for it in a burst.
                self.start = Some(now);
                self.passed = 0;
            }
            self.passed += 1;
        }
        self.unpublished += 1;
        if self.unpublished == 256 {
            self.total.fetch_add(256, Ordering::Relaxed);
            self.unpublished = 0;
        }
        Ok(())
    }
}

/// The statistics of one completed checkpoint, from its manifest.
struct Completed {
    id: u64,
    duration_ms: u64,
    alignment_ms: u64,
    bytes: u64,
    full_bytes: u64,
    created_unix_ms: u64,
    channel_state_bytes: Option<u64>,
}

/// Every complete checkpoint in `dir`, oldest first.
fn completed(dir: &Path) -> anyhow::Result<Vec<Completed>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Ok(bytes) = std::fs::read(path.join("_metadata")) else {
            continue;
        };
        let m: serde_json::Value = serde_json::from_slice(&bytes)?;
        let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        if m["kind"] != "checkpoint" {
            continue;
        }
        let s = &m["stats"];
        out.push(Completed {
            id: n(&m["checkpoint_id"]),
            duration_ms: n(&s["duration_ms"]),
            alignment_ms: n(&s["alignment_ms"]),
            bytes: n(&s["bytes"]),
            full_bytes: n(&s["full_bytes"]),
            created_unix_ms: n(&m["created_unix_ms"]),
            // Recorded by runtimes that store channel state with unaligned checkpoints.
            channel_state_bytes: s["channel_state_bytes"].as_u64(),
        });
    }
    out.sort_by_key(|c| c.id);
    Ok(out)
}

/// The nearest-rank `p`-quantile of `values` (0 when empty).
fn quantile(mut values: Vec<u64>, p: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    let rank = ((p * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Runs the job and returns its JSON line.
pub(crate) fn run(a: &BackpressureArgs) -> anyhow::Result<String> {
    let mode: CheckpointMode = a
        .checkpoint_mode
        .parse()
        .map_err(|e| anyhow::anyhow!("--checkpoint-mode: {e}"))?;
    if a.parallelism == 0 || a.seconds == 0 || a.rate < 10 || a.keys == 0 {
        anyhow::bail!(
            "--parallelism, --seconds and --keys must be at least 1, and --rate at least 10"
        );
    }
    let (dir, temporary) = match &a.checkpoint_dir {
        Some(d) if crate::non_empty(d) => anyhow::bail!(
            "{} is not empty; a benchmark starts from scratch, give it a new directory",
            d.display()
        ),
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!(
                "weir-backpressure-{}-{}",
                std::process::id(),
                unix_ms()
            )),
            true,
        ),
    };
    let outcome = measure(a, mode, &dir);
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    outcome
}

fn measure(a: &BackpressureArgs, mode: CheckpointMode, dir: &Path) -> anyhow::Result<String> {
    let p = a.parallelism as u64;
    let (source_rate, sink_rate) = if a.no_throttle {
        (None, None)
    } else {
        (Some(a.rate), Some((a.rate / 10).div_ceil(p)))
    };
    let mut ck = CheckpointConfig::new(dir)
        .interval(Duration::from_millis(a.checkpoint_interval_ms))
        .mode(mode);
    // Every checkpoint of the run stays, to be read at the end.
    ck.retain = 100_000;
    let env = Env::new()
        .parallelism(a.parallelism)
        .state_backend(crate::backend(a.state))
        .checkpoints(ck);
    let total = Arc::new(AtomicU64::new(0));
    let counter = total.clone();
    let keys = a.keys;
    env.source("rate-source", move |ctx| RateSource {
        per_sec: source_rate.map(|r| r.div_ceil(ctx.parallelism as u64)),
        keys,
        subtask: ctx.subtask as u64,
        parallelism: ctx.parallelism as u64,
        emitted: 0,
        start: None,
    })
    .key_by(|(k, _)| *k)
    .process(RunningSum::default)
    .name("running-sum")
    .sink("slow-sink", move || SlowSink {
        per_sec: sink_rate,
        total: counter.clone(),
        unpublished: 0,
        start: None,
        passed: 0,
    });
    let handle = env.execute_async("backpressure")?;
    let started = Instant::now();
    let started_ms = unix_ms();
    // Throughput over the run after a warm-up of a fifth of it (at most 5 s).
    let warmup = Duration::from_secs(a.seconds)
        .div_f64(5.0)
        .min(Duration::from_secs(5));
    let end = started + Duration::from_secs(a.seconds);
    std::thread::sleep(warmup);
    let (t0, n0) = (Instant::now(), total.load(Ordering::Relaxed));
    while Instant::now() < end {
        if handle.is_finished() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (t1, n1) = (Instant::now(), total.load(Ordering::Relaxed));
    let ended_ms = unix_ms();
    handle.cancel();
    match handle.join() {
        Err(weir::Error::Cancelled) => {}
        Err(e) => anyhow::bail!("the job failed: {e}"),
        Ok(_) => anyhow::bail!("the job ended before it was cancelled"),
    }
    let done = completed(dir)?;
    let highest = done.last().map(|c| c.id).unwrap_or(0);
    // The longest stretch without a completed checkpoint, the run's start and end included:
    // what "checkpoints keep their interval" means to a sink committing on them.
    let mut gaps = Vec::new();
    let mut last = started_ms;
    for c in &done {
        gaps.push(c.created_unix_ms.saturating_sub(last));
        last = c.created_unix_ms;
    }
    gaps.push(ended_ms.saturating_sub(last));
    let durations: Vec<u64> = done.iter().map(|c| c.duration_ms).collect();
    let channel_state: Vec<u64> = done.iter().filter_map(|c| c.channel_state_bytes).collect();
    let line = serde_json::json!({
        "job": "backpressure",
        "mode": mode.to_string(),
        "throttled": !a.no_throttle,
        "parallelism": a.parallelism,
        "seconds": a.seconds,
        "state": crate::backend(a.state).name(),
        "keys": a.keys,
        "source_rate": source_rate,
        "sink_rate_per_subtask": sink_rate,
        "checkpoint_interval_ms": a.checkpoint_interval_ms,
        "checkpoints_completed": done.len(),
        // Ids below the newest completed one that never completed (aborted or subsumed).
        "checkpoints_not_completed": highest.saturating_sub(done.len() as u64),
        "checkpoint_p50_ms": quantile(durations.clone(), 0.5),
        "checkpoint_p99_ms": quantile(durations.clone(), 0.99),
        "checkpoint_max_ms": durations.iter().copied().max().unwrap_or(0),
        "alignment_p99_ms": quantile(done.iter().map(|c| c.alignment_ms).collect(), 0.99),
        "checkpoint_bytes": quantile(done.iter().map(|c| c.bytes).collect(), 0.5),
        "checkpoint_full_bytes": quantile(done.iter().map(|c| c.full_bytes).collect(), 0.5),
        "channel_state_bytes": (!channel_state.is_empty()).then(|| quantile(channel_state, 0.5)),
        "longest_without_checkpoint_ms": gaps.into_iter().max().unwrap_or(0),
        "records_per_sec": ((n1 - n0) as f64 / (t1 - t0).as_secs_f64()).round() as u64,
    });
    Ok(line.to_string())
}
