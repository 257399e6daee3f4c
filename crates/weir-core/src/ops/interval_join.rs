//! The interval join behind `KeyedStream::interval_join` (Flink's `IntervalJoinOperator`):
//! a left record at time `t` meets every right record of the same key at a time in
//! `[t + lower, t + upper]`, in event time.
//!
//! Both inputs are buffered in keyed map state by time (a `TimeBuffer`), so the heap and the RocksDB backend hold them alike and a restore at another
//! parallelism splits them by key group. A record is paired with the other side's buffer
//! when it arrives, then kept only as long as a future record of the other side can still
//! fall into its interval: an event-time timer removes a left record once the watermark
//! reaches `t + upper`, a right record once it reaches `t - lower`. A record at or behind
//! the watermark is late: it goes to the side output given for its side, or is dropped and
//! counted in `join_late_records_dropped_total`. The gauge `join_buffered_records` (labels
//! `operator`, `subtask`, `input`) shows how many records each side holds.

use super::OpInfo;
use super::co::{CoContext, CoProcessFunction};
use super::side::SideOutputs;
use super::time_buffer::TimeBuffer;
use crate::data::{Data, Key};
use crate::dsl::OutputTag;
use crate::error::{Error, Result};
use crate::metrics::{self, Counter};
use crate::output::Collector;
use crate::state::StateContext;
use crate::time::Timestamp;
use crate::timer::TimeDomain;
use std::marker::PhantomData;

/// A function called for every pair of an interval join (Flink's `ProcessJoinFunction`).
///
/// ```
/// use weir_core::prelude::*;
///
/// /// Emits (auction, bid price, seconds from opening to bid).
/// struct BidDelay;
/// impl ProcessJoinFunction<(u32, i64), (u32, i64), (u32, i64, i64)> for BidDelay {
///     fn process_element(
///         &mut self,
///         auction: (u32, i64),
///         bid: (u32, i64),
///         ctx: &mut JoinContext<'_, (u32, i64, i64)>,
///     ) -> weir_core::Result<()> {
///         let delay = ctx.right_timestamp() - ctx.left_timestamp();
///         ctx.emit((auction.0, bid.1, delay));
///         Ok(())
///     }
/// }
///
/// let p = Pipeline::new();
/// let auctions = p.from_timestamped(vec![((7u32, 0i64), 100)])
///     .with_watermarks(WatermarkStrategy::monotonous());
/// let bids = p.from_timestamped(vec![((7u32, 42i64), 130)])
///     .with_watermarks(WatermarkStrategy::monotonous());
/// let _delays = auctions
///     .key_by(|a| a.0)
///     .interval_join(&bids.key_by(|b| b.0))
///     .between(0, 60)
///     .process(|| BidDelay)
///     .collect();
/// ```
pub trait ProcessJoinFunction<A, B, O>: 'static {
    /// Called once for each pair of a left and a right record of one key whose times
    /// match; emitted records get the larger of the two times unless set otherwise.
    fn process_element(&mut self, left: A, right: B, ctx: &mut JoinContext<'_, O>) -> Result<()>;
}

/// What a [`ProcessJoinFunction`] sees for one pair: both records' times, the output and
/// the side outputs (Flink's `ProcessJoinFunction.Context`).
pub struct JoinContext<'a, O> {
    out: &'a mut Collector<O>,
    side: &'a mut SideOutputs,
    left: Timestamp,
    right: Timestamp,
}

impl<'a, O> JoinContext<'a, O> {
    fn new<K: Key>(ctx: &'a mut CoContext<'_, K, O>, left: Timestamp, right: Timestamp) -> Self {
        let (out, side) = ctx.outputs();
        JoinContext {
            out,
            side,
            left,
            right,
        }
    }
    /// The left record's event time.
    pub fn left_timestamp(&self) -> Timestamp {
        self.left
    }
    /// The right record's event time.
    pub fn right_timestamp(&self) -> Timestamp {
        self.right
    }
    /// The time emitted records get: the larger of the two records' times.
    pub fn timestamp(&self) -> Timestamp {
        self.left.max(self.right)
    }
    /// Emits a record at [`Self::timestamp`].
    pub fn emit(&mut self, value: O) {
        let ts = self.timestamp();
        self.out.emit_at(value, ts)
    }
    /// Emits a record at the given time.
    pub fn emit_at(&mut self, value: O, ts: Timestamp) {
        self.out.emit_at(value, ts)
    }
    /// Emits to the side output `tag` (declare it with
    /// [`crate::dsl::Stream::with_side_output`] on the join's result), at the time of
    /// the record whose arrival completed the pair.
    pub fn output<S: Data>(&mut self, tag: &OutputTag<S>, value: S) -> Result<()> {
        self.side.emit(tag, value)
    }
}

/// The join's bounds, relative to a left record's time, both inclusive (exclusive bounds
/// are turned into inclusive ones by the DSL).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    pub(crate) lower: Timestamp,
    pub(crate) upper: Timestamp,
}

impl Bounds {
    /// True when a right record at `right` falls into the interval of a left one at `left`.
    fn matches(&self, left: Timestamp, right: Timestamp) -> bool {
        left.saturating_add(self.lower) <= right && right <= left.saturating_add(self.upper)
    }
    /// When a left record at `t` can no longer meet a future right record.
    fn left_expiry(&self, t: Timestamp) -> Timestamp {
        t.saturating_add(self.upper)
    }
    /// When a right record at `t` can no longer meet a future left record.
    fn right_expiry(&self, t: Timestamp) -> Timestamp {
        t.saturating_sub(self.lower)
    }
}

/// Where late records of one side go.
pub(crate) struct Late<T> {
    tag: Option<OutputTag<T>>,
    dropped: Counter,
}

impl<T: Data> Late<T> {
    pub(crate) fn new(tag: Option<OutputTag<T>>, info: &OpInfo, side: &str) -> Self {
        let subtask = info.subtask.to_string();
        let labels = [
            ("operator", &*info.name),
            ("subtask", subtask.as_str()),
            ("input", side),
        ];
        Late {
            tag,
            dropped: metrics::counter(
                "join_late_records_dropped_total",
                "Records an interval or temporal join dropped because they arrived at or behind the watermark (and no late side output was given).",
                &labels,
            ),
        }
    }

    pub(crate) fn handle<K: Key, O>(&self, value: T, ctx: &mut CoContext<'_, K, O>) -> Result<()> {
        match &self.tag {
            Some(tag) => ctx.output(tag, value),
            None => {
                self.dropped.add(1);
                Ok(())
            }
        }
    }
}

/// The error for a record without an event time.
pub(crate) fn no_timestamp(join: &str, side: &str) -> Error {
    Error::Config(format!(
        "the {join} works in event time, but a record of its {side} input has no timestamp; \
         give that input timestamps and watermarks, e.g. \
         .with_watermarks(WatermarkStrategy::bounded_out_of_orderness(..).with_timestamps(..)) \
         or a timestamped source"
    ))
}

/// The interval join as a keyed two-input function.
pub(crate) struct IntervalJoinFn<K, A, B, O, P> {
    bounds: Bounds,
    left: TimeBuffer<A>,
    right: TimeBuffer<B>,
    late_left: Late<A>,
    late_right: Late<B>,
    f: P,
    _p: PhantomData<fn(K) -> O>,
}

impl<K: Key, A: Data, B: Data, O: 'static, P: ProcessJoinFunction<A, B, O>>
    IntervalJoinFn<K, A, B, O, P>
{
    pub(crate) fn new(
        state: &mut StateContext<K>,
        bounds: Bounds,
        late_left: Late<A>,
        late_right: Late<B>,
        f: P,
    ) -> Result<Self> {
        Ok(IntervalJoinFn {
            bounds,
            left: TimeBuffer::new(state, "interval-join-left")?,
            right: TimeBuffer::new(state, "interval-join-right")?,
            late_left,
            late_right,
            f,
            _p: PhantomData,
        })
    }

    /// Counts the records each side buffers in the gauge `join_buffered_records`.
    pub(crate) fn with_buffer_gauges(mut self, info: &OpInfo) -> Self {
        let subtask = info.subtask.to_string();
        let gauge = |side: &str| {
            let g = metrics::gauge(
                "join_buffered_records",
                "Records an interval join holds in its state for one input, waiting for the watermark to pass their interval (counted since the subtask started).",
                &[
                    ("operator", &*info.name),
                    ("subtask", subtask.as_str()),
                    ("input", side),
                ],
            );
            // A subtask starting over (a restart in the same process) counts afresh.
            g.set(0);
            g
        };
        self.left.counted(gauge("left"));
        self.right.counted(gauge("right"));
        self
    }
}

impl<K: Key, A: Data, B: Data, O: 'static, P: ProcessJoinFunction<A, B, O>>
    CoProcessFunction<K, A, B, O> for IntervalJoinFn<K, A, B, O, P>
{
    fn process1(&mut self, a: A, ctx: &mut CoContext<'_, K, O>) -> Result<()> {
        let t = ctx
            .timestamp()
            .ok_or_else(|| no_timestamp("interval join", "left"))?;
        let wm = ctx.current_watermark();
        if t <= wm {
            return self.late_left.handle(a, ctx);
        }
        for (rt, n) in self.right.times()? {
            if self.bounds.matches(t, rt) {
                for b in self.right.at(rt, n)? {
                    let mut jc = JoinContext::new(ctx, t, rt);
                    self.f.process_element(a.clone(), b, &mut jc)?;
                }
            }
        }
        let expiry = self.bounds.left_expiry(t);
        if expiry > wm {
            self.left.add(t, a)?;
            ctx.register_event_time_timer(expiry);
        }
        Ok(())
    }

    fn process2(&mut self, b: B, ctx: &mut CoContext<'_, K, O>) -> Result<()> {
        let rt = ctx
            .timestamp()
            .ok_or_else(|| no_timestamp("interval join", "right"))?;
        let wm = ctx.current_watermark();
        if rt <= wm {
            return self.late_right.handle(b, ctx);
        }
        for (t, n) in self.left.times()? {
            if self.bounds.matches(t, rt) {
                for a in self.left.at(t, n)? {
                    let mut jc = JoinContext::new(ctx, t, rt);
                    self.f.process_element(a, b.clone(), &mut jc)?;
                }
            }
        }
        let expiry = self.bounds.right_expiry(rt);
        if expiry > wm {
            self.right.add(rt, b)?;
            ctx.register_event_time_timer(expiry);
        }
        Ok(())
    }

    fn on_timer(
        &mut self,
        time: Timestamp,
        _domain: TimeDomain,
        _ctx: &mut CoContext<'_, K, O>,
    ) -> Result<()> {
        // The timer at `time` is the expiry of left records at `time - upper` and of right
        // records at `time + lower` (no other time expires then).
        if let Some(t) = time.checked_sub(self.bounds.upper)
            && self.bounds.left_expiry(t) == time
        {
            self.left.take(t)?;
        }
        if let Some(t) = time.checked_add(self.bounds.lower)
            && self.bounds.right_expiry(t) == time
        {
            self.right.take(t)?;
        }
        Ok(())
    }
}

/// A [`ProcessJoinFunction`] from a closure over the pair.
pub(crate) struct ApplyJoin<A, B, O>(pub(crate) std::sync::Arc<dyn Fn(A, B) -> O + Send + Sync>);

impl<A: 'static, B: 'static, O: 'static> ProcessJoinFunction<A, B, O> for ApplyJoin<A, B, O> {
    fn process_element(&mut self, left: A, right: B, ctx: &mut JoinContext<'_, O>) -> Result<()> {
        ctx.emit((self.0)(left, right));
        Ok(())
    }
}
