//! Keyed state: the handles user functions hold ([`ValueState`], [`ListState`],
//! [`MapState`]), the current-key context they are scoped by, and the backend trait
//! ([`KeyedStateBackend`]) that stores them.
//!
//! A handle is created once (in `open`) and then always reads and writes the entry of the
//! key currently being processed; the operator sets that key before each call. Handles are
//! type-erased so user code never names the backend: switching a job from the in-memory
//! backend to another backend does not change user code.
//!
//! This module must not do I/O; persistent backends live in `weir-state`.

mod cached;
mod handles;
mod heap;
mod iter;
mod key_encoding;
mod operator_tables;
mod prefix;
mod store_list;
mod store_map;
#[cfg(test)]
pub(crate) mod test_store;
mod timers;
#[cfg(test)]
mod timers_tests;
mod ttl;

pub(crate) use timers::StoreTimers;

pub(crate) use ttl::now_ms;
use ttl::{Ttl, TtlList, TtlMap, ttl_ms};

pub use cached::{CachedTable, Changes, WRITE_CHUNK_BYTES, store_key};
pub use handles::{
    ListAccess, ListState, MapAccess, MapState, ReducingState, ValueAccess, ValueState,
};
pub use iter::{ITER_BATCH, ListIter, MapIter};
pub use key_encoding::KeyEncoding;
pub use store_list::StoreListTable;
pub use store_map::StoreMapTable;

pub use heap::{
    HeapListTable, HeapMapTable, HeapValueTable, SIZE_SAMPLE, decode_key_groups,
    encode_by_key_group, live_bytes,
};

use crate::checkpoint::{Checkpointed, KeyGroupBlobs, OperatorSnapshot};
use crate::data::{Data, Key};
use crate::error::{Error, Result};
use crate::ids::CheckpointId;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

struct BackendHooks(SharedBackend);

impl Checkpointed for BackendHooks {
    fn snapshot(&mut self, id: CheckpointId) -> Result<OperatorSnapshot> {
        let s = self.0.borrow().snapshot(id)?;
        Ok(OperatorSnapshot {
            keyed: s.keyed,
            operator: None,
            description: None,
            files: s.files,
            deferred: s.deferred.into_iter().collect(),
            watermark: None,
            stored: None,
        })
    }
    fn state_bytes(&self) -> Option<u64> {
        self.0.borrow().live_bytes()
    }
}

/// The key the operator is processing right now, shared with its state handles.
pub struct KeyContext<K> {
    current: RefCell<Option<K>>,
}

impl<K: Key> KeyContext<K> {
    /// A context with no current key.
    pub fn new() -> Rc<Self> {
        Rc::new(KeyContext {
            current: RefCell::new(None),
        })
    }
    /// Makes `key` the current key.
    pub fn set(&self, key: K) {
        *self.current.borrow_mut() = Some(key);
    }
    /// Leaves no key current (while a broadcast function handles a broadcast record).
    pub(crate) fn clear(&self) {
        *self.current.borrow_mut() = None;
    }
    /// Runs `f` with the current key.
    ///
    /// # Panics
    /// When no key is set: state was used outside of keyed processing (a bug in the
    /// operator, or keyed state used in a broadcast function's
    /// `process_broadcast_element`, which has no current key).
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&K) -> R) -> R {
        let k = self.current.borrow();
        f(k.as_ref().expect(
            "keyed state used outside keyed processing: there is no current key (keyed state \
             cannot be used in process_broadcast_element)",
        ))
    }
    /// A clone of the current key.
    pub fn get(&self) -> Option<K> {
        self.current.borrow().clone()
    }
}

/// What a state backend knows about a registered table, independent of its types.
pub trait StateTableInfo {
    /// Number of entries (keys with a value) in the table.
    fn entries(&self) -> usize;
    /// Encodes the table's entries, grouped by the key group of their key.
    fn snapshot(&self, max_parallelism: usize) -> Result<KeyGroupBlobs>;
    /// Loads entries produced by [`StateTableInfo::snapshot`] (of any subtask).
    fn restore(&self, blobs: &KeyGroupBlobs) -> Result<()>;
    /// True when the table lives in the backend's persistent store (its snapshot is the
    /// store's files, not [`StateTableInfo::snapshot`]).
    fn is_persistent(&self) -> bool {
        false
    }
    /// Hands over the changes cached since the last write-back (persistent tables only):
    /// the backend writes them into its store as part of a snapshot.
    fn take_changes(&self) -> Result<Option<Changes>> {
        Ok(None)
    }
    /// The encoded size of the table's live entries (keys and values, weir's codec):
    /// exact for a table of up to [`heap::SIZE_SAMPLE`] entries, otherwise the entry count
    /// times the mean size of that many entries. `None` when the table does not know
    /// (persistent tables: their store reports for them).
    fn live_bytes(&self) -> Option<u64> {
        None
    }
}

/// A keyed state backend: the store that holds an operator's keyed state tables.
///
/// The in-memory backend (`weir_state::MemoryBackend`) keeps typed tables on the heap.
/// Backends are chosen per job; operators only ever see the handles.
pub trait KeyedStateBackend {
    /// The backend's name as users configure it (`"memory"`, ...).
    fn name(&self) -> &'static str;
    /// Registers a table under `name`; a name may be registered only once per operator.
    fn register(&mut self, name: &str, table: Rc<dyn StateTableInfo>) -> Result<()>;
    /// Total entries over all tables (a state-size metric).
    fn entries(&self) -> usize;
    /// Snapshots every table: heap tables as entries per key group, persistent tables
    /// as the store's files.
    fn snapshot(&self, id: CheckpointId) -> Result<BackendSnapshot>;
    /// The persistent store behind this backend, if any: value, list and map states are
    /// then kept there behind a write-back cache.
    fn store(&self) -> Option<Rc<dyn KvStore>> {
        None
    }
    /// An estimate of the live state's size in bytes (see
    /// [`StateTableInfo::live_bytes`]); `None` when the backend cannot tell.
    fn live_bytes(&self) -> Option<u64> {
        None
    }
}

/// What a backend snapshot produced.
#[derive(Debug, Default)]
pub struct BackendSnapshot {
    /// Heap tables: name → entries per key group.
    pub keyed: BTreeMap<String, KeyGroupBlobs>,
    /// Files of the persistent store.
    pub files: Vec<crate::checkpoint::LocalFile>,
    /// Files of the persistent store still being written in the background.
    pub deferred: Option<crate::checkpoint::DeferredFiles>,
}

/// A persistent, ordered byte store (RocksDB) under the state backend.
pub trait KvStore {
    /// The value under `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;
    /// Reads the values under `keys` (sorted, each once) and hands each to `each` with
    /// its index in `keys`, in order: one batched read where the store has one (RocksDB's
    /// MultiGet), a [`get`](KvStore::get) per key otherwise. The value is borrowed from
    /// the store's block cache where it can be, not copied.
    fn multi_get(&self, keys: &[&[u8]], each: &mut EachValue<'_>) -> Result<()> {
        for (i, k) in keys.iter().enumerate() {
            each(i, self.get(k)?.as_deref())?;
        }
        Ok(())
    }
    /// Applies a table's changes (puts and deletes) atomically; [`Changes::sorted`] gives
    /// them in key order.
    fn write(&self, changes: &Changes) -> Result<()>;
    /// Up to `limit` entries with keys in `[start, end)`, in key order.
    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>>;
    /// Number of key groups (keys are prefixed by their key group).
    fn max_parallelism(&self) -> usize;
    /// Entries each table keeps in its write-back cache.
    fn cache_capacity(&self) -> usize;
    /// Entries a table whose entries take about `entry_bytes` of memory each keeps in
    /// its write-back cache (`0`: not known yet); by default [`cache_capacity`]. A store
    /// that sizes the caches in bytes divides their share by it.
    ///
    /// [`cache_capacity`]: KvStore::cache_capacity
    fn cache_capacity_for(&self, entry_bytes: usize) -> usize {
        let _ = entry_bytes;
        self.cache_capacity()
    }
    /// Waits until a snapshot's writes still running in the background have reached the
    /// store (and fails if they failed). Caches call this before they evict entries, whose
    /// values may not be in the store until then.
    fn settle(&self) -> Result<()> {
        Ok(())
    }
    /// True while a snapshot's writes are still running in the background, that is while
    /// [`settle`](KvStore::settle) would wait. Caches put an eviction off meanwhile (within
    /// their capacity) rather than stop the task until the snapshot is written.
    fn settling(&self) -> bool {
        false
    }
    /// How the store encodes state keys; a store keeps one for its whole life (one
    /// restored from an older checkpoint keeps that checkpoint's).
    fn key_encoding(&self) -> KeyEncoding {
        KeyEncoding::Ordered
    }
}

type SharedBackend = Rc<RefCell<Box<dyn KeyedStateBackend>>>;

/// What [`KvStore::multi_get`] hands each value to: its index among the keys, and the
/// value (`None`: no value under that key).
pub type EachValue<'a> = dyn FnMut(usize, Option<&[u8]>) -> Result<()> + 'a;

/// A cached table shared by an operator and its backend.
pub(crate) type SharedTable<SK, V> = Rc<RefCell<CachedTable<SK, V>>>;

/// Creates state handles for one keyed operator instance.
pub struct StateContext<K> {
    key: Rc<KeyContext<K>>,
    backend: SharedBackend,
    /// The value tables in the store, which load a batch's keys ahead of it.
    prefetch: Vec<Rc<dyn cached::Prefetch<K>>>,
}

impl<K: Key> StateContext<K> {
    /// A context over `backend`, scoped by `key`.
    pub fn new(key: Rc<KeyContext<K>>, backend: Box<dyn KeyedStateBackend>) -> Self {
        StateContext {
            key,
            backend: Rc::new(RefCell::new(backend)),
            prefetch: Vec::new(),
        }
    }

    /// The shared current-key context.
    pub fn key_context(&self) -> &Rc<KeyContext<K>> {
        &self.key
    }

    /// True when the operator has value tables in a store (the RocksDB backend), which
    /// [`StateContext::prefetch`] loads ahead of a batch.
    pub fn prefetches(&self) -> bool {
        !self.prefetch.is_empty()
    }

    /// Loads the values the keys of a batch of records (`keys`, the batch's in order)
    /// have in the operator's value tables and that their caches do not hold, with one
    /// batched read per table, before the records are processed one by one. Tables
    /// the records do not read, and the heap backend, load nothing.
    pub fn prefetch(&self, keys: &[K]) -> Result<()> {
        for t in &self.prefetch {
            t.prefetch(keys)?;
        }
        Ok(())
    }

    /// Total entries over all of the operator's state tables.
    pub fn entries(&self) -> usize {
        self.backend.borrow().entries()
    }

    /// The checkpoint hooks that snapshot this operator's keyed state.
    pub fn hooks(&self) -> Rc<RefCell<dyn Checkpointed>> {
        Rc::new(RefCell::new(BackendHooks(self.backend.clone())))
    }

    /// Registers an operator-specific table (windows keep their own layout).
    pub fn register_table(&mut self, name: &str, table: Rc<dyn StateTableInfo>) -> Result<()> {
        self.backend.borrow_mut().register(name, table)
    }

    /// Creates a raw heap table keyed by an arbitrary state key (used by windows and joins,
    /// whose state is keyed by key and window).
    pub fn heap_value_table<SK: Key, V: Data>(
        &mut self,
        name: &str,
    ) -> Result<Rc<RefCell<HeapValueTable<SK, V>>>> {
        let t = Rc::new(RefCell::new(HeapValueTable::default()));
        self.backend
            .borrow_mut()
            .register(name, Rc::new(heap::Info(t.clone())))?;
        Ok(t)
    }

    fn store(&self) -> Option<Rc<dyn KvStore>> {
        self.backend.borrow().store()
    }

    fn cached_table<V: Data>(
        &mut self,
        name: &str,
        store: Rc<dyn KvStore>,
    ) -> Result<Rc<RefCell<CachedTable<K, V>>>> {
        let t = Rc::new(RefCell::new(CachedTable::new(name, store)));
        self.backend
            .borrow_mut()
            .register(name, Rc::new(cached::Info(t.clone())))?;
        self.prefetch.push(t.clone());
        Ok(t)
    }

    /// Creates a value state whose entries expire `ttl` after they were last written
    /// (processing time): an expired value reads as absent. Expired entries keep their
    /// space until the key is written or cleared again (no background cleanup yet).
    /// The write time is stored with the value, so it survives checkpoints and restores.
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
    /// let key = KeyContext::<u32>::new();
    /// let mut ctx = StateContext::new(key.clone(), Box::new(NoBackend));
    /// let mut seen = ctx.value_state_with_ttl::<bool>("seen", std::time::Duration::ZERO).unwrap();
    /// key.set(1);
    /// seen.set(true).unwrap();
    /// assert_eq!(seen.get().unwrap(), None); // a zero TTL expires at once
    /// ```
    pub fn value_state_with_ttl<V: Data>(
        &mut self,
        name: &str,
        ttl: std::time::Duration,
    ) -> Result<ValueState<V>> {
        let inner = self.value_state::<(V, i64)>(name)?;
        Ok(ValueState {
            inner: Box::new(Ttl {
                inner,
                ttl_ms: ttl_ms(ttl),
            }),
        })
    }

    /// Creates a list state whose elements expire `ttl` after each was added (processing
    /// time): expired elements are left out of [`ListState::get`]. They keep their space
    /// until the key's list is replaced ([`ListState::update`]) or cleared.
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
    /// let key = KeyContext::<u32>::new();
    /// let mut ctx = StateContext::new(key.clone(), Box::new(NoBackend));
    /// let hour = std::time::Duration::from_secs(3600);
    /// let mut recent = ctx.list_state_with_ttl::<u32>("recent", hour).unwrap();
    /// key.set(1);
    /// recent.add(7).unwrap();
    /// recent.add(8).unwrap();
    /// assert_eq!(recent.get().unwrap(), vec![7, 8]); // both younger than an hour
    /// ```
    pub fn list_state_with_ttl<V: Data>(
        &mut self,
        name: &str,
        ttl: std::time::Duration,
    ) -> Result<ListState<V>> {
        let inner = self.list_state::<(V, i64)>(name)?;
        Ok(ListState {
            inner: Box::new(TtlList {
                inner,
                ttl_ms: ttl_ms(ttl),
            }),
        })
    }

    /// Creates a map state whose entries expire `ttl` after they were last put
    /// (processing time): an expired entry reads as absent in [`MapState::get`],
    /// [`MapState::remove`] and [`MapState::entries`]. It keeps its space until its user
    /// key is put or removed, or the key's map is cleared.
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
    /// let key = KeyContext::<u32>::new();
    /// let mut ctx = StateContext::new(key.clone(), Box::new(NoBackend));
    /// let mut sessions = ctx
    ///     .map_state_with_ttl::<String, u64>("sessions", std::time::Duration::ZERO)
    ///     .unwrap();
    /// key.set(1);
    /// sessions.put("a".into(), 1).unwrap();
    /// assert_eq!(sessions.get(&"a".into()).unwrap(), None); // a zero TTL expires at once
    /// assert!(sessions.entries().unwrap().is_empty());
    /// ```
    pub fn map_state_with_ttl<UK: Key, UV: Data>(
        &mut self,
        name: &str,
        ttl: std::time::Duration,
    ) -> Result<MapState<UK, UV>> {
        let inner = self.map_state::<UK, (UV, i64)>(name)?;
        Ok(MapState {
            inner: Box::new(TtlMap {
                inner,
                ttl_ms: ttl_ms(ttl),
            }),
        })
    }

    /// Creates a reducing state: one value per key, into which [`ReducingState::add`]
    /// folds each new value with `reduce` (a running sum, a maximum, ...).
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
    /// let key = KeyContext::<String>::new();
    /// let mut ctx = StateContext::new(key.clone(), Box::new(NoBackend));
    /// let mut max = ctx.reducing_state::<i64>("max", |a, b| a.max(b)).unwrap();
    /// key.set("alice".into());
    /// max.add(3).unwrap();
    /// max.add(9).unwrap();
    /// max.add(5).unwrap();
    /// assert_eq!(max.get().unwrap(), Some(9));
    /// key.set("bob".into());
    /// assert_eq!(max.get().unwrap(), None);
    /// ```
    pub fn reducing_state<V: Data>(
        &mut self,
        name: &str,
        reduce: impl Fn(V, V) -> V + 'static,
    ) -> Result<ReducingState<V>> {
        Ok(ReducingState {
            value: self.value_state(name)?,
            reduce: Box::new(reduce),
        })
    }

    /// Creates a reducing state whose value expires `ttl` after it was last written
    /// (every [`ReducingState::add`] writes it): once expired, the next `add` starts
    /// afresh from the added value.
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
    /// let key = KeyContext::<u32>::new();
    /// let mut ctx = StateContext::new(key.clone(), Box::new(NoBackend));
    /// let mut sum = ctx
    ///     .reducing_state_with_ttl::<i64>("sum", |a, b| a + b, std::time::Duration::ZERO)
    ///     .unwrap();
    /// key.set(1);
    /// sum.add(2).unwrap();
    /// assert_eq!(sum.get().unwrap(), None); // expired at once: nothing to fold into
    /// ```
    pub fn reducing_state_with_ttl<V: Data>(
        &mut self,
        name: &str,
        reduce: impl Fn(V, V) -> V + 'static,
        ttl: std::time::Duration,
    ) -> Result<ReducingState<V>> {
        Ok(ReducingState {
            value: self.value_state_with_ttl(name, ttl)?,
            reduce: Box::new(reduce),
        })
    }

    /// Creates a value state: one value per key.
    pub fn value_state<V: Data>(&mut self, name: &str) -> Result<ValueState<V>> {
        if let Some(store) = self.store() {
            let table = self.cached_table::<V>(name, store)?;
            return Ok(ValueState {
                inner: Box::new(cached::CachedValue {
                    key: self.key.clone(),
                    table,
                }),
            });
        }
        let table = self.heap_value_table::<K, V>(name)?;
        Ok(ValueState {
            inner: Box::new(heap::HeapValue {
                key: self.key.clone(),
                table,
            }),
        })
    }

    /// Creates a list state: a list of values per key.
    ///
    /// With the RocksDB backend each element is its own RocksDB entry: [`ListState::add`]
    /// does not read the list, and [`ListState::iter`] reads it in batches.
    pub fn list_state<V: Data>(&mut self, name: &str) -> Result<ListState<V>> {
        if let Some(store) = self.store() {
            let table = Rc::new(RefCell::new(StoreListTable::<K, V>::new(name, store)));
            self.backend
                .borrow_mut()
                .register(name, Rc::new(store_list::Info(table.clone())))?;
            return Ok(ListState {
                inner: Box::new(store_list::StoreList {
                    key: self.key.clone(),
                    table,
                }),
            });
        }
        let t = Rc::new(RefCell::new(HeapListTable::default()));
        self.backend
            .borrow_mut()
            .register(name, Rc::new(heap::Info(t.clone())))?;
        Ok(ListState {
            inner: Box::new(heap::HeapList {
                key: self.key.clone(),
                table: t,
            }),
        })
    }

    /// Creates a map state: a map per key.
    ///
    /// With the RocksDB backend each entry is its own RocksDB entry, under (key group,
    /// key, user key): [`MapState::get`], [`MapState::put`] and [`MapState::remove`] touch
    /// that entry only, and [`MapState::iter`] reads the map in batches.
    pub fn map_state<UK: Key, UV: Data>(&mut self, name: &str) -> Result<MapState<UK, UV>> {
        if let Some(store) = self.store() {
            let table = Rc::new(RefCell::new(StoreMapTable::<K, UK, UV>::new(name, store)));
            self.backend
                .borrow_mut()
                .register(name, Rc::new(store_map::Info(table.clone())))?;
            return Ok(MapState {
                inner: Box::new(store_map::StoreMap {
                    key: self.key.clone(),
                    table,
                }),
            });
        }
        let t = Rc::new(RefCell::new(HeapMapTable::default()));
        self.backend
            .borrow_mut()
            .register(name, Rc::new(heap::Info(t.clone())))?;
        Ok(MapState {
            inner: Box::new(heap::HeapMap {
                key: self.key.clone(),
                table: t,
            }),
        })
    }
}

/// Turns a failure to decode restored state `name` into the error a user can act on: a
/// [`Error::Config`] naming the state, since the checkpoint wrote it with another type and
/// restoring it again (or an older checkpoint of the same job) would fail the same way.
/// Other errors pass unchanged.
///
/// ```
/// use weir_core::{Error, state::state_type_changed};
/// let e = state_type_changed("count", Error::Codec("unexpected end of input".into()));
/// assert!(e.is_deterministic());
/// assert!(e.to_string().contains("state 'count' does not decode as the type the job declares"));
/// let io = state_type_changed("count", Error::User("disk full".into()));
/// assert!(!io.is_deterministic());
/// ```
pub fn state_type_changed(name: &str, e: Error) -> Error {
    match e {
        Error::Codec(why) => Error::Config(format!(
            "the checkpoint's state '{name}' does not decode as the type the job declares for \
             it ({why}): it was written with another type. State keeps its type across \
             restores: restore with the job version that wrote it, or give the state of the \
             new type another name (the old state is then kept in checkpoints, unused)"
        )),
        other => other,
    }
}

/// The error for a state name registered twice in one operator.
pub fn duplicate_state_name(name: &str) -> Error {
    Error::Config(format!(
        "state '{name}' is registered twice in the same operator; give each state a unique name"
    ))
}
