//! Bad input, bad configuration and an unreachable broker: clear errors, nothing lost.

use crate::support::*;
use rdkafka::producer::Producer;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use weir::prelude::*;
use weir_kafka::KafkaSink;

/// How long a kafka_sum run that is expected to fail may take (it makes its 3 restart
/// attempts first).
const FAIL_LIMIT: Duration = Duration::from_secs(90);

/// Asserts that every key's committed sums are a prefix (possibly empty) of its expected
/// sums, and that no other key was committed.
fn assert_committed_prefix(
    expected: &BTreeMap<String, Vec<i64>>,
    got: &BTreeMap<String, Vec<i64>>,
) {
    for (k, have) in got {
        let want = expected
            .get(k)
            .unwrap_or_else(|| panic!("key {k} was committed but is not before the bad record"));
        assert!(
            have.len() <= want.len() && have[..] == want[..have.len()],
            "key {k}: committed {have:?} is not a prefix of the sums before the bad record {want:?}"
        );
    }
}

/// Starts kafka_sum --bounded on a 1-partition topic whose record at offset `good.len()` is
/// `bad`, with good records before and after it.
fn start_on_malformed(
    bad: (Option<&[u8]>, Option<&[u8]>),
    seed: u64,
) -> (
    String,
    String,
    Vec<(String, i64)>,
    Running,
    tempfile::TempDir,
) {
    let input = unique("in-bad");
    let output = unique("out-bad");
    create_topic(&input, 1);
    create_topic(&output, 2);
    let before = random_input(200, 5, seed);
    let after = random_input(100, 5, seed + 1);
    produce(&input, &before);
    produce_raw(&input, &[bad]);
    produce(&input, &after);
    let ck = tempfile::tempdir().unwrap();
    let run = Running::start(kafka_sum(&input, &output, ck.path()).args([
        "--bounded",
        "--checkpoint-interval-ms",
        "50",
    ]));
    (input, output, before, run, ck)
}

/// A record whose value is not a number, and a record without a key, each fail kafka_sum
/// with the topic, partition, offset and what is wrong; nothing from the bad record on is
/// committed.
#[test]
fn a_malformed_record_fails_kafka_sum_naming_topic_partition_and_offset() {
    let started = Instant::now();
    let (in_value, out_value, before_value, run_value, _ck1) =
        start_on_malformed((Some(b"key-1"), Some(b"abc")), 31);
    let (in_key, out_key, before_key, run_key, _ck2) = start_on_malformed((None, Some(b"5")), 41);
    let (status_value, err_value) = run_value.wait_within(FAIL_LIMIT);
    let (status_key, err_key) = run_key.wait_within(FAIL_LIMIT);
    eprintln!(
        "both malformed-record runs ended after {:?}",
        started.elapsed()
    );

    assert!(
        !status_value.success(),
        "kafka_sum accepted the value \"abc\":\n{err_value}"
    );
    let want = format!(
        "record {in_value}/0 at offset 200 could not be deserialized: the value \"abc\" is not \
         an i64: invalid digit found in string"
    );
    assert!(
        err_value.contains(&want),
        "stderr lacks {want:?}:\n{err_value}"
    );
    assert_committed_prefix(&prefix_sums(&before_value), &committed_sums(&out_value));

    assert!(
        !status_key.success(),
        "kafka_sum accepted a record without a key:\n{err_key}"
    );
    let want =
        format!("record {in_key}/0 at offset 200 could not be deserialized: the record has no key");
    assert!(err_key.contains(&want), "stderr lacks {want:?}:\n{err_key}");
    assert_committed_prefix(&prefix_sums(&before_key), &committed_sums(&out_key));
}

/// A dead letter as read back: key, value, headers.
type DeadLetter = (Option<Vec<u8>>, Option<Vec<u8>>, Vec<(String, Vec<u8>)>);

/// With a dead-letter topic, malformed records land there with their original key and
/// value and headers naming the error, topic, partition and offset; every good record is
/// summed exactly once.
#[test]
fn malformed_records_go_to_the_dead_letter_topic_with_their_origin() {
    let input = unique("in-dlq");
    let output = unique("out-dlq");
    let dlq = unique("dlq");
    create_topic(&input, 3);
    create_topic(&output, 2);
    create_topic(&dlq, 1);
    let before = random_input(300, 10, 51);
    let after = random_input(300, 10, 52);
    produce(&input, &before);
    produce_raw(
        &input,
        &[
            (Some(b"key-1"), Some(b"abc")),
            (None, Some(b"5")),
            (Some(b"key-2"), None),
        ],
    );
    produce(&input, &after);
    let good: Vec<(String, i64)> = before.iter().chain(&after).cloned().collect();

    // Where the bad records are, read back with an independent consumer.
    let bad: Vec<Read> = read_all(&input, "read_uncommitted")
        .into_iter()
        .filter(|r| r.key.is_none() || r.value.is_none() || r.value.as_deref() == Some(b"abc"))
        .collect();
    assert_eq!(
        bad.len(),
        3,
        "the three bad records are in the input: {bad:?}"
    );
    let error_of = |r: &Read| -> &'static str {
        if r.value.as_deref() == Some(b"abc") {
            "the value \"abc\" is not an i64: invalid digit found in string"
        } else if r.key.is_none() {
            "the record has no key"
        } else {
            "the record has no value"
        }
    };
    let mut expected: Vec<DeadLetter> = bad
        .iter()
        .map(|r| {
            (
                r.key.clone(),
                r.value.clone(),
                vec![
                    ("weir.error".to_string(), error_of(r).as_bytes().to_vec()),
                    ("weir.topic".to_string(), input.as_bytes().to_vec()),
                    (
                        "weir.partition".to_string(),
                        r.partition.to_string().into_bytes(),
                    ),
                    ("weir.offset".to_string(), r.offset.to_string().into_bytes()),
                ],
            )
        })
        .collect();
    expected.sort();

    let ck = tempfile::tempdir().unwrap();
    let (status, err) = Running::start(kafka_sum(&input, &output, ck.path()).args([
        "--bounded",
        "--parallelism",
        "2",
        "--checkpoint-interval-ms",
        "100",
        "--dead-letter-topic",
        &dlq,
    ]))
    .wait_within(Duration::from_secs(60));
    assert!(status.success(), "kafka_sum failed:\n{err}");
    assert_exactly_once(&prefix_sums(&good), &committed_sums(&output));

    let mut got: Vec<DeadLetter> = read_all(&dlq, "read_committed")
        .into_iter()
        .map(|r| (r.key, r.value, r.headers))
        .collect();
    got.sort();
    assert_eq!(
        got, expected,
        "the dead-letter topic holds exactly the bad records"
    );
}

/// A broker address where nothing listens: kafka_sum fails saying the brokers did not
/// answer. Each attempt waits 10 s for the broker; with `--max-restarts 3` the job restarts
/// 3 times (about 100 ms, 200 ms and 400 ms apart) before it gives up, so it exits within
/// 75 s and says which strategy gave up.
#[test]
fn an_unreachable_broker_fails_kafka_sum_with_a_clear_message() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let address = format!("127.0.0.1:{port}");
    let want = format!("Kafka brokers {address} did not answer");
    let ck = tempfile::tempdir().unwrap();
    // The later --brokers wins.
    let mut run = Running::start(kafka_sum("in", "out", ck.path()).args([
        "--bounded",
        "--max-restarts",
        "3",
        "--brokers",
        &address,
    ]));
    let limit = Duration::from_secs(75);
    while run.is_running() && run.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(50));
    }
    let first_report = run.seen(&want);
    if run.is_running() {
        let err = run.kill();
        panic!(
            "kafka_sum was still running {limit:?} after it started against an unreachable \
             broker (first report of the problem after {first_report:?}); its stderr:\n{err}"
        );
    }
    let took = run.elapsed();
    let (status, err) = run.wait_within(Duration::from_secs(5));
    eprintln!(
        "kafka_sum against {address}: first report after {first_report:?}, exit after {took:?}"
    );
    assert!(
        !status.success(),
        "kafka_sum succeeded without a broker:\n{err}"
    );
    assert!(err.contains(&want), "stderr lacks {want:?}:\n{err}");
    let gave_up =
        "not restarting: the exponential-delay strategy allows at most 3 restarts in a row";
    assert!(err.contains(gave_up), "stderr lacks {gave_up:?}:\n{err}");
}

/// A missing input topic and a missing output topic are named in the error, and the
/// output topic is not created behind the user's back.
#[test]
fn missing_topics_are_named() {
    let missing_in = unique("in-missing");
    let output = unique("out-present");
    create_topic(&output, 1);
    let input = unique("in-present");
    let missing_out = unique("out-missing");
    create_topic(&input, 1);
    produce(&input, &random_input(10, 2, 61));
    let ck1 = tempfile::tempdir().unwrap();
    let ck2 = tempfile::tempdir().unwrap();
    let run_in = Running::start(kafka_sum(&missing_in, &output, ck1.path()).arg("--bounded"));
    let run_out = Running::start(kafka_sum(&input, &missing_out, ck2.path()).arg("--bounded"));
    let (status_in, err_in) = run_in.wait_within(FAIL_LIMIT);
    let (status_out, err_out) = run_out.wait_within(FAIL_LIMIT);

    assert!(
        !status_in.success(),
        "kafka_sum ran without its input topic:\n{err_in}"
    );
    let want = format!("topic '{missing_in}' does not exist on {}", broker());
    assert!(err_in.contains(&want), "stderr lacks {want:?}:\n{err_in}");

    assert!(
        !status_out.success(),
        "kafka_sum ran without its output topic:\n{err_out}"
    );
    let want = format!("topic '{missing_out}' does not exist on {}", broker());
    assert!(err_out.contains(&want), "stderr lacks {want:?}:\n{err_out}");
    assert!(
        !weir_kafka::admin::topic_exists(broker(), &missing_out).unwrap(),
        "the missing output topic was created"
    );
}

/// transaction.timeout.ms above the broker's transaction.max.timeout.ms, and below the
/// checkpoint interval plus timeout: both refused with the values involved.
#[test]
fn transaction_timeouts_out_of_range_are_refused_with_the_values() {
    let max: u64 = weir_kafka::admin::broker_setting(broker(), "transaction.max.timeout.ms")
        .unwrap()
        .expect("the broker reports transaction.max.timeout.ms")
        .parse()
        .unwrap();
    if std::env::var_os("WEIR_KAFKA_BROKERS").is_none() {
        assert_eq!(max, TXN_MAX_TIMEOUT_MS);
    }
    let too_long = max + 100_000;
    let input = unique("in-txn");
    let output = unique("out-txn");
    create_topic(&input, 1);
    create_topic(&output, 1);
    let records = random_input(10, 2, 71);
    produce(&input, &records);
    let ck1 = tempfile::tempdir().unwrap();
    let ck2 = tempfile::tempdir().unwrap();
    let long = Running::start(kafka_sum(&input, &output, ck1.path()).args([
        "--bounded",
        "--transaction-timeout-ms",
        &too_long.to_string(),
    ]));
    let short = Running::start(kafka_sum(&input, &output, ck2.path()).args([
        "--bounded",
        "--transaction-timeout-ms",
        "5000",
        "--checkpoint-interval-ms",
        "1000",
        "--checkpoint-timeout-ms",
        "30000",
    ]));
    let (status, err) = long.wait_within(FAIL_LIMIT);
    assert!(
        !status.success(),
        "kafka_sum accepted transaction.timeout.ms {too_long}:\n{err}"
    );
    let want = format!(
        "transaction.timeout.ms ({too_long} ms) exceeds the broker's transaction.max.timeout.ms \
         ({max} ms)"
    );
    assert!(err.contains(&want), "stderr lacks {want:?}:\n{err}");

    let (status, err) = short.wait_within(FAIL_LIMIT);
    assert!(
        !status.success(),
        "kafka_sum accepted transaction.timeout.ms 5000:\n{err}"
    );
    let want = "transaction.timeout.ms (5000 ms) is shorter than the checkpoint interval plus \
                the checkpoint timeout (1000 ms + 30000 ms)";
    assert!(err.contains(want), "stderr lacks {want:?}:\n{err}");
    assert!(
        read_all(&output, "read_uncommitted").is_empty(),
        "output was written"
    );
}

/// The checkpoint id a commit marker names.
fn marker_epoch(r: &Read) -> u64 {
    weir_kafka::txn::MarkerValue::parse(r.value.as_deref().unwrap_or_default())
        .unwrap_or_else(|| panic!("not a commit marker: {:?}", r.value_str()))
        .epoch()
}

/// Runs a one-record job into `sink` in-process and returns its error.
fn run_into(sink: KafkaSink<(String, i64)>) -> weir::Error {
    let env = Env::new().parallelism(1);
    env.from_collection(vec![("a".to_string(), 1i64)])
        .sink("kafka-out", sink.factory());
    match env.execute("bad-sink") {
        Ok(r) => panic!("the job should have failed: {r:?}"),
        Err(e) => e,
    }
}

/// acks=1 and a sink without a serializer are refused at open, with what to change.
#[test]
fn a_sink_with_acks_1_or_without_serializer_is_refused() {
    let output = unique("out-cfg");
    create_topic(&output, 1);
    let serializer =
        |(k, v): &(String, i64)| (Some(k.as_bytes().to_vec()), v.to_string().into_bytes());

    let e = run_into(
        KafkaSink::new(broker(), &output, &unique("acks"))
            .serializer(serializer)
            .set("acks", "1"),
    )
    .to_string();
    assert!(
        e.contains(
            "the Kafka sink needs acks=all and enable.idempotence=true and sets transactional.id \
             itself; remove the setting acks=1"
        ),
        "{e}"
    );
    assert!(e.contains("invalid configuration"), "{e}");

    let e = run_into(KafkaSink::new(broker(), &output, &unique("noser"))).to_string();
    assert!(
        e.contains(&format!(
            "the Kafka sink for topic '{output}' has no serializer; call .serializer(...)"
        )),
        "{e}"
    );
    assert!(
        read_all(&output, "read_uncommitted").is_empty(),
        "output was written"
    );
}

fn values(rs: &[Read]) -> Vec<String> {
    rs.iter().map(Read::value_str).collect()
}

fn kv(prefix: &str, n: i64) -> Vec<(String, i64)> {
    (0..n)
        .map(|i| (format!("{prefix}-{i}"), 1000 + i))
        .collect()
}

/// The broker's isolation the sink relies on: records of an aborted transaction are
/// invisible to read_committed readers but in the log.
#[test]
fn aborted_transactions_are_invisible_to_read_committed() {
    let topic = unique("txn-abort");
    create_topic(&topic, 1);
    let p = txn_producer(&unique("abort-id"));
    p.begin_transaction().unwrap();
    send_all(&p, &topic, &kv("committed", 3));
    p.commit_transaction(Duration::from_secs(30)).unwrap();
    p.begin_transaction().unwrap();
    send_all(&p, &topic, &kv("aborted", 4));
    p.abort_transaction(Duration::from_secs(30)).unwrap();

    assert_eq!(
        values(&read_all(&topic, "read_committed")),
        vec!["1000", "1001", "1002"]
    );
    assert_eq!(
        values(&read_all(&topic, "read_uncommitted")),
        vec!["1000", "1001", "1002", "1000", "1001", "1002", "1003"]
    );
}

/// A zombie: producer A is fenced by B initialising the same transactional.id; A can no
/// longer commit, and what it wrote never becomes visible to read_committed readers.
#[test]
fn a_fenced_producer_cannot_commit_and_its_records_stay_invisible() {
    let topic = unique("txn-fence");
    create_topic(&topic, 1);
    let id = unique("fence-id");
    let a = txn_producer(&id);
    a.begin_transaction().unwrap();
    send_all(&a, &topic, &[("zombie".to_string(), 1)]);
    let b = txn_producer(&id); // fences A and aborts its open transaction
    let late = send_one(&a, &topic, "zombie", "2");
    let commit = a.commit_transaction(Duration::from_secs(30));
    eprintln!("zombie send after fencing: {late:?}; zombie commit: {commit:?}");
    assert!(commit.is_err(), "the fenced producer committed");
    let msg = commit.unwrap_err().to_string().to_lowercase();
    assert!(
        msg.contains("fenced") || msg.contains("epoch"),
        "unexpected error: {msg}"
    );

    b.begin_transaction().unwrap();
    send_all(&b, &topic, &[("live".to_string(), 3)]);
    b.commit_transaction(Duration::from_secs(30)).unwrap();

    let committed = read_all(&topic, "read_committed");
    assert_eq!(
        committed
            .iter()
            .map(|r| (r.key_str(), r.value_str()))
            .collect::<Vec<_>>(),
        vec![("live".to_string(), "3".to_string())]
    );
    let all = read_all(&topic, "read_uncommitted");
    assert!(
        all.iter()
            .any(|r| r.key_str() == "zombie" && r.value_str() == "1"),
        "the zombie's record is in the log: {all:?}"
    );
    assert!(
        !all.iter().any(|r| r.value_str() == "2"),
        "a record sent after fencing reached the log: {all:?}"
    );
}

/// Sends one record and flushes, reporting whether the producer accepted and delivered it.
fn send_one(
    p: &rdkafka::producer::BaseProducer,
    topic: &str,
    key: &str,
    value: &str,
) -> Result<(), String> {
    p.send(
        rdkafka::producer::BaseRecord::to(topic)
            .key(key.as_bytes())
            .payload(value.as_bytes()),
    )
    .map_err(|(e, _)| e.to_string())?;
    p.flush(Duration::from_secs(10)).map_err(|e| e.to_string())
}

/// The newest complete checkpoint is lost after the sink committed its output: the restore
/// from the older checkpoint is refused with an explanation instead of writing that output
/// twice.
#[test]
fn restoring_an_older_checkpoint_after_newer_output_committed_is_refused() {
    let input = unique("in-newer");
    let output = unique("out-newer");
    create_topic(&input, 2);
    create_topic(&output, 2);
    let records = random_input(60_000, 20, 81);
    produce(&input, &records);
    let ck = tempfile::tempdir().unwrap();
    let cmd = || {
        let mut c = kafka_sum(&input, &output, ck.path());
        c.args(["--bounded", "--checkpoint-interval-ms", "100"]);
        c
    };
    let (status, err) = Running::start(&mut cmd()).wait_within(Duration::from_secs(90));
    assert!(status.success(), "kafka_sum failed:\n{err}");
    let expected = prefix_sums(&records);
    assert_exactly_once(&expected, &committed_sums(&output));

    // What the first run left: its complete checkpoints and the newest committed marker.
    let ids = complete_checkpoints(ck.path());
    let kinds: Vec<(u64, String)> = ids
        .iter()
        .map(|id| {
            let m =
                std::fs::read_to_string(checkpoint_path(ck.path(), *id).join("_metadata")).unwrap();
            let kind = ["final", "checkpoint", "savepoint"]
                .into_iter()
                .find(|k| m.contains(&format!("\"kind\": \"{k}\"")))
                .unwrap_or("?");
            (*id, kind.to_string())
        })
        .collect();
    let prefix = format!("{output}-sum");
    let marker_key = weir_kafka::txn::marker_key(&prefix, 0);
    let markers: Vec<u64> = read_all(&format!("weir-markers.{prefix}"), "read_committed")
        .into_iter()
        .filter(|r| r.key_str() == marker_key)
        .map(|r| marker_epoch(&r))
        .collect();
    let newest_committed = *markers.iter().max().expect("the sink committed markers");
    eprintln!(
        "first run: complete checkpoints {kinds:?}; committed markers of subtask 0: {markers:?}"
    );
    let newest = *ids.last().unwrap();
    // Normally the final checkpoint's epoch has output, so deleting the newest checkpoint
    // is enough. When that epoch happens to be empty (the source ended right at a periodic
    // barrier), the final checkpoint wrote no marker and restoring the one before it is
    // legitimately fine: delete down to the newest checkpoint whose output committed.
    assert!(
        newest_committed <= newest,
        "a marker newer than every checkpoint: {markers:?}"
    );
    if newest_committed != newest {
        eprintln!(
            "the newest checkpoint {newest} committed no output; deleting down to checkpoint \
             {newest_committed}"
        );
    }
    for id in ids.iter().filter(|id| **id >= newest_committed) {
        std::fs::remove_dir_all(checkpoint_path(ck.path(), *id)).unwrap();
    }
    let restored = *complete_checkpoints(ck.path())
        .last()
        .expect("an older checkpoint remains");

    let (status, err) = Running::start(&mut cmd()).wait_within(FAIL_LIMIT);
    assert!(
        !status.success(),
        "the restore from checkpoint {restored} was accepted:\n{err}"
    );
    let want = format!(
        "the Kafka sink's commit markers show that subtask 0 already committed the output of \
         checkpoint {newest_committed} (marker weir-markers.{prefix}/0 at offset "
    );
    assert!(err.contains(&want), "stderr lacks {want:?}:\n{err}");
    let want = format!("which checkpoint {restored} being restored does not cover");
    assert!(err.contains(&want), "stderr lacks {want:?}:\n{err}");
    assert_exactly_once(&expected, &committed_sums(&output));
}

/// The job used by [`restoring_a_savepoint_from_before_the_first_output_is_refused`]: copies
/// `input` to `output` (key, value) through an exactly-once sink, unbounded.
fn copy_job(
    input: &str,
    output: &str,
    prefix: &str,
    ck: &std::path::Path,
    from: Option<&std::path::Path>,
) -> Env {
    let mut cfg = CheckpointConfig::new(ck).interval(Duration::from_millis(100));
    cfg.retain = 100;
    cfg.timeout = Duration::from_secs(30);
    cfg.restore_from = from.map(std::path::Path::to_path_buf);
    cfg.restart = weir::RestartStrategy::None;
    let env = Env::new().parallelism(1).checkpoints(cfg);
    let source = weir_kafka::KafkaSource::new(broker(), [input]).deserializer(|r| {
        Ok((
            r.key.unwrap_or_default().to_vec(),
            r.value.unwrap_or_default().to_vec(),
        ))
    });
    let sink = KafkaSink::new(broker(), output, prefix)
        .transaction_timeout(Duration::from_secs(60))
        .serializer(|(k, v): &(Vec<u8>, Vec<u8>)| (Some(k.clone()), v.clone()));
    env.source("kafka-source", source.factory())
        .uid("kafka-source")
        .sink("kafka-sink", sink.factory())
        .uid("kafka-sink");
    env
}

/// The same refusal when the restored snapshot is from before the sink committed anything:
/// a savepoint taken before the first record, restored after output of later checkpoints
/// committed, must not write that output a second time.
#[test]
fn restoring_a_savepoint_from_before_the_first_output_is_refused() {
    use weir_tests::join_within;
    let input = unique("in-early");
    let output = unique("out-early");
    let prefix = unique("early");
    create_topic(&input, 1);
    create_topic(&output, 1);
    let ck = tempfile::tempdir().unwrap();
    let savepoint = || -> Option<std::path::PathBuf> {
        std::fs::read_dir(ck.path())
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("sp-"))
                    && p.join("_metadata").exists()
            })
    };

    // Run 1: a savepoint while the input is still empty, then 100 records copied and
    // committed by later checkpoints.
    let job = copy_job(&input, &output, &prefix, ck.path(), None)
        .execute_async("copy")
        .unwrap();
    job.trigger_savepoint();
    wait_for("the savepoint", Duration::from_secs(30), || {
        assert!(
            !job.is_finished(),
            "the copy job ended before its savepoint"
        );
        savepoint().is_some()
    });
    let sp = savepoint().unwrap();
    let records: Vec<(String, i64)> = (0..100).map(|i| (format!("k{i}"), i)).collect();
    produce(&input, &records);
    wait_for(
        "the copied records to commit",
        Duration::from_secs(30),
        || {
            assert!(
                !job.is_finished(),
                "the copy job ended before committing its output"
            );
            read_all(&output, "read_committed").len() >= 100
        },
    );
    job.cancel();
    assert!(matches!(
        join_within(job, Duration::from_secs(30)),
        Err(weir::Error::Cancelled)
    ));
    assert_eq!(read_all(&output, "read_committed").len(), 100);
    let marker_key = weir_kafka::txn::marker_key(&prefix, 0);
    let newest_committed = read_all(&format!("weir-markers.{prefix}"), "read_committed")
        .into_iter()
        .filter(|r| r.key_str() == marker_key)
        .map(|r| marker_epoch(&r))
        .max()
        .expect("committed markers");
    let sp_meta = std::fs::read_to_string(sp.join("_metadata")).unwrap();
    let sp_id: u64 = sp
        .file_name()
        .unwrap()
        .to_string_lossy()
        .split('-')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    eprintln!(
        "savepoint {sp_id} ({}); newest committed marker {newest_committed}",
        sp.display()
    );
    assert!(
        sp_meta.contains("pending transactions []"),
        "the savepoint holds no output:\n{sp_meta}"
    );

    // Run 2 from the savepoint: it must refuse, not copy the 100 records again.
    let job = copy_job(&input, &output, &prefix, ck.path(), Some(&sp))
        .execute_async("copy")
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !job.is_finished()
        && Instant::now() < deadline
        && read_all(&output, "read_committed").len() <= 100
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    job.cancel();
    let result = join_within(job, Duration::from_secs(30));
    let committed = read_all(&output, "read_committed").len();
    let want = format!(
        "the Kafka sink's commit markers show that subtask 0 already committed the output of \
         checkpoint {newest_committed} (marker weir-markers.{prefix}/0 at offset "
    );
    let want2 = format!("which checkpoint {sp_id} being restored does not cover");
    match result {
        Err(e) if e.to_string().contains(&want) && e.to_string().contains(&want2) => {}
        other => panic!(
            "restoring savepoint {sp_id} (taken before any output) after checkpoint \
             {newest_committed} committed was not refused: {other:?}; the output now holds \
             {committed} records for 100 inputs"
        ),
    }
    assert_eq!(committed, 100);
}
