//! Watermark alignment: an interval join of a source that emits its whole input at once
//! with a throttled one keeps a buffer bounded by the maximum drift when the two sources
//! are aligned, and buffers the whole fast input when they are not (exact output both
//! ways); an idle source does not stall its group; a source reading two splits at
//! different speeds pauses the fast split; invalid configurations are refused with a
//! clear message. Waits poll a condition with a deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};
use weir::prelude::*;
use weir::watermark::{AlignmentHandle, SplitAlignment};
use weir_tests::rest::{self, operator};
use weir_tests::{join_within, run, run_failing, unique, wait_for};

/// Records `(key, id)` at event time `id * step`, `per_poll` a poll; with `pause`, the
/// source rests 1 ms after each poll (throttled); with a `gate`, it emits nothing until
/// the gate opens.
struct Timed {
    next: u64,
    count: u64,
    step: i64,
    per_poll: u64,
    pause: bool,
    gate: Option<Arc<AtomicBool>>,
}

impl SourceFunction<(u32, u64)> for Timed {
    fn poll(&mut self, out: &mut SourceOutput<'_, (u32, u64)>) -> weir::Result<SourceStatus> {
        if self
            .gate
            .as_ref()
            .is_some_and(|g| !g.load(Ordering::SeqCst))
        {
            return Ok(SourceStatus::Idle(2));
        }
        let end = (self.next + self.per_poll).min(self.count);
        while self.next < end {
            let id = self.next;
            out.emit_at(((id % 4) as u32, id), id as i64 * self.step)?;
            self.next += 1;
        }
        Ok(if self.next == self.count {
            SourceStatus::Finished
        } else if self.pause {
            SourceStatus::Idle(1)
        } else {
            SourceStatus::More
        })
    }
}

fn timed(
    env: &Env,
    name: &str,
    source: impl Fn() -> Timed + Send + Sync + 'static,
    group: Option<(&str, u64)>,
) -> Stream<(u32, u64)> {
    let mut strategy = WatermarkStrategy::monotonous().with_per_record_watermarks();
    if let Some((group, drift_ms)) = group {
        strategy = strategy.watermark_alignment(
            group,
            Duration::from_millis(drift_ms),
            Duration::from_millis(5),
        );
    }
    env.source(name, move |_| source())
        .with_watermarks(strategy)
}

const FAST: u64 = 20_000;
const FAST_BATCH: u64 = 100;
const SLOW: u64 = 2_000;
const SLOW_STEP: i64 = 10;
const UPPER: i64 = 10;
const DRIFT: u64 = 200;

/// Every (fast id, slow id) of one key with the slow record's time in [t, t + UPPER].
fn expected_pairs() -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for j in 0..SLOW {
        let rt = j as i64 * SLOW_STEP;
        for t in (rt - UPPER).max(0)..=rt {
            let i = t as u64;
            if i < FAST && i % 4 == j % 4 {
                out.push((i, j));
            }
        }
    }
    out.sort_unstable();
    out
}

/// Runs the join of a fast and a throttled source, aligned or not; returns the largest
/// number of fast records the join held while it ran, and the source's paused time as
/// the REST API showed it.
fn join_of_fast_and_slow(aligned: bool) -> (i64, u64) {
    let env = Env::new().parallelism(1).web_address("127.0.0.1:0");
    let group = aligned.then_some(("fast-and-slow", DRIFT));
    // Not aligned: the slow source waits until the join holds the whole fast input.
    let gate = (!aligned).then(|| Arc::new(AtomicBool::new(false)));
    let fast = timed(
        &env,
        "fast",
        move || Timed {
            next: 0,
            count: FAST,
            step: 1,
            per_poll: FAST_BATCH,
            pause: false,
            gate: None,
        },
        group,
    );
    let slow_gate = gate.clone();
    let slow = timed(
        &env,
        "slow",
        move || Timed {
            next: 0,
            count: SLOW,
            step: SLOW_STEP,
            per_poll: 2,
            pause: true,
            gate: slow_gate.clone(),
        },
        group,
    );
    let name = unique("aligned-join");
    let joined = fast
        .key_by(|r| r.0)
        .interval_join(&slow.key_by(|r| r.0))
        .between(0, UPPER)
        .apply(|a, b| (a.1, b.1))
        .name(&name)
        .collect();
    let handle = env.execute_async("alignment").unwrap();
    let addr = handle.web_address().expect("a web address");
    let labels = [
        ("operator", name.as_str()),
        ("subtask", "0"),
        ("input", "left"),
    ];
    let buffered = || weir::metrics::value("join_buffered_records", &labels).unwrap_or(0.0) as i64;
    let mut peak = 0;
    let mut paused_ms = 0;
    if let Some(gate) = &gate {
        wait_for(
            "the join to hold every fast record",
            Duration::from_secs(60),
            || buffered() == FAST as i64,
        );
        peak = buffered();
        gate.store(true, Ordering::SeqCst);
    } else {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut polls = 0u64;
        while !handle.is_finished() {
            assert!(Instant::now() < deadline, "the aligned join did not finish");
            peak = peak.max(buffered());
            polls += 1;
            if polls.is_multiple_of(20) {
                let ops = rest::get(addr, "/v1/operators");
                if let Some(ms) = operator(&ops, "fast")["alignment_paused_ms"].as_u64() {
                    paused_ms = paused_ms.max(ms);
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    join_within(handle, Duration::from_secs(60)).unwrap();
    assert_eq!(joined.sorted(), expected_pairs(), "aligned: {aligned}");
    (peak, paused_ms)
}

#[test]
fn alignment_bounds_the_state_of_a_join_of_a_fast_and_a_slow_source() {
    let (peak, paused_ms) = join_of_fast_and_slow(true);
    // The fast source reads at most the drift, one poll and the join's interval beyond the
    // slow one, plus what of the slow input is in flight to the join (its watermark is
    // then behind the one the group saw).
    let bound = (DRIFT + FAST_BATCH) as i64 + UPPER + 500;
    eprintln!("aligned join: at most {peak} fast records held, source paused {paused_ms} ms");
    assert!(
        peak > 0 && peak <= bound,
        "with alignment the join held up to {peak} fast records (bound {bound})"
    );
    assert!(paused_ms > 0, "the fast source never showed paused time");
}

#[test]
fn without_alignment_the_join_holds_the_whole_fast_input() {
    let (peak, _) = join_of_fast_and_slow(false);
    assert_eq!(peak, FAST as i64);
}

#[test]
fn an_idle_source_does_not_hold_its_group_back() {
    let env = Env::new().parallelism(1);
    let done = Arc::new(AtomicBool::new(false));
    // Three records, then nothing (idle after 50 ms) until the other source is done.
    struct Quiet(u64, Arc<AtomicBool>);
    impl SourceFunction<(u32, u64)> for Quiet {
        fn poll(&mut self, out: &mut SourceOutput<'_, (u32, u64)>) -> weir::Result<SourceStatus> {
            if self.0 < 3 {
                out.emit_at((9, self.0), self.0 as i64)?;
                self.0 += 1;
                return Ok(SourceStatus::More);
            }
            Ok(if self.1.load(Ordering::SeqCst) {
                SourceStatus::Finished
            } else {
                SourceStatus::Idle(5)
            })
        }
    }
    let aligned = |s: WatermarkStrategy<(u32, u64)>| {
        s.with_per_record_watermarks().watermark_alignment(
            "with-an-idle-one",
            Duration::from_millis(100),
            Duration::from_millis(5),
        )
    };
    let fast = env
        .source("busy", |_| Timed {
            next: 0,
            count: 5_000,
            step: 1,
            per_poll: 100,
            pause: false,
            gate: None,
        })
        .with_watermarks(aligned(WatermarkStrategy::monotonous()));
    let quiet_done = done.clone();
    let quiet = env
        .source("quiet", move |_| Quiet(0, quiet_done.clone()))
        .with_watermarks(aligned(
            WatermarkStrategy::monotonous().with_idleness(Duration::from_millis(50)),
        ));
    // The busy source's records, counted as they come; the quiet one finishes after.
    let seen = Arc::new(AtomicI64::new(0));
    let (s, d) = (seen.clone(), done.clone());
    let all = fast
        .union(&[quiet])
        .map(move |r| {
            if r.0 != 9 && s.fetch_add(1, Ordering::SeqCst) + 1 == 5_000 {
                d.store(true, Ordering::SeqCst);
            }
            r
        })
        .collect();
    run(&env).unwrap();
    let values = all.sorted();
    assert_eq!(values.len(), 5_003);
    assert_eq!(
        values.iter().filter(|r| r.0 != 9).map(|r| r.1).sum::<u64>(),
        (0..5_000).sum::<u64>()
    );
    assert_eq!(
        values.iter().filter(|r| r.0 == 9).count(),
        3,
        "the quiet source's records"
    );
}

/// Two splits in one subtask: split 0 at 100 records a poll, split 1 at one, each with its
/// own watermark; the subtask's watermark is the slower split's. With alignment the
/// source skips a split the group does not allow; it reports the largest lead of split 0
/// over split 1 it ever had.
struct TwoSplits {
    pos: [i64; 2],
    count: i64,
    splits: SplitAlignment<usize>,
    alignment: Option<AlignmentHandle>,
    lead: Arc<AtomicI64>,
}

impl SourceFunction<(usize, i64)> for TwoSplits {
    fn open(&mut self, ctx: &SourceContext) -> weir::Result<()> {
        self.alignment = ctx.alignment.clone();
        Ok(())
    }
    fn poll(&mut self, out: &mut SourceOutput<'_, (usize, i64)>) -> weir::Result<SourceStatus> {
        let open: Vec<(usize, i64)> = (0..2)
            .filter(|&s| self.pos[s] < self.count)
            .map(|s| (s, self.pos[s] - 1))
            .collect();
        self.splits.align(self.alignment.as_ref(), open);
        for (split, per_poll) in [(0, 100), (1, 1)] {
            if self.splits.is_paused(&split) {
                continue;
            }
            for _ in 0..per_poll {
                if self.pos[split] < self.count {
                    out.emit_at((split, self.pos[split]), self.pos[split])?;
                    self.pos[split] += 1;
                }
            }
        }
        let lead = self.pos[0] - self.pos[1];
        self.lead.fetch_max(lead, Ordering::SeqCst);
        let slowest = self.pos.iter().filter(|p| **p < self.count).min();
        match slowest {
            Some(p) => out.emit_watermark(p - 1)?,
            None => return Ok(SourceStatus::Finished),
        }
        Ok(SourceStatus::More)
    }
}

fn two_splits(aligned: bool) -> i64 {
    let env = Env::new().parallelism(1);
    let lead = Arc::new(AtomicI64::new(0));
    let l = lead.clone();
    let mut s = env.source("two-splits", move |_| TwoSplits {
        pos: [0, 0],
        count: 3_000,
        splits: SplitAlignment::new(),
        alignment: None,
        lead: l.clone(),
    });
    if aligned {
        s = s.watermark_alignment(
            "splits",
            Duration::from_millis(50),
            Duration::from_millis(1),
        );
    }
    let out = s.collect();
    run(&env).unwrap();
    let mut values = out.values();
    values.sort_unstable();
    let expected: Vec<(usize, i64)> = (0..2)
        .flat_map(|s| (0..3_000).map(move |i| (s, i)))
        .collect();
    assert_eq!(values, expected);
    lead.load(Ordering::SeqCst)
}

#[test]
fn a_source_pauses_the_split_that_runs_ahead_of_its_group() {
    // Aligned: split 0 stops at the drift (50) plus one poll (100) ahead of split 1.
    let lead = two_splits(true);
    assert!(lead <= 150, "split 0 ran {lead} ahead with alignment");
    // Not aligned: split 0 finishes its 3,000 records after 30 polls, split 1 is at 30.
    assert_eq!(two_splits(false), 3_000 - 30);
}

#[test]
fn invalid_alignments_are_refused_with_what_to_change() {
    let cases: [(&str, u64, u64, &str); 3] = [
        ("", 100, 10, "watermark alignment needs a group name"),
        (
            "g",
            0,
            10,
            "group 'g': the maximum drift is 0ns; it must be at least 1 ms",
        ),
        ("g", 100, 0, "group 'g': the update interval is zero"),
    ];
    for (group, drift, interval, message) in cases {
        let env = Env::new().parallelism(1);
        env.from_collection(vec![(1u32, 1u64)])
            .with_watermarks(WatermarkStrategy::monotonous().watermark_alignment(
                group,
                Duration::from_millis(drift),
                Duration::from_millis(interval),
            ))
            .collect();
        let e = run_failing(&env).to_string();
        assert!(e.contains(message), "{e}");
    }
    // Alignment after a rebalance runs in no source's task.
    let env = Env::new().parallelism(2);
    env.from_collection(vec![(1u32, 1u64)])
        .rebalance()
        .map(|r| r)
        .with_watermarks(WatermarkStrategy::monotonous().watermark_alignment(
            "g",
            Duration::from_millis(10),
            Duration::from_millis(10),
        ))
        .collect();
    let e = run_failing(&env).to_string();
    assert!(
        e.contains(
            "watermark alignment group 'g' is set on 'watermarks', which runs in the task of \
             'map', not in a source's task"
        ),
        "{e}"
    );
}

/// Subtask 0 emits `count` records at 100 a poll, subtask 1 at 2 a poll with a rest in
/// between; both at event times 0, 1, 2, ... Subtask 0 notes its largest lead.
struct Pair {
    subtask: usize,
    next: i64,
    count: i64,
    positions: Arc<[AtomicI64; 2]>,
    lead: Arc<AtomicI64>,
}

impl SourceFunction<i64> for Pair {
    fn poll(&mut self, out: &mut SourceOutput<'_, i64>) -> weir::Result<SourceStatus> {
        let per_poll = if self.subtask == 0 { 100 } else { 2 };
        let end = (self.next + per_poll).min(self.count);
        while self.next < end {
            out.emit_at(self.next, self.next)?;
            self.next += 1;
        }
        self.positions[self.subtask].store(self.next, Ordering::SeqCst);
        if self.subtask == 0 {
            let other = self.positions[1].load(Ordering::SeqCst);
            self.lead.fetch_max(self.next - other, Ordering::SeqCst);
        }
        Ok(if self.next == self.count {
            SourceStatus::Finished
        } else if self.subtask == 1 {
            SourceStatus::Idle(1)
        } else {
            SourceStatus::More
        })
    }
}

#[test]
fn a_group_spans_the_workers_of_a_cluster() {
    use weir::cluster::{ClusterConfig, join};
    const COUNT: i64 = 3_000;
    let positions = Arc::new([AtomicI64::new(0), AtomicI64::new(0)]);
    let lead = Arc::new(AtomicI64::new(0));
    let sum = Arc::new(AtomicI64::new(0));
    let build = {
        let (positions, lead, sum) = (positions.clone(), lead.clone(), sum.clone());
        move |env: &Env| {
            let (positions, lead, sum) = (positions.clone(), lead.clone(), sum.clone());
            env.source("pair", move |ctx| Pair {
                subtask: ctx.subtask,
                next: 0,
                count: COUNT,
                positions: positions.clone(),
                lead: lead.clone(),
            })
            .with_watermarks(
                WatermarkStrategy::monotonous()
                    .with_per_record_watermarks()
                    .watermark_alignment(
                        "across-workers",
                        Duration::from_millis(200),
                        Duration::from_millis(5),
                    ),
            )
            .for_each(move || {
                let sum = sum.clone();
                move |v, _| {
                    sum.fetch_add(v, Ordering::SeqCst);
                    Ok(())
                }
            });
        }
    };
    let address = crate::cluster::free_address();
    let mut cfg = ClusterConfig::coordinator(&address, 2, vec![]);
    cfg.heartbeat_interval = Duration::from_millis(50);
    let coordinator = Env::new()
        .parallelism(2)
        .web_address("127.0.0.1:0")
        .cluster(cfg);
    build(&coordinator);
    let coordinator = coordinator
        .execute_async("across")
        .expect("the coordinator");
    let web = coordinator.web_address().expect("the coordinator's API");
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (address, build) = (address.clone(), build.clone());
            std::thread::spawn(move || {
                let joined = join(&address, 1, Duration::from_secs(30)).expect("join");
                let env = Env::new()
                    .parallelism(2)
                    .cluster(ClusterConfig::worker(joined));
                build(&env);
                env.execute("across").expect("the worker's share")
            })
        })
        .collect();
    // The coordinator's API shows the paused time the workers report.
    let mut paused_ms = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while paused_ms == 0 && !coordinator.is_finished() {
        assert!(Instant::now() < deadline, "the cluster job did not finish");
        let ops = rest::get(web, "/v1/operators");
        paused_ms = operator(&ops, "pair")["alignment_paused_ms"]
            .as_u64()
            .unwrap_or(0);
        std::thread::sleep(Duration::from_millis(20));
    }
    join_within(coordinator, Duration::from_secs(120)).expect("the cluster job");
    assert!(
        paused_ms > 0,
        "the coordinator never showed the source paused"
    );
    let mut sources_run = 0;
    for w in workers {
        let result = w.join().expect("worker thread");
        sources_run += result.tasks.iter().filter(|t| t.is_source).count();
    }
    // One source subtask on each worker: the group spans both.
    assert_eq!(sources_run, 2);
    assert_eq!(sum.load(Ordering::SeqCst), 2 * (0..COUNT).sum::<i64>());
    // Subtask 0 waited for subtask 1 on the other worker: at most the drift and one poll
    // ahead (its view of the other worker is older, never newer, than the truth), plus the
    // one poll of subtask 1 whose watermark may be seen before its position is noted here.
    let lead = lead.load(Ordering::SeqCst);
    eprintln!("across workers: subtask 0 at most {lead} ahead");
    assert!(lead <= 302, "subtask 0 ran {lead} ahead of subtask 1");
}

#[test]
fn a_paused_source_still_takes_part_in_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::new()
        .parallelism(1)
        .web_address("127.0.0.1:0")
        .checkpoints(CheckpointConfig::new(dir.path()).interval(Duration::from_millis(20)));
    // The late source emits nothing (and is not idle) until released: the group's minimum
    // stays at the start, and the eager source pauses after its first records.
    let release = Arc::new(AtomicBool::new(false));
    let eager = timed(
        &env,
        "eager",
        || Timed {
            next: 0,
            count: 2_000,
            step: 1,
            per_poll: 100,
            pause: false,
            gate: None,
        },
        Some(("with-checkpoints", 50)),
    );
    let gate = release.clone();
    let late = timed(
        &env,
        "late",
        move || Timed {
            next: 0,
            count: 2_000,
            step: 1,
            per_poll: 100,
            pause: false,
            gate: Some(gate.clone()),
        },
        Some(("with-checkpoints", 50)),
    );
    let out = eager.union(&[late]).collect();
    let handle = env.execute_async("paused-checkpoints").unwrap();
    let addr = handle.web_address().expect("a web address");
    // While the eager source is paused, three checkpoints complete: its task answers the
    // triggers and sends the barriers.
    let paused = |ops: &serde_json::Value| {
        let eager = operator(ops, "eager");
        eager["records_out"].as_u64() < Some(2_000)
            && eager["alignment_paused_ms"].as_u64() > Some(0)
    };
    wait_for("the eager source to pause", Duration::from_secs(60), || {
        paused(&rest::get(addr, "/v1/operators"))
    });
    let before = rest::get(addr, "/v1/checkpoints")["counts"]["completed"]
        .as_u64()
        .unwrap();
    wait_for(
        "three checkpoints while the eager source is paused",
        Duration::from_secs(60),
        || {
            rest::get(addr, "/v1/checkpoints")["counts"]["completed"]
                .as_u64()
                .unwrap()
                >= before + 3
        },
    );
    assert!(paused(&rest::get(addr, "/v1/operators")));
    release.store(true, Ordering::SeqCst);
    join_within(handle, Duration::from_secs(60)).unwrap();
    let mut expected: Vec<(u32, u64)> = (0..2_000).map(|i| ((i % 4) as u32, i)).collect();
    expected.extend(expected.clone());
    expected.sort_unstable();
    assert_eq!(out.sorted(), expected);
}
