//! The exactly-once Kafka sink's pending epochs, seen through a running job's REST API.

use crate::support::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use weir::prelude::*;
use weir_kafka::KafkaSink;
use weir_tests::rest::{self, operator};
use weir_tests::{join_within, wait_for};

/// Emits `n` records, then stays idle until `release` is set.
struct Held {
    left: usize,
    release: Arc<AtomicBool>,
}

impl SourceFunction<(String, i64)> for Held {
    fn poll(&mut self, out: &mut SourceOutput<'_, (String, i64)>) -> Result<SourceStatus> {
        if self.left > 0 {
            self.left -= 1;
            out.emit((format!("k{}", self.left % 3), 1))?;
            return Ok(SourceStatus::More);
        }
        if self.release.load(Ordering::SeqCst) {
            Ok(SourceStatus::Finished)
        } else {
            Ok(SourceStatus::Idle(5))
        }
    }
}

/// The `kafka_sink_pending_epochs` figure of the sink's subtask 0.
fn pending(addr: std::net::SocketAddr) -> Option<f64> {
    let ops = rest::get(addr, "/v1/operators");
    operator(&ops, "kafka-sink")["subtasks"][0]["metrics"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == "kafka_sink_pending_epochs")?["value"]
        .as_f64()
}

/// An intermediate savepoint commits nothing: its epoch waits for the next checkpoint,
/// which the API shows as one pending epoch; the final checkpoint commits it.
#[test]
fn a_savepoints_epoch_shows_as_pending_until_the_next_checkpoint_commits_it() {
    let out = unique("rest-out");
    create_topic(&out, 1);
    let dir = tempfile::tempdir().unwrap();
    let release = Arc::new(AtomicBool::new(false));
    let env = Env::new()
        .parallelism(1)
        .web_address("127.0.0.1:0")
        .checkpoints(CheckpointConfig {
            // The sink's transactions must outlive a checkpoint (the broker allows 5 min).
            timeout: Duration::from_secs(30),
            ..CheckpointConfig::new(dir.path()).interval(Duration::ZERO)
        });
    let r = release.clone();
    let sink = KafkaSink::new(broker(), &out, &unique("rest"))
        .transaction_timeout(Duration::from_secs(60))
        .serializer(|(k, v): &(String, i64)| {
            (Some(k.as_bytes().to_vec()), v.to_string().into_bytes())
        });
    env.source("held", move |_| Held {
        left: 30,
        release: r.clone(),
    })
    .sink("kafka-sink", sink.factory());
    let job = env.execute_async("rest-kafka").unwrap();
    let addr = job.web_address().unwrap();
    let limit = Duration::from_secs(60);
    wait_for("30 records into the sink", limit, || {
        let job = rest::get(addr, "/v1/job");
        assert_ne!(job["state"], "FAILED", "{job:#}");
        operator(&rest::get(addr, "/v1/operators"), "kafka-sink")["records_in"] == 30
    });
    assert_eq!(pending(addr), Some(0.0));
    let (status, body) = rest::post(addr, "/v1/savepoints", r#"{"timeout_ms": 60000}"#);
    assert_eq!(status, 200, "{body}");
    assert_eq!(pending(addr), Some(1.0));
    assert!(
        read_committed_now(&out).is_empty(),
        "a savepoint commits nothing"
    );

    release.store(true, Ordering::SeqCst);
    wait_for("the job to end", limit, || job.is_finished());
    assert_eq!(pending(addr), Some(0.0));
    join_within(job, limit).unwrap();
    assert_eq!(read_committed_now(&out).len(), 30);
}
