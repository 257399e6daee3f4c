//! Changelogs into compacted topics through the Kafka upsert sink: the topic created
//! compacted, every change once in order per key with tombstones for deletes (also through
//! `kafka_upsert_totals` killed with SIGKILL), and a topic that is not compacted refused.

use crate::support::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use weir::prelude::*;
use weir_kafka::KafkaUpserts;

/// Per key, the values of its records in log order (`None`: a tombstone).
type Histories = BTreeMap<String, Vec<Option<String>>>;

/// The [`Histories`] a `read_committed` reader sees in `topic`.
fn histories(topic: &str) -> Histories {
    let mut by_key: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
    for r in read_all(topic, "read_committed") {
        let v = r
            .value
            .as_ref()
            .map(|v| String::from_utf8_lossy(v).into_owned());
        by_key.entry(r.key_str()).or_default().push(v);
    }
    by_key
}

/// Per key, the latest value (`None`: the last record is a tombstone): what compaction keeps.
fn latest(h: &BTreeMap<String, Vec<Option<String>>>) -> BTreeMap<String, Option<String>> {
    h.iter()
        .map(|(k, vs)| (k.clone(), vs.last().cloned().flatten()))
        .collect()
}

/// 20 keys: inserts, updates, deletes and re-inserts, and per key the values expected.
fn changelog() -> (Vec<Change<String, i64>>, Histories) {
    let mut changes = Vec::new();
    let mut table: BTreeMap<String, i64> = BTreeMap::new();
    let mut want: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
    for round in 0..5i64 {
        for i in 0..20i64 {
            let key = format!("k{i:02}");
            let value = i * 10 + round;
            let c = match table.get(&key).copied() {
                None => Change::Insert { key, value },
                Some(old) if (i + round) % 4 == 0 => Change::Delete { key, old },
                Some(old) => Change::Update {
                    key,
                    old,
                    new: value,
                },
            };
            match c.new_value() {
                Some(v) => table.insert(c.key().clone(), *v),
                None => table.remove(c.key()),
            };
            want.entry(c.key().clone())
                .or_default()
                .push(c.new_value().map(|v| v.to_string()));
            changes.push(c);
        }
    }
    (changes, want)
}

fn upserts(topic: &str) -> KafkaUpserts<String, i64> {
    KafkaUpserts::new(broker(), topic, &format!("{topic}-upserts"))
        .key_encoder(|k: &String| k.as_bytes().to_vec())
        .value_encoder(|v: &i64| v.to_string().into_bytes())
        .configure(|s| s.transaction_timeout(Duration::from_secs(60)))
}

fn run_changes(sink: KafkaUpserts<String, i64>, dir: &Path) -> weir::Result<()> {
    let (changes, _) = changelog();
    let mut checkpoints = CheckpointConfig::new(dir).interval(Duration::from_millis(100));
    // Within the transaction timeout (60 s).
    checkpoints.timeout = Duration::from_secs(30);
    let env = Env::new().parallelism(2).checkpoints(checkpoints);
    env.from_iter(changes)
        .parallelism(1)
        .sink_changes("upserts", sink.factory());
    weir_tests::run(&env).map(|_| ())
}

#[test]
fn a_changelog_becomes_a_compacted_topic_with_every_change_once_and_tombstones() {
    let topic = unique("upserts");
    let dir = tempfile::tempdir().unwrap();
    run_changes(upserts(&topic).partitions(3), dir.path()).unwrap();
    // Created by the sink: compacted, with the partitions asked for.
    assert_eq!(
        weir_kafka::admin::topic_setting(broker(), &topic, "cleanup.policy").unwrap(),
        Some("compact".to_string())
    );
    assert_eq!(
        weir_kafka::admin::partitions(broker(), &topic).unwrap(),
        vec![0, 1, 2]
    );
    let (_, want) = changelog();
    let got = histories(&topic);
    assert_eq!(got, want, "per key, every change once, in order");
    let tombstones = got.values().flatten().filter(|v| v.is_none()).count();
    assert!(tombstones >= 10, "{tombstones} tombstones");
    // Every record of a key is in one partition, so compaction keeps its latest.
    let mut partitions: BTreeMap<String, std::collections::BTreeSet<i32>> = BTreeMap::new();
    for r in read_all(&topic, "read_committed") {
        partitions
            .entry(r.key_str())
            .or_default()
            .insert(r.partition);
    }
    assert!(partitions.values().all(|p| p.len() == 1), "{partitions:?}");
    assert_eq!(latest(&got), latest(&want));
}

#[test]
fn a_topic_that_is_not_compacted_is_refused_with_the_command_that_fixes_it() {
    let topic = unique("plain");
    create_topic(&topic, 1);
    let dir = tempfile::tempdir().unwrap();
    let e = run_changes(upserts(&topic), dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("topic '{topic}' is not compacted"))
            && e.contains(&format!(
                "--entity-name {topic} --add-config cleanup.policy=compact"
            ))
            && e.contains(".allow_uncompacted()"),
        "{e}"
    );
    assert!(read_all(&topic, "read_uncommitted").is_empty());
    // Allowed explicitly, the job writes with a warning.
    let dir = tempfile::tempdir().unwrap();
    run_changes(upserts(&topic).allow_uncompacted(), dir.path()).unwrap();
    assert_eq!(histories(&topic), changelog().1);
}

/// Lines `account,amount` / `account,close` and, per account, the values of the records
/// `kafka_upsert_totals` must write (`total,updates`, or `None` for a close).
fn totals_input(lines: usize, seed: u64) -> (String, BTreeMap<String, Vec<Option<String>>>) {
    let mut x = seed | 1;
    let mut below = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut text = String::new();
    let mut rows: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut want: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
    for _ in 0..lines {
        let account = format!("acct-{}", below(30));
        if below(20) == 0 {
            text.push_str(&format!("{account},close\n"));
            if rows.remove(&account).is_some() {
                want.entry(account).or_default().push(None);
            }
        } else {
            let amount = below(1000) as i64 - 300;
            text.push_str(&format!("{account},{amount}\n"));
            let row = rows.entry(account.clone()).or_insert((0, 0));
            row.0 += amount;
            row.1 += 1;
            want.entry(account)
                .or_default()
                .push(Some(format!("{},{}", row.0, row.1)));
        }
    }
    (text, want)
}

fn upsert_totals(input: &Path, topic: &str, ck: &Path, parallelism: usize, rate: u64) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kafka_upsert_totals"));
    c.args(["--brokers", broker(), "--topic", topic])
        .arg("--input")
        .arg(input)
        .arg("--checkpoint-dir")
        .arg(ck)
        .args(["--partitions", "2", "--checkpoint-interval-ms", "150"])
        .args(["--parallelism", &parallelism.to_string()])
        .args(["--max-rate", &rate.to_string()])
        .args(["--transactional-id-prefix", &format!("{topic}-totals")])
        .env_remove("WEIR_FAILPOINTS");
    c
}

#[test]
fn kafka_upsert_totals_killed_at_random_moments_writes_every_change_once() {
    let topic = unique("totals");
    let dir = tempfile::tempdir().unwrap();
    // 6000 lines at 300 per second: each run below is killed long before the input ends.
    let (text, want) = totals_input(6000, 41);
    let input = dir.path().join("lines.csv");
    std::fs::write(&input, text).unwrap();
    let ck = dir.path().join("ck");
    let mut x = 5u64;
    for parallelism in [2usize, 1, 2] {
        let before = complete_checkpoints(&ck).last().copied();
        let run = Running::start(&mut upsert_totals(&input, &topic, &ck, parallelism, 300));
        // Each run completes a checkpoint of its own before it is killed, so the job moves on.
        let deadline = Instant::now() + Duration::from_secs(60);
        while complete_checkpoints(&ck).last().copied() == before {
            assert!(Instant::now() < deadline, "no checkpoint within 60 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_millis((x >> 33) % 400));
        run.kill();
    }
    let run = Running::start(&mut upsert_totals(&input, &topic, &ck, 2, 1_000_000));
    let (status, log) = run.wait_within(Duration::from_secs(120));
    assert!(
        status.success(),
        "kafka_upsert_totals failed: {status}\n{log}"
    );
    let got = histories(&topic);
    assert_eq!(got, want, "per account, every change once, in order");
    assert!(got.values().flatten().any(|v| v.is_none()), "no tombstone");
}
