//! Timers: an ordered, de-duplicated queue of (time, key, namespace) entries.
//!
//! Sans-IO: the operator registers timers and asks for the ones due at a watermark or a
//! processing time; nothing here reads a clock.

use crate::time::Timestamp;
use rustc_hash::FxHashSet;
use std::collections::BTreeMap;
use std::hash::Hash;

/// Which clock a timer follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimeDomain {
    /// Fires when the watermark reaches the timer's time.
    EventTime,
    /// Fires when the wall clock reaches the timer's time (ms since the Unix epoch).
    ProcessingTime,
}

/// An ordered queue of timers; registering the same (time, key, namespace) twice keeps one.
///
/// ```
/// use weir_core::timer::TimerQueue;
/// let mut q = TimerQueue::<&str, ()>::default();
/// q.register(10, "a", ());
/// q.register(5, "b", ());
/// q.register(10, "a", ()); // duplicate
/// assert_eq!(q.pop_due(9), Some((5, vec![("b", ())])));
/// assert_eq!(q.pop_due(9), None);
/// assert_eq!(q.pop_due(10), Some((10, vec![("a", ())])));
/// ```
pub struct TimerQueue<K, N> {
    by_time: BTreeMap<Timestamp, Vec<(K, N)>>,
    live: FxHashSet<(Timestamp, K, N)>,
    dedup: bool,
    len: usize,
}

impl<K, N> Default for TimerQueue<K, N> {
    fn default() -> Self {
        TimerQueue {
            by_time: BTreeMap::new(),
            live: FxHashSet::default(),
            dedup: true,
            len: 0,
        }
    }
}

impl<K, N> TimerQueue<K, N> {
    /// A queue for callers that never register the same timer twice and never delete
    /// (windows that register a timer only when they create a window's state). It skips
    /// the duplicate check, which saves a hash-set insert and remove per timer.
    pub fn unique() -> Self {
        TimerQueue {
            dedup: false,
            ..Self::default()
        }
    }
}

impl<K: Clone + Eq + Hash, N: Clone + Eq + Hash> TimerQueue<K, N> {
    /// Registers a timer; returns false if it was already registered.
    pub fn register(&mut self, ts: Timestamp, key: K, ns: N) -> bool {
        if self.dedup && !self.live.insert((ts, key.clone(), ns.clone())) {
            return false;
        }
        self.len += 1;
        self.by_time.entry(ts).or_default().push((key, ns));
        true
    }

    /// Deletes a timer; returns false if it was not registered.
    ///
    /// # Panics
    /// On a queue made with [`TimerQueue::unique`], which does not support deletion.
    pub fn delete(&mut self, ts: Timestamp, key: K, ns: N) -> bool {
        assert!(
            self.dedup,
            "timers of a unique timer queue cannot be deleted"
        );
        let removed = self.live.remove(&(ts, key, ns));
        if removed {
            self.len -= 1;
        }
        removed
    }

    /// Removes and returns the earliest group of timers due at `now` (time <= now),
    /// in registration order. Call repeatedly until `None`: firing may register more.
    pub fn pop_due(&mut self, now: Timestamp) -> Option<(Timestamp, Vec<(K, N)>)> {
        loop {
            let (&ts, _) = self.by_time.first_key_value()?;
            if ts > now {
                return None;
            }
            let (ts, entries) = self.by_time.pop_first()?;
            let due: Vec<(K, N)> = if self.dedup {
                entries
                    .into_iter()
                    .filter(|(k, n)| self.live.remove(&(ts, k.clone(), n.clone())))
                    .collect()
            } else {
                entries
            };
            self.len -= due.len();
            if !due.is_empty() {
                return Some((ts, due));
            }
        }
    }

    /// Every live timer, in time order (for snapshots).
    pub fn entries(&self) -> Vec<(Timestamp, K, N)> {
        let mut out = Vec::with_capacity(self.len);
        for (&ts, list) in &self.by_time {
            for (k, n) in list {
                if !self.dedup || self.live.contains(&(ts, k.clone(), n.clone())) {
                    out.push((ts, k.clone(), n.clone()));
                }
            }
        }
        out
    }

    /// The earliest registered time, if any.
    pub fn next_time(&self) -> Option<Timestamp> {
        self.by_time.keys().next().copied()
    }

    /// Number of live timers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no timer is registered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Timers due at one time: the time and the (key, namespace) of each.
pub(crate) type DueTimers<K, N> = (Timestamp, Vec<(K, N)>);

/// A timer queue on the heap ([`TimerQueue`]) or in the RocksDB backend's store, in time
/// order there too (see docs/checkpoints.md, "Timers and windows in RocksDB"). Operators
/// hold this and never ask which.
pub(crate) struct TimerService<K, N> {
    inner: Inner<K, N>,
    /// A store error met where the caller could not be told (registering or deleting from
    /// a function's context); reported by the next [`TimerService::pop_due`].
    error: Option<crate::Error>,
}

enum Inner<K, N> {
    Heap(TimerQueue<K, N>),
    Store(crate::state::StoreTimers<K, N>),
}

impl<K, N> TimerService<K, N> {
    /// A queue on the heap.
    pub(crate) fn heap(q: TimerQueue<K, N>) -> Self {
        TimerService {
            inner: Inner::Heap(q),
            error: None,
        }
    }
}

impl<K: crate::data::Key, N: crate::data::Data + Eq + Hash> TimerService<K, N> {
    /// A queue in the persistent store, under table `name` and time domain `domain`;
    /// `checked`: registering and deleting answer whether the timer existed (a point
    /// read each; see [`TimerQueue::unique`] for callers that need no answer).
    pub(crate) fn in_store(
        name: &str,
        domain: u8,
        store: std::rc::Rc<dyn crate::state::KvStore>,
        checked: bool,
    ) -> crate::Result<Self> {
        Ok(TimerService {
            inner: Inner::Store(crate::state::StoreTimers::open(
                name, domain, store, checked,
            )?),
            error: None,
        })
    }

    /// The heap queue, if the timers live on the heap.
    pub(crate) fn as_heap(&self) -> Option<&TimerQueue<K, N>> {
        match &self.inner {
            Inner::Heap(q) => Some(q),
            Inner::Store(_) => None,
        }
    }

    /// The store queue, if the timers live in the store.
    pub(crate) fn as_store(&mut self) -> Option<&mut crate::state::StoreTimers<K, N>> {
        match &mut self.inner {
            Inner::Heap(_) => None,
            Inner::Store(q) => Some(q),
        }
    }

    fn keep<T>(&mut self, r: crate::Result<T>, or: T) -> T {
        r.unwrap_or_else(|e| {
            self.error.get_or_insert(e);
            or
        })
    }

    /// Registers a timer; false if it was already registered (or the store failed: the
    /// error is reported by the next [`TimerService::pop_due`]).
    pub fn register(&mut self, ts: Timestamp, key: K, ns: N) -> bool {
        match &mut self.inner {
            Inner::Heap(q) => q.register(ts, key, ns),
            Inner::Store(q) => {
                let r = q.register(ts, &key, &ns);
                self.keep(r, false)
            }
        }
    }

    /// Deletes a timer; false if it was not registered.
    pub fn delete(&mut self, ts: Timestamp, key: K, ns: N) -> bool {
        match &mut self.inner {
            Inner::Heap(q) => q.delete(ts, key, ns),
            Inner::Store(q) => {
                let r = q.delete(ts, &key, &ns);
                self.keep(r, false)
            }
        }
    }

    /// Removes and returns due timers (time <= now) of the earliest time: all of them
    /// on the heap, a batch in the store. Call repeatedly until `None`.
    pub fn pop_due(&mut self, now: Timestamp) -> crate::Result<Option<DueTimers<K, N>>> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        match &mut self.inner {
            Inner::Heap(q) => Ok(q.pop_due(now)),
            Inner::Store(q) => q.pop_due(now),
        }
    }

    /// The earliest registered time, if any.
    pub fn next_time(&self) -> Option<Timestamp> {
        match &self.inner {
            Inner::Heap(q) => q.next_time(),
            Inner::Store(q) => q.next_time(),
        }
    }

    /// Number of live timers (in the store: counted once by reading them all, then kept).
    pub fn len(&mut self) -> usize {
        match &mut self.inner {
            Inner::Heap(q) => q.len(),
            Inner::Store(q) => {
                let r = q.len();
                self.keep(r, 0)
            }
        }
    }

    /// Deletes every timer; returns how many there were.
    pub fn clear(&mut self) -> crate::Result<usize> {
        match &mut self.inner {
            Inner::Heap(q) => {
                let n = q.len();
                *q = TimerQueue::default();
                Ok(n)
            }
            Inner::Store(q) => q.clear(),
        }
    }

    /// Timers kept in memory: all of them on the heap, the pending changes in the store.
    pub(crate) fn in_memory(&self) -> usize {
        match &self.inner {
            Inner::Heap(q) => q.len(),
            Inner::Store(q) => q.cached(),
        }
    }
}
