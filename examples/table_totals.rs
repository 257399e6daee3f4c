//! table_totals: the balance of every region, kept as a table from a file of account
//! upserts and deletes, written as a changelog into an exactly-once file sink.
//!
//! ```text
//! cargo run --release --example table_totals -- --input IN --output OUTDIR --checkpoint-dir CKDIR \
//!     [--checkpoint-interval-ms MS] [--parallelism P] [--max-rate LINES_PER_S] [--state memory|rocksdb]
//! ```
//!
//! - IN holds one change of an account per line: `upsert,<account>,<region>,<amount>` sets
//!   the account's row (its region and an i64 amount; an account may move to another
//!   region), `delete,<account>` removes it. Accounts and regions are text without commas.
//! - The accounts are a table (`Table::from_upserts`); their amounts are summed per region
//!   (`group_by(..).sum_by(..)`), with retractions: an account that changes its amount or
//!   moves to another region leaves its old region's total and joins the new one's.
//! - Every change of a region's total goes to OUTDIR as one line: `insert,<region>,<total>`
//!   when the region gets its first account, `update,<region>,<old>,<new>` when its total
//!   changes, `delete,<region>,<old>` when its last account goes. Committed files are
//!   `part-<subtask>-<checkpoint>`; files starting with a dot are not committed yet and
//!   must be ignored by readers.
//! - Checkpoints go to CKDIR every MS milliseconds (default 1000). Started again with the
//!   same CKDIR, the job resumes from the latest complete checkpoint; killed at any moment
//!   (even with `kill -9`), the committed output still holds every change exactly once.
//! - `--parallelism` (default 1) sets the parallelism of the table, the totals and the
//!   sink; the file is read by one reader, so each account's lines stay in file order. At
//!   parallelism 1 the output is one sequence, the same in every run; above it, a region's
//!   changes may interleave its accounts' updates in another order, but each change starts
//!   from the total the previous one left, and the last total is the same.
//! - `--max-rate` throttles the reader, so a kill can land mid-run.
//! - `--state rocksdb|memory` picks the keyed state backend (default: rocksdb when built
//!   with `--features rocksdb`, memory otherwise).
//! - Exits 0 once the input is consumed and the final checkpoint has committed everything;
//!   a malformed line fails the job, quoting the line.

use anyhow::Context;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;
use weir::prelude::*;

/// Region totals of account upserts and deletes, as an exactly-once changelog.
#[derive(Parser)]
#[command(name = "table_totals")]
struct Args {
    /// Input file: `upsert,<account>,<region>,<amount>` or `delete,<account>` per line.
    #[arg(long)]
    input: PathBuf,
    /// Output directory of the exactly-once file sink.
    #[arg(long)]
    output: PathBuf,
    /// Checkpoint directory; a run resumes from its latest complete checkpoint.
    #[arg(long)]
    checkpoint_dir: PathBuf,
    /// Milliseconds between checkpoints.
    #[arg(long, default_value_t = 1000)]
    checkpoint_interval_ms: u64,
    /// Parallelism of the table, the totals and the sink.
    #[arg(long, default_value_t = 1)]
    parallelism: usize,
    /// Lines read per second at most.
    #[arg(long)]
    max_rate: Option<u64>,
    /// Keyed state backend: `memory` or `rocksdb`.
    #[arg(long, default_value = if cfg!(feature = "rocksdb") { "rocksdb" } else { "memory" })]
    state: String,
}

/// An account's row: (region, amount).
type Row = (String, i64);

/// One input line as an upsert: `(account, Some(row))` or `(account, None)`.
fn parse_line(line: &str) -> weir::Result<(String, Option<Row>)> {
    let bad = |why: &str| {
        Error::Malformed(format!(
            "{why} in line {line:?}; expected `upsert,<account>,<region>,<amount>` or \
             `delete,<account>`"
        ))
    };
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    match fields.as_slice() {
        ["upsert", account, region, amount] if !account.is_empty() && !region.is_empty() => {
            let amount = amount
                .parse::<i64>()
                .map_err(|e| bad(&format!("amount {amount:?} is not an i64 ({e})")))?;
            Ok((account.to_string(), Some((region.to_string(), amount))))
        }
        ["delete", account] if !account.is_empty() => Ok((account.to_string(), None)),
        [op, ..] if !matches!(*op, "upsert" | "delete") => {
            Err(bad(&format!("unknown operation {op:?}")))
        }
        _ => Err(bad("wrong number of fields or an empty name")),
    }
}

/// One output line for a change of a region's total.
fn format_change(change: &Change<String, i64>) -> String {
    match change {
        Change::Insert { key, value } => format!("insert,{key},{value}"),
        Change::Update { key, old, new } => format!("update,{key},{old},{new}"),
        Change::Delete { key, old } => format!("delete,{key},{old}"),
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let env = Env::new()
        .parallelism(args.parallelism)
        .state_backend(BackendKind::parse(&args.state)?)
        .checkpoints(
            CheckpointConfig::new(&args.checkpoint_dir)
                .interval(Duration::from_millis(args.checkpoint_interval_ms)),
        );
    let lines = match args.max_rate {
        Some(r) => env.read_text_file_at_rate(&args.input, r),
        None => env.read_text_file(&args.input),
    };
    let upserts = lines
        .parallelism(1)
        .uid("file-source")
        .try_map(|line| parse_line(&line))
        .name("parse")
        .parallelism(1);
    let accounts = Table::from_upserts(&upserts)
        .name("accounts")
        .uid("accounts");
    accounts
        .group_by(|_account, (region, _)| region.clone())
        .sum_by(|(_, amount)| *amount)
        .name("region-totals")
        .uid("region-totals")
        .changes()
        .write_text_exactly_once(&args.output, format_change)
        .uid("sink");
    let result = env.execute("table_totals").context("table_totals failed")?;
    tracing::info!(
        lines = result.records_read(),
        "done, {} lines read in {:.2}s",
        result.records_read(),
        result.elapsed.as_secs_f64()
    );
    Ok(())
}
