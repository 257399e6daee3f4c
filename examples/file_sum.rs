//! file_sum: running sums per key from a text file into an exactly-once file sink, with
//! checkpoints and automatic resume.
//!
//! ```text
//! cargo run --release --example file_sum -- --input IN --output OUTDIR --checkpoint-dir CKDIR \
//!     [--checkpoint-interval-ms MS] [--parallelism P] [--max-rate RECORDS_PER_S]
//! ```
//!
//! - IN holds lines `key,value` (key: text without commas, value: an i64).
//! - For every input line the job emits `key,sum` — the key's running sum after that line —
//!   into the exactly-once file sink in OUTDIR. Committed files are `part-<subtask>-<checkpoint>`;
//!   files starting with a dot are not committed yet and must be ignored by readers.
//! - Checkpoints go to CKDIR every MS milliseconds (default 1000). Started again with the same
//!   CKDIR, the job resumes from the latest complete checkpoint; kill it at any moment
//!   (even with `kill -9`) and the committed output still holds every running sum exactly once.
//! - `--parallelism` sets the parallelism of the keyed sum and the sink (the file is read by
//!   one reader so each key's lines stay in file order); it may change between runs.
//! - `--max-rate` throttles the reader, so a kill can land mid-run.
//! - `--state rocksdb|memory` picks the keyed state backend. The default is rocksdb (files
//!   checkpointed incrementally) when the example is built with `--features rocksdb`, and
//!   memory otherwise (the quickstart's crate builds without RocksDB by default).
//! - `--from-savepoint PATH` starts from a savepoint (or a specific checkpoint) instead of
//!   the latest checkpoint in CKDIR. Take a savepoint of a running job with
//!   `weir savepoint trigger CKDIR`, or stop it with one with `weir savepoint stop CKDIR`
//!   (the job then exits 0 and prints the savepoint's path).
//! - Exits 0 once the input is consumed and the final checkpoint has committed everything;
//!   a malformed line fails the job with the line's content and number.

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
    from_savepoint: Option<PathBuf>,
    state: BackendKind,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut input = None;
    let mut output = None;
    let mut checkpoint_dir = None;
    let mut interval_ms = 1000;
    let mut parallelism = 1;
    let mut max_rate = None;
    let mut from_savepoint = None;
    // RocksDB when this example is built with the `rocksdb` feature, the heap otherwise.
    let mut state = BackendKind::parse(if cfg!(feature = "rocksdb") {
        "rocksdb"
    } else {
        "memory"
    })?;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--input" => input = Some(PathBuf::from(value()?)),
            "--output" => output = Some(PathBuf::from(value()?)),
            "--checkpoint-dir" => checkpoint_dir = Some(PathBuf::from(value()?)),
            "--checkpoint-interval-ms" => {
                interval_ms = value()?.parse().context("--checkpoint-interval-ms")?
            }
            "--parallelism" => parallelism = value()?.parse().context("--parallelism")?,
            "--max-rate" => max_rate = Some(value()?.parse().context("--max-rate")?),
            "--from-savepoint" => from_savepoint = Some(PathBuf::from(value()?)),
            "--state" => state = BackendKind::parse(&value()?)?,
            "-h" | "--help" => {
                println!(
                    "usage: file_sum --input IN --output OUTDIR --checkpoint-dir CKDIR \
                     [--checkpoint-interval-ms MS] [--parallelism P] [--max-rate RECORDS_PER_S] \
                     [--from-savepoint PATH] [--state rocksdb|memory]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown flag {other}; see --help"),
        }
    }
    Ok(Args {
        input: input.context("--input IN is required")?,
        output: output.context("--output OUTDIR is required")?,
        checkpoint_dir: checkpoint_dir.context("--checkpoint-dir CKDIR is required")?,
        interval_ms,
        parallelism,
        max_rate,
        from_savepoint,
        state,
    })
}

/// Keeps a running sum per key and emits it after every record.
#[derive(Default)]
struct RunningSum {
    sum: Option<ValueState<i64>>,
}

impl KeyedProcessFunction<String, (String, i64), (String, i64)> for RunningSum {
    fn open(&mut self, state: &mut StateContext<String>) -> weir::Result<()> {
        self.sum = Some(state.value_state("sum")?);
        Ok(())
    }
    fn process(
        &mut self,
        (key, value): (String, i64),
        ctx: &mut KeyedContext<'_, String, (String, i64)>,
    ) -> weir::Result<()> {
        let sum = self.sum.as_mut().expect("opened");
        let next = sum
            .get()?
            .unwrap_or(0)
            .checked_add(value)
            .ok_or_else(|| Error::user(format!("sum of key '{key}' overflows i64")))?;
        sum.set(next)?;
        ctx.emit((key, next));
        Ok(())
    }
}

fn parse_line(line: &str) -> weir::Result<(String, i64)> {
    let (key, value) = line
        .split_once(',')
        .ok_or_else(|| Error::Malformed(format!("expected `key,value`, got {line:?}")))?;
    let value = value
        .trim()
        .parse::<i64>()
        .map_err(|e| Error::Malformed(format!("value of {line:?} is not an i64: {e}")))?;
    Ok((key.to_string(), value))
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let mut checkpoints = CheckpointConfig::new(&args.checkpoint_dir)
        .interval(Duration::from_millis(args.interval_ms));
    checkpoints.restore_from = args.from_savepoint.clone();
    let env = Env::new()
        .parallelism(args.parallelism)
        .state_backend(args.state.clone())
        .checkpoints(checkpoints);
    let lines = match args.max_rate {
        Some(r) => env.read_text_file_at_rate(&args.input, r),
        None => env.read_text_file(&args.input),
    };
    lines
        .parallelism(1)
        .uid("file-source")
        .try_map(|line| parse_line(&line))
        .name("parse")
        .parallelism(1)
        .key_by(|(k, _)| k.clone())
        .process(RunningSum::default)
        .name("running-sum")
        .uid("running-sum")
        .write_text_exactly_once(&args.output, |(k, s)| format!("{k},{s}"))
        .uid("sink");
    let result = env.execute("file_sum").context("file_sum failed")?;
    if result.stopped_with_savepoint {
        let path = result
            .savepoints
            .last()
            .context("stopped without a savepoint path")?;
        println!("stopped with savepoint {}", path.display());
        return Ok(());
    }
    eprintln!(
        "file_sum: done, {} lines read in {:.2}s",
        result.records_read(),
        result.elapsed.as_secs_f64()
    );
    Ok(())
}
