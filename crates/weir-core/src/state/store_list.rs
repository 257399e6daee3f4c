//! List state over a persistent [`KvStore`] (the RocksDB backend): one store entry per
//! element, so that appending never reads the list.
//!
//! Layout, for state key `k` of table `t` (`P = [key group: u16 BE][t][0][encoded k]`):
//! `P` holds the list's length (weir's codec, a `u64`), and `P ++ [position: u64 BE]` holds
//! each element. Positions run from 0 without gaps, so byte order is list order, and the
//! list is one contiguous range that a rescale splits off with its key group.
//!
//! The write-back cache holds, per key, the length in the store and the elements appended
//! since the last write-back; a whole list is never held. Appends reach the store at the
//! checkpoint barrier or when the cache is full, like the value tables' writes. `update`
//! and `clear` delete the key's stored elements at once (in batches).

use super::prefix::{delete_range, prefix_end};
use super::{Changes, KeyContext, KvStore, ListAccess, StateTableInfo, store_key};
use crate::checkpoint::KeyGroupBlobs;
use crate::codec;
use crate::data::{Data, Key};
use crate::error::{Error, Result};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::rc::Rc;

struct Slot<V> {
    /// The store key of the length; elements follow it with their position.
    prefix: Vec<u8>,
    /// Elements in the store: positions `0..stored`.
    stored: u64,
    /// Elements appended since the last write-back: positions `stored..`.
    pending: Vec<V>,
    /// Used since the last eviction.
    used: bool,
}

/// One list state table: per key, its length and its not yet written appends, over the
/// elements in the store.
pub struct StoreListTable<K, V> {
    name: String,
    keys: FxHashMap<K, Slot<V>>,
    /// Cached keys plus pending elements: what the cache capacity bounds.
    held: usize,
    store: Rc<dyn KvStore>,
    max_parallelism: usize,
    capacity: usize,
}

fn element_key(prefix: &[u8], position: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(prefix.len() + 8);
    key.extend_from_slice(prefix);
    key.extend_from_slice(&position.to_be_bytes());
    key
}

impl<K: Key, V: Data> StoreListTable<K, V> {
    /// A table named `name` over `store`.
    pub fn new(name: &str, store: Rc<dyn KvStore>) -> Self {
        StoreListTable {
            name: name.to_string(),
            keys: FxHashMap::default(),
            held: 0,
            max_parallelism: store.max_parallelism(),
            capacity: store.cache_capacity().max(1),
            store,
        }
    }

    fn key_start(&self) -> usize {
        self.name.len() + 3
    }

    /// The cached slot of `k`, with its length read from the store if it is not cached.
    /// A slot not in the cache has nothing in a background snapshot (it would have stayed
    /// cached until that snapshot settled), so the store's length is current.
    fn slot(&mut self, k: &K) -> Result<&mut Slot<V>> {
        if !self.keys.contains_key(k) {
            self.make_room(1)?;
            let prefix = store_key(
                &self.name,
                k,
                self.max_parallelism,
                self.store.key_encoding(),
            )?;
            let stored = match self.store.get(&prefix)? {
                Some(bytes) => codec::decode::<u64>(&bytes).map_err(|e| {
                    Error::Malformed(format!(
                        "list state '{}' of key {k:?}: the stored length does not decode \
                         ({e}); a checkpoint of a weir release that kept a list as one \
                         value cannot be restored by this one",
                        self.name
                    ))
                })?,
                None => 0,
            };
            self.held += 1;
            return Ok(self.keys.entry(k.clone()).or_insert(Slot {
                prefix,
                stored,
                pending: Vec::new(),
                used: false,
            }));
        }
        let slot = self.keys.get_mut(k).expect("checked above");
        slot.used = true;
        Ok(slot)
    }

    /// Appends `value` to the list of `k` (reads the list's length at most, never its
    /// elements).
    pub fn add(&mut self, k: &K, value: V) -> Result<()> {
        self.make_room(1)?;
        self.slot(k)?.pending.push(value);
        self.held += 1;
        Ok(())
    }

    /// Removes the list of `k`: its stored elements are deleted now, its pending ones
    /// dropped.
    pub fn clear(&mut self, k: &K) -> Result<()> {
        let key_start = self.key_start();
        let slot = self.slot(k)?;
        if slot.stored > 0 {
            let prefix = slot.prefix.clone();
            delete_range(&*self.store, key_start, &prefix, &prefix_end(&prefix))?;
        }
        let slot = self.keys.get_mut(k).expect("slot() cached it");
        slot.stored = 0;
        self.held -= slot.pending.len();
        slot.pending = Vec::new();
        Ok(())
    }

    /// Replaces the list of `k` with `values`.
    pub fn update(&mut self, k: &K, values: Vec<V>) -> Result<()> {
        self.clear(k)?;
        let n = values.len();
        self.slot(k)?.pending = values;
        self.held += n;
        self.make_room(0)
    }

    /// Up to `limit` elements of the list of `k` from position `from` on, and the position
    /// after them.
    pub fn read_from(&mut self, k: &K, from: usize, limit: usize) -> Result<(Vec<V>, usize)> {
        let store = self.store.clone();
        let name = self.name.clone();
        let slot = self.slot(k)?;
        let stored = slot.stored as usize;
        let from = from.min(stored + slot.pending.len());
        let mut out = Vec::with_capacity(limit.min(stored + slot.pending.len() - from));
        if from < stored {
            // Elements of the last barrier may still be on their way into the store.
            store.settle()?;
            let want = limit.min(stored - from);
            let start = element_key(&slot.prefix, from as u64);
            let end = element_key(&slot.prefix, stored as u64);
            for (_, bytes) in store.scan(&start, &end, want)? {
                out.push(super::cached::decode_stored::<V>(&name, &bytes)?);
            }
            if out.len() != want {
                return Err(Error::Malformed(format!(
                    "list state '{name}': the store holds {} of the {want} elements from \
                     position {from} on; the state is damaged",
                    out.len()
                )));
            }
        }
        let next = from + out.len();
        if out.len() < limit && next >= stored {
            let first = next - stored;
            let last = (first + limit - out.len()).min(slot.pending.len());
            out.extend_from_slice(&slot.pending[first..last]);
        }
        let next = from + out.len();
        Ok((out, next))
    }

    /// Keeps the cache within its capacity with room for `extra` more: write everything
    /// back, then evict the keys not used since the last eviction (and more if those used
    /// fill over half the cache).
    fn make_room(&mut self, extra: usize) -> Result<()> {
        if self.held + extra >= self.capacity {
            // Cached lengths may belong to a snapshot still being written, and the store
            // takes no newer value before that snapshot is done.
            self.store.settle()?;
            self.flush()?;
            // The store may size caches from a memory budget shared with tables opened
            // since this one: take the current capacity at every eviction.
            self.capacity = self.store.cache_capacity().max(1);
            let mut keep = self.capacity / 2;
            self.keys.retain(|_, slot| {
                let stays = slot.used && keep > 0;
                if stays {
                    keep -= 1;
                    slot.used = false;
                }
                stays
            });
            self.held = self.keys.len();
            self.keys.shrink_to(self.capacity);
        }
        Ok(())
    }

    /// Encodes the pending elements, with the new lengths, and marks them written.
    /// With a `store`, writes the changes to it in chunks as they are encoded and returns
    /// the rest (see [`Changes::spill`]).
    fn take_changes(&mut self, store: Option<&dyn KvStore>) -> Result<Changes> {
        let mut changes = Changes::for_store(self.key_start(), store);
        for slot in self.keys.values_mut().filter(|s| !s.pending.is_empty()) {
            for (i, v) in slot.pending.iter().enumerate() {
                changes.push_with(|buf| {
                    buf.extend_from_slice(&slot.prefix);
                    buf.extend_from_slice(&(slot.stored + i as u64).to_be_bytes());
                    let start = buf.len();
                    codec::encode_into(v, buf)?;
                    Ok(Some(start))
                })?;
            }
            slot.stored += slot.pending.len() as u64;
            self.held -= slot.pending.len();
            slot.pending = Vec::new();
            changes.push_with(|buf| {
                buf.extend_from_slice(&slot.prefix);
                let start = buf.len();
                codec::encode_into(&slot.stored, buf)?;
                Ok(Some(start))
            })?;
            changes.spill(store)?;
        }
        Ok(changes)
    }

    fn flush(&mut self) -> Result<()> {
        let store = self.store.clone();
        let changes = self.take_changes(Some(&*store))?;
        if !changes.is_empty() {
            store.write(&changes)?;
        }
        Ok(())
    }
}

pub(super) struct Info<T>(pub(super) Rc<RefCell<T>>);

impl<K: Key, V: Data> StateTableInfo for Info<StoreListTable<K, V>> {
    fn entries(&self) -> usize {
        self.0.borrow().keys.len()
    }
    fn snapshot(&self, _max_parallelism: usize) -> Result<KeyGroupBlobs> {
        Ok(Vec::new())
    }
    /// Lists checkpointed by a heap table (a job that switched from the memory backend)
    /// are appended to the cache, and written to the store as the cache fills.
    fn restore(&self, blobs: &KeyGroupBlobs) -> Result<()> {
        let mut t = self.0.borrow_mut();
        for (k, list) in super::heap::decode_key_groups::<K, Vec<V>>(blobs)? {
            for v in list {
                t.add(&k, v)?;
            }
        }
        Ok(())
    }
    fn is_persistent(&self) -> bool {
        true
    }
    fn take_changes(&self) -> Result<Option<Changes>> {
        self.0.borrow_mut().take_changes(None).map(Some)
    }
}

pub(super) struct StoreList<K, V> {
    pub(super) key: Rc<KeyContext<K>>,
    pub(super) table: Rc<RefCell<StoreListTable<K, V>>>,
}

impl<K: Key, V: Data> ListAccess<V> for StoreList<K, V> {
    fn get(&self) -> Result<Vec<V>> {
        self.key.with(|k| {
            let mut t = self.table.borrow_mut();
            let mut out = Vec::new();
            loop {
                let (batch, next) = t.read_from(k, out.len(), super::ITER_BATCH)?;
                if next <= out.len() {
                    return Ok(out);
                }
                out.extend(batch);
            }
        })
    }
    fn add(&mut self, value: V) -> Result<()> {
        self.key.with(|k| self.table.borrow_mut().add(k, value))
    }
    fn update(&mut self, values: Vec<V>) -> Result<()> {
        self.key.with(|k| self.table.borrow_mut().update(k, values))
    }
    fn clear(&mut self) -> Result<()> {
        self.key.with(|k| self.table.borrow_mut().clear(k))
    }
    fn read_from(&self, from: usize, limit: usize) -> Result<(Vec<V>, usize)> {
        self.key
            .with(|k| self.table.borrow_mut().read_from(k, from, limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::KeyEncoding;
    use crate::state::test_store::Store;
    use proptest::prelude::*;

    fn table(capacity: usize) -> (Rc<Store>, StoreListTable<u32, u64>) {
        let store = Rc::new(Store {
            capacity,
            ..Store::default()
        });
        let t = StoreListTable::new("l", store.clone() as Rc<dyn KvStore>);
        (store, t)
    }

    fn all(t: &mut StoreListTable<u32, u64>, k: u32) -> Vec<u64> {
        let mut out = Vec::new();
        loop {
            let (batch, next) = t.read_from(&k, out.len(), 7).unwrap();
            if next <= out.len() {
                return out;
            }
            out.extend(batch);
        }
    }

    /// Elements stored with another type (a job version that changed the list's element
    /// type restored them) fail naming the state, with an error a restart does not retry.
    #[test]
    fn elements_of_another_type_fail_naming_the_state() {
        let (store, mut t) = table(1);
        t.add(&1, 1_000).unwrap();
        t.add(&1, 2_000).unwrap();
        // Key 2 takes the one cache slot: key 1's elements go to the store.
        t.add(&2, 1).unwrap();
        assert_eq!(all(&mut t, 1), vec![1_000, 2_000]);
        let mut texts = StoreListTable::<u32, String>::new("l", store as Rc<dyn KvStore>);
        let e = texts.read_from(&1, 0, 10).unwrap_err();
        assert!(e.is_deterministic(), "{e}");
        assert!(
            e.to_string()
                .contains("state 'l' does not decode as the type the job declares"),
            "{e}"
        );
    }

    /// Appending to a long list reads nothing from the store but the list's length, once.
    #[test]
    fn appending_reads_no_elements() {
        let (store, mut t) = table(16);
        for v in 0..10_000u64 {
            t.add(&((v % 3) as u32), v).unwrap();
        }
        assert_eq!(store.scanned.get(), 0, "no element was read");
        assert!(store.gets.get() <= 3, "{} reads", store.gets.get());
        let want: Vec<u64> = (0..10_000).filter(|v| v % 3 == 1).collect();
        assert_eq!(all(&mut t, 1), want);
        assert!(t.held <= 16);
    }

    /// A list stored as one value (the layout of earlier releases) is refused with an
    /// error that says so, not misread.
    #[test]
    fn a_list_in_the_one_value_layout_is_refused() {
        let (store, mut t) = table(16);
        store.data.borrow_mut().insert(
            store_key("l", &1u32, 128, KeyEncoding::Ordered).unwrap(),
            codec::encode(&vec![1u64, 2, 3]).unwrap(),
        );
        let e = t.add(&1, 4).unwrap_err().to_string();
        assert!(
            e.contains("list state 'l' of key 1") && e.contains("kept a list as one value"),
            "{e}"
        );
    }

    proptest! {
        /// Whatever the capacity and the operations, each key's list reads as a model's,
        /// through write-backs, evictions and clears.
        #[test]
        fn lists_read_as_the_model(
            capacity in 1usize..8,
            ops in prop::collection::vec((0u32..4, 0u8..10, 0u64..1000), 0..300),
        ) {
            let (_store, mut t) = table(capacity);
            let mut model: std::collections::HashMap<u32, Vec<u64>> = Default::default();
            for (k, op, v) in ops {
                match op {
                    0 => {
                        t.clear(&k).unwrap();
                        model.remove(&k);
                    }
                    1 => {
                        let vals: Vec<u64> = (0..v % 5).map(|i| v + i).collect();
                        t.update(&k, vals.clone()).unwrap();
                        model.insert(k, vals);
                    }
                    2 => t.flush().unwrap(),
                    3 => prop_assert_eq!(all(&mut t, k), model.get(&k).cloned().unwrap_or_default()),
                    _ => {
                        t.add(&k, v).unwrap();
                        model.entry(k).or_default().push(v);
                    }
                }
                prop_assert!(t.held <= capacity + 5, "held {}", t.held);
            }
            for k in 0..4 {
                prop_assert_eq!(all(&mut t, k), model.get(&k).cloned().unwrap_or_default());
            }
        }
    }
}
