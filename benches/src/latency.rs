//! `weir-bench latency`: source-to-sink latency of a keyed job at a fixed input rate.
//!
//! A paced source → key_by → running count per key (keyed value state) → sink. Each
//! source subtask emits its share of `--rate` records per second, paced by the wall clock
//! (every poll emits what is due by then, so the input is steady, not one burst a second),
//! and stamps each record with the wall-clock time in microseconds at which it left the
//! source. The sink records `now − stamp` into an HDR histogram. Records stamped during the
//! warm-up are left out.
//!
//! With checkpoints on (every second by default) the sink also keeps the largest latency
//! of the records that crossed a checkpoint: those that reached the sink after a source
//! injected the barrier and left the source before the sink's task had finished its
//! synchronous snapshot (the records the checkpoint could hold up).

use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use weir::prelude::*;

/// The flags of `weir-bench latency`.
#[derive(clap::Args, Debug, Clone)]
pub struct LatencyArgs {
    /// Records per second, over all source subtasks.
    #[arg(long)]
    pub rate: u64,
    /// Parallelism of every operator.
    #[arg(long, default_value_t = 1)]
    pub parallelism: usize,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Seconds at the start whose records are not measured.
    #[arg(long, default_value_t = 1.0)]
    pub warmup_seconds: f64,
    /// How long a partly filled batch may wait for more records while its producer is
    /// busy (milliseconds; 0 = at every millisecond tick).
    #[arg(long, default_value_t = 10)]
    pub flush_interval_ms: u64,
    /// Checkpoint interval in milliseconds (0 = no checkpoints).
    #[arg(long, default_value_t = 1000)]
    pub checkpoint_interval_ms: u64,
    /// Keyed state backend.
    #[arg(long, value_enum, default_value_t = crate::State::Memory)]
    pub state: crate::State,
    /// Distinct keys.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Records per channel batch.
    #[arg(long, default_value_t = 1024)]
    pub batch_size: usize,
}

impl LatencyArgs {
    /// Refuses flags that cannot make a run, with what to change.
    pub fn validate(&self) -> Result<(), String> {
        if self.rate == 0 || self.parallelism == 0 || self.keys == 0 || self.batch_size == 0 {
            return Err("--rate, --parallelism, --keys and --batch-size must be at least 1".into());
        }
        if self.rate < self.parallelism as u64 {
            return Err(format!(
                "--rate {} is below one record per second per source subtask (--parallelism {})",
                self.rate, self.parallelism
            ));
        }
        if !(self.seconds > 0.0 && self.seconds.is_finite()) {
            return Err("--seconds must be a positive number".into());
        }
        if !(self.warmup_seconds >= 0.0 && self.warmup_seconds.is_finite()) {
            return Err("--warmup-seconds must be zero or a positive number".into());
        }
        Ok(())
    }
}

/// Percentiles of a latency histogram (microsecond samples), in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest sample.
    pub max_ms: f64,
}

/// Summarises a histogram of microseconds (all zero when it is empty).
pub fn summarize(h: &Histogram<u64>) -> Summary {
    let ms = |us: u64| us as f64 / 1000.0;
    if h.is_empty() {
        return Summary {
            count: 0,
            p50_ms: 0.0,
            p99_ms: 0.0,
            p999_ms: 0.0,
            max_ms: 0.0,
        };
    }
    Summary {
        count: h.len(),
        p50_ms: ms(h.value_at_quantile(0.5)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        p999_ms: ms(h.value_at_quantile(0.999)),
        max_ms: ms(h.max()),
    }
}

/// A histogram of microseconds from 1 µs to an hour, three significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// Wall-clock microseconds since the Unix epoch.
fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// What the subtasks share: the measurement window and the last barrier's time.
#[derive(Default)]
struct Shared {
    /// Records stamped before this (µs) are the warm-up; 0 until a source starts.
    measure_from_us: AtomicI64,
    /// When a source last injected a checkpoint barrier (µs), the latest of the subtasks.
    barrier_us: AtomicI64,
    /// The sinks' histograms, merged at end of input.
    all: Mutex<Option<Histogram<u64>>>,
    crossing: Mutex<Option<Histogram<u64>>>,
}

/// How many records one subtask emits by `elapsed`, at `rate` per second: the pace.
pub fn due(rate: u64, elapsed: Duration) -> u64 {
    (elapsed.as_nanos() * rate as u128 / 1_000_000_000) as u64
}

/// Emits its share of the rate, each record stamped with the time it left.
struct Paced {
    rate: u64,
    total: u64,
    sent: u64,
    key: u64,
    step: u64,
    keys: u64,
    warmup: Duration,
    started: Option<Instant>,
    shared: Arc<Shared>,
}

impl SourceFunction<(u64, i64)> for Paced {
    fn poll(&mut self, out: &mut SourceOutput<'_, (u64, i64)>) -> weir::Result<SourceStatus> {
        let started = *self.started.get_or_insert_with(|| {
            let from = now_us() + self.warmup.as_micros() as i64;
            let _ = self.shared.measure_from_us.compare_exchange(
                0,
                from,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
            Instant::now()
        });
        let elapsed = started.elapsed();
        let target = due(self.rate, elapsed).min(self.total);
        // One stamp per poll of at most 1024 records (a few microseconds of work).
        let n = (target - self.sent).min(1024);
        let stamp = now_us();
        for _ in 0..n {
            out.emit((self.key, stamp))?;
            self.key = (self.key + self.step) % self.keys;
        }
        self.sent += n;
        if self.sent == self.total {
            return Ok(SourceStatus::Finished);
        }
        if self.sent < target {
            return Ok(SourceStatus::More);
        }
        // Nothing due: come back when the next record is.
        let next = Duration::from_nanos(
            ((self.sent + 1) as u128 * 1_000_000_000 / self.rate as u128) as u64,
        );
        Ok(SourceStatus::Idle(
            next.saturating_sub(elapsed).as_millis() as u64
        ))
    }

    fn snapshot(&mut self) -> weir::Result<Option<(Vec<u8>, String)>> {
        self.shared.barrier_us.fetch_max(now_us(), Ordering::SeqCst);
        Ok(None)
    }
}

/// A count per key in keyed state; passes each record's stamp on.
#[derive(Default)]
struct CountPerKey {
    count: Option<ValueState<u64>>,
}

impl KeyedProcessFunction<u64, (u64, i64), (u64, i64)> for CountPerKey {
    fn open(&mut self, state: &mut StateContext<u64>) -> weir::Result<()> {
        self.count = Some(state.value_state("count")?);
        Ok(())
    }

    fn process(
        &mut self,
        (key, stamp): (u64, i64),
        ctx: &mut KeyedContext<'_, u64, (u64, i64)>,
    ) -> weir::Result<()> {
        let count = self.count.as_mut().expect("opened");
        let next = count.get()?.unwrap_or(0) + 1;
        count.set(next)?;
        ctx.emit((key, stamp));
        Ok(())
    }
}

/// Records each record's age; see the module documentation for "crossed a checkpoint".
struct LatencySink {
    shared: Arc<Shared>,
    all: Histogram<u64>,
    crossing: Histogram<u64>,
    /// The barrier being observed (µs) and, once the task's snapshot is over, when it was.
    window: Option<(i64, Option<i64>)>,
    snapshotted: bool,
}

impl SinkFunction<(u64, i64)> for LatencySink {
    fn invoke(&mut self, (_, stamp): (u64, i64), _ts: Timestamp) -> weir::Result<()> {
        let now = now_us();
        let from = self.shared.measure_from_us.load(Ordering::Relaxed);
        let barrier = self.shared.barrier_us.load(Ordering::Relaxed);
        if barrier > 0 && self.window.is_none_or(|(b, _)| barrier > b) {
            self.window = Some((barrier, None));
        }
        if self.snapshotted {
            self.snapshotted = false;
            if let Some((_, resumed)) = &mut self.window {
                *resumed = Some(now);
            }
        }
        if stamp < from {
            return Ok(());
        }
        let age = (now - stamp).max(1) as u64;
        self.all.saturating_record(age);
        if let Some((b, resumed)) = self.window
            && now >= b
            && stamp <= resumed.unwrap_or(i64::MAX)
        {
            self.crossing.saturating_record(age);
        }
        Ok(())
    }

    fn snapshot(
        &mut self,
        _id: weir::ids::CheckpointId,
    ) -> weir::Result<Option<(Vec<u8>, String)>> {
        self.snapshotted = true;
        Ok(None)
    }

    fn finish(&mut self) -> weir::Result<()> {
        for (mine, total) in [
            (&self.all, &self.shared.all),
            (&self.crossing, &self.shared.crossing),
        ] {
            let mut total = total.lock().unwrap_or_else(|p| p.into_inner());
            match total.as_mut() {
                Some(t) => t
                    .add(mine)
                    .map_err(|e| weir::Error::Config(e.to_string()))?,
                None => *total = Some(mine.clone()),
            }
        }
        Ok(())
    }
}

/// Runs the job and returns its JSON line.
pub fn run(a: &LatencyArgs) -> anyhow::Result<String> {
    a.validate().map_err(anyhow::Error::msg)?;
    let dir = tempfile::tempdir()?;
    let mut cfg = JobConfig {
        parallelism: a.parallelism,
        batch_size: a.batch_size,
        flush_interval: Duration::from_millis(a.flush_interval_ms),
        state_backend: crate::backend(a.state),
        ..JobConfig::default()
    };
    if a.checkpoint_interval_ms > 0 {
        cfg.checkpoint = Some(
            CheckpointConfig::new(dir.path())
                .interval(Duration::from_millis(a.checkpoint_interval_ms)),
        );
    }
    let env = Env::with_config(cfg);
    let shared = Arc::new(Shared::default());
    let p = a.parallelism as u64;
    let secs = a.warmup_seconds + a.seconds;
    let (rate, keys, warmup) = (a.rate, a.keys, Duration::from_secs_f64(a.warmup_seconds));
    let src = shared.clone();
    env.source("paced", move |ctx| {
        let r = ctx.subtask as u64;
        let rate = rate / p + u64::from(r < rate % p);
        Paced {
            rate,
            total: (rate as f64 * secs).round() as u64,
            sent: 0,
            key: r % keys,
            step: p,
            keys,
            warmup,
            started: None,
            shared: src.clone(),
        }
    })
    .key_by(|(k, _)| *k)
    .process(CountPerKey::default)
    .name("count-per-key")
    .sink("latency", {
        let shared = shared.clone();
        move || LatencySink {
            shared: shared.clone(),
            all: new_histogram(),
            crossing: new_histogram(),
            window: None,
            snapshotted: false,
        }
    });
    let r = env.execute("latency")?;
    let take = |m: &Mutex<Option<Histogram<u64>>>| {
        m.lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_else(new_histogram)
    };
    let all = summarize(&take(&shared.all));
    let crossing = summarize(&take(&shared.crossing));
    let checkpoints = a.checkpoint_interval_ms > 0;
    Ok(serde_json::json!({
        "job": "latency",
        "rate": a.rate,
        "parallelism": a.parallelism,
        "flush_interval_ms": a.flush_interval_ms,
        "state": a.state.flag(),
        "checkpoint_interval_ms": a.checkpoint_interval_ms,
        "seconds": a.seconds,
        "records": all.count,
        "records_per_sec": (all.count as f64 / a.seconds).round() as u64,
        "latency_p50_ms": all.p50_ms,
        "latency_p99_ms": all.p99_ms,
        "latency_p999_ms": all.p999_ms,
        "latency_max_ms": all.max_ms,
        "checkpoints_completed": r.checkpoints_completed,
        "checkpoint_records": checkpoints.then_some(crossing.count),
        "checkpoint_latency_max_ms": checkpoints.then_some(crossing.max_ms),
        "checkpoint_latency_p99_ms": checkpoints.then_some(crossing.p99_ms),
    })
    .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_reads_percentiles_in_milliseconds() {
        let mut h = new_histogram();
        // 1 ms .. 1000 ms, one sample each.
        for ms in 1..=1000u64 {
            h.record(ms * 1000).unwrap();
        }
        let s = summarize(&h);
        assert_eq!(s.count, 1000);
        // Three significant digits: within 0.1% of the exact value.
        assert!((s.p50_ms - 500.0).abs() <= 0.5, "{s:?}");
        assert!((s.p99_ms - 990.0).abs() <= 1.0, "{s:?}");
        assert!((s.p999_ms - 999.0).abs() <= 1.0, "{s:?}");
        assert!((s.max_ms - 1000.0).abs() <= 1.0, "{s:?}");
        assert_eq!(summarize(&new_histogram()).count, 0);
        assert_eq!(summarize(&new_histogram()).max_ms, 0.0);
    }

    #[test]
    fn pace_spreads_the_rate_over_the_second() {
        assert_eq!(due(100_000, Duration::ZERO), 0);
        assert_eq!(due(100_000, Duration::from_micros(10)), 1);
        assert_eq!(due(100_000, Duration::from_millis(1)), 100);
        assert_eq!(due(100_000, Duration::from_millis(2500)), 250_000);
        assert_eq!(due(3, Duration::from_millis(999)), 2);
    }

    #[test]
    fn bad_flags_are_refused_with_what_to_change() {
        let ok = LatencyArgs {
            rate: 1000,
            parallelism: 2,
            seconds: 1.0,
            warmup_seconds: 0.0,
            flush_interval_ms: 1,
            checkpoint_interval_ms: 0,
            state: crate::State::Memory,
            keys: 10,
            batch_size: 1024,
        };
        assert_eq!(ok.validate(), Ok(()));
        let slow = LatencyArgs {
            rate: 1,
            ..ok.clone()
        };
        assert!(slow.validate().unwrap_err().contains("--rate 1"));
        let warm = LatencyArgs {
            warmup_seconds: -1.0,
            ..ok.clone()
        };
        assert!(warm.validate().unwrap_err().contains("--warmup-seconds"));
        let none = LatencyArgs { seconds: 0.0, ..ok };
        assert!(none.validate().unwrap_err().contains("--seconds"));
    }
}
