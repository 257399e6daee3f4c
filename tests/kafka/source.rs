//! The Kafka source: assignment, offsets across restarts and rescaling, bounded mode.

use crate::support::*;
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use weir::prelude::*;
use weir_kafka::KafkaSource;
use weir_tests::{BySubtask, join_within};

/// The manifest (`_metadata`) of checkpoint `id` in `dir`.
fn manifest(dir: &Path, id: u64) -> String {
    std::fs::read_to_string(checkpoint_path(dir, id).join("_metadata")).expect("read _metadata")
}

/// Waits for a complete checkpoint newer than `after` and returns its id; fails the test if
/// the process ends first or after `limit`.
fn wait_for_checkpoint(run: &mut Running, dir: &Path, after: u64, limit: Duration) -> u64 {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(&id) = complete_checkpoints(dir)
            .iter()
            .rev()
            .find(|id| **id > after)
        {
            return id;
        }
        assert!(
            run.is_running(),
            "kafka_sum ended before checkpoint {} completed",
            after + 1
        );
        assert!(
            Instant::now() < deadline,
            "no checkpoint after {after} within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Kills kafka_sum as soon as a checkpoint newer than `after` completes (it must still be
/// mid-way: the checkpoint is not the final one); returns that checkpoint's id.
fn kill_after_next_checkpoint(mut run: Running, dir: &Path, after: u64) -> u64 {
    let id = wait_for_checkpoint(&mut run, dir, after, Duration::from_secs(60));
    let err = run.kill();
    let m = manifest(dir, id);
    assert!(
        m.contains("\"kind\": \"checkpoint\""),
        "checkpoint {id} should be a periodic one taken mid-way, not the end of the run:\n{m}\n{err}"
    );
    let positions: Vec<&str> = m
        .lines()
        .filter(|l| l.contains("\"operator_state\"") && l.contains('@'))
        .map(str::trim)
        .collect();
    eprintln!("killed after checkpoint {id}; source positions: {positions:?}");
    id
}

/// kafka_sum at parallelism 2, killed after its first checkpoint, resumed at parallelism 1,
/// killed again, and resumed at parallelism 3 to the end: every prefix sum committed once
/// (the partitions' offsets are redistributed on each rescale).
#[test]
fn offsets_survive_kills_and_rescaling_2_to_1_to_3() {
    let input = unique("in-rescale");
    let output = unique("out-rescale");
    create_topic(&input, 5);
    create_topic(&output, 3);
    let records = random_input(150_000, 50, 101);
    produce(&input, &records);
    let ck = tempfile::tempdir().unwrap();
    let run = |p: &str| {
        Running::start(kafka_sum(&input, &output, ck.path()).args([
            "--bounded",
            "--checkpoint-interval-ms",
            "100",
            "--parallelism",
            p,
        ]))
    };
    let first = kill_after_next_checkpoint(run("2"), ck.path(), 0);
    let second = kill_after_next_checkpoint(run("1"), ck.path(), first);
    let (status, err) = run("3").wait_within(Duration::from_secs(120));
    assert!(status.success(), "the last run failed:\n{err}");
    assert!(
        err.contains("resuming from checkpoint"),
        "the last run did not resume from a checkpoint:\n{err}"
    );
    eprintln!("killed after checkpoints {first} (P=2) and {second} (P=1), finished at P=3");
    assert_exactly_once(&prefix_sums(&records), &committed_sums(&output));
}

/// A narrower reproduction of what the rescaling test can hit: kafka_sum at parallelism 1
/// is killed right after its first checkpoint with output completes and before the sink
/// commits it (fail point `kafka.before_commit`), then resumed at parallelism 3. The restore
/// re-produces the uncommitted epoch; the keys in it now belong to other subtasks too, and
/// their newer sums must not land in the log before the re-produced older ones.
#[test]
fn a_rescaled_restore_keeps_each_keys_output_in_order() {
    let input = unique("in-replay");
    let output = unique("out-replay");
    create_topic(&input, 3);
    create_topic(&output, 3);
    let records = random_input(100_000, 30, 131);
    produce(&input, &records);
    let ck = tempfile::tempdir().unwrap();
    let cmd = |p: &str| {
        let mut c = kafka_sum(&input, &output, ck.path());
        c.args([
            "--bounded",
            "--checkpoint-interval-ms",
            "100",
            "--parallelism",
            p,
        ]);
        c
    };
    let (status, err) = Running::start(cmd("1").env("WEIR_FAILPOINTS", "kafka.before_commit=kill"))
        .wait_within(Duration::from_secs(60));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(9),
        "the fail point did not kill kafka_sum:\n{err}"
    );
    let (status, err) = Running::start(&mut cmd("3")).wait_within(Duration::from_secs(90));
    assert!(status.success(), "the resumed run failed:\n{err}");
    assert!(
        err.contains("re-produced"),
        "the resumed run re-produced nothing:\n{err}"
    );
    for line in err.lines().filter(|l| l.contains(" [weir] ")) {
        eprintln!("resumed run: {line}");
    }
    assert_exactly_once(&prefix_sums(&records), &committed_sums(&output));
    // The restore itself must not stall or fail: a restart here means the resumed run lost
    // its first attempt (seen: other subtasks' pre-committed transactions hold the marker
    // partition's last stable offset while subtask 0 scans it, until the broker aborts them).
    assert!(
        !err.contains("restarting from the last complete checkpoint"),
        "the resumed run failed and restarted:\n{err}"
    );
}

/// Bounded mode: the end offsets observed at the first start are kept in the checkpoints,
/// so records produced while the job is down are not read by the resumed run.
#[test]
fn bounded_mode_keeps_the_end_offsets_of_the_first_start() {
    let input = unique("in-bounded");
    let output = unique("out-bounded");
    create_topic(&input, 3);
    create_topic(&output, 2);
    let a = random_input(100_000, 30, 111);
    produce(&input, &a);
    let ends_a = end_offsets(&input);
    let ck = tempfile::tempdir().unwrap();
    let cmd = || {
        let mut c = kafka_sum(&input, &output, ck.path());
        c.args(["--bounded", "--checkpoint-interval-ms", "100"]);
        c
    };
    let first = kill_after_next_checkpoint(Running::start(&mut cmd()), ck.path(), 0);
    // The source's positions in the checkpoint carry the end offsets of the first start.
    let m = manifest(ck.path(), first);
    for (p, end) in &ends_a {
        let want = format!("{input}/{p}@");
        let at = m
            .find(&want)
            .unwrap_or_else(|| panic!("no position of {want} in:\n{m}"));
        let rest = &m[at..];
        let entry = &rest[..rest.find([',', '"']).unwrap_or(rest.len())];
        assert!(
            entry.ends_with(&format!("(end {end})")),
            "partition {p}: {entry:?} should end at {end}"
        );
    }

    let b = random_input(5_000, 30, 112);
    produce(&input, &b);
    assert!(end_offsets(&input) != ends_a, "B was appended");
    let (status, err) = Running::start(&mut cmd()).wait_within(Duration::from_secs(90));
    assert!(status.success(), "the resumed run failed:\n{err}");
    assert!(
        err.contains("resuming from checkpoint"),
        "did not resume:\n{err}"
    );
    assert_exactly_once(&prefix_sums(&a), &committed_sums(&output));
}

/// The source reads read_committed: input of an aborted transaction is never processed,
/// input of committed transactions is.
#[test]
fn input_of_aborted_transactions_is_not_processed() {
    let input = unique("in-txn");
    let output = unique("out-txn");
    create_topic(&input, 2);
    create_topic(&output, 2);
    let c1 = random_input(500, 8, 121);
    let aborted: Vec<(String, i64)> = random_input(300, 8, 122)
        .into_iter()
        .map(|(k, v)| (k, v * 1_000_000))
        .collect();
    let c2 = random_input(500, 8, 123);
    let p = txn_producer(&unique("input-txn"));
    for (batch, commit) in [(&c1, true), (&aborted, false), (&c2, true)] {
        p.begin_transaction().unwrap();
        send_all(&p, &input, batch);
        if commit {
            p.commit_transaction(Duration::from_secs(30)).unwrap();
        } else {
            p.abort_transaction(Duration::from_secs(30)).unwrap();
        }
    }
    // The aborted records are in the log: a read_uncommitted reader sees them.
    assert_eq!(read_all(&input, "read_uncommitted").len(), 1300);

    let ck = tempfile::tempdir().unwrap();
    let (status, err) = Running::start(kafka_sum(&input, &output, ck.path()).args([
        "--bounded",
        "--parallelism",
        "2",
        "--checkpoint-interval-ms",
        "100",
    ]))
    .wait_within(Duration::from_secs(60));
    assert!(status.success(), "kafka_sum failed:\n{err}");
    let committed: Vec<(String, i64)> = c1.iter().chain(&c2).cloned().collect();
    assert_exactly_once(&prefix_sums(&committed), &committed_sums(&output));
}

/// Produces `n` records to each partition of `topic` (key and value: the partition).
fn produce_to_each_partition(topic: &str, partitions: i32, n: usize) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .unwrap();
    for part in 0..partitions {
        let s = part.to_string();
        for _ in 0..n {
            p.send(
                BaseRecord::to(topic)
                    .partition(part)
                    .key(s.as_bytes())
                    .payload(s.as_bytes()),
            )
            .map_err(|(e, _)| e)
            .unwrap();
        }
    }
    p.flush(Duration::from_secs(30)).unwrap();
}

/// Partitions of all topics, sorted by (topic, partition), are dealt round-robin: subtask i
/// of P reads those at positions n with n % P == i.
#[test]
fn partitions_are_assigned_deterministically_in_sorted_order() {
    // "asg-a-…" sorts before "asg-b-…".
    let ta = unique("asg-a");
    let tb = unique("asg-b");
    create_topic(&ta, 3);
    create_topic(&tb, 2);
    produce_to_each_partition(&ta, 3, 4);
    produce_to_each_partition(&tb, 2, 4);

    let env = Env::new().parallelism(2);
    let source = KafkaSource::new(broker(), [tb.clone(), ta.clone()])
        .bounded()
        .deserializer(|r| Ok((r.topic.to_string(), r.partition, r.offset)));
    let seen = BySubtask::attach(&env.source("kafka", source.factory()), 2);
    join_within(
        env.execute_async("assignment").unwrap(),
        Duration::from_secs(60),
    )
    .unwrap();

    // Sorted: a/0 a/1 a/2 b/0 b/1 -> subtask 0: a/0 a/2 b/1; subtask 1: a/1 b/0.
    let read = |parts: &[(&String, i32)]| -> Vec<(String, i32, i64)> {
        let mut v: Vec<(String, i32, i64)> = parts
            .iter()
            .flat_map(|(t, p)| (0..4).map(move |o| ((*t).clone(), *p, o)))
            .collect();
        v.sort();
        v
    };
    let mut want = BTreeMap::new();
    want.insert(0, read(&[(&ta, 0), (&ta, 2), (&tb, 1)]));
    want.insert(1, read(&[(&ta, 1), (&tb, 0)]));
    assert_eq!(seen.per_subtask(), want);
}

/// Per-partition watermarks: the source's watermark is the minimum over its partitions, so
/// a partition lagging in event time loses no records; once that partition goes idle it
/// no longer holds the watermark back, and the windows of the other partition fire.
#[test]
fn per_partition_watermarks_wait_for_the_slowest_partition_until_it_is_idle() {
    let topic = unique("in-wm");
    create_topic(&topic, 2);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let base = (now_ms / 1000) * 1000 - 60_000;

    let env = Env::new().parallelism(1);
    let source = KafkaSource::new(broker(), [topic.clone()])
        .watermarks(0, Some(Duration::from_millis(1000)))
        .deserializer(|r| {
            let key = String::from_utf8_lossy(r.key.unwrap_or_default()).into_owned();
            Ok((key, r.timestamp.ok_or("no timestamp")?))
        });
    let (tx, rx) = mpsc::channel::<(String, i64, Vec<i64>)>();
    env.source("kafka", source.factory())
        .key_by(|(k, _): &(String, i64)| k.clone())
        .window(WindowAssigner::tumbling(1000))
        .process(|key: &String, w, records: &[(String, i64)], out| {
            out.emit((key.clone(), w.start, records.iter().map(|r| r.1).collect()));
            Ok(())
        })
        .for_each(move || {
            let tx = tx.clone();
            move |v, _ts| {
                let _ = tx.send(v);
                Ok(())
            }
        });
    let job = env.execute_async("watermarks").unwrap();

    // The live input: partition 0 ("a") runs 1 s ahead of partition 1 ("b") in event time;
    // after 20 pairs, partition 1 stops (goes idle) and partition 0 goes on.
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let stop = stop.clone();
        let topic = topic.clone();
        std::thread::spawn(move || {
            let p: BaseProducer = ClientConfig::new()
                .set("bootstrap.servers", broker())
                .set("enable.idempotence", "true")
                .set("acks", "all")
                .set("linger.ms", "0")
                .create()
                .unwrap();
            let send = |part: i32, key: &str, ts: i64| {
                p.send(
                    BaseRecord::to(&topic)
                        .partition(part)
                        .key(key.as_bytes())
                        .payload(b"1")
                        .timestamp(ts),
                )
                .map_err(|(e, _)| e)
                .unwrap();
            };
            for i in 0..600 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                send(0, "a", base + i * 100);
                if i < 20 {
                    send(1, "b", base - 1000 + i * 100);
                }
                p.flush(Duration::from_secs(10)).unwrap();
                // Paces the live input (not a synchronisation).
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let window = |start: i64| -> Vec<i64> { (0..10).map(|i| start + i * 100).collect() };
    let expected: BTreeSet<(String, i64, Vec<i64>)> = [
        ("b".to_string(), base - 1000, window(base - 1000)),
        ("b".to_string(), base, window(base)),
        ("a".to_string(), base, window(base)),
        ("a".to_string(), base + 1000, window(base + 1000)),
    ]
    .into_iter()
    .collect();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(40);
    while !expected.iter().all(|e| got.contains(e)) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(v) => got.push(v),
            Err(_) => break,
        }
    }
    stop.store(true, Ordering::SeqCst);
    job.cancel();
    let ended = join_within(job, Duration::from_secs(30));
    producer.join().unwrap();
    assert!(
        matches!(ended, Err(weir::Error::Cancelled)),
        "the job should end cancelled: {ended:?}"
    );
    while let Ok(v) = rx.try_recv() {
        got.push(v);
    }
    eprintln!(
        "windows fired: {:?}",
        got.iter()
            .map(|g| (&g.0, g.1 - base, g.2.len()))
            .collect::<Vec<_>>()
    );
    for e in &expected {
        assert!(
            got.contains(e),
            "window {e:?} did not fire (fired: {got:?})"
        );
    }
    // Anything else that fired is a later, complete window of partition 0, each once.
    let mut distinct = BTreeSet::new();
    for g in &got {
        assert!(distinct.insert(g.clone()), "window fired twice: {g:?}");
        if !expected.contains(g) {
            assert!(
                g.0 == "a" && g.1 >= base + 2000 && g.2 == window(g.1),
                "unexpected window result {g:?} (all: {got:?})"
            );
        }
    }
}

/// Produces `(partition, key, timestamp)` records and waits until the broker has them.
fn produce_at(topic: &str, records: &[(i32, &str, i64)]) {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()
        .unwrap();
    for (part, key, ts) in records {
        p.send(
            BaseRecord::to(topic)
                .partition(*part)
                .key(key.as_bytes())
                .payload(b"1")
                .timestamp(*ts),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    }
    p.flush(Duration::from_secs(10)).unwrap();
}

/// Each partition's event time is part of the source's checkpoint state: after a stop with
/// a savepoint and a restore at another parallelism (2 → 1, both partitions now in one
/// subtask), a new record on partition 0 alone advances the watermark to
/// min(partition 0, partition 1 as restored). Without the partitions' event time in the
/// checkpoint, partition 1 would count as "no record yet" and hold the watermark at the
/// restored low mark until it got a record, so the timer below would not fire.
#[test]
fn per_partition_event_time_survives_a_savepoint_and_a_rescale() {
    let topic = unique("in-wm-restore");
    create_topic(&topic, 2);
    let base = 1_000_000i64;
    let mut first: Vec<(i32, &str, i64)> = Vec::new();
    for i in 0..20 {
        first.push((0, "a", base + i * 100)); // partition 0 up to base + 1900
        first.push((1, "b", base + 5_000 + i * 100)); // partition 1 up to base + 6900
    }
    produce_at(&topic, &first);
    let dir = tempfile::tempdir().unwrap();

    /// Passes records on; on each, sets an event-time timer 500 ms after its timestamp and
    /// reports the firing.
    struct Timer;
    impl KeyedProcessFunction<String, (String, i64), (String, i64)> for Timer {
        fn process(
            &mut self,
            v: (String, i64),
            ctx: &mut KeyedContext<'_, String, (String, i64)>,
        ) -> weir::Result<()> {
            ctx.register_event_time_timer(v.1 + 500);
            ctx.emit(v);
            Ok(())
        }
        fn on_timer(
            &mut self,
            time: Timestamp,
            _d: TimeDomain,
            ctx: &mut KeyedContext<'_, String, (String, i64)>,
        ) -> weir::Result<()> {
            ctx.emit((format!("timer {}", ctx.key()), time));
            Ok(())
        }
    }
    let run = |parallelism: usize| {
        let env = Env::new()
            .parallelism(parallelism)
            .checkpoints(CheckpointConfig::new(dir.path()).interval(Duration::from_millis(100)));
        let source = KafkaSource::new(broker(), [topic.clone()])
            .watermarks(0, None)
            .deserializer(|r| {
                let key = String::from_utf8_lossy(r.key.unwrap_or_default()).into_owned();
                Ok((key, r.timestamp.ok_or("no timestamp")?))
            });
        let (tx, rx) = mpsc::channel::<(String, i64)>();
        env.source("kafka", source.factory())
            .uid("kafka")
            .key_by(|(k, _): &(String, i64)| k.clone())
            .process(|| Timer)
            .uid("timers")
            .for_each(move || {
                let tx = tx.clone();
                move |v, _ts| {
                    let _ = tx.send(v);
                    Ok(())
                }
            });
        (env.execute_async("event-time").unwrap(), rx)
    };
    let deadline = Duration::from_secs(60);

    // The first run reads all 40 records at parallelism 2, then stops with a savepoint.
    let (job, rx) = run(2);
    let mut records = 0;
    while records < 40 {
        let (k, _) = rx.recv_timeout(deadline).expect("the first run stalled");
        if !k.starts_with("timer") {
            records += 1;
        }
    }
    job.stop_with_savepoint();
    let result = join_within(job, deadline).expect("the first run failed");
    assert!(result.stopped_with_savepoint);

    // Resumed at parallelism 1: a record on partition 0 at base + 3000 moves partition 0's
    // watermark to base + 2999; partition 1 stands at base + 6899 (restored), so the
    // source's watermark becomes base + 2999, and the timers of "a" still pending from the
    // first run (base + 1900 to base + 2400; its watermark had reached base + 1899) fire
    // while the job runs. Those of "b" (base + 5500 and later) do not.
    let (job, rx) = run(1);
    produce_at(&topic, &[(0, "a", base + 3_000)]);
    let want: Vec<(String, i64)> = (19..=24)
        .map(|i| ("timer a".to_string(), base + i * 100))
        .collect();
    let mut fired = Vec::new();
    while fired.len() < want.len() {
        match rx.recv_timeout(deadline) {
            Ok(v) if v.0.starts_with("timer") => fired.push(v),
            Ok(_) => continue,
            Err(_) => panic!(
                "after the restore only {fired:?} fired within {deadline:?}: partition 1's event time was not restored"
            ),
        }
    }
    job.cancel();
    let _ = join_within(job, deadline);
    assert_eq!(fired, want);
}
