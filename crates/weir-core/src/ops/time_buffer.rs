//! Records of the current key buffered by event time, for the interval and temporal joins.
//!
//! Two keyed map states: time → how many records arrived at that time, and (time, index)
//! → record. Adding a record writes one entry (no list that grows and is copied on each
//! append), the times can be listed without reading the records, and the records of one
//! time are read or removed by index, in arrival order. Being plain map states, both live
//! in whichever backend the job uses and split by key group on rescale.

use crate::data::{Data, Key};
use crate::error::Result;
use crate::metrics::Gauge;
use crate::state::{MapState, StateContext};
use crate::time::Timestamp;

/// The records of the current key, by event time.
pub(crate) struct TimeBuffer<T> {
    counts: MapState<Timestamp, u32>,
    records: MapState<(Timestamp, u32), T>,
    /// Records added minus records taken by this subtask since it started (never below 0:
    /// records restored from a checkpoint are not counted in).
    buffered: Option<Gauge>,
}

impl<T: Data> TimeBuffer<T> {
    /// Creates the two states, named `name-times` and `name-records`.
    pub(crate) fn new<K: Key>(state: &mut StateContext<K>, name: &str) -> Result<Self> {
        Ok(TimeBuffer {
            counts: state.map_state(&format!("{name}-times"))?,
            records: state.map_state(&format!("{name}-records"))?,
            buffered: None,
        })
    }

    /// Counts the records in the buffer into `gauge`.
    pub(crate) fn counted(&mut self, gauge: Gauge) {
        self.buffered = Some(gauge);
    }

    /// Appends `value` to the records at `ts`.
    pub(crate) fn add(&mut self, ts: Timestamp, value: T) -> Result<()> {
        let n = self.counts.get(&ts)?.unwrap_or(0);
        self.records.put((ts, n), value)?;
        if let Some(g) = &self.buffered {
            g.set(g.get() + 1);
        }
        self.counts.put(ts, n + 1)
    }

    /// The times that hold records, ascending, with how many each holds.
    pub(crate) fn times(&self) -> Result<Vec<(Timestamp, u32)>> {
        self.counts.entries()
    }

    /// The `n` records at `ts`, in arrival order.
    pub(crate) fn at(&self, ts: Timestamp, n: u32) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n {
            if let Some(v) = self.records.get(&(ts, i))? {
                out.push(v);
            }
        }
        Ok(out)
    }

    /// Removes and returns the records at `ts`, in arrival order.
    pub(crate) fn take(&mut self, ts: Timestamp) -> Result<Vec<T>> {
        let Some(n) = self.counts.remove(&ts)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n {
            if let Some(v) = self.records.remove(&(ts, i))? {
                out.push(v);
            }
        }
        if let Some(g) = &self.buffered {
            g.set((g.get() - out.len() as i64).max(0));
        }
        Ok(out)
    }
}
