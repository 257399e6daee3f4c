//! Upgrading weir under a job with state, tried as an operator would: the job was killed
//! with SIGKILL while an earlier release of weir ran it, and this release is started on
//! what that process left behind (its checkpoints, its RocksDB files, its file sinks'
//! pending and in-progress files), at the same parallelism and at another. The committed
//! output must be exactly what the plain-Rust model of the windows says for the whole
//! input: nothing lost before the upgrade, nothing written twice across it.
//!
//! The fixture, `tests/fixtures/earlier-release/late-sessions-d2daa08` (its README says how
//! it was made), was written by `late_sessions` built from commit d2daa08, before state
//! keys became big-endian (decision 0054): its RocksDB instances hold little-endian keys
//! and name no encoding, so a restore must keep reading and writing them that way.

use crate::event_time::{Event, assert_same, model};
use crate::harness::{ExampleRun, committed_lines, latest_checkpoint};
use std::path::Path;
use weir_tests::operator::copy_dir;

/// What the earlier release left behind, as it was after the kill.
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/fixtures/earlier-release/late-sessions-d2daa08"
);

/// The newest complete checkpoint in the fixture: the one a restart resumes from.
const RESUMED_FROM: u64 = 11;

fn parse(text: &str) -> Vec<Event> {
    text.lines()
        .map(|l| {
            let mut p = l.splitn(3, ',');
            let ts = p.next().and_then(|x| x.parse().ok()).expect("ts");
            let key = p.next().expect("key").to_string();
            let value = p.next().and_then(|x| x.parse().ok()).expect("value");
            (ts, key, value)
        })
        .collect()
}

/// Every key encoding the newest complete checkpoint in `ck` names, one per RocksDB
/// instance.
fn key_encodings(ck: &Path) -> Vec<String> {
    let id = latest_checkpoint(ck).expect("a complete checkpoint");
    let dir = ck.join(format!("chk-{id:020}"));
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("checkpoint dir").flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .ends_with("WEIR-KEY-ENCODING")
        {
            found.push(
                std::fs::read_to_string(entry.path())
                    .expect("read encoding")
                    .trim()
                    .to_string(),
            );
        }
    }
    found
}

/// Copies what the earlier release left into a new directory, resumes it at `parallelism`
/// to the end of its input, and checks the committed output against the model.
fn resume_at(parallelism: usize) {
    let fixture = Path::new(FIXTURE);
    let input = std::fs::read_to_string(fixture.join("input.csv")).expect("read input");
    let run = ExampleRun::new(
        "late_sessions",
        env!("CARGO_BIN_EXE_late_sessions"),
        "input.csv",
        &input,
        &["--state", "rocksdb", "--state-cache-entries", "4"],
    );
    copy_dir(&fixture.join("ck"), &run.checkpoints);
    copy_dir(&fixture.join("out"), &run.output);
    assert_eq!(
        latest_checkpoint(&run.checkpoints),
        Some(RESUMED_FROM),
        "the fixture's newest complete checkpoint"
    );
    let log = run.run_to_end(parallelism);
    // It resumed from the earlier release's checkpoint, not from the start of the input.
    assert!(
        log.contains(&format!("resuming from checkpoint {RESUMED_FROM} (")),
        "no restore of checkpoint {RESUMED_FROM} in the log:\n{log}"
    );
    let got = (
        committed_lines(&run.output.join("sessions"), true),
        committed_lines(&run.output.join("late"), true),
    );
    let want = model(&parse(&input));
    assert!(!want.0.is_empty() && !want.1.is_empty());
    assert_same(
        &got,
        &want,
        &format!("resumed at parallelism {parallelism} from the earlier release's checkpoint"),
    );
    // The restored instances kept the earlier release's key encoding.
    let encodings = key_encodings(&run.checkpoints);
    assert_eq!(
        encodings,
        vec!["little-endian".to_string(); parallelism],
        "the key encodings of the resumed job's last checkpoint"
    );
}

#[test]
fn a_job_killed_under_an_earlier_release_resumes_exactly_in_this_one() {
    resume_at(2);
}

#[test]
fn a_job_killed_under_an_earlier_release_resumes_exactly_in_this_one_rescaled() {
    resume_at(3);
}
