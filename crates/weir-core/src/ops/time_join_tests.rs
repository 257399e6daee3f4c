//! The interval and temporal joins driven directly, record by record and watermark by
//! watermark on each input: exact output against a brute-force model over random
//! out-of-order input with late records, late side outputs, and state that is empty once
//! the watermark has passed everything (timers clean it, not the end of input).

use super::OpInfo;
use super::co::{TwoInputs, build};
use super::interval_join::{ApplyJoin, Bounds, IntervalJoinFn, Late};
use super::side::{SideDecl, SideDecls, SideOutputs};
use super::temporal_join::TemporalJoinFn;
use crate::changelog::Change;
use crate::dsl::OutputTag;
use crate::error::Result;
use crate::ids::CheckpointId;
use crate::output::{Control, Output};
use crate::state::{BackendSnapshot, KeyContext, KeyedStateBackend, StateContext, StateTableInfo};
use crate::time::Timestamp;
use proptest::prelude::*;
use std::any::Any;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

type Registered = Vec<(String, Rc<dyn StateTableInfo>)>;

/// A heap backend that keeps its tables, to count their entries.
#[derive(Clone, Default)]
struct Tables(Rc<RefCell<Registered>>);

impl Tables {
    fn entries(&self) -> BTreeMap<String, usize> {
        self.0
            .borrow()
            .iter()
            .map(|(n, t)| (n.clone(), t.entries()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

impl KeyedStateBackend for Tables {
    fn name(&self) -> &'static str {
        "test"
    }
    fn register(&mut self, name: &str, table: Rc<dyn StateTableInfo>) -> Result<()> {
        self.0.borrow_mut().push((name.to_string(), table));
        Ok(())
    }
    fn entries(&self) -> usize {
        self.0.borrow().iter().map(|(_, t)| t.entries()).sum()
    }
    fn snapshot(&self, _: CheckpointId) -> Result<BackendSnapshot> {
        Ok(BackendSnapshot::default())
    }
}

/// Records a port received, with their timestamps.
#[derive(Clone)]
struct Got<T>(Rc<RefCell<Vec<(T, Timestamp)>>>);

impl<T> Default for Got<T> {
    fn default() -> Self {
        Got(Rc::new(RefCell::new(Vec::new())))
    }
}

impl<T: Clone + Ord> Got<T> {
    fn sorted(&self) -> Vec<(T, Timestamp)> {
        let mut v = self.0.borrow().clone();
        v.sort();
        v
    }
}

impl<T> Output<T> for Got<T> {
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        self.0.borrow_mut().push((value, ts));
        Ok(())
    }
    fn control(&mut self, _: Control) -> Result<()> {
        Ok(())
    }
}

fn info(name: &str) -> OpInfo {
    OpInfo {
        name: Arc::from(name),
        subtask: 0,
        parallelism: 1,
    }
}

/// A left or right record: (key, id).
type Rec = (u8, u32);

/// One step of an input: a record of the left or right input at a time, or a watermark.
#[derive(Debug, Clone)]
enum Step {
    Left(Rec, Timestamp),
    Right(Rec, Timestamp),
    Watermark(Timestamp),
}

/// Random steps: times drift upwards with records up to 12 units out of order, watermarks
/// trail the largest time by 0–8 units (so some records are late).
fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec((0u8..3, 0u8..3, 0i64..13, 0i64..9), 1..120).prop_map(|raw| {
        let (mut t, mut max, mut id) = (0i64, 0i64, 0u32);
        let mut out = Vec::new();
        for (kind, key, back, lag) in raw {
            t += 2;
            let ts = t - back;
            id += 1;
            match kind {
                0 => out.push(Step::Left((key, id), ts)),
                1 => out.push(Step::Right((key, id), ts)),
                _ => out.push(Step::Watermark(max - lag)),
            }
            max = max.max(ts);
        }
        out
    })
}

struct Sides<A, B> {
    late_left: OutputTag<A>,
    late_right: OutputTag<B>,
    side: SideOutputs,
    got_left: Got<A>,
    got_right: Got<B>,
}

fn sides<A: crate::data::Data, B: crate::data::Data>() -> Sides<A, B> {
    let late_left = OutputTag::<A>::new("late-left");
    let late_right = OutputTag::<B>::new("late-right");
    let decls = SideDecls::default();
    decls.lock().unwrap().push(SideDecl::new(&late_left, 1));
    decls.lock().unwrap().push(SideDecl::new(&late_right, 2));
    let (got_left, got_right) = (Got::<A>::default(), Got::<B>::default());
    let mut outputs: Vec<Box<dyn Any>> = vec![
        Box::new(()),
        Box::new(Box::new(got_left.clone()) as Box<dyn Output<A>>),
        Box::new(Box::new(got_right.clone()) as Box<dyn Output<B>>),
    ];
    let side = SideOutputs::take(&decls, &mut outputs);
    Sides {
        late_left,
        late_right,
        side,
        got_left,
        got_right,
    }
}

/// Drives both inputs of a two-input operator through `steps`.
fn drive<B>(ops: &mut TwoInputs<Rec, B>, steps: &[Step], right: impl Fn(Rec) -> B) {
    let mut wm = Timestamp::MIN;
    for s in steps {
        match s {
            Step::Left(r, ts) => ops.0.record(*r, *ts).unwrap(),
            Step::Right(r, ts) => ops.1.record(right(*r), *ts).unwrap(),
            Step::Watermark(w) if *w > wm => {
                wm = *w;
                ops.2.control(Control::Watermark(*w)).unwrap();
            }
            Step::Watermark(_) => {}
        }
    }
}

/// The interval join's output by brute force: every pair of records of one key that were
/// not late (at or behind the watermark) when they came, whose times match.
#[allow(clippy::type_complexity)]
fn interval_model(
    steps: &[Step],
    lower: i64,
    upper: i64,
) -> (
    Vec<((u32, u32), Timestamp)>,
    Vec<(Rec, i64)>,
    Vec<(Rec, i64)>,
) {
    let mut wm = Timestamp::MIN;
    let (mut left, mut right, mut late_l, mut late_r) = (vec![], vec![], vec![], vec![]);
    for s in steps {
        match s {
            Step::Left(r, ts) if *ts <= wm => late_l.push((*r, *ts)),
            Step::Left(r, ts) => left.push((*r, *ts)),
            Step::Right(r, ts) if *ts <= wm => late_r.push((*r, *ts)),
            Step::Right(r, ts) => right.push((*r, *ts)),
            Step::Watermark(w) => wm = wm.max(*w),
        }
    }
    let mut pairs = Vec::new();
    for (l, lt) in &left {
        for (r, rt) in &right {
            if l.0 == r.0 && lt + lower <= *rt && *rt <= lt + upper {
                pairs.push(((l.1, r.1), (*lt).max(*rt)));
            }
        }
    }
    pairs.sort();
    late_l.sort();
    late_r.sort();
    (pairs, late_l, late_r)
}

/// The operator's inputs, its output and its late side outputs.
type IntervalOp = (TwoInputs<Rec, Rec>, Got<(u32, u32)>, Got<Rec>, Got<Rec>);

fn interval_operator(bounds: Bounds, tables: &Tables) -> IntervalOp {
    let mut state = StateContext::new(KeyContext::new(), Box::new(tables.clone()));
    let s = sides::<Rec, Rec>();
    let i = info("interval-join-test");
    let f = ApplyJoin::<Rec, Rec, (u32, u32)>(Arc::new(|l: Rec, r: Rec| (l.1, r.1)));
    let join = IntervalJoinFn::new(
        &mut state,
        bounds,
        Late::new(Some(s.late_left), &i, "left"),
        Late::new(Some(s.late_right), &i, "right"),
        f,
    )
    .unwrap();
    let out = Got::default();
    let ops = build(
        Arc::new(|r: &Rec| r.0),
        Arc::new(|r: &Rec| r.0),
        join,
        state,
        Box::new(out.clone()),
        s.side,
        i,
    )
    .unwrap();
    (ops, out, s.got_left, s.got_right)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn interval_join_emits_exactly_the_matching_pairs_and_cleans_its_state(
        steps in steps(),
        lower in -6i64..4,
        width in 0i64..8,
    ) {
        let upper = lower + width;
        let tables = Tables::default();
        let (mut ops, out, late_l, late_r) = interval_operator(Bounds { lower, upper }, &tables);
        drive(&mut ops, &steps, |r| r);
        let (pairs, want_late_l, want_late_r) = interval_model(&steps, lower, upper);
        prop_assert_eq!(out.sorted(), pairs);
        prop_assert_eq!(late_l.sorted(), want_late_l);
        prop_assert_eq!(late_r.sorted(), want_late_r);
        // A watermark past every record's last partner time empties the state: the
        // timers removed the buffers (and fired).
        ops.2.control(Control::Watermark(10_000)).unwrap();
        prop_assert_eq!(tables.entries(), BTreeMap::new());
    }
}

#[test]
fn interval_join_state_holds_only_records_that_can_still_pair() {
    let tables = Tables::default();
    let (mut ops, out, _, _) = interval_operator(
        Bounds {
            lower: 0,
            upper: 10,
        },
        &tables,
    );
    ops.0.record((1, 1), 100).unwrap();
    ops.1.record((1, 2), 105).unwrap();
    let count = |t: &Tables, n: &str| t.entries().get(n).copied().unwrap_or(0);
    assert_eq!(count(&tables, "interval-join-left-times"), 1);
    assert_eq!(count(&tables, "interval-join-right-times"), 1);
    // The right record at 105 could meet a left one at 95..=105: kept until 105.
    ops.2.control(Control::Watermark(104)).unwrap();
    assert_eq!(count(&tables, "interval-join-right-times"), 1);
    ops.2.control(Control::Watermark(105)).unwrap();
    assert_eq!(count(&tables, "interval-join-right-times"), 0);
    // The left record at 100 could meet a right one up to 110.
    assert_eq!(count(&tables, "interval-join-left-times"), 1);
    ops.1.record((1, 3), 110).unwrap();
    ops.2.control(Control::Watermark(110)).unwrap();
    assert_eq!(tables.entries(), BTreeMap::new());
    assert_eq!(out.sorted(), vec![((1, 2), 105), ((1, 3), 110)]);
}

/// The temporal join's output by brute force: a record that was not late is emitted when
/// the watermark first reaches its time, with the newest version of its key at or before
/// its time among the versions that had come (and were not late) by then.
#[allow(clippy::type_complexity)]
fn temporal_model(steps: &[Step]) -> (Vec<((u32, Option<u32>), Timestamp)>, Vec<(Rec, i64)>) {
    let mut wm = Timestamp::MIN;
    let mut versions: Vec<(u8, Timestamp, Option<u32>)> = Vec::new();
    let mut waiting: Vec<(Rec, Timestamp)> = Vec::new();
    let (mut out, mut late) = (Vec::new(), Vec::new());
    let mut emit = |wm: Timestamp, waiting: &mut Vec<(Rec, Timestamp)>, versions: &[_]| {
        waiting.retain(|(r, t)| {
            if *t > wm {
                return true;
            }
            let version = versions
                .iter()
                .filter(|(k, v, _): &&(u8, Timestamp, Option<u32>)| *k == r.0 && v <= t)
                .max_by_key(|(_, v, _)| *v) // the last of equal times wins
                .and_then(|(_, _, value)| *value);
            out.push(((r.1, version), *t));
            false
        });
    };
    for s in steps {
        match s {
            Step::Left(r, ts) if *ts <= wm => late.push((*r, *ts)),
            Step::Left(r, ts) => waiting.push((*r, *ts)),
            Step::Right(_, ts) if *ts <= wm => {}
            // Ids divisible by 4 are deletes.
            Step::Right(r, ts) => versions.push((r.0, *ts, (r.1 % 4 != 0).then_some(r.1))),
            Step::Watermark(w) if *w > wm => {
                wm = *w;
                emit(wm, &mut waiting, &versions);
            }
            Step::Watermark(_) => {}
        }
    }
    out.sort();
    late.sort();
    (out, late)
}

fn change(r: Rec) -> Change<u8, u32> {
    if r.1.is_multiple_of(4) {
        Change::Delete { key: r.0, old: 0 }
    } else {
        Change::Update {
            key: r.0,
            old: 0,
            new: r.1,
        }
    }
}

/// The operator's inputs, its output and its late side output for records.
type TemporalOp = (
    TwoInputs<Rec, Change<u8, u32>>,
    Got<(u32, Option<u32>)>,
    Got<Rec>,
);

fn temporal_operator(tables: &Tables) -> TemporalOp {
    let mut state = StateContext::new(KeyContext::new(), Box::new(tables.clone()));
    let s = sides::<Rec, Change<u8, u32>>();
    let i = info("temporal-join-test");
    let join = TemporalJoinFn::<u8, Rec, u8, u32, (u32, Option<u32>)>::new(
        &mut state,
        Late::new(Some(s.late_left), &i, "left"),
        Late::new(Some(s.late_right), &i, "right"),
        Arc::new(|r: Rec, v: Option<&u32>| Some((r.1, v.copied()))),
    )
    .unwrap();
    let out = Got::default();
    let ops = build(
        Arc::new(|r: &Rec| r.0),
        Arc::new(|c: &Change<u8, u32>| *c.key()),
        join,
        state,
        Box::new(out.clone()),
        s.side,
        i,
    )
    .unwrap();
    (ops, out, s.got_left)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn temporal_join_emits_each_record_with_its_version_and_cleans_its_state(steps in steps()) {
        // Distinct version times per key keep the model free of ties between equal times.
        let mut seen = std::collections::BTreeSet::new();
        let steps: Vec<Step> = steps
            .into_iter()
            .filter(|s| !matches!(s, Step::Right(r, ts) if !seen.insert((r.0, *ts))))
            .collect();
        let tables = Tables::default();
        let (mut ops, out, late) = temporal_operator(&tables);
        drive(&mut ops, &steps, change);
        ops.2.control(Control::Watermark(10_000)).unwrap();
        let (want, want_late) = temporal_model(&{
            let mut s = steps.clone();
            s.push(Step::Watermark(10_000));
            s
        });
        prop_assert_eq!(out.sorted(), want);
        prop_assert_eq!(late.sorted(), want_late);
        // Past everything, only the newest version of each key that still has a row stays.
        let mut rows = BTreeMap::new();
        let mut wm = Timestamp::MIN;
        for s in &steps {
            match s {
                Step::Right(r, ts) if *ts > wm => {
                    let e = rows.entry(r.0).or_insert((Timestamp::MIN, false));
                    if *ts >= e.0 {
                        *e = (*ts, r.1 % 4 != 0);
                    }
                }
                Step::Watermark(w) => wm = wm.max(*w),
                _ => {}
            }
        }
        let live = rows.values().filter(|(_, row)| *row).count();
        let want_tables: BTreeMap<String, usize> = (live > 0)
            .then(|| ("temporal-join-versions".to_string(), live))
            .into_iter()
            .collect();
        prop_assert_eq!(tables.entries(), want_tables);
    }
}

#[test]
fn temporal_join_keeps_one_version_per_row_and_forgets_deleted_rows() {
    let tables = Tables::default();
    let (mut ops, out, _) = temporal_operator(&tables);
    let versions = |t: &Tables| t.entries().get("temporal-join-versions").copied();
    ops.1.record(change((1, 1)), 10).unwrap();
    ops.1.record(change((1, 5)), 20).unwrap();
    ops.1.record(change((1, 9)), 30).unwrap();
    ops.0.record((1, 100), 25).unwrap();
    ops.2.control(Control::Watermark(25)).unwrap();
    assert_eq!(out.sorted(), vec![((100, Some(5)), 25)]);
    // Versions of key 1 are one map: the entry stays until the row is deleted.
    assert_eq!(versions(&tables), Some(1));
    ops.1.record(change((1, 4)), 40).unwrap(); // a delete
    ops.0.record((1, 101), 35).unwrap();
    ops.0.record((1, 102), 45).unwrap();
    ops.2.control(Control::Watermark(50)).unwrap();
    assert_eq!(
        out.sorted(),
        vec![
            ((100, Some(5)), 25),
            ((101, Some(9)), 35),
            ((102, None), 45)
        ]
    );
    assert_eq!(tables.entries(), BTreeMap::new());
}
