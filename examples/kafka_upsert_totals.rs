//! kafka_upsert_totals: running totals per account as a compacted Kafka topic — the latest
//! total of every open account, a tombstone for every closed one — written exactly once
//! although the job may be killed at any moment.
//!
//! ```text
//! scripts/kafka.sh start               # a broker at 127.0.0.1:9092
//! cargo run --release --example kafka_upsert_totals -- --brokers HOST:PORT --input LINES \
//!     --topic TOPIC --checkpoint-dir CKDIR [--partitions N] [--checkpoint-interval-ms MS] \
//!     [--parallelism P] [--max-rate LINES_PER_S] [--checkpoint-timeout-ms MS] \
//!     [--transaction-timeout-ms MS] \
//!     [--transactional-id-prefix NAME] [--allow-uncompacted]
//! ```
//!
//! - LINES holds `account,amount` (amount an i64) or `account,close`. The job keeps each
//!   account's (total, number of amounts) in keyed state and emits its changes: an insert
//!   for a new account, an update for every amount, a delete on `close`.
//! - Every change becomes a record of TOPIC: key = the account (UTF-8), value =
//!   `total,updates` (UTF-8), or no value at all (a tombstone) when the account closes. The
//!   records go out in Kafka transactions committed when checkpoints complete:
//!   `read_committed` readers see every change exactly once, in order per account.
//! - A missing TOPIC is created with `cleanup.policy=compact` and `--partitions` partitions
//!   (default 1); an existing topic that is not compacted is refused with the command that
//!   fixes it, unless `--allow-uncompacted`.
//! - Started again with the same CKDIR, the job resumes from the newest complete checkpoint
//!   and finishes the transactions the previous run left pending.
//! - Exits 0 when the input is consumed and the final checkpoint committed.
//!
//! Read the result with `kcat -b HOST:PORT -C -t TOPIC -X isolation.level=read_committed -K: -Z -e`.

#[path = "upsert_changelog.rs"]
mod changelog;

use anyhow::Context;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;
use weir::prelude::*;
use weir_kafka::KafkaUpserts;

#[derive(Parser)]
#[command(about = "Running totals per account into a compacted Kafka topic, exactly once")]
struct Args {
    /// Bootstrap servers, e.g. 127.0.0.1:9092.
    #[arg(long)]
    brokers: String,
    /// Lines `account,amount` or `account,close`.
    #[arg(long)]
    input: PathBuf,
    /// The compacted topic written.
    #[arg(long)]
    topic: String,
    /// Where checkpoints go; the job resumes from the latest one found there.
    #[arg(long)]
    checkpoint_dir: PathBuf,
    /// Partitions of TOPIC when the job creates it.
    #[arg(long, default_value_t = 1)]
    partitions: i32,
    #[arg(long, default_value_t = 500)]
    checkpoint_interval_ms: u64,
    #[arg(long, default_value_t = 1)]
    parallelism: usize,
    /// Read at most this many lines per second.
    #[arg(long)]
    max_rate: Option<u64>,
    /// How long a checkpoint may take before it is given up.
    #[arg(long, default_value_t = 30_000)]
    checkpoint_timeout_ms: u64,
    /// Kafka's transaction.timeout.ms: covers the checkpoint interval plus the checkpoint
    /// timeout, within the broker's transaction.max.timeout.ms.
    #[arg(long, default_value_t = 60_000)]
    transaction_timeout_ms: u64,
    #[arg(long, default_value = "kafka_upsert_totals")]
    transactional_id_prefix: String,
    /// Write into an existing topic that is not compacted (with a warning).
    #[arg(long)]
    allow_uncompacted: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.parallelism > 0, "--parallelism must be at least 1");
    let mut checkpoints = CheckpointConfig::new(&args.checkpoint_dir)
        .interval(Duration::from_millis(args.checkpoint_interval_ms));
    checkpoints.timeout = Duration::from_millis(args.checkpoint_timeout_ms);
    let env = Env::new()
        .parallelism(args.parallelism)
        .checkpoints(checkpoints);
    let lines = match args.max_rate {
        Some(r) => env.read_text_file_at_rate(&args.input, r),
        None => env.read_text_file(&args.input),
    }
    .parallelism(1)
    .uid("lines");
    let txn_timeout = Duration::from_millis(args.transaction_timeout_ms);
    let mut totals = KafkaUpserts::new(&args.brokers, &args.topic, &args.transactional_id_prefix)
        .key_encoder(|account: &String| account.as_bytes().to_vec())
        .value_encoder(|(total, updates): &changelog::Total| {
            format!("{total},{updates}").into_bytes()
        })
        .partitions(args.partitions)
        .configure(|sink| sink.transaction_timeout(txn_timeout));
    if args.allow_uncompacted {
        totals = totals.allow_uncompacted();
    }
    changelog::totals_changelog(lines)
        .sink_changes("account-totals", totals.factory())
        .uid("account-totals");
    let result = env
        .execute("kafka_upsert_totals")
        .context("kafka_upsert_totals failed")?;
    tracing::info!(
        "done, {} lines read in {:.2}s",
        result.records_read(),
        result.elapsed.as_secs_f64()
    );
    Ok(())
}
