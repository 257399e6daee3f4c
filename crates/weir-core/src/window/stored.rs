//! Where the window operator keeps its state: the tables of window contents and timers,
//! on the heap (memory backend) or in the backend's store (RocksDB).
//!
//! In the store, fixed (non-merging) windows keep one pane per (key, window), under the
//! key group of the key, with its own timers at the window's end and at its cleanup time
//! (Flink's layout); session windows keep each key's open sessions as one value and their
//! timers in the store too. Both are read through the write-back cache, so only changed
//! panes reach each checkpoint's new files.
//!
//! This module owns the tables and their snapshots, not the firing rules (the operator).

use super::TimeWindow;
use crate::checkpoint::KeyGroupBlobs;
use crate::data::{Data, Key, key_group};
use crate::error::Result;
use crate::state::{
    CachedTable, Changes, HeapValueTable, SharedTable, StateContext, StateTableInfo,
    decode_key_groups, encode_by_key_group,
};
use crate::time::Timestamp;
use crate::timer::TimerService;
use std::cell::RefCell;
use std::rc::Rc;

/// The table of window timers (sessions on the heap; every window in the store).
pub(super) const TIMERS: &str = "window-timers";
/// Time-domain byte of window timers in the store (event time).
const EVENT: u8 = 0;

/// Window timers: (time, key, window).
pub(super) type WindowTimers<K> = Rc<RefCell<TimerService<K, TimeWindow>>>;

/// The panes of fixed windows in the store: (key, window) → (fired, accumulator).
pub(super) type PaneTable<K, A> = Rc<RefCell<CachedTable<(K, TimeWindow), (bool, A)>>>;

/// A pane's key group is its key's: a rescale keeps a key's windows with the key.
fn pane_group<K: Key>(pane: &(K, TimeWindow), max_parallelism: usize) -> u32 {
    key_group(&pane.0, max_parallelism).0
}

/// Creates the window timers and, if the operator `uses` them, registers their table.
pub(super) fn timers<K: Key>(state: &mut StateContext<K>, uses: bool) -> Result<WindowTimers<K>> {
    // A window registers its timers once, when its pane or session is created, and
    // deletes only timers it registered: no existence check (a point read) is needed.
    let timers = Rc::new(RefCell::new(state.timer_service(TIMERS, EVENT, false)?));
    if uses {
        state.register_table(TIMERS, Rc::new(TimersTable(timers.clone())))?;
    }
    Ok(timers)
}

/// Creates the pane table in the store, or `None` on the heap.
pub(super) fn panes<K: Key, A: Data>(
    state: &mut StateContext<K>,
) -> Result<Option<PaneTable<K, A>>> {
    state.store_table("window-panes", pane_group::<K>)
}

/// A key's open sessions, in window order.
type Sessions<A> = Vec<(TimeWindow, A)>;

/// The open sessions of each key, on the heap or in the store.
#[derive(Clone)]
pub(super) enum SessionTable<K, A> {
    Heap(Rc<RefCell<HeapValueTable<K, Sessions<A>>>>),
    Store(SharedTable<K, Sessions<A>>),
}

impl<K: Key, A: Data> SessionTable<K, A> {
    /// Creates the table (`window-sessions`) where the backend keeps state.
    pub(super) fn new(state: &mut StateContext<K>) -> Result<Self> {
        const NAME: &str = "window-sessions";
        Ok(
            match state.store_table(NAME, |k: &K, p| key_group(k, p).0)? {
                Some(t) => SessionTable::Store(t),
                None => SessionTable::Heap(state.heap_value_table(NAME)?),
            },
        )
    }

    /// Takes `key`'s sessions out of the table (empty if none).
    pub(super) fn take(&self, key: &K) -> Result<Sessions<A>> {
        match self {
            SessionTable::Heap(t) => Ok(t.borrow_mut().map.remove(key).unwrap_or_default()),
            SessionTable::Store(t) => {
                let mut t = t.borrow_mut();
                let sessions = t.get(key)?.unwrap_or_default();
                if !sessions.is_empty() {
                    t.put(key, None)?;
                }
                Ok(sessions)
            }
        }
    }

    /// Puts `key`'s sessions back (none: the key has no open session).
    pub(super) fn put(&self, key: K, sessions: Sessions<A>) -> Result<()> {
        match self {
            SessionTable::Heap(t) => {
                if !sessions.is_empty() {
                    t.borrow_mut().map.insert(key, sessions);
                }
                Ok(())
            }
            SessionTable::Store(t) => {
                let v = (!sessions.is_empty()).then_some(sessions);
                t.borrow_mut().put(&key, v)
            }
        }
    }
}

/// The window timers as a state table: on the heap (time, window) per key of each key
/// group; in the store, their pending changes.
struct TimersTable<K>(WindowTimers<K>);

impl<K: Key> StateTableInfo for TimersTable<K> {
    fn entries(&self) -> usize {
        self.0.borrow().in_memory()
    }
    fn snapshot(&self, max_parallelism: usize) -> Result<KeyGroupBlobs> {
        let q = self.0.borrow();
        let Some(heap) = q.as_heap() else {
            return Ok(Vec::new());
        };
        let entries = heap.entries();
        encode_by_key_group(
            max_parallelism,
            entries.iter().map(|(ts, k, w)| (k, (*ts, *w))),
        )
    }
    fn restore(&self, blobs: &KeyGroupBlobs) -> Result<()> {
        let mut q = self.0.borrow_mut();
        for (k, (ts, w)) in decode_key_groups::<K, (Timestamp, TimeWindow)>(blobs)? {
            q.register(ts, k, w);
        }
        Ok(())
    }
    fn is_persistent(&self) -> bool {
        self.0.borrow_mut().as_store().is_some()
    }
    fn take_changes(&self) -> Result<Option<Changes>> {
        let mut q = self.0.borrow_mut();
        let Some(store) = q.as_store() else {
            return Ok(None);
        };
        let mut changes = store.changes();
        store.take_changes_into(&mut changes, None)?;
        Ok(Some(changes))
    }
}

/// Loads the fixed windows of a memory-backend checkpoint (`window-contents`: per key,
/// max timestamp, start, fired, accumulator) into panes and timers in the store, so a job
/// that switches to RocksDB keeps its open windows. Its own snapshots are the store's.
pub(super) struct HeapPanes<K: Key, A: Data> {
    pub(super) panes: PaneTable<K, A>,
    pub(super) timers: WindowTimers<K>,
    pub(super) lateness: Timestamp,
}

impl<K: Key, A: Data> StateTableInfo for HeapPanes<K, A> {
    fn entries(&self) -> usize {
        0
    }
    fn snapshot(&self, _max_parallelism: usize) -> Result<KeyGroupBlobs> {
        Ok(Vec::new())
    }
    fn restore(&self, blobs: &KeyGroupBlobs) -> Result<()> {
        let mut panes = self.panes.borrow_mut();
        let mut timers = self.timers.borrow_mut();
        type Entry<A> = (Timestamp, Timestamp, bool, A);
        for (k, (max_ts, start, fired, acc)) in decode_key_groups::<K, Entry<A>>(blobs)? {
            let w = TimeWindow::new(start, max_ts.saturating_add(1));
            if !fired {
                timers.register(max_ts, k.clone(), w);
            }
            if self.lateness > 0 {
                timers.register(max_ts.saturating_add(self.lateness), k.clone(), w);
            }
            panes.put(&(k, w), Some((fired, acc)))?;
        }
        Ok(())
    }
    fn is_persistent(&self) -> bool {
        true
    }
}
