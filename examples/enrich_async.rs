//! enrich_async: every input line enriched by a call to an HTTP service, many calls in
//! flight at once (async I/O), into an exactly-once file sink, with checkpoints and resume.
//!
//! ```text
//! cargo run --release --example enrich_async -- --input IN --output OUTDIR --checkpoint-dir CKDIR \
//!     [--checkpoint-interval-ms MS] [--parallelism P] [--max-rate R] [--capacity N] \
//!     [--service-latency-ms MS]
//! ```
//!
//! - IN holds lines `id,value` (id: text without commas, value: an i64).
//! - The job starts its own local HTTP service (on 127.0.0.1, a free port) that answers
//!   `GET /double?id=ID&value=V` with `2 × V` after `--service-latency-ms` milliseconds
//!   (default 10). For every line the job calls it and writes `id,value,answer` into the
//!   exactly-once file sink in OUTDIR (committed files `part-<subtask>-<checkpoint>`; files
//!   starting with a dot are not committed yet).
//! - `--capacity N` (default 100) is how many calls each subtask may have in flight;
//!   `--parallelism P` (default 1) sets the subtasks of the calls and the sink, and may
//!   change between runs. `--max-rate R` throttles the reader to R lines a second.
//! - Checkpoints go to CKDIR every `--checkpoint-interval-ms` (default 1000). The calls in
//!   flight at a checkpoint are stored in it; started again with the same CKDIR, the job
//!   resumes from the latest complete checkpoint and makes those calls again, so even after
//!   a `kill -9` every line's `id,value,answer` is committed exactly once.
//! - Logs: `RUST_LOG=info,enrich_async=debug` shows every request the service receives
//!   (`service request id=…`); at the end the service reports how many requests it
//!   answered and the most it had in flight at once. Exits 0 once the input is consumed
//!   and committed; a malformed line fails the job with the line.

use anyhow::Context;
use axum::extract::{Query, State};
use clap::Parser;
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use weir::async_io::AsyncOptions;
use weir::prelude::*;
use weir::retry::RetryPolicy;

/// Enriches `id,value` lines through a local HTTP service, with async I/O and exactly-once
/// output.
#[derive(Parser)]
#[command(name = "enrich_async")]
struct Args {
    /// Input file of `id,value` lines.
    #[arg(long)]
    input: PathBuf,
    /// Output directory of the exactly-once file sink.
    #[arg(long)]
    output: PathBuf,
    /// Checkpoint directory (resumed from when it holds checkpoints).
    #[arg(long)]
    checkpoint_dir: PathBuf,
    /// Checkpoint interval in milliseconds.
    #[arg(long, default_value_t = 1000)]
    checkpoint_interval_ms: u64,
    /// Parallelism of the calls and the sink.
    #[arg(long, default_value_t = 1)]
    parallelism: usize,
    /// Lines read per second, at most.
    #[arg(long)]
    max_rate: Option<u64>,
    /// Calls in flight per subtask, at most.
    #[arg(long, default_value_t = 100)]
    capacity: usize,
    /// How long the service takes to answer, in milliseconds.
    #[arg(long, default_value_t = 10)]
    service_latency_ms: u64,
}

/// The local service's figures: requests answered and in flight.
#[derive(Default)]
struct Service {
    latency: Duration,
    now: AtomicUsize,
    max: AtomicUsize,
    requests: AtomicU64,
}

#[derive(Deserialize)]
struct DoubleQuery {
    id: String,
    value: i64,
}

async fn double(State(s): State<Arc<Service>>, Query(q): Query<DoubleQuery>) -> String {
    let inside = s.now.fetch_add(1, Ordering::SeqCst) + 1;
    s.max.fetch_max(inside, Ordering::SeqCst);
    s.requests.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(id = %q.id, "service request id={}", q.id);
    tokio::time::sleep(s.latency).await;
    s.now.fetch_sub(1, Ordering::SeqCst);
    (2 * q.value).to_string()
}

/// Starts the service on the process's async runtime; returns its base URL.
fn start_service(service: Arc<Service>) -> anyhow::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding the service")?;
    listener.set_nonblocking(true)?;
    let address = listener.local_addr()?;
    let runtime = weir::async_io::handle();
    let listener = {
        let _inside = runtime.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let app = axum::Router::new()
        .route("/double", axum::routing::get(double))
        .with_state(service);
    runtime.spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("the local service stopped: {e}");
        }
    });
    tracing::info!(%address, "local service answers 2 × value at http://{address}/double");
    Ok(format!("http://{address}/double"))
}

fn parse_line(line: &str) -> weir::Result<(String, i64)> {
    let (id, value) = line
        .split_once(',')
        .ok_or_else(|| Error::Malformed(format!("expected `id,value`, got `{line}`")))?;
    let value = value
        .trim()
        .parse::<i64>()
        .map_err(|e| Error::Malformed(format!("the value of `{line}` is not an i64: {e}")))?;
    Ok((id.trim().to_string(), value))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    weir::logging::init()?;
    if args.capacity == 0 || args.parallelism == 0 {
        anyhow::bail!("--capacity and --parallelism must be at least 1");
    }
    let service = Arc::new(Service {
        latency: Duration::from_millis(args.service_latency_ms),
        ..Service::default()
    });
    let url = start_service(service.clone())?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.capacity)
        .build()
        .context("building the HTTP client")?;

    let env = Env::new().parallelism(args.parallelism).checkpoints(
        CheckpointConfig::new(&args.checkpoint_dir)
            .interval(Duration::from_millis(args.checkpoint_interval_ms)),
    );
    let lines = match args.max_rate {
        Some(r) => env.read_text_file_at_rate(&args.input, r),
        None => env.read_text_file(&args.input),
    };
    // A call retried after a lost connection or a 5xx answer; each call may take the
    // service's latency plus 30 s over all its attempts.
    let opts = AsyncOptions::new(
        args.capacity,
        Duration::from_millis(args.service_latency_ms) + Duration::from_secs(30),
    )
    .retry(RetryPolicy::default());
    lines
        .parallelism(1)
        .uid("file-source")
        .try_map(|line| parse_line(&line))
        .name("parse")
        .parallelism(1)
        .rebalance()
        .try_map_async(opts, move |(id, value): (String, i64)| {
            let request = client
                .get(&url)
                .query(&[("id", id.as_str()), ("value", &value.to_string())]);
            async move {
                let answer = request
                    .send()
                    .await
                    .and_then(|r| r.error_for_status())
                    .map_err(|e| format!("calling the service for {id}: {e}"))?
                    .text()
                    .await
                    .map_err(|e| format!("reading the answer for {id}: {e}"))?;
                let answer: i64 = answer
                    .trim()
                    .parse()
                    .map_err(|e| format!("the answer for {id} is not a number ({answer}): {e}"))?;
                Ok::<_, String>((id, value, answer))
            }
        })
        .name("enrich")
        .uid("enrich")
        .write_text_exactly_once(&args.output, |(id, value, answer)| {
            format!("{id},{value},{answer}")
        })
        .uid("sink");
    let result = env.execute("enrich_async").context("enrich_async failed")?;
    tracing::info!(
        requests = service.requests.load(Ordering::Relaxed),
        max_in_flight = service.max.load(Ordering::SeqCst),
        "service: {} requests answered, at most {} in flight at once",
        service.requests.load(Ordering::Relaxed),
        service.max.load(Ordering::SeqCst)
    );
    tracing::info!(
        lines = result.records_read(),
        "done, {} lines read in {:.2}s",
        result.records_read(),
        result.elapsed.as_secs_f64()
    );
    Ok(())
}
