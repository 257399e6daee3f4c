//! The store-backed timer queue against the heap queue, over an in-memory ordered store.

use super::KvStore;
use super::test_store::Store;
use super::timers::StoreTimers;
use crate::time::Timestamp;
use crate::timer::TimerQueue;
use proptest::prelude::*;
use std::rc::Rc;

fn store(capacity: usize) -> Rc<Store> {
    Rc::new(Store::with_capacity(capacity))
}

/// What a checkpoint does with the queue: its changes written to the store.
fn checkpoint(q: &mut StoreTimers<u32, u8>, store: &Store) {
    let mut c = q.changes();
    q.take_changes_into(&mut c, None).unwrap();
    store.write(&c).unwrap();
}

/// Everything due at `now`, sorted within each time (the heap keeps registration order,
/// the store key order).
fn drain(q: &mut StoreTimers<u32, u8>, now: Timestamp) -> Vec<(Timestamp, Vec<(u32, u8)>)> {
    let mut out: Vec<(Timestamp, Vec<(u32, u8)>)> = Vec::new();
    while let Some((ts, mut due)) = q.pop_due(now).unwrap() {
        match out.last_mut() {
            Some((last, all)) if *last == ts => all.append(&mut due),
            _ => out.push((ts, due)),
        }
    }
    for (_, d) in &mut out {
        d.sort_unstable();
    }
    out
}

fn drain_heap(q: &mut TimerQueue<u32, u8>, now: Timestamp) -> Vec<(Timestamp, Vec<(u32, u8)>)> {
    let mut out = Vec::new();
    while let Some((ts, mut due)) = q.pop_due(now) {
        due.sort_unstable();
        out.push((ts, due));
    }
    out
}

#[derive(Debug, Clone)]
enum Op {
    Register(Timestamp, u32, u8),
    Delete(Timestamp, u32, u8),
    Fire(Timestamp),
    Checkpoint,
    /// Reopens the queue over the store after a checkpoint, as a restore does.
    Restore,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (-20i64..40, 0u32..30, 0u8..2).prop_map(|(t, k, n)| Op::Register(t, k, n)),
        2 => (-20i64..40, 0u32..30, 0u8..2).prop_map(|(t, k, n)| Op::Delete(t, k, n)),
        1 => (-20i64..40).prop_map(Op::Fire),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Restore),
    ]
}

proptest! {
    /// Whatever the cache capacity, the interleaving of checkpoints and restores, the
    /// store queue fires exactly what the heap queue fires, in the same time order; a
    /// checked queue also gives the same de-duplication and deletion answers and count.
    #[test]
    fn fires_like_the_heap_queue(
        capacity in 1usize..8,
        checked in any::<bool>(),
        ops in prop::collection::vec(op(), 0..200),
    ) {
        let st = store(capacity);
        let mut q = StoreTimers::<u32, u8>::open("t", 0, st.clone(), checked).unwrap();
        let mut model = TimerQueue::<u32, u8>::default();
        for op in ops {
            match op {
                Op::Register(t, k, n) => {
                    let (got, want) = (q.register(t, &k, &n).unwrap(), model.register(t, k, n));
                    prop_assert!(got == want || !checked);
                }
                Op::Delete(t, k, n) => {
                    let (got, want) = (q.delete(t, &k, &n).unwrap(), model.delete(t, k, n));
                    prop_assert!(got == want || !checked);
                }
                Op::Fire(now) => prop_assert_eq!(drain(&mut q, now), drain_heap(&mut model, now)),
                Op::Checkpoint => checkpoint(&mut q, &st),
                Op::Restore => {
                    checkpoint(&mut q, &st);
                    q = StoreTimers::open("t", 0, st.clone(), checked).unwrap();
                }
            }
            if checked {
                prop_assert_eq!(q.len().unwrap(), model.len());
            }
            prop_assert!(q.cached() <= capacity);
        }
        prop_assert_eq!(drain(&mut q, Timestamp::MAX), drain_heap(&mut model, Timestamp::MAX));
        prop_assert_eq!(q.next_time(), None);
    }
}

/// Firing the earliest timers reads only those, not the whole queue: the queue keeps the
/// head of each key group in memory and the rest in the store.
#[test]
fn firing_reads_the_due_timers_not_all_of_them() {
    let st = store(64);
    let mut q = StoreTimers::<u32, u8>::open("t", 0, st.clone(), true).unwrap();
    for k in 0..10_000u32 {
        q.register(1_000 + i64::from(k), &k, &0).unwrap();
    }
    checkpoint(&mut q, &st);
    assert!(q.cached() < 64, "the timers are in the store");
    let q = &mut StoreTimers::<u32, u8>::open("t", 0, st.clone(), true).unwrap();
    st.scanned.set(0);
    let fired = drain(q, 1_009);
    assert_eq!(
        fired,
        (0..10u32)
            .map(|k| (1_000 + i64::from(k), vec![(k, 0)]))
            .collect::<Vec<_>>()
    );
    // Each fired timer is read a few times (firing it, then finding the next head of its
    // key group past it), the other 9,990 not at all.
    assert!(st.scanned.get() <= 40, "read {} entries", st.scanned.get());
    assert_eq!(q.next_time(), Some(1_010));
}

/// Timers of one key group and different domains or tables do not see each other.
#[test]
fn domains_and_tables_are_separate() {
    let st = store(4);
    let mut event = StoreTimers::<u32, u8>::open("t", 0, st.clone(), true).unwrap();
    let mut processing = StoreTimers::<u32, u8>::open("t", 1, st.clone(), true).unwrap();
    let mut other = StoreTimers::<u32, u8>::open("u", 0, st.clone(), true).unwrap();
    for k in 0..20u32 {
        event.register(5, &k, &0).unwrap();
        processing.register(7, &k, &1).unwrap();
        other.register(9, &k, &2).unwrap();
    }
    let all = |n: u8| vec![(0..20u32).map(|k| (k, n)).collect::<Vec<_>>()];
    assert_eq!(drain(&mut processing, 100), vec![(7, all(1)[0].clone())]);
    assert_eq!(drain(&mut event, 100), vec![(5, all(0)[0].clone())]);
    assert_eq!(drain(&mut other, 100), vec![(9, all(2)[0].clone())]);
}

/// Negative and extreme times keep their order (the time's sign bit is flipped in keys).
#[test]
fn negative_and_extreme_times_fire_in_order() {
    let st = store(8);
    let mut q = StoreTimers::<u32, u8>::open("t", 0, st, true).unwrap();
    for (i, t) in [i64::MAX, 0, -1, i64::MIN, 1].into_iter().enumerate() {
        q.register(t, &(i as u32), &0).unwrap();
    }
    let times: Vec<_> = drain(&mut q, i64::MAX)
        .into_iter()
        .map(|(t, _)| t)
        .collect();
    assert_eq!(times, [i64::MIN, -1, 0, 1, i64::MAX]);
}
