//! A checkpoint whose files verify but whose state does not restore (RocksDB does not open
//! them: a checkpoint written wrong, or damaged before its checksums were taken) is not
//! restored again and again. Tried as an operator would meet it: an explicit restore of it
//! fails at once naming it; a plain restart falls back to the checkpoint before it, where
//! the file sink refuses to write the newer checkpoint's committed output twice, and once
//! that output is moved away the sums are exact; and a damaged local copy (local recovery)
//! of a sound checkpoint is fetched again from checkpoint storage instead of costing the
//! checkpoint.

use crate::harness::{Scenario, latest_checkpoint, line_of, wait_for};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use weir_checkpoint::Manifest;

/// The checkpoint the fail point kills the process after.
const NEWEST: u64 = 4;

fn scenario(seed: u64) -> Scenario {
    let mut s = Scenario::new(30_000, 40, seed);
    s.extra_args = ["--state", "rocksdb"].map(String::from).to_vec();
    s
}

/// What the log says when the restart strategy restarts the job.
const RESTARTING: &str = "restarting from the last complete checkpoint";

/// Runs file_sum (its working directory, where local recovery keeps its copies, under
/// `tmp`) until the fail point SIGKILLs it right after checkpoint [`NEWEST`]'s `_metadata`
/// is written: the checkpoint is complete, and its output not yet committed.
fn killed_at_newest(s: &Scenario, tmp: &Path) {
    let out = s
        .command(1, Some(10_000), 20)
        .env("TMPDIR", tmp)
        .env(
            "WEIR_FAILPOINTS",
            format!("checkpoint.after_metadata={NEWEST}*kill"),
        )
        .output()
        .expect("run file_sum");
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(9), "{log}");
    assert_eq!(latest_checkpoint(&s.checkpoints), Some(NEWEST), "{log}");
}

/// Runs file_sum (working directory under `tmp`) and SIGKILLs it once it has written
/// `checkpoints` complete checkpoints; the newest one's id.
fn killed_after(s: &Scenario, tmp: &Path, checkpoints: u64) -> u64 {
    let mut child = s
        .command(1, Some(10_000), 20)
        .env("TMPDIR", tmp)
        .spawn()
        .expect("start file_sum");
    wait_for("checkpoints", Duration::from_secs(60), || {
        latest_checkpoint(&s.checkpoints).is_some_and(|id| id >= checkpoints)
    });
    child.kill().expect("SIGKILL file_sum");
    child.wait().expect("reap file_sum");
    latest_checkpoint(&s.checkpoints).expect("a checkpoint")
}

/// Runs file_sum again with `args` and `tmp` as its working directory; its exit status and
/// standard error. A run that has not ended within two minutes is killed and fails the
/// test (a checkpoint restored again and again never ends).
fn resume(s: &Scenario, tmp: &Path, args: &[&str]) -> (std::process::ExitStatus, String) {
    let log = tempfile::NamedTempFile::new().expect("log file");
    let mut child = s
        .command(1, Some(10_000), 20)
        .env("TMPDIR", tmp)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(log.reopen().expect("log handle"))
        .spawn()
        .expect("resume file_sum");
    let status = weir_tests::try_wait_within(&mut child, Duration::from_secs(120));
    let text = std::fs::read_to_string(log.path()).unwrap_or_default();
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("file_sum {args:?} did not end within 2 minutes:\n{text}");
    };
    (status, text)
}

fn chk(s: &Scenario, id: u64) -> PathBuf {
    s.checkpoints.join(format!("chk-{id:020}"))
}

/// Replaces `file` with as many bytes of other contents (every bit flipped), through a new
/// file renamed over it: the stored file and the copies local recovery keeps may be hard
/// links of one another, and only this one is to change. Returns the new CRC-32.
fn garble(file: &Path) -> u32 {
    let bytes: Vec<u8> = std::fs::read(file)
        .expect("read the file")
        .iter()
        .map(|b| !b)
        .collect();
    let new = file.with_extension("garbled");
    std::fs::write(&new, &bytes).expect("write the garbled copy");
    std::fs::rename(&new, file).expect("put it in place");
    crc32fast::hash(&bytes)
}

/// Writes `manifest` as checkpoint `dir`'s `_metadata`, sealed with its own checksum as
/// weir writes it: a checkpoint whose every file verifies.
fn seal(manifest: &Manifest, dir: &Path) {
    let body = serde_json::to_vec_pretty(manifest).expect("encode the manifest");
    let rest = body.strip_prefix(b"{\n".as_slice()).expect("a JSON object");
    let mut out = format!("{{\n  \"metadata_crc32\": {},\n", crc32fast::hash(&body)).into_bytes();
    out.extend_from_slice(rest);
    std::fs::write(dir.join("_metadata"), out).expect("write _metadata");
}

/// Garbles RocksDB's own manifest (the `MANIFEST-…` file of the summing operator's
/// instance) in checkpoint `id` and records the new checksum, as a checkpoint written
/// wrong would be: every file verifies, and RocksDB does not open them.
fn write_wrong(s: &Scenario, id: u64) {
    let dir = chk(s, id);
    let mut manifest = Manifest::read(&dir.join("_metadata")).expect("read _metadata");
    let entry = manifest
        .operators
        .iter_mut()
        .flat_map(|o| o.subtasks.iter_mut())
        .flat_map(|st| st.files.iter_mut())
        .find(|f| f.name.contains("MANIFEST-"))
        .expect("checkpoint holds a RocksDB MANIFEST file");
    let file = if entry.shared {
        s.checkpoints.join("shared").join(&entry.name)
    } else {
        dir.join(&entry.name)
    };
    entry.crc32 = garble(&file);
    seal(&manifest, &dir);
}

/// The line of `log` saying that checkpoint `id` at `path` did not open in RocksDB and that
/// the job restores the one before it.
fn fell_back_from(log: &str, id: u64, path: &str) -> usize {
    let failed = line_of(log, &format!("checkpoint {id} ({path}) cannot be restored"));
    assert!(
        log.lines()
            .nth(failed)
            .is_some_and(|l| l.contains("RocksDB open")
                && l.contains("restoring the newest checkpoint before it")),
        "{log}"
    );
    failed
}

#[test]
fn a_checkpoint_whose_state_does_not_restore_is_not_restored_again() {
    let s = scenario(311);
    let tmp = tempfile::tempdir().expect("working directory");
    let newest = killed_after(&s, tmp.path(), NEWEST);
    write_wrong(&s, newest);
    // Restarted on another machine: no local copy to recover from.
    std::fs::remove_dir_all(tmp.path().join("weir-rocksdb")).expect("remove the local copies");
    let path = chk(&s, newest);
    let path = path.to_str().expect("path");

    // Restoring that checkpoint explicitly fails at once, naming it.
    let (status, log) = resume(&s, tmp.path(), &["--from-savepoint", path]);
    assert!(!status.success(), "{log}");
    // The error the run ends with (a backtrace may follow it).
    let error = log
        .lines()
        .skip(line_of(&log, "Caused by:") + 1)
        .find(|l| !l.trim().is_empty())
        .unwrap_or_else(|| panic!("no error after \"Caused by:\":\n{log}"));
    for says in [
        format!("checkpoint {newest} ({path}) cannot be restored"),
        "RocksDB open".to_string(),
        "Corruption".to_string(),
        "Restoring it again would fail the same way".to_string(),
    ] {
        assert!(
            error.contains(&says),
            "the error does not say {says:?}:\n{log}"
        );
    }
    assert!(!log.contains(RESTARTING), "{log}");

    // A plain restart falls back to the checkpoint before it. The crash came after the
    // newest checkpoint's output was committed, so replaying from the one before would
    // write it twice: the file sink refuses, and the job fails at once, saying so.
    let (status, log) = resume(&s, tmp.path(), &[]);
    assert!(!status.success(), "{log}");
    let first = line_of(&log, &format!("resuming from checkpoint {newest} "));
    let failed = fell_back_from(&log, newest, path);
    let skipped = line_of(&log, &format!("skipping checkpoint {path}"));
    let again = line_of(&log, &format!("resuming from checkpoint {} ", newest - 1));
    let refused = line_of(&log, "holds committed output newer than the checkpoint");
    assert!(
        first < failed && failed < skipped && skipped < again && again < refused,
        "{log}"
    );
    assert!(!log.contains(RESTARTING), "{log}");

    // The operator accepts that the newest checkpoint's output is produced again, moves it
    // away and resumes from the checkpoint before (a new run would try the newest first
    // again): every sum is there exactly once.
    s.move_output_from(newest);
    let before = chk(&s, newest - 1);
    let before = before.to_str().expect("path");
    let (status, log) = resume(&s, tmp.path(), &["--from-savepoint", before]);
    assert!(status.success(), "{log}");
    line_of(&log, &format!("resuming from checkpoint {} ", newest - 1));
    s.check();
}

#[test]
fn a_damaged_local_copy_is_fetched_again_from_checkpoint_storage() {
    let s = scenario(312);
    let tmp = tempfile::tempdir().expect("working directory");
    killed_at_newest(&s, tmp.path());
    // The copy local recovery kept of checkpoint 4 is damaged in place (same sizes); the
    // stored checkpoint is sound.
    let stored = Manifest::read(&chk(&s, NEWEST).join("_metadata")).expect("read _metadata");
    let local_manifests: Vec<PathBuf> = std::fs::read_dir(tmp.path().join("weir-rocksdb"))
        .expect("local copies")
        .flatten()
        .flat_map(|inst| {
            std::fs::read_dir(inst.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .filter(|copy| copy.file_name().to_string_lossy().starts_with("chk-"))
        .flat_map(|copy| {
            std::fs::read_dir(copy.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|f| f.path())
        .filter(|f| {
            f.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("MANIFEST-"))
        })
        .filter(|f| {
            let local = f
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            stored.files().any(|e| e.name.ends_with(&local))
        })
        .collect();
    assert!(
        !local_manifests.is_empty(),
        "no local copy of checkpoint {NEWEST}"
    );
    for f in &local_manifests {
        garble(f);
    }

    let (status, log) = resume(&s, tmp.path(), &[]);
    assert!(status.success(), "{log}");
    let local = line_of(&log, "restoring from the local copy of the checkpoint");
    let failed = line_of(&log, "the local copy kept for local recovery");
    let again = log
        .lines()
        .enumerate()
        .skip(failed + 1)
        .find(|(_, l)| l.contains(&format!("resuming from checkpoint {NEWEST} ")))
        .map(|(i, _)| i)
        .unwrap_or_else(|| panic!("checkpoint {NEWEST} was not restored again:\n{log}"));
    assert!(local < failed && failed < again, "{log}");
    assert!(!log.contains("skipping checkpoint"), "{log}");
    assert!(log.contains(RESTARTING), "{log}");
    s.check();
}

#[test]
fn a_cluster_does_not_restore_again_a_checkpoint_whose_state_does_not_restore() {
    use super::cluster::{Cluster, Processes, expect_success, read, wait_checkpoint_after};
    use super::cluster_restore::join_workers;
    let s = scenario(313);
    let mut cl = Cluster::new(&s);
    cl.workers = 2;
    // Each worker's working directory (RocksDB instances, local copies) on a "machine".
    let machine = |i: usize| s._dir.path().join(format!("machine-{i}"));
    // Starts a coordinator (with `args`) and two workers on machines `first` and the next.
    let mut cluster = |args: &[&str], first: usize| {
        let coordinator = cl.coordinator_env(args, &[]);
        let log = coordinator.1.clone();
        let mut procs = Processes(vec![coordinator]);
        procs.0.extend(join_workers(
            &mut cl,
            &log,
            &[machine(first), machine(first + 1)],
        ));
        procs
    };

    // The whole cluster crashes once it has written three checkpoints.
    let mut procs = cluster(&[], 1);
    wait_checkpoint_after(&s, 3);
    for (child, _) in &mut procs.0 {
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }
    let newest = latest_checkpoint(&s.checkpoints).expect("a checkpoint");
    write_wrong(&s, newest);
    let path = chk(&s, newest);
    let path = path.to_str().expect("path");

    // Started again on other machines, the worker whose instance does not open reports it,
    // and the coordinator falls back to the checkpoint before, where the file sink refuses
    // to write the newest checkpoint's committed output twice: the job ends, not retried.
    let mut procs = cluster(&[], 3);
    let (coord, coord_log) = &mut procs.0[0];
    let status = weir_tests::wait_within(coord, Duration::from_secs(120));
    let log = read(coord_log);
    assert!(!status.success(), "{log}");
    let failed = fell_back_from(&log, newest, path);
    let again = line_of(&log, &format!("resuming from checkpoint {} ", newest - 1));
    let refused = line_of(&log, "holds committed output newer than the checkpoint");
    assert!(failed < again && again < refused, "{log}");
    assert!(!log.contains(RESTARTING), "{log}");
    for (w, _) in &mut procs.0[1..] {
        weir_tests::wait_within(w, Duration::from_secs(60));
    }

    // With that output moved away, the cluster resumes from the checkpoint before and
    // every sum is there exactly once.
    s.move_output_from(newest);
    let before = chk(&s, newest - 1);
    let mut procs = cluster(&["--from-savepoint", before.to_str().expect("path")], 5);
    for ((child, log), what) in procs
        .0
        .iter_mut()
        .zip(["the coordinator", "a worker", "a worker"])
    {
        expect_success(child, log, what);
    }
    s.check();
}
