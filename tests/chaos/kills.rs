//! SIGKILL at random moments, at every named fail point, and across a rescale from a
//! savepoint.

use crate::harness::{
    Rng, Scenario, has_complete_checkpoint, latest_checkpoint, soak_factor, stderr_of, wait_for,
    wait_within,
};
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

/// Kills `file_sum` at `kills` random moments (30–330 ms into each run), restarting it each
/// time, then lets it finish; every kill must land while the job is still running.
fn random_kills(parallelism: usize, seed: u64, extra_args: &[&str]) {
    let mut s = Scenario::new(40_000, 40, seed);
    s.extra_args = extra_args.iter().map(|a| a.to_string()).collect();
    let mut rng = Rng::new(seed ^ 0xC0FFEE);
    let kills = 20 * soak_factor();
    let landed = s
        .kill_at_random_moments(parallelism, kills, (30, 300), &mut rng, &[])
        .len();
    assert!(
        landed >= 20.min(kills),
        "only {landed} of {kills} kills landed while the job was running"
    );
    s.run_to_end(parallelism);
    s.check();
}

#[test]
fn sigkill_at_random_moments_parallelism_1() {
    random_kills(1, 1, &[]);
}

#[test]
fn sigkill_at_random_moments_parallelism_2() {
    random_kills(2, 2, &[]);
}

/// With 4 cache entries per state for 40 keys, RocksDB state is written back and evicted
/// all the time between checkpoints, also while a checkpoint's background write runs.
#[test]
fn sigkill_at_random_moments_with_a_tiny_rocksdb_cache() {
    random_kills(2, 3, &["--state", "rocksdb", "--state-cache-entries", "4"]);
}

const FAIL_POINTS: [&str; 5] = [
    "checkpoint.before_metadata",
    "checkpoint.after_metadata",
    "sink.after_precommit",
    "sink.before_commit",
    "sink.after_commit",
];

#[test]
fn sigkill_at_every_fail_point() {
    let s = Scenario::new(20_000, 20, 3);
    for point in FAIL_POINTS {
        let mut child = s
            .command(2, Some(10_000), 50)
            .env("WEIR_FAILPOINTS", format!("{point}=kill"))
            .spawn()
            .expect("start file_sum");
        let status = wait_within(&mut child, Duration::from_secs(60));
        let err = stderr_of(&mut child);
        assert_eq!(
            status.signal(),
            Some(9),
            "fail point {point} did not kill file_sum ({status}):\n{err}"
        );
        assert!(
            err.contains(&format!("fail point '{point}'")),
            "fail point {point} was not reported:\n{err}"
        );
    }
    s.run_to_end(2);
    s.check();
}

#[test]
fn rescale_from_savepoint_2_to_1_to_3() {
    let s = Scenario::new(30_000, 30, 4);
    // Parallelism 2, stopped with a savepoint once a checkpoint exists. At 2,000 lines per
    // second per subtask the input lasts 7.5 s, so even on a loaded machine the stop
    // request arrives before the end of the input (it is taken at once).
    let mut child = s
        .command(2, Some(2_000), 50)
        .spawn()
        .expect("start file_sum");
    wait_for("a first checkpoint", Duration::from_secs(30), || {
        has_complete_checkpoint(&s.checkpoints)
    });
    weir_tests::operator::request_savepoint(&s.checkpoints, "stop");
    let status = wait_within(&mut child, Duration::from_secs(30));
    let out = child.wait_with_output().expect("file_sum output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        status.success(),
        "stop-with-savepoint failed: {status}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let savepoint = stdout
        .lines()
        .find_map(|l| l.strip_prefix("stopped with savepoint "))
        .unwrap_or_else(|| panic!("no savepoint path in the output: {stdout:?}"))
        .to_string();
    // Parallelism 1 from the savepoint, killed mid-run.
    let mut child = s
        .command(1, Some(10_000), 50)
        .arg("--from-savepoint")
        .arg(&savepoint)
        .spawn()
        .expect("start file_sum");
    let sp_id: u64 = savepoint
        .rsplit('/')
        .next()
        .and_then(|n| n.strip_prefix("sp-"))
        .and_then(|n| n.split('-').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected savepoint path {savepoint}"));
    wait_for(
        "a checkpoint after the savepoint",
        Duration::from_secs(30),
        || latest_checkpoint(&s.checkpoints).is_some_and(|id| id > sp_id),
    );
    child.kill().expect("SIGKILL file_sum");
    child.wait().expect("reap file_sum");
    // Parallelism 3 from the latest checkpoint, to the end.
    s.run_to_end(3);
    s.check();
}

#[test]
fn a_corrupt_checkpoint_is_reported_and_skipped() {
    let s = Scenario::new(5_000, 10, 5);
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
    // Damage a state file of every checkpoint from the one that committed the newest
    // output on, and start again: the restore falls back past output already committed.
    let state = s.damage_from_newest_output(|dir| {
        let file = std::fs::read_dir(dir)
            .expect("checkpoint dir")
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "state"))
            .expect("a state file");
        let mut bytes = std::fs::read(&file).expect("read state file");
        bytes[0] ^= 0xFF;
        std::fs::write(&file, bytes).expect("corrupt state file");
        file
    });
    let out = s.command(1, None, 20).output().expect("rerun file_sum");
    let err = String::from_utf8_lossy(&out.stderr);
    let name = state
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    assert!(
        err.contains("skipping corrupt checkpoint") && err.contains(&name),
        "corruption not reported:\n{err}"
    );
    // The previous checkpoint is older than output already committed: replaying it would
    // duplicate that output, so the job refuses and says why instead of corrupting it.
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

#[test]
fn a_malformed_line_fails_the_job_with_the_line() {
    let s = Scenario::new(100, 5, 6);
    let mut text = std::fs::read_to_string(&s.input).expect("input");
    text.push_str("key-1,not-a-number\n");
    std::fs::write(&s.input, text).expect("write input");
    let out = s.command(1, None, 20).output().expect("run file_sum");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a malformed line must fail the job");
    assert!(
        err.contains("key-1,not-a-number") && err.contains("not an i64"),
        "unclear error:\n{err}"
    );
    assert!(
        err.contains("operator 'parse'"),
        "the error does not name the operator:\n{err}"
    );
}

#[test]
fn a_state_cache_size_needs_the_rocksdb_backend() {
    let mut s = Scenario::new(10, 2, 9);
    for (args, want) in [
        (
            ["--state", "memory", "--state-cache-entries", "4"],
            "--state-cache-entries applies to the rocksdb state backend only, not to `memory`",
        ),
        (
            ["--state", "rocksdb", "--state-cache-entries", "0"],
            "--state-cache-entries must be at least 1",
        ),
    ] {
        s.extra_args = args.iter().map(|a| a.to_string()).collect();
        let out = s.command(1, None, 20).output().expect("run file_sum");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} must be refused");
        assert!(err.contains(want), "unclear error for {args:?}:\n{err}");
    }
}

/// Runs file_sum on `from`, kills it once a checkpoint exists, and reruns it to the end on
/// `to`; returns the rerun's output.
fn restore_with_other_backend(seed: u64, from: &str, to: &str) -> (Scenario, std::process::Output) {
    let s = Scenario::new(20_000, 20, seed);
    let mut child = s
        .command(2, Some(10_000), 50)
        .arg("--state")
        .arg(from)
        .spawn()
        .expect("start file_sum");
    wait_for("a first checkpoint", Duration::from_secs(30), || {
        has_complete_checkpoint(&s.checkpoints)
    });
    child.kill().expect("SIGKILL file_sum");
    child.wait().expect("reap file_sum");
    let out = s
        .command(2, None, 50)
        .arg("--state")
        .arg(to)
        .output()
        .expect("rerun file_sum");
    (s, out)
}

#[test]
fn switching_state_backends_on_restore() {
    // Memory → RocksDB: the heap state is loaded into RocksDB and nothing is lost.
    let (s, out) = restore_with_other_backend(7, "memory", "rocksdb");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.check();

    // RocksDB → memory: the RocksDB files cannot be read by the heap backend; say so.
    let (_s, out) = restore_with_other_backend(8, "rocksdb", "memory");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a restore that cannot read the state must fail"
    );
    assert!(
        err.contains("rocksdb backend to restore it"),
        "unclear error:\n{err}"
    );
}
