//! Changelogs written into tables through the upsert sink, in-process: the exact rows after
//! exactly-once and at-least-once runs, with and without checkpoints, a composite key, and
//! the errors a user meets when the table and the mapping do not fit.

use crate::support::{Schema, unique, url};
use std::collections::BTreeMap;
use std::time::Duration;
use weir::prelude::*;
use weir::retry::RetryPolicy;
use weir_postgres::{UpsertGuarantee, Upserts};
use weir_tests::{run, run_failing};

/// (region, account) → (total, label)
type K = (String, i64);
type V = (i64, String);

fn k(region: &str, account: i64) -> K {
    (region.to_string(), account)
}

/// A changelog over 30 keys in 2 regions: inserts, several updates per key, deletes, a key
/// deleted and inserted again, a key inserted and deleted at once; and the table it leaves.
fn changelog() -> (Vec<Change<K, V>>, BTreeMap<K, V>) {
    let mut changes = Vec::new();
    let mut table: BTreeMap<K, V> = BTreeMap::new();
    let mut apply = |c: Change<K, V>, table: &mut BTreeMap<K, V>| {
        match c.new_value() {
            Some(v) => table.insert(c.key().clone(), v.clone()),
            None => table.remove(c.key()),
        };
        changes.push(c);
    };
    for round in 0..4i64 {
        for a in 0..30i64 {
            let key = k(if a % 2 == 0 { "eu" } else { "us" }, a);
            let value = (a * 100 + round, format!("r{round}"));
            let c = match table.get(&key).cloned() {
                None => Change::Insert { key, value },
                Some(old) if (a + round) % 7 == 0 => Change::Delete { key, old },
                Some(old) => Change::Update {
                    key,
                    old,
                    new: value,
                },
            };
            apply(c, &mut table);
        }
    }
    // Inserted and deleted before any checkpoint could separate them.
    apply(
        Change::Insert {
            key: k("eu", 99),
            value: (1, "gone".into()),
        },
        &mut table,
    );
    apply(
        Change::Delete {
            key: k("eu", 99),
            old: (1, "gone".into()),
        },
        &mut table,
    );
    (changes, table)
}

fn create_table(s: &mut Schema) -> String {
    let t = format!("{}.totals", s.name);
    s.db.batch_execute(&format!(
        "CREATE TABLE {t} (region TEXT NOT NULL, account BIGINT NOT NULL, total BIGINT NOT NULL,
             label TEXT NOT NULL, PRIMARY KEY (region, account))"
    ))
    .unwrap();
    t
}

fn upserts(s: &Schema, table: &str) -> Upserts<K, V> {
    Upserts::new(url(), table)
        .key_columns(&["region", "account"], |(r, a): &K| {
            vec![Box::new(r.clone()), Box::new(*a)]
        })
        .value_columns(&["total", "label"], |(t, l): &V| {
            vec![Box::new(*t), Box::new(l.clone())]
        })
        .keys_table(&format!("{}.processed_messages", s.name))
        .retry(RetryPolicy {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(20),
            max_attempts: 3,
            ..RetryPolicy::default()
        })
}

fn rows(s: &mut Schema, table: &str) -> BTreeMap<K, V> {
    s.db.query(
        &format!("SELECT region, account, total, label FROM {table}"),
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| ((r.get(0), r.get(1)), (r.get(2), r.get(3))))
    .collect()
}

/// The batch keys in the schema's `processed_messages`, with their states.
fn batch_keys(s: &mut Schema) -> Vec<(String, String)> {
    s.db.query(
        &format!(
            "SELECT handler, state FROM {}.processed_messages ORDER BY idempotency_key",
            s.name
        ),
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// A source that yields the changes slowly enough for several checkpoints to pass.
fn paced_env(parallelism: usize, dir: Option<&std::path::Path>) -> Env {
    let env = Env::new().parallelism(parallelism);
    match dir {
        Some(d) => env.checkpoints(CheckpointConfig::new(d).interval(Duration::from_millis(30))),
        None => env,
    }
}

fn write_changes(env: &Env, changes: Vec<Change<K, V>>, sink: Upserts<K, V>, op: &str) {
    env.from_iter(changes)
        .parallelism(1)
        .map(|c| {
            // Spread the input over several checkpoints.
            std::thread::sleep(Duration::from_micros(300));
            c
        })
        // In one subtask, as a table's changes come: in order per key.
        .parallelism(1)
        .sink_changes(op, sink.make());
}

#[test]
fn exactly_once_upserts_leave_the_latest_row_of_every_key() {
    let mut s = Schema::bare("upsert_eo");
    let t = create_table(&mut s);
    let (changes, want) = changelog();
    let dir = tempfile::tempdir().unwrap();
    let env = paced_env(2, Some(dir.path()));
    let op = unique("totals");
    write_changes(&env, changes.clone(), upserts(&s, &t), &op);
    run(&env).unwrap();
    assert_eq!(rows(&mut s, &t), want);
    // Every write went through the APPLY protocol: one DONE key per batch, and the rows
    // written add up to at most one per key and batch.
    let keys = batch_keys(&mut s);
    assert!(!keys.is_empty());
    assert!(
        keys.iter()
            .all(|(h, st)| h == &format!("upsert {t}") && st == "DONE"),
        "{keys:?}"
    );
    let written = weir::metrics::sum("upsert_rows_written_total", &[("operator", &op)]);
    let batches = weir::metrics::sum("upsert_batches_written_total", &[("operator", &op)]);
    assert_eq!(batches, keys.len() as f64);
    assert!(
        written <= changes.len() as f64 && written >= want.len() as f64,
        "{written} rows written for {} changes",
        changes.len()
    );
}

#[test]
fn without_checkpoints_exactly_once_writes_everything_in_one_transaction_at_the_end() {
    let mut s = Schema::bare("upsert_end");
    let t = create_table(&mut s);
    let (changes, want) = changelog();
    let env = paced_env(1, None);
    let op = unique("totals");
    let distinct: std::collections::BTreeSet<K> = changes.iter().map(|c| c.key().clone()).collect();
    write_changes(&env, changes, upserts(&s, &t), &op);
    run(&env).unwrap();
    assert_eq!(rows(&mut s, &t), want);
    // The changes of each key collapsed to its last: one row written per key.
    assert_eq!(
        weir::metrics::sum("upsert_rows_written_total", &[("operator", &op)]),
        distinct.len() as f64
    );
    assert_eq!(
        batch_keys(&mut s),
        vec![(format!("upsert {t}"), "DONE".to_string())]
    );
}

#[test]
fn at_least_once_upserts_end_with_the_same_table_and_no_keys() {
    for checkpoints in [false, true] {
        let mut s = Schema::bare("upsert_alo");
        let t = create_table(&mut s);
        let (changes, want) = changelog();
        let dir = tempfile::tempdir().unwrap();
        let env = paced_env(2, checkpoints.then_some(dir.path()));
        let op = unique("totals");
        let sink = upserts(&s, &t)
            .guarantee(UpsertGuarantee::AtLeastOnce)
            .batch_size(7);
        write_changes(&env, changes.clone(), sink, &op);
        run(&env).unwrap();
        assert_eq!(rows(&mut s, &t), want, "checkpoints: {checkpoints}");
        let keys_table: Option<String> =
            s.db.query_one(
                "SELECT to_regclass($1)::text",
                &[&format!("{}.processed_messages", s.name)],
            )
            .unwrap()
            .get(0);
        assert_eq!(keys_table, None, "at-least-once keeps no keys");
        // Batches of at most 7 keys: more than one transaction per subtask.
        let batches = weir::metrics::sum("upsert_batches_written_total", &[("operator", &op)]);
        assert!(batches >= (want.len() / 7) as f64, "{batches} batches");
    }
}

/// Runs a one-change job into `table` with `sink` and returns its error message.
fn failure(sink: Upserts<K, V>) -> String {
    let env = Env::new();
    env.from_iter(vec![Change::Insert {
        key: k("eu", 1),
        value: (1, "x".to_string()),
    }])
    .sink_changes("totals", sink.make());
    run_failing(&env).to_string()
}

#[test]
fn a_missing_table_is_named_with_the_statement_that_creates_it() {
    let s = Schema::bare("upsert_notable");
    let t = format!("{}.nowhere", s.name);
    let e = failure(upserts(&s, &t));
    assert!(
        e.contains(&format!("table '{t}' does not exist"))
            && e.contains("CREATE TABLE")
            && e.contains("PRIMARY KEY"),
        "{e}"
    );
}

#[test]
fn a_missing_key_column_is_named_with_the_columns_the_table_has() {
    let mut s = Schema::bare("upsert_nocol");
    let t = format!("{}.totals", s.name);
    s.db.batch_execute(&format!(
        "CREATE TABLE {t} (region TEXT, acct BIGINT, total BIGINT, label TEXT, PRIMARY KEY (region, acct))"
    ))
    .unwrap();
    let e = failure(upserts(&s, &t));
    assert!(
        e.contains(&format!(
            "table '{t}' has no column 'account' (named as a key column)"
        )) && e.contains("region, acct, total, label"),
        "{e}"
    );
}

#[test]
fn key_columns_without_a_unique_constraint_are_refused_with_the_fix() {
    let mut s = Schema::bare("upsert_nopk");
    let t = format!("{}.totals", s.name);
    s.db.batch_execute(&format!(
        "CREATE TABLE {t} (region TEXT, account BIGINT, total BIGINT, label TEXT, UNIQUE (account))"
    ))
    .unwrap();
    let e = failure(upserts(&s, &t));
    assert!(
        e.contains("no primary key or unique constraint on exactly (region, account)")
            && e.contains(&format!(
                "ALTER TABLE {t} ADD PRIMARY KEY (region, account)"
            )),
        "{e}"
    );
}

#[test]
fn a_mapping_that_does_not_fit_the_columns_fails_without_retrying() {
    let mut s = Schema::bare("upsert_mapping");
    let t = create_table(&mut s);
    // One value for two value columns.
    let short = upserts(&s, &t).value_columns(&["total", "label"], |(t, _): &V| vec![Box::new(*t)]);
    let e = failure(short);
    assert!(
        e.contains("the value mapping gave 1 value(s) for the 2 value column(s) (total, label)")
            && e.contains("after 1 attempt(s)"),
        "{e}"
    );
    // An i32 for a BIGINT column: a type error, named with the columns, not retried.
    let wrong = upserts(&s, &t).value_columns(&["total", "label"], |(t, l): &V| {
        vec![Box::new(*t as i32), Box::new(l.clone())]
    });
    let e = failure(wrong);
    assert!(
        e.contains("a value does not fit its column")
            && e.contains("region, account, total, label")
            && e.contains("after 1 attempt(s)"),
        "{e}"
    );
    assert!(rows(&mut s, &t).is_empty());
}

#[test]
fn bad_names_are_refused_before_connecting() {
    let s = Schema::bare("upsert_names");
    let e = failure(upserts(&s, "totals; DROP TABLE x"));
    assert!(e.contains("is not a plain SQL table name"), "{e}");
    let no_keys =
        Upserts::<K, V>::new(url(), "t").value_columns(&["total"], |v: &V| vec![Box::new(v.0)]);
    let e = failure(no_keys);
    assert!(e.contains("no key columns for table 't'"), "{e}");
}
