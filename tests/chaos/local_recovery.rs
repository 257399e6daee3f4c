//! Local recovery of RocksDB state: `file_sum` killed with SIGKILL and restarted on the
//! same machine restores from the copy of its last checkpoint it kept in its working
//! directory, and from checkpoint storage when that copy is gone or no longer matches.

use crate::harness::{Scenario, has_complete_checkpoint, stderr_of, wait_for};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Runs `file_sum` at parallelism 2 (rocksdb, its working directory under `tmp`) until a
/// checkpoint is complete, then SIGKILLs it.
fn run_and_kill(s: &Scenario, tmp: &Path) {
    let mut child = s
        .command(2, Some(2_000), 400)
        .env("TMPDIR", tmp)
        .spawn()
        .expect("start file_sum");
    wait_for("a first checkpoint", Duration::from_secs(60), || {
        has_complete_checkpoint(&s.checkpoints)
    });
    child.kill().expect("SIGKILL file_sum");
    let status = child.wait().expect("reap file_sum");
    assert_eq!(status.signal(), Some(9), "{}", stderr_of(&mut child));
}

/// Restarts `file_sum` at `parallelism` and runs it to the end; its standard error.
fn resume(s: &Scenario, tmp: &Path, parallelism: usize) -> String {
    let out = s
        .command(parallelism, None, 100)
        .env("TMPDIR", tmp)
        .output()
        .expect("start file_sum");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "file_sum failed: {}\n{err}",
        out.status
    );
    err
}

/// The local copies the killed process kept: `chk-*` directories of its RocksDB instances.
fn local_copies(tmp: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for inst in std::fs::read_dir(tmp.join("weir-rocksdb"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for e in std::fs::read_dir(inst.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if e.file_name().to_string_lossy().starts_with("chk-") {
                found.push(e.path());
            }
        }
    }
    found
}

fn scenario() -> (Scenario, PathBuf) {
    let s = Scenario::new(20_000, 200, 11);
    let tmp = s._dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).expect("create TMPDIR");
    (s, tmp)
}

#[test]
fn a_killed_job_restores_from_its_local_copy() {
    let (s, tmp) = scenario();
    run_and_kill(&s, &tmp);
    assert!(
        !local_copies(&tmp).is_empty(),
        "the killed process kept no local copy"
    );
    let err = resume(&s, &tmp, 2);
    assert!(
        err.contains("local_copies=2 fetched_instances=0 fetched_files=0"),
        "the restart did not restore from the local copies:\n{err}"
    );
    s.check();
}

#[test]
fn a_killed_job_rescaled_from_2_to_3_restores_from_its_local_copy() {
    let (s, tmp) = scenario();
    run_and_kill(&s, &tmp);
    let err = resume(&s, &tmp, 3);
    assert!(
        err.contains("local_copies=2 fetched_instances=0 fetched_files=0"),
        "the restart did not restore from the local copies:\n{err}"
    );
    s.check();
}

#[test]
fn a_stale_local_copy_falls_back_to_checkpoint_storage() {
    let (s, tmp) = scenario();
    run_and_kill(&s, &tmp);
    // Every local copy changed after the checkpoint: one of its files has grown.
    let copies = local_copies(&tmp);
    assert!(!copies.is_empty(), "the killed process kept no local copy");
    for dir in &copies {
        let f = std::fs::read_dir(dir)
            .expect("local copy")
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with("MANIFEST"))
            .expect("a RocksDB MANIFEST file in the local copy");
        let mut bytes = std::fs::read(f.path()).expect("read");
        bytes.push(0);
        std::fs::write(f.path(), bytes).expect("write");
    }
    let err = resume(&s, &tmp, 2);
    assert!(
        err.contains("local_copies=0 fetched_instances=2"),
        "the restart did not fall back to checkpoint storage:\n{err}"
    );
    s.check();
}

#[test]
fn a_missing_local_copy_falls_back_to_checkpoint_storage() {
    let (s, tmp) = scenario();
    run_and_kill(&s, &tmp);
    std::fs::remove_dir_all(tmp.join("weir-rocksdb")).expect("remove the working directory");
    let err = resume(&s, &tmp, 2);
    assert!(
        err.contains("local_copies=0 fetched_instances=2"),
        "the restart did not fall back to checkpoint storage:\n{err}"
    );
    s.check();
}
