//! Results do not depend on parallelism: keyed aggregations and window counts give the
//! same multiset at parallelism 1, 2 and 4 (fixed inputs and a property over random ones).

use proptest::prelude::*;
use std::collections::BTreeMap;
use weir::prelude::*;
use weir_tests::run;

#[test]
fn generator_keyed_sums_and_window_counts_agree_across_parallelism() {
    let (events, keys) = (4000u64, 8u64);
    for p in [1, 2, 4] {
        let env = Env::new().parallelism(p);
        let src = env.generator(events, keys);
        let rolling = src
            .key_by(|(k, _)| *k)
            .reduce(|a, b| (a.0, a.1 + b.1))
            .collect();
        let counts = src
            .with_watermarks(WatermarkStrategy::monotonous())
            .key_by(|(k, _)| *k)
            .window(WindowAssigner::tumbling(100))
            .aggregate_with_window(Count, |k: &u64, w: &TimeWindow, n: u64| (*k, w.start, n))
            .collect();
        run(&env).unwrap();

        // Rolling sums: the arrival order of a key's records across source subtasks may
        // vary, but each key emits once per record and ends at the key's total.
        let mut last: BTreeMap<u64, (usize, i64)> = BTreeMap::new();
        for (k, s) in rolling.values() {
            let e = last.entry(k).or_default();
            e.0 += 1;
            e.1 = e.1.max(s);
        }
        for k in 0..keys {
            let total: i64 = (0..events as i64).filter(|i| *i as u64 % keys == k).sum();
            assert_eq!(last[&k], ((events / keys) as usize, total), "p {p} key {k}");
        }
        assert_eq!(last.len(), keys as usize);

        // Windows of 100 event-time units hold 100 / 8 rounded per key.
        let mut expected = Vec::new();
        for start in (0..events as i64).step_by(100) {
            for k in 0..keys {
                let n = (start..start + 100)
                    .filter(|i| *i as u64 % keys == k)
                    .count() as u64;
                expected.push((k, start, n));
            }
        }
        expected.sort();
        assert_eq!(counts.sorted(), expected, "p {p}");
    }
}

/// Sorted (key, running sum) and (key, window start, count) results.
type Results = (Vec<(u8, i64)>, Vec<(u8, i64, u64)>);

/// Per-key running sums in input order, and per (key, tumbling window of 20) counts.
fn model(input: &[(u8, i64, i64)]) -> Results {
    let mut sums: BTreeMap<u8, i64> = BTreeMap::new();
    let mut rolling = Vec::new();
    let mut windows: BTreeMap<(u8, i64), u64> = BTreeMap::new();
    for &(k, v, ts) in input {
        let s = sums.entry(k).or_default();
        *s += v;
        rolling.push((k, *s));
        *windows.entry((k, ts - ts.rem_euclid(20))).or_default() += 1;
    }
    rolling.sort();
    let windows = windows.into_iter().map(|((k, s), n)| (k, s, n)).collect();
    (rolling, windows)
}

fn run_at(parallelism: usize, input: &[(u8, i64, i64)]) -> Results {
    let env = Env::new().parallelism(parallelism);
    let src = env.from_timestamped(input.iter().map(|&(k, v, ts)| ((k, v), ts)).collect());
    let rolling = src
        .key_by(|r| r.0)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .collect();
    // The bound exceeds the timestamp range, so no record is ever late.
    let windows = src
        .with_watermarks(WatermarkStrategy::bounded_out_of_orderness(1000))
        .key_by(|r| r.0)
        .window(WindowAssigner::tumbling(20))
        .aggregate_with_window(Count, |k: &u8, w: &TimeWindow, n: u64| (*k, w.start, n))
        .collect();
    run(&env).unwrap();
    (rolling.sorted(), windows.sorted())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn keyed_results_are_the_same_at_parallelism_1_2_and_4(
        input in prop::collection::vec((0u8..6, -50i64..50, 0i64..200), 0..300)
    ) {
        let expected = model(&input);
        for p in [1, 2, 4] {
            prop_assert_eq!(run_at(p, &input), expected.clone(), "parallelism {}", p);
        }
    }
}
