//! joins: an interval join or a temporal join over one input file of two interleaved
//! streams, into an exactly-once file sink — checkpointed, and resumable at any parallelism.
//!
//! ```text
//! cargo run --release --example joins -- --join interval|temporal --input IN --output OUTDIR \
//!     --checkpoint-dir CKDIR [--checkpoint-interval-ms MS] [--parallelism P] \
//!     [--max-rate RECORDS_PER_S] [--max-delay T] [--lower T] [--upper T] [--state rocksdb|memory]
//! ```
//!
//! - IN holds lines `side,ts,key,value`: side `L` (a record of the left stream), `R` (a
//!   record of the right stream; for the temporal join, the row `key` now holds `value`) or
//!   `D` (temporal join: the row `key` is deleted; the value is ignored); ts is the event time
//!   (an i64), key a text without commas, value an i64. Lines come roughly in event-time
//!   order.
//! - The file is read by one reader at parallelism 1; the watermark follows every record
//!   (largest timestamp so far - max delay - 1, `--max-delay` default 5); lines further out
//!   of order than that are late and take no part in the join.
//! - `--join interval` pairs each left record at `t` with the right records of its key at
//!   times in `[t + lower, t + upper]` (`--lower` default -5, `--upper` default 10), writing
//!   `key,left_ts,left_value,right_ts,right_value` per pair into OUTDIR/pairs.
//! - `--join temporal` joins each left record at `t` with the row's value valid at `t` (the
//!   newest `R` or `D` line of its key at or before `t`), writing `key,ts,value,row` per
//!   left record into OUTDIR/joined, where row is the row's value or `-` when there was no
//!   row.
//! - `--parallelism` sets the parallelism of the join and the sink; it may change between
//!   runs. Checkpoints go to CKDIR every MS milliseconds (default 1000); started again with
//!   the same CKDIR, the job resumes from the latest complete checkpoint. Killed at any
//!   moment (even with `kill -9`) and resumed, at any parallelism, the committed files hold
//!   exactly what one uninterrupted run writes.
//! - `--max-rate` throttles the reader, so a kill can land mid-run. `--state` picks the
//!   state backend (default rocksdb when built with the `rocksdb` feature, else memory).
//! - Exits 0 once the input is consumed and the final checkpoint committed everything.

use anyhow::{Context, bail};
use std::path::PathBuf;
use std::time::Duration;
use weir::prelude::*;

struct Args {
    join: String,
    input: PathBuf,
    output: PathBuf,
    checkpoint_dir: PathBuf,
    interval_ms: u64,
    parallelism: usize,
    max_rate: Option<u64>,
    max_delay: Timestamp,
    lower: Timestamp,
    upper: Timestamp,
    state: BackendKind,
}

const USAGE: &str = "usage: joins --join interval|temporal --input IN --output OUTDIR \
     --checkpoint-dir CKDIR [--checkpoint-interval-ms MS] [--parallelism P] \
     [--max-rate RECORDS_PER_S] [--max-delay T] [--lower T] [--upper T] [--state rocksdb|memory]";

fn parse_args() -> anyhow::Result<Args> {
    let mut join = None;
    let mut input = None;
    let mut output = None;
    let mut checkpoint_dir = None;
    let mut interval_ms = 1000;
    let mut parallelism = 1;
    let mut max_rate = None;
    let (mut max_delay, mut lower, mut upper) = (5, -5, 10);
    let mut state = BackendKind::parse(if cfg!(feature = "rocksdb") {
        "rocksdb"
    } else {
        "memory"
    })?;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--join" => join = Some(value()?),
            "--input" => input = Some(PathBuf::from(value()?)),
            "--output" => output = Some(PathBuf::from(value()?)),
            "--checkpoint-dir" => checkpoint_dir = Some(PathBuf::from(value()?)),
            "--checkpoint-interval-ms" => interval_ms = value()?.parse().context(flag)?,
            "--parallelism" => parallelism = value()?.parse().context(flag)?,
            "--max-rate" => max_rate = Some(value()?.parse().context(flag)?),
            "--max-delay" => max_delay = value()?.parse().context(flag)?,
            "--lower" => lower = value()?.parse().context(flag)?,
            "--upper" => upper = value()?.parse().context(flag)?,
            "--state" => state = BackendKind::parse(&value()?)?,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown flag {other}; see --help"),
        }
    }
    let join = join.context("--join interval|temporal is required")?;
    if join != "interval" && join != "temporal" {
        bail!("--join must be interval or temporal, not {join:?}");
    }
    if lower > upper {
        bail!("--lower {lower} is above --upper {upper}: the interval would be empty");
    }
    Ok(Args {
        join,
        input: input.context("--input IN is required")?,
        output: output.context("--output OUTDIR is required")?,
        checkpoint_dir: checkpoint_dir.context("--checkpoint-dir CKDIR is required")?,
        interval_ms,
        parallelism,
        max_rate,
        max_delay,
        lower,
        upper,
        state,
    })
}

/// One input line: (side, event time, key, value).
type Line = (char, Timestamp, String, i64);

fn parse_line(line: &str) -> weir::Result<Line> {
    let bad = || Error::Malformed(format!("expected `L|R|D,ts,key,value`, got {line:?}"));
    let mut parts = line.splitn(4, ',');
    let side = match parts.next() {
        Some("L") => 'L',
        Some("R") => 'R',
        Some("D") => 'D',
        _ => return Err(bad()),
    };
    let ts = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let key = parts.next().ok_or_else(bad)?.to_string();
    let value = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    Ok((side, ts, key, value))
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
    // One reader with the watermark generator chained to it: both sides of the join see
    // the records and watermarks of one channel, in file order.
    let events = lines
        .parallelism(1)
        .uid("file-source")
        .try_map(|line| parse_line(&line))
        .name("parse")
        .parallelism(1)
        .with_watermarks(
            WatermarkStrategy::bounded_out_of_orderness(args.max_delay)
                .with_timestamps(|l: &Line| l.1)
                .with_per_record_watermarks(),
        )
        .parallelism(1)
        .uid("watermarks");
    let left = events
        .filter(|l| l.0 == 'L')
        .parallelism(1)
        .map(|l| (l.2, l.1, l.3))
        .parallelism(1);
    let right = events.filter(|l| l.0 != 'L').parallelism(1);
    let (dir, lines) = if args.join == "interval" {
        let pairs = left
            .key_by(|l| l.0.clone())
            .interval_join(&right.key_by(|r| r.2.clone()))
            .between(args.lower, args.upper)
            .process(|| Pairs)
            .uid("interval-join");
        ("pairs", pairs)
    } else {
        let changes = right.map(|r| match r.0 {
            'D' => Change::Delete { key: r.2, old: r.3 },
            _ => Change::Insert {
                key: r.2,
                value: r.3,
            },
        });
        let joined = left
            .key_by(|l| l.0.clone())
            .temporal_join(&changes.key_by(|c| c.key().clone()))
            .apply(|(key, ts, value), row: Option<&i64>| {
                let row = row.map_or("-".to_string(), |r| r.to_string());
                format!("{key},{ts},{value},{row}")
            })
            .uid("temporal-join");
        ("joined", joined)
    };
    lines
        .write_text_exactly_once(args.output.join(dir), |l| l.clone())
        .uid("sink");
    let result = env.execute("joins").context("joins failed")?;
    tracing::info!(
        lines = result.records_read(),
        "done, {} lines read in {:.2}s",
        result.records_read(),
        result.elapsed.as_secs_f64()
    );
    Ok(())
}

/// Formats an interval join's pair with both records' times.
struct Pairs;

impl ProcessJoinFunction<(String, Timestamp, i64), Line, String> for Pairs {
    fn process_element(
        &mut self,
        left: (String, Timestamp, i64),
        right: Line,
        ctx: &mut JoinContext<'_, String>,
    ) -> weir::Result<()> {
        let line = format!(
            "{},{},{},{},{}",
            left.0,
            ctx.left_timestamp(),
            left.2,
            ctx.right_timestamp(),
            right.3
        );
        ctx.emit(line);
        Ok(())
    }
}
