//! A Kafka source's per-partition lag (high watermark − position), seen through a running
//! job's REST API and `/metrics`, against a real broker.

use crate::support::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use weir::prelude::*;
use weir_kafka::KafkaSource;
use weir_tests::rest::{self, operator};
use weir_tests::{join_within, wait_for};

/// The records of each partition of `topic`, read by an independent consumer.
fn per_partition(topic: &str) -> BTreeMap<i32, i64> {
    let mut n: BTreeMap<i32, i64> = [(0, 0), (1, 0)].into();
    for r in read_all(topic, "read_committed") {
        *n.entry(r.partition).or_default() += 1;
    }
    n
}

/// The `partitions` of the source as the API shows them: exactly one row per partition,
/// subtask `p` reading partition `p`, with position `positions[p]` and high watermark
/// `ends[p]`.
fn rows(
    topic: &str,
    positions: &BTreeMap<i32, i64>,
    ends: &BTreeMap<i32, i64>,
) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = positions
        .iter()
        .map(|(&p, &pos)| {
            serde_json::json!({
                "subtask": p,
                "topic": topic,
                "partition": p,
                "position": pos,
                "high_watermark": ends[&p],
                "lag": ends[&p] - pos,
            })
        })
        .collect();
    serde_json::Value::Array(rows)
}

/// A job reads a 2-partition topic to its end: lag 0 and position = records per partition.
/// Held by a blocked operator chained to the source, it reads nothing more: records
/// produced then show as lag, per partition, in the API and on `/metrics`. Released, it
/// catches up to lag 0 again.
#[test]
fn the_api_shows_each_partitions_position_high_watermark_and_lag() {
    let topic = unique("lag");
    create_topic(&topic, 2);
    let first: Vec<(String, i64)> = (0..40).map(|i| (format!("k{}", i % 10), i)).collect();
    produce(&topic, &first);
    let read = per_partition(&topic);
    assert_eq!(read.values().sum::<i64>(), 40);

    let hold = Arc::new(AtomicBool::new(false));
    let env = Env::new().parallelism(2).web_address("127.0.0.1:0");
    let source = KafkaSource::new(broker(), [topic.clone()])
        .deserializer(|r| Ok(String::from_utf8_lossy(r.value.unwrap_or_default()).into_owned()));
    let h = hold.clone();
    env.source("kafka-in", source.factory())
        .map(move |v: String| {
            // The hold: while set, the subtask (source and this map, one thread) stops
            // inside its poll and reads nothing more.
            while h.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            v
        })
        .discard();
    let job = env.execute_async("kafka-lag").unwrap();
    let addr = job.web_address().unwrap();
    let limit = Duration::from_secs(60);
    let partitions = || {
        let job = rest::get(addr, "/v1/job");
        assert_ne!(job["state"], "FAILED", "{job:#}");
        let ops = rest::get(addr, "/v1/operators");
        operator(&ops, "kafka-in")["partitions"].clone()
    };

    let caught_up = rows(&topic, &read, &read);
    wait_for("the source to read every record", limit, || {
        partitions() == caught_up
    });
    let ops = rest::get(addr, "/v1/operators");
    assert_eq!(operator(&ops, "map")["chained"], true, "{ops:#}");
    assert_eq!(operator(&ops, "map")["partitions"], serde_json::json!([]));

    hold.store(true, Ordering::SeqCst);
    let more: Vec<(String, i64)> = (0..30).map(|i| (format!("k{}", i % 10), i)).collect();
    produce(&topic, &more);
    let ends = per_partition(&topic);
    assert_eq!(ends.values().sum::<i64>(), 70);
    let behind = rows(&topic, &read, &ends);
    wait_for("the API to show the records produced as lag", limit, || {
        partitions() == behind
    });
    let text = rest::call(addr, "GET", "/metrics", "").1;
    for p in [0, 1] {
        let labels =
            format!("operator=\"kafka-in\",partition=\"{p}\",subtask=\"{p}\",topic=\"{topic}\"");
        for (name, v) in [
            ("lag", ends[&p] - read[&p]),
            ("position", read[&p]),
            ("high_watermark", ends[&p]),
        ] {
            let line = format!("weir_kafka_source_partition_{name}{{{labels}}} {v}\n");
            assert!(text.contains(&line), "no {line} in\n{text}");
        }
    }

    hold.store(false, Ordering::SeqCst);
    let done = rows(&topic, &ends, &ends);
    wait_for("the source to catch up", limit, || partitions() == done);
    job.cancel();
    assert!(matches!(join_within(job, limit), Err(Error::Cancelled)));
}
