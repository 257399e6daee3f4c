//! SIGKILL under backpressure with unaligned (and aligned-timeout) checkpoints: `file_sum`
//! reads at [`READ_RATE`] lines/s while each sink subtask writes at most [`SINK_RATE`]
//! (`--sink-rate`), so the keyed exchange is full whenever a checkpoint is taken. The job is
//! killed at random moments, restarted each time (once at another parallelism), and finally
//! restored at a third parallelism and run to the end; every key's committed history must
//! then be exactly its running sums in input order: nothing lost, nothing twice.

use crate::harness::{
    Checkpoints, Scenario, kill_at_random, latest_checkpoint, soak_factor, stderr_of,
};

/// Lines per second the reader reads at most (`--max-rate`).
const READ_RATE: u64 = 3_000;
/// Records per second each sink subtask writes at most (`--sink-rate`): at parallelism 2
/// the job writes 600 lines/s, a fifth of the reader's pace.
const SINK_RATE: u64 = 300;
/// Lines of input: 10 s of the sink's work at parallelism 2, more than the killed runs
/// last all together (6.3 s and 4.6 s for the seeds below), so every kill lands while the
/// job runs.
const LINES: usize = 6_000;
const KEYS: u64 = 30;
/// Checkpoint interval.
const INTERVAL_MS: u64 = 100;

/// Kills `file_sum` in checkpoint mode `mode` up to `rounds` times, 50..1550 ms into each
/// run (at parallelism 2, except one run at 1), then resumes it at parallelism 3 from the
/// newest checkpoint and runs it to the end; checks every key's full history.
fn kills_under_backpressure(mode: &str, seed: u64, rounds: usize) {
    // More kills need more input for each to land while the job runs.
    let mut s = Scenario::new(LINES * soak_factor(), KEYS, seed);
    s.extra_args = [
        "--checkpoint-mode",
        mode,
        "--sink-rate",
        &SINK_RATE.to_string(),
    ]
    .map(String::from)
    .to_vec();
    let rounds = rounds * soak_factor();
    let mut seen = Checkpoints::default();
    let landed = kill_at_random("file_sum", rounds, seed, 1_500, |i| {
        seen.record(&s.checkpoints);
        let parallelism = if i == rounds / 2 { 1 } else { 2 };
        s.command(parallelism, Some(READ_RATE), INTERVAL_MS)
    });
    seen.record(&s.checkpoints);
    assert_eq!(
        landed, rounds,
        "a run finished before its kill: the input is too short for {rounds} kills"
    );
    let from = latest_checkpoint(&s.checkpoints)
        .unwrap_or_else(|| panic!("no checkpoint completed in {rounds} runs (mode {mode})"));
    let out = s
        .command(3, Some(READ_RATE), INTERVAL_MS)
        .output()
        .expect("run file_sum to the end");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the last run failed:\n{err}");
    assert!(
        err.contains(&format!("resuming from checkpoint {from} ")),
        "the last run (parallelism 3) did not resume from checkpoint {from}:\n{err}"
    );
    s.check_history();
    seen.assert_taken_under_backpressure(mode);
    seen.assert_stored_channel_state(mode);
    eprintln!(
        "{mode}: {landed} kills, {} checkpoints seen, the last run resumed from {from}",
        seen.stats.len()
    );
}

#[test]
fn sigkill_under_backpressure_with_unaligned_checkpoints() {
    kills_under_backpressure("unaligned", 0x0A11_6E0D, 10);
}

#[test]
fn sigkill_under_backpressure_with_aligned_timeout_checkpoints() {
    kills_under_backpressure("aligned-timeout:50", 0x0A11_6E0E, 6);
}

/// A mode or rate the example cannot use is refused before the job starts, saying what
/// would be accepted.
#[test]
fn a_bad_checkpoint_mode_or_sink_rate_is_refused() {
    let mut s = Scenario::new(10, 2, 11);
    for (args, want) in [
        (
            ["--checkpoint-mode", "sideways"],
            "--checkpoint-mode: invalid configuration: unknown checkpoint mode \"sideways\": \
             use aligned, unaligned, aligned-timeout or aligned-timeout:MS",
        ),
        (
            ["--checkpoint-mode", "aligned-timeout:0"],
            "unknown checkpoint mode \"aligned-timeout:0\"",
        ),
        (
            ["--sink-rate", "0"],
            "--sink-rate must be at least 1 record per second",
        ),
        (
            ["--sink-rate", "fast"],
            "--sink-rate \"fast\" is not a number of records per second",
        ),
    ] {
        s.extra_args = args.map(String::from).to_vec();
        let mut child = s.command(1, None, 20).spawn().expect("start file_sum");
        let status = child.wait().expect("wait for file_sum");
        let err = stderr_of(&mut child);
        assert!(!status.success(), "{args:?} must be refused");
        assert!(err.contains(want), "unclear error for {args:?}:\n{err}");
        assert!(
            !s.output.exists(),
            "{args:?} was refused only after the job started"
        );
    }
}
