//! Window state restored at another parallelism, driven the way the runtime drives a
//! window subtask: records and watermarks in, snapshots of its tables out, and restores
//! of the key groups a new subtask owns.

use super::*;
use crate::checkpoint::KeyGroupBlobs;
use crate::data::{key_group, key_group_range};
use crate::ids::CheckpointId;
use crate::state::test_store::Store as MemStore;
use crate::state::{BackendSnapshot, KeyContext, KeyedStateBackend, KvStore, StateContext};

const MAX_P: usize = 128;
/// Fired windows stay this long for late records.
const LATENESS: Timestamp = 100;

/// Where the test backend keeps state.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Tables on the heap (the memory backend).
    Heap,
    /// Tables in an ordered store whose tables cache two entries (as on RocksDB).
    Store,
}

const KINDS: [Kind; 2] = [Kind::Heap, Kind::Store];

/// A subtask's checkpoint: heap tables by key group, and the store's entries.
#[derive(Clone)]
struct Snapshot {
    keyed: BTreeMap<String, KeyGroupBlobs>,
    store: Vec<(Vec<u8>, Vec<u8>)>,
}

/// A backend that keeps the operator's tables, on the heap or in a store, to snapshot
/// and restore them.
#[derive(Clone, Default)]
struct Tables(
    Rc<RefCell<BTreeMap<String, Rc<dyn StateTableInfo>>>>,
    Option<Rc<MemStore>>,
);

impl KeyedStateBackend for Tables {
    fn name(&self) -> &'static str {
        "test"
    }
    fn register(&mut self, name: &str, table: Rc<dyn StateTableInfo>) -> Result<()> {
        self.0.borrow_mut().insert(name.to_string(), table);
        Ok(())
    }
    fn entries(&self) -> usize {
        self.0.borrow().values().map(|t| t.entries()).sum()
    }
    fn snapshot(&self, _: CheckpointId) -> Result<BackendSnapshot> {
        let mut s = BackendSnapshot::default();
        for (name, t) in self.0.borrow().iter() {
            if t.is_persistent() {
                let store = self.1.as_ref().expect("persistent tables need the store");
                if let Some(c) = t.take_changes()? {
                    store.write(&c)?;
                }
            } else {
                s.keyed.insert(name.clone(), t.snapshot(MAX_P)?);
            }
        }
        Ok(s)
    }
    fn store(&self) -> Option<Rc<dyn KvStore>> {
        self.1.clone().map(|s| s as Rc<dyn KvStore>)
    }
}

/// What a subtask emitted: (key, sum, window max timestamp).
#[derive(Clone, Default)]
struct Emitted(Rc<RefCell<Vec<(u64, i64, Timestamp)>>>);

impl Output<(u64, i64)> for Emitted {
    fn record(&mut self, (k, v): (u64, i64), ts: Timestamp) -> Result<()> {
        self.0.borrow_mut().push((k, v, ts));
        Ok(())
    }
    fn control(&mut self, _: Control) -> Result<()> {
        Ok(())
    }
}

struct Sum;

impl WindowFn<u64, (u64, i64), (u64, i64)> for Sum {
    type Acc = i64;
    fn create(&self) -> i64 {
        0
    }
    fn add(&self, acc: &mut i64, (_, v): (u64, i64)) {
        *acc += v;
    }
    fn merge(&self, acc: &mut i64, other: i64) {
        *acc += other;
    }
    fn emit(
        &self,
        key: &u64,
        _: &TimeWindow,
        acc: &i64,
        out: &mut Collector<(u64, i64)>,
    ) -> Result<()> {
        out.emit((*key, *acc));
        Ok(())
    }
}

/// Subtask `s` of a window sum at parallelism `p`, restored from `restore` (the
/// snapshots of every old subtask) as the runtime restores it: the entries of the key
/// groups it owns.
struct Subtask {
    op: WindowOperator<u64, (u64, i64), (u64, i64), Sum>,
    tables: Tables,
    out: Emitted,
}

impl Subtask {
    fn new(p: usize, s: usize, restore: &[Snapshot], kind: Kind) -> Subtask {
        Self::with(WindowAssigner::tumbling(10), p, s, restore, kind)
    }

    fn with(
        assigner: WindowAssigner,
        p: usize,
        s: usize,
        restore: &[Snapshot],
        kind: Kind,
    ) -> Subtask {
        let range = key_group_range(s, MAX_P, p);
        let store = match kind {
            Kind::Heap => None,
            Kind::Store => {
                let store = MemStore::with_capacity(2);
                for snap in restore {
                    store.data.borrow_mut().extend(
                        snap.store
                            .iter()
                            .filter(|(k, _)| {
                                range.contains(&u32::from(u16::from_be_bytes([k[0], k[1]])))
                            })
                            .cloned(),
                    );
                }
                Some(Rc::new(store))
            }
        };
        let tables = Tables(Rc::default(), store);
        let mut state = StateContext::new(KeyContext::<u64>::new(), Box::new(tables.clone()));
        let out = Emitted::default();
        let op = WindowOperator::new(
            Arc::new(|(k, _): &(u64, i64)| *k),
            assigner,
            LATENESS,
            Sum,
            &mut state,
            Box::new(out.clone()),
            None,
            OpInfo {
                name: Arc::from("window"),
                subtask: s,
                parallelism: p,
            },
        )
        .unwrap();
        for snap in restore {
            for (name, blobs) in &snap.keyed {
                let mine: KeyGroupBlobs = blobs
                    .iter()
                    .filter(|(g, _)| range.contains(g))
                    .cloned()
                    .collect();
                tables.0.borrow()[name].restore(&mine).unwrap();
            }
        }
        Subtask { op, tables, out }
    }
    fn record(&mut self, key: u64, v: i64, ts: Timestamp) {
        self.op.record((key, v), ts).unwrap();
    }
    fn watermark(&mut self, wm: Timestamp) {
        self.op.control(Control::Watermark(wm)).unwrap();
    }
    fn snapshot(&self) -> Snapshot {
        let keyed = self.tables.snapshot(CheckpointId(1)).unwrap().keyed;
        let store = match &self.tables.1 {
            Some(st) => st.entries_of(0..MAX_P as u32),
            None => Vec::new(),
        };
        Snapshot { keyed, store }
    }
    fn take(&self) -> Vec<(u64, i64, Timestamp)> {
        let mut v = std::mem::take(&mut *self.out.0.borrow_mut());
        v.sort_unstable();
        v
    }
}

/// A key whose key group lies in `groups`.
fn key_in(groups: std::ops::Range<u32>) -> u64 {
    (0u64..)
        .find(|k| groups.contains(&key_group(k, MAX_P).0))
        .unwrap()
}

/// Keys `a` and `b` belong to different subtasks at parallelism 2 and to subtask 1 at
/// parallelism 3. At parallelism 2, subtask 0's watermark has passed window [0, 10)
/// and fired it for `a`, while subtask 1's (held back by an input that was idle for it
/// alone, or by an at-least-once checkpoint) has not fired it for `b`.
fn checkpoint_at_parallelism_2(kind: Kind) -> (u64, u64, Vec<Snapshot>) {
    let (a, b) = (key_in(43..64), key_in(64..86));
    let mut s0 = Subtask::new(2, 0, &[], kind);
    let mut s1 = Subtask::new(2, 1, &[], kind);
    s0.record(a, 1, 1);
    s0.record(a, 2, 5);
    s1.record(b, 10, 3);
    s0.watermark(12);
    s1.watermark(5);
    assert_eq!(s0.take(), [(a, 3, 9)]);
    assert_eq!(s1.take(), []);
    (a, b, vec![s0.snapshot(), s1.snapshot()])
}

/// After the restore: a late record for `a`, which fired before, fires it again at once
/// (allowed lateness); the watermark passing the window fires it for `b` alone, which
/// had not fired; from then on a late record for `b` fires it again at once too.
fn resume(s: &mut Subtask, a: u64, b: u64) {
    s.record(a, 4, 7);
    assert_eq!(s.take(), [(a, 7, 9)], "a fired before the restore");
    s.watermark(20);
    assert_eq!(s.take(), [(b, 10, 9)], "b's result must not be suppressed");
    s.record(b, 5, 8);
    assert_eq!(s.take(), [(b, 15, 9)]);
    s.watermark(200);
    assert_eq!(s.take(), []);
}

#[test]
fn restored_at_parallelism_1_every_key_fires_exactly_once() {
    for kind in KINDS {
        let (a, b, snaps) = checkpoint_at_parallelism_2(kind);
        resume(&mut Subtask::new(1, 0, &snaps, kind), a, b);
    }
}

#[test]
fn restored_at_parallelism_3_every_key_fires_exactly_once() {
    for kind in KINDS {
        let (a, b, snaps) = checkpoint_at_parallelism_2(kind);
        for s in [0, 2] {
            let mut other = Subtask::new(3, s, &snaps, kind);
            other.watermark(200);
            assert_eq!(
                other.take(),
                [],
                "{kind:?}: subtask {s} of 3 owns neither key"
            );
        }
        resume(&mut Subtask::new(3, 1, &snaps, kind), a, b);
    }
}

#[test]
fn per_key_fired_state_survives_another_checkpoint_and_rescale() {
    for kind in KINDS {
        let (a, b, snaps) = checkpoint_at_parallelism_2(kind);
        // Restored at parallelism 1 and checkpointed again before the window fires there,
        // then restored at parallelism 2 again: each key keeps its own state.
        let merged = Subtask::new(1, 0, &snaps, kind).snapshot();
        let mut s0 = Subtask::new(2, 0, std::slice::from_ref(&merged), kind);
        let mut s1 = Subtask::new(2, 1, std::slice::from_ref(&merged), kind);
        s0.watermark(20);
        s1.watermark(20);
        assert_eq!(s0.take(), [], "{kind:?}: a fired before");
        assert_eq!(s1.take(), [(b, 10, 9)], "{kind:?}");
        s0.record(a, 4, 7);
        assert_eq!(s0.take(), [(a, 7, 9)], "{kind:?}");
    }
}

/// A job that switches from the memory backend to RocksDB keeps its open windows: the
/// heap checkpoint's windows become panes and timers in the store.
#[test]
fn windows_checkpointed_on_the_heap_are_restored_into_the_store() {
    let (a, b, snaps) = checkpoint_at_parallelism_2(Kind::Heap);
    resume(&mut Subtask::new(1, 0, &snaps, Kind::Store), a, b);
    let (a, b, snaps) = checkpoint_at_parallelism_2(Kind::Heap);
    resume(&mut Subtask::new(3, 1, &snaps, Kind::Store), a, b);
}

/// Records of 40 keys, with times that go back past the watermark now and then: (key,
/// value, time), and the watermark after each.
fn stream(n: u64) -> Vec<(u64, i64, Timestamp, Timestamp)> {
    let mut x = 0x9E37_79B9_u64;
    let mut max = 0;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let ts = i as Timestamp - (x % 60) as Timestamp;
            max = ts.max(max);
            (x % 40, (x % 100) as i64, ts, max - 5)
        })
        .collect()
}

/// Feeds records `range` of `input` to the subtasks, each to the owner of its key, and
/// every watermark to all of them.
fn feed(subtasks: &mut [Subtask], input: &[(u64, i64, Timestamp, Timestamp)], p: usize) {
    for &(k, v, ts, wm) in input {
        let owner = crate::data::subtask_for_key_group(key_group(&k, MAX_P), MAX_P, p);
        subtasks[owner].record(k, v, ts);
        for s in subtasks.iter_mut() {
            s.watermark(wm);
        }
    }
}

/// Sliding windows and sessions, with lateness, checkpointed at parallelism 2 mid-stream
/// and restored at 1 and at 3 (key groups of panes, sessions and timers split and
/// merged), emit exactly what one uninterrupted subtask emits, on the heap and in a
/// store whose tables cache two entries.
#[test]
fn a_rescaled_run_emits_what_an_uninterrupted_run_emits() {
    let input = stream(600);
    let (head, tail) = input.split_at(300);
    for assigner in [WindowAssigner::sliding(20, 5), WindowAssigner::session(4)] {
        let mut whole = Subtask::with(assigner, 1, 0, &[], Kind::Heap);
        feed(std::slice::from_mut(&mut whole), &input, 1);
        whole.watermark(Timestamp::MAX);
        let want = whole.take();
        assert!(want.len() > 200, "{} results", want.len());
        for (kind, restored) in [
            (Kind::Heap, Kind::Heap),
            (Kind::Store, Kind::Store),
            (Kind::Heap, Kind::Store),
        ] {
            let mut before: Vec<Subtask> = (0..2)
                .map(|s| Subtask::with(assigner, 2, s, &[], kind))
                .collect();
            feed(&mut before, head, 2);
            let got: Vec<_> = before.iter().flat_map(|s| s.take()).collect();
            let snaps: Vec<Snapshot> = before.iter().map(Subtask::snapshot).collect();
            for p in [1, 3] {
                let mut after: Vec<Subtask> = (0..p)
                    .map(|s| Subtask::with(assigner, p, s, &snaps, restored))
                    .collect();
                feed(&mut after, tail, p);
                let mut all = got.clone();
                for s in &mut after {
                    s.watermark(Timestamp::MAX);
                    all.extend(s.take());
                }
                all.sort_unstable();
                assert_eq!(
                    all, want,
                    "{assigner:?} on {kind:?}, restored on {restored:?} at parallelism {p}"
                );
            }
        }
    }
}
