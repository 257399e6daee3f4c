//! payments_apply_once: orders go from pending to paid exactly once, although the input
//! carries duplicate payments and the job may be killed at any moment.
//!
//! ```text
//! scripts/postgres.sh start            # prints the URL, e.g. postgres://weir@127.0.0.1:15432/weir
//! cargo run --release --example payments_apply_once -- --postgres URL --input PAYMENTS \
//!     --checkpoint-dir CKDIR [--schema NAME] [--create-orders N] [--dead-letters DIR] \
//!     [--checkpoint-interval-ms MS] [--parallelism P] [--max-rate RECORDS_PER_S] \
//!     [--checkpoint-mode MODE] [--web HOST:PORT] [--secret-file PATH] [--tls-dir DIR] \
//!     [--measure-bytes]
//! ```
//!
//! - PAYMENTS holds lines `payment_id,order_id,amount` (amount: an i64). A payment may
//!   appear several times — a producer's retry, an at-least-once hop upstream: the same
//!   payment_id with the same order and amount. payment_id is the idempotency key.
//! - `--create-orders N` creates, in the schema (default `payments`), the table `orders`
//!   with orders 1..=N `pending`, and `ledger` (one row per money movement, amount > 0);
//!   existing rows are kept.
//! - Each payment is applied through weir's apply-once sink: in one transaction, the key is
//!   marked in `processed_messages` and the order is moved from pending to paid with a ledger
//!   row; the response (`{"order_id":…,"status":"paid"|"already_paid"|"unknown_order"}`) is
//!   stored with the key. A duplicate finds its key DONE and changes nothing.
//! - A payment the database rejects (an amount ≤ 0 breaks the ledger's check) is set aside
//!   in `--dead-letters DIR` (default CKDIR/dead-letters) with its key, and the job goes on.
//! - Checkpoints go to CKDIR; started again with the same CKDIR the job resumes from the
//!   latest complete checkpoint, replaying the payments after it — which the sink recognises.
//!   Kill it anywhere (even `kill -9` between a database commit and the next checkpoint) and
//!   every payment still has exactly one effect.
//! - `--parallelism P` runs P sink subtasks with payments spread round-robin, so duplicates
//!   of one payment can meet in two subtasks at once (one applies, the other gets a conflict
//!   and then finds the key DONE). `--max-rate` throttles the reader so a kill can land mid-run.
//! - `--checkpoint-mode aligned|unaligned|aligned-timeout|aligned-timeout:MS` sets how
//!   checkpoint barriers pass the payments queued before the sink (docs/checkpoints.md).
//!   The sink is the slow part of this job (a database transaction per payment), so
//!   payments back up in front of it; with `unaligned` the barriers overtake them and the
//!   checkpoint stores them, to be applied after a restore — where the apply-once sink
//!   recognises any that it had applied already.
//! - `--web HOST:PORT` serves the job's REST API and metrics while it runs
//!   (docs/operations.md); port 0 picks a free port, printed at the start.
//! - Exits 0 when the input is consumed and the final checkpoint completed; prints the
//!   number of applied, suppressed and dead-lettered payments of this run.
//!
//! Check the result with `scripts/postgres.sh psql -c "SELECT status, count(*) FROM
//! payments.orders GROUP BY 1"` and `SELECT payment_id, count(*) FROM payments.ledger GROUP
//! BY 1 HAVING count(*) > 1` (no rows).

use anyhow::{Context, bail};
use std::path::PathBuf;
use std::time::Duration;
use weir::prelude::*;
use weir_postgres::{ApplyOnce, postgres};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Payment {
    payment_id: String,
    order_id: i64,
    amount: i64,
}

struct Args {
    url: String,
    input: PathBuf,
    checkpoint_dir: PathBuf,
    schema: String,
    create_orders: Option<i64>,
    dead_letters: Option<PathBuf>,
    interval_ms: u64,
    parallelism: usize,
    max_rate: Option<u64>,
    web: Option<String>,
    /// The secret the REST API's actions need (`--secret-file`, or `WEIR_SECRET_FILE`).
    secret: Option<weir::Secret>,
    /// TLS settings (`--tls-dir`, or `WEIR_TLS_DIR`).
    tls: Option<weir::Tls>,
    /// Measure the bytes records take on channels (`--measure-bytes`, with `--web`).
    measure_bytes: bool,
    /// How barriers pass records in flight (`--checkpoint-mode`).
    mode: CheckpointMode,
}

fn parse_args() -> anyhow::Result<Args> {
    let (mut url, mut input, mut checkpoint_dir) = (None, None, None);
    let mut schema = "payments".to_string();
    let (mut create_orders, mut dead_letters, mut max_rate) = (None, None, None);
    let (mut interval_ms, mut parallelism) = (1000, 1);
    let mut web = None;
    let mut secret_file = None;
    let mut tls_dir = None;
    let mut measure_bytes = false;
    let mut mode = CheckpointMode::default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--postgres" => url = Some(value()?),
            "--input" => input = Some(PathBuf::from(value()?)),
            "--checkpoint-dir" => checkpoint_dir = Some(PathBuf::from(value()?)),
            "--schema" => schema = value()?,
            "--create-orders" => create_orders = Some(value()?.parse().context("--create-orders")?),
            "--dead-letters" => dead_letters = Some(PathBuf::from(value()?)),
            "--checkpoint-interval-ms" => {
                interval_ms = value()?.parse().context("--checkpoint-interval-ms")?
            }
            "--parallelism" => parallelism = value()?.parse().context("--parallelism")?,
            "--max-rate" => max_rate = Some(value()?.parse().context("--max-rate")?),
            "--web" => web = Some(value()?),
            "--measure-bytes" => measure_bytes = true,
            "--checkpoint-mode" => {
                mode = value()?
                    .parse::<CheckpointMode>()
                    .map_err(|e| anyhow::anyhow!("--checkpoint-mode: {e}"))?
            }
            "--secret-file" => secret_file = Some(PathBuf::from(value()?)),
            "--tls-dir" => tls_dir = Some(PathBuf::from(value()?)),
            other => bail!(
                "unknown argument {other:?}; usage: payments_apply_once --postgres URL --input PAYMENTS \
                 --checkpoint-dir CKDIR [--schema NAME] [--create-orders N] [--dead-letters DIR] \
                 [--checkpoint-interval-ms MS] [--parallelism P] [--max-rate RECORDS_PER_S] \
                 [--checkpoint-mode aligned|unaligned|aligned-timeout[:MS]] \
                 [--web HOST:PORT] [--secret-file PATH] [--tls-dir DIR] [--measure-bytes]"
            ),
        }
    }
    if !schema
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_')
        || !schema.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
    {
        bail!("--schema {schema:?} is not a plain SQL name (letters, digits, '_')");
    }
    if parallelism == 0 {
        bail!("--parallelism must be at least 1");
    }
    Ok(Args {
        url: url.context("--postgres URL is required (scripts/postgres.sh start prints one)")?,
        input: input.context("--input PAYMENTS is required")?,
        checkpoint_dir: checkpoint_dir.context("--checkpoint-dir CKDIR is required")?,
        schema,
        create_orders,
        dead_letters,
        interval_ms,
        parallelism,
        max_rate,
        web,
        secret: weir::Secret::from_file_or_env(secret_file.as_deref())?,
        tls: weir::Tls::from_dir_or_env(tls_dir.as_deref())?,
        measure_bytes,
        mode,
    })
}

fn parse_line(line: &str) -> weir::Result<Payment> {
    let bad = |why: &str| {
        Error::Malformed(format!(
            "payment {line:?}: {why}; expected payment_id,order_id,amount"
        ))
    };
    let mut parts = line.split(',');
    let (Some(id), Some(order), Some(amount), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("not three fields"));
    };
    Ok(Payment {
        payment_id: id.trim().to_string(),
        order_id: order
            .trim()
            .parse()
            .map_err(|_| bad("order_id is not an integer"))?,
        amount: amount
            .trim()
            .parse()
            .map_err(|_| bad("amount is not an integer"))?,
    })
}

fn create_orders(url: &str, schema: &str, n: i64) -> anyhow::Result<()> {
    let mut db = postgres::Client::connect(url, postgres::NoTls)
        .with_context(|| format!("cannot connect to PostgreSQL at {url}"))?;
    db.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS {schema}.orders (
             id BIGINT PRIMARY KEY, status TEXT NOT NULL, paid_amount BIGINT, payment_id TEXT);
         CREATE TABLE IF NOT EXISTS {schema}.ledger (
             payment_id TEXT NOT NULL, order_id BIGINT NOT NULL,
             amount BIGINT NOT NULL CHECK (amount > 0), at TIMESTAMPTZ NOT NULL DEFAULT now());"
    ))?;
    db.execute(
        &format!(
            "INSERT INTO {schema}.orders (id, status) SELECT g, 'pending' FROM generate_series(1, $1::bigint) g
             ON CONFLICT (id) DO NOTHING"
        ),
        &[&n],
    )?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    if let Some(n) = args.create_orders {
        create_orders(&args.url, &args.schema, n)?;
    }
    let mut checkpoints = CheckpointConfig::new(&args.checkpoint_dir)
        .interval(Duration::from_millis(args.interval_ms));
    checkpoints.mode = args.mode;
    let mut env = Env::new()
        .parallelism(args.parallelism)
        .checkpoints(checkpoints);
    if let Some(a) = &args.web {
        env = env.web_address(a);
    }
    if let Some(s) = &args.secret {
        env = env.secret(s.clone());
    }
    if let Some(t) = &args.tls {
        env = env.tls(t.clone());
    }
    env = env.measure_bytes(args.measure_bytes);
    let lines = match args.max_rate {
        Some(r) => env.read_text_file_at_rate(&args.input, r),
        None => env.read_text_file(&args.input),
    };
    let s = args.schema.clone();
    let dead_letters = args
        .dead_letters
        .clone()
        .unwrap_or_else(|| args.checkpoint_dir.join("dead-letters"));
    let pay = ApplyOnce::new(&args.url, "payments", |p: &Payment| p.payment_id.clone())
        .table(&format!("{s}.processed_messages"))
        .dead_letters(weir::dlq::to_dir(dead_letters))
        .effect(move |tx, p: &Payment| {
            // The business effect, in the transaction that marks the key.
            let paid = tx.query_opt(
                &format!(
                    "UPDATE {s}.orders SET status = 'paid', paid_amount = $2, payment_id = $3
                     WHERE id = $1 AND status = 'pending' RETURNING id"
                ),
                &[&p.order_id, &p.amount, &p.payment_id],
            )?;
            let status = if paid.is_some() {
                tx.execute(
                    &format!(
                        "INSERT INTO {s}.ledger (payment_id, order_id, amount) VALUES ($1, $2, $3)"
                    ),
                    &[&p.payment_id, &p.order_id, &p.amount],
                )?;
                "paid"
            } else if tx
                .query_opt(
                    &format!("SELECT 1 FROM {s}.orders WHERE id = $1"),
                    &[&p.order_id],
                )?
                .is_some()
            {
                "already_paid"
            } else {
                "unknown_order"
            };
            Ok(serde_json::json!({ "order_id": p.order_id, "status": status }))
        });
    lines
        .parallelism(1)
        .uid("payments-source")
        .try_map(|line| parse_line(&line))
        .name("parse")
        .parallelism(1)
        .rebalance()
        .sink("apply-payments", pay.make())
        .uid("apply-payments");
    let handle = env
        .execute_async("payments_apply_once")
        .context("payments_apply_once failed")?;
    if let Some(a) = handle.web_address() {
        let scheme = if args.tls.is_some() { "https" } else { "http" };
        tracing::info!(address = %a, "REST API at {scheme}://{a}/v1/job");
        tracing::info!(address = %a, "dashboard at {scheme}://{a}/");
    }
    let result = handle.join().context("payments_apply_once failed")?;
    let m = |name: &str| weir::metrics::sum(name, &[("operator", "apply-payments")]);
    tracing::info!(
        "done, {} payments read in {:.2}s: {} applied, {} duplicates suppressed, {} dead-lettered",
        result.records_read(),
        result.elapsed.as_secs_f64(),
        m("apply_once_applied_total"),
        m("duplicates_suppressed_total"),
        weir::metrics::sum("dead_letters_total", &[("handler", "payments")]),
    );
    Ok(())
}
