//! What the checkpoint directory holds after things go wrong in it: a savepoint whose
//! writing fails or whose process dies leaves no `sp-` directory behind, and a changed byte
//! in a checkpoint's `_metadata` is reported and skipped like a damaged state file.

use crate::harness::{Scenario, has_complete_checkpoint, latest_checkpoint, wait_for, wait_within};
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Collects a running child's standard error on a thread, so that a test can wait for a line.
fn capture_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    let mut pipe = child.stderr.take().expect("stderr is piped");
    let log = Arc::new(Mutex::new(String::new()));
    let sink = log.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            sink.lock().expect("stderr log").push_str(&text);
        }
    });
    log
}

/// The `sp-` directories in a checkpoint directory, complete or not.
fn savepoint_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("checkpoint directory")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("sp-"))
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

/// `weir checkpoints list DIR`, which must succeed.
fn weir_list(dir: &Path) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir-cli"))
        .args(["checkpoints", "list"])
        .arg(dir)
        .output()
        .expect("run weir checkpoints list");
    assert!(
        out.status.success(),
        "weir checkpoints list failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 listing")
}

#[test]
fn a_savepoint_that_fails_or_dies_while_written_leaves_no_directory() {
    // 2,000 lines per second per subtask: the input lasts 10 s, well past every step below
    // even on a loaded machine (each run is killed long before its end).
    let s = Scenario::new(40_000, 20, 21);

    // 1. Writing the savepoint fails after its files are written (the fail point panics on
    //    the checkpoint writer thread): the savepoint is aborted, the job goes on.
    let mut child = s
        .command(2, Some(2_000), 50)
        .env("WEIR_FAILPOINTS", "savepoint.before_metadata=panic")
        .spawn()
        .expect("start file_sum");
    let err = capture_stderr(&mut child);
    wait_for("a first checkpoint", Duration::from_secs(30), || {
        has_complete_checkpoint(&s.checkpoints)
    });
    weir_tests::operator::request_savepoint(&s.checkpoints, "savepoint");
    wait_for("the savepoint to fail", Duration::from_secs(30), || {
        err.lock()
            .expect("stderr log")
            .contains("fail point 'savepoint.before_metadata': panic")
    });
    // Checkpoints are written one after the other: one completed after the failure was
    // handled (and the savepoint's directory dealt with).
    let before = latest_checkpoint(&s.checkpoints).expect("a checkpoint");
    wait_for(
        "a checkpoint after the failed savepoint",
        Duration::from_secs(30),
        || latest_checkpoint(&s.checkpoints).is_some_and(|id| id > before),
    );
    assert!(
        child.try_wait().expect("poll file_sum").is_none(),
        "the job must go on after a failed savepoint:\n{}",
        err.lock().expect("stderr log")
    );
    assert_eq!(savepoint_dirs(&s.checkpoints), Vec::<PathBuf>::new());
    let listing = weir_list(&s.checkpoints);
    assert!(!listing.contains("savepoint"), "{listing}");
    child.kill().expect("SIGKILL file_sum");
    child.wait().expect("reap file_sum");

    // 2. The process dies while writing a savepoint: its directory is left incomplete, and
    //    the next run removes it once a newer checkpoint is complete.
    let first_run = latest_checkpoint(&s.checkpoints).expect("a checkpoint");
    let mut child = s
        .command(2, Some(2_000), 50)
        .env("WEIR_FAILPOINTS", "savepoint.before_metadata=kill")
        .spawn()
        .expect("start file_sum");
    wait_for(
        "a checkpoint of the second run",
        Duration::from_secs(30),
        || latest_checkpoint(&s.checkpoints).is_some_and(|id| id > first_run),
    );
    weir_tests::operator::request_savepoint(&s.checkpoints, "savepoint");
    let status = wait_within(&mut child, Duration::from_secs(30));
    assert_eq!(
        status.signal(),
        Some(9),
        "the fail point did not kill file_sum"
    );
    let left = savepoint_dirs(&s.checkpoints);
    assert_eq!(left.len(), 1, "the killed savepoint's directory: {left:?}");
    assert!(!left[0].join("_metadata").exists());
    assert!(weir_list(&s.checkpoints).contains("incomplete"));

    s.run_to_end(2);
    assert_eq!(savepoint_dirs(&s.checkpoints), Vec::<PathBuf>::new());
    let listing = weir_list(&s.checkpoints);
    assert!(
        !listing.contains("savepoint") && !listing.contains("incomplete"),
        "{listing}"
    );
    s.check();
}

#[test]
fn a_changed_byte_in_metadata_is_reported_and_skipped() {
    let s = Scenario::new(5_000, 10, 22);
    let out = s
        .command(1, Some(20_000), 20)
        .output()
        .expect("run file_sum");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.check();
    // Change one digit of the newest checkpoint's creation time: still valid JSON, still
    // consistent with every state file; only the manifest's own checksum tells.
    // Done to every checkpoint from the one that committed the newest output on, so the
    // restore falls back past output already committed.
    let meta = s.damage_from_newest_output(|dir| {
        let meta = dir.join("_metadata");
        let mut bytes = std::fs::read(&meta).expect("read _metadata");
        let field = b"\"created_unix_ms\": ";
        let at = bytes
            .windows(field.len())
            .position(|w| w == field)
            .expect("created_unix_ms in _metadata")
            + field.len();
        bytes[at + 3] ^= 0x01; // a digit stays a digit
        std::fs::write(&meta, bytes).expect("damage _metadata");
        meta
    });
    let out = s.command(1, None, 20).output().expect("rerun file_sum");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("skipping corrupt checkpoint")
            && err.contains(&format!("{}: the file's crc32 is", meta.display())),
        "the damaged _metadata was not reported:\n{err}"
    );
    // As for a damaged state file: the previous checkpoint is older than output already
    // committed, so the job refuses to replay over it, and says why.
    assert!(
        !out.status.success(),
        "restoring an older checkpoint over newer committed output must fail"
    );
    assert!(
        err.contains("newer than the checkpoint being restored"),
        "no explanation:\n{err}"
    );
    s.check();
}
