//! A job resumed after a crash starts before the checksums of its checkpoint are read
//! (reading a large state whole was most of a restart): tried as an operator would meet it,
//! nothing is committed until they verify, and a checkpoint that turns out corrupt is left
//! for the newest one that verifies, with the sums still exact.

use crate::harness::{Scenario, latest_checkpoint, line_of, wait_for};
use std::path::PathBuf;
use std::time::Duration;
use weir_checkpoint::Manifest;

const LIMIT: Duration = Duration::from_secs(60);

/// A RocksDB-backed scenario killed (SIGKILL) once it has written `checkpoints` complete
/// checkpoints; the newest one's id.
fn killed_after(s: &Scenario, checkpoints: u64) -> u64 {
    let mut child = s
        .command(1, Some(10_000), 20)
        .spawn()
        .expect("start file_sum");
    wait_for("checkpoints", LIMIT, || {
        latest_checkpoint(&s.checkpoints).is_some_and(|id| id >= checkpoints)
    });
    child.kill().expect("SIGKILL file_sum");
    child.wait().expect("reap file_sum");
    latest_checkpoint(&s.checkpoints).expect("a checkpoint")
}

fn rocksdb_scenario(seed: u64) -> Scenario {
    let mut s = Scenario::new(30_000, 40, seed);
    s.extra_args = ["--state", "rocksdb"].map(String::from).to_vec();
    s
}

fn manifest(s: &Scenario, id: u64) -> Manifest {
    Manifest::read(&s.checkpoints.join(format!("chk-{id:020}/_metadata"))).expect("manifest")
}

/// A shared file of checkpoint `id` that no older checkpoint in the directory lists.
fn file_only_in(s: &Scenario, id: u64) -> PathBuf {
    let older: Vec<String> = (1..id)
        .filter(|o| {
            s.checkpoints
                .join(format!("chk-{o:020}/_metadata"))
                .exists()
        })
        .flat_map(|o| {
            manifest(s, o)
                .files()
                .map(|f| f.name.clone())
                .collect::<Vec<_>>()
        })
        .collect();
    let m = manifest(s, id);
    let f = m
        .files()
        .filter(|f| f.shared && f.size > 0 && !older.contains(&f.name))
        .max_by_key(|f| f.size)
        .unwrap_or_else(|| panic!("checkpoint {id} stores no file of its own"));
    s.checkpoints.join("shared").join(&f.name)
}

#[test]
fn a_resumed_job_commits_nothing_before_its_checkpoint_verifies() {
    let s = rocksdb_scenario(301);
    let restored = killed_after(&s, 3);
    // The checksums are read two seconds late; checkpoints every 20 ms meanwhile.
    let out = s
        .command(1, Some(10_000), 20)
        .env("WEIR_FAILPOINTS", "restore.verify=sleep:2000")
        .output()
        .expect("resume file_sum");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let resumed = line_of(&log, &format!("resuming from checkpoint {restored} "));
    let verified = line_of(
        &log,
        &format!("the files of restored checkpoint {restored} verified in"),
    );
    let first_complete = line_of(&log, " complete (");
    // The sink, chained behind the summing operator, restores (committing what the
    // checkpoint pre-committed) only once the files verified.
    assert!(
        resumed < verified && verified < first_complete,
        "a checkpoint completed before the restored one verified:\n{log}"
    );
    s.check();
}

#[test]
fn a_resumed_checkpoint_that_does_not_verify_is_left_for_the_previous_one() {
    let s = rocksdb_scenario(302);
    let newest = killed_after(&s, 4);
    // One byte of a file only the newest checkpoint holds, its size unchanged: only a
    // checksum tells.
    let damaged = file_only_in(&s, newest);
    let mut bytes = std::fs::read(&damaged).expect("read the file");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(&damaged, bytes).expect("damage the file");
    // The operator accepts that the newest checkpoint's output is produced again.
    s.move_output_from(newest);
    let out = s
        .command(1, Some(10_000), 20)
        .env("WEIR_FAILPOINTS", "restore.verify=sleep:1500")
        .output()
        .expect("resume file_sum");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let name = damaged
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let first = line_of(&log, &format!("resuming from checkpoint {newest} "));
    let bad = line_of(&log, &format!("the restored checkpoint {newest} ("));
    assert!(
        log.lines().nth(bad).is_some_and(|l| l.contains(&name)),
        "{log}"
    );
    let skipped = line_of(&log, "skipping corrupt checkpoint");
    let again = line_of(&log, &format!("resuming from checkpoint {} ", newest - 1));
    assert!(first < bad && bad < skipped && skipped < again, "{log}");
    // Nothing was committed from the damaged checkpoint, and every sum is there once.
    s.check();
}
