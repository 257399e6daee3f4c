//! Event-time windows with out-of-order and late data: tumbling, sliding and session
//! windows with reduce, aggregate, aggregate_with_window and process; allowed lateness
//! (late firings with the full emission history); late records on the side output; and
//! the final watermark at end of input.
//!
//! Inputs go through `weir_tests::event_time`, which advances the watermark after every
//! record (watermark = max timestamp so far - delay - 1), so which records are late is
//! exact. The comments beside each input give the watermark after that record.

use weir::prelude::*;
use weir_tests::{Stamped, by_key, event_time, kv, run};

fn at(k: &str, v: i64, ts: Timestamp) -> ((String, i64), Timestamp) {
    (kv(k, v), ts)
}

#[test]
fn tumbling_reduce_drops_late_records_to_the_side_output() {
    let env = Env::new().parallelism(2);
    let input = vec![
        at("a", 1, 1),  // wm -2
        at("a", 2, 5),  // wm 2
        at("b", 10, 3), // wm 2
        at("a", 3, 12), // wm 9: [0,10) fires with a=1+2, b=10
        at("a", 4, 8),  // late: [0,10) is gone (no allowed lateness)
        at("b", 20, 11),
        at("a", 5, 14),  // wm 11
        at("a", 6, 19),  // wm 16
        at("b", 30, 25), // wm 22: [10,20) fires with a=3+5+6, b=20
        at("a", 7, 9),   // late
    ]; // end of input: [20,30) fires with b=30
    let late = OutputTag::<(String, i64)>::new("late");
    let sums = event_time(&env, input, 2)
        .key_by(|(k, _)| k.clone())
        .window(WindowAssigner::tumbling(10))
        .side_output_late_data(&late)
        .reduce(|a, b| (a.0, a.1 + b.1));
    let late_records = Stamped::attach(&sums.side_output(&late));
    let out = Stamped::attach(&sums);
    run(&env).unwrap();

    let mut got = out.values();
    got.sort();
    // Each result carries its window's max timestamp.
    assert_eq!(
        got,
        vec![
            (kv("a", 3), 9),
            (kv("a", 14), 19),
            (kv("b", 10), 9),
            (kv("b", 20), 19),
            (kv("b", 30), 29)
        ]
    );
    let mut late_got = late_records.values();
    late_got.sort();
    // Late records keep their own timestamps.
    assert_eq!(late_got, vec![(kv("a", 4), 8), (kv("a", 7), 9)]);
}

#[test]
fn allowed_lateness_refires_the_window_with_the_updated_contents() {
    let env = Env::new().parallelism(2);
    let input = vec![
        at("a", 1, 2),  // wm 1
        at("a", 2, 7),  // wm 6
        at("a", 3, 11), // wm 10: [0,10) fires with [1, 2]
        at("a", 4, 4),  // within lateness (until wm 14): fires again with [1, 2, 4]
        at("a", 5, 13), // wm 12
        at("a", 6, 6),  // fires again with [1, 2, 4, 6]
        at("c", 1, 8),  // a new window after its end but within lateness fires at once
        at("a", 7, 16), // wm 15: [0,10) is cleaned up
        at("a", 8, 3),  // late
        at("a", 9, 9),  // late
        at("b", 1, 15),
    ]; // end of input: [10,20) fires for a ([3, 5, 7]) and b ([1])
    let late = OutputTag::<(String, i64)>::new("late");
    let fired = event_time(&env, input, 0)
        .key_by(|(k, _)| k.clone())
        .window(WindowAssigner::tumbling(10))
        .allowed_lateness(5)
        .side_output_late_data(&late)
        .process(|key: &String, w, records: &[(String, i64)], out| {
            let values: Vec<i64> = records.iter().map(|r| r.1).collect();
            out.emit((key.clone(), (w.start, values)));
            Ok(())
        });
    let late_records = fired.side_output(&late).collect();
    let out = fired.collect();
    run(&env).unwrap();

    // The full emission history per key, in firing order.
    let history = by_key(&out.values());
    assert_eq!(
        history["a"],
        vec![
            (0, vec![1, 2]),
            (0, vec![1, 2, 4]),
            (0, vec![1, 2, 4, 6]),
            (10, vec![3, 5, 7])
        ]
    );
    assert_eq!(history["b"], vec![(10, vec![1])]);
    assert_eq!(history["c"], vec![(0, vec![1])]);
    assert_eq!(history.len(), 3);
    assert_eq!(late_records.sorted(), vec![kv("a", 8), kv("a", 9)]);
}

#[test]
fn sliding_windows_accept_a_record_while_any_of_its_windows_is_open() {
    let env = Env::new().parallelism(2);
    let input = vec![
        at("a", 1, 1),   // in [-5,5) and [0,10); wm 0
        at("a", 6, 6),   // wm 5: [-5,5) fires with 1 record
        at("a", 12, 12), // wm 11: [0,10) fires with 2 records
        at("a", 8, 8),   // [0,10) is gone, [5,15) still open: counted there only
        at("a", 3, 3),   // [-5,5) and [0,10) both gone: late
    ]; // end of input: [5,15) has 6, 12, 8 and [10,20) has 12
    let late = OutputTag::<(String, i64)>::new("late");
    let counts = event_time(&env, input, 0)
        .key_by(|(k, _)| k.clone())
        .window(WindowAssigner::sliding(10, 5))
        .side_output_late_data(&late)
        .aggregate_with_window(Count, |key: &String, w: &TimeWindow, n: u64| {
            (key.clone(), w.start, w.end, n)
        });
    let late_records = counts.side_output(&late).collect();
    let out = counts.collect();
    run(&env).unwrap();
    let a = |s, e, n| ("a".to_string(), s, e, n);
    assert_eq!(
        out.sorted(),
        vec![a(-5, 5, 1), a(0, 10, 2), a(5, 15, 3), a(10, 20, 1)]
    );
    assert_eq!(late_records.sorted(), vec![kv("a", 3)]);
}

/// Sums the values of a key and counts them: (key, sum, count).
struct SumCount;

impl AggregateFunction<(String, i64), (String, i64, u64), (String, i64, u64)> for SumCount {
    fn create(&self) -> (String, i64, u64) {
        (String::new(), 0, 0)
    }
    fn add(&self, acc: &mut (String, i64, u64), (k, v): (String, i64)) {
        acc.0 = k;
        acc.1 += v;
        acc.2 += 1;
    }
    fn result(&self, acc: &(String, i64, u64)) -> (String, i64, u64) {
        acc.clone()
    }
    fn merge(&self, acc: &mut (String, i64, u64), other: (String, i64, u64)) {
        if acc.0.is_empty() {
            acc.0 = other.0;
        }
        acc.1 += other.1;
        acc.2 += other.2;
    }
}

#[test]
fn session_windows_merge_when_a_record_bridges_two_sessions() {
    let env = Env::new().parallelism(2);
    let input = vec![
        at("a", 1, 0),    // session [0,5); wm -11
        at("a", 2, 10),   // session [10,15); wm -1
        at("a", 3, 5),    // [5,10) touches both: one session [0,15)
        at("a", 4, 30),   // wm 19: [0,15) fires with 1+2+3
        at("b", 100, 12), // its own session [12,17) ended before wm 19: late
        at("a", 5, 31),   // session [30,36)
    ]; // end of input: [30,36) fires with 4+5
    let late = OutputTag::<(String, i64)>::new("late");
    let sums = event_time(&env, input, 10)
        .key_by(|(k, _)| k.clone())
        .window(WindowAssigner::session(5))
        .side_output_late_data(&late)
        .aggregate(SumCount);
    let late_records = sums.side_output(&late).collect();
    let out = sums.collect();
    run(&env).unwrap();
    assert_eq!(
        out.sorted(),
        vec![("a".to_string(), 6, 3), ("a".to_string(), 9, 2)]
    );
    assert_eq!(late_records.sorted(), vec![kv("b", 100)]);
}

#[test]
fn a_late_record_within_lateness_bridges_fired_sessions_and_refires() {
    let env = Env::new().parallelism(2);
    let input = vec![
        at("a", 1, 0),  // wm -1
        at("a", 2, 10), // wm 9: [0,5) fires with [1]
        at("a", 3, 20), // wm 19: [10,15) fires with [2]
        at("a", 4, 5),  // bridges the two fired sessions (kept for the lateness): [0,15) fires
        at("a", 5, 50), // wm 49: [20,25) fires; [0,15) and [20,25) are cleaned up
        at("a", 6, 3),  // its session [3,8) is past its lateness: late
    ]; // end of input: [50,55) fires with [5]
    let late = OutputTag::<(String, i64)>::new("late");
    let fired = event_time(&env, input, 0)
        .key_by(|(k, _)| k.clone())
        .window(WindowAssigner::session(5))
        .allowed_lateness(20)
        .side_output_late_data(&late)
        .process(|key: &String, w, records: &[(String, i64)], out| {
            let mut values: Vec<i64> = records.iter().map(|r| r.1).collect();
            values.sort();
            out.emit((key.clone(), (w.start, w.end, values)));
            Ok(())
        });
    let late_records = fired.side_output(&late).collect();
    let out = fired.collect();
    run(&env).unwrap();
    let history = by_key(&out.values());
    assert_eq!(
        history["a"],
        vec![
            (0, 5, vec![1]),
            (10, 15, vec![2]),
            (0, 15, vec![1, 2, 4]),
            (20, 25, vec![3]),
            (50, 55, vec![5])
        ]
    );
    assert_eq!(history.len(), 1);
    assert_eq!(late_records.sorted(), vec![kv("a", 6)]);
}

/// Flink semantics: a record is late only if the session it ends up in (after merging) is
/// late, not if the window it would open on its own is.
#[test]
fn an_out_of_order_record_inside_an_open_session_is_not_late() {
    let env = Env::new().parallelism(2);
    let input = vec![
        at("a", 1, 0),  // session [0,10)
        at("a", 2, 8),  // [0,18)
        at("a", 3, 16), // [0,26); wm 15
        at("b", 1, 20), // wm 19
        at("a", 4, 5),  // alone [5,15) would be over, but it falls in the open [0,26)
    ];
    let late = OutputTag::<(String, i64)>::new("late");
    let sums = event_time(&env, input, 0)
        .key_by(|(k, _)| k.clone())
        .window(WindowAssigner::session(10))
        .side_output_late_data(&late)
        .reduce(|a, b| (a.0, a.1 + b.1));
    let late_records = sums.side_output(&late).collect();
    let out = sums.collect();
    run(&env).unwrap();
    assert_eq!(out.sorted(), vec![kv("a", 10), kv("b", 1)]);
    assert_eq!(late_records.sorted(), vec![]);
}

#[test]
fn the_final_watermark_fires_every_window_at_end_of_input() {
    let env = Env::new().parallelism(2);
    let far = 1_000_000_000_000i64;
    // Timestamps come from the records (with_timestamps); the collection has none.
    let counts = env
        .from_collection(vec![
            kv("k", 7),
            kv("k", far),
            kv("k", far + 500),
            kv("j", far + 999),
        ])
        .with_watermarks(WatermarkStrategy::monotonous().with_timestamps(|r: &(String, i64)| r.1))
        .key_by(|(k, _)| k.clone())
        .window(WindowAssigner::tumbling(1000))
        .aggregate_with_window(Count, |k: &String, w: &TimeWindow, n: u64| {
            (k.clone(), w.start, n)
        })
        .collect();
    // A session far in event time and never closed by a later record.
    let sessions = env
        .from_timestamped(vec![(kv("s", 1), far), (kv("s", 2), far + 10)])
        .with_watermarks(WatermarkStrategy::bounded_out_of_orderness(5))
        .key_by(|(k, _)| k.clone())
        .window(WindowAssigner::session(1_000_000))
        .reduce(|a, b| (a.0, a.1 + b.1))
        .collect();
    run(&env).unwrap();
    assert_eq!(
        counts.sorted(),
        vec![
            ("j".to_string(), far, 1),
            ("k".to_string(), 0, 1),
            ("k".to_string(), far, 2)
        ]
    );
    assert_eq!(sessions.sorted(), vec![kv("s", 3)]);
}
