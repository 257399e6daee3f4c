//! A checkpoint that never completes, tried as a user would meet it: a state backend's
//! background snapshot hangs (the fail point `rocksdb.snapshot=N*sleep:600000` holds one
//! RocksDB instance's snapshot for ten minutes, as RocksDB 10.4's checkpoint bug did).
//! Before, the job went on reading while no checkpoint ever completed again and no output
//! was committed. Now the checkpoint times out, the job stops its tasks, leaves the stuck
//! one behind once the cancellation timeout has passed, and restarts from its latest
//! completed checkpoint: it ends in seconds, with the committed output exact.

use super::cluster::{Cluster, Processes, expect_success, read, wait_log};
use super::harness::Scenario;
use std::time::Duration;

/// Long enough that a test which waited for the hang to end fails on its own time limit.
const HANG: &str = "sleep:600000";

#[test]
fn a_snapshot_that_never_ends_restarts_the_job_and_the_output_stays_exact() {
    let s = Scenario::new(20_000, 40, 81);
    let started = std::time::Instant::now();
    let mut child = s
        .command(2, Some(5_000), 100)
        .args(["--checkpoint-timeout-ms", "4000"])
        .args(["--cancellation-timeout-ms", "2000"])
        // Two instances snapshot at every checkpoint: the sixth snapshot is checkpoint 3's.
        .env("WEIR_FAILPOINTS", format!("rocksdb.snapshot=6*{HANG}"))
        .spawn()
        .expect("start file_sum");
    let limit = Duration::from_secs(120);
    let (status, log) = weir_tests::wait_reading_output(&mut child, limit);
    let status = status.unwrap_or_else(|| {
        panic!("file_sum did not end within {limit:?} (waiting for the hung snapshot?):\n{log}")
    });
    assert!(status.success(), "file_sum failed: {status}\n{log}");
    // In one process the tasks acknowledge at once and the checkpoint hangs while its files
    // are written.
    let timed_out = "checkpoint 3 timed out: every task acknowledged it, but its files were \
                     not written within 4s (1 timeout in a row, 0 tolerated)";
    assert!(
        log.contains(timed_out),
        "no {timed_out:?} in the log:\n{log}"
    );
    assert!(
        log.contains("did not stop within 2s of being cancelled"),
        "the stuck task was not left behind:\n{log}"
    );
    assert!(
        log.contains("restarting from the last complete checkpoint"),
        "no restart:\n{log}"
    );
    s.check();
    eprintln!(
        "stuck snapshot (one process): restarted and exact in {:?}",
        started.elapsed()
    );
}

/// On a cluster: a worker's snapshot hangs (checkpoint 2 of the first attempt), the job
/// restarts from checkpoint 1; then the coordinator writes the next checkpoint slowly (the
/// fail point `checkpoint.before_metadata=2*sleep:7000`), past the timeout, so the job
/// restarts again, this time from that checkpoint: the first one taken after a restore,
/// which refers to files the workers restored and did not send again. Such a checkpoint
/// could not be restored before (each restart failed the same way, without end). Only the
/// stuck task is left behind: the worker's other task reports its end.
#[test]
fn a_snapshot_that_never_ends_on_a_worker_restarts_the_cluster_job_exactly() {
    let s = Scenario::new(30_000, 40, 82);
    let mut cl = Cluster::new(&s);
    cl.workers = 2;
    let coordinator = cl.coordinator_env(
        &[
            "--checkpoint-timeout-ms",
            "5000",
            "--cancellation-timeout-ms",
            "3000",
        ],
        &[(
            "WEIR_FAILPOINTS",
            std::ffi::OsStr::new("checkpoint.before_metadata=2*sleep:7000"),
        )],
    );
    let coord_log = coordinator.1.clone();
    let mut procs = Processes(vec![coordinator]);
    // Parallelism 4 over two workers of two slots: each runs two RocksDB instances, and the
    // first worker's third snapshot (checkpoint 2's) hangs.
    procs
        .0
        .push(cl.worker_with(2, Some(&format!("rocksdb.snapshot=3*{HANG}"))));
    wait_log(&coord_log, "worker 1 joined", 1);
    procs.0.push(cl.worker(2));
    let stuck_log = procs.0[1].1.clone();
    for ((child, log), what) in procs.0.iter_mut().zip([
        "the coordinator",
        "the worker whose snapshot hung",
        "the other worker",
    ]) {
        expect_success(child, log, what);
    }
    let log = read(&coord_log);
    // A worker acknowledges once its files are read: the acknowledgement never comes.
    for timed_out in [
        "checkpoint 2 timed out: not every task acknowledged it within 5s",
        "timed out: every task acknowledged it, but its files were not written within 5s",
        "resuming from checkpoint 2",
    ] {
        assert!(
            log.contains(timed_out),
            "no {timed_out:?} in the log:\n{log}"
        );
    }
    let worker_log = read(&stuck_log);
    assert!(
        worker_log.contains("did not stop within 3s of being cancelled"),
        "the worker did not leave its stuck task behind:\n{worker_log}"
    );
    // The coordinator leaves behind the one task whose snapshot hung, and no other: the
    // worker relays each task's reports on its own, so its other task's end is not held
    // back behind the stuck acknowledgement.
    let left: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("did not stop within 3s of being cancelled"))
        .collect();
    assert_eq!(left.len(), 1, "one attempt left a task behind:\n{log}");
    assert_eq!(
        left[0].matches("(subtask ").count(),
        1,
        "the coordinator left behind more than the stuck task: {}",
        left[0]
    );
    s.check();
}
