//! Timers kept in the persistent store (the RocksDB backend), in time order.
//!
//! A timer is one store key with an empty value:
//! `[key group: u16 BE][table name][0][domain][time: i64 BE, sign bit flipped][key][namespace]`.
//! Within a key group the timers therefore sort by time, then key and namespace, and a
//! key group's timers stay contiguous, so a rescale splits them off like any other keyed
//! state. Registering the same (time, key, namespace) twice writes the same key: one timer.
//!
//! In memory the queue keeps only what Flink's RocksDB priority queue keeps: the earliest
//! time of each key group (its head) and a set of those heads ordered by time, so the next
//! timer to fire is the first head. Firing reads the due timers of that key group from the
//! store, a batch at a time. Registrations and deletions go into a small write-back overlay
//! of pending keys (written to the store when it outgrows the cache capacity and handed to
//! the backend's snapshot at every checkpoint barrier); reads merge the store with it.
//!
//! This module owns the key layout of timers; it knows nothing of windows or functions.

use super::{Changes, KvStore};
use crate::codec;
use crate::data::{Key, key_group};
use crate::error::Result;
use crate::time::Timestamp;
use crate::timer::DueTimers;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;
use std::rc::Rc;

/// Timers handed to the caller per call of [`StoreTimers::pop_due`] (at most).
const POP_BATCH: usize = 1024;
/// Store entries read per seek when merging the store with the overlay.
const SCAN_BATCH: usize = 256;

/// A pending change of one timer key.
#[derive(Clone, Copy)]
struct Pending {
    /// The timer exists (registered) or not (deleted or fired).
    live: bool,
    /// Not yet written to the store nor handed to a snapshot.
    dirty: bool,
}

/// An ordered, de-duplicated timer queue of one time domain in the store.
pub(crate) struct StoreTimers<K, N> {
    /// `[table name][0][domain]`: what follows the key group in every key.
    tag: Vec<u8>,
    store: Rc<dyn KvStore>,
    max_parallelism: usize,
    capacity: usize,
    overlay: BTreeMap<Vec<u8>, Pending>,
    /// The earliest time of each key group's timers.
    heads: Vec<Option<Timestamp>>,
    /// The heads, by time.
    order: BTreeSet<(Timestamp, u16)>,
    /// Number of timers, once counted (counting reads every timer once).
    len: Option<usize>,
    /// Registering and deleting check whether the timer exists (to answer and to count).
    checked: bool,
    _p: PhantomData<fn() -> (K, N)>,
}

fn time_bytes(ts: Timestamp) -> [u8; 8] {
    ((ts as u64) ^ (1 << 63)).to_be_bytes()
}

fn time_of(bytes: &[u8]) -> Timestamp {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[..8]);
    (u64::from_be_bytes(b) ^ (1 << 63)) as Timestamp
}

impl<K: Key, N: Serialize + DeserializeOwned + Clone> StoreTimers<K, N> {
    /// The queue of table `name`, time domain `domain`, over `store`: reads the head of
    /// every key group already in the store (after a restore).
    ///
    /// An unchecked queue (for callers that never register a timer twice nor delete one
    /// that is not there, as windows) skips the point read per registration that answers
    /// whether a timer existed: its `register` and `delete` always answer true.
    pub(crate) fn open(
        name: &str,
        domain: u8,
        store: Rc<dyn KvStore>,
        checked: bool,
    ) -> Result<Self> {
        let mut tag = name.as_bytes().to_vec();
        tag.push(0);
        tag.push(domain);
        let max_parallelism = store.max_parallelism();
        let mut q = StoreTimers {
            tag,
            capacity: store.cache_capacity().max(1),
            store,
            max_parallelism,
            overlay: BTreeMap::new(),
            heads: vec![None; max_parallelism],
            order: BTreeSet::new(),
            len: None,
            checked,
            _p: PhantomData,
        };
        for g in 0..max_parallelism as u16 {
            q.refresh_head(g)?;
        }
        Ok(q)
    }

    fn group_prefix(&self, g: u16) -> Vec<u8> {
        let mut k = Vec::with_capacity(2 + self.tag.len() + 24);
        k.extend_from_slice(&g.to_be_bytes());
        k.extend_from_slice(&self.tag);
        k
    }

    /// The first key after every timer of key group `g`.
    fn group_end(&self, g: u16) -> Vec<u8> {
        let mut k = self.group_prefix(g);
        *k.last_mut().expect("the tag ends with the domain") += 1;
        k
    }

    fn encode(&self, ts: Timestamp, key: &K, ns: &N) -> Result<(u16, Vec<u8>)> {
        let g = key_group(key, self.max_parallelism).0 as u16;
        let mut k = self.group_prefix(g);
        k.extend_from_slice(&time_bytes(ts));
        codec::encode_into(&(key, ns), &mut k)?;
        Ok((g, k))
    }

    fn decode(&self, store_key: &[u8]) -> Result<(Timestamp, K, N)> {
        let at = 2 + self.tag.len();
        let ts = time_of(&store_key[at..]);
        let (k, n) = codec::decode::<(K, N)>(&store_key[at + 8..]).map_err(|e| {
            // The tag is the table's name, a 0 and the time domain.
            let name = String::from_utf8_lossy(&self.tag[..self.tag.len() - 2]);
            super::state_type_changed(&name, e)
        })?;
        Ok((ts, k, n))
    }

    /// Up to `limit` live timer keys in `[start, end)`, in order: the store's keys with
    /// the overlay's pending changes applied.
    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        let mut cur = start.to_vec();
        // Small reads first (a head is one entry), larger while pending deletes hide
        // the store's entries.
        let mut batch = limit.clamp(1, SCAN_BATCH);
        loop {
            let stored = self.store.scan(&cur, end, batch)?;
            // A full batch tells nothing about the store past its last key.
            let upto = match stored.last() {
                Some((k, _)) if stored.len() == batch => {
                    let mut next = k.clone();
                    next.push(0);
                    next
                }
                _ => end.to_vec(),
            };
            let mut merged: BTreeMap<&[u8], bool> =
                stored.iter().map(|(k, _)| (k.as_slice(), true)).collect();
            for (k, p) in self.overlay.range(cur.clone()..upto.clone()) {
                merged.insert(k.as_slice(), p.live);
            }
            for (k, live) in merged {
                if live {
                    out.push(k.to_vec());
                    if out.len() == limit {
                        return Ok(out);
                    }
                }
            }
            if upto.as_slice() >= end {
                return Ok(out);
            }
            cur = upto;
            batch = (batch * 2).min(SCAN_BATCH);
        }
    }

    /// Reads key group `g`'s earliest timer again.
    fn refresh_head(&mut self, g: u16) -> Result<()> {
        if let Some(old) = self.heads[g as usize].take() {
            self.order.remove(&(old, g));
        }
        let first = self.scan(&self.group_prefix(g), &self.group_end(g), 1)?;
        if let Some(k) = first.first() {
            let ts = time_of(&k[2 + self.tag.len()..]);
            self.heads[g as usize] = Some(ts);
            self.order.insert((ts, g));
        }
        Ok(())
    }

    fn exists(&self, store_key: &[u8]) -> Result<bool> {
        match self.overlay.get(store_key) {
            Some(p) => Ok(p.live),
            None => Ok(self.store.get(store_key)?.is_some()),
        }
    }

    fn set(&mut self, store_key: Vec<u8>, live: bool) -> Result<()> {
        self.overlay
            .insert(store_key, Pending { live, dirty: true });
        if let Some(n) = self.len.as_mut().filter(|_| self.checked) {
            *n = if live { *n + 1 } else { n.saturating_sub(1) };
        }
        self.make_room()
    }

    /// Registers a timer; false if it was registered already.
    pub(crate) fn register(&mut self, ts: Timestamp, key: &K, ns: &N) -> Result<bool> {
        let (g, k) = self.encode(ts, key, ns)?;
        if self.checked && self.exists(&k)? {
            return Ok(false);
        }
        self.set(k, true)?;
        let head = &mut self.heads[g as usize];
        if head.is_none_or(|h| ts < h) {
            if let Some(old) = head.replace(ts) {
                self.order.remove(&(old, g));
            }
            self.order.insert((ts, g));
        }
        Ok(true)
    }

    /// Deletes a timer; false if it was not registered.
    pub(crate) fn delete(&mut self, ts: Timestamp, key: &K, ns: &N) -> Result<bool> {
        let (g, k) = self.encode(ts, key, ns)?;
        if self.checked && !self.exists(&k)? {
            return Ok(false);
        }
        self.set(k, false)?;
        if self.heads[g as usize] == Some(ts) {
            self.refresh_head(g)?;
        }
        Ok(true)
    }

    /// Removes and returns timers due at `now` (time <= now), all of the earliest time
    /// and one key group, at most [`POP_BATCH`] of them. Call repeatedly until `None`.
    pub(crate) fn pop_due(&mut self, now: Timestamp) -> Result<Option<DueTimers<K, N>>> {
        loop {
            let Some(&(ts, g)) = self.order.first() else {
                return Ok(None);
            };
            if ts > now {
                return Ok(None);
            }
            let mut start = self.group_prefix(g);
            start.extend_from_slice(&time_bytes(ts));
            let end = match ts.checked_add(1) {
                Some(next) => {
                    let mut e = self.group_prefix(g);
                    e.extend_from_slice(&time_bytes(next));
                    e
                }
                None => self.group_end(g),
            };
            let keys = self.scan(&start, &end, POP_BATCH)?;
            let mut due = Vec::with_capacity(keys.len());
            for k in &keys {
                let (_, key, ns) = self.decode(k)?;
                due.push((key, ns));
            }
            let all = keys.len() < POP_BATCH;
            for k in keys {
                self.set(k, false)?;
            }
            if all {
                self.refresh_head(g)?;
            }
            if !due.is_empty() {
                return Ok(Some((ts, due)));
            }
        }
    }

    /// The earliest registered time, if any.
    pub(crate) fn next_time(&self) -> Option<Timestamp> {
        self.order.first().map(|&(ts, _)| ts)
    }

    /// Number of timers: counted by one pass over them the first time, then kept.
    pub(crate) fn len(&mut self) -> Result<usize> {
        if let Some(n) = self.len {
            return Ok(n);
        }
        let mut n = 0;
        for g in 0..self.max_parallelism as u16 {
            let end = self.group_end(g);
            let mut cur = self.group_prefix(g);
            loop {
                let keys = self.scan(&cur, &end, SCAN_BATCH)?;
                n += keys.len();
                match keys.last() {
                    Some(k) if keys.len() == SCAN_BATCH => {
                        cur = k.clone();
                        cur.push(0);
                    }
                    _ => break,
                }
            }
        }
        if self.checked {
            self.len = Some(n);
        }
        Ok(n)
    }

    /// Pending changes kept in memory (a state-size metric).
    pub(crate) fn cached(&self) -> usize {
        self.overlay.len()
    }

    /// Deletes every timer; returns how many there were.
    pub(crate) fn clear(&mut self) -> Result<usize> {
        let mut n = 0;
        while let Some((_, due)) = self.pop_due(Timestamp::MAX)? {
            n += due.len();
        }
        Ok(n)
    }

    /// Hands the changes since the last write-back to a snapshot and marks them clean;
    /// they stay in the overlay until the next write-back, so reads see them while the
    /// snapshot writes them in the background. With a `store`, writes them to it in chunks
    /// of [`WRITE_CHUNK_BYTES`](super::WRITE_CHUNK_BYTES) as they are gathered instead
    /// (a write-back) and leaves the last chunk in `changes`.
    pub(crate) fn take_changes_into(
        &mut self,
        changes: &mut Changes,
        store: Option<&dyn KvStore>,
    ) -> Result<()> {
        for (k, p) in self.overlay.iter_mut().filter(|(_, p)| p.dirty) {
            changes.push_with(|buf| {
                buf.extend_from_slice(k);
                Ok(p.live.then_some(buf.len()))
            })?;
            p.dirty = false;
            changes.spill(store)?;
        }
        Ok(())
    }

    /// A new change set for this queue's keys.
    pub(crate) fn changes(&self) -> Changes {
        Changes::new(self.key_start())
    }

    /// Where the encoded key begins in each of this queue's store keys.
    fn key_start(&self) -> usize {
        2 + self.tag.len() - 1
    }

    /// Keeps the overlay within the cache capacity: writes its changes to the store and
    /// forgets them.
    fn make_room(&mut self) -> Result<()> {
        if self.overlay.len() < self.capacity {
            return Ok(());
        }
        // Clean entries may still be on their way into the store with a snapshot.
        self.store.settle()?;
        // In chunks, as a write-back cache writes back: one set of changes for the whole
        // overlay grew its buffers (and RocksDB's batch) by doubling to the overlay's size.
        let store = self.store.clone();
        let mut changes = Changes::for_store(self.key_start(), Some(&*store));
        self.take_changes_into(&mut changes, Some(&*store))?;
        if !changes.is_empty() {
            store.write(&changes)?;
        }
        self.overlay.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::test_store::Store;

    /// Timers stored with one key type and read by a job version that declares another
    /// (here text keys, then numbers) fail naming the timers' table, with an error a
    /// restart does not retry, instead of a bare decoding error.
    #[test]
    fn timers_of_another_key_type_fail_naming_their_table() {
        let store = Rc::new(Store {
            capacity: 1,
            ..Store::default()
        });
        let mut texts =
            StoreTimers::<String, ()>::open("timers", 0, store.clone() as Rc<dyn KvStore>, true)
                .unwrap();
        for (t, key) in [(10, "a"), (20, "b"), (30, "c")] {
            texts.register(t, &key.to_string(), &()).unwrap();
        }
        assert!(
            !store.data.borrow().is_empty(),
            "a capacity of one writes timers to the store"
        );
        drop(texts);
        let mut numbers =
            StoreTimers::<u64, ()>::open("timers", 0, store as Rc<dyn KvStore>, true).unwrap();
        let e = match numbers.pop_due(Timestamp::MAX) {
            Err(e) => e,
            Ok(due) => panic!(
                "timers of text keys decoded as numbers: {:?}",
                due.is_some()
            ),
        };
        assert!(e.is_deterministic(), "{e}");
        assert!(
            e.to_string()
                .contains("state 'timers' does not decode as the type the job declares"),
            "{e}"
        );
    }
}
