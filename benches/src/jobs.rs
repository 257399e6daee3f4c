//! The benchmark jobs, written in the public DSL.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use weir::cluster::ClusterConfig;
use weir::prelude::*;
use weir_bench::Counting;

/// What a run produced.
pub struct Run {
    pub elapsed_s: f64,
    pub results: u64,
    pub checkpoints: u64,
}

/// How a benchmark job runs.
pub struct Setup {
    pub parallelism: usize,
    pub batch_size: usize,
    pub state: weir::BackendKind,
    /// Checkpoint directory and interval in milliseconds.
    pub checkpoint: Option<(std::path::PathBuf, u64)>,
    /// Run as a cluster's coordinator or worker instead of alone.
    pub cluster: Option<ClusterConfig>,
    /// Serve the REST API on this address.
    pub web: Option<String>,
    /// Latency tracking: a latency marker from each source subtask this many ms apart.
    pub latency_tracking_ms: Option<u64>,
    /// The in-flight target in ms (0: fixed capacity; `None`: weir's default).
    pub in_flight_target_ms: Option<u64>,
}

/// Running sum per key; emits (key, sum) on every 1000th record this subtask processes.
#[derive(Default)]
struct RunningSum {
    sum: Option<ValueState<i64>>,
    seen: u64,
}

impl KeyedProcessFunction<u64, (u64, i64), (u64, i64)> for RunningSum {
    fn open(&mut self, state: &mut StateContext<u64>) -> weir::Result<()> {
        self.sum = Some(state.value_state("sum")?);
        Ok(())
    }

    #[inline]
    fn process(
        &mut self,
        (key, value): (u64, i64),
        ctx: &mut KeyedContext<'_, u64, (u64, i64)>,
    ) -> weir::Result<()> {
        let sum = self.sum.as_mut().expect("opened");
        let next = sum.get()?.unwrap_or(0) + value;
        sum.set(next)?;
        self.seen += 1;
        if self.seen.is_multiple_of(1000) {
            ctx.emit((key, next));
        }
        Ok(())
    }
}

pub(crate) fn env(setup: &Setup) -> Env {
    let mut env = Env::new()
        .parallelism(setup.parallelism)
        .exchange(setup.batch_size, 16)
        .state_backend(setup.state.clone());
    if let Some((dir, ms)) = &setup.checkpoint {
        env = env.checkpoints(CheckpointConfig::new(dir).interval(Duration::from_millis(*ms)));
    }
    if let Some(c) = &setup.cluster {
        env = env.cluster(c.clone());
        // The cluster's TLS settings and secret from WEIR_TLS_DIR / WEIR_SECRET_FILE
        // (benches/cluster_tls.sh); workers read the same in `cluster::worker`.
        let bad = |e: weir::Error| -> ! { panic!("weir-bench: {e}") };
        if let Some(t) = weir::Tls::from_env().unwrap_or_else(|e| bad(e)) {
            env = env.tls(t);
        }
        if let Some(s) = weir::Secret::from_env().unwrap_or_else(|e| bad(e)) {
            env = env.secret(s);
        }
    }
    if let Some(a) = &setup.web {
        env = env.web_address(a);
    }
    if let Some(ms) = setup.latency_tracking_ms {
        env = env.latency_tracking_interval(Duration::from_millis(ms));
    }
    if let Some(ms) = setup.in_flight_target_ms {
        env = env.in_flight_target((ms > 0).then(|| Duration::from_millis(ms)));
    }
    env
}

/// generator → key_by → running sum → counting sink.
pub fn keyed_sum(events: u64, keys: u64, setup: &Setup) -> weir::Result<Run> {
    let (job, emitted) = start_keyed_sum(events, keys, setup)?;
    let r = job.join()?;
    Ok(Run {
        elapsed_s: r.elapsed.as_secs_f64(),
        results: emitted.load(Ordering::SeqCst),
        checkpoints: r.checkpoints_completed,
    })
}

/// Starts keyed-sum in the background. The counter holds what this process's sinks
/// emitted once they finished: all of it when the job runs alone, nothing on a cluster's
/// coordinator, a worker's share on a worker.
pub fn start_keyed_sum(
    events: u64,
    keys: u64,
    setup: &Setup,
) -> weir::Result<(JobHandle, Arc<AtomicU64>)> {
    let env = env(setup);
    let emitted = Arc::new(AtomicU64::new(0));
    let counter = emitted.clone();
    env.generator(events, keys)
        .key_by(|(k, _)| *k)
        .process(RunningSum::default)
        .name("running-sum")
        .sink("count", move || {
            Counting::new(counter.clone(), |_: &(u64, i64)| 1)
        });
    Ok((env.execute_async("keyed-sum")?, emitted))
}

/// generator with watermarks → key_by → tumbling windows of 1000 → count → summing sink.
pub fn window_count(events: u64, keys: u64, setup: &Setup) -> weir::Result<Run> {
    let env = env(setup);
    let total = Arc::new(AtomicU64::new(0));
    let counter = total.clone();
    env.generator(events, keys)
        .with_watermarks(
            WatermarkStrategy::bounded_out_of_orderness(100)
                .with_emit_interval(Duration::from_millis(20)),
        )
        .key_by(|(k, _)| *k)
        .window(WindowAssigner::tumbling(1000))
        .aggregate(Count)
        .sink("sum-counts", move || {
            Counting::new(counter.clone(), |c: &u64| *c)
        });
    let r = env.execute("window-count")?;
    Ok(Run {
        elapsed_s: r.elapsed.as_secs_f64(),
        results: total.load(Ordering::SeqCst),
        checkpoints: r.checkpoints_completed,
    })
}

/// generator → table of the latest value per key → group by key mod 100 → sum with
/// retractions → counting sink (the number of changes of the group sums).
pub fn table_sum(events: u64, keys: u64, setup: &Setup) -> weir::Result<Run> {
    let env = env(setup);
    let changes = Arc::new(AtomicU64::new(0));
    let counter = changes.clone();
    let upserts = env.generator(events, keys).map(|(k, v)| (k, Some(v)));
    Table::from_upserts(&upserts)
        .group_by(|k, _| k % 100)
        .sum()
        .changes()
        .sink("count-changes", move || {
            Counting::new(counter.clone(), |_: &Change<u64, i64>| 1)
        });
    let r = env.execute("table-sum")?;
    Ok(Run {
        elapsed_s: r.elapsed.as_secs_f64(),
        results: changes.load(Ordering::SeqCst),
        checkpoints: r.checkpoints_completed,
    })
}

/// Keeps a `value_bytes`-long value per key.
struct Fill {
    value_bytes: usize,
    state: Option<ValueState<Vec<u8>>>,
}

impl KeyedProcessFunction<u64, (u64, i64), u64> for Fill {
    fn open(&mut self, state: &mut StateContext<u64>) -> weir::Result<()> {
        self.state = Some(state.value_state("value")?);
        Ok(())
    }
    fn process(
        &mut self,
        (k, v): (u64, i64),
        _ctx: &mut KeyedContext<'_, u64, u64>,
    ) -> weir::Result<()> {
        // Incompressible bytes, so the state's size on disk is about keys × value_bytes.
        let mut x = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut bytes: Vec<u8> = (0..self.value_bytes)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        bytes[..8].copy_from_slice(&v.to_le_bytes());
        self.state.as_mut().expect("opened").set(bytes)
    }
}

fn recovery_env(parallelism: usize, dir: &std::path::Path) -> Env {
    let cfg = weir::RocksDbConfig {
        cache_entries: 100_000,
        ..Default::default()
    };
    Env::new()
        .parallelism(parallelism)
        .state_backend(weir::BackendKind::RocksDb(cfg))
        .checkpoints(CheckpointConfig::new(dir).interval(Duration::ZERO))
}

fn recovery_pipeline(env: &Env, keys: u64, value_bytes: usize) {
    env.generator(keys, keys)
        .uid("generator")
        .key_by(|(k, _)| *k)
        .process(move || Fill {
            value_bytes: value_bytes.max(16),
            state: None,
        })
        .uid("fill")
        .discard();
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            total += if p.is_dir() {
                dir_bytes(&p)
            } else {
                e.metadata().map(|m| m.len()).unwrap_or(0)
            };
        }
    }
    total
}

/// Builds the state and checkpoints it (final checkpoint), then restarts from it.
pub fn recovery(
    keys: u64,
    value_bytes: usize,
    parallelism: usize,
    dir: &std::path::Path,
) -> weir::Result<String> {
    if dir.exists()
        && std::fs::read_dir(dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    {
        return Err(weir::Error::Config(format!(
            "{} is not empty; give the benchmark a new directory",
            dir.display()
        )));
    }
    let env = recovery_env(parallelism, dir);
    recovery_pipeline(&env, keys, value_bytes);
    // One job name for both runs: a job resumes only from its own checkpoints.
    let build = env.execute("recovery")?;
    let checkpoint_bytes = dir_bytes(dir);
    // The second run resumes from the final checkpoint: the generator is exhausted, so the
    // run's duration is the restore (copy from storage, load the key groups) plus start-up.
    let env = recovery_env(parallelism, dir);
    recovery_pipeline(&env, keys, value_bytes);
    let restore = env.execute("recovery")?;
    Ok(serde_json::json!({
        "job": "recovery",
        "keys": keys,
        "value_bytes": value_bytes,
        "parallelism": parallelism,
        "state": "rocksdb",
        "build_elapsed_s": (build.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
        "checkpoint_dir_bytes": checkpoint_bytes,
        "restore_elapsed_s": (restore.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
        "peak_rss_kib": crate::large_state::peak_rss_kib(),
    })
    .to_string())
}
