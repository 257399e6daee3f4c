//! The table functions driven directly, one record or change at a time, so that the
//! order of a join's two inputs is chosen by the test: full changelog histories of
//! tables and aggregations, and join results for every interleaving that matters.

use super::{JoinKind, TableJoinFn, TableRow, new_value};
use crate::changelog::Change;
use crate::data::Data;
use crate::error::Result;
use crate::ids::CheckpointId;
use crate::ops::co::build;
use crate::ops::keyed::{KeyedProcess, KeyedProcessFunction};
use crate::ops::table_agg::{CountRows, GroupAggregateFn, GroupDelta, SumOf, deltas};
use crate::ops::{OpInfo, table_agg::TableAggregate};
use crate::output::{Control, Output};
use crate::state::{BackendSnapshot, KeyContext, KeyedStateBackend, StateContext, StateTableInfo};
use crate::time::Timestamp;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;

struct NoBackend;

impl KeyedStateBackend for NoBackend {
    fn name(&self) -> &'static str {
        "test"
    }
    fn register(&mut self, _: &str, _: Rc<dyn StateTableInfo>) -> Result<()> {
        Ok(())
    }
    fn entries(&self) -> usize {
        0
    }
    fn snapshot(&self, _: CheckpointId) -> Result<BackendSnapshot> {
        Ok(BackendSnapshot::default())
    }
}

/// Everything an operator emitted, in order, with timestamps.
struct Seen<T>(Rc<RefCell<Vec<(T, Timestamp)>>>);

impl<T> Output<T> for Seen<T> {
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        self.0.borrow_mut().push((value, ts));
        Ok(())
    }
    fn control(&mut self, _: Control) -> Result<()> {
        Ok(())
    }
}

type Emitted<T> = Rc<RefCell<Vec<(T, Timestamp)>>>;

fn info() -> OpInfo {
    OpInfo {
        name: Arc::from("table-test"),
        subtask: 0,
        parallelism: 1,
    }
}

fn keyed<K: crate::data::Key, I: 'static, O: Data, P: KeyedProcessFunction<K, I, O>>(
    key_fn: impl Fn(&I) -> K + Send + Sync + 'static,
    make: impl FnOnce(&mut StateContext<K>) -> P,
) -> (KeyedProcess<K, I, O, P>, Emitted<O>) {
    let mut state = StateContext::new(KeyContext::new(), Box::new(NoBackend));
    let f = make(&mut state);
    let seen = Rc::new(RefCell::new(Vec::new()));
    let op = KeyedProcess::new(
        Arc::new(key_fn),
        f,
        state,
        Box::new(Seen(seen.clone())),
        info(),
    )
    .unwrap();
    (op, seen)
}

fn ins(k: &str, v: i64) -> Change<String, i64> {
    Change::Insert {
        key: k.into(),
        value: v,
    }
}
fn upd(k: &str, old: i64, new: i64) -> Change<String, i64> {
    Change::Update {
        key: k.into(),
        old,
        new,
    }
}
fn del(k: &str, old: i64) -> Change<String, i64> {
    Change::Delete { key: k.into(), old }
}

type Upsert = (String, Option<i64>);

type UpsertTable = KeyedProcess<String, Upsert, Change<String, i64>, TableRow<Upsert, i64>>;

fn upsert_table() -> (UpsertTable, Emitted<Change<String, i64>>) {
    keyed(
        |(k, _): &Upsert| k.clone(),
        |s| TableRow {
            row: s.value_state("row").unwrap(),
            row_of: |(_, v)| v,
        },
    )
}

#[test]
fn upserts_give_insert_then_updates_then_delete_with_the_old_values_and_timestamps() {
    let (mut op, seen) = upsert_table();
    let input: Vec<(Upsert, Timestamp)> = vec![
        (("a".into(), Some(1)), 10),
        (("b".into(), Some(5)), 11),
        (("a".into(), Some(2)), 12),
        (("a".into(), Some(2)), 13), // the same value again is still an update
        (("c".into(), None), 14),    // tombstone of an unknown key: nothing
        (("a".into(), None), 15),
        (("a".into(), None), 16), // deleted twice: nothing the second time
        (("a".into(), Some(7)), 17),
    ];
    for (u, ts) in input {
        op.record(u, ts).unwrap();
    }
    assert_eq!(
        *seen.borrow(),
        vec![
            (ins("a", 1), 10),
            (ins("b", 5), 11),
            (upd("a", 1, 2), 12),
            (upd("a", 2, 2), 13),
            (del("a", 2), 15),
            (ins("a", 7), 17),
        ]
    );
}

#[test]
fn a_table_from_a_changelog_recomputes_old_values_from_its_rows() {
    let (mut op, seen) = keyed(
        |c: &Change<String, i64>| c.key().clone(),
        |s| TableRow {
            row: s.value_state("row").unwrap(),
            row_of: new_value,
        },
    );
    // An inconsistent feed: a second insert, an update with a wrong old value, a delete
    // of a key never inserted.
    for (i, c) in [
        ins("a", 1),
        ins("a", 3),
        upd("a", 99, 4),
        del("z", 1),
        del("a", 5),
    ]
    .into_iter()
    .enumerate()
    {
        op.record(c, i as Timestamp).unwrap();
    }
    let got: Vec<_> = seen.borrow().iter().map(|(c, _)| c.clone()).collect();
    assert_eq!(
        got,
        vec![ins("a", 1), upd("a", 1, 3), upd("a", 3, 4), del("a", 4)]
    );
}

/// The two inputs of a join: records, and the table's changes.
type JoinInputs = (
    Box<dyn Output<(String, i64)>>,
    Box<dyn Output<Change<String, i64>>>,
);

/// The join as the runtime builds it, with its two inputs fed by the test.
fn join(kind: JoinKind) -> (JoinInputs, Emitted<String>) {
    let mut state = StateContext::new(KeyContext::new(), Box::new(NoBackend));
    let f = TableJoinFn {
        row: state.value_state("row").unwrap(),
        kind,
        f: Arc::new(|(k, n): (String, i64), row: Option<i64>| format!("{k}:{n}x{row:?}")),
    };
    let seen = Rc::new(RefCell::new(Vec::new()));
    let (records, changes, _control) = build(
        Arc::new(|(k, _): &(String, i64)| k.clone()),
        Arc::new(|c: &Change<String, i64>| c.key().clone()),
        f,
        state,
        Box::new(Seen(seen.clone())),
        Default::default(),
        info(),
    )
    .unwrap();
    ((records, changes), seen)
}

/// Records and table changes in one order: each record sees the row as of that moment.
fn join_in_order(kind: JoinKind) -> Vec<(String, Timestamp)> {
    let ((mut records, mut changes), seen) = join(kind);
    records.record(("a".into(), 1), 1).unwrap(); // before any row
    changes.record(ins("a", 10), 2).unwrap();
    records.record(("a".into(), 2), 3).unwrap();
    records.record(("b".into(), 3), 4).unwrap(); // b has no row
    changes.record(upd("a", 10, 20), 5).unwrap();
    changes.record(ins("b", 30), 6).unwrap();
    records.record(("a".into(), 4), 7).unwrap();
    records.record(("b".into(), 5), 8).unwrap();
    changes.record(del("a", 20), 9).unwrap();
    records.record(("a".into(), 6), 10).unwrap();
    seen.take()
}

#[test]
fn an_inner_join_gives_each_record_the_current_row_and_drops_records_without_one() {
    let got = join_in_order(JoinKind::Inner);
    let want: Vec<(String, Timestamp)> = vec![
        ("a:2xSome(10)".into(), 3),
        ("a:4xSome(20)".into(), 7),
        ("b:5xSome(30)".into(), 8),
    ];
    assert_eq!(got, want);
}

#[test]
fn a_left_join_gives_records_without_a_row_none() {
    let got = join_in_order(JoinKind::Left);
    let want: Vec<(String, Timestamp)> = vec![
        ("a:1xNone".into(), 1),
        ("a:2xSome(10)".into(), 3),
        ("b:3xNone".into(), 4),
        ("a:4xSome(20)".into(), 7),
        ("b:5xSome(30)".into(), 8),
        ("a:6xNone".into(), 10),
    ];
    assert_eq!(got, want);
}

/// Rows `(account, (region, amount))` aggregated by region with `agg`: the deltas of each
/// change go to the group function in order, as the runtime sends them to one subtask.
fn aggregate<Acc: Data, O: Data + PartialEq, A: TableAggregate<(String, i64), Acc, O>>(
    agg: A,
    changes: Vec<Change<String, (String, i64)>>,
) -> Vec<Change<String, O>> {
    let (mut op, seen) = keyed(
        |(g, _): &(String, GroupDelta<(String, i64)>)| g.clone(),
        |s| GroupAggregateFn {
            agg: Arc::new(agg),
            group: s.value_state("group").unwrap(),
            _types: PhantomData,
        },
    );
    let region = |_: &String, (r, _): &(String, i64)| r.clone();
    for c in changes {
        for d in deltas(c, &region) {
            op.record(d, 0).unwrap();
        }
    }
    seen.take().into_iter().map(|(c, _)| c).collect()
}

/// Every kind of row change: new rows, an update within a group, an update that moves a
/// row to another group (emptying it), a move back, an update that leaves the sum as it
/// was, and deletes down to an empty group.
fn account_changes() -> Vec<Change<String, (String, i64)>> {
    let (a1, a2, a3) = ("a1".to_string(), "a2".to_string(), "a3".to_string());
    let v = |r: &str, n: i64| (r.to_string(), n);
    vec![
        Change::Insert {
            key: a1.clone(),
            value: v("eu", 10),
        },
        Change::Insert {
            key: a2.clone(),
            value: v("eu", 5),
        },
        Change::Insert {
            key: a3.clone(),
            value: v("us", 7),
        },
        Change::Update {
            key: a1.clone(),
            old: v("eu", 10),
            new: v("eu", 12),
        },
        Change::Update {
            key: a3.clone(),
            old: v("us", 7),
            new: v("eu", 7),
        },
        Change::Update {
            key: a2.clone(),
            old: v("eu", 5),
            new: v("us", 1),
        },
        Change::Update {
            key: a1.clone(),
            old: v("eu", 12),
            new: v("eu", 12),
        },
        Change::Delete {
            key: a2,
            old: v("us", 1),
        },
        Change::Delete {
            key: a1,
            old: v("eu", 12),
        },
        Change::Delete {
            key: a3,
            old: v("eu", 7),
        },
    ]
}

#[test]
fn a_sum_retracts_updates_and_moves_and_deletes_empty_groups() {
    let got = aggregate(SumOf::new(|(_, n): &(String, i64)| *n), account_changes());
    let c = |g: &str| g.to_string();
    assert_eq!(
        got,
        vec![
            Change::Insert {
                key: c("eu"),
                value: 10
            },
            Change::Update {
                key: c("eu"),
                old: 10,
                new: 15
            },
            Change::Insert {
                key: c("us"),
                value: 7
            },
            Change::Update {
                key: c("eu"),
                old: 15,
                new: 17
            },
            // a3 moves from us (now empty) to eu.
            Change::Delete {
                key: c("us"),
                old: 7
            },
            Change::Update {
                key: c("eu"),
                old: 17,
                new: 24
            },
            // a2 moves from eu to us.
            Change::Update {
                key: c("eu"),
                old: 24,
                new: 19
            },
            Change::Insert {
                key: c("us"),
                value: 1
            },
            // a1 12 -> 12: the sum does not change, nothing is emitted.
            Change::Delete {
                key: c("us"),
                old: 1
            },
            Change::Update {
                key: c("eu"),
                old: 19,
                new: 7
            },
            Change::Delete {
                key: c("eu"),
                old: 7
            },
        ]
    );
}

#[test]
fn a_count_follows_rows_between_groups() {
    let got = aggregate(CountRows, account_changes());
    let c = |g: &str| g.to_string();
    assert_eq!(
        got,
        vec![
            Change::Insert {
                key: c("eu"),
                value: 1
            },
            Change::Update {
                key: c("eu"),
                old: 1,
                new: 2
            },
            Change::Insert {
                key: c("us"),
                value: 1
            },
            Change::Delete {
                key: c("us"),
                old: 1
            },
            Change::Update {
                key: c("eu"),
                old: 2,
                new: 3
            },
            Change::Update {
                key: c("eu"),
                old: 3,
                new: 2
            },
            Change::Insert {
                key: c("us"),
                value: 1
            },
            Change::Delete {
                key: c("us"),
                old: 1
            },
            Change::Update {
                key: c("eu"),
                old: 2,
                new: 1
            },
            Change::Delete {
                key: c("eu"),
                old: 1
            },
        ]
    );
}

#[test]
fn a_retraction_from_an_empty_group_fails_naming_the_group() {
    let (mut op, _seen) = keyed(
        |(g, _): &(String, GroupDelta<i64>)| g.clone(),
        |s| GroupAggregateFn {
            agg: Arc::new(CountRows),
            group: s.value_state("group").unwrap(),
            _types: PhantomData::<fn(i64) -> u64>,
        },
    );
    let err = op
        .record(("eu".to_string(), GroupDelta::Retract(3)), 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "group \"eu\" holds no rows, yet a row leaves it: the table's changelog retracts \
             a value it never added"
        ),
        "{err}"
    );
}

#[test]
fn integer_sums_undo_additions_exactly_through_wraparound() {
    let sum = SumOf::new(|v: &i64| *v);
    let mut acc = sum.create();
    sum.add(&mut acc, i64::MAX);
    sum.add(&mut acc, 10);
    sum.retract(&mut acc, i64::MAX);
    assert_eq!(sum.result(&acc), 10);
}
