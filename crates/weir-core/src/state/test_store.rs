//! An in-memory ordered [`KvStore`] for the unit tests of the cached tables.

use super::{Changes, KvStore};
use crate::error::Result;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

/// An in-memory ordered store that counts its reads.
#[derive(Default)]
pub(super) struct Store {
    pub(super) data: RefCell<BTreeMap<Vec<u8>, Vec<u8>>>,
    /// Point reads so far.
    pub(super) gets: Cell<usize>,
    /// Entries returned by scans so far.
    pub(super) scanned: Cell<usize>,
    pub(super) capacity: usize,
}

impl KvStore for Store {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.gets.set(self.gets.get() + 1);
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
}
