//! A map of a million entries and a list of a million elements under one key: written,
//! changed, checkpointed, restored and read back exactly (with RocksDB, under a write-back
//! cache a thousandth of their size).

use crate::harness::{Harness, checkpoint, open};
use weir_core::state::{KeyContext, ListState, MapState};

const N: u64 = 1_000_000;
const BIG: u64 = 7;
const SMALL: u64 = 8;

fn element(i: u64) -> u64 {
    i ^ 0x5555
}

fn check(key: &KeyContext<u64>, map: &MapState<u64, u64>, list: &ListState<u64>) {
    key.set(BIG);
    let mut seen = vec![false; N as usize];
    let mut count = 0u64;
    for e in map.iter() {
        let (k, v) = e.unwrap();
        assert!(!seen[k as usize], "user key {k} came twice");
        seen[k as usize] = true;
        assert_eq!(v, if k == 5 { 0 } else { k * 3 }, "user key {k}");
        count += 1;
    }
    assert_eq!(count, N - N / 1000);
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(*s, i % 1000 != 0, "user key {i}");
    }
    assert_eq!(map.get(&999_999).unwrap(), Some(999_999 * 3));
    assert_eq!(map.get(&1_000).unwrap(), None);
    assert!(!map.contains(&N).unwrap());

    let mut n = 0u64;
    for (i, v) in list.iter().enumerate() {
        assert_eq!(v.unwrap(), element(i as u64), "position {i}");
        n += 1;
    }
    assert_eq!(n, N + 1);

    key.set(SMALL);
    assert_eq!(map.entries().unwrap(), vec![(1, 1)]);
    assert_eq!(list.get().unwrap(), vec![1]);
}

pub fn a_million_map_entries_and_list_elements_under_one_key<H: Harness>(h: &H) {
    let (key, mut ctx) = open(h, 0, 1, &[]);
    let mut map = ctx.map_state::<u64, u64>("big-map").unwrap();
    let mut list = ctx.list_state::<u64>("big-list").unwrap();
    key.set(BIG);
    for i in 0..N {
        map.put(i, i * 3).unwrap();
        list.add(element(i)).unwrap();
    }
    key.set(SMALL);
    map.put(1, 1).unwrap();
    list.add(1).unwrap();
    // Change the big ones after most of them reached the store.
    key.set(BIG);
    for i in (0..N).step_by(1000) {
        assert_eq!(map.remove(&i).unwrap(), Some(i * 3));
    }
    map.put(5, 0).unwrap();
    list.add(element(N)).unwrap();
    check(&key, &map, &list);

    let snap = checkpoint(h, &ctx, 1);
    drop((map, list, ctx));
    let (key, mut ctx) = open(h, 0, 1, &[snap]);
    let map = ctx.map_state::<u64, u64>("big-map").unwrap();
    let list = ctx.list_state::<u64>("big-list").unwrap();
    check(&key, &map, &list);
}
