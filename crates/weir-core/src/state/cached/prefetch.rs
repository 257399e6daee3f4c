//! Batched reads ahead of a batch of records: a keyed operator hands the keys of the batch
//! it is about to process to its tables, and each loads the values it does not cache with
//! one batched read of the store ([`KvStore::multi_get`], RocksDB's MultiGet) instead of a
//! point read per record. What the records then read is what they would have read one by
//! one: a key that is not cached has its latest value in the store (an eviction first
//! waits for a snapshot still being written), and a loaded value is clean.

use super::{CachedTable, Slot};
use crate::data::{Data, Key};
use crate::error::Result;
use std::cell::RefCell;

/// Keys read from the store in one batched read.
const READ_CHUNK: usize = 32;

/// A table that can load the values of a batch's keys ahead of the batch.
pub(crate) trait Prefetch<K> {
    /// Loads the values of those of `keys` the table does not cache; see
    /// [`CachedTable::prefetch`].
    fn prefetch(&self, keys: &[K]) -> Result<()>;
}

impl<K: Key, V: Data> Prefetch<K> for RefCell<CachedTable<K, V>> {
    fn prefetch(&self, keys: &[K]) -> Result<()> {
        self.borrow_mut().prefetch(keys)
    }
}

impl<K: Key, V: Data> CachedTable<K, V> {
    /// Loads the values of those of `keys` the cache does not hold, with one batched read
    /// of the store.
    ///
    /// Only a table the records read: one read at most half as many times as the previous
    /// batch had records (a table only written, or read for a few records) loads nothing,
    /// so no value is read that no record asks for. At most the room left under the
    /// cache's capacity is loaded (after an eviction, if one is due), so the cache keeps
    /// its memory bound; a cache of fewer than 10 entries loads nothing.
    pub(crate) fn prefetch(&mut self, keys: &[K]) -> Result<()> {
        let read_enough = self.reads * 2 >= self.last_batch;
        self.reads = 0;
        self.last_batch = keys.len();
        if !read_enough || self.capacity < 10 {
            return Ok(());
        }
        let mut missing: Vec<(Vec<u8>, &K)> = Vec::new();
        for k in keys {
            if !self.map.contains_key(k) {
                missing.push((self.store_key(k)?, k));
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        // RocksDB's MultiGet wants its keys sorted; a key twice is read once.
        missing.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        missing.dedup_by(|a, b| a.0 == b.0);
        if self.map.len() + missing.len() >= super::eviction_start(self.capacity) {
            self.make_room()?;
        }
        missing.truncate(self.capacity.saturating_sub(self.map.len()));
        if missing.is_empty() {
            return Ok(());
        }
        // In chunks: the store keeps a chunk's values pinned until it is decoded (RocksDB
        // batches its MultiGet by 32 keys anyway).
        for chunk in missing.chunks(READ_CHUNK) {
            let store_keys: Vec<&[u8]> = chunk.iter().map(|(s, _)| s.as_slice()).collect();
            let (map, name) = (&mut self.map, &self.name);
            self.store.multi_get(&store_keys, &mut |i, bytes| {
                let value = match bytes {
                    Some(bytes) => Some(super::decode_stored::<V>(name, bytes)?),
                    None => None,
                };
                map.insert(
                    chunk[i].1.clone(),
                    Slot {
                        value,
                        dirty: false,
                        used: false,
                    },
                );
                Ok(())
            })?;
        }
        if self.entry_bytes == 0 && self.map.len() >= self.sample_at {
            self.estimate_entry_bytes()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::KvStore;
    use crate::state::test_store::Store;
    use std::rc::Rc;

    /// A store holding `value(k)` for keys `0..n` of table "t", and an empty table over it.
    fn stored(n: u32, capacity: usize) -> (Rc<Store>, CachedTable<u32, u64>) {
        let store = Rc::new(Store::with_capacity(capacity.max(n as usize + 1)));
        let mut writer = CachedTable::<u32, u64>::new("t", store.clone() as Rc<dyn KvStore>);
        for k in 0..n {
            writer.put(&k, Some(u64::from(k) * 7)).unwrap();
        }
        writer.flush().unwrap();
        let store = Rc::new(Store {
            data: std::cell::RefCell::new(store.data.borrow().clone()),
            ..Store::with_capacity(capacity)
        });
        let t = CachedTable::new("t", store.clone() as Rc<dyn KvStore>);
        (store, t)
    }

    #[test]
    fn a_batch_is_loaded_with_one_read_and_reads_what_point_reads_would() {
        let (store, mut t) = stored(100, 1000);
        // Keys in no order, twice, and some the store does not have.
        let keys: Vec<u32> = (0..120).rev().chain(0..50).collect();
        t.prefetch(&keys).unwrap();
        assert_eq!(store.multi_gets.get(), 120_usize.div_ceil(READ_CHUNK));
        assert_eq!(store.multi_got.get(), 120, "each key read once");
        for k in 0..120u32 {
            let want = (k < 100).then(|| u64::from(k) * 7);
            assert_eq!(t.get(&k).unwrap(), want, "key {k}");
        }
        assert_eq!(store.gets.get(), 0, "every record found its key cached");
    }

    #[test]
    fn a_cached_value_is_not_read_again_and_a_change_is_kept() {
        let (store, mut t) = stored(10, 1000);
        t.put(&3, Some(1)).unwrap();
        t.prefetch(&[3, 4]).unwrap();
        assert_eq!(store.multi_got.get(), 1, "only key 4 was read");
        assert_eq!(t.get(&3).unwrap(), Some(1), "the cached change stays");
        assert_eq!(t.get(&4).unwrap(), Some(28));
    }

    #[test]
    fn a_table_the_records_do_not_read_loads_nothing() {
        let (store, mut t) = stored(100, 1000);
        let batch: Vec<u32> = (0..100).collect();
        t.prefetch(&batch).unwrap();
        let loads = store.multi_gets.get();
        assert_eq!(store.multi_got.get(), 100, "the first batch is loaded");
        // The records of that batch only wrote: the next batch is not loaded.
        for k in 0..100 {
            t.put(&k, Some(0)).unwrap();
        }
        let next: Vec<u32> = (100..200).collect();
        t.prefetch(&next).unwrap();
        assert_eq!(store.multi_gets.get(), loads);
        // Read again for most records: loaded again.
        for k in 100..160 {
            t.get(&k).unwrap();
        }
        let third: Vec<u32> = (200..300).collect();
        t.prefetch(&third).unwrap();
        assert_eq!(store.multi_got.get(), 200);
    }

    #[test]
    fn a_batch_larger_than_the_cache_loads_only_what_fits() {
        let (store, mut t) = stored(1000, 50);
        let batch: Vec<u32> = (0..1000).collect();
        t.prefetch(&batch).unwrap();
        assert!(t.map.len() <= 50, "{} entries cached", t.map.len());
        assert_eq!(store.multi_got.get(), 50);
        for k in (0..1000).step_by(37) {
            assert_eq!(t.get(&k).unwrap(), Some(u64::from(k) * 7), "key {k}");
            assert!(t.map.len() <= 50);
        }
        // A tiny cache loads nothing ahead.
        let (store, mut t) = stored(100, 4);
        t.prefetch(&[1, 2, 3]).unwrap();
        assert_eq!(store.multi_gets.get(), 0);
    }

    /// Keys loaded ahead with no value yet say nothing about the size of the values the
    /// records then write: the cache sizes itself from entries with a value only (an
    /// estimate from valueless keys made the cache, sized in bytes, far too long).
    #[test]
    fn keys_without_values_do_not_size_the_cache() {
        let store = Rc::new(Store::with_capacity(100_000));
        let mut t = CachedTable::<u32, Vec<u8>>::new("t", store.clone() as Rc<dyn KvStore>);
        let first: Vec<u32> = (0..2000).collect();
        t.prefetch(&first).unwrap();
        assert_eq!(t.map.len(), 2000);
        assert_eq!(t.entry_bytes, 0, "no estimate from keys without values");
        for k in &first {
            t.get(k).unwrap();
            t.put(k, Some(vec![1; 4000])).unwrap();
        }
        let next: Vec<u32> = (2000..4000).collect();
        t.prefetch(&next).unwrap();
        assert!(
            t.entry_bytes > 8000,
            "an entry of 4,000 bytes (and its encoded copy) counts {} bytes",
            t.entry_bytes
        );
    }
}
