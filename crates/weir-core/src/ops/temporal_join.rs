//! The event-time temporal join behind `KeyedStream::temporal_join` (Flink SQL's
//! `JOIN ... FOR SYSTEM_TIME AS OF`): each record of a stream meets the version of a
//! table row that was valid at the record's event time.
//!
//! The table arrives as a keyed changelog ([`Change`]) with event times: an insert or update
//! at time `v` makes its new value the row's version from `v` on, a delete makes the row
//! absent from `v` on. Per key, keyed map state holds the versions (time → value, `None`
//! for a delete) and the records waiting for the watermark (a `TimeBuffer`). A record at
//! time `t` is emitted once the watermark reaches `t`, joined with the newest version at or
//! before `t` — so versions that arrive out of order before then still count. Then every
//! version older than the newest one at or below the watermark is removed (no waiting
//! record can need it any more); a trailing delete is removed as well. An event-time timer
//! per record time and per version time drives both. A record or a version at or behind
//! the watermark is late — the version a late record needs may have been removed, and a
//! late version could contradict versions already removed — so it takes no part: it goes
//! to the late side output of its input, or is dropped and counted in
//! `join_late_records_dropped_total`.

use super::co::{CoContext, CoProcessFunction};
use super::interval_join::{Late, no_timestamp};
use super::time_buffer::TimeBuffer;
use crate::changelog::Change;
use crate::data::{Data, Key};
use crate::error::Result;
use crate::state::{MapState, StateContext};
use crate::time::Timestamp;
use crate::timer::TimeDomain;
use std::marker::PhantomData;
use std::sync::Arc;

/// The user's function: the record and the version valid at its time (`None`: no row);
/// `None` back emits nothing (inner join without a row).
pub(crate) type TemporalFn<T, V, O> = Arc<dyn Fn(T, Option<&V>) -> Option<O> + Send + Sync>;

/// The temporal join as a keyed two-input function.
pub(crate) struct TemporalJoinFn<K, T, CK, V, O> {
    versions: MapState<Timestamp, Option<V>>,
    waiting: TimeBuffer<T>,
    late: Late<T>,
    late_versions: Late<Change<CK, V>>,
    f: TemporalFn<T, V, O>,
    _p: PhantomData<fn(K, CK)>,
}

impl<K: Key, T: Data, CK: Data, V: Data, O: 'static> TemporalJoinFn<K, T, CK, V, O> {
    pub(crate) fn new(
        state: &mut StateContext<K>,
        late: Late<T>,
        late_versions: Late<Change<CK, V>>,
        f: TemporalFn<T, V, O>,
    ) -> Result<Self> {
        Ok(TemporalJoinFn {
            versions: state.map_state("temporal-join-versions")?,
            waiting: TimeBuffer::new(state, "temporal-join-waiting")?,
            late,
            late_versions,
            f,
            _p: PhantomData,
        })
    }

    /// Removes the versions no record after `time` can need: all older than the newest
    /// version at or before `time`, and that one too when it is a delete.
    fn prune(&mut self, time: Timestamp) -> Result<()> {
        let versions = self.versions.entries()?;
        let Some(base) = versions.iter().rposition(|(v, _)| *v <= time) else {
            return Ok(());
        };
        for (v, _) in &versions[..base] {
            self.versions.remove(v)?;
        }
        if versions[base].1.is_none() {
            self.versions.remove(&versions[base].0)?;
        }
        Ok(())
    }
}

impl<K: Key, T: Data, CK: Data, V: Data, O: 'static> CoProcessFunction<K, T, Change<CK, V>, O>
    for TemporalJoinFn<K, T, CK, V, O>
{
    fn process1(&mut self, record: T, ctx: &mut CoContext<'_, K, O>) -> Result<()> {
        let t = ctx
            .timestamp()
            .ok_or_else(|| no_timestamp("temporal join", "probe (left)"))?;
        if t <= ctx.current_watermark() {
            return self.late.handle(record, ctx);
        }
        self.waiting.add(t, record)?;
        ctx.register_event_time_timer(t);
        Ok(())
    }

    fn process2(&mut self, change: Change<CK, V>, ctx: &mut CoContext<'_, K, O>) -> Result<()> {
        let v = ctx
            .timestamp()
            .ok_or_else(|| no_timestamp("temporal join", "versioned (right)"))?;
        if v <= ctx.current_watermark() {
            return self.late_versions.handle(change, ctx);
        }
        self.versions.put(v, change.new_value().cloned())?;
        ctx.register_event_time_timer(v);
        Ok(())
    }

    fn on_timer(
        &mut self,
        time: Timestamp,
        _domain: TimeDomain,
        ctx: &mut CoContext<'_, K, O>,
    ) -> Result<()> {
        // The timer at `time` is that of the records waiting at `time` (and of versions).
        let records = self.waiting.take(time)?;
        if !records.is_empty() {
            let versions = self.versions.entries()?;
            let version = versions
                .iter()
                .rev()
                .find(|(v, _)| *v <= time)
                .and_then(|(_, value)| value.as_ref());
            for r in records {
                if let Some(out) = (self.f)(r, version) {
                    ctx.emit_at(out, time);
                }
            }
        }
        self.prune(time)
    }
}
