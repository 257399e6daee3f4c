//! kafka_sum killed with SIGKILL under backpressure with unaligned checkpoints: the input
//! topic is full before the job starts, each source subtask reads [`READ_RATE`] records/s
//! (`--max-rate`) while each sink subtask produces at most [`SINK_RATE`] records/s
//! (`--sink-rate`), so the keyed exchange is full whenever a checkpoint is taken. The job is killed at random moments,
//! restarted each time (once at another parallelism), then restored at a third parallelism
//! and run to the end. The independent `read_committed` reader must see, per key, exactly
//! the running sums of the input in order (nothing lost, nothing twice), and no
//! transaction may be left open.

use crate::chaos::{Job, newest_checkpoint};
use std::process::Command;
use weir_tests::harness::{Checkpoints, kill_at_random};

/// Records per second each sink subtask produces at most: at parallelism 2 the input
/// takes 12 s of the sink's work, more than the killed runs last all together (8.2 s for
/// this seed), so every kill lands while the job runs.
const SINK_RATE: u64 = 500;
/// Records per second each source subtask reads: six times what the sinks write.
const READ_RATE: u64 = 1_500;
const RECORDS: usize = 12_000;
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

/// Kills kafka_sum in checkpoint mode `mode` `rounds` times, 50..2050 ms into each run
/// (parallelism 2, one run at 1), then resumes it at parallelism 3 to the end and checks.
fn kills_under_backpressure(mode: &str, seed: u64, rounds: usize) {
    let mut job = Job::new(RECORDS, KEYS, seed);
    let logs = job.dir.path().to_path_buf();
    let mut seen = Checkpoints::default();
    let landed = kill_at_random("kafka_sum", rounds, seed, 2_000, |i| {
        seen.record(&job.checkpoints());
        let parallelism = if i == rounds / 2 { 1 } else { 2 };
        let mut c = with_mode(job.command(parallelism, INTERVAL_MS), mode);
        let log = std::fs::File::create(logs.join(format!("killed-{i:02}.log"))).expect("log");
        c.stdout(log.try_clone().expect("clone log file"))
            .stderr(log);
        c
    });
    seen.record(&job.checkpoints());
    assert_eq!(
        landed, rounds,
        "a run finished before its kill: the input is too short for {rounds} kills"
    );
    let from = newest_checkpoint(&job)
        .unwrap_or_else(|| panic!("no checkpoint completed in {rounds} runs (mode {mode})"));
    let log = job.run_to_end(with_mode(job.command(3, INTERVAL_MS), mode));
    assert!(
        log.contains(&format!("resuming from checkpoint {from} ")),
        "the last run (parallelism 3) did not resume from checkpoint {from}:\n{log}"
    );
    let read = job.check();
    seen.assert_taken_under_backpressure(mode);
    eprintln!(
        "{mode}: {landed} kills, {} checkpoints seen, the last run resumed from {from}; \
         exactly-once (check {read:?})",
        seen.stats.len()
    );
}

#[test]
fn sigkill_under_backpressure_with_unaligned_checkpoints() {
    kills_under_backpressure("unaligned", 0x0A11_6E1D, 8);
}
