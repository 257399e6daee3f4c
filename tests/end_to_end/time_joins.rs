//! Interval and temporal joins: exact output on out-of-order input against a brute-force
//! join computed here, on the heap and on RocksDB, at several parallelisms; result times;
//! late records on their side outputs; and the errors a user gets for an empty interval or input without event time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use weir::prelude::*;
use weir_tests::Rng;
use weir_tests::{Stamped, run, run_failing};

const MAX_DELAY: i64 = 6;

/// `n` records (key, id) with times drifting upwards, each up to `MAX_DELAY` out of order
/// (none late under a watermark that trails by `MAX_DELAY`).
fn records(n: u32, keys: u64, seed: u64) -> Vec<((u32, u32), Timestamp)> {
    let mut rng = Rng::new(seed);
    let mut t = 0;
    (0..n)
        .map(|id| {
            t += rng.below(3) as i64;
            let ts = t - rng.below(MAX_DELAY as u64 + 1) as i64;
            ((rng.below(keys) as u32, id), ts)
        })
        .collect()
}

fn timed(env: &Env, items: Vec<((u32, u32), Timestamp)>) -> Stream<(u32, u32)> {
    env.from_timestamped(items)
        .with_watermarks(WatermarkStrategy::bounded_out_of_orderness(MAX_DELAY))
}

/// Every (left id, right id) of one key with the right time in [lt + lower, lt + upper].
fn interval_pairs(
    left: &[((u32, u32), Timestamp)],
    right: &[((u32, u32), Timestamp)],
    lower: i64,
    upper: i64,
) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    for ((lk, lid), lt) in left {
        for ((rk, rid), rt) in right {
            if lk == rk && lt + lower <= *rt && *rt <= lt + upper {
                out.push((*lid, *rid));
            }
        }
    }
    out.sort_unstable();
    out
}

fn interval_join_matches_brute_force(backend: &str, parallelism: usize) {
    let left = records(400, 5, 7);
    let right = records(400, 5, 11);
    for (lower, upper, lower_ex, upper_ex) in [(-4, 9, false, false), (-4, 9, true, true)] {
        let env = Env::new()
            .parallelism(parallelism)
            .state_backend(BackendKind::parse(backend).unwrap());
        let mut joined = timed(&env, left.clone())
            .key_by(|l| l.0)
            .interval_join(&timed(&env, right.clone()).key_by(|r| r.0))
            .between(lower, upper);
        if lower_ex {
            joined = joined.lower_bound_exclusive();
        }
        if upper_ex {
            joined = joined.upper_bound_exclusive();
        }
        let pairs = joined.apply(|l, r| (l.1, r.1)).collect();
        run(&env).unwrap();
        let want = interval_pairs(
            &left,
            &right,
            lower + lower_ex as i64,
            upper - upper_ex as i64,
        );
        assert!(want.len() > 300, "only {} pairs", want.len());
        assert_eq!(
            pairs.sorted(),
            want,
            "{backend}, parallelism {parallelism}, [{lower}, {upper}] exclusive {lower_ex}/{upper_ex}"
        );
    }
}

#[test]
fn interval_join_emits_every_pair_within_the_interval_on_the_heap() {
    interval_join_matches_brute_force("memory", 1);
    interval_join_matches_brute_force("memory", 3);
}

#[test]
fn interval_join_emits_every_pair_within_the_interval_on_rocksdb() {
    interval_join_matches_brute_force("rocksdb", 2);
}

/// Versions (key, id) of rows: ids divisible by 5 delete the row. A key has one version
/// per time at most.
fn changes(n: u32, keys: u64, seed: u64) -> Vec<(Change<u32, u32>, Timestamp)> {
    let mut seen = std::collections::BTreeSet::new();
    records(n, keys, seed)
        .into_iter()
        .filter(|((k, _), ts)| seen.insert((*k, *ts)))
        .map(|((key, id), ts)| {
            let c = if id % 5 == 0 {
                Change::Delete { key, old: 0 }
            } else {
                Change::Insert { key, value: id }
            };
            (c, ts)
        })
        .collect()
}

/// Each record with the newest version of its key at or before its time.
fn temporal_rows(
    left: &[((u32, u32), Timestamp)],
    versions: &[(Change<u32, u32>, Timestamp)],
) -> Vec<(u32, Option<u32>)> {
    let mut out: Vec<(u32, Option<u32>)> = left
        .iter()
        .map(|((k, id), t)| {
            let row = versions
                .iter()
                .filter(|(c, v)| c.key() == k && v <= t)
                .max_by_key(|(_, v)| *v)
                .and_then(|(c, _)| c.new_value().copied());
            (*id, row)
        })
        .collect();
    out.sort_unstable();
    out
}

fn temporal_join_matches_brute_force(backend: &str, parallelism: usize) {
    let left = records(400, 5, 13);
    let versions = changes(200, 5, 17);
    let env = Env::new()
        .parallelism(parallelism)
        .state_backend(BackendKind::parse(backend).unwrap());
    let rates = env
        .from_timestamped(versions.clone())
        .with_watermarks(WatermarkStrategy::bounded_out_of_orderness(MAX_DELAY))
        .key_by(|c| *c.key());
    let orders = timed(&env, left.clone()).key_by(|l| l.0);
    let all = orders
        .temporal_join(&rates)
        .apply(|l, row: Option<&u32>| (l.1, row.copied()))
        .collect();
    let inner = orders
        .temporal_join(&rates)
        .inner(|l, row| (l.1, *row))
        .collect();
    run(&env).unwrap();
    let want = temporal_rows(&left, &versions);
    let found = want.iter().filter(|(_, r)| r.is_some()).count();
    assert!(
        found > 200 && want.len() - found > 30,
        "{found} of {}",
        want.len()
    );
    assert_eq!(all.sorted(), want, "{backend}, parallelism {parallelism}");
    let want_inner: Vec<(u32, u32)> = want
        .iter()
        .filter_map(|(id, r)| r.map(|r| (*id, r)))
        .collect();
    assert_eq!(
        inner.sorted(),
        want_inner,
        "{backend}, parallelism {parallelism}"
    );
}

#[test]
fn temporal_join_gives_each_record_the_version_valid_at_its_time_on_the_heap() {
    temporal_join_matches_brute_force("memory", 1);
    temporal_join_matches_brute_force("memory", 3);
}

#[test]
fn temporal_join_gives_each_record_the_version_valid_at_its_time_on_rocksdb() {
    temporal_join_matches_brute_force("rocksdb", 2);
}

#[test]
fn joined_records_carry_the_later_time_or_the_probe_time() {
    let env = Env::new().parallelism(1);
    let left = timed(&env, vec![((1, 1), 10), ((1, 2), 20)]);
    let right = timed(&env, vec![((1, 3), 8), ((1, 4), 15)]);
    let pairs = Stamped::attach(
        &left
            .key_by(|l| l.0)
            .interval_join(&right.key_by(|r| r.0))
            .between(-5, 5)
            .apply(|l, r| (l.1, r.1)),
    );
    let versions = env
        .from_timestamped(vec![(
            Change::Insert {
                key: 1u32,
                value: 7u32,
            },
            12,
        )])
        .with_watermarks(WatermarkStrategy::monotonous());
    let rows = Stamped::attach(
        &left
            .key_by(|l| l.0)
            .temporal_join(&versions.key_by(|c| *c.key()))
            .apply(|l, v: Option<&u32>| (l.1, v.copied())),
    );
    run(&env).unwrap();
    let mut p = pairs.values();
    p.sort();
    // 1@10 pairs with 3@8 (at 10) and 4@15 (at 15); 2@20 with 4@15 (at 20).
    assert_eq!(p, vec![((1, 3), 10), ((1, 4), 15), ((2, 4), 20)]);
    let mut r = rows.values();
    r.sort();
    assert_eq!(r, vec![((1, None), 10), ((2, Some(7)), 20)]);
}

#[test]
#[should_panic(expected = "interval is empty: lower bound 5 is above upper bound 5 (exclusive)")]
fn an_empty_interval_is_rejected_when_the_join_is_built() {
    let env = Env::new();
    let a = env.from_collection(vec![1u32]).key_by(|x| *x);
    let b = env.from_collection(vec![1u32]).key_by(|x| *x);
    let _ = a
        .interval_join(&b)
        .between(5, 5)
        .upper_bound_exclusive()
        .apply(|a, b| a + b);
}

#[test]
fn joins_of_input_without_event_time_fail_saying_how_to_add_it() {
    let env = Env::new().parallelism(1);
    let a = env.from_collection(vec![(1u32, 1u32)]).key_by(|x| x.0);
    let b = env.from_collection(vec![(1u32, 2u32)]).key_by(|x| x.0);
    a.interval_join(&b)
        .between(0, 1)
        .apply(|a, b| (a, b))
        .collect();
    let err = run_failing(&env).to_string();
    assert!(
        err.contains("interval join works in event time")
            && err.contains("has no timestamp")
            && err.contains("with_watermarks"),
        "{err}"
    );

    let env = Env::new().parallelism(1);
    let orders = env.from_collection(vec![(1u32, 1u32)]).key_by(|x| x.0);
    let rows = env
        .from_timestamped(vec![(
            Change::Insert {
                key: 1u32,
                value: 2u32,
            },
            1,
        )])
        .key_by(|c| *c.key());
    orders.temporal_join(&rows).inner(|o, v| (o, *v)).collect();
    let err = run_failing(&env).to_string();
    assert!(
        err.contains("temporal join works in event time")
            && err.contains("probe (left) input has no timestamp"),
        "{err}"
    );
}

/// Emits `before`, then waits (polling, up to a minute) until `gate` is open, then emits
/// `after`: a record of `after` reaches the join only once the test knows the join's
/// watermark has passed it, so it is late whatever the timing.
struct Gated {
    before: Vec<((u32, u32), Timestamp)>,
    after: Vec<((u32, u32), Timestamp)>,
    gate: Arc<AtomicBool>,
    since: Option<Instant>,
}

impl SourceFunction<(u32, u32)> for Gated {
    fn poll(&mut self, out: &mut SourceOutput<'_, (u32, u32)>) -> weir::Result<SourceStatus> {
        for (v, ts) in self.before.drain(..) {
            out.emit_at(v, ts)?;
        }
        if !self.gate.load(Ordering::SeqCst) {
            let since = *self.since.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(60) {
                return Err(Error::user(
                    "the join's watermark did not advance within 60 s",
                ));
            }
            return Ok(SourceStatus::Idle(5));
        }
        for (v, ts) in self.after.drain(..) {
            out.emit_at(v, ts)?;
        }
        Ok(SourceStatus::Finished)
    }
}

fn gated(env: &Env, gate: &Arc<AtomicBool>, late: ((u32, u32), Timestamp)) -> Stream<(u32, u32)> {
    let gate = gate.clone();
    env.source("gated", move |_| Gated {
        before: vec![((1, 1), 1000), ((1, 2), 3000)],
        after: vec![late],
        gate: gate.clone(),
        since: None,
    })
    .parallelism(1)
    .with_watermarks(
        WatermarkStrategy::bounded_out_of_orderness(0).with_emit_interval(Duration::from_millis(5)),
    )
    .parallelism(1)
}

/// Opens the gate when the watermark of its input passes 1500 (an event-time timer set by
/// the first record), passing the records through.
struct OpenAt1500(Arc<AtomicBool>);

impl KeyedProcessFunction<u8, (u32, u32), (u32, u32)> for OpenAt1500 {
    fn process(
        &mut self,
        v: (u32, u32),
        ctx: &mut KeyedContext<'_, u8, (u32, u32)>,
    ) -> weir::Result<()> {
        ctx.register_event_time_timer(1500);
        ctx.emit(v);
        Ok(())
    }
    fn on_timer(
        &mut self,
        _: Timestamp,
        _: TimeDomain,
        _: &mut KeyedContext<'_, u8, (u32, u32)>,
    ) -> weir::Result<()> {
        self.0.store(true, Ordering::SeqCst);
        Ok(())
    }
}

#[test]
fn late_records_of_an_interval_join_go_to_their_side_output() {
    let env = Env::new().parallelism(2);
    let gate = Arc::new(AtomicBool::new(false));
    // Record 3 at 100 comes after the join's watermark passed 1500: late, though right
    // record 9 at 50 is within its interval [0, 100].
    let left = gated(&env, &gate, ((1, 3), 100));
    let right = timed(&env, vec![((1, 9), 50), ((1, 8), 1000), ((1, 7), 2990)]);
    let late_left = OutputTag::<(u32, u32)>::new("late-left");
    let late_right = OutputTag::<(u32, u32)>::new("late-right");
    let joined = left
        .key_by(|l| l.0)
        .interval_join(&right.key_by(|r| r.0))
        .between(-100, 0)
        .side_output_late_left(&late_left)
        .side_output_late_right(&late_right)
        .apply(|l, r| (l.1, r.1));
    let late_l = joined.side_output(&late_left).collect();
    let late_r = joined.side_output(&late_right).collect();
    let g = gate.clone();
    let pairs = joined
        .key_by(|_| 0u8)
        .process(move || OpenAt1500(g.clone()))
        .collect();
    run(&env).unwrap();
    assert_eq!(pairs.sorted(), vec![(1, 8), (2, 7)]);
    assert_eq!(late_l.sorted(), vec![(1, 3)]);
    assert!(late_r.sorted().is_empty());
}

#[test]
fn late_records_of_a_temporal_join_go_to_their_side_output() {
    let env = Env::new().parallelism(2);
    let gate = Arc::new(AtomicBool::new(false));
    // Record 3 at 100 comes once record 1 (at 1000) was emitted, so after the join's
    // watermark passed 1000: late.
    let orders = gated(&env, &gate, ((1, 3), 100));
    let rows = env
        .from_timestamped(vec![(
            Change::Insert {
                key: 1u32,
                value: 70u32,
            },
            0,
        )])
        .with_watermarks(WatermarkStrategy::monotonous());
    let late = OutputTag::<(u32, u32)>::new("late-orders");
    let joined = orders
        .key_by(|o| o.0)
        .temporal_join(&rows.key_by(|c| *c.key()))
        .side_output_late(&late)
        .inner(|o, v| (o.1, *v));
    let late_orders = joined.side_output(&late).collect();
    let g = gate.clone();
    let rows = joined.collect();
    joined.for_each(move || {
        let g = g.clone();
        move |v: (u32, u32), _| {
            if v.0 == 1 {
                g.store(true, Ordering::SeqCst);
            }
            Ok(())
        }
    });
    run(&env).unwrap();
    assert_eq!(rows.sorted(), vec![(1, 70), (2, 70)]);
    assert_eq!(late_orders.sorted(), vec![(1, 3)]);
}

/// Emits (left id, right id, right time - left time); pairs more than 3 apart go to a side
/// output instead.
struct Delay {
    far: OutputTag<(u32, u32)>,
}

impl ProcessJoinFunction<(u32, u32), (u32, u32), (u32, u32, i64)> for Delay {
    fn process_element(
        &mut self,
        l: (u32, u32),
        r: (u32, u32),
        ctx: &mut JoinContext<'_, (u32, u32, i64)>,
    ) -> weir::Result<()> {
        let delay = ctx.right_timestamp() - ctx.left_timestamp();
        if delay.abs() > 3 {
            ctx.output(&self.far, (l.1, r.1))
        } else {
            ctx.emit((l.1, r.1, delay));
            Ok(())
        }
    }
}

#[test]
fn a_process_join_function_sees_both_times_and_emits_to_side_outputs() {
    let env = Env::new().parallelism(2);
    let left = timed(&env, vec![((1, 1), 10), ((2, 2), 20)]);
    let right = timed(
        &env,
        vec![((1, 3), 8), ((1, 4), 15), ((2, 5), 21), ((2, 6), 14)],
    );
    let far = OutputTag::<(u32, u32)>::new("far");
    let tag = far.clone();
    let near = left
        .key_by(|l| l.0)
        .interval_join(&right.key_by(|r| r.0))
        .between(-6, 5)
        .process(move || Delay { far: tag.clone() })
        .with_side_output(&far);
    let far_pairs = near.side_output(&far).collect();
    let near = near.collect();
    run(&env).unwrap();
    assert_eq!(near.sorted(), vec![(1, 3, -2), (2, 5, 1)]);
    assert_eq!(far_pairs.sorted(), vec![(1, 4), (2, 6)]);
}

#[test]
fn late_records_without_a_side_output_are_dropped_and_counted() {
    let env = Env::new().parallelism(2);
    let gate = Arc::new(AtomicBool::new(false));
    let left = gated(&env, &gate, ((1, 3), 100));
    let right = timed(&env, vec![((1, 9), 50), ((1, 8), 1000)]);
    let g = gate.clone();
    let pairs = left
        .key_by(|l| l.0)
        .interval_join(&right.key_by(|r| r.0))
        .between(-100, 0)
        .apply(|l, r| (l.1, r.1))
        .name("interval-join-drops")
        .key_by(|_| 0u8)
        .process(move || OpenAt1500(g.clone()))
        .collect();
    run(&env).unwrap();
    assert_eq!(pairs.sorted(), vec![(1, 8)]);
    let dropped = |input| {
        weir::metrics::sum(
            "join_late_records_dropped_total",
            &[("operator", "interval-join-drops"), ("input", input)],
        )
    };
    assert_eq!((dropped("left"), dropped("right")), (1.0, 0.0));
}
