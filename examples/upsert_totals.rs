//! upsert_totals: a table of running totals per account, kept in PostgreSQL exactly once —
//! rows upserted as totals change, deleted when an account closes — although the job may be
//! killed at any moment.
//!
//! ```text
//! scripts/postgres.sh start            # prints the URL, e.g. postgres://weir@127.0.0.1:15432/weir
//! cargo run --release --example upsert_totals -- --postgres URL --input LINES \
//!     --checkpoint-dir CKDIR [--table SCHEMA.TABLE] [--create-table] \
//!     [--checkpoint-interval-ms MS] [--parallelism P] [--max-rate LINES_PER_S] [--at-least-once]
//! ```
//!
//! - LINES holds `account,amount` (amount an i64) or `account,close`. The job keeps each
//!   account's (total, number of amounts) in keyed state and emits its changes: an insert
//!   for a new account, an update for every amount, a delete on `close`.
//! - The changes go to `--table` (default `public.account_totals`, columns `account TEXT
//!   PRIMARY KEY, total BIGINT, updates BIGINT`; `--create-table` creates it if missing)
//!   through weir's upsert sink: `INSERT ... ON CONFLICT (account) DO UPDATE` and `DELETE`.
//!   Within one checkpoint the changes of an account collapse to its last.
//! - Exactly-once (the default): the changes of each checkpoint are written in one
//!   transaction when the checkpoint completes, together with the batch's key in
//!   `processed_messages` (same schema). Started again with the same CKDIR, the job resumes
//!   from the latest complete checkpoint; a batch written before the kill is not written
//!   twice. `--at-least-once` writes as changes come instead (the table ends the same).
//! - `--parallelism P` runs P running-total and sink subtasks; `--max-rate` throttles the
//!   reader so a kill can land mid-run.
//! - Exits 0 when the input is consumed and the final checkpoint completed; prints how many
//!   rows were written.
//!
//! Check the result with `scripts/postgres.sh psql -c "SELECT * FROM account_totals ORDER BY 1"`.

#[path = "upsert_changelog.rs"]
mod changelog;

use anyhow::Context;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;
use weir::prelude::*;
use weir_postgres::{UpsertGuarantee, Upserts, postgres};

#[derive(Parser)]
#[command(about = "Running totals per account, upserted into PostgreSQL exactly once")]
struct Args {
    /// The database, e.g. postgres://weir@127.0.0.1:15432/weir (scripts/postgres.sh start prints it).
    #[arg(long = "postgres")]
    url: String,
    /// Lines `account,amount` or `account,close`.
    #[arg(long)]
    input: PathBuf,
    /// Where checkpoints go; the job resumes from the latest one found there.
    #[arg(long)]
    checkpoint_dir: PathBuf,
    /// The table written (`name` or `schema.name`).
    #[arg(long, default_value = "public.account_totals")]
    table: String,
    /// Create the table (and its schema) if missing.
    #[arg(long)]
    create_table: bool,
    #[arg(long, default_value_t = 500)]
    checkpoint_interval_ms: u64,
    #[arg(long, default_value_t = 1)]
    parallelism: usize,
    /// Read at most this many lines per second.
    #[arg(long)]
    max_rate: Option<u64>,
    /// Write changes as they come (at-least-once) instead of per checkpoint.
    #[arg(long)]
    at_least_once: bool,
}

fn create_table(url: &str, table: &str) -> anyhow::Result<()> {
    let mut db = postgres::Client::connect(url, postgres::NoTls)
        .with_context(|| format!("cannot connect to PostgreSQL at {url}"))?;
    if let Some((schema, _)) = table.split_once('.') {
        db.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))?;
    }
    db.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (
             account TEXT PRIMARY KEY, total BIGINT NOT NULL, updates BIGINT NOT NULL)"
    ))
    .with_context(|| format!("cannot create {table}"))?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.parallelism > 0, "--parallelism must be at least 1");
    if args.create_table {
        create_table(&args.url, &args.table)?;
    }
    let env = Env::new().parallelism(args.parallelism).checkpoints(
        CheckpointConfig::new(&args.checkpoint_dir)
            .interval(Duration::from_millis(args.checkpoint_interval_ms)),
    );
    let lines = match args.max_rate {
        Some(r) => env.read_text_file_at_rate(&args.input, r),
        None => env.read_text_file(&args.input),
    }
    .parallelism(1)
    .uid("lines");
    let keys_table = match args.table.split_once('.') {
        Some((schema, _)) => format!("{schema}.processed_messages"),
        None => "processed_messages".to_string(),
    };
    let guarantee = if args.at_least_once {
        UpsertGuarantee::AtLeastOnce
    } else {
        UpsertGuarantee::ExactlyOnce
    };
    let totals = Upserts::new(&args.url, &args.table)
        .key_columns(&["account"], |account: &String| {
            vec![Box::new(account.clone())]
        })
        .value_columns(
            &["total", "updates"],
            |(total, updates): &changelog::Total| vec![Box::new(*total), Box::new(*updates)],
        )
        .keys_table(&keys_table)
        .guarantee(guarantee);
    changelog::totals_changelog(lines)
        .sink_changes("account-totals", totals.make())
        .uid("account-totals");
    let result = env
        .execute("upsert_totals")
        .context("upsert_totals failed")?;
    tracing::info!(
        "done, {} lines read in {:.2}s: {} rows written",
        result.records_read(),
        result.elapsed.as_secs_f64(),
        weir::metrics::sum(
            "upsert_rows_written_total",
            &[("operator", "account-totals")]
        ),
    );
    Ok(())
}
