//! Timers of a keyed process function in RocksDB, checkpointed and restored at the same
//! and at another parallelism, driven the way the runtime drives a subtask.

use super::*;
use std::cell::RefCell;
use weir_core::checkpoint::OperatorSnapshot;
use weir_core::data::{key_group, subtask_for_key_group};
use weir_core::ops::OpInfo;
use weir_core::ops::keyed::{KeyedContext, KeyedProcess, KeyedProcessFunction};
use weir_core::output::{Control, Output};
use weir_core::state::{KeyContext, StateContext};
use weir_core::time::Timestamp;
use weir_core::timer::TimeDomain;

const MAX_P: usize = 128;
const KEYS: u64 = 300;

/// Each record `(key, t)` registers an event-time timer at `t` and a processing-time timer
/// at `t + 10_000`, and deletes the event-time timer at `t - 1`; each timer emits
/// `(key, time, processing?)`.
struct Timers;

type Fired = (u64, Timestamp, bool);

impl KeyedProcessFunction<u64, (u64, Timestamp), Fired> for Timers {
    fn process(
        &mut self,
        (_, t): (u64, Timestamp),
        ctx: &mut KeyedContext<'_, u64, Fired>,
    ) -> weir_core::Result<()> {
        ctx.register_event_time_timer(t);
        ctx.delete_event_time_timer(t - 1);
        ctx.register_processing_time_timer(t + 10_000);
        Ok(())
    }
    fn on_timer(
        &mut self,
        time: Timestamp,
        domain: TimeDomain,
        ctx: &mut KeyedContext<'_, u64, Fired>,
    ) -> weir_core::Result<()> {
        let key = *ctx.key();
        ctx.emit((key, time, domain == TimeDomain::ProcessingTime));
        Ok(())
    }
}

#[derive(Clone, Default)]
struct Out(Rc<RefCell<Vec<Fired>>>);

impl Output<Fired> for Out {
    fn record(&mut self, v: Fired, _: Timestamp) -> weir_core::Result<()> {
        self.0.borrow_mut().push(v);
        Ok(())
    }
    fn control(&mut self, _: Control) -> weir_core::Result<()> {
        Ok(())
    }
}

struct Subtask {
    op: KeyedProcess<u64, (u64, Timestamp), Fired, Timers>,
    out: Out,
}

fn subtask(
    dir: &Path,
    (p, s): (usize, usize),
    restore: &[RestoredInstance],
    partitioned: bool,
) -> Subtask {
    let cfg = RocksDbConfig {
        local_dir: dir.join("local"),
        // Far fewer entries than timers: they live in RocksDB.
        cache_entries: 4,
        partitioned_index_filters: partitioned,
        ..RocksDbConfig::default()
    };
    let label = format!("op1-{s}");
    let backend =
        RocksDbBackend::open(&cfg, &label, MAX_P, s, p, BTreeMap::new(), restore).unwrap();
    let state = StateContext::new(KeyContext::<u64>::new(), Box::new(backend));
    let out = Out::default();
    let op = KeyedProcess::new(
        Arc::new(|(k, _): &(u64, Timestamp)| *k),
        Timers,
        state,
        Box::new(out.clone()),
        OpInfo {
            name: Arc::from("timers"),
            subtask: s,
            parallelism: p,
        },
    )
    .unwrap();
    Subtask { op, out }
}

fn owner(k: u64, p: usize) -> usize {
    subtask_for_key_group(key_group(&k, MAX_P), MAX_P, p)
}

/// The records: each key registers event-time timers at 100 + k, 200 + k (deleting
/// 199 + k, which was never registered) and 201 + k (deleting 200 + k).
fn records() -> Vec<(u64, Timestamp)> {
    (0..KEYS)
        .flat_map(|k| {
            [
                (k, 100 + k as i64),
                (k, 200 + k as i64),
                (k, 201 + k as i64),
            ]
        })
        .collect()
}

/// Snapshots subtask `index` (of 2) and copies its files into `dir`, as a restore brings
/// them back; checks that its SST files have a partitioned index exactly when
/// `partitioned`.
fn checkpoint(s: &Subtask, index: usize, dir: &Path, partitioned: bool) -> RestoredInstance {
    let hooks = s.op.state().hooks();
    let mut snap: OperatorSnapshot = hooks.borrow_mut().snapshot(CheckpointId(1)).unwrap();
    snap.resolve_files().unwrap();
    assert!(
        snap.keyed.is_empty(),
        "nothing on the heap: {:?}",
        snap.keyed
    );
    let ssts: Vec<Vec<u8>> = snap
        .files
        .iter()
        .filter(|f| f.path.extension().is_some_and(|e| e == "sst"))
        .map(|f| std::fs::read(&f.path).unwrap())
        .collect();
    assert!(!ssts.is_empty(), "no SST file in the snapshot");
    for sst in &ssts {
        // The table property `rocksdb.block.based.table.index.type`, a fixed 32-bit value
        // right after its name: 0 a binary search over one index block, 2 a two-level
        // (partitioned) index. The properties block stores each name as what it does not
        // share with the name before it, so only the name's tail is sure to appear whole.
        let name = b"index.type";
        let found: Vec<usize> = sst
            .windows(name.len())
            .enumerate()
            .filter(|(_, w)| w == name)
            .map(|(at, _)| at)
            .collect();
        assert_eq!(found.len(), 1, "one index type property");
        let at = found[0] + name.len();
        let index_type = u32::from_le_bytes(sst[at..at + 4].try_into().unwrap());
        assert_eq!(index_type, if partitioned { 2 } else { 0 }, "index type");
    }
    crate::rocks_restore::tests::keep(&snap, dir, key_group_range(index, MAX_P, 2))
}

/// Every timer fires exactly once over a checkpoint at parallelism 2 and a restore at
/// `p`: those due before the checkpoint before it, the others after the restore, in
/// time order on each subtask; deleted timers never.
fn fire_across_a_restore_at(p: usize, partitioned: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let mut before: Vec<Subtask> = (0..2)
        .map(|s| subtask(tmp.path(), (2, s), &[], partitioned))
        .collect();
    for (k, t) in records() {
        before[owner(k, 2)].op.record((k, t), t).unwrap();
    }
    // Event time 150 and processing time 10_150 fire the first timers of keys < 51.
    for s in &mut before {
        s.op.control(Control::Watermark(150)).unwrap();
        s.op.control(Control::Tick(10_150)).unwrap();
    }
    let mut fired: Vec<Fired> = before.iter().flat_map(|s| s.out.0.take()).collect();
    let want_before: Vec<Fired> = (0..51)
        .flat_map(|k| [(k, 100 + k as i64, false), (k, 10_100 + k as i64, true)])
        .collect();
    fired.sort_unstable();
    assert_eq!(fired, want_before);
    let dirs: Vec<RestoredInstance> = before
        .iter()
        .enumerate()
        .map(|(i, s)| checkpoint(s, i, &tmp.path().join(format!("chk-{i}")), partitioned))
        .collect();
    drop(before);

    let mut after: Vec<Subtask> = (0..p)
        .map(|s| subtask(tmp.path(), (p, s), &dirs, partitioned))
        .collect();
    for s in &mut after {
        s.op.control(Control::Watermark(Timestamp::MAX - 1))
            .unwrap();
        s.op.control(Control::Tick(Timestamp::MAX - 1)).unwrap();
        let got = s.out.0.take();
        let times: Vec<(bool, Timestamp)> = got.iter().map(|&(_, t, pt)| (pt, t)).collect();
        // Each domain fires in time order.
        let (ev, pt): (Vec<(bool, Timestamp)>, Vec<_>) = times.iter().partition(|(pt, _)| !pt);
        assert!(ev.windows(2).all(|w| w[0].1 <= w[1].1), "{ev:?}");
        assert!(pt.windows(2).all(|w| w[0].1 <= w[1].1), "{pt:?}");
        fired.extend(got);
    }
    fired.sort_unstable();
    let mut want: Vec<Fired> = (0..KEYS)
        .flat_map(|k| {
            let k1 = k as i64;
            [
                (k, 100 + k1, false),
                (k, 201 + k1, false),
                (k, 10_100 + k1, true),
                (k, 10_200 + k1, true),
                (k, 10_201 + k1, true),
            ]
        })
        .collect();
    want.sort_unstable();
    assert_eq!(fired, want, "restored at parallelism {p}");
}

#[test]
fn timers_in_rocksdb_fire_once_across_a_restore_at_the_same_parallelism() {
    fire_across_a_restore_at(2, false);
}

#[test]
fn timers_in_rocksdb_fire_once_across_a_restore_at_another_parallelism() {
    fire_across_a_restore_at(3, false);
    fire_across_a_restore_at(1, false);
}

/// `RocksDbConfig::partitioned_index_filters`: the files are written with a two-level
/// index and partitioned filters, and read back the same across restores and rescales
/// (the ingested key groups of another old instance included).
#[test]
fn timers_fire_once_with_partitioned_index_and_filters() {
    fire_across_a_restore_at(2, true);
    fire_across_a_restore_at(3, true);
}
