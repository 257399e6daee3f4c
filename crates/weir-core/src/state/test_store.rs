//! An ordered in-memory [`KvStore`] for tests: what RocksDB does for the state module,
//! without files. Counts the entries its scans return.

use super::{Changes, KvStore};
use crate::error::Result;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

/// An ordered in-memory store.
#[derive(Default)]
pub(crate) struct MemStore {
    pub(crate) data: RefCell<BTreeMap<Vec<u8>, Vec<u8>>>,
    pub(crate) capacity: usize,
    pub(crate) max_parallelism: usize,
    pub(crate) scanned: Cell<usize>,
}

impl MemStore {
    /// A store of `max_parallelism` key groups whose tables cache `capacity` entries.
    pub(crate) fn new(capacity: usize, max_parallelism: usize) -> Self {
        MemStore {
            capacity,
            max_parallelism,
            ..MemStore::default()
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

impl KvStore for MemStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.data.borrow().get(key).cloned())
    }
    fn write(&self, changes: &Changes) -> Result<()> {
        let mut d = self.data.borrow_mut();
        for (k, v) in changes.sorted() {
            match v {
                Some(v) => d.insert(k.to_vec(), v.to_vec()),
                None => d.remove(k),
            };
        }
        Ok(())
    }
    fn max_parallelism(&self) -> usize {
        self.max_parallelism
    }
    fn cache_capacity(&self) -> usize {
        self.capacity
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
}
