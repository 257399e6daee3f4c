//! `KeyedStream::interval_join`: pairs of records of two keyed streams whose event times
//! lie within an interval of each other ([`IntervalJoin`] → [`IntervalJoined`]).

use super::connected::two_input_node;
use super::keyed::state_context;
use super::{KeyedStream, OutputTag, Stream};
use crate::data::{Data, Key};
use crate::ops::interval_join::{ApplyJoin, Bounds, IntervalJoinFn, Late, ProcessJoinFunction};
use crate::ops::side::SideDecls;
use crate::ops::{OpInfo, guard};
use crate::time::Timestamp;
use std::sync::Arc;

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Joins with another keyed stream by event time (Flink's interval join): choose the
    /// interval with [`IntervalJoin::between`]. See [`IntervalJoined`] for the semantics.
    pub fn interval_join<B: Data>(&self, other: &KeyedStream<K, B>) -> IntervalJoin<K, T, B> {
        IntervalJoin {
            a: self.clone(),
            b: other.clone(),
        }
    }
}

/// Two keyed streams to be joined by event time; set the interval with
/// [`IntervalJoin::between`].
pub struct IntervalJoin<K, A, B> {
    a: KeyedStream<K, A>,
    b: KeyedStream<K, B>,
}

impl<K: Key, A: Data, B: Data> IntervalJoin<K, A, B> {
    /// A left record at time `t` joins the right records of its key at times in
    /// `[t + lower, t + upper]` (both bounds inclusive; make them exclusive with
    /// [`IntervalJoined::lower_bound_exclusive`] / [`IntervalJoined::upper_bound_exclusive`]).
    /// Bounds may be negative: `between(-5, 0)` pairs a left record with right records of
    /// the five time units before it.
    pub fn between(self, lower: Timestamp, upper: Timestamp) -> IntervalJoined<K, A, B> {
        IntervalJoined {
            a: self.a,
            b: self.b,
            lower,
            upper,
            lower_exclusive: false,
            upper_exclusive: false,
            late_left: None,
            late_right: None,
        }
    }
}

/// An interval join waiting for its join function ([`IntervalJoined::apply`] or
/// [`IntervalJoined::process`]).
///
/// Works in event time only: both inputs need timestamps and watermarks. Every pair of a
/// left record at `t` and a right record of the same key at a time in
/// `[t + lower, t + upper]` is emitted exactly once, as soon as the second of the two
/// arrives, with the larger of the two times. Records are buffered in keyed state (heap
/// or RocksDB, whichever the job uses) and removed once the watermark has passed the last
/// time a future record could still pair with them (`t + upper` for a left record,
/// `t - lower` for a right one), so the state stays as large as the interval and the
/// out-of-orderness make it. A record at or behind the watermark is late: it would miss
/// pairs whose partner was already removed, so it is not joined at all; it goes to the side
/// output given with [`IntervalJoined::side_output_late_left`] /
/// [`IntervalJoined::side_output_late_right`], or is dropped and counted in the metric
/// `join_late_records_dropped_total` (labels `operator`, `subtask`, `input`).
///
/// ```
/// use weir_core::prelude::*;
///
/// let p = Pipeline::new();
/// // (auction, seller) opened at some time; (auction, price) bids.
/// let auctions = p
///     .from_timestamped(vec![((1u32, "ann".to_string()), 100), ((2, "bob".to_string()), 150)])
///     .with_watermarks(WatermarkStrategy::bounded_out_of_orderness(10));
/// let bids = p
///     .from_timestamped(vec![((1u32, 30i64), 130), ((2, 70), 140), ((1, 45), 260)])
///     .with_watermarks(WatermarkStrategy::bounded_out_of_orderness(10));
/// // Bids within 100 time units after the auction opened: (1, ann, 30) only — bid 2@140
/// // came before its auction opened, bid 1@260 too late.
/// let early_bids = auctions
///     .key_by(|a| a.0)
///     .interval_join(&bids.key_by(|b| b.0))
///     .between(0, 100)
///     .apply(|auction, bid| (auction.0, auction.1, bid.1))
///     .collect();
/// # let _ = early_bids;
/// ```
pub struct IntervalJoined<K, A, B> {
    a: KeyedStream<K, A>,
    b: KeyedStream<K, B>,
    lower: Timestamp,
    upper: Timestamp,
    lower_exclusive: bool,
    upper_exclusive: bool,
    late_left: Option<OutputTag<A>>,
    late_right: Option<OutputTag<B>>,
}

impl<K: Key, A: Data, B: Data> IntervalJoined<K, A, B> {
    /// Excludes the lower bound: right records at exactly `t + lower` do not pair.
    pub fn lower_bound_exclusive(mut self) -> Self {
        self.lower_exclusive = true;
        self
    }

    /// Excludes the upper bound: right records at exactly `t + upper` do not pair.
    pub fn upper_bound_exclusive(mut self) -> Self {
        self.upper_exclusive = true;
        self
    }

    /// Sends late left records to the side output `tag` (read it with
    /// [`Stream::side_output`] on the result) instead of dropping them.
    pub fn side_output_late_left(mut self, tag: &OutputTag<A>) -> Self {
        self.late_left = Some(tag.clone());
        self
    }

    /// Sends late right records to the side output `tag` instead of dropping them.
    pub fn side_output_late_right(mut self, tag: &OutputTag<B>) -> Self {
        self.late_right = Some(tag.clone());
        self
    }

    /// Emits `f(left, right)` for every pair, at the larger of the two times.
    ///
    /// # Panics
    /// See [`IntervalJoined::process`].
    pub fn apply<O: Data>(self, f: impl Fn(A, B) -> O + Send + Sync + 'static) -> Stream<O> {
        let f: Arc<dyn Fn(A, B) -> O + Send + Sync> = Arc::new(f);
        self.process(move || ApplyJoin(f.clone()))
    }

    /// Runs a [`ProcessJoinFunction`] for every pair; `make` creates each subtask's
    /// instance on its thread. Declare further side outputs the function emits to with
    /// [`Stream::with_side_output`] on the result.
    ///
    /// # Panics
    /// When the interval is empty: the lower bound above the upper one (after exclusive
    /// bounds are applied), e.g. `between(10, 5)`.
    pub fn process<O: Data, P: ProcessJoinFunction<A, B, O>>(
        self,
        make: impl Fn() -> P + Send + Sync + 'static,
    ) -> Stream<O> {
        let bounds = Bounds {
            lower: self.lower.saturating_add(self.lower_exclusive as i64),
            upper: self.upper.saturating_sub(self.upper_exclusive as i64),
        };
        assert!(
            bounds.lower <= bounds.upper,
            "the interval join's interval is empty: lower bound {}{} is above upper bound {}{}; \
             use between(lower, upper) with lower <= upper",
            self.lower,
            if self.lower_exclusive {
                " (exclusive)"
            } else {
                ""
            },
            self.upper,
            if self.upper_exclusive {
                " (exclusive)"
            } else {
                ""
            },
        );
        let (ka, kb) = (self.a.key_fn.clone(), self.b.key_fn.clone());
        let (late_a, late_b) = (self.late_left.clone(), self.late_right.clone());
        let mut out = two_input_node(
            &self.a.stream,
            self.a.partitioning(),
            &self.b.stream,
            self.b.partitioning(),
            "interval-join",
            true,
            Some(SideDecls::default()),
            move |ctx, out, side| {
                let info = OpInfo::from_ctx(ctx);
                let mut state = state_context::<K>(ctx)?;
                let f = guard(&info, || Ok(make()))?;
                let join = IntervalJoinFn::new(
                    &mut state,
                    bounds,
                    Late::new(late_a.clone(), &info, "left"),
                    Late::new(late_b.clone(), &info, "right"),
                    f,
                )?
                .with_buffer_gauges(&info);
                crate::ops::co::build(ka.clone(), kb.clone(), join, state, out, side, info)
            },
        );
        if let Some(tag) = &self.late_left {
            out = out.with_side_output(tag);
        }
        if let Some(tag) = &self.late_right {
            out = out.with_side_output(tag);
        }
        out
    }
}
