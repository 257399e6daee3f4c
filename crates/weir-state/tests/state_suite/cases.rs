//! The cases of the state suite, each a generic function of the backend.

use crate::harness::{Harness, MAX_PARALLELISM, checkpoint, open};
use std::time::Duration;
use weir_core::data::{key_group, subtask_for_key_group};
use weir_core::state::{ITER_BATCH, ListState, MapState, StateContext, ValueState};

const HOUR: Duration = Duration::from_secs(3600);

pub fn value_state_is_per_key<H: Harness>(h: &H) {
    let (key, mut ctx) = open(h, 0, 1, &[]);
    let mut v = ctx.value_state::<String>("v").unwrap();
    let mut sum = ctx.reducing_state::<u64>("sum", |a, b| a + b).unwrap();
    for k in 0..200u64 {
        key.set(k);
        v.set(format!("v{k}")).unwrap();
        sum.add(k).unwrap();
        sum.add(1).unwrap();
    }
    for k in (0..200u64).step_by(3) {
        key.set(k);
        v.clear().unwrap();
    }
    for k in 0..200u64 {
        key.set(k);
        assert_eq!(
            v.get().unwrap(),
            (k % 3 != 0).then(|| format!("v{k}")),
            "key {k}"
        );
        assert_eq!(sum.get().unwrap(), Some(k + 1), "key {k}");
    }
    key.set(1);
    assert_eq!(v.update(|o| o.unwrap() + "!").unwrap(), "v1!");
    assert_eq!(v.get().unwrap().as_deref(), Some("v1!"));
    key.set(1_000);
    assert_eq!(v.get().unwrap(), None);
    assert_eq!(sum.get().unwrap(), None);
}

pub fn list_state_adds_updates_and_clears<H: Harness>(h: &H) {
    let (key, mut ctx) = open(h, 0, 1, &[]);
    let mut l = ctx.list_state::<u64>("l").unwrap();
    for i in 0..1_000u64 {
        key.set(i % 10);
        l.add(i).unwrap();
    }
    for k in 0..10u64 {
        key.set(k);
        let want: Vec<u64> = (0..1_000).filter(|i| i % 10 == k).collect();
        assert_eq!(l.get().unwrap(), want, "key {k}");
    }
    key.set(3);
    l.update(vec![7, 8, 9]).unwrap();
    assert_eq!(l.get().unwrap(), vec![7, 8, 9]);
    l.add(10).unwrap();
    assert_eq!(l.get().unwrap(), vec![7, 8, 9, 10]);
    key.set(4);
    l.clear().unwrap();
    assert_eq!(l.get().unwrap(), Vec::<u64>::new());
    l.add(1).unwrap();
    assert_eq!(l.get().unwrap(), vec![1]);
    key.set(5);
    l.update(Vec::new()).unwrap();
    assert_eq!(l.get().unwrap(), Vec::<u64>::new());
    key.set(6);
    let want: Vec<u64> = (0..1_000).filter(|i| i % 10 == 6).collect();
    assert_eq!(l.get().unwrap(), want, "other keys keep their lists");
    key.set(100);
    assert_eq!(l.get().unwrap(), Vec::<u64>::new());
}

pub fn map_state_puts_gets_removes_and_clears<H: Harness>(h: &H) {
    let (key, mut ctx) = open(h, 0, 1, &[]);
    let mut m = ctx.map_state::<String, u64>("m").unwrap();
    for k in 0..20u64 {
        key.set(k);
        for j in 0..50 {
            m.put(format!("u{j}"), k * 100 + j).unwrap();
        }
    }
    key.set(3);
    assert_eq!(m.get(&"u7".into()).unwrap(), Some(307));
    assert_eq!(m.get(&"nope".into()).unwrap(), None);
    assert!(m.contains(&"u7".into()).unwrap());
    assert!(!m.contains(&"x".into()).unwrap());
    assert_eq!(m.remove(&"u7".into()).unwrap(), Some(307));
    assert_eq!(m.remove(&"u7".into()).unwrap(), None);
    assert_eq!(m.get(&"u7".into()).unwrap(), None);
    assert!(!m.contains(&"u7".into()).unwrap());
    m.put("u8".into(), 1).unwrap();
    assert_eq!(m.get(&"u8".into()).unwrap(), Some(1));
    let mut want: Vec<(String, u64)> = (0..50)
        .filter(|j| *j != 7)
        .map(|j| (format!("u{j}"), if j == 8 { 1 } else { 300 + j }))
        .collect();
    want.sort();
    assert_eq!(
        m.entries().unwrap(),
        want,
        "entries() is sorted by user key"
    );
    key.set(4);
    m.clear().unwrap();
    assert_eq!(m.entries().unwrap(), Vec::new());
    assert!(m.is_empty().unwrap());
    assert_eq!(m.get(&"u1".into()).unwrap(), None);
    m.put("z".into(), 5).unwrap();
    assert_eq!(m.entries().unwrap(), vec![("z".to_string(), 5)]);
    key.set(5);
    assert_eq!(m.entries().unwrap().len(), 50, "other keys keep their maps");
    assert!(!m.is_empty().unwrap());
    key.set(99);
    assert!(m.is_empty().unwrap());
}

fn sorted<T: Ord>(it: impl Iterator<Item = weir_core::Result<T>>) -> Vec<T> {
    let mut v: Vec<T> = it.map(Result::unwrap).collect();
    v.sort();
    v
}

pub fn iteration_reads_every_element_once<H: Harness>(h: &H) {
    let (key, mut ctx) = open(h, 0, 1, &[]);
    let mut l = ctx.list_state::<u64>("l").unwrap();
    let mut m = ctx.map_state::<u64, u64>("m").unwrap();
    let n = 3 * ITER_BATCH as u64 + 7;
    for k in 0..3u64 {
        key.set(k);
        for i in 0..n {
            l.add(k * n + i).unwrap();
            m.put(i, k * n + i).unwrap();
        }
    }
    // A checkpoint writes everything to a persistent store; the changes after it stay in
    // the cache (those that fit) and iteration must merge both.
    let _snap = checkpoint(h, &ctx, 1);
    key.set(1);
    for i in (0..n).step_by(5) {
        assert_eq!(m.remove(&i).unwrap(), Some(n + i));
    }
    for i in (1..n).step_by(5) {
        m.put(i, 0).unwrap();
    }
    m.put(n + 10, 42).unwrap();
    for i in 0..10 {
        l.add(i).unwrap();
    }

    let want_list: Vec<u64> = (n..2 * n).chain(0..10).collect();
    let got: Vec<u64> = l.iter().map(Result::unwrap).collect();
    assert_eq!(got, want_list, "list iteration is in list order");
    assert_eq!(l.get().unwrap(), want_list);

    let mut want_map: Vec<(u64, u64)> = (0..n)
        .filter(|i| i % 5 != 0)
        .map(|i| (i, if i % 5 == 1 { 0 } else { n + i }))
        .collect();
    want_map.push((n + 10, 42));
    assert_eq!(sorted(m.iter()), want_map);
    assert_eq!(m.entries().unwrap(), want_map);
    assert_eq!(
        sorted(m.keys()),
        want_map.iter().map(|e| e.0).collect::<Vec<_>>()
    );
    assert_eq!(
        m.values().map(Result::unwrap).sum::<u64>(),
        want_map.iter().map(|e| e.1).sum::<u64>()
    );
    // The neighbours are untouched.
    for k in [0u64, 2] {
        key.set(k);
        assert_eq!(
            l.iter().map(Result::unwrap).collect::<Vec<_>>(),
            (k * n..(k + 1) * n).collect::<Vec<_>>()
        );
        assert_eq!(
            sorted(m.iter()),
            (0..n).map(|i| (i, k * n + i)).collect::<Vec<_>>()
        );
    }
    key.set(7);
    assert_eq!(l.iter().count(), 0);
    assert_eq!(m.iter().count(), 0);
}

pub fn ttl_hides_what_expired<H: Harness>(h: &H) {
    let (key, mut ctx) = open(h, 0, 1, &[]);
    let mut v0 = ctx
        .value_state_with_ttl::<u64>("v0", Duration::ZERO)
        .unwrap();
    let mut v1 = ctx.value_state_with_ttl::<u64>("v1", HOUR).unwrap();
    let mut l0 = ctx
        .list_state_with_ttl::<u64>("l0", Duration::ZERO)
        .unwrap();
    let mut l1 = ctx.list_state_with_ttl::<u64>("l1", HOUR).unwrap();
    let mut m0 = ctx
        .map_state_with_ttl::<u64, u64>("m0", Duration::ZERO)
        .unwrap();
    let mut m1 = ctx.map_state_with_ttl::<u64, u64>("m1", HOUR).unwrap();
    // More than a batch per key, so that iteration skips whole batches of expired ones.
    let n = ITER_BATCH as u64 * 2 + 3;
    for k in 0..3u64 {
        key.set(k);
        v0.set(k).unwrap();
        v1.set(k).unwrap();
        for i in 0..n {
            l0.add(i).unwrap();
            l1.add(k + i).unwrap();
            m0.put(i, i).unwrap();
            m1.put(i, k + i).unwrap();
        }
    }
    for k in 0..3u64 {
        key.set(k);
        assert_eq!(v0.get().unwrap(), None);
        assert_eq!(v1.get().unwrap(), Some(k));
        assert_eq!(l0.get().unwrap(), Vec::<u64>::new());
        assert_eq!(l0.iter().count(), 0);
        let want: Vec<u64> = (k..k + n).collect();
        assert_eq!(l1.get().unwrap(), want);
        assert_eq!(l1.iter().map(Result::unwrap).collect::<Vec<_>>(), want);
        assert_eq!(m0.get(&1).unwrap(), None);
        assert_eq!(m0.remove(&2).unwrap(), None);
        assert!(m0.entries().unwrap().is_empty());
        assert_eq!(m0.iter().count(), 0);
        assert!(m0.is_empty().unwrap());
        assert_eq!(m1.get(&1).unwrap(), Some(k + 1));
        let want: Vec<(u64, u64)> = (0..n).map(|i| (i, k + i)).collect();
        assert_eq!(m1.entries().unwrap(), want);
        assert_eq!(sorted(m1.iter()), want);
    }
}

/// A value, a list, a map and TTL variants: the states the recovery cases check.
struct States {
    value: ValueState<u64>,
    list: ListState<u64>,
    map: MapState<u32, String>,
    ttl_list: ListState<u64>,
    ttl_map: MapState<u32, u64>,
}

impl States {
    fn new(ctx: &mut StateContext<u64>) -> Self {
        States {
            value: ctx.value_state("value").unwrap(),
            list: ctx.list_state("list").unwrap(),
            map: ctx.map_state("map").unwrap(),
            ttl_list: ctx.list_state_with_ttl("ttl-list", HOUR).unwrap(),
            ttl_map: ctx.map_state_with_ttl("ttl-map", HOUR).unwrap(),
        }
    }

    fn fill(&mut self, k: u64) {
        if !k.is_multiple_of(7) {
            self.value.set(k * 3).unwrap();
        }
        for i in 0..k % 9 {
            self.list.add(k * 10 + i).unwrap();
        }
        for i in 0..(k % 6) as u32 {
            self.map.put(i, format!("{k}:{i}")).unwrap();
        }
        self.ttl_list.add(k).unwrap();
        self.ttl_map.put(1, k).unwrap();
    }

    fn expect(&self, k: u64) {
        assert_eq!(
            self.value.get().unwrap(),
            (!k.is_multiple_of(7)).then_some(k * 3),
            "key {k}"
        );
        let list: Vec<u64> = (0..k % 9).map(|i| k * 10 + i).collect();
        assert_eq!(self.list.get().unwrap(), list, "key {k}");
        let map: Vec<(u32, String)> = (0..(k % 6) as u32)
            .map(|i| (i, format!("{k}:{i}")))
            .collect();
        assert_eq!(self.map.entries().unwrap(), map, "key {k}");
        assert_eq!(self.ttl_list.get().unwrap(), vec![k], "key {k}");
        assert_eq!(self.ttl_map.entries().unwrap(), vec![(1, k)], "key {k}");
    }

    fn expect_empty(&self, k: u64) {
        assert_eq!(self.value.get().unwrap(), None, "key {k}");
        assert_eq!(self.list.get().unwrap(), Vec::<u64>::new(), "key {k}");
        assert!(self.map.is_empty().unwrap(), "key {k}");
        assert_eq!(self.ttl_list.get().unwrap(), Vec::<u64>::new(), "key {k}");
        assert!(self.ttl_map.is_empty().unwrap(), "key {k}");
    }
}

const KEYS: u64 = 400;

pub fn a_restore_gives_the_state_at_the_checkpoint<H: Harness>(h: &H) {
    let (key, mut ctx) = open(h, 0, 1, &[]);
    let mut s = States::new(&mut ctx);
    for k in 0..KEYS {
        key.set(k);
        s.fill(k);
    }
    let snap = checkpoint(h, &ctx, 1);
    // What happens after the barrier is not in the checkpoint.
    for k in 0..KEYS {
        key.set(k);
        s.value.set(999).unwrap();
        s.list.add(999).unwrap();
        s.map.put(999, "late".into()).unwrap();
        if k % 2 == 0 {
            s.list.clear().unwrap();
            s.map.clear().unwrap();
        }
    }
    drop((s, ctx));

    let (key, mut ctx) = open(h, 0, 1, &[snap]);
    let mut s = States::new(&mut ctx);
    for k in 0..KEYS {
        key.set(k);
        s.expect(k);
    }
    // The restored lists and maps go on from where they were, through another checkpoint.
    for k in 0..KEYS {
        key.set(k);
        s.list.add(7).unwrap();
        s.map.remove(&0).unwrap();
    }
    let snap = checkpoint(h, &ctx, 2);
    drop((s, ctx));
    let (key, mut ctx) = open(h, 0, 1, &[snap]);
    let s = States::new(&mut ctx);
    for k in 0..KEYS {
        key.set(k);
        let list: Vec<u64> = (0..k % 9).map(|i| k * 10 + i).chain([7]).collect();
        assert_eq!(s.list.get().unwrap(), list, "key {k}");
        let map: Vec<(u32, String)> = (1..(k % 6) as u32)
            .map(|i| (i, format!("{k}:{i}")))
            .collect();
        assert_eq!(s.map.entries().unwrap(), map, "key {k}");
    }
}

fn owner(k: u64, parallelism: usize) -> usize {
    subtask_for_key_group(key_group(&k, MAX_PARALLELISM), MAX_PARALLELISM, parallelism)
}

pub fn a_restore_at_another_parallelism_gives_each_key_to_its_owner<H: Harness>(h: &H) {
    // Two subtasks, each with the keys of its key groups.
    let mut snaps = Vec::new();
    for sub in 0..2 {
        let (key, mut ctx) = open(h, sub, 2, &[]);
        let mut s = States::new(&mut ctx);
        for k in (0..KEYS).filter(|k| owner(*k, 2) == sub) {
            key.set(k);
            s.fill(k);
        }
        snaps.push(checkpoint(h, &ctx, 1));
    }
    // Three subtasks: each has exactly the keys it now owns.
    let mut rescaled = Vec::new();
    for sub in 0..3 {
        let (key, mut ctx) = open(h, sub, 3, &snaps);
        let mut s = States::new(&mut ctx);
        let mut owned = 0;
        for k in 0..KEYS {
            key.set(k);
            if owner(k, 3) == sub {
                s.expect(k);
                owned += 1;
            } else {
                s.expect_empty(k);
            }
        }
        assert!(owned > 0, "subtask {sub} of 3 owns some of the keys");
        // Change the owned keys, so that the next restore shows the rescaled state moved on.
        for k in (0..KEYS).filter(|k| owner(*k, 3) == sub) {
            key.set(k);
            s.list.add(k).unwrap();
        }
        rescaled.push(checkpoint(h, &ctx, 2));
    }
    // And back to one subtask.
    let (key, mut ctx) = open(h, 0, 1, &rescaled);
    let s = States::new(&mut ctx);
    for k in 0..KEYS {
        key.set(k);
        assert_eq!(
            s.value.get().unwrap(),
            (!k.is_multiple_of(7)).then_some(k * 3),
            "key {k}"
        );
        let list: Vec<u64> = (0..k % 9).map(|i| k * 10 + i).chain([k]).collect();
        assert_eq!(s.list.get().unwrap(), list, "key {k}");
        assert_eq!(s.map.entries().unwrap().len(), (k % 6) as usize, "key {k}");
    }
}
