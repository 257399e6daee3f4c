//! `upsert-postgres`: generator → changes → the PostgreSQL upsert sink, to measure how many
//! changes per second a table can be kept up to date with, exactly-once or at-least-once.

use anyhow::Context;
use std::time::{Duration, Instant};
use weir::prelude::*;
use weir_postgres::{UpsertGuarantee, Upserts, postgres};

/// The settings of one run.
#[derive(clap::Args, Debug, Clone)]
pub struct UpsertArgs {
    /// The database (scripts/postgres.sh start prints one).
    #[arg(long = "postgres")]
    pub url: String,
    /// Changes generated in all.
    #[arg(long, default_value_t = 2_000_000)]
    pub events: u64,
    /// Distinct keys (rows of the table at the end).
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Parallelism of the generator and the sink.
    #[arg(long, default_value_t = 1)]
    pub parallelism: usize,
    /// Checkpoint interval in milliseconds (exactly-once writes once per checkpoint).
    #[arg(long, default_value_t = 1000)]
    pub checkpoint_interval_ms: u64,
    /// Write changes as they come instead of per checkpoint.
    #[arg(long)]
    pub at_least_once: bool,
}

/// Runs the job into a fresh table (dropped afterwards) and returns the JSON line.
pub fn run(a: &UpsertArgs) -> anyhow::Result<serde_json::Value> {
    let schema = format!("weir_bench_{}", std::process::id());
    let table = format!("{schema}.upserts");
    let mut db = postgres::Client::connect(&a.url, postgres::NoTls)
        .with_context(|| format!("cannot connect to {}", a.url))?;
    db.batch_execute(&format!(
        "CREATE SCHEMA {schema};
         CREATE TABLE {table} (k BIGINT PRIMARY KEY, v BIGINT NOT NULL)"
    ))?;
    let result = (|| -> anyhow::Result<serde_json::Value> {
        let dir = tempfile::tempdir()?;
        let env = Env::new().parallelism(a.parallelism).checkpoints(
            CheckpointConfig::new(dir.path())
                .interval(Duration::from_millis(a.checkpoint_interval_ms)),
        );
        let guarantee = if a.at_least_once {
            UpsertGuarantee::AtLeastOnce
        } else {
            UpsertGuarantee::ExactlyOnce
        };
        let sink = Upserts::new(&a.url, &table)
            .key_columns(&["k"], |k: &i64| vec![Box::new(*k)])
            .value_columns(&["v"], |v: &i64| vec![Box::new(*v)])
            .keys_table(&format!("{schema}.processed_messages"))
            .guarantee(guarantee);
        env.generator(a.events, a.keys)
            .map(|(k, v)| Change::Insert {
                key: k as i64,
                value: v,
            })
            .sink_changes("upserts", sink.make());
        let started = Instant::now();
        let r = env.execute("upsert-postgres")?;
        let elapsed = started.elapsed().as_secs_f64();
        let rows: i64 = db
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])?
            .get(0);
        Ok(serde_json::json!({
            "job": "upsert-postgres",
            "guarantee": if a.at_least_once { "at-least-once" } else { "exactly-once" },
            "events": a.events,
            "keys": a.keys,
            "parallelism": a.parallelism,
            "checkpoint_interval_ms": a.checkpoint_interval_ms,
            "elapsed_s": elapsed,
            "events_per_sec": a.events as f64 / elapsed,
            "rows_written": weir::metrics::sum("upsert_rows_written_total", &[("operator", "upserts")]),
            "transactions": weir::metrics::sum("upsert_batches_written_total", &[("operator", "upserts")]),
            "checkpoints": r.checkpoints_completed,
            "results": rows,
        }))
    })();
    db.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))?;
    result
}
