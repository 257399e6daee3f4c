//! A two-worker cluster running `file_sum` with unaligned checkpoints under a throttled
//! sink (`--sink-rate`): the keyed sum's subtasks on the worker without the reader get all
//! their records over the TCP exchange, and the records in flight there are part of each
//! checkpoint's channel state. That worker is SIGKILLed once a checkpoint holding in-flight
//! records completed; a replacement worker joins, the job resumes from that checkpoint,
//! the replacement replays its subtasks' stored records, and the committed output holds
//! every key's prefix sums exactly once.

use crate::cluster::{Cluster, expect_success, read, wait_log, weir_cluster};
use crate::harness::{Scenario, wait_for};
use std::time::Duration;
use weir_tests::harness::{Checkpoints, REPLAYED, resumed_from};

/// Lines per second the reader reads (`--max-rate`).
const READ_RATE: u64 = 4_000;
/// Records per second each of the four sink subtasks writes at most (`--sink-rate`): the
/// job writes 1,200 lines/s, under a third of the reader's pace.
const SINK_RATE: u64 = 300;
/// 13 s of the sinks' work: the job is still running when the worker is killed.
const LINES: usize = 16_000;

#[test]
fn a_worker_killed_under_backpressure_with_unaligned_checkpoints_is_replaced_and_the_output_is_exact()
 {
    let mut s = Scenario::new(LINES, 40, 61);
    s.extra_args = [
        "--checkpoint-mode",
        "unaligned",
        "--sink-rate",
        &SINK_RATE.to_string(),
    ]
    .map(String::from)
    .to_vec();
    let mut cl = Cluster::new(&s);
    cl.workers = 2;
    cl.max_rate = READ_RATE;
    let (mut coord, coord_log) = cl.coordinator();
    // Worker 1 runs the reader and two subtasks of the keyed sum; worker 2 the other two,
    // whose input comes over the TCP exchange only.
    let (mut first, first_log) = cl.worker(2);
    wait_log(&coord_log, "worker 1 joined", 1);
    let (mut victim, _) = cl.worker(2);
    wait_log(&coord_log, "worker 2 joined", 1);
    let mut seen = Checkpoints::default();
    wait_for(
        "a checkpoint holding in-flight records",
        Duration::from_secs(90),
        || {
            seen.record(&s.checkpoints);
            !seen.with_channel_state().is_empty()
        },
    );
    // The layout the test relies on: the reader and two sum subtasks on worker 1 (three
    // tasks), two sum subtasks with their sinks on worker 2.
    let status: serde_json::Value =
        serde_json::from_str(&weir_cluster(&cl.web, &["status", "--json"])).expect("JSON");
    let layout: Vec<(u64, u64, u64)> = status["job"]["cluster"]["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .map(|w| {
            let n = |f: &str| w[f].as_u64().expect("a number");
            (n("id"), n("slots"), n("tasks"))
        })
        .collect();
    assert_eq!(layout, vec![(1, 2, 3), (2, 2, 2)]);
    victim.kill().expect("SIGKILL worker 2");
    victim.wait().expect("reap worker 2");
    wait_log(&coord_log, "worker 2 (", 1);
    seen.record(&s.checkpoints);
    let (mut replacement, replacement_log) = cl.worker(2);
    // The job keeps only its newest few checkpoints: read the one it resumes from before
    // the resumed job's checkpoints replace it (one may have completed between the poll
    // above and the kill).
    wait_log(&coord_log, "resuming from checkpoint ", 1);
    seen.record(&s.checkpoints);
    expect_success(&mut coord, &coord_log, "the coordinator");
    expect_success(&mut first, &first_log, "worker 1");
    expect_success(&mut replacement, &replacement_log, "the replacement worker");
    seen.record(&s.checkpoints);
    let log = read(&coord_log);
    let redeployed = log
        .lines()
        .find(|l| l.contains("deployed (") && l.contains("worker 3:"))
        .unwrap_or_else(|| panic!("the job was not deployed to the replacement:\n{log}"));
    assert!(
        redeployed.contains("worker 1: 3 task(s)") && redeployed.contains("worker 3: 2 task(s)"),
        "the replacement does not run worker 2's tasks: {redeployed}"
    );
    let from = resumed_from(&log)
        .unwrap_or_else(|| panic!("the job did not resume from a checkpoint:\n{log}"));
    assert!(
        seen.channel_state_bytes(from) > 0,
        "the job resumed from checkpoint {from}, which held no in-flight records: {:?}",
        seen.stats
    );
    // The replacement runs the subtasks fed over TCP only: what it replayed had been in
    // flight on the TCP exchange.
    let replaced = read(&replacement_log);
    assert!(
        replaced.contains(REPLAYED),
        "the replacement worker replayed no in-flight records of checkpoint {from}:\n{replaced}"
    );
    seen.assert_taken_under_backpressure("unaligned");
    seen.assert_stored_channel_state("unaligned");
    s.check();
    eprintln!(
        "resumed from checkpoint {from} ({} bytes in flight); {} checkpoints seen, {} with \
         channel state",
        seen.channel_state_bytes(from),
        seen.stats.len(),
        seen.with_channel_state().len()
    );
}

/// The final checkpoint is aligned in every mode: the sinks commit everything at it and
/// the job ends, so a record it left in flight would never be committed. The runtime tells
/// the operator tasks which checkpoint is the final one before its barriers leave the
/// sources; in a cluster that notice travels from the coordinator to each worker while the
/// barriers travel from worker to worker, and either may come first. Here worker 2 hands
/// the notice to its tasks 3 s late (fail point `cluster.final_notice`), while the final
/// barrier waits behind a full channel far longer than the alignment timeout (20 ms),
/// which would send any other barrier on unaligned: the final checkpoint must still be
/// aligned, hold no channel state, and the output must be exact.
#[test]
fn the_final_checkpoint_stays_aligned_when_a_worker_hears_of_it_late() {
    let mut s = Scenario::new(6_000, 40, 62);
    s.extra_args = [
        "--checkpoint-mode",
        "aligned-timeout:20",
        "--sink-rate",
        &SINK_RATE.to_string(),
        // Every sink subtask aligns over a channel from each sum subtask, local and remote.
        "--rebalance-before-sink",
    ]
    .map(String::from)
    .to_vec();
    let mut cl = Cluster::new(&s);
    cl.workers = 2;
    cl.max_rate = READ_RATE;
    let (mut coord, coord_log) = cl.coordinator();
    let (mut first, first_log) = cl.worker(2);
    wait_log(&coord_log, "worker 1 joined", 1);
    let (mut late, late_log) = cl.worker_with(2, Some("cluster.final_notice=sleep:3000"));
    expect_success(&mut coord, &coord_log, "the coordinator");
    expect_success(&mut first, &first_log, "worker 1");
    expect_success(&mut late, &late_log, "worker 2");
    assert!(
        read(&late_log).contains("fail point 'cluster.final_notice': sleep:3000"),
        "worker 2 never got a final checkpoint's notice:\n{}",
        read(&late_log)
    );
    let log = read(&coord_log);
    let at = log
        .find("final checkpoint ")
        .unwrap_or_else(|| panic!("no final checkpoint completed:\n{log}"))
        + "final checkpoint ".len();
    let id: u64 = log[at..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no final checkpoint id in the log:\n{log}"));
    let mut seen = Checkpoints::default();
    seen.record(&s.checkpoints);
    let stats = seen
        .stats
        .get(&id)
        .unwrap_or_else(|| panic!("final checkpoint {id} not on disk: {:?}", seen.stats));
    assert_eq!(
        (
            stats["unaligned"].as_bool(),
            stats["channel_state_bytes"].as_u64()
        ),
        (Some(false), Some(0)),
        "the final checkpoint {id} was taken unaligned: {stats}"
    );
    s.check();
}
