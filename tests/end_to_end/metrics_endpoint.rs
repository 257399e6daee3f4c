//! The job's metrics endpoint, scraped over HTTP as Prometheus would while the job runs.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use weir::metrics;
use weir::prelude::*;
use weir_tests::{JOB_DEADLINE, join_within};

/// Emits its records, then stays idle until `release` is set, then finishes: the job
/// keeps running (and serving metrics) for as long as the test needs.
struct HoldOpen {
    items: Vec<(String, i64)>,
    release: Arc<AtomicBool>,
}

impl SourceFunction<(String, i64)> for HoldOpen {
    fn poll(&mut self, out: &mut SourceOutput<'_, (String, i64)>) -> Result<SourceStatus> {
        if let Some(item) = self.items.pop() {
            out.emit(item)?;
            return Ok(SourceStatus::More);
        }
        if self.release.load(Ordering::SeqCst) {
            Ok(SourceStatus::Finished)
        } else {
            Ok(SourceStatus::Idle(5))
        }
    }
}

fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut c = TcpStream::connect(addr)?;
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: weir\r\nAccept: text/plain\r\n\r\n"
    )?;
    let mut response = String::new();
    c.read_to_string(&mut response)?;
    Ok(response)
}

#[test]
fn a_running_job_serves_its_metrics_in_the_prometheus_format() {
    let release = Arc::new(AtomicBool::new(false));
    let env = Env::new().parallelism(1).metrics_address("127.0.0.1:0");
    let errors = OutputTag::<IdempotencyError<(String, i64)>>::new("errors");
    let input = ["a", "b", "a", "a", "c", "b"]
        .map(|k| (k.to_string(), 1))
        .to_vec();
    let r = release.clone();
    env.source("held", move |_| HoldOpen {
        items: input.clone(),
        release: r.clone(),
    })
    .dedup_by(|(k, _)| k.clone(), Duration::from_secs(3600), &errors)
    .name("dedup-scraped")
    .discard();
    let handle = env.execute_async("scraped").unwrap();
    let addr = handle.metrics_address().expect("a metrics address");
    assert_ne!(addr.port(), 0, "port 0 is replaced by the bound port");

    // The six records are processed soon after the start; scrape until they show. A
    // response renders the metrics one after the other (the state gauge before the
    // counter), so it may catch the counter after the last record and the gauge before it:
    // wait for both.
    let want = "duplicates_suppressed_total{operator=\"dedup-scraped\",subtask=\"0\"} 3\n";
    let entries = "dedup_state_entries{operator=\"dedup-scraped\",subtask=\"0\"} 3\n";
    let deadline = Instant::now() + JOB_DEADLINE;
    let response = loop {
        let r = get(addr, "/metrics").expect("the endpoint answers while the job runs");
        if (r.contains(want) && r.contains(entries)) || Instant::now() > deadline {
            break r;
        }
    };
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(
        response.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
        "{response}"
    );
    assert!(response.contains(want), "{response}");
    assert!(
        response.contains("# TYPE duplicates_suppressed_total counter\n"),
        "{response}"
    );
    assert!(response.contains(entries), "{response}");
    let missing = get(addr, "/other").unwrap();
    assert!(
        missing.starts_with("HTTP/1.1 404 Not Found\r\n"),
        "{missing}"
    );

    release.store(true, Ordering::SeqCst);
    join_within(handle, JOB_DEADLINE).unwrap();
    assert!(
        TcpStream::connect(addr).is_err(),
        "the endpoint still answers after the job ended"
    );
}

#[test]
fn checkpoint_statistics_are_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::new()
        .parallelism(2)
        .checkpoints(CheckpointConfig::new(dir.path()).interval(Duration::ZERO));
    env.from_collection((0..100i64).collect::<Vec<_>>())
        .key_by(|v| v % 7)
        .reduce(|a, b| a + b)
        .discard();
    env.execute("checkpoint-metrics").unwrap();
    let job = [("job", "checkpoint-metrics")];
    // Only the final checkpoint: interval 0 triggers no periodic ones.
    assert_eq!(
        metrics::value("checkpoints_completed_total", &job),
        Some(1.0)
    );
    assert_eq!(metrics::value("checkpoints_failed_total", &job), Some(0.0));
    let size = metrics::value("checkpoint_last_size_bytes", &job).unwrap();
    assert!(size > 0.0, "the final checkpoint wrote {size} bytes");
}

#[test]
fn a_metrics_address_in_use_is_refused_with_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let env = Env::new().parallelism(1).metrics_address(&addr);
    env.from_collection(vec![1i64]).discard();
    let err = env
        .execute_async("refused")
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains(&format!("cannot serve metrics on {addr}")),
        "{err}"
    );
}
