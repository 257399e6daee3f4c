//! Typed heap tables: the in-memory representation of keyed state.
//!
//! Owns the hash maps and the handle implementations over them; knows nothing of
//! backends beyond [`super::StateTableInfo`].

use super::{KeyContext, ListAccess, MapAccess, StateTableInfo, ValueAccess};
use crate::checkpoint::KeyGroupBlobs;
use crate::codec;
use crate::data::{Data, Key, key_group};
use crate::error::Result;
use rustc_hash::FxHashMap;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

/// A table of one value per state key.
pub struct HeapValueTable<SK, V> {
    /// The entries.
    pub map: FxHashMap<SK, V>,
}

impl<SK, V> Default for HeapValueTable<SK, V> {
    fn default() -> Self {
        HeapValueTable {
            map: FxHashMap::default(),
        }
    }
}

/// A table of one list per key.
pub struct HeapListTable<K, V> {
    /// The entries.
    pub map: FxHashMap<K, Vec<V>>,
}

impl<K, V> Default for HeapListTable<K, V> {
    fn default() -> Self {
        HeapListTable {
            map: FxHashMap::default(),
        }
    }
}

/// A table of one sorted map per key.
pub struct HeapMapTable<K, UK, UV> {
    /// The entries.
    pub map: FxHashMap<K, BTreeMap<UK, UV>>,
}

impl<K, UK, UV> Default for HeapMapTable<K, UK, UV> {
    fn default() -> Self {
        HeapMapTable {
            map: FxHashMap::default(),
        }
    }
}

pub(super) struct Info<T>(pub(super) Rc<RefCell<T>>);

/// Entries whose size [`live_bytes`] adds up exactly; beyond, it extrapolates from them.
pub const SIZE_SAMPLE: usize = 1000;

/// The encoded size of `len` `(key, entry)` pairs that `items` iterates: exact up to
/// [`SIZE_SAMPLE`] entries, otherwise `len` times the mean size of the first
/// [`SIZE_SAMPLE`] (a walk of at most that many entries, whatever the table's size).
///
/// ```
/// use weir_core::state::live_bytes;
/// let entries = [("a".to_string(), 1u64), ("bb".to_string(), 300u64)];
/// // "a": 1 + 1 bytes, 1: 1 byte; "bb": 1 + 2, 300: 3 bytes.
/// assert_eq!(live_bytes(2, entries.iter().map(|(k, v)| (k, v))), 9);
/// ```
pub fn live_bytes<'a, K: Serialize + 'a, E: Serialize + 'a>(
    len: usize,
    items: impl Iterator<Item = (&'a K, &'a E)>,
) -> u64 {
    let (mut n, mut bytes) = (0u64, 0u64);
    for (k, e) in items.take(SIZE_SAMPLE) {
        bytes += codec::encoded_size(&(k, e)).unwrap_or(0) as u64;
        n += 1;
    }
    if n == 0 || n == len as u64 {
        bytes
    } else {
        bytes * len as u64 / n
    }
}

/// Encodes `(key, entry)` pairs grouped by the key group of the key.
pub fn encode_by_key_group<'a, K: Key + 'a, E: Serialize>(
    max_parallelism: usize,
    items: impl Iterator<Item = (&'a K, E)>,
) -> Result<KeyGroupBlobs> {
    let mut groups: BTreeMap<u32, Vec<(&'a K, E)>> = BTreeMap::new();
    for (k, e) in items {
        groups
            .entry(key_group(k, max_parallelism).0)
            .or_default()
            .push((k, e));
    }
    groups
        .into_iter()
        .map(|(g, entries)| Ok((g, codec::encode(&entries)?)))
        .collect()
}

/// Decodes every blob of [`encode_by_key_group`] into `(key, entry)` pairs.
pub fn decode_key_groups<K: Key, E: DeserializeOwned>(
    blobs: &KeyGroupBlobs,
) -> Result<Vec<(K, E)>> {
    let mut out = Vec::new();
    for (_, b) in blobs {
        out.extend(codec::decode::<Vec<(K, E)>>(b)?);
    }
    Ok(out)
}

impl<K: Key, V: Data> StateTableInfo for Info<HeapValueTable<K, V>> {
    fn entries(&self) -> usize {
        self.0.borrow().map.len()
    }
    fn live_bytes(&self) -> Option<u64> {
        let t = self.0.borrow();
        Some(live_bytes(t.map.len(), t.map.iter()))
    }
    fn snapshot(&self, max_parallelism: usize) -> Result<KeyGroupBlobs> {
        encode_by_key_group(max_parallelism, self.0.borrow().map.iter())
    }
    fn restore(&self, blobs: &KeyGroupBlobs) -> Result<()> {
        let mut t = self.0.borrow_mut();
        for (k, v) in decode_key_groups::<K, V>(blobs)? {
            t.map.insert(k, v);
        }
        Ok(())
    }
}
impl<K: Key, V: Data> StateTableInfo for Info<HeapListTable<K, V>> {
    fn entries(&self) -> usize {
        self.0.borrow().map.len()
    }
    fn live_bytes(&self) -> Option<u64> {
        let t = self.0.borrow();
        Some(live_bytes(t.map.len(), t.map.iter()))
    }
    fn snapshot(&self, max_parallelism: usize) -> Result<KeyGroupBlobs> {
        encode_by_key_group(max_parallelism, self.0.borrow().map.iter())
    }
    fn restore(&self, blobs: &KeyGroupBlobs) -> Result<()> {
        let mut t = self.0.borrow_mut();
        for (k, v) in decode_key_groups::<K, Vec<V>>(blobs)? {
            t.map.insert(k, v);
        }
        Ok(())
    }
}
impl<K: Key, UK: Key, UV: Data> StateTableInfo for Info<HeapMapTable<K, UK, UV>> {
    fn entries(&self) -> usize {
        self.0.borrow().map.len()
    }
    fn live_bytes(&self) -> Option<u64> {
        let t = self.0.borrow();
        Some(live_bytes(t.map.len(), t.map.iter()))
    }
    fn snapshot(&self, max_parallelism: usize) -> Result<KeyGroupBlobs> {
        encode_by_key_group(max_parallelism, self.0.borrow().map.iter())
    }
    fn restore(&self, blobs: &KeyGroupBlobs) -> Result<()> {
        let mut t = self.0.borrow_mut();
        for (k, v) in decode_key_groups::<K, BTreeMap<UK, UV>>(blobs)? {
            t.map.insert(k, v);
        }
        Ok(())
    }
}

pub(super) struct HeapValue<K, V> {
    pub(super) key: Rc<KeyContext<K>>,
    pub(super) table: Rc<RefCell<HeapValueTable<K, V>>>,
}

impl<K: Key, V: Data> ValueAccess<V> for HeapValue<K, V> {
    fn get(&self) -> Result<Option<V>> {
        let t = self.table.borrow();
        Ok(self.key.with(|k| t.map.get(k).cloned()))
    }
    fn set(&mut self, value: V) -> Result<()> {
        let mut t = self.table.borrow_mut();
        self.key.with(|k| match t.map.get_mut(k) {
            Some(slot) => *slot = value,
            None => {
                t.map.insert(k.clone(), value);
            }
        });
        Ok(())
    }
    fn clear(&mut self) -> Result<()> {
        let mut t = self.table.borrow_mut();
        self.key.with(|k| t.map.remove(k));
        Ok(())
    }
}

pub(super) struct HeapList<K, V> {
    pub(super) key: Rc<KeyContext<K>>,
    pub(super) table: Rc<RefCell<HeapListTable<K, V>>>,
}

impl<K: Key, V: Data> ListAccess<V> for HeapList<K, V> {
    fn get(&self) -> Result<Vec<V>> {
        let t = self.table.borrow();
        Ok(self.key.with(|k| t.map.get(k).cloned().unwrap_or_default()))
    }
    fn add(&mut self, value: V) -> Result<()> {
        let mut t = self.table.borrow_mut();
        self.key.with(|k| match t.map.get_mut(k) {
            Some(l) => l.push(value),
            None => {
                t.map.insert(k.clone(), vec![value]);
            }
        });
        Ok(())
    }
    fn update(&mut self, values: Vec<V>) -> Result<()> {
        let mut t = self.table.borrow_mut();
        self.key.with(|k| {
            if values.is_empty() {
                t.map.remove(k);
            } else {
                t.map.insert(k.clone(), values);
            }
        });
        Ok(())
    }
    fn clear(&mut self) -> Result<()> {
        let mut t = self.table.borrow_mut();
        self.key.with(|k| t.map.remove(k));
        Ok(())
    }
    fn read_from(&self, from: usize, limit: usize) -> Result<(Vec<V>, usize)> {
        let t = self.table.borrow();
        Ok(self.key.with(|k| {
            let list = t.map.get(k).map(Vec::as_slice).unwrap_or_default();
            let from = from.min(list.len());
            let to = from.saturating_add(limit).min(list.len());
            (list[from..to].to_vec(), to)
        }))
    }
}

pub(super) struct HeapMap<K, UK, UV> {
    pub(super) key: Rc<KeyContext<K>>,
    pub(super) table: Rc<RefCell<HeapMapTable<K, UK, UV>>>,
}

impl<K: Key, UK: Key, UV: Data> MapAccess<UK, UV> for HeapMap<K, UK, UV> {
    fn get(&self, uk: &UK) -> Result<Option<UV>> {
        let t = self.table.borrow();
        Ok(self
            .key
            .with(|k| t.map.get(k).and_then(|m| m.get(uk).cloned())))
    }
    fn put(&mut self, uk: UK, uv: UV) -> Result<()> {
        let mut t = self.table.borrow_mut();
        self.key.with(|k| match t.map.get_mut(k) {
            Some(m) => {
                m.insert(uk, uv);
            }
            None => {
                t.map.insert(k.clone(), BTreeMap::from([(uk, uv)]));
            }
        });
        Ok(())
    }
    fn remove(&mut self, uk: &UK) -> Result<Option<UV>> {
        let mut t = self.table.borrow_mut();
        Ok(self.key.with(|k| {
            let m = t.map.get_mut(k)?;
            let v = m.remove(uk);
            if m.is_empty() {
                t.map.remove(k);
            }
            v
        }))
    }
    fn entries(&self) -> Result<Vec<(UK, UV)>> {
        let t = self.table.borrow();
        Ok(self.key.with(|k| {
            t.map
                .get(k)
                .map(|m| m.iter().map(|(a, b)| (a.clone(), b.clone())).collect())
                .unwrap_or_default()
        }))
    }
    fn clear(&mut self) -> Result<()> {
        let mut t = self.table.borrow_mut();
        self.key.with(|k| t.map.remove(k));
        Ok(())
    }
    fn entries_after(&self, after: Option<&UK>, limit: usize) -> Result<Vec<(UK, UV)>> {
        use std::ops::Bound::{Excluded, Unbounded};
        let t = self.table.borrow();
        Ok(self.key.with(|k| {
            let Some(m) = t.map.get(k) else {
                return Vec::new();
            };
            let from = after.map_or(Unbounded, Excluded);
            m.range((from, Unbounded))
                .take(limit)
                .map(|(a, b)| (a.clone(), b.clone()))
                .collect()
        }))
    }
}
