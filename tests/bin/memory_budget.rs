//! A job whose RocksDB state is far larger than its memory budget, for the memory test.
//! Prints what it verified, the state's logical size and its own peak RSS.
//!
//! - `--job keyed` (the default): every key gets a value of `--value-bytes` bytes in a
//!   value state, then every key is read back and checked.
//! - `--job windows`: event-time windows of 2 h sliding by 1 h, every event at time 0, so
//!   each key has two open windows (panes in RocksDB, with their timers) until the input
//!   ends. A window's accumulator is the key's `--value-bytes` bytes, stored by the key's
//!   first event and checked by its second; every window fires at the end with its count.
//!
//! `memory_budget --keys N --value-bytes B --budget-mib M --checkpoint-dir DIR
//!  [--job keyed|windows] [--parallelism P] [--checkpoint-interval-ms MS]`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use weir::prelude::*;

/// The value of key `k`: `len` incompressible bytes.
fn value_of(k: u64, len: usize) -> Vec<u8> {
    let mut x = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// First sight of a key stores its value; the second checks it and emits the key.
struct FillThenCheck {
    len: usize,
    state: Option<ValueState<Vec<u8>>>,
}

impl KeyedProcessFunction<u64, (u64, i64), u64> for FillThenCheck {
    fn open(&mut self, state: &mut StateContext<u64>) -> weir::Result<()> {
        self.state = Some(state.value_state("value")?);
        Ok(())
    }
    fn process(
        &mut self,
        (k, _): (u64, i64),
        ctx: &mut KeyedContext<'_, u64, u64>,
    ) -> weir::Result<()> {
        let state = self.state.as_mut().expect("opened");
        match state.get()? {
            None => state.set(value_of(k, self.len)),
            Some(v) if v == value_of(k, self.len) => {
                ctx.emit(k);
                Ok(())
            }
            Some(v) => Err(weir::Error::User(format!(
                "key {k} read back {} bytes that differ from what was stored",
                v.len()
            ))),
        }
    }
}

/// A window's accumulator: the events it counted, the key's bytes as its first event
/// stored them, and whether a later event found them changed.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
struct Blob {
    events: u32,
    bytes: Vec<u8>,
    differs: bool,
}

struct StoreThenCheck(usize);

impl AggregateFunction<(u64, i64), Blob, Blob> for StoreThenCheck {
    fn create(&self) -> Blob {
        Blob::default()
    }
    fn add(&self, acc: &mut Blob, (k, _): (u64, i64)) {
        let expected = value_of(k, self.0);
        if acc.events == 0 {
            acc.bytes = expected;
        } else if acc.bytes != expected {
            acc.differs = true;
        }
        acc.events += 1;
    }
    fn result(&self, acc: &Blob) -> Blob {
        acc.clone()
    }
    fn merge(&self, acc: &mut Blob, other: Blob) {
        acc.differs |= other.differs || (acc.events > 0 && acc.bytes != other.bytes);
        acc.events += other.events;
    }
}

struct Count(u64, Arc<AtomicU64>);

impl SinkFunction<u64> for Count {
    fn invoke(&mut self, _: u64, _ts: Timestamp) -> weir::Result<()> {
        self.0 += 1;
        Ok(())
    }
    fn finish(&mut self) -> weir::Result<()> {
        self.1.fetch_add(self.0, Ordering::SeqCst);
        Ok(())
    }
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn main() -> anyhow::Result<()> {
    let mut keys = 0u64;
    let mut len = 100usize;
    let mut budget_mib = 0usize;
    let mut parallelism = 1usize;
    let mut interval_ms = 1000u64;
    let mut dir = None;
    let mut job = String::from("keyed");
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| anyhow::anyhow!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--keys" => keys = value()?.parse()?,
            "--value-bytes" => len = value()?.parse()?,
            "--budget-mib" => budget_mib = value()?.parse()?,
            "--parallelism" => parallelism = value()?.parse()?,
            "--checkpoint-interval-ms" => interval_ms = value()?.parse()?,
            "--checkpoint-dir" => dir = Some(std::path::PathBuf::from(value()?)),
            "--job" => job = value()?,
            other => anyhow::bail!("unknown flag {other}"),
        }
    }
    let dir = dir.ok_or_else(|| anyhow::anyhow!("--checkpoint-dir is required"))?;
    let cfg = weir::RocksDbConfig {
        local_dir: dir.join("local"),
        memory_budget_bytes: budget_mib << 20,
        ..weir::RocksDbConfig::default()
    };
    let env = Env::new()
        .parallelism(parallelism)
        .state_backend(weir::BackendKind::RocksDb(cfg))
        .checkpoints(
            CheckpointConfig::new(dir.join("checkpoints"))
                .interval(Duration::from_millis(interval_ms)),
        );
    let verified = Arc::new(AtomicU64::new(0));
    let total = verified.clone();
    // Event i has key i % keys: every key is seen twice, a whole pass apart.
    let events = env.generator(2 * keys, keys);
    let (what, expected, logical) = match job.as_str() {
        "keyed" => {
            events
                .key_by(|(k, _)| *k)
                .process(move || FillThenCheck { len, state: None })
                .sink("count", move || Count(0, total.clone()));
            ("keys", keys, keys * (len as u64 + 8))
        }
        "windows" => {
            events
                .with_watermarks(
                    WatermarkStrategy::bounded_out_of_orderness(0)
                        .with_timestamps(|_: &(u64, i64)| 0),
                )
                .key_by(|(k, _)| *k)
                .window(WindowAssigner::sliding(2 * 3_600_000, 3_600_000))
                .aggregate_with_window(StoreThenCheck(len), move |k, _w, b: Blob| {
                    // A window is verified when it saw the key's two events and its bytes
                    // came back from RocksDB as stored.
                    (b.events == 2 && !b.differs && b.bytes == value_of(*k, len)).then_some(*k)
                })
                .flat_map(|k: Option<u64>| k)
                .sink("count", move || Count(0, total.clone()));
            // Two windows per key, each holding the key's bytes.
            ("windows", 2 * keys, 2 * keys * (len as u64 + 8))
        }
        other => anyhow::bail!("unknown job {other}: keyed or windows"),
    };
    let run = env.execute("memory-budget")?;
    println!(
        "verified {} of {expected} {what}",
        verified.load(Ordering::SeqCst)
    );
    println!("logical state {logical} bytes");
    println!("checkpoints {}", run.checkpoints_completed);
    println!("peak RSS {} KiB", peak_rss_kib());
    Ok(())
}
