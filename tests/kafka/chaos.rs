//! kafka_sum killed with SIGKILL at random moments and at every named fail point.
//!
//! Every scenario ends with a clean run to completion (exit 0) and two checks: no
//! transaction is left open on the output or marker topic once the job has finished (a
//! `read_committed` reader must not be held back by a transaction of a killed run), and the
//! independent `read_committed` reader sees, per key, exactly the prefix sums of the input,
//! each once. `WEIR_SOAK=1` multiplies the random kills by 10.

use crate::support::*;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use weir_tests::Rng;

/// How long a run may take before the test calls it hung.
const RUN_LIMIT: Duration = Duration::from_secs(240);

/// How long after a job finished its last transaction markers may take to reach the
/// partitions (they are written asynchronously after the commit returns). A transaction of
/// a killed run that nobody fenced stays open for the whole transaction timeout instead.
const OPEN_TXN_LIMIT: Duration = Duration::from_secs(10);

/// How long a check waits for a transaction held open past `OPEN_TXN_LIMIT` to end (a
/// kafka_sum transaction times out after 60 s by default).
const OPEN_TXN_WAIT: Duration = Duration::from_secs(80);

/// How many times the soak mode multiplies the kills.
fn soak_factor() -> usize {
    if std::env::var_os("WEIR_SOAK").is_some() {
        10
    } else {
        1
    }
}

/// One kafka_sum job: an input topic (3 partitions) holding `records`, an output topic
/// (3 partitions), a checkpoint directory shared by all its runs, and a log file per run.
pub(crate) struct Job {
    pub(crate) input: String,
    pub(crate) output: String,
    pub(crate) records: Vec<(String, i64)>,
    pub(crate) dir: tempfile::TempDir,
    runs: usize,
}

impl Job {
    pub(crate) fn new(n: usize, keys: u64, seed: u64) -> Job {
        let input = unique("chaos-in");
        let output = unique("chaos-out");
        create_topic(&input, 3);
        create_topic(&output, 3);
        let records = random_input(n, keys, seed);
        produce(&input, &records);
        Job {
            input,
            output,
            records,
            dir: tempfile::tempdir().expect("temp dir"),
            runs: 0,
        }
    }

    pub(crate) fn checkpoints(&self) -> PathBuf {
        self.dir.path().join("ck")
    }

    /// `kafka_sum --bounded` at `parallelism`, without fail points.
    pub(crate) fn command(&self, parallelism: usize, interval_ms: u64) -> Command {
        let mut c = kafka_sum(&self.input, &self.output, &self.checkpoints());
        c.arg("--bounded")
            .arg("--parallelism")
            .arg(parallelism.to_string())
            .arg("--checkpoint-interval-ms")
            .arg(interval_ms.to_string())
            .env_remove("WEIR_FAILPOINTS")
            .stdin(Stdio::null());
        c
    }

    /// Starts `cmd` with its stdout and stderr going to a log file of this run (a file,
    /// not a pipe, so a chatty run never blocks on a full pipe).
    fn spawn(&mut self, mut cmd: Command) -> Run {
        self.runs += 1;
        let log = self.dir.path().join(format!("run-{:03}.log", self.runs));
        let f = std::fs::File::create(&log).expect("create run log");
        let child = cmd
            .stdout(f.try_clone().expect("clone log file"))
            .stderr(f)
            .spawn()
            .expect("start kafka_sum");
        Run {
            child,
            log,
            started: Instant::now(),
        }
    }

    /// Runs `cmd` once with `WEIR_FAILPOINTS={point}=kill` and asserts that the fail point
    /// killed it; returns the run's log.
    fn kill_at(&mut self, mut cmd: Command, point: &str) -> String {
        cmd.env("WEIR_FAILPOINTS", format!("{point}=kill"));
        self.spawn(cmd).expect_fail_point(point)
    }

    /// Runs `cmd` to completion, asserts exit 0, returns the log.
    pub(crate) fn run_to_end(&mut self, cmd: Command) -> String {
        self.spawn(cmd).finish()
    }

    /// The commit-marker topic of this job's sink (the sink's default name).
    fn marker_topic(&self) -> String {
        format!("weir-markers.{}-sum", self.output)
    }

    /// Once the job has finished: no transaction may stay open on the output or marker
    /// topic for longer than `OPEN_TXN_LIMIT` (else a `read_committed` reader is held back),
    /// and the independent `read_committed` reader must see exactly the prefix sums.
    /// Returns how long the check took.
    pub(crate) fn check(&self) -> Duration {
        let t = Instant::now();
        if let Some(held) = self.check_exactly_once() {
            panic!("{held}");
        }
        t.elapsed()
    }

    /// Like [`Job::check`], but a transaction held open past `OPEN_TXN_LIMIT` is waited out
    /// (up to `OPEN_TXN_WAIT`, for a transaction timeout of 60 s) and returned as a
    /// description instead of failing at once, so a test can go on and fail at its end.
    /// Exactly-once is asserted in any case.
    fn check_exactly_once(&self) -> Option<String> {
        let t = Instant::now();
        let mut held = None;
        loop {
            let output = open_transactions(&self.output);
            let markers = open_transactions(&self.marker_topic());
            if output.is_empty() && markers.is_empty() {
                break;
            }
            if t.elapsed() > OPEN_TXN_LIMIT && held.is_none() {
                held = Some(format!(
                    "{:?} after the job finished (exit 0), transactions are still open \
                     ((partition, last stable offset, high watermark)): output {output:?}, \
                     marker topic {markers:?}; a read_committed reader sees none of the \
                     output's committed records past those last stable offsets",
                    t.elapsed()
                ));
            }
            if t.elapsed() > OPEN_TXN_WAIT {
                panic!(
                    "{}; still open after {:?}",
                    held.unwrap_or_default(),
                    t.elapsed()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_exactly_once(&prefix_sums(&self.records), &committed_sums(&self.output));
        held.map(|h| {
            format!(
                "{h}; the transactions ended (timed out) {:?} after the job finished; then \
                 exactly-once held",
                t.elapsed()
            )
        })
    }
}

/// What weir prints when the job fails inside the process (and restarts or gives up).
const JOB_FAILED: &str = "[weir] job 'kafka_sum' failed";

/// Fails the test if the job failed inside the process: none of these scenarios has a
/// reason to (the only faults are the kills), so the first such failure is a finding.
fn assert_no_job_failure(log: &str) {
    if let Some(line) = log.lines().find(|l| l.contains(JOB_FAILED)) {
        panic!("the job failed inside kafka_sum: {line}\nits log:\n{log}");
    }
}

/// A running kafka_sum process.
struct Run {
    child: Child,
    log: PathBuf,
    started: Instant,
}

impl Drop for Run {
    /// Never leaves a kafka_sum running behind a failed test.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Run {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process with a deadline; kills it and fails the test if it hangs or
    /// if the job fails and restarts inside the process (none of these scenarios has a
    /// reason to: the only faults are the kills).
    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = self.started + limit;
        let mut next_look = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for kafka_sum") {
                assert_no_job_failure(&self.log());
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "kafka_sum did not exit within {limit:?}; its log:\n{}",
                    self.log()
                );
            }
            if Instant::now() >= next_look {
                let log = self.log();
                if log.contains(JOB_FAILED) {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    assert_no_job_failure(&self.log());
                }
                next_look = Instant::now() + Duration::from_millis(200);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for a normal end (exit 0) and returns the log.
    fn finish(mut self) -> String {
        let status = self.wait(RUN_LIMIT);
        let log = self.log();
        assert!(status.success(), "kafka_sum failed: {status}\n{log}");
        log
    }

    /// Waits for the process and asserts the fail point `point` killed it.
    fn expect_fail_point(mut self, point: &str) -> String {
        let status = self.wait(RUN_LIMIT);
        let log = self.log();
        assert!(
            log.contains(&format!("[weir] fail point '{point}': kill")),
            "fail point {point} did not fire (the run ended with {status}):\n{log}"
        );
        assert_eq!(
            status.signal(),
            Some(9),
            "fail point {point} fired but kafka_sum did not die of SIGKILL ({status}):\n{log}"
        );
        log
    }

    /// SIGKILLs the process from outside; returns false when it had already exited (then
    /// asserts that it exited 0).
    fn kill(mut self) -> bool {
        if let Some(status) = self.child.try_wait().expect("poll kafka_sum") {
            assert_no_job_failure(&self.log());
            assert!(
                status.success(),
                "kafka_sum failed on its own: {status}\n{}",
                self.log()
            );
            return false;
        }
        self.child.kill().expect("SIGKILL kafka_sum");
        let status = self.child.wait().expect("reap kafka_sum");
        assert_no_job_failure(&self.log());
        if status.signal() == Some(9) {
            return true;
        }
        // It exited between try_wait and kill.
        assert!(
            status.success(),
            "kafka_sum failed on its own: {status}\n{}",
            self.log()
        );
        false
    }
}

/// Records in the random-kill jobs: a run without kills takes about 4 s (debug build, idle
/// machine: ~100k records/s once running); a restore takes about 1.5 s, a fresh start 0.5 s.
const RANDOM_KILL_RECORDS: usize = 300_000;

/// The newest complete checkpoint of a job.
pub(crate) fn newest_checkpoint(job: &Job) -> Option<u64> {
    complete_checkpoints(&job.checkpoints()).last().copied()
}

/// SIGKILL at >= 30 random moments, alternating parallelism 1 and 2 between restarts (so
/// nearly every restore rescales), checkpoint interval 100..300 ms. Half the kills come
/// 100..2500 ms after the start (start-up, fencing, the restore's marker scan and
/// re-production, and the first epochs before the run's first checkpoint completes), half
/// 0..700 ms after the run completed a checkpoint of its own (while it processes, with
/// epochs pre-committed or committing); the kind is random too. A run that
/// finishes before its kill completes its job: that job is checked and a fresh one starts.
/// After the last kill the current job runs to completion at parallelism 2 and is checked.
/// Transactions left open past the end of a job are collected and fail the test at the end,
/// after the exactly-once check of every job.
#[test]
fn random_kills_with_rescaling_commit_every_sum_exactly_once() {
    let started = Instant::now();
    let target = 30 * soak_factor();
    let mut rng = Rng::new(0x6B61_666B_6121);
    let mut seed = 1000;
    let mut job = Job::new(RANDOM_KILL_RECORDS, 50, seed);
    let (mut kills, mut runs, mut jobs_done, mut progressed) = (0usize, 0usize, 0usize, 0usize);
    let mut held = Vec::new();
    while kills < target {
        let parallelism = 1 + runs % 2;
        runs += 1;
        let interval = 100 + 100 * rng.below(3);
        let after_checkpoint = rng.below(2) == 0;
        let delay = Duration::from_millis(if after_checkpoint {
            rng.below(700)
        } else {
            100 + rng.below(2400)
        });
        let before = newest_checkpoint(&job);
        let mut run = job.spawn(job.command(parallelism, interval));
        if after_checkpoint {
            // Waits (with a deadline) for the run to complete a checkpoint, to end or to fail.
            while newest_checkpoint(&job) == before
                && run.child.try_wait().expect("poll kafka_sum").is_none()
                && !run.log().contains(JOB_FAILED)
            {
                assert!(
                    run.started.elapsed() < RUN_LIMIT,
                    "no checkpoint completed within {RUN_LIMIT:?}:\n{}",
                    run.log()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        std::thread::sleep(delay);
        if run.kill() {
            kills += 1;
            let after = newest_checkpoint(&job);
            if after != before {
                progressed += 1;
            }
            eprintln!(
                "random_kills: kill {kills}/{target}: P={parallelism} interval={interval}ms \
                 {delay:?} after {}; newest checkpoint {before:?} -> {after:?}",
                if after_checkpoint {
                    "a checkpoint"
                } else {
                    "the start"
                }
            );
        } else {
            let t = Instant::now();
            if let Some(h) = job.check_exactly_once() {
                held.push(format!("job {}: {h}", jobs_done + 1));
            }
            jobs_done += 1;
            eprintln!(
                "random_kills: job {jobs_done} finished before its kill (P={parallelism}, \
                 {delay:?}); exactly-once, checked in {:?}",
                t.elapsed()
            );
            seed += 1;
            job = Job::new(RANDOM_KILL_RECORDS, 50, seed);
        }
    }
    let t = Instant::now();
    job.run_to_end(job.command(2, 200));
    let last_run = t.elapsed();
    let t = Instant::now();
    if let Some(h) = job.check_exactly_once() {
        held.push(format!("job {} (final): {h}", jobs_done + 1));
    }
    let read = t.elapsed();
    jobs_done += 1;
    eprintln!(
        "random_kills: {kills} kills ({progressed} after the killed run completed a \
         checkpoint) in {runs} runs, {jobs_done} jobs checked exactly-once; final run (P=2) \
         {last_run:?}, final check {read:?}; total {:?}",
        started.elapsed()
    );
    assert!(
        kills >= target,
        "only {kills} kills landed, wanted {target}"
    );
    // A good share of the kills must hit a run that made progress, not only restores.
    assert!(
        progressed >= target / 4,
        "only {progressed} of {kills} kills came after the killed run completed a checkpoint"
    );
    assert!(
        held.is_empty(),
        "{} of {jobs_done} jobs left transactions open after they finished:\n{}",
        held.len(),
        held.join("\n")
    );
}

/// Records in the fail point jobs: enough that the first checkpoint (100 ms) comes well
/// before the end of the input, so a fail point fires mid-stream, not at the final
/// checkpoint.
const FAIL_POINT_RECORDS: usize = 100_000;

/// Asserts that `log`, of a run after a kill, did not resume from the final checkpoint: the
/// kill came mid-stream, with input left to process after the restore.
fn assert_resumed_mid_stream(log: &str, what: &str) {
    assert!(
        !log.contains("had already finished"),
        "{what} came at the end of the input, not mid-stream:\n{log}"
    );
}

/// Kills the job at `point` (first hit) at `parallelism`, restarts it clean at
/// `restart_parallelism` to completion, checks exactly-once.
fn fail_point_then_restart(point: &str, parallelism: usize, restart_parallelism: usize, seed: u64) {
    let t = Instant::now();
    let mut job = Job::new(FAIL_POINT_RECORDS, 30, seed);
    job.kill_at(job.command(parallelism, 100), point);
    let log = job.run_to_end(job.command(restart_parallelism, 100));
    assert_resumed_mid_stream(&log, point);
    let read = job.check();
    let restore = log
        .lines()
        .filter(|l| l.contains("restored") || l.contains("re-produced"))
        .collect::<Vec<_>>()
        .join("\n  ");
    eprintln!(
        "fail_points: {point} at P={parallelism}, restart at P={restart_parallelism}: \
         exactly-once ({:?}, check {read:?})\n  {restore}",
        t.elapsed()
    );
}

const FAIL_POINTS: [&str; 6] = [
    "kafka.after_precommit",
    "kafka.before_commit",
    "kafka.during_commit",
    "kafka.after_commit",
    "checkpoint.after_metadata",
    "checkpoint.before_metadata",
];

#[test]
fn fail_points_at_parallelism_2() {
    for (i, point) in FAIL_POINTS.into_iter().enumerate() {
        fail_point_then_restart(point, 2, 2, 200 + i as u64);
    }
}

#[test]
fn fail_points_at_parallelism_1() {
    for (i, point) in ["kafka.after_precommit", "kafka.before_commit"]
        .into_iter()
        .enumerate()
    {
        fail_point_then_restart(point, 1, 1, 300 + i as u64);
    }
}

/// A crash half-way through re-producing an epoch on restore: the epoch left pending by a
/// kill at `kafka.before_commit` is re-produced again by the next restore, and the
/// `read_committed` reader sees it once although the log holds aborted copies.
#[test]
fn replay_crash_is_recovered_and_aborted_copies_stay_hidden() {
    let t = Instant::now();
    let mut job = Job::new(FAIL_POINT_RECORDS, 30, 400);
    job.kill_at(job.command(2, 100), "kafka.before_commit");
    let log = job.kill_at(job.command(2, 100), "kafka.during_replay");
    assert_resumed_mid_stream(&log, "kafka.before_commit");
    let log = job.run_to_end(job.command(2, 100));
    assert!(
        log.contains("re-produced"),
        "the last restore did not re-produce the pending epoch:\n{log}"
    );
    job.check();
    // Every record in the log, aborted or not, is one of the input's prefix sums; the
    // aborted copies (the fenced epoch and the half-replayed one) make the log longer than
    // what committed, and they repeat committed (key, sum) pairs.
    let expected = prefix_sums(&job.records);
    let committed: usize = expected.values().map(Vec::len).sum();
    let all = read_all(&job.output, "read_uncommitted");
    let mut seen = std::collections::BTreeMap::<(String, i64), usize>::new();
    for r in &all {
        let k = r.key_str();
        let v: i64 = r.value_str().parse().expect("an i64 sum");
        assert!(
            expected.get(&k).is_some_and(|s| s.contains(&v)),
            "the log holds {k}={v}, which is no prefix sum of the input"
        );
        *seen.entry((k, v)).or_default() += 1;
    }
    assert_eq!(
        seen.len(),
        committed,
        "the log does not hold every prefix sum"
    );
    let copies = seen.values().filter(|n| **n > 1).count();
    assert!(
        all.len() > committed && copies > 0,
        "expected aborted copies in the log: {} records in it, {committed} committed, \
         {copies} repeated",
        all.len()
    );
    eprintln!(
        "replay_crash: {} records in the log, {committed} committed, {copies} sums written \
         more than once; {:?}",
        all.len(),
        t.elapsed()
    );
}

/// The job stays down longer than its transaction timeout: the broker aborts the pending
/// transaction of a completed checkpoint on its own, and the restore re-produces it.
#[test]
fn downtime_longer_than_transaction_timeout() {
    let t = Instant::now();
    let mut job = Job::new(20_000, 30, 500);
    let timeouts = |mut c: Command| {
        c.args([
            "--transaction-timeout-ms",
            "10000",
            "--checkpoint-timeout-ms",
            "5000",
        ]);
        c
    };
    job.kill_at(timeouts(job.command(2, 500)), "kafka.before_commit");
    // The downtime is the scenario: longer than transaction.timeout.ms (10 s) plus the
    // broker's abort check (every second).
    std::thread::sleep(Duration::from_secs(13));
    // The broker has aborted the killed run's transactions on its own by now.
    let open = open_transactions(&job.output);
    assert!(
        open.is_empty(),
        "13 s after the kill, transactions with a 10 s timeout are still open: {open:?}"
    );
    let log = job.run_to_end(timeouts(job.command(2, 500)));
    assert!(
        log.contains("re-produced"),
        "the restore did not re-produce the epoch the broker aborted:\n{log}"
    );
    let read = job.check();
    eprintln!(
        "downtime: exactly-once after 13 s down ({:?}, check {read:?})",
        t.elapsed()
    );
}

/// How many records of each sink subtask (lineage) are in `topic` (aborted, open or
/// committed), from the sink's transaction header.
fn lineages_in_log(topic: &str) -> std::collections::BTreeMap<u32, usize> {
    let mut by = std::collections::BTreeMap::new();
    for r in read_all(topic, "read_uncommitted") {
        if let Some((_, v)) = r
            .headers
            .iter()
            .find(|(k, _)| k == weir_kafka::txn::TXN_HEADER)
            && let Some((lineage, _, _)) = weir_kafka::txn::decode_header(v)
        {
            *by.entry(lineage).or_default() += 1;
        }
    }
    by
}

/// Killed right after the first pre-commit at parallelism 2 (so no checkpoint completed and
/// nothing committed), resumed at parallelism 1 to the end. The killed run's subtask 1 had
/// a transaction open (asserted: its records are in the log, and nothing can have committed
/// them), which no checkpoint knows about: the restart must still fence it, or it holds back
/// every `read_committed` reader of the output until it times out.
#[test]
fn precommit_kill_at_parallelism_2_then_restart_at_parallelism_1() {
    let t = Instant::now();
    let mut job = Job::new(FAIL_POINT_RECORDS, 30, 600);
    // A 20 s interval: the first barrier is the final one at the end of the input, when both
    // subtasks have written records.
    let log = job.kill_at(job.command(2, 20_000), "kafka.after_precommit");
    let lineages = lineages_in_log(&job.output);
    assert!(
        lineages.contains_key(&1),
        "the killed run's subtask 1 wrote nothing (records per lineage in the log: \
         {lineages:?}):\n{log}"
    );
    let log = job.run_to_end(job.command(1, 100));
    let read = job.check();
    eprintln!(
        "rescale 2 (killed after pre-commit) -> 1: exactly-once ({:?}, check {read:?})\n{log}",
        t.elapsed()
    );
}

/// A transaction left open by a rescaled-away subtask, then more commits and a restore:
/// 1. parallelism 1, killed right after its first commit (a checkpoint written at P=1);
/// 2. parallelism 2 restored from it, killed once both subtasks pre-committed the next
///    checkpoint but before it completed (`checkpoint.before_metadata`): subtask 1's
///    transaction, with its commit marker, is open, and no checkpoint knows about it;
/// 3. parallelism 1 restored from step 1's checkpoint, killed right after it committed
///    an epoch (`kafka.after_commit`): that epoch's records and marker lie behind subtask
///    1's open transaction in the log;
/// 4. parallelism 1 to the end: its restore must find the step-3 epoch committed.
///
/// The transaction timeout is 120 s (the sink's own default is 15 minutes), so the open
/// transaction does not simply expire during the test.
#[test]
fn commit_behind_an_open_transaction_of_a_rescaled_away_subtask() {
    let t = Instant::now();
    let mut job = Job::new(FAIL_POINT_RECORDS, 30, 700);
    let timeout = |mut c: Command| {
        c.args(["--transaction-timeout-ms", "120000"]);
        c
    };
    job.kill_at(timeout(job.command(1, 100)), "kafka.after_commit");
    let first = newest_checkpoint(&job);
    assert!(
        first.is_some(),
        "no checkpoint completed before kafka.after_commit"
    );
    // A 20 s interval: the first barrier of this run is the final one at the end of the
    // input, when both subtasks have written records.
    let log = job.kill_at(
        timeout(job.command(2, 20_000)),
        "checkpoint.before_metadata",
    );
    assert!(
        log.contains("resuming from checkpoint"),
        "the parallelism-2 run did not restore the parallelism-1 checkpoint:\n{log}"
    );
    assert_resumed_mid_stream(&log, "kafka.after_commit");
    assert_eq!(
        newest_checkpoint(&job),
        first,
        "the parallelism-2 run completed a checkpoint"
    );
    let lineages = lineages_in_log(&job.output);
    assert!(
        lineages.contains_key(&1),
        "the parallelism-2 run's subtask 1 wrote nothing (records per lineage in the log: \
         {lineages:?}):\n{log}"
    );
    let log3 = job.kill_at(timeout(job.command(1, 100)), "kafka.after_commit");
    assert_resumed_mid_stream(&log3, "kafka.after_commit");
    let third = newest_checkpoint(&job);
    assert!(
        third > first,
        "step 3 completed no checkpoint before its commit:\n{log3}"
    );
    let t_last = Instant::now();
    let log = job.run_to_end(timeout(job.command(1, 100)));
    let last_run = t_last.elapsed();
    let read = job.check();
    eprintln!(
        "commit behind an open transaction: exactly-once; last run {last_run:?}, check \
         {read:?}, total {:?}\n{log}",
        t.elapsed()
    );
}
