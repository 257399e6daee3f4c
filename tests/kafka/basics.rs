//! kafka_sum end to end without failures.

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::*;

/// A bounded run at parallelism 2 over 3 input partitions commits exactly the prefix sums.
#[test]
fn kafka_sum_bounded_run_commits_every_prefix_sum_once() {
    let input = unique("in");
    let output = unique("out");
    create_topic(&input, 3);
    create_topic(&output, 3);
    let records = random_input(5_000, 40, 7);
    produce(&input, &records);
    let ck = tempfile::tempdir().unwrap();
    let out = kafka_sum(&input, &output, ck.path())
        .args([
            "--bounded",
            "--parallelism",
            "2",
            "--checkpoint-interval-ms",
            "200",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_exactly_once(&prefix_sums(&records), &committed_sums(&output));
}

/// After the run, the source's offsets are committed to Kafka under its group id (for lag
/// monitoring), at the end of every input partition.
#[test]
fn source_offsets_are_committed_back_for_monitoring() {
    let input = unique("in");
    let output = unique("out");
    create_topic(&input, 3);
    create_topic(&output, 1);
    let records = random_input(3_000, 20, 11);
    produce(&input, &records);
    let ck = tempfile::tempdir().unwrap();
    let out = kafka_sum(&input, &output, ck.path())
        .args(["--bounded", "--checkpoint-interval-ms", "200"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // kafka_sum's source commits under "{prefix}-source"; the test's prefix is "{output}-sum".
    let group = format!("{output}-sum-source");
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker())
        .set("group.id", &group)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..3 {
        tpl.add_partition(&input, p);
    }
    let committed = c
        .committed_offsets(tpl, Duration::from_secs(30))
        .expect("committed offsets");
    let got: BTreeMap<i32, i64> = committed
        .elements()
        .iter()
        .map(|e| {
            let o = match e.offset() {
                Offset::Offset(o) => o,
                other => panic!(
                    "partition {} has no committed offset: {other:?}",
                    e.partition()
                ),
            };
            (e.partition(), o)
        })
        .collect();
    assert_eq!(got, end_offsets(&input));
}
