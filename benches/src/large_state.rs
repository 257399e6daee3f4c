//! Keyed state far larger than memory: keyed-sum over `--keys` keys whose state is a
//! `--value-bytes` value (the running sum in its first 8 bytes) on RocksDB under one
//! memory budget, and a sliding-window count (1 h windows sliding by 1 min of event time).
//! Each prints one JSON line with records/s, checkpoint duration p50/p99 (from the REST
//! API's checkpoint history, polled during the run), the process's peak RSS (VmHWM) and
//! the size of the state on disk, and where the memory was at that peak (`memory_at_peak`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir::prelude::*;
use weir_bench::Counting;

#[derive(clap::Args, Debug, Clone)]
pub struct LargeStateArgs {
    /// Distinct keys.
    #[arg(long, default_value_t = 20_000_000)]
    pub keys: u64,
    /// Events (key `i % keys`); default twice the keys: every key written, then read back.
    #[arg(long)]
    pub events: Option<u64>,
    /// Bytes of state per key.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Parallelism of every operator.
    #[arg(long, default_value_t = 1)]
    pub parallelism: usize,
    /// The RocksDB memory budget of the job in MiB (split over its slots).
    #[arg(long, default_value_t = 512)]
    pub budget_mib: usize,
    /// Checkpoint interval in milliseconds (0 = no checkpoints).
    #[arg(long, default_value_t = 1000)]
    pub checkpoint_interval_ms: u64,
    /// Working directory: checkpoints and RocksDB's local files (must be new or empty).
    #[arg(long)]
    pub dir: std::path::PathBuf,
    /// RocksDB's partitioned index and filter blocks
    /// (`RocksDbConfig::partitioned_index_filters`).
    #[arg(long)]
    pub partitioned_index_filters: bool,
}

/// The peak resident set of this process (VmHWM), in KiB.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// CPU time this process has used so far (user + system, all threads), in seconds: on a
/// machine shared with other work it says what the job cost where events/s says how fast
/// the share it got let it go.
pub fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    // utime and stime are fields 14 and 15, in USER_HZ (100 on Linux) ticks.
    Some((ticks(11)? + ticks(12)?) as f64 / 100.0)
}

/// The process's resident set now (VmRSS), in bytes.
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Where the memory was when the resident set was at its highest, sampled every 50 ms:
/// RocksDB's own counters summed over the slots (block cache with the memtables reserved
/// in it, pinned blocks, memtables) and, with the `jemalloc-stats` feature, the
/// allocator's live (`allocated`) and resident bytes. What RSS holds beyond the cache and
/// the write-back caches is the overhead a memory budget cannot bound.
#[derive(Default, Clone, Copy)]
struct MemorySample {
    rss: u64,
    budget: usize,
    cache: usize,
    pinned: usize,
    memtables: usize,
    heap: Option<HeapStats>,
}

/// jemalloc's counters: live bytes, bytes in pages holding them, bytes resident (free
/// pages not yet returned included) and its own metadata.
#[derive(Clone, Copy)]
struct HeapStats {
    allocated: usize,
    active: usize,
    resident: usize,
    metadata: usize,
}

impl MemorySample {
    fn take() -> Option<MemorySample> {
        let rss = rss_bytes()?;
        let slots = weir_state::rocksdb_memory();
        Some(MemorySample {
            rss,
            budget: slots.iter().map(|s| s.plan.slot_bytes).sum(),
            cache: slots.iter().map(|s| s.cache_bytes).sum(),
            pinned: slots.iter().map(|s| s.pinned_bytes).sum(),
            memtables: slots.iter().map(|s| s.memtable_bytes).sum(),
            heap: jemalloc_stats(),
        })
    }

    fn json(&self) -> serde_json::Value {
        let mib = |b: usize| ((b as f64 / (1 << 20) as f64) * 10.0).round() / 10.0;
        serde_json::json!({
            "rss_mib": mib(self.rss as usize),
            "slot_budgets_mib": mib(self.budget),
            "block_cache_mib": mib(self.cache),
            "pinned_mib": mib(self.pinned),
            "memtables_mib": mib(self.memtables),
            "heap_allocated_mib": self.heap.map(|h| mib(h.allocated)),
            "heap_active_mib": self.heap.map(|h| mib(h.active)),
            "heap_resident_mib": self.heap.map(|h| mib(h.resident)),
            "heap_metadata_mib": self.heap.map(|h| mib(h.metadata)),
        })
    }
}

/// jemalloc's counters, refreshed.
#[cfg(feature = "jemalloc-stats")]
fn jemalloc_stats() -> Option<HeapStats> {
    use tikv_jemalloc_ctl::{epoch, stats};
    epoch::advance().ok()?;
    Some(HeapStats {
        allocated: stats::allocated::read().ok()?,
        active: stats::active::read().ok()?,
        resident: stats::resident::read().ok()?,
        metadata: stats::metadata::read().ok()?,
    })
}

#[cfg(not(feature = "jemalloc-stats"))]
fn jemalloc_stats() -> Option<HeapStats> {
    None
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

fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[i])
}

/// Keyed-sum with a wide value: the running sum lives in the first 8 bytes of a
/// `len`-byte value; every 1000th record a subtask processes emits `(key, sum)`.
struct WideSum {
    len: usize,
    seen: u64,
    state: Option<ValueState<Vec<u8>>>,
}

impl KeyedProcessFunction<u64, (u64, i64), (u64, i64)> for WideSum {
    fn open(&mut self, state: &mut StateContext<u64>) -> weir::Result<()> {
        self.state = Some(state.value_state("sum")?);
        Ok(())
    }
    fn process(
        &mut self,
        (k, v): (u64, i64),
        ctx: &mut KeyedContext<'_, u64, (u64, i64)>,
    ) -> weir::Result<()> {
        let state = self.state.as_mut().expect("opened");
        let mut value = state.get()?.unwrap_or_else(|| {
            let mut x = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            (0..self.len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        });
        let sum = i64::from_le_bytes(value[..8].try_into().expect("8 bytes")).wrapping_add(v);
        value[..8].copy_from_slice(&sum.to_le_bytes());
        state.set(value)?;
        self.seen += 1;
        if self.seen.is_multiple_of(1000) {
            ctx.emit((k, sum));
        }
        Ok(())
    }
}

fn env(a: &LargeStateArgs) -> anyhow::Result<Env> {
    if std::fs::read_dir(&a.dir).is_ok_and(|mut d| d.next().is_some()) {
        anyhow::bail!(
            "{} is not empty; give the benchmark a new directory",
            a.dir.display()
        );
    }
    let cfg = weir::RocksDbConfig {
        local_dir: a.dir.join("local"),
        memory_budget_bytes: a.budget_mib << 20,
        partitioned_index_filters: a.partitioned_index_filters,
        ..weir::RocksDbConfig::default()
    };
    let mut env = Env::new()
        .parallelism(a.parallelism)
        .state_backend(weir::BackendKind::RocksDb(cfg))
        .web_address("127.0.0.1:0");
    if a.checkpoint_interval_ms > 0 {
        env = env.checkpoints(
            CheckpointConfig::new(a.dir.join("checkpoints"))
                .interval(Duration::from_millis(a.checkpoint_interval_ms)),
        );
    }
    Ok(env)
}

/// Runs the job, polling its checkpoint history; returns the JSON line.
fn run(
    name: &str,
    a: &LargeStateArgs,
    events: u64,
    env: Env,
    results: Arc<AtomicU64>,
) -> anyhow::Result<String> {
    let cpu_start = cpu_seconds();
    let handle = env.execute_async(name)?;
    let addr = handle.web_address();
    let durations = Arc::new(Mutex::new(BTreeMap::<u64, u64>::new()));
    let done = Arc::new(AtomicBool::new(false));
    // The instances remove their files when the job ends: measured while it runs.
    let state_bytes = Arc::new(AtomicU64::new(0));
    let at_peak = Arc::new(Mutex::new(MemorySample::default()));
    let sampler = {
        let (at_peak, done) = (at_peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                if let Some(s) = MemorySample::take() {
                    let mut peak = at_peak.lock().unwrap();
                    if s.rss > peak.rss {
                        *peak = s;
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let poller = {
        let (durations, done, state) = (durations.clone(), done.clone(), state_bytes.clone());
        let local = a.dir.join("local");
        std::thread::spawn(move || {
            let mut polls = 0u64;
            while let Some(addr) = addr.filter(|_| !done.load(Ordering::SeqCst)) {
                if polls.is_multiple_of(5) {
                    state.fetch_max(dir_bytes(&local), Ordering::SeqCst);
                }
                polls += 1;
                if let Ok(v) = get(addr, "/v1/checkpoints") {
                    for c in v["history"].as_array().into_iter().flatten() {
                        if c["status"] == "COMPLETED"
                            && let (Some(id), Some(ms)) =
                                (c["id"].as_u64(), c["duration_ms"].as_u64())
                        {
                            durations.lock().unwrap().insert(id, ms);
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    let r = handle.join();
    done.store(true, Ordering::SeqCst);
    let _ = poller.join();
    let _ = sampler.join();
    let r = r?;
    let mut d: Vec<u64> = durations.lock().unwrap().values().copied().collect();
    d.sort_unstable();
    let elapsed = r.elapsed.as_secs_f64();
    let line = serde_json::json!({
        "job": name,
        "events": events,
        "keys": a.keys,
        "value_bytes": a.value_bytes,
        "parallelism": a.parallelism,
        "state": "rocksdb",
        "memory_budget_mib": a.budget_mib,
        "partitioned_index_filters": a.partitioned_index_filters,
        "checkpoint_interval_ms": a.checkpoint_interval_ms,
        "elapsed_s": (elapsed * 1000.0).round() / 1000.0,
        "events_per_sec": (events as f64 / elapsed).round() as u64,
        "checkpoints_completed": r.checkpoints_completed,
        "checkpoint_p50_ms": quantile(&d, 0.5),
        "checkpoint_p99_ms": quantile(&d, 0.99),
        "cpu_s": cpu_seconds()
            .zip(cpu_start)
            .map(|(end, start)| ((end - start) * 10.0).round() / 10.0),
        "peak_rss_kib": peak_rss_kib(),
        "allocator": crate::ALLOCATOR_NAME,
        "memory_at_peak": at_peak.lock().unwrap().json(),
        "state_dir_bytes": state_bytes.load(Ordering::SeqCst),
        "checkpoint_dir_bytes": dir_bytes(&a.dir.join("checkpoints")),
        "results": results.load(Ordering::SeqCst),
    });
    Ok(line.to_string())
}

/// keyed-sum with `--value-bytes` of state per key.
pub fn keyed_sum(a: &LargeStateArgs) -> anyhow::Result<String> {
    let events = a.events.unwrap_or(2 * a.keys);
    let env = env(a)?;
    let emitted = Arc::new(AtomicU64::new(0));
    let counter = emitted.clone();
    let len = a.value_bytes.max(8);
    env.generator(events, a.keys)
        .key_by(|(k, _)| *k)
        .process(move || WideSum {
            len,
            seen: 0,
            state: None,
        })
        .sink("count", move || {
            Counting::new(counter.clone(), |_: &(u64, i64)| 1)
        });
    run("keyed-sum-large", a, events, env, emitted)
}

/// Event time per event: 1,000,000 events per minute of event time, so each of 1M keys
/// is seen about once a minute.
const EVENT_TIME_NUM: i64 = 60_000;
const EVENT_TIME_DEN: i64 = 1_000_000;

/// generator → event time `i × 60000 / 1000000` ms → key_by → sliding windows of 1 h
/// sliding by 1 min → count per key per window → summing sink (each event counted once
/// per window it falls in).
pub fn sliding_window(a: &LargeStateArgs) -> anyhow::Result<String> {
    let events = a.events.unwrap_or(10 * a.keys);
    let env = env(a)?;
    let total = Arc::new(AtomicU64::new(0));
    let counter = total.clone();
    env.generator(events, a.keys)
        .with_watermarks(
            WatermarkStrategy::bounded_out_of_orderness(100)
                .with_timestamps(|(_, v): &(u64, i64)| *v * EVENT_TIME_NUM / EVENT_TIME_DEN)
                .with_emit_interval(Duration::from_millis(20)),
        )
        .key_by(|(k, _)| *k)
        .window(WindowAssigner::sliding(3_600_000, 60_000))
        .aggregate(Count)
        .sink("sum-counts", move || {
            Counting::new(counter.clone(), |c: &u64| *c)
        });
    run("sliding-window-count", a, events, env, total)
}
