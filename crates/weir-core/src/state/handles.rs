//! The handles user functions hold ([`ValueState`], [`ListState`], [`MapState`],
//! [`ReducingState`]) and the access traits each backend implements behind them.

use super::{ListIter, MapIter};
use crate::error::Result;

/// Access to one value per key, as the backend implements it.
pub trait ValueAccess<V> {
    /// The current key's value.
    fn get(&self) -> Result<Option<V>>;
    /// Sets the current key's value.
    fn set(&mut self, value: V) -> Result<()>;
    /// Removes the current key's value.
    fn clear(&mut self) -> Result<()>;
}

/// Access to a list per key, as the backend implements it.
pub trait ListAccess<V> {
    /// The current key's list (empty if none).
    fn get(&self) -> Result<Vec<V>>;
    /// Appends to the current key's list.
    fn add(&mut self, value: V) -> Result<()>;
    /// Replaces the current key's list.
    fn update(&mut self, values: Vec<V>) -> Result<()>;
    /// Removes the current key's list.
    fn clear(&mut self) -> Result<()>;
    /// Up to about `limit` elements of the current key's list from position `from` on,
    /// and the position to read on from (the list's length once everything is read).
    /// Positions are the backend's: a wrapper that leaves elements out (TTL) still
    /// counts them.
    fn read_from(&self, from: usize, limit: usize) -> Result<(Vec<V>, usize)>;
}

/// Access to a map per key, as the backend implements it.
pub trait MapAccess<UK, UV> {
    /// The value under `k` in the current key's map.
    fn get(&self, k: &UK) -> Result<Option<UV>>;
    /// Puts `k -> v` into the current key's map.
    fn put(&mut self, k: UK, v: UV) -> Result<()>;
    /// Removes `k` from the current key's map.
    fn remove(&mut self, k: &UK) -> Result<Option<UV>>;
    /// All entries of the current key's map, sorted by user key.
    fn entries(&self) -> Result<Vec<(UK, UV)>>;
    /// Removes the current key's whole map.
    fn clear(&mut self) -> Result<()>;
    /// Up to about `limit` entries of the current key's map after user key `after` (from
    /// the first when `None`), in the backend's iteration order; empty once there are no
    /// more.
    fn entries_after(&self, after: Option<&UK>, limit: usize) -> Result<Vec<(UK, UV)>>;
}

/// One value per key, scoped to the key being processed.
///
/// ```
/// use weir_core::state::{KeyContext, StateContext, ValueState};
/// # struct NoBackend;
/// # impl weir_core::state::KeyedStateBackend for NoBackend {
/// #   fn name(&self) -> &'static str { "test" }
/// #   fn register(&mut self, _: &str, _: std::rc::Rc<dyn weir_core::state::StateTableInfo>) -> weir_core::Result<()> { Ok(()) }
/// #   fn entries(&self) -> usize { 0 }
/// #   fn snapshot(&self, _: weir_core::ids::CheckpointId) -> weir_core::Result<weir_core::state::BackendSnapshot> { Ok(Default::default()) }
/// # }
/// let key = KeyContext::<String>::new();
/// let mut ctx = StateContext::new(key.clone(), Box::new(NoBackend));
/// let mut sum: ValueState<i64> = ctx.value_state("sum").unwrap();
/// key.set("alice".into());
/// sum.set(sum.get().unwrap().unwrap_or(0) + 5).unwrap();
/// key.set("bob".into());
/// assert_eq!(sum.get().unwrap(), None);
/// key.set("alice".into());
/// assert_eq!(sum.get().unwrap(), Some(5));
/// ```
pub struct ValueState<V> {
    pub(super) inner: Box<dyn ValueAccess<V>>,
}

impl<V> ValueState<V> {
    /// Wraps a backend's implementation.
    pub fn from_access(inner: Box<dyn ValueAccess<V>>) -> Self {
        ValueState { inner }
    }
    /// The current key's value.
    pub fn get(&self) -> Result<Option<V>> {
        self.inner.get()
    }
    /// Sets the current key's value.
    pub fn set(&mut self, value: V) -> Result<()> {
        self.inner.set(value)
    }
    /// Removes the current key's value.
    pub fn clear(&mut self) -> Result<()> {
        self.inner.clear()
    }
    /// Reads, transforms and writes back the current key's value.
    pub fn update(&mut self, f: impl FnOnce(Option<V>) -> V) -> Result<V>
    where
        V: Clone,
    {
        let next = f(self.get()?);
        self.set(next.clone())?;
        Ok(next)
    }
}

/// A list of values per key, scoped to the key being processed.
pub struct ListState<V> {
    pub(super) inner: Box<dyn ListAccess<V>>,
}

impl<V> ListState<V> {
    /// Wraps a backend's implementation.
    pub fn from_access(inner: Box<dyn ListAccess<V>>) -> Self {
        ListState { inner }
    }
    /// The current key's list (empty if none).
    pub fn get(&self) -> Result<Vec<V>> {
        self.inner.get()
    }
    /// Appends to the current key's list.
    pub fn add(&mut self, value: V) -> Result<()> {
        self.inner.add(value)
    }
    /// Replaces the current key's list.
    pub fn update(&mut self, values: Vec<V>) -> Result<()> {
        self.inner.update(values)
    }
    /// Removes the current key's list.
    pub fn clear(&mut self) -> Result<()> {
        self.inner.clear()
    }
    /// The current key's list, element by element, read from the backend in batches of
    /// [`ITER_BATCH`](super::ITER_BATCH): a long list is never loaded at once.
    ///
    /// The iterator reads the list of the key current when each batch is read; do not
    /// change the current key while iterating.
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
    /// let mut seen = ctx.list_state::<u64>("seen").unwrap();
    /// key.set(1);
    /// for v in 0..5_000 {
    ///     seen.add(v).unwrap();
    /// }
    /// let mut sum = 0;
    /// for v in seen.iter() {
    ///     sum += v.unwrap();
    /// }
    /// assert_eq!(sum, 4_999 * 5_000 / 2);
    /// ```
    pub fn iter(&self) -> ListIter<'_, V> {
        ListIter::new(&*self.inner)
    }
}

/// A sorted map per key, scoped to the key being processed.
pub struct MapState<UK, UV> {
    pub(super) inner: Box<dyn MapAccess<UK, UV>>,
}

impl<UK, UV> MapState<UK, UV> {
    /// Wraps a backend's implementation.
    pub fn from_access(inner: Box<dyn MapAccess<UK, UV>>) -> Self {
        MapState { inner }
    }
    /// The value under `k` for the current key.
    pub fn get(&self, k: &UK) -> Result<Option<UV>> {
        self.inner.get(k)
    }
    /// Puts `k -> v` for the current key.
    pub fn put(&mut self, k: UK, v: UV) -> Result<()> {
        self.inner.put(k, v)
    }
    /// Removes `k` for the current key.
    pub fn remove(&mut self, k: &UK) -> Result<Option<UV>> {
        self.inner.remove(k)
    }
    /// True when `k` is present for the current key.
    pub fn contains(&self, k: &UK) -> Result<bool> {
        Ok(self.inner.get(k)?.is_some())
    }
    /// All entries for the current key, sorted by user key (loaded at once: for a large
    /// map use [`MapState::iter`]).
    pub fn entries(&self) -> Result<Vec<(UK, UV)>> {
        self.inner.entries()
    }
    /// Removes the current key's map.
    pub fn clear(&mut self) -> Result<()> {
        self.inner.clear()
    }
    /// The current key's entries, read from the backend in batches of [`ITER_BATCH`](super::ITER_BATCH): a
    /// large map is never loaded at once. The memory backend iterates in user-key order;
    /// the RocksDB backend in the order of the encoded user keys (every entry once, in an
    /// order that does not change while the map does not).
    ///
    /// The iterator reads the map of the key current when each batch is read; do not
    /// change the current key while iterating.
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
    /// let mut clicks = ctx.map_state::<String, u64>("clicks").unwrap();
    /// key.set(1);
    /// clicks.put("home".into(), 3).unwrap();
    /// clicks.put("cart".into(), 1).unwrap();
    /// let total: u64 = clicks.values().map(|v| v.unwrap()).sum();
    /// assert_eq!(total, 4);
    /// let mut pages: Vec<String> = clicks.keys().collect::<Result<_, _>>().unwrap();
    /// pages.sort();
    /// assert_eq!(pages, ["cart", "home"]);
    /// assert!(!clicks.is_empty().unwrap());
    /// ```
    pub fn iter(&self) -> MapIter<'_, UK, UV> {
        MapIter::new(&*self.inner)
    }
    /// The current key's user keys, in [`MapState::iter`]'s order.
    pub fn keys(&self) -> impl Iterator<Item = Result<UK>> + '_
    where
        UK: Clone,
    {
        self.iter().map(|e| e.map(|(k, _)| k))
    }
    /// The current key's values, in [`MapState::iter`]'s order.
    pub fn values(&self) -> impl Iterator<Item = Result<UV>> + '_
    where
        UK: Clone,
    {
        self.iter().map(|e| e.map(|(_, v)| v))
    }
    /// True when the current key's map has no entries (reads at most one entry).
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.inner.entries_after(None, 1)?.is_empty())
    }
}

/// One value per key that new values are folded into, scoped to the key being processed.
/// Created by [`StateContext::reducing_state`](super::StateContext::reducing_state); stored like a [`ValueState`].
pub struct ReducingState<V> {
    pub(super) value: ValueState<V>,
    pub(super) reduce: Box<dyn Fn(V, V) -> V>,
}

impl<V> ReducingState<V> {
    /// The current key's reduced value, if anything was added.
    pub fn get(&self) -> Result<Option<V>> {
        self.value.get()
    }
    /// Folds `value` into the current key's value (or stores it, if there is none).
    pub fn add(&mut self, value: V) -> Result<()> {
        let next = match self.value.get()? {
            Some(acc) => (self.reduce)(acc, value),
            None => value,
        };
        self.value.set(next)
    }
    /// Removes the current key's value.
    pub fn clear(&mut self) -> Result<()> {
        self.value.clear()
    }
}
