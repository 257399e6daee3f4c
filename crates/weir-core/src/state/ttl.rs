//! Time-to-live wrappers: value, list and map state that store each write's wall-clock
//! time next to the data and hide what has expired.

use super::{ListAccess, ListState, MapAccess, MapState, ValueAccess, ValueState};
use crate::error::Result;

/// A value state with a time-to-live: stores the write time next to the value.
pub(super) struct Ttl<V> {
    pub(super) inner: ValueState<(V, i64)>,
    pub(super) ttl_ms: i64,
}

/// Wall-clock time in Unix milliseconds (0 before the epoch).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl<V> ValueAccess<V> for Ttl<V> {
    fn get(&self) -> Result<Option<V>> {
        Ok(match self.inner.get()? {
            Some((v, written)) if alive(written, now_ms(), self.ttl_ms) => Some(v),
            _ => None,
        })
    }
    fn set(&mut self, value: V) -> Result<()> {
        self.inner.set((value, now_ms()))
    }
    fn clear(&mut self) -> Result<()> {
        self.inner.clear()
    }
}

pub(super) fn ttl_ms(ttl: std::time::Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// True when something written at `written` (Unix ms) is still alive at `now`.
fn alive(written: i64, now: i64, ttl_ms: i64) -> bool {
    now.saturating_sub(written) < ttl_ms
}

/// A list state with a time-to-live per element: stores each element's write time.
pub(super) struct TtlList<V> {
    pub(super) inner: ListState<(V, i64)>,
    pub(super) ttl_ms: i64,
}

impl<V> ListAccess<V> for TtlList<V> {
    fn get(&self) -> Result<Vec<V>> {
        let now = now_ms();
        Ok(self
            .inner
            .get()?
            .into_iter()
            .filter(|(_, w)| alive(*w, now, self.ttl_ms))
            .map(|(v, _)| v)
            .collect())
    }
    fn add(&mut self, value: V) -> Result<()> {
        self.inner.add((value, now_ms()))
    }
    fn update(&mut self, values: Vec<V>) -> Result<()> {
        let now = now_ms();
        self.inner
            .update(values.into_iter().map(|v| (v, now)).collect())
    }
    fn clear(&mut self) -> Result<()> {
        self.inner.clear()
    }
    fn read_from(&self, mut from: usize, limit: usize) -> Result<(Vec<V>, usize)> {
        let now = now_ms();
        // Batches of expired elements are skipped, so that an empty batch means the end.
        loop {
            let (batch, next) = self.inner.inner.read_from(from, limit)?;
            let alive: Vec<V> = batch
                .into_iter()
                .filter(|(_, w)| alive(*w, now, self.ttl_ms))
                .map(|(v, _)| v)
                .collect();
            if !alive.is_empty() || next <= from {
                return Ok((alive, next));
            }
            from = next;
        }
    }
}

/// A map state with a time-to-live per entry: stores each entry's write time.
pub(super) struct TtlMap<UK, UV> {
    pub(super) inner: MapState<UK, (UV, i64)>,
    pub(super) ttl_ms: i64,
}

impl<UK: Clone, UV> MapAccess<UK, UV> for TtlMap<UK, UV> {
    fn get(&self, k: &UK) -> Result<Option<UV>> {
        let now = now_ms();
        Ok(self
            .inner
            .get(k)?
            .filter(|(_, w)| alive(*w, now, self.ttl_ms))
            .map(|(v, _)| v))
    }
    fn put(&mut self, k: UK, v: UV) -> Result<()> {
        self.inner.put(k, (v, now_ms()))
    }
    fn remove(&mut self, k: &UK) -> Result<Option<UV>> {
        let now = now_ms();
        Ok(self
            .inner
            .remove(k)?
            .filter(|(_, w)| alive(*w, now, self.ttl_ms))
            .map(|(v, _)| v))
    }
    fn entries(&self) -> Result<Vec<(UK, UV)>> {
        let now = now_ms();
        Ok(self
            .inner
            .entries()?
            .into_iter()
            .filter(|(_, (_, w))| alive(*w, now, self.ttl_ms))
            .map(|(k, (v, _))| (k, v))
            .collect())
    }
    fn clear(&mut self) -> Result<()> {
        self.inner.clear()
    }
    fn entries_after(&self, after: Option<&UK>, limit: usize) -> Result<Vec<(UK, UV)>> {
        let now = now_ms();
        // Batches of expired entries are skipped, so that an empty batch means the end.
        let mut batch = self.inner.inner.entries_after(after, limit)?;
        loop {
            let Some(last) = batch.last().map(|(k, _)| k.clone()) else {
                return Ok(Vec::new());
            };
            let alive: Vec<(UK, UV)> = batch
                .into_iter()
                .filter(|(_, (_, w))| alive(*w, now, self.ttl_ms))
                .map(|(k, (v, _))| (k, v))
                .collect();
            if !alive.is_empty() {
                return Ok(alive);
            }
            batch = self.inner.inner.entries_after(Some(&last), limit)?;
        }
    }
}
