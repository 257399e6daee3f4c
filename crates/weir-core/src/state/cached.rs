//! Write-back cached tables over a persistent [`KvStore`] (the RocksDB backend).
//!
//! Reads go to a typed cache first and fall back to the store; writes stay in the cache
//! and are written to the store in one batch when the operator snapshots (at the
//! checkpoint barrier), or in chunks of [`WRITE_CHUNK_BYTES`] when the cache outgrows its
//! capacity. A full cache writes its changes back, then evicts with a second chance:
//! entries read or written since the last eviction stay (up to half the capacity), the
//! others go, so a hot set of keys survives a stream of keys seen once. Keys in the store
//! are
//! `[key group: u16 big-endian][table name][0][encoded key]`, so a key group's entries
//! are contiguous and can be split off on rescale.

use super::{KeyContext, KeyEncoding, KvStore, StateTableInfo, ValueAccess};
use crate::checkpoint::KeyGroupBlobs;
use crate::codec;
use crate::data::{Data, Key, key_group};
use crate::error::Result;
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::rc::Rc;

mod prefetch;
pub(crate) use prefetch::Prefetch;

struct Slot<V> {
    value: Option<V>,
    dirty: bool,
    /// Read or written since the last eviction.
    used: bool,
}

/// One state table: a typed write-back cache over the store.
pub struct CachedTable<K, V> {
    name: String,
    map: FxHashMap<K, Slot<V>>,
    store: Rc<dyn KvStore>,
    max_parallelism: usize,
    capacity: usize,
    /// The key group of a key.
    group: fn(&K, usize) -> u32,
    /// How the store encodes keys.
    encoding: KeyEncoding,
    /// Memory one entry takes, estimated from encoded sizes (0: not estimated yet).
    entry_bytes: usize,
    /// Reads (cached or not) since the last [`CachedTable::prefetch`], and the number of
    /// records of that batch: a table read for fewer than half of them loads nothing
    /// ahead of the next batch.
    reads: usize,
    last_batch: usize,
    /// The number of cached entries at which the next estimate of `entry_bytes` is made
    /// while there is none.
    sample_at: usize,
}

/// Entries a cache holds before it estimates their size to size itself in bytes.
const SIZE_SAMPLE_AT: usize = 1024;

/// The store key of `key` in table `name`, with `key` encoded as `encoding` says.
pub fn store_key<K: Key>(
    name: &str,
    key: &K,
    max_parallelism: usize,
    encoding: KeyEncoding,
) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(name.len() + 16);
    store_key_grouped_into(name, key, (max_parallelism, own_group), encoding, &mut out)?;
    Ok(out)
}

/// Decodes a value of state `name` read from the store. One that does not decode fails
/// naming the state ([`super::state_type_changed`]): the store was restored from a
/// checkpoint that wrote the state with another type.
pub(crate) fn decode_stored<V: Data>(name: &str, bytes: &[u8]) -> Result<V> {
    codec::decode::<V>(bytes).map_err(|e| super::state_type_changed(name, e))
}

/// The key group of a key that is itself the stream's key.
fn own_group<K: Key>(key: &K, max_parallelism: usize) -> u32 {
    key_group(key, max_parallelism).0
}

/// Appends the store key of `key` in table `name` to `out`, under the key group `group`
/// gives it (of `max_parallelism`).
fn store_key_grouped_into<K: Key>(
    name: &str,
    key: &K,
    (max_parallelism, group): (usize, fn(&K, usize) -> u32),
    encoding: KeyEncoding,
    out: &mut Vec<u8>,
) -> Result<()> {
    let g = group(key, max_parallelism) as u16;
    out.extend_from_slice(&g.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    encoding.encode_into(key, out)
}

/// Encoded bytes a cache's write-back (when it outgrows its capacity) hands to the store
/// at a time. Writing a full cache in one batch held its encoded copy and the store's
/// write batch (two more copies of every dirty entry, growing with the cache and so with
/// the memory budget) on top of the cache; in chunks, those copies stay below about twice
/// this size whatever the budget.
pub const WRITE_CHUNK_BYTES: usize = 1 << 20;

/// Where one change lies in [`Changes::bytes`].
struct Span {
    key: usize,
    value: usize,
    end: usize,
    delete: bool,
}

/// One table's changes since its last write-back: store keys with encoded values or
/// deletes, in no particular order. Keys and values are encoded back to back into one
/// buffer: two allocations per batch rather than two per entry, on the task thread that
/// encodes them and on whichever thread frees them.
pub struct Changes {
    bytes: Vec<u8>,
    spans: Vec<Span>,
    /// Where the encoded key begins in each store key (after group, name and separator).
    key_start: usize,
}

impl Changes {
    pub(super) fn new(key_start: usize) -> Self {
        Changes {
            bytes: Vec::new(),
            spans: Vec::new(),
            key_start,
        }
    }

    /// An empty change set for changes that [`Changes::spill`] writes to `store` a chunk
    /// at a time (`None`: kept whole, for a snapshot). With a store its buffer has room
    /// for a chunk of [`WRITE_CHUNK_BYTES`] and its last entry: allocated once at that
    /// size and reused chunk after chunk, where growing it by doubling left a series of
    /// freed buffers of other sizes behind.
    pub(super) fn for_store(key_start: usize, store: Option<&dyn KvStore>) -> Self {
        let capacity = if store.is_some() {
            WRITE_CHUNK_BYTES + (64 << 10)
        } else {
            0
        };
        Changes {
            bytes: Vec::with_capacity(capacity),
            spans: Vec::new(),
            key_start,
        }
    }

    /// Appends a change whose store key and value `encode` appends to the buffer, the
    /// value starting at the offset it returns (`None`: a delete).
    pub(super) fn push_with(
        &mut self,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<Option<usize>>,
    ) -> Result<()> {
        let key = self.bytes.len();
        let value = encode(&mut self.bytes)?;
        let end = self.bytes.len();
        self.spans.push(Span {
            key,
            value: value.unwrap_or(end),
            end,
            delete: value.is_none(),
        });
        Ok(())
    }

    /// Writes the changes gathered so far to `store` and forgets them once they hold
    /// [`WRITE_CHUNK_BYTES`] or more (`None`: keeps them all, for a snapshot). Returns the
    /// (encoded bytes, changes) written.
    pub(super) fn spill(&mut self, store: Option<&dyn KvStore>) -> Result<(usize, usize)> {
        match store {
            Some(store) if self.bytes.len() >= WRITE_CHUNK_BYTES => {
                store.write(self)?;
                let written = (self.bytes.len(), self.spans.len());
                self.bytes.clear();
                self.spans.clear();
                Ok(written)
            }
            _ => Ok((0, 0)),
        }
    }

    /// Number of changed keys.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Bytes of the encoded keys and values.
    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    fn key(&self, s: &Span) -> &[u8] {
        &self.bytes[s.key..s.value]
    }

    /// The changes in byte order of their store keys: (store key, encoded value or `None`
    /// for a delete).
    ///
    /// In that order RocksDB's memtable skip list finds each insert position next to the
    /// previous one (in the cache's hash order every insert searched from the top, about
    /// 4.6× the instructions per key), and an SST file can be built at all. Comparing
    /// whole keys spent as much again in comparisons, so this sorts (group and first six
    /// key bytes as one integer, index) pairs and compares whole keys only on ties.
    pub fn sorted(&self) -> Vec<(&[u8], Option<&[u8]>)> {
        let prefix = |k: &[u8]| -> u64 {
            let mut p = [0u8; 8];
            p[..2].copy_from_slice(&k[..2]);
            let rest = k.get(self.key_start..).unwrap_or_default();
            let n = rest.len().min(6);
            p[2..2 + n].copy_from_slice(&rest[..n]);
            u64::from_be_bytes(p)
        };
        let mut order: Vec<(u64, u32)> = self
            .spans
            .iter()
            .enumerate()
            .map(|(i, s)| (prefix(self.key(s)), i as u32))
            .collect();
        order.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0).then_with(|| {
                self.key(&self.spans[a.1 as usize])
                    .cmp(self.key(&self.spans[b.1 as usize]))
            })
        });
        order
            .into_iter()
            .map(|(_, i)| {
                let s = &self.spans[i as usize];
                let value = (!s.delete).then(|| &self.bytes[s.value..s.end]);
                (self.key(s), value)
            })
            .collect()
    }
}

impl<K: Key, V: Data> CachedTable<K, V> {
    pub(super) fn new(name: &str, store: Rc<dyn KvStore>) -> Self {
        Self::with_group(name, store, own_group::<K>)
    }

    /// A table whose keys take the key group `group` gives them (a (key, window) pair:
    /// its key's group, so a rescale keeps a key's windows with the key).
    pub(super) fn with_group(
        name: &str,
        store: Rc<dyn KvStore>,
        group: fn(&K, usize) -> u32,
    ) -> Self {
        CachedTable {
            name: name.to_string(),
            map: FxHashMap::default(),
            max_parallelism: store.max_parallelism(),
            capacity: store.cache_capacity().max(1),
            entry_bytes: 0,
            encoding: store.key_encoding(),
            store,
            group,
            reads: 0,
            last_batch: 0,
            sample_at: SIZE_SAMPLE_AT,
        }
    }

    fn store_key(&self, k: &K) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.name.len() + 16);
        let (name, group) = (&self.name, (self.max_parallelism, self.group));
        store_key_grouped_into(name, k, group, self.encoding, &mut out)?;
        Ok(out)
    }

    /// The value of `k`.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) naming the state when the stored value does
    /// not decode as `V` (see [`decode_stored`]).
    pub(crate) fn get(&mut self, k: &K) -> Result<Option<V>> {
        self.reads += 1;
        if let Some(slot) = self.map.get_mut(k) {
            slot.used = true;
            return Ok(slot.value.clone());
        }
        let value = match self.store.get(&self.store_key(k)?)? {
            Some(bytes) => Some(decode_stored::<V>(&self.name, &bytes)?),
            None => None,
        };
        self.make_room()?;
        self.map.insert(
            k.clone(),
            Slot {
                value: value.clone(),
                dirty: false,
                used: false,
            },
        );
        Ok(value)
    }

    /// Sets (`Some`) or removes (`None`) the value of `k`.
    pub(crate) fn put(&mut self, k: &K, value: Option<V>) -> Result<()> {
        match self.map.get_mut(k) {
            Some(slot) => {
                slot.value = value;
                slot.dirty = true;
                slot.used = true;
            }
            None => {
                self.make_room()?;
                self.map.insert(
                    k.clone(),
                    Slot {
                        value,
                        dirty: true,
                        used: false,
                    },
                );
            }
        }
        Ok(())
    }

    /// The cache slot of `k`, loaded from the store if it is not cached (a newly loaded
    /// slot counts as used only from its next access, as with [`Self::get`]).
    fn slot(&mut self, k: &K) -> Result<&mut Slot<V>> {
        self.reads += 1;
        if self.map.contains_key(k) {
            let slot = self.map.get_mut(k).expect("checked above");
            slot.used = true;
            return Ok(slot);
        }
        let value = match self.store.get(&self.store_key(k)?)? {
            Some(bytes) => Some(decode_stored::<V>(&self.name, &bytes)?),
            None => None,
        };
        self.make_room()?;
        Ok(self.map.entry(k.clone()).or_insert(Slot {
            value,
            dirty: false,
            used: false,
        }))
    }

    /// Changes the value of `k` in place and marks it for the store.
    pub(crate) fn modify<R>(&mut self, k: &K, f: impl FnOnce(&mut Option<V>) -> R) -> Result<R> {
        let slot = self.slot(k)?;
        slot.dirty = true;
        Ok(f(&mut slot.value))
    }

    /// Keeps the cache within its capacity: write the changes back, then evict every entry
    /// not used since the last eviction, and more if those used fill over half the cache.
    ///
    /// Eviction starts at [`eviction_start`] of the capacity. An eviction must wait for a
    /// snapshot still being written in the background (see below); while one is, the
    /// cache fills the rest of its capacity instead, so the task does not stop for the
    /// snapshot (with 1 s checkpoints and state far larger than the cache it otherwise
    /// waited for most snapshots). The capacity stays the bound on the cache's memory.
    fn make_room(&mut self) -> Result<()> {
        if self.entry_bytes == 0 && self.map.len() >= self.sample_at {
            self.estimate_entry_bytes()?;
        }
        let len = self.map.len();
        if len >= eviction_start(self.capacity) && (len >= self.capacity || !self.store.settling())
        {
            // Clean entries may hold values a background snapshot is still writing, and
            // the store takes no newer value before that snapshot is done.
            self.store.settle()?;
            self.flush()?;
            // The store may size caches from a memory budget shared with tables opened
            // since this one: take the current capacity at every eviction.
            self.capacity = self.store.cache_capacity_for(self.entry_bytes).max(1);
            let mut keep = self.capacity / 2;
            self.map.retain(|_, slot| {
                let stays = slot.used && keep > 0;
                if stays {
                    keep -= 1;
                    slot.used = false;
                }
                stays
            });
            self.map.shrink_to(self.capacity);
        }
        Ok(())
    }

    /// Estimates the memory of one entry from the encoded sizes of a sample of cached
    /// entries (a value takes about its encoded size on the heap, and its encoded copy
    /// as much again while a checkpoint writes it), and resizes the cache to it.
    ///
    /// Only entries with a value count: a cache that loaded the keys of a batch ahead of
    /// it holds many keys with no value yet, which would make the estimate, and so the
    /// cache's size in bytes, far off. With no value among the first
    /// [`SIZE_SAMPLE_AT`] entries, nothing is estimated yet.
    fn estimate_entry_bytes(&mut self) -> Result<()> {
        let mut buf = Vec::new();
        let mut n = 0;
        let with_values = self.map.iter().take(SIZE_SAMPLE_AT);
        for (k, v) in with_values
            .filter_map(|(k, s)| Some((k, s.value.as_ref()?)))
            .take(64)
        {
            codec::encode_into(k, &mut buf)?;
            codec::encode_into(v, &mut buf)?;
            n += 1;
        }
        if n == 0 {
            // Again once as many entries more are cached.
            self.sample_at = self.map.len() + SIZE_SAMPLE_AT;
            return Ok(());
        }
        self.set_entry_bytes(buf.len(), n);
        self.capacity = self.store.cache_capacity_for(self.entry_bytes).max(1);
        Ok(())
    }

    /// Sets the memory of one entry from its encoded size: its hash map slot, its value
    /// on the heap (about its encoded size), and, while a checkpoint writes it, its
    /// encoded copy with its span and its place in the sorted run the snapshot thread
    /// builds from it (a pair of slices, and the sort's (prefix, index) pair).
    fn set_entry_bytes(&mut self, encoded: usize, entries: usize) {
        if let Some(per_entry) = encoded.checked_div(entries) {
            let slot = std::mem::size_of::<(K, Slot<V>)>() * 8 / 7 + 1;
            let sorted =
                std::mem::size_of::<(&[u8], Option<&[u8]>)>() + std::mem::size_of::<(u64, u32)>();
            self.entry_bytes =
                slot + 2 * per_entry + std::mem::size_of::<Span>() + sorted + self.name.len() + 3;
        }
    }

    /// Encodes the changed entries and marks them clean; with a `store`, writes them to
    /// it in chunks of [`WRITE_CHUNK_BYTES`] as they are encoded and returns the rest.
    fn take_changes(&mut self, store: Option<&dyn KvStore>) -> Result<Changes> {
        let mut changes = Changes::for_store(self.name.len() + 3, store);
        let (mut spilled_bytes, mut spilled) = (0, 0);
        let (name, group, encoding) = (
            &self.name,
            (self.max_parallelism, self.group),
            self.encoding,
        );
        for (k, slot) in self.map.iter_mut().filter(|(_, s)| s.dirty) {
            changes.push_with(|buf| {
                store_key_grouped_into(name, k, group, encoding, buf)?;
                let Some(v) = &slot.value else {
                    return Ok(None);
                };
                let start = buf.len();
                codec::encode_into(v, buf)?;
                Ok(Some(start))
            })?;
            slot.dirty = false;
            let (bytes, n) = changes.spill(store)?;
            spilled_bytes += bytes;
            spilled += n;
        }
        let n = spilled + changes.len();
        let overhead = n * (self.name.len() + 3);
        self.set_entry_bytes(
            (spilled_bytes + changes.bytes.len()).saturating_sub(overhead),
            n,
        );
        Ok(changes)
    }

    /// Writes the changed entries to the store, a chunk at a time.
    fn flush(&mut self) -> Result<()> {
        let store = self.store.clone();
        let changes = self.take_changes(Some(&*store))?;
        if !changes.is_empty() {
            store.write(&changes)?;
        }
        Ok(())
    }
}

/// The number of entries at which a cache of `capacity` entries evicts when no snapshot
/// is being written: four fifths of it, leaving the last fifth for the time a background
/// snapshot takes.
fn eviction_start(capacity: usize) -> usize {
    capacity - capacity / 5
}

pub(super) struct Info<T>(pub(super) Rc<RefCell<T>>);

impl<K: Key, V: Data> StateTableInfo for Info<CachedTable<K, V>> {
    fn entries(&self) -> usize {
        self.0.borrow().map.len()
    }
    fn snapshot(&self, _max_parallelism: usize) -> Result<KeyGroupBlobs> {
        Ok(Vec::new())
    }
    /// Entries checkpointed by a heap table (a job that switched from the memory backend)
    /// are loaded into the cache as changes, written to the store at the next flush.
    fn restore(&self, blobs: &KeyGroupBlobs) -> Result<()> {
        let mut t = self.0.borrow_mut();
        for (k, v) in super::heap::decode_key_groups::<K, V>(blobs)? {
            t.put(&k, Some(v))?;
        }
        Ok(())
    }
    fn is_persistent(&self) -> bool {
        true
    }
    fn take_changes(&self) -> Result<Option<Changes>> {
        self.0.borrow_mut().take_changes(None).map(Some)
    }
}

pub(super) struct CachedValue<K, V> {
    pub(super) key: Rc<KeyContext<K>>,
    pub(super) table: Rc<RefCell<CachedTable<K, V>>>,
}

impl<K: Key, V: Data> ValueAccess<V> for CachedValue<K, V> {
    fn get(&self) -> Result<Option<V>> {
        self.key.with(|k| self.table.borrow_mut().get(k))
    }
    fn set(&mut self, value: V) -> Result<()> {
        self.key
            .with(|k| self.table.borrow_mut().put(k, Some(value)))
    }
    fn clear(&mut self) -> Result<()> {
        self.key.with(|k| self.table.borrow_mut().put(k, None))
    }
}
#[cfg(test)]
#[path = "cached_tests.rs"]
mod tests;
