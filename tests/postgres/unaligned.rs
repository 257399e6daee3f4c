//! `payments_apply_once` killed with SIGKILL under backpressure with unaligned checkpoints:
//! the apply-once sink is the slow part of the job (a database transaction per payment), so
//! payments queue up in front of it while the reader reads ahead. Each run is killed a
//! random moment after it completed a checkpoint that stored the queued payments (channel
//! state), and restarted; the job is then restored at another parallelism and run to the
//! end. Every restore replays the stored payments before reading on, and the apply-once
//! sink recognises those it had applied before the kill: every valid payment must have
//! exactly one ledger row and have paid its order, every poison payment sits in the dead
//! letters.

use crate::chaos::Payments;
use std::time::Duration;
use weir_tests::harness::{Checkpoints, KillPlan, REPLAYED, resumed_from};

/// Payments read per second: several times what the sink applies, so it falls behind.
const READ_RATE: u64 = 4_000;

#[test]
fn payments_killed_under_backpressure_with_unaligned_checkpoints_pay_every_order_once() {
    let mut p = Payments::new(4_000, 3, 23);
    let logs = p.dir.path().to_path_buf();
    let mut seen = Checkpoints::default();
    let rounds = 3;
    let plan = KillPlan {
        name: "payments_apply_once",
        rounds,
        seed: 23,
        spread_ms: 800,
        limit: Duration::from_secs(60),
    };
    let landed = plan.after_channel_state(&p.checkpoints(), &mut seen, |i| {
        let log = std::fs::File::create(logs.join(format!("killed-{i}.log"))).expect("log");
        let mut c = p.command(2, READ_RATE);
        c.args(["--checkpoint-mode", "unaligned"]).stderr(log);
        c
    });
    assert_eq!(
        landed, rounds,
        "a run finished before its kill: the input is too short for {rounds} kills"
    );
    for i in 1..rounds {
        let log = std::fs::read_to_string(logs.join(format!("killed-{i}.log"))).expect("log");
        let from = resumed_from(&log)
            .unwrap_or_else(|| panic!("killed run {i} did not resume from a checkpoint:\n{log}"));
        assert!(
            seen.channel_state_bytes(from) > 0,
            "killed run {i} resumed from checkpoint {from}, which held no queued payments"
        );
        assert!(log.contains(REPLAYED), "run {i} replayed nothing:\n{log}");
    }
    // The last run at parallelism 1: the payments stored for two sink subtasks all go to one.
    let log = p.run_to_end_with(1, &["--checkpoint-mode", "unaligned"]);
    let from = resumed_from(&log)
        .unwrap_or_else(|| panic!("the last run did not resume from a checkpoint:\n{log}"));
    assert!(
        seen.channel_state_bytes(from) > 0,
        "the last run resumed from checkpoint {from}, which held no queued payments"
    );
    assert!(
        log.contains(REPLAYED),
        "the last run replayed nothing:\n{log}"
    );
    seen.assert_taken_under_backpressure("unaligned");
    seen.assert_stored_channel_state("unaligned");
    p.check();
    eprintln!(
        "{} kills, {} checkpoints seen ({} with queued payments), the last run resumed from \
         {from} ({} bytes of payments in flight)",
        landed,
        seen.stats.len(),
        seen.with_channel_state().len(),
        seen.channel_state_bytes(from)
    );
}

/// A checkpoint mode the example cannot use is refused before it connects anywhere, saying
/// which modes there are.
#[test]
fn a_bad_checkpoint_mode_is_refused_with_the_modes_there_are() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_payments_apply_once"))
        .args(["--postgres", "postgres://weir@127.0.0.1:1/none"])
        .arg("--input")
        .arg(dir.path().join("payments.csv"))
        .arg("--checkpoint-dir")
        .arg(dir.path().join("ck"))
        .args(["--checkpoint-mode", "sideways"])
        .output()
        .expect("run payments_apply_once");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a bad mode must be refused:\n{err}");
    assert!(
        err.contains(
            "--checkpoint-mode: invalid configuration: unknown checkpoint mode \"sideways\": \
             use aligned, unaligned, aligned-timeout or aligned-timeout:MS"
        ),
        "unclear error:\n{err}"
    );
    assert!(
        !dir.path().join("ck").exists(),
        "refused only after the job started"
    );
}
