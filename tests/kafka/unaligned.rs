//! kafka_sum killed with SIGKILL under backpressure with unaligned checkpoints: the input
//! topic is full before the job starts, each source subtask reads [`READ_RATE`] records/s
//! (`--max-rate`) while each sink subtask produces at most [`SINK_RATE`] records/s
//! (`--sink-rate`), so the keyed exchange holds thousands of records whenever a checkpoint
//! is taken. Each run is killed a random moment after it completed a checkpoint that stored
//! in-flight records (channel state), and restarted (once at another parallelism); the
//! job is then restored at a third parallelism and run to the end. Every restore replays
//! held channel state; the independent `read_committed` reader must see, per key, exactly
//! the running sums of the input in order (nothing lost, nothing twice), and no
//! transaction may be left open.
//!
//! Why the runs wait for such a checkpoint instead of dying at a random moment from their
//! start: a kafka_sum run reads nothing for its first ~2 s (the consumer's start-up and the
//! sink's transactional producer), and an unaligned barrier still waits for the batch in
//! hand of a throttled chain (up to 1024 records at the sink's pace) and for the source's
//! blocked send, so early kills leave only checkpoints of empty channels.

use crate::chaos::Job;
use crate::support::*;
use std::process::Command;
use std::time::Duration;
use weir_tests::harness::{Checkpoints, KillPlan, REPLAYED, resumed_from};

/// Records per second each sink subtask produces at most.
const SINK_RATE: u64 = 500;
/// Records per second each source subtask reads: three times what the sinks write.
const READ_RATE: u64 = 1_500;
/// More than the killed runs get through (~1,000 records/s once reading, a few seconds
/// each), so every kill lands while the job runs.
const RECORDS: usize = 30_000;
const KEYS: u64 = 30;
const INTERVAL_MS: u64 = 200;

fn with_mode(mut c: Command, mode: &str) -> Command {
    c.args([
        "--checkpoint-mode",
        mode,
        "--sink-rate",
        &SINK_RATE.to_string(),
        // Reading at a pace keeps the sources running through every killed run: a source
        // that read its whole (bounded) topic into the channels at once would leave only
        // the final checkpoint, which is always aligned.
        "--max-rate",
        &READ_RATE.to_string(),
    ]);
    c
}

/// Kills kafka_sum in checkpoint mode `mode` `rounds` times, each after a checkpoint
/// holding in-flight records (parallelism 2, one run at 1), then resumes it at
/// parallelism 3 to the end and checks the output and what each restore replayed.
fn kills_under_backpressure(mode: &str, seed: u64, rounds: usize) {
    let mut job = Job::new(RECORDS, KEYS, seed);
    let logs = job.dir.path().to_path_buf();
    let mut seen = Checkpoints::default();
    let plan = KillPlan {
        name: "kafka_sum",
        rounds,
        seed,
        spread_ms: 1_000,
        limit: Duration::from_secs(60),
    };
    let landed = plan.after_channel_state(&job.checkpoints(), &mut seen, |i| {
        let parallelism = if i == rounds / 2 { 1 } else { 2 };
        let mut c = with_mode(job.command(parallelism, INTERVAL_MS), mode);
        let log = std::fs::File::create(logs.join(format!("killed-{i:02}.log"))).expect("log");
        c.stdout(log.try_clone().expect("clone log file"))
            .stderr(log);
        c
    });
    assert_eq!(
        landed, rounds,
        "a run finished before its kill: the input is too short for {rounds} kills"
    );
    // Every restart after the first resumed from a checkpoint holding in-flight records
    // and replayed them before reading on.
    for i in 1..rounds {
        let log = std::fs::read_to_string(logs.join(format!("killed-{i:02}.log"))).expect("log");
        let from = resumed_from(&log)
            .unwrap_or_else(|| panic!("killed run {i} did not resume from a checkpoint:\n{log}"));
        assert!(
            seen.channel_state_bytes(from) > 0,
            "killed run {i} resumed from checkpoint {from}, which held no in-flight records: {:?}",
            seen.stats[&from]
        );
        assert!(
            log.contains(REPLAYED),
            "killed run {i} resumed from checkpoint {from} without replaying its channel state:\n{log}"
        );
    }
    let log = job.run_to_end(with_mode(job.command(3, INTERVAL_MS), mode));
    seen.record(&job.checkpoints());
    let from = resumed_from(&log)
        .unwrap_or_else(|| panic!("the last run (parallelism 3) did not resume:\n{log}"));
    assert!(
        seen.channel_state_bytes(from) > 0,
        "the last run resumed from checkpoint {from}, which held no in-flight records"
    );
    assert!(
        log.contains(REPLAYED),
        "the last run (parallelism 3) did not replay the channel state of {from}:\n{log}"
    );
    let read = job.check();
    seen.assert_taken_under_backpressure(mode);
    seen.assert_stored_channel_state(mode);
    eprintln!(
        "{mode}: {} kills, {} checkpoints seen ({} with channel state), the last run \
         resumed from {from} ({} bytes in flight); exactly-once (check {read:?})",
        landed,
        seen.stats.len(),
        seen.with_channel_state().len(),
        seen.channel_state_bytes(from)
    );
}

#[test]
fn sigkill_under_backpressure_with_unaligned_checkpoints() {
    kills_under_backpressure("unaligned", 0x0A11_6E1D, 5);
}

/// Found by the test above: kafka_sum under backpressure with unaligned checkpoints, at
/// parallelism 2, is killed once its second checkpoint that stored in-flight records is
/// complete and before any sink commits it (fail point
/// `checkpoint.after_metadata_with_channel_state=2*kill`: by the first, the sinks may not
/// have written anything yet), then resumed at parallelism 3. The
/// sink subtasks that write their uncommitted transactions again do so slowly
/// (`kafka.during_replay` sleeps 3 s halfway through each), while the new subtask 2 replays in-flight
/// records of keys that old subtask 1's output holds too. Those replays must wait for the
/// restore of every sink subtask: otherwise a key's newer sums land in the log before its
/// older ones.
#[test]
fn replayed_in_flight_records_wait_for_every_sink_subtasks_restore() {
    let input = unique("in-inflight");
    let output = unique("out-inflight");
    create_topic(&input, 3);
    create_topic(&output, 3);
    let records = random_input(40_000, KEYS, 0x5EED_0F12);
    produce(&input, &records);
    let ck = tempfile::tempdir().expect("temp dir");
    let cmd = |p: &str, failpoint: &str| {
        let mut c = with_mode(kafka_sum(&input, &output, ck.path()), "unaligned");
        c.args([
            "--bounded",
            "--checkpoint-interval-ms",
            &INTERVAL_MS.to_string(),
            "--parallelism",
            p,
        ])
        .env("WEIR_FAILPOINTS", failpoint);
        c
    };
    let (status, err) = Running::start(&mut cmd(
        "2",
        "checkpoint.after_metadata_with_channel_state=2*kill",
    ))
    .wait_within(Duration::from_secs(120));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(9),
        "the fail point did not kill kafka_sum:\n{err}"
    );
    let mut seen = Checkpoints::default();
    seen.record(ck.path());
    let from = seen
        .newest()
        .expect("the killed run completed a checkpoint");
    assert!(
        seen.channel_state_bytes(from) > 0,
        "checkpoint {from} held no in-flight records: {:?}",
        seen.stats[&from]
    );
    let (status, err) = Running::start(&mut cmd("3", "kafka.during_replay=every*sleep:3000"))
        .wait_within(Duration::from_secs(180));
    assert!(status.success(), "the resumed run failed:\n{err}");
    for line in err.lines().filter(|l| l.contains(" [weir] ")) {
        eprintln!("resumed run: {line}");
    }
    assert_eq!(resumed_from(&err), Some(from), "{err}");
    // Once: the run must not fail and restart (a sink whose commits wait behind its slow
    // input runs out of transactional producers).
    assert_eq!(
        err.matches("resuming from checkpoint").count(),
        1,
        "the resumed run failed and restarted:\n{err}"
    );
    assert!(
        err.contains("re-produced"),
        "the resumed run re-produced nothing:\n{err}"
    );
    assert!(
        err.contains(REPLAYED),
        "the resumed run replayed no in-flight records:\n{err}"
    );
    assert_exactly_once(&prefix_sums(&records), &committed_sums(&output));
}
