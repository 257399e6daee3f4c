//! `KeyedStream::temporal_join`: each record joined with the version of a table row valid
//! at the record's event time ([`TemporalJoin`]).

use super::connected::two_input_node;
use super::keyed::state_context;
use super::{KeyedStream, OutputTag, Stream};
use crate::changelog::Change;
use crate::data::{Data, Key};
use crate::ops::OpInfo;
use crate::ops::interval_join::Late;
use crate::ops::side::SideDecls;
use crate::ops::temporal_join::{TemporalFn, TemporalJoinFn};
use std::sync::Arc;

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Joins each record with the version of a table row that was valid at the record's
    /// event time (Flink SQL's `FOR SYSTEM_TIME AS OF`). `versions` is the table's
    /// changelog, keyed by the same key, with event times. See [`TemporalJoin`].
    pub fn temporal_join<CK: Data, V: Data>(
        &self,
        versions: &KeyedStream<K, Change<CK, V>>,
    ) -> TemporalJoin<K, T, CK, V> {
        TemporalJoin {
            a: self.clone(),
            b: versions.clone(),
            late: None,
            late_versions: None,
        }
    }
}

/// An event-time temporal join waiting for its join function: [`TemporalJoin::apply`]
/// (every record, with the row's version if there was one) or [`TemporalJoin::inner`]
/// (only records that found a row).
///
/// The right input is a changelog of [`Change`]s with event times: an insert or update at
/// time `v` makes its new value the row's version from `v` on; a delete at `v` means no row
/// from `v` on. A left record at time `t` meets the newest version at or before `t` (a
/// version at exactly `t` counts). It is emitted, at time `t`, when the watermark of the
/// join (the smaller of both inputs' watermarks) reaches `t`: until then versions may still
/// arrive out of order and count. Per key the join keeps the records waiting for the
/// watermark and the versions some waiting or future record can still need — the newest
/// version at or below the watermark and all later ones — in keyed state (heap or RocksDB,
/// whichever the job uses); older versions are removed as the watermark advances. Two
/// versions of a key at the same time: the one that arrives last wins.
///
/// A left record at or behind the watermark is late (the version it needs may be gone): it
/// goes to the side output given with [`TemporalJoin::side_output_late`], or is dropped and
/// counted in `join_late_records_dropped_total` (labels `operator`, `subtask`, `input`). A
/// version at or behind the watermark is late too (records before it were emitted already,
/// and the versions it would follow may be gone): it changes nothing and goes to
/// [`TemporalJoin::side_output_late_versions`], or is dropped and counted.
///
/// ```
/// use weir_core::prelude::*;
///
/// let p = Pipeline::new();
/// // Orders (id, currency, amount) and the changelog of exchange rates per currency.
/// let orders = p
///     .from_timestamped(vec![
///         ((1u32, "eur".to_string(), 100i64), 5),
///         ((2, "eur".to_string(), 100), 15),
///         ((3, "usd".to_string(), 50), 15),
///     ])
///     .with_watermarks(WatermarkStrategy::bounded_out_of_orderness(5));
/// let rates = p
///     .from_timestamped(vec![
///         (Change::Insert { key: "eur".to_string(), value: 110i64 }, 0),
///         (Change::Update { key: "eur".to_string(), old: 110, new: 120 }, 10),
///     ])
///     .with_watermarks(WatermarkStrategy::bounded_out_of_orderness(5));
/// // Order 1 gets the rate of time 0, order 2 the rate of time 10, order 3 no rate.
/// let priced = orders
///     .key_by(|o| o.1.clone())
///     .temporal_join(&rates.key_by(|c| c.key().clone()))
///     .apply(|order, rate: Option<&i64>| (order.0, rate.map(|r| order.2 * r)))
///     .collect();
/// # let _ = priced;
/// ```
pub struct TemporalJoin<K, T, CK, V> {
    a: KeyedStream<K, T>,
    b: KeyedStream<K, Change<CK, V>>,
    late: Option<OutputTag<T>>,
    late_versions: Option<OutputTag<Change<CK, V>>>,
}

impl<K: Key, T: Data, CK: Data, V: Data> TemporalJoin<K, T, CK, V> {
    /// Sends late left records to the side output `tag` (read it with
    /// [`Stream::side_output`] on the result) instead of dropping them.
    pub fn side_output_late(mut self, tag: &OutputTag<T>) -> Self {
        self.late = Some(tag.clone());
        self
    }

    /// Sends late versions (changes at or behind the watermark) to the side output `tag`
    /// instead of dropping them.
    pub fn side_output_late_versions(mut self, tag: &OutputTag<Change<CK, V>>) -> Self {
        self.late_versions = Some(tag.clone());
        self
    }

    /// A left join: emits `f(record, version)` for every record, with `None` when the row
    /// did not exist (or was deleted) at the record's time.
    pub fn apply<O: Data>(
        self,
        f: impl Fn(T, Option<&V>) -> O + Send + Sync + 'static,
    ) -> Stream<O> {
        self.build(Arc::new(move |t, v| Some(f(t, v))))
    }

    /// An inner join: emits `f(record, version)` for records whose row existed at their
    /// time; the others are not emitted.
    pub fn inner<O: Data>(self, f: impl Fn(T, &V) -> O + Send + Sync + 'static) -> Stream<O> {
        self.build(Arc::new(move |t, v| v.map(|v| f(t, v))))
    }

    fn build<O: Data>(self, f: TemporalFn<T, V, O>) -> Stream<O> {
        let (ka, kb) = (self.a.key_fn.clone(), self.b.key_fn.clone());
        let (late, late_versions) = (self.late.clone(), self.late_versions.clone());
        let out = two_input_node(
            &self.a.stream,
            self.a.partitioning(),
            &self.b.stream,
            self.b.partitioning(),
            "temporal-join",
            true,
            Some(SideDecls::default()),
            move |ctx, out, side| {
                let info = OpInfo::from_ctx(ctx);
                let mut state = state_context::<K>(ctx)?;
                let join = TemporalJoinFn::<K, T, CK, V, O>::new(
                    &mut state,
                    Late::new(late.clone(), &info, "left"),
                    Late::new(late_versions.clone(), &info, "right"),
                    f.clone(),
                )?;
                crate::ops::co::build(ka.clone(), kb.clone(), join, state, out, side, info)
            },
        );
        let mut out = out;
        if let Some(tag) = &self.late {
            out = out.with_side_output(tag);
        }
        if let Some(tag) = &self.late_versions {
            out = out.with_side_output(tag);
        }
        out
    }
}
