//! Window joins: pairs of records with equal keys in the same window, exactly once per
//! shared window.

use weir::prelude::*;
use weir_tests::run;

#[test]
fn tumbling_window_join_pairs_records_of_a_key_in_the_same_window() {
    let env = Env::new().parallelism(2);
    let orders = env
        .from_timestamped(vec![
            ((1u32, 100u32), 1),
            ((1, 101), 4),
            ((2, 200), 5),
            ((1, 102), 12),
            ((3, 300), 3),
        ])
        .with_watermarks(WatermarkStrategy::monotonous());
    let payments = env
        .from_timestamped(vec![
            ((1u32, "p1".to_string()), 2),
            ((1, "p2".to_string()), 8),
            ((2, "q".to_string()), 15), // customer 2 paid in the next window: no pair
            ((1, "p3".to_string()), 11),
            ((4, "z".to_string()), 1), // no order from customer 4
        ])
        .with_watermarks(WatermarkStrategy::monotonous());
    let joined = orders
        .key_by(|o| o.0)
        .join(&payments.key_by(|p| p.0))
        .window(WindowAssigner::tumbling(10))
        .apply(|o, p| (o.0, o.1, p.1))
        .collect();
    run(&env).unwrap();
    let j = |c: u32, o: u32, p: &str| (c, o, p.to_string());
    assert_eq!(
        joined.sorted(),
        vec![
            j(1, 100, "p1"),
            j(1, 100, "p2"),
            j(1, 101, "p1"),
            j(1, 101, "p2"),
            j(1, 102, "p3")
        ]
    );
}

#[test]
fn sliding_window_join_emits_a_pair_once_per_shared_window() {
    let env = Env::new().parallelism(2);
    let left = env
        .from_timestamped(vec![
            (("k".to_string(), 1i64), 4),
            (("k".to_string(), 2), 7),
        ])
        .with_watermarks(WatermarkStrategy::monotonous());
    let right = env
        .from_timestamped(vec![
            (("k".to_string(), 'x'), 6),
            (("k".to_string(), 'y'), 8),
        ])
        .with_watermarks(WatermarkStrategy::monotonous());
    let joined = left
        .key_by(|l| l.0.clone())
        .join(&right.key_by(|r| r.0.clone()))
        .window(WindowAssigner::sliding(10, 5))
        .apply(|l, r| (l.1, r.1))
        .collect();
    run(&env).unwrap();
    // 1@4 is in [-5,5) and [0,10); 2@7, x@6 and y@8 are in [0,10) and [5,15).
    // [0,10) pairs {1,2}x{x,y}; [5,15) pairs {2}x{x,y}.
    assert_eq!(
        joined.sorted(),
        vec![(1, 'x'), (1, 'y'), (2, 'x'), (2, 'x'), (2, 'y'), (2, 'y')]
    );
}

#[test]
#[should_panic(expected = "not sessions")]
fn a_session_window_join_is_rejected() {
    let env = Env::new();
    let a = env.from_collection(vec![1u32]).key_by(|x| *x);
    let b = env.from_collection(vec![1u32]).key_by(|x| *x);
    let _ = a.join(&b).window(WindowAssigner::session(5));
}
