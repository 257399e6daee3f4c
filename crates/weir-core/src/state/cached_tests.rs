//! Tests of the write-back cache and its change sets.

use super::*;
use crate::state::test_store::Store;
use proptest::prelude::*;
use std::collections::HashMap;

fn table(capacity: usize) -> (Rc<Store>, CachedTable<u32, u64>) {
    let store = Rc::new(Store {
        capacity,
        ..Store::default()
    });
    let t = CachedTable::new("t", store.clone() as Rc<dyn KvStore>);
    (store, t)
}

/// A full cache writes its changes back a chunk at a time: no batch the store gets
/// holds much more than `WRITE_CHUNK_BYTES` (the copies a write-back makes do not
/// grow with the cache), and every value is in the store afterwards.
#[test]
fn a_full_cache_writes_back_in_bounded_chunks() {
    let store = Rc::new(Store::with_capacity(64));
    let mut t = CachedTable::<u32, Vec<u8>>::new("t", store.clone() as Rc<dyn KvStore>);
    let value = |k: u32| vec![k as u8; 100_000];
    // Eviction starts at four fifths of the capacity (no snapshot is being written).
    let full = eviction_start(64) as u32;
    for k in 0..full {
        t.put(&k, Some(value(k))).unwrap();
    }
    assert_eq!(store.writes.get(), 0);
    // The next key finds the cache full: its 5.2 MB of changes go to the store.
    t.put(&full, Some(value(full))).unwrap();
    assert!(store.writes.get() >= 5, "{} writes", store.writes.get());
    let largest = store.largest_write.get();
    assert!(
        largest < WRITE_CHUNK_BYTES + 100_100,
        "{largest} bytes in one write"
    );
    let data = store.data.borrow();
    for k in 0..full {
        let stored = data
            .get(&store_key("t", &k, 128, KeyEncoding::Ordered).unwrap())
            .unwrap();
        assert_eq!(
            codec::decode::<Vec<u8>>(stored).unwrap(),
            value(k),
            "key {k}"
        );
    }
    assert_eq!(data.len(), full as usize);
}

/// A key read again and again stays cached while keys seen once stream through a
/// cache much smaller than them.
#[test]
fn a_hot_key_survives_evictions() {
    let (store, mut t) = table(64);
    t.put(&0, Some(1)).unwrap();
    for cold in 1..10_000u32 {
        t.put(&cold, Some(cold as u64)).unwrap();
        let hot = t.get(&0).unwrap().unwrap();
        t.put(&0, Some(hot + 1)).unwrap();
    }
    assert_eq!(t.get(&0).unwrap(), Some(10_000));
    assert_eq!(
        store.gets.get(),
        0,
        "the hot key was never read back from the store"
    );
    assert!(t.map.len() <= 64);
    // Evicted keys come back from the store with their values.
    assert_eq!(t.get(&5_000).unwrap(), Some(5_000));
    assert_eq!(store.gets.get(), 1);
}

/// While a snapshot is written in the background the cache fills its last fifth
/// instead of waiting for it; at its capacity it waits, and the values it wrote back
/// then are all in the store.
#[test]
fn an_eviction_waits_for_a_background_snapshot_only_at_capacity() {
    let (store, mut t) = table(100);
    for k in 0..80u32 {
        t.put(&k, Some(u64::from(k))).unwrap();
    }
    // A checkpoint took the changes; its snapshot is still being written.
    store.write(&t.take_changes(None).unwrap()).unwrap();
    store.settling.set(true);
    for k in 80..100u32 {
        t.put(&k, Some(u64::from(k))).unwrap();
    }
    assert_eq!((t.map.len(), store.settles.get()), (100, 0));
    t.put(&100, Some(100)).unwrap();
    assert_eq!(
        store.settles.get(),
        1,
        "a full cache waits for the snapshot"
    );
    assert!(t.map.len() <= 100);
    // Without a snapshot being written, eviction starts at four fifths.
    let (store, mut t) = table(100);
    for k in 0..81u32 {
        t.put(&k, Some(u64::from(k))).unwrap();
    }
    assert_eq!(store.settles.get(), 1);
    assert!(t.map.len() < 80, "{}", t.map.len());
    for k in 0..101u32 {
        assert_eq!(
            t.get(&k).unwrap(),
            (k < 81).then_some(u64::from(k)),
            "key {k}"
        );
    }
}

proptest! {
    /// Whatever the capacity and the access pattern, the cached table reads what was
    /// last written, through flushes and evictions.
    #[test]
    fn reads_see_the_last_write(
        capacity in 1usize..6,
        ops in prop::collection::vec((0u32..12, prop::option::of(0u64..100), any::<bool>()), 0..300),
    ) {
        let (_store, mut t) = table(capacity);
        let mut model: HashMap<u32, u64> = HashMap::new();
        for (k, v, checkpoint) in ops {
            match v {
                Some(v) => {
                    t.put(&k, Some(v)).unwrap();
                    model.insert(k, v);
                }
                None => prop_assert_eq!(t.get(&k).unwrap(), model.get(&k).copied()),
            }
            if checkpoint {
                t.flush().unwrap();
            }
            prop_assert!(t.map.len() <= capacity);
        }
        for k in 0..12 {
            prop_assert_eq!(t.get(&k).unwrap(), model.get(&k).copied());
        }
    }
}

proptest! {
    /// The cheap sort gives exactly byte order, whatever the keys share.
    #[test]
    fn batches_come_out_in_byte_order(
        keys in prop::collection::btree_set(
            (0u16..4, prop::collection::vec(0u8..3, 0..10)), 0..200),
        name in "[a-z]{0,4}",
    ) {
        let batch: Vec<(Vec<u8>, Option<Vec<u8>>)> = keys
            .iter()
            .rev()
            .enumerate()
            .map(|(i, (g, k))| {
                let mut key = g.to_be_bytes().to_vec();
                key.extend_from_slice(name.as_bytes());
                key.push(0);
                key.extend_from_slice(k);
                (key, (i % 3 != 0).then(|| vec![i as u8]))
            })
            .collect();
        let mut changes = Changes::new(name.len() + 3);
        for (k, v) in &batch {
            changes.push_with(|buf| {
                buf.extend_from_slice(k);
                let start = buf.len();
                Ok(v.as_ref().map(|v| {
                    buf.extend_from_slice(v);
                    start
                }))
            }).unwrap();
        }
        let mut want = batch.clone();
        want.sort();
        let got: Vec<(Vec<u8>, Option<Vec<u8>>)> = changes
            .sorted()
            .into_iter()
            .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
            .collect();
        prop_assert_eq!(got, want);
    }
}
