//! Tables: the latest value per key, stream–table joins and aggregations with
//! retractions, run on the local runtime on both state backends. Changelogs are compared
//! in full: per key (each key's changes keep their order through every exchange) or, at
//! parallelism 1, as one sequence. The restore test runs the same job four times on one
//! checkpoint directory at parallelism 1, 3, 2 and 3, feeding only one input of the join
//! per run so that every result is exact.

use std::collections::BTreeMap;
use std::time::Duration;
use weir::prelude::*;
use weir_tests::run;

type Account = (String, Option<(String, i64)>);

fn upsert(account: &str, row: Option<(&str, i64)>) -> Account {
    (account.into(), row.map(|(r, n)| (r.to_string(), n)))
}

fn ins<V>(key: &str, value: V) -> Change<String, V> {
    Change::Insert {
        key: key.into(),
        value,
    }
}
fn upd<V>(key: &str, old: V, new: V) -> Change<String, V> {
    Change::Update {
        key: key.into(),
        old,
        new,
    }
}
fn del<V>(key: &str, old: V) -> Change<String, V> {
    Change::Delete {
        key: key.into(),
        old,
    }
}
fn rv(region: &str, n: i64) -> (String, i64) {
    (region.into(), n)
}

/// Each key's changes, in the order they came.
fn per_key<V: Clone>(changes: Vec<Change<String, V>>) -> BTreeMap<String, Vec<Change<String, V>>> {
    let mut m: BTreeMap<String, Vec<Change<String, V>>> = BTreeMap::new();
    for c in changes {
        m.entry(c.key().clone()).or_default().push(c);
    }
    m
}

fn backend(name: &str) -> BackendKind {
    BackendKind::parse(name).unwrap()
}

/// Upserts and deletes of five devices through a table at parallelism 3: every device's
/// full history, each change with the value it replaced.
fn to_table_history(state: &str) {
    let env = Env::new().parallelism(3).state_backend(backend(state));
    let readings: Vec<(String, i64)> = vec![
        ("d1".into(), 1),
        ("d2".into(), 10),
        ("d1".into(), 2),
        ("d3".into(), 100),
        ("d1".into(), 2),
        ("d2".into(), 11),
    ];
    let latest = env
        .from_collection(readings)
        .key_by(|(d, _)| d.clone())
        .to_table()
        .map_values(|(_, v)| v)
        .changes()
        .collect();
    let feed = env.from_collection(vec![
        upsert("a", Some(("eu", 1))),
        upsert("b", None),
        upsert("a", Some(("us", 2))),
        upsert("b", Some(("eu", 3))),
        upsert("a", None),
        upsert("a", None),
        upsert("a", Some(("eu", 4))),
    ]);
    let upserted = Table::from_upserts(&feed).changes().collect();
    run(&env).unwrap();

    let want = BTreeMap::from([
        (
            "d1".to_string(),
            vec![ins("d1", 1), upd("d1", 1, 2), upd("d1", 2, 2)],
        ),
        ("d2".to_string(), vec![ins("d2", 10), upd("d2", 10, 11)]),
        ("d3".to_string(), vec![ins("d3", 100)]),
    ]);
    assert_eq!(per_key(latest.values()), want);
    let want = BTreeMap::from([
        (
            "a".to_string(),
            vec![
                ins("a", rv("eu", 1)),
                upd("a", rv("eu", 1), rv("us", 2)),
                del("a", rv("us", 2)),
                ins("a", rv("eu", 4)),
            ],
        ),
        ("b".to_string(), vec![ins("b", rv("eu", 3))]),
    ]);
    assert_eq!(per_key(upserted.values()), want);
}

#[test]
fn a_table_records_every_change_with_its_old_value_on_the_memory_backend() {
    to_table_history("memory");
}

#[test]
fn a_table_records_every_change_with_its_old_value_on_rocksdb() {
    to_table_history("rocksdb");
}

/// Accounts move between regions, change within one, and go away; the per-region sum
/// and count, at parallelism 1 (one sequence), are compared change by change.
fn aggregation_history(state: &str) {
    let env = Env::new().parallelism(1).state_backend(backend(state));
    let accounts = Table::from_upserts(&env.from_collection(vec![
        upsert("a1", Some(("eu", 10))),
        upsert("a2", Some(("eu", 5))),
        upsert("a3", Some(("us", 7))),
        upsert("a1", Some(("eu", 12))),
        upsert("a3", Some(("eu", 7))),  // us empties
        upsert("a2", Some(("us", 1))),  // a2 moves to us
        upsert("a1", Some(("eu", 12))), // the same value: the sum stays, nothing emitted
        upsert("a2", None),
        upsert("a1", None),
        upsert("a3", None), // eu empties
    ]));
    let by_region = accounts.group_by(|_, (region, _)| region.clone());
    let sums = by_region.sum_by(|(_, n)| *n).changes().collect();
    let counts = by_region.count().changes().collect();
    run(&env).unwrap();

    assert_eq!(
        sums.values(),
        vec![
            ins("eu", 10),
            upd("eu", 10, 15),
            ins("us", 7),
            upd("eu", 15, 17),
            del("us", 7),
            upd("eu", 17, 24),
            upd("eu", 24, 19),
            ins("us", 1),
            del("us", 1),
            upd("eu", 19, 7),
            del("eu", 7),
        ]
    );
    assert_eq!(
        counts.values(),
        vec![
            ins("eu", 1),
            upd("eu", 1, 2),
            ins("us", 1),
            del("us", 1),
            upd("eu", 2, 3),
            upd("eu", 3, 2),
            ins("us", 1),
            del("us", 1),
            upd("eu", 2, 1),
            del("eu", 1),
        ]
    );
}

#[test]
fn group_by_retracts_moved_and_deleted_rows_on_the_memory_backend() {
    aggregation_history("memory");
}

#[test]
fn group_by_retracts_moved_and_deleted_rows_on_rocksdb() {
    aggregation_history("rocksdb");
}

/// At parallelism 3 a group's changes come from several subtasks in any interleaving, so
/// only the chain is fixed: each change starts from the value the previous one left, and
/// the last value of every group is the sum of its accounts' final amounts.
#[test]
fn parallel_group_changes_chain_to_the_exact_final_sums() {
    let env = Env::new().parallelism(3);
    let mut input = Vec::new();
    let mut last: BTreeMap<String, (String, i64)> = BTreeMap::new();
    for i in 0..600i64 {
        let account = format!("a{}", i % 37);
        if i % 11 == 0 {
            input.push(upsert(&account, None));
            last.remove(&account);
        } else {
            let region = ["eu", "us", "apac", "latam"][(i % 7 % 4) as usize];
            input.push(upsert(&account, Some((region, i))));
            last.insert(account, (region.to_string(), i));
        }
    }
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    for (region, n) in last.values() {
        *want.entry(region.clone()).or_default() += n;
    }
    let sums = Table::from_upserts(&env.from_collection(input))
        .group_by(|_, (region, _)| region.clone())
        .sum_by(|(_, n)| *n)
        .changes()
        .collect();
    run(&env).unwrap();

    let mut got = BTreeMap::new();
    for (region, changes) in per_key(sums.values()) {
        let mut now: Option<i64> = None;
        for c in changes {
            assert_eq!(c.old_value().copied(), now, "{region}: {c:?} after {now:?}");
            now = c.new_value().copied();
        }
        if let Some(n) = now {
            got.insert(region, n);
        }
    }
    assert_eq!(got, want);
}

/// The accounts table, its per-region sums and both joins, with stable ids, on the
/// checkpoint directory `dir`: returns (table changes, sums, inner, left), each sorted.
type Outputs = (
    Vec<String>,
    Vec<String>,
    Vec<(String, i64, String)>,
    Vec<(String, i64, Option<String>)>,
);

fn accounts_job(
    dir: &std::path::Path,
    parallelism: usize,
    state: &str,
    upserts: &[Account],
    orders: &[(String, i64)],
) -> Outputs {
    let env = Env::new()
        .parallelism(parallelism)
        .state_backend(backend(state))
        .checkpoints(CheckpointConfig::new(dir).interval(Duration::ZERO));
    let accounts =
        Table::from_upserts(&env.from_collection(upserts.to_vec()).uid("upserts")).uid("accounts");
    let sums = accounts
        .group_by(|_, (region, _)| region.clone())
        .sum_by(|(_, n)| *n)
        .uid("sums");
    let orders = env
        .from_collection(orders.to_vec())
        .uid("orders")
        .key_by(|(account, _)| account.clone());
    let inner = orders
        .join_table(&accounts)
        .inner(|(a, n), (region, _)| (a, n, region))
        .uid("inner-join")
        .collect();
    let left = orders
        .join_table(&accounts)
        .left(|(a, n), row| (a, n, row.map(|(region, _)| region)))
        .uid("left-join")
        .collect();
    let changes = accounts.changes().collect();
    let sum_changes = sums.changes().collect();
    run(&env).unwrap();
    let show = |v: Vec<String>| {
        let mut v = v;
        v.sort();
        v
    };
    (
        show(changes.values().iter().map(|c| format!("{c:?}")).collect()),
        show(
            sum_changes
                .values()
                .iter()
                .map(|c| format!("{c:?}"))
                .collect(),
        ),
        inner.sorted(),
        left.sorted(),
    )
}

fn debug<V: std::fmt::Debug>(changes: Vec<Change<String, V>>) -> Vec<String> {
    let mut v: Vec<String> = changes.iter().map(|c| format!("{c:?}")).collect();
    v.sort();
    v
}

/// A table's rows, the join's copy of them and the group sums survive restarts at other
/// parallelisms: after each restore, changes carry the old values from before it and
/// orders are joined with the rows loaded in an earlier run.
fn restore_at_other_parallelism(state: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut upserts = vec![
        upsert("a1", Some(("eu", 10))),
        upsert("a2", Some(("eu", 5))),
        upsert("a3", Some(("us", 7))),
    ];
    let mut orders: Vec<(String, i64)> = Vec::new();

    // Run 1, parallelism 1: the table is loaded; no orders yet.
    let (changes, sums, inner, left) = accounts_job(dir.path(), 1, state, &upserts, &orders);
    assert_eq!(
        changes,
        debug(vec![
            ins("a1", rv("eu", 10)),
            ins("a2", rv("eu", 5)),
            ins("a3", rv("us", 7))
        ])
    );
    assert_eq!(
        sums,
        debug(vec![ins("eu", 10), upd("eu", 10, 15), ins("us", 7)])
    );
    assert!(inner.is_empty() && left.is_empty());

    // Run 2, parallelism 3: orders only, joined with the restored rows.
    orders.extend([("a1".into(), 100), ("a2".into(), 200), ("a4".into(), 400)]);
    let (changes, sums, inner, left) = accounts_job(dir.path(), 3, state, &upserts, &orders);
    assert!(
        changes.is_empty() && sums.is_empty(),
        "{changes:?} {sums:?}"
    );
    assert_eq!(
        inner,
        vec![
            ("a1".to_string(), 100, "eu".to_string()),
            ("a2".into(), 200, "eu".into())
        ]
    );
    assert_eq!(
        left,
        vec![
            ("a1".to_string(), 100, Some("eu".to_string())),
            ("a2".into(), 200, Some("eu".into())),
            ("a4".into(), 400, None)
        ]
    );

    // Run 3, parallelism 2: a1 moves to apac, a3 goes away. Each group is touched by one
    // account, so its changes are exact even in parallel; the old values come from the
    // restored state.
    upserts.extend([upsert("a1", Some(("apac", 12))), upsert("a3", None)]);
    let (changes, sums, inner, left) = accounts_job(dir.path(), 2, state, &upserts, &orders);
    assert_eq!(
        changes,
        debug(vec![
            upd("a1", rv("eu", 10), rv("apac", 12)),
            del("a3", rv("us", 7))
        ])
    );
    assert_eq!(
        sums,
        debug(vec![upd("eu", 15, 5), ins("apac", 12), del("us", 7)])
    );
    assert!(inner.is_empty() && left.is_empty());

    // Run 4, parallelism 3: orders see the rows as run 3 left them.
    orders.extend([("a1".into(), 101), ("a3".into(), 301), ("a2".into(), 201)]);
    let (changes, sums, inner, left) = accounts_job(dir.path(), 3, state, &upserts, &orders);
    assert!(
        changes.is_empty() && sums.is_empty(),
        "{changes:?} {sums:?}"
    );
    assert_eq!(
        inner,
        vec![
            ("a1".to_string(), 101, "apac".to_string()),
            ("a2".into(), 201, "eu".into())
        ]
    );
    assert_eq!(
        left,
        vec![
            ("a1".to_string(), 101, Some("apac".to_string())),
            ("a2".into(), 201, Some("eu".into())),
            ("a3".into(), 301, None)
        ]
    );
}

#[test]
fn tables_joins_and_sums_restore_at_another_parallelism_on_the_memory_backend() {
    restore_at_other_parallelism("memory");
}

#[test]
fn tables_joins_and_sums_restore_at_another_parallelism_on_rocksdb() {
    restore_at_other_parallelism("rocksdb");
}
