//! The process function of a non-keyed stream (Flink's `ProcessFunction`): one call per
//! record, with its timestamp, the watermark, the main output and side outputs. It has no
//! keyed state and no timers: those need a key ([`super::keyed::KeyedProcessFunction`]).

use super::side::SideOutputs;
use super::{OpInfo, guard};
use crate::data::Data;
use crate::dsl::OutputTag;
use crate::error::Result;
use crate::output::{Collector, Control, Output};
use crate::time::{MIN_WATERMARK, NO_TIMESTAMP, Timestamp};

/// A function over a non-keyed stream (Flink's `ProcessFunction`): called once per
/// record, it may emit any number of records to the main output and to side outputs.
/// One instance runs per subtask, created on the subtask's thread by the factory given to
/// [`crate::dsl::Stream::process`], so it may keep plain fields across records (they are
/// not checkpointed). For keyed state and timers, key the stream first and use a
/// [`super::keyed::KeyedProcessFunction`].
///
/// ```
/// use weir_core::prelude::*;
///
/// /// Parses "name,amount" lines; lines that do not parse go to a side output.
/// struct Parse { rejected: OutputTag<String> }
///
/// impl ProcessFunction<String, (String, i64)> for Parse {
///     fn process(&mut self, line: String, ctx: &mut ProcessContext<'_, (String, i64)>) -> weir_core::Result<()> {
///         match line.split_once(',').and_then(|(n, a)| Some((n, a.parse().ok()?))) {
///             Some((name, amount)) => ctx.emit((name.to_string(), amount)),
///             None => ctx.output(&self.rejected, line)?,
///         }
///         Ok(())
///     }
/// }
///
/// let p = Pipeline::new();
/// let rejected = OutputTag::<String>::new("rejected");
/// let tag = rejected.clone();
/// let parsed = p
///     .from_collection(vec!["ann,5".to_string(), "bo;7".to_string()])
///     .process(move || Parse { rejected: tag.clone() })
///     .with_side_output(&rejected);
/// let _rejected = parsed.side_output(&rejected).collect();
/// let _parsed = parsed.collect();
/// ```
pub trait ProcessFunction<I, O>: 'static {
    /// Called for each record.
    fn process(&mut self, value: I, ctx: &mut ProcessContext<'_, O>) -> Result<()>;
}

/// What a [`ProcessFunction`] sees while it handles a record.
pub struct ProcessContext<'a, O> {
    timestamp: Option<Timestamp>,
    watermark: Timestamp,
    processing_time: i64,
    out: &'a mut Collector<O>,
    side: &'a mut SideOutputs,
}

impl<O> ProcessContext<'_, O> {
    /// The timestamp of the current record, if it has one.
    pub fn timestamp(&self) -> Option<Timestamp> {
        self.timestamp
    }
    /// The operator's current watermark.
    pub fn current_watermark(&self) -> Timestamp {
        self.watermark
    }
    /// Wall-clock time in milliseconds since the Unix epoch, as of the last tick.
    pub fn current_processing_time(&self) -> i64 {
        self.processing_time
    }
    /// Emits a record with the current record's timestamp.
    pub fn emit(&mut self, value: O) {
        self.out.emit(value)
    }
    /// Emits a record with the given timestamp.
    pub fn emit_at(&mut self, value: O, ts: Timestamp) {
        self.out.emit_at(value, ts)
    }
    /// Emits a record to the side output `tag`, with the current record's timestamp.
    ///
    /// # Errors
    /// [`crate::Error::Config`], naming the tag, when the operator does not declare this
    /// side output ([`crate::dsl::Stream::with_side_output`]).
    pub fn output<S: Data>(&mut self, tag: &OutputTag<S>, value: S) -> Result<()> {
        self.side.emit(tag, value)
    }
}

/// Runs a [`ProcessFunction`].
pub(crate) struct ProcessOp<O, P> {
    pub(crate) f: P,
    pub(crate) buf: Collector<O>,
    pub(crate) side: SideOutputs,
    pub(crate) out: Box<dyn Output<O>>,
    pub(crate) info: OpInfo,
    pub(crate) watermark: Timestamp,
    pub(crate) now: i64,
}

impl<O, P> ProcessOp<O, P> {
    pub(crate) fn new(f: P, side: SideOutputs, out: Box<dyn Output<O>>, info: OpInfo) -> Self {
        ProcessOp {
            f,
            buf: Collector::new(),
            side,
            out,
            info,
            watermark: MIN_WATERMARK,
            now: 0,
        }
    }
}

impl<I, O, P: ProcessFunction<I, O>> Output<I> for ProcessOp<O, P> {
    #[inline]
    fn record(&mut self, value: I, ts: Timestamp) -> Result<()> {
        let ProcessOp {
            f,
            buf,
            side,
            info,
            watermark,
            now,
            ..
        } = self;
        let mut ctx = ProcessContext {
            timestamp: (ts != NO_TIMESTAMP).then_some(ts),
            watermark: *watermark,
            processing_time: *now,
            out: buf,
            side,
        };
        guard(info, || f.process(value, &mut ctx))?;
        if !self.buf.is_empty() {
            self.buf.drain_into(&mut *self.out, ts)?;
        }
        self.side.drain(ts)
    }

    fn control(&mut self, event: Control) -> Result<()> {
        match event {
            Control::Watermark(w) => self.watermark = w,
            Control::Tick(now) => self.now = now,
            Control::Idle(_)
            | Control::Barrier(_)
            | Control::End
            | Control::LatencyMarker(_)
            | Control::Flush => {}
        }
        self.side.control(event)?;
        self.out.control(event)
    }
}
