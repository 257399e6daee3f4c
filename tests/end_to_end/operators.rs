//! One-input operators with exact outputs: map, try_map, filter, flat_map, rolling reduce
//! and aggregate, keyed process functions with value, list and map state, union,
//! rebalance, broadcast, and the per-operator settings (parallelism, name, uid, chaining).

use std::collections::BTreeMap;
use weir::prelude::*;
use weir_tests::{BySubtask, by_key, kv, run};

#[test]
fn map_filter_flat_map_give_exact_outputs() {
    let env = Env::new().parallelism(2);
    let s = env.from_collection((1..=6i64).collect::<Vec<_>>());
    let mapped = s.map(|x| x * 3).collect();
    let filtered = s.filter(|x| x % 2 == 0).collect();
    // x is repeated x % 3 times: 1 once, 2 twice, 3 never, ...
    let flat = s
        .flat_map(|x| std::iter::repeat_n(x, (x % 3) as usize))
        .collect();
    let nothing = s.flat_map(|_| Vec::<i64>::new()).collect();
    run(&env).unwrap();
    assert_eq!(mapped.sorted(), vec![3, 6, 9, 12, 15, 18]);
    assert_eq!(filtered.sorted(), vec![2, 4, 6]);
    assert_eq!(flat.sorted(), vec![1, 2, 2, 4, 5, 5]);
    assert_eq!(nothing.values(), Vec::<i64>::new());
}

#[test]
fn a_single_subtask_chain_keeps_input_order() {
    let env = Env::new().parallelism(1);
    let out = env
        .from_collection(vec![5i64, 3, 9, 1, 7])
        .map(|x| x * 10)
        .filter(|x| *x != 90)
        .flat_map(|x| vec![x, x + 1])
        .collect();
    run(&env).unwrap();
    assert_eq!(out.values(), vec![50, 51, 30, 31, 10, 11, 70, 71]);
}

#[test]
fn try_map_transforms_when_every_record_succeeds() {
    let env = Env::new().parallelism(2);
    let out = env
        .from_collection(vec!["1".to_string(), "22".into(), "-333".into()])
        .try_map(|s| s.parse::<i64>().map_err(Error::user))
        .collect();
    run(&env).unwrap();
    assert_eq!(out.sorted(), vec![-333, 1, 22]);
}

fn sales() -> Vec<(String, i64)> {
    vec![
        kv("a", 1),
        kv("b", 10),
        kv("a", 2),
        kv("a", 3),
        kv("b", 20),
        kv("c", 5),
    ]
}

#[test]
fn rolling_reduce_emits_every_intermediate_value_per_key() {
    let env = Env::new().parallelism(2);
    let out = env
        .from_collection(sales())
        .key_by(|(k, _)| k.clone())
        .reduce(|a, b| (a.0, a.1 + b.1))
        .collect();
    run(&env).unwrap();
    assert_eq!(
        out.sorted(),
        vec![
            kv("a", 1),
            kv("a", 3),
            kv("a", 6),
            kv("b", 10),
            kv("b", 30),
            kv("c", 5)
        ]
    );
    // Per key, the running values come in input order.
    let per_key = by_key(&out.values());
    assert_eq!(per_key["a"], vec![1, 3, 6]);
    assert_eq!(per_key["b"], vec![10, 30]);
    assert_eq!(per_key["c"], vec![5]);
}

/// Tracks (key, count, min, max) of i64 values.
struct Stats;

impl AggregateFunction<(String, i64), (String, u64, i64, i64), (String, u64, i64, i64)> for Stats {
    fn create(&self) -> (String, u64, i64, i64) {
        (String::new(), 0, i64::MAX, i64::MIN)
    }
    fn add(&self, acc: &mut (String, u64, i64, i64), v: (String, i64)) {
        acc.0 = v.0;
        acc.1 += 1;
        acc.2 = acc.2.min(v.1);
        acc.3 = acc.3.max(v.1);
    }
    fn result(&self, acc: &(String, u64, i64, i64)) -> (String, u64, i64, i64) {
        acc.clone()
    }
    fn merge(&self, acc: &mut (String, u64, i64, i64), o: (String, u64, i64, i64)) {
        acc.1 += o.1;
        acc.2 = acc.2.min(o.2);
        acc.3 = acc.3.max(o.3);
    }
}

#[test]
fn rolling_aggregate_emits_the_result_after_every_record() {
    let env = Env::new().parallelism(2);
    let keyed = env
        .from_collection(vec![kv("a", 4), kv("b", 7), kv("a", -1), kv("a", 9)])
        .key_by(|(k, _)| k.clone());
    let stats = keyed.aggregate(Stats).collect();
    let counts = keyed.aggregate(Count).collect();
    run(&env).unwrap();
    let s = |k: &str, n, lo, hi| (k.to_string(), n, lo, hi);
    assert_eq!(
        stats.sorted(),
        vec![
            s("a", 1, 4, 4),
            s("a", 2, -1, 4),
            s("a", 3, -1, 9),
            s("b", 1, 7, 7)
        ]
    );
    assert_eq!(counts.sorted(), vec![1, 1, 2, 3]);
}

type Checkout = (String, u64, Vec<String>, Vec<(String, i64)>);

/// A shopping basket per user: counts events (value state), keeps the items added since
/// the last checkout (list state) and the quantity per item (map state); a "checkout"
/// emits all three and clears the basket.
#[derive(Default)]
struct Basket {
    events: Option<ValueState<u64>>,
    history: Option<ListState<String>>,
    totals: Option<MapState<String, i64>>,
}

impl KeyedProcessFunction<String, (String, String, i64), Checkout> for Basket {
    fn open(&mut self, state: &mut StateContext<String>) -> Result<()> {
        self.events = Some(state.value_state("events")?);
        self.history = Some(state.list_state("history")?);
        self.totals = Some(state.map_state("totals")?);
        Ok(())
    }

    fn process(
        &mut self,
        (user, item, qty): (String, String, i64),
        ctx: &mut KeyedContext<'_, String, Checkout>,
    ) -> Result<()> {
        let n = self
            .events
            .as_mut()
            .unwrap()
            .update(|c| c.unwrap_or(0) + 1)?;
        let history = self.history.as_mut().unwrap();
        let totals = self.totals.as_mut().unwrap();
        if item == "checkout" {
            assert_eq!(&user, ctx.key());
            ctx.emit((user, n, history.get()?, totals.entries()?));
            history.clear()?;
            totals.clear()?;
            return Ok(());
        }
        history.add(item.clone())?;
        let total = totals.get(&item)?.unwrap_or(0) + qty;
        if total > 0 {
            totals.put(item, total)?;
        } else {
            assert_eq!(totals.remove(&item)?, Some(total - qty));
            assert!(!totals.contains(&item)?);
        }
        Ok(())
    }
}

#[test]
fn keyed_process_function_uses_value_list_and_map_state_per_key() {
    let ev = |u: &str, i: &str, q: i64| (u.to_string(), i.to_string(), q);
    let input = vec![
        ev("u1", "apple", 2),
        ev("u2", "pear", 1),
        ev("u1", "plum", 1),
        ev("u1", "apple", 3),
        ev("u2", "checkout", 0),
        ev("u1", "plum", -1),
        ev("u3", "checkout", 0),
        ev("u1", "checkout", 0),
        ev("u1", "fig", 5),
        ev("u1", "checkout", 0),
    ];
    let env = Env::new().parallelism(3);
    let out = env
        .from_collection(input)
        .key_by(|e| e.0.clone())
        .process(Basket::default)
        .collect();
    run(&env).unwrap();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let t = |v: &[(&str, i64)]| {
        v.iter()
            .map(|(k, n)| (k.to_string(), *n))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        out.sorted(),
        vec![
            (
                "u1".to_string(),
                5,
                s(&["apple", "plum", "apple", "plum"]),
                t(&[("apple", 5)])
            ),
            ("u1".to_string(), 7, s(&["fig"]), t(&[("fig", 5)])),
            ("u2".to_string(), 2, s(&["pear"]), t(&[("pear", 1)])),
            ("u3".to_string(), 1, vec![], vec![]),
        ]
    );
}

#[test]
fn union_merges_streams_of_different_parallelism() {
    let env = Env::new().parallelism(2);
    let a = env.from_collection(vec![1i64, 2, 3]);
    let b = env
        .from_collection(vec![10i64, 20])
        .map(|x| x + 1)
        .parallelism(3);
    let c = env.from_iter(vec![100i64]);
    let out = a.union(&[b, c]).map(|x| x * 2).collect();
    run(&env).unwrap();
    assert_eq!(out.sorted(), vec![2, 4, 6, 22, 42, 200]);
}

#[test]
fn rebalance_spreads_records_evenly_over_subtasks() {
    let env = Env::new().parallelism(3);
    let input: Vec<i64> = (0..12).collect();
    let by = BySubtask::attach(&env.from_collection(input.clone()).rebalance(), 3);
    run(&env).unwrap();
    let per = by.per_subtask();
    assert_eq!(per.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2]);
    for (s, v) in &per {
        assert_eq!(v.len(), 4, "subtask {s} got {v:?}");
    }
    let mut all: Vec<i64> = per.into_values().flatten().collect();
    all.sort();
    assert_eq!(all, input);
}

#[test]
fn broadcast_sends_every_record_to_every_subtask() {
    let env = Env::new().parallelism(3);
    let s = env.from_collection(vec![1i64, 2, 3, 4, 5]);
    let by = BySubtask::attach(&s.broadcast(), 3);
    // A subtask-independent transform after broadcast: every value appears once per subtask.
    let mapped = s.broadcast().map(|x| x * 10).parallelism(3).collect();
    run(&env).unwrap();
    let per = by.per_subtask();
    assert_eq!(per.len(), 3);
    for (s, v) in &per {
        assert_eq!(v, &vec![1, 2, 3, 4, 5], "subtask {s}");
    }
    let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
    for v in mapped.values() {
        *counts.entry(v).or_default() += 1;
    }
    assert_eq!(
        counts,
        BTreeMap::from([(10, 3), (20, 3), (30, 3), (40, 3), (50, 3)])
    );
}

/// (task name, number of subtasks) of a finished job.
fn tasks(r: &JobResult) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for t in &r.tasks {
        *m.entry(t.name.clone()).or_default() += 1;
    }
    m
}

#[test]
fn per_operator_parallelism_name_and_disable_chaining_shape_the_tasks() {
    let build = |disable: bool| {
        let env = Env::new().parallelism(3);
        let plus = env
            .from_collection((1..=9i64).collect::<Vec<_>>())
            .map(|x| x + 1)
            .name("plus-one")
            .parallelism(3);
        let double = plus.map(|x| x * 2).name("double");
        let double = if disable {
            double.disable_chaining()
        } else {
            double
        };
        let out = double.collect();
        let r = run(&env).unwrap();
        (tasks(&r), out.sorted(), r.records_read())
    };
    let expected: Vec<i64> = (2..=10).map(|x| x * 2).collect();

    let (t, out, read) = build(false);
    assert_eq!(out, expected);
    assert_eq!(read, 9);
    // "double" and the sink are chained into the "plus-one" tasks.
    let want = |pairs: &[(&str, usize)]| {
        pairs
            .iter()
            .map(|(n, c)| (n.to_string(), *c))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(t, want(&[("collection", 1), ("plus-one", 3)]));

    let (t, out, _) = build(true);
    assert_eq!(out, expected);
    assert_eq!(
        t,
        want(&[("collection", 1), ("double", 3), ("plus-one", 3)])
    );
}

#[test]
fn sink_and_keyed_operator_parallelism_and_names_apply() {
    let env = Env::new().parallelism(2);
    let sum = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    let target = sum.clone();
    env.from_collection((1..=100i64).collect::<Vec<_>>())
        .key_by(|x| x % 5)
        .reduce(|a, b| a.max(b))
        .name("max-per-class")
        .parallelism(4)
        .for_each(move || {
            let target = target.clone();
            move |v, _| {
                target.fetch_add(v, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
        })
        .name("adder")
        .parallelism(1);
    let r = run(&env).unwrap();
    let t = tasks(&r);
    assert_eq!(t["max-per-class"], 4);
    assert_eq!(t["adder"], 1);
    // The sum of all rolling maxima: for class c, values c, c+5, ... are increasing, so the
    // rolling max is each value itself.
    assert_eq!(sum.load(std::sync::atomic::Ordering::Relaxed), 5050);
}

#[test]
fn uid_is_recorded_and_does_not_change_results() {
    let env = Env::new().parallelism(2);
    let out = env
        .from_collection(vec![kv("x", 1), kv("x", 2)])
        .uid("numbers-v1")
        .key_by(|(k, _)| k.clone())
        .reduce(|a, b| (a.0, a.1 + b.1))
        .uid("sum-v1")
        .name("sum")
        .collect();
    let mut uids: Vec<(String, String)> = env.with_graph(|g| {
        g.nodes
            .iter()
            .filter_map(|n| n.uid.clone().map(|u| (n.name.clone(), u)))
            .collect()
    });
    uids.sort();
    assert_eq!(
        uids,
        vec![
            ("collection".to_string(), "numbers-v1".to_string()),
            ("sum".to_string(), "sum-v1".to_string())
        ]
    );
    run(&env).unwrap();
    assert_eq!(out.sorted(), vec![kv("x", 1), kv("x", 3)]);
}
