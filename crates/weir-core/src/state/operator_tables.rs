//! The tables operators keep for themselves (timers, window panes and sessions), created
//! where the backend keeps state: in its persistent store (RocksDB) when it has one, on
//! the heap otherwise. Owns the choice, not the tables' layouts (`timers.rs`, windows).

use super::{CachedTable, SharedTable, StateContext, cached};
use crate::data::{Data, Key};
use crate::error::Result;
use std::cell::RefCell;
use std::rc::Rc;

impl<K: Key> StateContext<K> {
    /// True when the backend keeps state in a persistent store (RocksDB): operators then
    /// keep their timers and window contents there too.
    ///
    /// ```
    /// use weir_core::state::{KeyContext, StateContext};
    /// # struct NoBackend;
    /// # impl weir_core::state::KeyedStateBackend for NoBackend {
    /// #   fn name(&self) -> &'static str { "test" }
    /// #   fn register(&mut self, _: &str, _: std::rc::Rc<dyn weir_core::state::StateTableInfo>) -> weir_core::Result<()> { Ok(()) }
    /// #   fn entries(&self) -> usize { 0 }
    /// #   fn snapshot(&self, _: weir_core::ids::CheckpointId) -> weir_core::Result<weir_core::state::BackendSnapshot> { Ok(Default::default()) }
    /// # }
    /// let ctx = StateContext::new(KeyContext::<u32>::new(), Box::new(NoBackend));
    /// assert!(!ctx.is_persistent()); // a backend without a store keeps state on the heap
    /// ```
    pub fn is_persistent(&self) -> bool {
        self.store().is_some()
    }

    /// A timer queue for time domain `domain` (a byte of the key layout) of table `name`:
    /// in the persistent store when the backend has one, on the heap otherwise. The
    /// caller registers the table that snapshots it. `checked`: in the store, registering
    /// and deleting read whether the timer exists (to answer, and to count timers).
    pub(crate) fn timer_service<N: Data + Eq + std::hash::Hash>(
        &self,
        name: &str,
        domain: u8,
        checked: bool,
    ) -> Result<crate::timer::TimerService<K, N>> {
        match self.store() {
            Some(store) => crate::timer::TimerService::in_store(name, domain, store, checked),
            None => Ok(crate::timer::TimerService::heap(
                crate::timer::TimerQueue::default(),
            )),
        }
    }

    /// A write-back cached table in the persistent store, keyed by a state key whose key
    /// group is that of `group_key(state key)` (windows: the key of a (key, window)
    /// pair), or `None` when the backend keeps state on the heap.
    pub(crate) fn store_table<SK: Key, V: Data>(
        &mut self,
        name: &str,
        group_key: fn(&SK, usize) -> u32,
    ) -> Result<Option<SharedTable<SK, V>>> {
        let Some(store) = self.store() else {
            return Ok(None);
        };
        let t = Rc::new(RefCell::new(CachedTable::with_group(
            name, store, group_key,
        )));
        self.backend
            .borrow_mut()
            .register(name, Rc::new(cached::Info(t.clone())))?;
        Ok(Some(t))
    }
}
