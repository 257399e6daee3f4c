//! Map state over a persistent [`KvStore`] (the RocksDB backend): one store entry per map
//! entry, under `[key group: u16 BE][table][0][encoded key][encoded user key]`, as Flink's
//! RocksDB backend keeps its map state. Reading, putting or removing one user key touches
//! that entry only; iteration reads the key's range of the store in batches.
//!
//! The write-back cache holds single entries (clean, dirty, or known absent), grouped by
//! key so that a key's cached entries can be merged into a scan of its range and dropped
//! when its map is cleared. Dirty entries reach the store at the checkpoint barrier or
//! when the cache is full; eviction gives entries used since the last one a second chance,
//! as the value tables do.

use super::prefix::{delete_range, prefix_end, successor};
use super::{Changes, KeyContext, KvStore, MapAccess, StateTableInfo, store_key};
use crate::checkpoint::KeyGroupBlobs;
use crate::codec;
use crate::data::{Data, Key};
use crate::error::{Error, Result};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::rc::Rc;

struct Entry<UK, UV> {
    key: UK,
    /// `None`: absent (removed, or known not to be in the store).
    value: Option<UV>,
    dirty: bool,
    /// Read or written since the last eviction.
    used: bool,
}

struct Slot<UK, UV> {
    /// The store key prefix of the key's entries.
    prefix: Vec<u8>,
    /// Cached entries by encoded user key: the store's order.
    entries: BTreeMap<Vec<u8>, Entry<UK, UV>>,
}

/// One map state table: cached single entries over the entries in the store.
pub struct StoreMapTable<K, UK, UV> {
    name: String,
    keys: FxHashMap<K, Slot<UK, UV>>,
    /// Cached entries over all keys: what the cache capacity bounds.
    held: usize,
    store: Rc<dyn KvStore>,
    max_parallelism: usize,
    capacity: usize,
}

impl<K: Key, UK: Key, UV: Data> StoreMapTable<K, UK, UV> {
    /// A table named `name` over `store`.
    pub fn new(name: &str, store: Rc<dyn KvStore>) -> Self {
        StoreMapTable {
            name: name.to_string(),
            keys: FxHashMap::default(),
            held: 0,
            max_parallelism: store.max_parallelism(),
            capacity: store.cache_capacity().max(1),
            store,
        }
    }

    fn prefix(&self, k: &K) -> Result<Vec<u8>> {
        match self.keys.get(k) {
            Some(slot) => Ok(slot.prefix.clone()),
            None => store_key(
                &self.name,
                k,
                self.max_parallelism,
                self.store.key_encoding(),
            ),
        }
    }

    /// The cached entry of `(k, uk)`, loaded from the store if it is not cached (an
    /// entry not in the cache has nothing in a background snapshot: it would have stayed
    /// cached until that snapshot settled).
    fn entry(&mut self, k: &K, uk: &UK, load: bool) -> Result<&mut Entry<UK, UV>> {
        let enc = codec::encode(uk)?;
        let cached = self
            .keys
            .get(k)
            .is_some_and(|s| s.entries.contains_key(&enc));
        if !cached {
            self.make_room()?;
            if !self.keys.contains_key(k) {
                let prefix = self.prefix(k)?;
                self.keys.insert(
                    k.clone(),
                    Slot {
                        prefix,
                        entries: BTreeMap::new(),
                    },
                );
            }
        }
        let slot = self.keys.get_mut(k).expect("inserted above");
        if cached {
            let e = slot.entries.get_mut(&enc).expect("checked above");
            e.used = true;
            return Ok(e);
        }
        let value = if load {
            let mut key = slot.prefix.clone();
            key.extend_from_slice(&enc);
            match self.store.get(&key)? {
                Some(bytes) => Some(super::cached::decode_stored::<UV>(&self.name, &bytes)?),
                None => None,
            }
        } else {
            None
        };
        self.held += 1;
        Ok(slot.entries.entry(enc).or_insert(Entry {
            key: uk.clone(),
            value,
            dirty: false,
            used: false,
        }))
    }

    /// The value under `uk` in the map of `k`.
    pub fn get(&mut self, k: &K, uk: &UK) -> Result<Option<UV>> {
        Ok(self.entry(k, uk, true)?.value.clone())
    }

    /// Puts `uk -> v` into the map of `k` (reads nothing).
    pub fn put(&mut self, k: &K, uk: UK, v: UV) -> Result<()> {
        let e = self.entry(k, &uk, false)?;
        e.value = Some(v);
        e.dirty = true;
        Ok(())
    }

    /// Removes `uk` from the map of `k`, returning its value.
    pub fn remove(&mut self, k: &K, uk: &UK) -> Result<Option<UV>> {
        let e = self.entry(k, uk, true)?;
        let old = e.value.take();
        if old.is_some() {
            e.dirty = true;
        }
        Ok(old)
    }

    /// Removes the map of `k`: its cached entries are dropped and its stored ones deleted
    /// now (in batches).
    pub fn clear(&mut self, k: &K) -> Result<()> {
        let prefix = self.prefix(k)?;
        if let Some(slot) = self.keys.remove(k) {
            self.held -= slot.entries.len();
        }
        delete_range(
            &*self.store,
            self.name.len() + 3,
            &prefix,
            &prefix_end(&prefix),
        )?;
        Ok(())
    }

    /// Up to about `limit` entries of the map of `k` after user key `after`, in the order
    /// of the encoded user keys: a batch of the store's range with the cached entries
    /// merged in (cached entries are newer than the store's).
    pub fn entries_after(&self, k: &K, after: Option<&UK>, limit: usize) -> Result<Vec<(UK, UV)>> {
        let limit = limit.max(1);
        let prefix = self.prefix(k)?;
        let end = prefix_end(&prefix);
        let mut start = prefix.clone();
        if let Some(uk) = after {
            codec::encode_into(uk, &mut start)?;
            start.push(0);
        }
        let cached = self.keys.get(k).map(|s| &s.entries);
        loop {
            let batch = self.store.scan(&start, &end, limit)?;
            let full = batch.len() == limit;
            let lo = &start[prefix.len()..];
            let hi = match batch.last() {
                Some((last, _)) if full => Bound::Included(&last[prefix.len()..]),
                _ => Bound::Unbounded,
            };
            let mut from_cache = cached
                .into_iter()
                .flat_map(|m| m.range::<[u8], _>((Bound::Included(lo), hi)))
                .peekable();
            let mut out = Vec::with_capacity(batch.len());
            for (key, value) in &batch {
                let suffix = &key[prefix.len()..];
                if suffix.is_empty() {
                    return Err(Error::Malformed(format!(
                        "map state '{}' of key {k:?} holds the whole map as one value: a \
                         checkpoint of a weir release that kept maps that way cannot be \
                         restored by this one",
                        self.name
                    )));
                }
                while let Some((_, e)) = from_cache.next_if(|(ck, _)| ck.as_slice() < suffix) {
                    if let Some(v) = &e.value {
                        out.push((e.key.clone(), v.clone()));
                    }
                }
                match from_cache.next_if(|(ck, _)| ck.as_slice() == suffix) {
                    Some((_, e)) => {
                        if let Some(v) = &e.value {
                            out.push((e.key.clone(), v.clone()));
                        }
                    }
                    None => out.push((
                        super::cached::decode_stored(&self.name, suffix)?,
                        super::cached::decode_stored(&self.name, value)?,
                    )),
                }
            }
            for (_, e) in from_cache {
                if let Some(v) = &e.value {
                    out.push((e.key.clone(), v.clone()));
                }
            }
            match batch.last() {
                // Every entry of this batch was removed in the cache: read on.
                Some((last, _)) if out.is_empty() && full => start = successor(last),
                _ => return Ok(out),
            }
        }
    }

    /// Keeps the cache within its capacity: write the changes back, then evict every entry
    /// not used since the last eviction, and more if those used fill over half the cache.
    fn make_room(&mut self) -> Result<()> {
        if self.held >= self.capacity {
            // Clean entries may hold values a background snapshot is still writing, and
            // the store takes no newer value before that snapshot is done.
            self.store.settle()?;
            self.flush()?;
            // The store may size caches from a memory budget shared with tables opened
            // since this one: take the current capacity at every eviction.
            self.capacity = self.store.cache_capacity().max(1);
            let mut keep = self.capacity / 2;
            self.keys.retain(|_, slot| {
                slot.entries.retain(|_, e| {
                    let stays = e.used && keep > 0;
                    if stays {
                        keep -= 1;
                        e.used = false;
                    }
                    stays
                });
                !slot.entries.is_empty()
            });
            self.held = self.keys.values().map(|s| s.entries.len()).sum();
            self.keys.shrink_to(self.capacity);
        }
        Ok(())
    }

    /// Encodes the changed entries and marks them clean.
    /// With a `store`, writes the changes to it in chunks as they are encoded and returns
    /// the rest (see [`Changes::spill`]).
    fn take_changes(&mut self, store: Option<&dyn KvStore>) -> Result<Changes> {
        let mut changes = Changes::for_store(self.name.len() + 3, store);
        for slot in self.keys.values_mut() {
            for (enc, e) in slot.entries.iter_mut().filter(|(_, e)| e.dirty) {
                changes.push_with(|buf| {
                    buf.extend_from_slice(&slot.prefix);
                    buf.extend_from_slice(enc);
                    let Some(v) = &e.value else {
                        return Ok(None);
                    };
                    let start = buf.len();
                    codec::encode_into(v, buf)?;
                    Ok(Some(start))
                })?;
                e.dirty = false;
                changes.spill(store)?;
            }
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

impl<K: Key, UK: Key, UV: Data> StateTableInfo for Info<StoreMapTable<K, UK, UV>> {
    fn entries(&self) -> usize {
        self.0.borrow().held
    }
    fn snapshot(&self, _max_parallelism: usize) -> Result<KeyGroupBlobs> {
        Ok(Vec::new())
    }
    /// Maps checkpointed by a heap table (a job that switched from the memory backend)
    /// are put into the cache entry by entry, and written to the store as it fills.
    fn restore(&self, blobs: &KeyGroupBlobs) -> Result<()> {
        let mut t = self.0.borrow_mut();
        for (k, map) in super::heap::decode_key_groups::<K, BTreeMap<UK, UV>>(blobs)? {
            for (uk, uv) in map {
                t.put(&k, uk, uv)?;
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

pub(super) struct StoreMap<K, UK, UV> {
    pub(super) key: Rc<KeyContext<K>>,
    pub(super) table: Rc<RefCell<StoreMapTable<K, UK, UV>>>,
}

impl<K: Key, UK: Key, UV: Data> MapAccess<UK, UV> for StoreMap<K, UK, UV> {
    fn get(&self, uk: &UK) -> Result<Option<UV>> {
        self.key.with(|k| self.table.borrow_mut().get(k, uk))
    }
    fn put(&mut self, uk: UK, uv: UV) -> Result<()> {
        self.key.with(|k| self.table.borrow_mut().put(k, uk, uv))
    }
    fn remove(&mut self, uk: &UK) -> Result<Option<UV>> {
        self.key.with(|k| self.table.borrow_mut().remove(k, uk))
    }
    /// Reads the whole map in batches, then sorts it by user key.
    fn entries(&self) -> Result<Vec<(UK, UV)>> {
        self.key.with(|k| {
            let t = self.table.borrow();
            let mut out: Vec<(UK, UV)> = Vec::new();
            loop {
                let batch = t.entries_after(k, out.last().map(|(uk, _)| uk), super::ITER_BATCH)?;
                if batch.is_empty() {
                    break;
                }
                out.extend(batch);
            }
            out.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(out)
        })
    }
    fn clear(&mut self) -> Result<()> {
        self.key.with(|k| self.table.borrow_mut().clear(k))
    }
    fn entries_after(&self, after: Option<&UK>, limit: usize) -> Result<Vec<(UK, UV)>> {
        self.key
            .with(|k| self.table.borrow().entries_after(k, after, limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::KeyEncoding;
    use crate::state::test_store::Store;
    use proptest::prelude::*;
    use std::collections::HashMap;

    type Table = StoreMapTable<u32, u32, u64>;

    fn table(capacity: usize) -> (Rc<Store>, Table) {
        let store = Rc::new(Store {
            capacity,
            ..Store::default()
        });
        let t = StoreMapTable::new("m", store.clone() as Rc<dyn KvStore>);
        (store, t)
    }

    /// Values stored with another type (a job version that changed the map's value type
    /// restored them) fail naming the state, read one by one or iterated, with an error a
    /// restart does not retry.
    #[test]
    fn values_of_another_type_fail_naming_the_state() {
        let (store, mut t) = table(1);
        t.put(&1, 7, 1_000).unwrap();
        // Key 2 takes the one cache slot: key 1's entry goes to the store.
        t.put(&2, 7, 1).unwrap();
        assert_eq!(all(&t, 1, 10), vec![(7, 1_000)]);
        let mut texts = StoreMapTable::<u32, u32, String>::new("m", store as Rc<dyn KvStore>);
        let named = |e: Error| {
            assert!(e.is_deterministic(), "{e}");
            let e = e.to_string();
            assert!(
                e.contains("state 'm' does not decode as the type the job declares"),
                "{e}"
            );
        };
        named(texts.entries_after(&1, None, 10).unwrap_err());
        named(texts.get(&1, &7).unwrap_err());
    }

    /// Every entry of `k`'s map, read in batches of `batch`, in iteration order.
    fn all(t: &Table, k: u32, batch: usize) -> Vec<(u32, u64)> {
        let mut out: Vec<(u32, u64)> = Vec::new();
        loop {
            let b = t
                .entries_after(&k, out.last().map(|(uk, _)| uk), batch)
                .unwrap();
            if b.is_empty() {
                return out;
            }
            out.extend(b);
        }
    }

    /// Putting into and reading one entry of a large map reads that entry only.
    #[test]
    fn one_entry_is_read_alone() {
        let (store, mut t) = table(8);
        for uk in 0..5_000u32 {
            t.put(&1, uk, uk as u64 * 2).unwrap();
        }
        t.flush().unwrap();
        assert_eq!(store.gets.get(), 0, "put reads nothing");
        assert_eq!(t.get(&1, &4_321).unwrap(), Some(8_642));
        assert_eq!(t.get(&1, &9_999).unwrap(), None);
        assert_eq!(store.gets.get(), 2);
        assert_eq!(store.scanned.get(), 0);
        assert_eq!(all(&t, 1, 100).len(), 5_000);
    }

    /// A map stored as one value (the layout of earlier releases) is refused with an
    /// error that says so when it is read, not misread.
    #[test]
    fn a_map_in_the_one_value_layout_is_refused() {
        let (store, t) = table(16);
        store.data.borrow_mut().insert(
            store_key("m", &1u32, 128, KeyEncoding::Ordered).unwrap(),
            codec::encode(&BTreeMap::from([(1u32, 2u64)])).unwrap(),
        );
        let e = t.entries_after(&1, None, 10).unwrap_err().to_string();
        assert!(
            e.contains("map state 'm' of key 1") && e.contains("holds the whole map as one value"),
            "{e}"
        );
    }

    proptest! {
        /// Whatever the capacity and the operations, each key's map reads as a model's,
        /// by single entries and by iteration (every entry once, each batch size), through
        /// write-backs, evictions and clears.
        #[test]
        fn maps_read_as_the_model(
            capacity in 1usize..8,
            batch in 1usize..5,
            ops in prop::collection::vec((0u32..3, 0u8..10, 0u32..12, 0u64..100), 0..300),
        ) {
            let (_store, mut t) = table(capacity);
            let mut model: HashMap<u32, BTreeMap<u32, u64>> = HashMap::new();
            for (k, op, uk, v) in ops {
                match op {
                    0 => {
                        t.clear(&k).unwrap();
                        model.remove(&k);
                    }
                    1 | 2 => {
                        let want = model.get_mut(&k).and_then(|m| m.remove(&uk));
                        prop_assert_eq!(t.remove(&k, &uk).unwrap(), want);
                    }
                    3 => t.flush().unwrap(),
                    4 => prop_assert_eq!(
                        t.get(&k, &uk).unwrap(),
                        model.get(&k).and_then(|m| m.get(&uk).copied())
                    ),
                    5 => {
                        let mut got = all(&t, k, batch);
                        got.sort();
                        let want: Vec<(u32, u64)> = model
                            .get(&k)
                            .map(|m| m.iter().map(|(a, b)| (*a, *b)).collect())
                            .unwrap_or_default();
                        prop_assert_eq!(got, want);
                    }
                    _ => {
                        t.put(&k, uk, v).unwrap();
                        model.entry(k).or_default().insert(uk, v);
                    }
                }
                prop_assert!(t.held <= capacity, "held {}", t.held);
            }
            for k in 0..3 {
                let mut got = all(&t, k, batch);
                got.sort();
                let want: Vec<(u32, u64)> = model
                    .get(&k)
                    .map(|m| m.iter().map(|(a, b)| (*a, *b)).collect())
                    .unwrap_or_default();
                prop_assert_eq!(got, want);
            }
        }
    }
}
