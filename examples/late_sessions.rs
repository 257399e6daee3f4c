//! late_sessions: event-time session windows over out-of-order and late data, with
//! watermarks after every record, allowed lateness and a late-data side output, into two
//! exactly-once file sinks — checkpointed, and resumable at any parallelism.
//!
//! ```text
//! cargo run --release --example late_sessions -- --input IN --output OUTDIR --checkpoint-dir CKDIR \
//!     [--checkpoint-interval-ms MS] [--parallelism P] [--max-rate RECORDS_PER_S] \
//!     [--max-delay T] [--gap T] [--lateness T] [--state rocksdb|memory] \
//!     [--state-cache-entries N] [--sliding SIZE,SLIDE]
//! ```
//!
//! - IN holds lines `ts,key,value` (ts: the event time, an i64; key: text without commas;
//!   value: an i64), roughly in event-time order.
//! - The file is read by one reader at parallelism 1; the watermark follows every record
//!   (largest timestamp so far - max delay - 1, `--max-delay` default 5).
//! - Records are grouped per key into session windows (`--gap`, default 10); a session
//!   fires when the watermark passes its end, and again for every record that joins it
//!   within the allowed lateness (`--lateness`, default 20). Each firing writes
//!   `key,start,end,count,sum` into OUTDIR/sessions.
//! - Records whose session was already dropped (beyond the allowed lateness) are written
//!   as they came, `ts,key,value`, into OUTDIR/late.
//! - `--parallelism` sets the parallelism of the windows and the sinks; it may change
//!   between runs. Checkpoints go to CKDIR every MS milliseconds (default 1000); started
//!   again with the same CKDIR, the job resumes from the latest complete checkpoint. Killed
//!   at any moment (even with `kill -9`) and resumed, at any parallelism, the committed
//!   files hold exactly what one uninterrupted run writes: the watermark is part of the
//!   checkpoints (docs/checkpoints.md, "Event time").
//! - `--sliding SIZE,SLIDE` uses sliding windows instead of sessions (each record in
//!   SIZE/SLIDE windows; same output lines), `--state-cache-entries N` sets the RocksDB
//!   backend's write-back cache per state table: far smaller than the windows' state, it
//!   keeps window panes and timers in RocksDB rather than in memory.
//! - `--max-rate` throttles the reader, so a kill can land mid-run.
//! - Exits 0 once the input is consumed and the final checkpoint committed everything.

use anyhow::{Context, bail};
use std::path::PathBuf;
use std::time::Duration;
use weir::prelude::*;

struct Args {
    input: PathBuf,
    output: PathBuf,
    checkpoint_dir: PathBuf,
    interval_ms: u64,
    parallelism: usize,
    max_rate: Option<u64>,
    max_delay: Timestamp,
    gap: Timestamp,
    lateness: Timestamp,
    state: BackendKind,
    /// Sliding windows (size, slide) instead of sessions.
    sliding: Option<(Timestamp, Timestamp)>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut input = None;
    let mut output = None;
    let mut checkpoint_dir = None;
    let mut interval_ms = 1000;
    let mut parallelism = 1;
    let mut max_rate = None;
    let (mut max_delay, mut gap, mut lateness) = (5, 10, 20);
    let mut state = BackendKind::parse(if cfg!(feature = "rocksdb") {
        "rocksdb"
    } else {
        "memory"
    })?;
    let mut cache_entries: Option<usize> = None;
    let mut sliding = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--input" => input = Some(PathBuf::from(value()?)),
            "--output" => output = Some(PathBuf::from(value()?)),
            "--checkpoint-dir" => checkpoint_dir = Some(PathBuf::from(value()?)),
            "--checkpoint-interval-ms" => interval_ms = value()?.parse().context(flag)?,
            "--parallelism" => parallelism = value()?.parse().context(flag)?,
            "--max-rate" => max_rate = Some(value()?.parse().context(flag)?),
            "--max-delay" => max_delay = value()?.parse().context(flag)?,
            "--gap" => gap = value()?.parse().context(flag)?,
            "--lateness" => lateness = value()?.parse().context(flag)?,
            "--state" => state = BackendKind::parse(&value()?)?,
            "--state-cache-entries" => cache_entries = Some(value()?.parse().context(flag)?),
            "--sliding" => {
                let v = value()?;
                let (size, slide) = v
                    .split_once(',')
                    .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                    .with_context(|| {
                        format!("--sliding takes SIZE,SLIDE (two integers), got {v:?}")
                    })?;
                if size <= 0 || slide <= 0 {
                    bail!("--sliding {v}: SIZE and SLIDE must be positive");
                }
                sliding = Some((size, slide));
            }
            "-h" | "--help" => {
                println!(
                    "usage: late_sessions --input IN --output OUTDIR --checkpoint-dir CKDIR \
                     [--checkpoint-interval-ms MS] [--parallelism P] [--max-rate RECORDS_PER_S] \
                     [--max-delay T] [--gap T] [--lateness T] [--state rocksdb|memory] \
                     [--state-cache-entries N] [--sliding SIZE,SLIDE]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown flag {other}; see --help"),
        }
    }
    if let Some(n) = cache_entries {
        state = with_cache_entries(state, n)?;
    }
    Ok(Args {
        input: input.context("--input IN is required")?,
        output: output.context("--output OUTDIR is required")?,
        checkpoint_dir: checkpoint_dir.context("--checkpoint-dir CKDIR is required")?,
        interval_ms,
        parallelism,
        max_rate,
        max_delay,
        gap,
        lateness,
        state,
        sliding,
    })
}

/// The backend with a write-back cache of `n` entries per table (RocksDB only).
fn with_cache_entries(state: BackendKind, n: usize) -> anyhow::Result<BackendKind> {
    if n == 0 {
        bail!("--state-cache-entries must be at least 1");
    }
    match state {
        #[cfg(feature = "rocksdb")]
        BackendKind::RocksDb(mut cfg) => {
            cfg.cache_entries = n;
            Ok(BackendKind::RocksDb(cfg))
        }
        other => bail!(
            "--state-cache-entries applies to the rocksdb state backend only, not to `{}`",
            other.name()
        ),
    }
}

/// One input record: (event time, key, value).
type Event = (Timestamp, String, i64);

fn parse_line(line: &str) -> weir::Result<Event> {
    let bad = || Error::Malformed(format!("expected `ts,key,value`, got {line:?}"));
    let mut parts = line.splitn(3, ',');
    let ts = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let key = parts.next().ok_or_else(bad)?.to_string();
    let value = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    Ok((ts, key, value))
}

/// Count and sum of a session's values.
struct CountSum;

impl AggregateFunction<Event, (u64, i64), (u64, i64)> for CountSum {
    fn create(&self) -> (u64, i64) {
        (0, 0)
    }
    fn add(&self, acc: &mut (u64, i64), e: Event) {
        acc.0 += 1;
        acc.1 += e.2;
    }
    fn result(&self, acc: &(u64, i64)) -> (u64, i64) {
        *acc
    }
    fn merge(&self, acc: &mut (u64, i64), other: (u64, i64)) {
        acc.0 += other.0;
        acc.1 += other.1;
    }
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let checkpoints = CheckpointConfig::new(&args.checkpoint_dir)
        .interval(Duration::from_millis(args.interval_ms));
    let env = Env::new()
        .parallelism(args.parallelism)
        .state_backend(args.state.clone())
        .checkpoints(checkpoints);
    let lines = match args.max_rate {
        Some(r) => env.read_text_file_at_rate(&args.input, r),
        None => env.read_text_file(&args.input),
    };
    // One reader, with the watermark generator chained to it: every window subtask reads
    // one channel, where records and watermarks come in the same order in every run.
    let events = lines
        .parallelism(1)
        .uid("file-source")
        .try_map(|line| parse_line(&line))
        .name("parse")
        .parallelism(1)
        .with_watermarks(
            WatermarkStrategy::bounded_out_of_orderness(args.max_delay)
                .with_timestamps(|e: &Event| e.0)
                .with_per_record_watermarks(),
        )
        .parallelism(1)
        .uid("watermarks");
    let late = OutputTag::<Event>::new("late");
    let sessions = events
        .key_by(|e| e.1.clone())
        .window(match args.sliding {
            Some((size, slide)) => WindowAssigner::sliding(size, slide),
            None => WindowAssigner::session(args.gap),
        })
        .allowed_lateness(args.lateness)
        .side_output_late_data(&late)
        .aggregate_with_window(CountSum, |key: &String, w: &TimeWindow, (n, sum)| {
            format!("{key},{},{},{n},{sum}", w.start, w.end)
        })
        .uid("sessions");
    sessions
        .write_text_exactly_once(args.output.join("sessions"), |l| l.clone())
        .uid("sessions-sink");
    sessions
        .side_output(&late)
        .write_text_exactly_once(args.output.join("late"), |(ts, k, v)| {
            format!("{ts},{k},{v}")
        })
        .uid("late-sink");
    let result = env
        .execute("late_sessions")
        .context("late_sessions failed")?;
    tracing::info!(
        lines = result.records_read(),
        "done, {} lines read in {:.2}s",
        result.records_read(),
        result.elapsed.as_secs_f64()
    );
    Ok(())
}
