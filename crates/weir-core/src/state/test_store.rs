//! An in-memory ordered [`KvStore`] for the unit tests of the cached tables, the timers
//! in the store and the window operator: what RocksDB does for the state module, without
//! files.

use super::{Changes, KvStore};
use crate::error::Result;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

/// An in-memory ordered store that counts its reads.
#[derive(Default)]
pub(crate) struct Store {
    pub(crate) data: RefCell<BTreeMap<Vec<u8>, Vec<u8>>>,
    /// Point reads so far.
    pub(crate) gets: Cell<usize>,
    /// Batched reads so far, and the keys they asked for.
    pub(crate) multi_gets: Cell<usize>,
    pub(crate) multi_got: Cell<usize>,
    /// Entries returned by scans so far.
    pub(crate) scanned: Cell<usize>,
    /// Writes so far, and the encoded bytes of the largest.
    pub(crate) writes: Cell<usize>,
    pub(crate) largest_write: Cell<usize>,
    pub(crate) capacity: usize,
    /// A snapshot is being written in the background ([`KvStore::settling`]); `settle`
    /// counts its calls and ends it.
    pub(crate) settling: Cell<bool>,
    /// Calls of [`KvStore::settle`] so far.
    pub(crate) settles: Cell<usize>,
}

impl KvStore for Store {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.gets.set(self.gets.get() + 1);
        Ok(self.data.borrow().get(key).cloned())
    }
    fn multi_get(&self, keys: &[&[u8]], each: &mut super::EachValue<'_>) -> Result<()> {
        assert!(keys.is_sorted(), "a batched read takes its keys sorted");
        assert!(keys.windows(2).all(|w| w[0] != w[1]), "and each once");
        self.multi_gets.set(self.multi_gets.get() + 1);
        self.multi_got.set(self.multi_got.get() + keys.len());
        let data = self.data.borrow();
        for (i, k) in keys.iter().enumerate() {
            each(i, data.get(*k).map(Vec::as_slice))?;
        }
        Ok(())
    }
    fn write(&self, changes: &Changes) -> Result<()> {
        self.writes.set(self.writes.get() + 1);
        self.largest_write
            .set(self.largest_write.get().max(changes.byte_len()));
        let mut d = self.data.borrow_mut();
        for (k, v) in changes.sorted() {
            match v {
                Some(v) => d.insert(k.to_vec(), v.to_vec()),
                None => d.remove(k),
            };
        }
        Ok(())
    }
    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let out: Vec<_> = self
            .data
            .borrow()
            .range(start.to_vec()..end.to_vec())
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self.scanned.set(self.scanned.get() + out.len());
        Ok(out)
    }
    fn max_parallelism(&self) -> usize {
        128
    }
    fn cache_capacity(&self) -> usize {
        self.capacity
    }
    fn settle(&self) -> Result<()> {
        self.settles.set(self.settles.get() + 1);
        self.settling.set(false);
        Ok(())
    }
    fn settling(&self) -> bool {
        self.settling.get()
    }
}

impl Store {
    /// A store of 128 key groups whose tables cache `capacity` entries.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Store {
            capacity,
            ..Store::default()
        }
    }

    /// A copy of the entries of key groups `groups`, as a restore takes them.
    pub(crate) fn entries_of(&self, groups: std::ops::Range<u32>) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.data
            .borrow()
            .iter()
            .filter(|(k, _)| groups.contains(&u32::from(u16::from_be_bytes([k[0], k[1]]))))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}
