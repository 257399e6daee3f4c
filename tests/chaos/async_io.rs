//! Async I/O through a crash: `enrich_async` (every line enriched by a call to its own local
//! HTTP service, many calls in flight) runs as a real process, is killed with SIGKILL while
//! calls are in flight and the latest checkpoint holds some of them, and is started again on
//! the same checkpoint directory at another parallelism. Every id must be committed exactly
//! once with the service's answer, and the calls in flight at the checkpoint must have been
//! made again after the restart.

use crate::harness::committed_lines;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use weir_checkpoint::CheckpointStorage;
use weir_tests::wait_for;

/// `lines` input lines `id-<i>,<value>` and the committed lines they must produce.
fn input(dir: &Path, lines: i64) -> (std::path::PathBuf, Vec<String>) {
    let path = dir.join("input.csv");
    let mut text = String::new();
    let mut expected = Vec::new();
    for i in 0..lines {
        let value = i * 7 - 500;
        text.push_str(&format!("id-{i},{value}\n"));
        expected.push(format!("id-{i},{value},{}", 2 * value));
    }
    std::fs::write(&path, text).expect("write input");
    expected.sort();
    (path, expected)
}

fn enrich(dir: &Path, input: &Path, parallelism: usize, extra: &[&str], log: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_enrich_async"));
    c.arg("--input")
        .arg(input)
        .arg("--output")
        .arg(dir.join("out"))
        .arg("--checkpoint-dir")
        .arg(dir.join("ck"))
        .args(["--parallelism", &parallelism.to_string()])
        .args(extra)
        .env("RUST_LOG", "info,enrich_async=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(log)).expect("log file"));
    c
}

/// The ids the service received requests for, in the log `log`.
fn requested(dir: &Path, log: &str) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join(log)).expect("read log");
    text.lines()
        .filter_map(|l| l.split("service request id=").nth(1))
        .map(|id| id.trim().to_string())
        .collect()
}

/// The ids in flight in the latest complete checkpoint's async operator, as its
/// description lists them (`None` before the first complete checkpoint).
fn in_flight_at_latest(ck: &Path) -> Option<(u64, BTreeSet<String>)> {
    let storage = CheckpointStorage::open(ck).ok()?;
    let latest = storage.latest_complete().ok()?.checkpoint?;
    let op = latest
        .manifest
        .operators
        .iter()
        .find(|o| o.uid == "enrich")?;
    let mut ids = BTreeSet::new();
    for st in &op.subtasks {
        let text = st.operator_state.as_ref()?.as_str()?.to_string();
        assert!(
            !text.contains("more)"),
            "every in-flight record is listed: {text}"
        );
        let list = text.split("in flight: ").nth(1)?;
        let records: Vec<(String, i64)> = serde_json::from_str(list).expect("in-flight records");
        ids.extend(records.into_iter().map(|(id, _)| id));
    }
    Some((latest.manifest.checkpoint_id.0, ids))
}

fn check_exactly_once(dir: &Path, expected: &[String]) {
    let got = committed_lines(&dir.join("out"), true);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for l in &got {
        *counts.entry(l.split(',').next().unwrap()).or_default() += 1;
    }
    let repeated: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        repeated.is_empty(),
        "ids committed more than once: {repeated:?}"
    );
    assert_eq!(got.len(), expected.len(), "lines lost");
    assert_eq!(got, expected);
}

#[test]
fn enrich_async_killed_with_calls_in_flight_resumes_exactly_once_at_another_parallelism() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (input, expected) = input(dir.path(), 500);
    // 150 lines a second against 100 ms answers: about 15 calls in flight at any moment,
    // fewer than the 2 × 10 the operators may hold, so checkpoints are not held up by
    // backpressure and each one stores some.
    let slow = [
        "--capacity",
        "10",
        "--service-latency-ms",
        "100",
        "--max-rate",
        "150",
        "--checkpoint-interval-ms",
        "150",
    ];
    let mut first = enrich(dir.path(), &input, 2, &slow, "run1.log")
        .spawn()
        .expect("start enrich_async");
    let ck = dir.path().join("ck");
    wait_for(
        "a checkpoint with calls in flight",
        Duration::from_secs(60),
        || in_flight_at_latest(&ck).is_some_and(|(id, ids)| id >= 2 && !ids.is_empty()),
    );
    first.kill().expect("SIGKILL enrich_async");
    let status = first.wait().expect("wait for the killed run");
    assert!(!status.success(), "the first run was killed, not finished");
    let (checkpoint, in_flight) = in_flight_at_latest(&ck).expect("a complete checkpoint");
    let before = requested(dir.path(), "run1.log");
    assert!(
        before.len() < expected.len(),
        "the kill landed before every line was requested"
    );
    // The calls stored in flight had reached the service before the kill (a call issued
    // a moment before the checkpoint may not have, so not every one is required).
    let before: BTreeSet<String> = before.into_iter().collect();
    let made = in_flight.intersection(&before).count();
    assert!(
        made > 0,
        "calls stored in flight at checkpoint {checkpoint}: {in_flight:?}; none reached the service before the kill"
    );

    let fast = [
        "--capacity",
        "10",
        "--service-latency-ms",
        "20",
        "--checkpoint-interval-ms",
        "150",
    ];
    let status = enrich(dir.path(), &input, 3, &fast, "run2.log")
        .status()
        .expect("run enrich_async again");
    let log2 = std::fs::read_to_string(dir.path().join("run2.log")).unwrap();
    assert!(status.success(), "the resumed run failed:\n{log2}");
    check_exactly_once(dir.path(), &expected);

    // The resumed run issued the stored calls again, and said so.
    let after: BTreeSet<String> = requested(dir.path(), "run2.log").into_iter().collect();
    let missing: Vec<_> = in_flight.difference(&after).collect();
    assert!(
        missing.is_empty(),
        "calls in flight at the checkpoint not made again: {missing:?}"
    );
    let reissued: usize = log2
        .lines()
        .filter_map(|l| l.split("async I/O issues again the ").nth(1))
        .map(|rest| {
            assert!(
                rest.contains(&format!("at checkpoint {checkpoint}")),
                "{rest}"
            );
            rest.split(' ').next().unwrap().parse::<usize>().unwrap()
        })
        .sum();
    assert_eq!(reissued, in_flight.len(), "{log2}");
}

#[test]
fn enrich_async_writes_every_line_once_and_keeps_to_its_capacity() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (input, expected) = input(dir.path(), 300);
    let args = ["--capacity", "5", "--service-latency-ms", "20"];
    let status = enrich(dir.path(), &input, 2, &args, "run.log")
        .status()
        .expect("run enrich_async");
    let log = std::fs::read_to_string(dir.path().join("run.log")).unwrap();
    assert!(status.success(), "{log}");
    check_exactly_once(dir.path(), &expected);
    let requests = requested(dir.path(), "run.log");
    assert_eq!(requests.len(), 300, "one call per line without failures");
    // The service counted the calls it had at once: never more than 2 subtasks × 5.
    let max: usize = log
        .lines()
        .find_map(|l| l.split("at most ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the service's figures are in the log:\n{log}"));
    assert!(
        (1..=10).contains(&max),
        "at most {max} calls in flight at once"
    );
}
