//! The Kafka sink through a job's life, as a user moves the job: a savepoint restored into a
//! new checkpoint directory, a renamed transactional-id prefix, a marker topic deleted and
//! created again, a subtask idle for longer than the markers' retention, a switch to
//! at-least-once with epochs pending, savepoints one after another. Each ends with an
//! independent `read_committed` reader checking that every key's output is exactly its
//! prefix sums (none lost, none twice) and that no transaction stays open. And what the
//! sink refuses at start-up: two sinks with one prefix, a bad `transaction.timeout.ms` given
//! with `set`, exactly-once without checkpoints at parallelism 2.

use crate::support::*;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use weir::prelude::*;
use weir_kafka::KafkaSink;

/// How long one kafka_sum run, or a wait for its output, may take.
const LIMIT: Duration = Duration::from_secs(120);

/// kafka_sum's input (2 partitions, fed in batches) and output (2 partitions), and a
/// directory for checkpoint directories and savepoint copies.
struct Sums {
    input: String,
    output: String,
    records: Vec<(String, i64)>,
    dir: tempfile::TempDir,
    seed: u64,
}

impl Sums {
    fn new(name: &str) -> Sums {
        let input = unique(&format!("{name}-in"));
        let output = unique(&format!("{name}-out"));
        create_topic(&input, 2);
        create_topic(&output, 2);
        Sums {
            input,
            output,
            records: Vec::new(),
            dir: tempfile::tempdir().expect("temp dir"),
            seed: 0,
        }
    }

    /// Appends `n` random records of 20 keys to the input.
    fn feed(&mut self, n: usize) {
        self.seed += 1;
        let batch = random_input(n, 20, self.seed * 7919);
        produce(&self.input, &batch);
        self.records.extend(batch);
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The sink's default transactional-id prefix in [`kafka_sum`].
    fn prefix(&self) -> String {
        format!("{}-sum", self.output)
    }

    fn markers(&self, prefix: &str) -> String {
        format!("weir-markers.{prefix}")
    }

    /// kafka_sum on checkpoint directory `ck` at `parallelism`, checkpoints every 100 ms.
    fn command(&self, ck: &Path, parallelism: usize, extra: &[&str]) -> Command {
        let mut c = kafka_sum(&self.input, &self.output, ck);
        c.args(["--parallelism", &parallelism.to_string()])
            .args(["--checkpoint-interval-ms", "100"])
            .args(extra)
            .env_remove("WEIR_FAILPOINTS");
        c
    }

    /// No transaction stays open on the output or `marker_topics`, and the committed output
    /// is exactly the prefix sums of everything fed.
    fn check(&self, marker_topics: &[String]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let open: Vec<_> = std::iter::once(&self.output)
                .chain(marker_topics)
                .map(|t| (t, open_transactions(t)))
                .filter(|(_, o)| !o.is_empty())
                .collect();
            if open.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "transactions still open after the job ended: {open:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_exactly_once(&prefix_sums(&self.records), &committed_sums(&self.output));
    }
}

/// Runs `cmd` with the fail point `point` set to kill; asserts that it killed the process.
fn kill_at(cmd: &mut Command, point: &str) -> String {
    cmd.env("WEIR_FAILPOINTS", format!("{point}=kill"));
    let (status, err) = Running::start(cmd).wait_within(LIMIT);
    assert!(
        err.contains(&format!("[weir] fail point '{point}': kill")) && status.signal() == Some(9),
        "fail point {point} did not kill kafka_sum ({status}):\n{err}"
    );
    err
}

/// Runs `cmd` to its end (exit 0) and returns its standard error.
fn run_to_end(cmd: &mut Command) -> String {
    let (status, err) = Running::start(cmd).wait_within(LIMIT);
    assert!(status.success(), "kafka_sum failed ({status}):\n{err}");
    err
}

/// Waits until a `read_committed` reader sees at least `n` output records; fails the test if
/// the run ends first.
fn wait_committed(mut run: Running, topic: &str, n: usize) -> Running {
    let deadline = Instant::now() + LIMIT;
    loop {
        let have = read_all(topic, "read_committed").len();
        if have >= n {
            return run;
        }
        if !run.is_running() {
            let (status, err) = run.wait_within(Duration::from_secs(5));
            panic!("kafka_sum ended ({status}) with {have} of {n} records committed:\n{err}");
        }
        assert!(
            Instant::now() < deadline,
            "{have} of {n} records committed after {LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Stops the run on `ck` with a savepoint (`weir savepoint stop`); returns the savepoint.
fn stop_with_savepoint(run: Running, ck: &Path) -> PathBuf {
    request_stop(ck);
    let (status, err) = run.wait_within(LIMIT);
    assert!(
        status.success(),
        "stop-with-savepoint failed ({status}):\n{err}"
    );
    newest_savepoint(ck).unwrap_or_else(|| panic!("no savepoint in {}:\n{err}", ck.display()))
}

/// The scenario on the Kafka side: stopped with a savepoint, the savepoint moved
/// elsewhere and the old checkpoint directory gone, resumed from it into a new checkpoint
/// directory at another parallelism and killed right after its first commit, then restarted
/// on the new directory. Every sum is committed once.
#[test]
fn a_savepoint_resumed_in_a_new_checkpoint_directory_commits_every_sum_once() {
    let mut s = Sums::new("newdir");
    s.feed(10_000);
    let first = s.path("first");
    let run = wait_committed(
        Running::start(&mut s.command(&first, 2, &[])),
        &s.output,
        10_000,
    );
    // More input after a dozen checkpoints: the first run's last commits name checkpoint
    // ids far above those the resumed run will start from in its new directory.
    wait_for("a dozen checkpoints", LIMIT, || {
        complete_checkpoints(&first)
            .last()
            .is_some_and(|n| *n >= 12)
    });
    s.feed(10_000);
    let run = wait_committed(run, &s.output, 20_000);
    let sp = stop_with_savepoint(run, &first);
    let moved = s
        .path("moved")
        .join(sp.file_name().expect("savepoint name"));
    copy_dir(&sp, &moved);
    std::fs::remove_dir_all(&first).expect("remove the first checkpoint directory");
    s.feed(20_000);
    let second = s.path("second");
    let moved = moved.to_string_lossy().into_owned();
    kill_at(
        &mut s.command(&second, 1, &["--from-savepoint", &moved]),
        "kafka.after_commit",
    );
    s.feed(20_000);
    let run = wait_committed(
        Running::start(&mut s.command(&second, 2, &[])),
        &s.output,
        60_000,
    );
    stop_with_savepoint(run, &second);
    s.check(&[s.markers(&s.prefix())]);
}

/// Killed right after committing an epoch that its newest checkpoint still holds as
/// pending, then restarted under another transactional-id prefix: the restore reads the
/// old prefix's markers (the epoch committed: not written again) and fences the old
/// prefix's transactions (none stays open).
#[test]
fn a_renamed_prefix_finishes_the_old_prefixes_transactions_once() {
    let mut s = Sums::new("rename");
    s.feed(30_000);
    let ck = s.path("ck");
    kill_at(&mut s.command(&ck, 2, &["--bounded"]), "kafka.after_commit");
    let renamed = format!("{}-renamed", s.prefix());
    run_to_end(&mut s.command(
        &ck,
        2,
        &["--bounded", "--transactional-id-prefix", &renamed],
    ));
    s.check(&[s.markers(&s.prefix()), s.markers(&renamed)]);
}

/// Killed at `point` (after or before the commit of an epoch the checkpoint holds as
/// pending); the marker topic is deleted and created again; the restart decides from the
/// output's records whether the epoch committed.
fn marker_topic_recreated(point: &str) {
    let mut s = Sums::new("recreated");
    s.feed(30_000);
    let ck = s.path("ck");
    kill_at(&mut s.command(&ck, 2, &["--bounded"]), point);
    let markers = s.markers(&s.prefix());
    delete_topic(&markers);
    create_topic(&markers, 1);
    let err = run_to_end(&mut s.command(&ck, 2, &["--bounded"]));
    assert!(
        err.contains("decided from the output records"),
        "the restore did not fall back to the output:\n{err}"
    );
    s.check(&[markers]);
}

#[test]
fn a_recreated_marker_topic_does_not_write_a_committed_epoch_twice() {
    marker_topic_recreated("kafka.after_commit");
}

#[test]
fn a_recreated_marker_topic_does_not_lose_an_uncommitted_epoch() {
    marker_topic_recreated("kafka.before_commit");
}

/// A job idle after its output committed keeps taking checkpoints with nothing pending;
/// meanwhile retention removes every commit marker. Killed and restarted with new input, it
/// restores (its last marker is gone, but nothing waits on it) and commits every sum once.
#[test]
fn an_idle_subtask_restores_after_its_markers_were_removed() {
    let mut s = Sums::new("idle");
    s.feed(5_000);
    let ck = s.path("ck");
    let run = wait_committed(
        Running::start(&mut s.command(&ck, 1, &[])),
        &s.output,
        5_000,
    );
    // Two checkpoints after the output committed: the newest has nothing pending.
    let seen = complete_checkpoints(&ck).last().copied().unwrap_or(0);
    wait_for("two idle checkpoints", LIMIT, || {
        complete_checkpoints(&ck)
            .last()
            .is_some_and(|n| *n >= seen + 2)
    });
    let markers = s.markers(&s.prefix());
    let start = delete_all_records(&markers, 0);
    assert!(start > 0, "the job wrote no markers");
    let seen = complete_checkpoints(&ck).last().copied().unwrap_or(0);
    wait_for("a checkpoint after the markers were removed", LIMIT, || {
        complete_checkpoints(&ck).last().is_some_and(|n| *n > seen)
    });
    run.kill();
    s.feed(5_000);
    let run = wait_committed(
        Running::start(&mut s.command(&ck, 1, &[])),
        &s.output,
        10_000,
    );
    stop_with_savepoint(run, &ck);
    s.check(&[markers]);
}

/// Killed after a checkpoint completed but before its epoch committed, then restarted
/// at-least-once: the restore first writes the pending epoch again and fences the
/// exactly-once run's transactions, then goes on without transactions.
#[test]
fn switching_to_at_least_once_first_finishes_the_pending_epochs() {
    let mut s = Sums::new("to-alo");
    s.feed(30_000);
    let ck = s.path("ck");
    kill_at(
        &mut s.command(&ck, 2, &["--bounded"]),
        "kafka.before_commit",
    );
    let err = run_to_end(&mut s.command(&ck, 2, &["--bounded", "--at-least-once"]));
    assert!(
        err.contains("re-produced"),
        "the pending epoch was not written again:\n{err}"
    );
    s.check(&[s.markers(&s.prefix())]);
}

// ---------------------------------------------------------------------------------------
// Refused at start-up
// ---------------------------------------------------------------------------------------

fn sink(topic: &str, prefix: &str) -> KafkaSink<(String, i64)> {
    KafkaSink::new(broker(), topic, prefix)
        .transaction_timeout(Duration::from_secs(60))
        .serializer(|(k, v): &(String, i64)| {
            (Some(k.as_bytes().to_vec()), v.to_string().into_bytes())
        })
}

fn records(n: i64) -> Vec<(String, i64)> {
    (0..n).map(|i| (format!("k{}", i % 7), i)).collect()
}

fn run_expecting_failure(env: &Env) -> String {
    match weir_tests::run(env) {
        Ok(r) => panic!("the job should have failed: {r:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn two_sinks_with_one_prefix_are_refused_naming_both() {
    let (a, b) = (unique("two-a"), unique("two-b"));
    create_topic(&a, 1);
    create_topic(&b, 1);
    let prefix = unique("shared");
    let env = Env::new().parallelism(1);
    let s = env.from_collection(records(50));
    s.sink("first", sink(&a, &prefix).factory());
    s.sink("second", sink(&b, &prefix).factory());
    let e = run_expecting_failure(&env);
    assert!(
        e.contains(&format!(
            "two Kafka sinks use the transactional-id prefix '{prefix}' on {}",
            broker()
        )) && e.contains("sink 'first'")
            && e.contains("sink 'second'")
            && e.contains("give each sink its own prefix"),
        "{e}"
    );
    assert!(
        read_all(&a, "read_uncommitted").is_empty(),
        "written to {a}"
    );
    assert!(
        read_all(&b, "read_uncommitted").is_empty(),
        "written to {b}"
    );
}

/// A job with checkpoints every second (30 s timeout) into `sink`.
fn checkpointed_into(sink: KafkaSink<(String, i64)>, ck: &Path) -> Env {
    let mut cfg = CheckpointConfig::new(ck).interval(Duration::from_secs(1));
    cfg.timeout = Duration::from_secs(30);
    let env = Env::new().parallelism(1).checkpoints(cfg);
    env.from_collection(records(10)).sink("out", sink.factory());
    env
}

/// `set("transaction.timeout.ms", ..)` is checked like `transaction_timeout`: too short for
/// the checkpoints, above the broker's maximum, or not a number.
#[test]
fn a_transaction_timeout_given_with_set_is_checked() {
    let out = unique("set-txn");
    create_topic(&out, 1);
    let max: u64 = weir_kafka::admin::broker_setting(broker(), "transaction.max.timeout.ms")
        .unwrap()
        .expect("the broker reports transaction.max.timeout.ms")
        .parse()
        .unwrap();
    let too_long = (max + 100_000).to_string();
    let cases = [
        (
            "5000",
            "transaction.timeout.ms (5000 ms) is shorter than the checkpoint interval plus the \
             checkpoint timeout (1000 ms + 30000 ms)"
                .to_string(),
        ),
        (
            too_long.as_str(),
            format!(
                "transaction.timeout.ms ({too_long} ms) exceeds the broker's \
                 transaction.max.timeout.ms ({max} ms)"
            ),
        ),
        (
            "soon",
            "transaction.timeout.ms must be a whole number of milliseconds, not \"soon\""
                .to_string(),
        ),
    ];
    for (value, want) in cases {
        let ck = tempfile::tempdir().unwrap();
        let s = sink(&out, &unique("set-txn")).set("transaction.timeout.ms", value);
        let e = run_expecting_failure(&checkpointed_into(s, ck.path()));
        assert!(e.contains(&want), "transaction.timeout.ms={value}: {e}");
    }
    assert!(
        read_all(&out, "read_uncommitted").is_empty(),
        "output was written"
    );
}

/// Without checkpoints the exactly-once sink commits each subtask's transaction at the end
/// of input on its own: refused at parallelism 2, one atomic commit at parallelism 1.
#[test]
fn exactly_once_without_checkpoints_needs_a_single_sink_subtask() {
    let out = unique("no-ck");
    create_topic(&out, 2);
    let env = Env::new().parallelism(2);
    env.from_collection(records(100))
        .sink("out", sink(&out, &unique("no-ck")).factory());
    let e = run_expecting_failure(&env);
    assert!(
        e.contains(
            "the exactly-once Kafka sink 'out' runs at parallelism 2 in a job without \
                    checkpoints"
        ) && e.contains("run the sink at parallelism 1"),
        "{e}"
    );
    assert!(read_all(&out, "read_uncommitted").is_empty());

    let env = Env::new().parallelism(2);
    env.from_collection(records(100))
        .sink("out", sink(&out, &unique("no-ck")).factory())
        .parallelism(1);
    weir_tests::run(&env).expect("one sink subtask without checkpoints");
    let mut got: Vec<(String, i64)> = read_all(&out, "read_committed")
        .iter()
        .map(|r| (r.key_str(), r.value_str().parse().unwrap()))
        .collect();
    got.sort();
    let mut want = records(100);
    want.sort();
    assert_eq!(got, want);
}

// ---------------------------------------------------------------------------------------
// Savepoints one after another
// ---------------------------------------------------------------------------------------

/// An intermediate savepoint commits nothing; the next checkpoint's completion commits every
/// epoch up to it. With savepoints one after another, more epochs wait than the pool has
/// producers: the subtask adds producers (up to two more), commits the epochs in order
/// when the checkpoint completes, and fails with an explanation beyond that. Driven by hand,
/// as the runtime would, against the real broker.
#[test]
fn savepoints_in_a_row_grow_the_pool_and_commit_in_order_with_the_next_checkpoint() {
    use weir::ids::CheckpointId;
    use weir::ops::sink::{SinkContext, SinkFunction};
    let out = unique("sp-row");
    create_topic(&out, 1);
    let mut f = sink(&out, &unique("sp-row")).pool_size(2).factory()();
    let ctx = SinkContext {
        subtask: 0,
        parallelism: 1,
        checkpointing: true,
        checkpoint_timing: None,
        name: "out".into(),
        operator_id: "out".into(),
    };
    f.open(&ctx).unwrap();
    let write = |f: &mut weir_kafka::KafkaSinkFunction<(String, i64)>, epoch: u64| {
        for i in 0..3 {
            f.invoke((format!("e{epoch}"), i), weir::time::NO_TIMESTAMP)
                .unwrap_or_else(|e| panic!("{e}"));
        }
    };
    let committed = || -> Vec<String> {
        read_committed_now(&out)
            .iter()
            .map(|r| format!("{}:{}", r.key_str(), r.value_str()))
            .collect()
    };
    let expected = |epochs: std::ops::RangeInclusive<u64>| -> Vec<String> {
        epochs
            .flat_map(|e| (0..3).map(move |i| format!("e{e}:{i}")))
            .collect()
    };
    // The broker writes a commit's markers just after it answers the commit, so the last
    // stable offset can trail the sink's notify by a moment: wait for a commit to show.
    let committed_by_now = |want: Vec<String>| {
        weir_tests::wait_for("the commit to show", Duration::from_secs(30), || {
            committed() == want
        });
    };
    // checkpoint 1, committed
    write(&mut f, 1);
    f.snapshot(CheckpointId(1)).unwrap();
    f.notify_complete(CheckpointId(1)).unwrap();
    committed_by_now(expected(1..=1));
    // savepoints 2 and 3 (never notified), checkpoint 4 in flight, epoch 5 open: 4 producers
    for id in 2..=4 {
        write(&mut f, id);
        f.snapshot(CheckpointId(id)).unwrap();
    }
    write(&mut f, 5);
    assert_eq!(committed(), expected(1..=1));
    f.notify_complete(CheckpointId(4)).unwrap();
    committed_by_now(expected(1..=4));
    // epoch 5 and three savepoints more: the pool (2 + 2) is full
    for id in 5..=8 {
        f.snapshot(CheckpointId(id)).unwrap();
        if id < 8 {
            write(&mut f, id + 1);
        }
    }
    let e = f
        .invoke(("e9".into(), 0), weir::time::NO_TIMESTAMP)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "all 4 transactional producers hold epochs waiting for a checkpoint to \
                    complete ([5, 6, 7, 8])"
        ) && e.contains("savepoints were taken one after another"),
        "{e}"
    );
    assert_eq!(committed(), expected(1..=4));
}
