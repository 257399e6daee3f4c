//! Watermark alignment of the Kafka source's partitions: a partition whose records are far
//! later in event time than another's is paused while the other is read, and read to its
//! end once the other is done.

use crate::support::*;
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir::prelude::*;
use weir_kafka::KafkaSource;
use weir_tests::join_within;

const PER_PARTITION: i64 = 10_000;
/// Partition 1's records are this much later in event time than partition 0's.
const AHEAD_MS: i64 = 10_000_000;

/// Produces `PER_PARTITION` records to each of the two partitions, partition 1 first, each
/// with a 100-byte payload (so that the consumer fetches them in several rounds).
fn produce_far_apart(topic: &str) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let payload = [b'x'; 100];
    let base = 1_700_000_000_000i64;
    for (partition, start) in [(1, base + AHEAD_MS), (0, base)] {
        for i in 0..PER_PARTITION {
            let mut r = BaseRecord::<[u8], [u8]>::to(topic)
                .partition(partition)
                .timestamp(start + i)
                .payload(&payload[..]);
            loop {
                match p.send(r) {
                    Ok(()) => break,
                    Err((_, back)) => {
                        r = back;
                        p.poll(Duration::from_millis(10));
                    }
                }
            }
        }
    }
    p.flush(Duration::from_secs(60)).expect("flush");
}

#[test]
fn kafka_partitions_far_ahead_in_event_time_are_paused_until_the_others_catch_up() {
    let topic = unique("aligned-partitions");
    create_topic(&topic, 2);
    produce_far_apart(&topic);
    let env = Env::new().parallelism(1);
    let source = KafkaSource::new(broker(), [topic.clone()])
        .bounded()
        .watermarks(0, None)
        .deserializer(|r| Ok((r.partition, r.offset)));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    env.source("kafka", source.factory())
        .watermark_alignment(
            "partitions",
            Duration::from_millis(1_000),
            Duration::from_millis(5),
        )
        .for_each(move || {
            let sink = sink.clone();
            move |v: (i32, i64), _ts| {
                sink.lock().unwrap().push(v);
                Ok(())
            }
        });
    let job = env.execute_async("aligned-partitions").unwrap();
    join_within(job, Duration::from_secs(120)).unwrap();
    let order = seen.lock().unwrap().clone();
    // Every record exactly once, each partition in offset order.
    let mut sorted = order.clone();
    sorted.sort_unstable();
    let expected: Vec<(i32, i64)> = (0..2)
        .flat_map(|p| (0..PER_PARTITION).map(move |o| (p, o)))
        .collect();
    assert_eq!(sorted, expected);
    for p in 0..2 {
        let offsets: Vec<i64> = order.iter().filter(|r| r.0 == p).map(|r| r.1).collect();
        assert!(
            offsets.windows(2).all(|w| w[0] < w[1]),
            "partition {p} out of order"
        );
    }
    // Partition 1 was paused after the first poll that read from it (at most one batch),
    // until partition 0, 10,000 s behind in event time, was read to its end.
    let last_of_0 = order.iter().rposition(|r| r.0 == 0).unwrap();
    let early = order[..last_of_0].iter().filter(|r| r.0 == 1).count();
    assert!(
        early <= weir::dsl::SOURCE_BATCH,
        "{early} records of partition 1 came before partition 0 was read"
    );
}
