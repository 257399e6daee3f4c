//! The broadcast operator (Flink's broadcast state pattern): a data stream, keyed or not,
//! connected with a broadcast stream whose every record reaches every parallel instance.
//! The broadcast side writes broadcast state ([`BroadcastState`]); the data side reads it
//! ([`ReadOnlyBroadcastState`]) and keeps its own keyed state and timers.
//!
//! Owns the function trait, its two contexts and the operator. The broadcast maps and
//! their checkpoint format are in `state`; keyed state and timers are the keyed process
//! operator's, which this operator wraps for the data side.

mod state;

pub use state::{
    BroadcastState, BroadcastStateDescriptor, ReadOnlyBroadcastState, WritableBroadcastState,
};
pub(crate) use state::{BroadcastStates, Declaration};

use super::co::{Either, TwoInputs, split_inputs};
use super::keyed::{KeyedContext, KeyedProcess, KeyedProcessFunction};
use super::side::SideOutputs;
use super::{OpInfo, guard};
use crate::checkpoint::{Checkpointed, OperatorSnapshot};
use crate::data::{Data, Key, KeyFn};
use crate::dsl::OutputTag;
use crate::error::Result;
use crate::graph::BuildContext;
use crate::ids::CheckpointId;
use crate::output::{Collector, Control, Output};
use crate::state::StateContext;
use crate::time::{NO_TIMESTAMP, Timestamp};
use crate::timer::TimeDomain;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::rc::Rc;

/// A function over a data stream connected with a broadcast stream (Flink's
/// `KeyedBroadcastProcessFunction`, and `BroadcastProcessFunction` with the key `()`).
///
/// - [`process_element`](Self::process_element) handles a record of the data stream. On
///   a keyed stream its key is current: keyed state and timers work as in a
///   [`KeyedProcessFunction`]. Broadcast state is **read-only** here
///   ([`ReadOnlyContext::broadcast_state`]).
/// - [`process_broadcast_element`](Self::process_broadcast_element) handles a record of the
///   broadcast stream. Every parallel instance receives every broadcast record and must
///   make the same change to the broadcast state ([`BroadcastContext::broadcast_state`]),
///   so the copies stay identical. No key is current: keyed state cannot be used here.
///
/// The two inputs are not ordered against each other: data records that arrive before
/// the broadcast record they depend on see the state as it is (buffer them in keyed state
/// if they must wait).
///
/// ```
/// use weir_core::prelude::*;
///
/// /// Emits (sensor, reading) when a reading exceeds the threshold of the sensor's kind.
/// struct Alerts { thresholds: BroadcastStateDescriptor<String, i64> }
///
/// impl BroadcastProcessFunction<String, (String, i64), (String, i64), (String, i64)> for Alerts {
///     fn process_element(&mut self, (sensor, v): (String, i64), ctx: &mut ReadOnlyContext<'_, String, (String, i64)>) -> weir_core::Result<()> {
///         let kind = sensor.split('-').next().unwrap_or_default().to_string();
///         if let Some(limit) = ctx.broadcast_state(&self.thresholds)?.get(&kind) {
///             if v > *limit { ctx.emit((sensor, v)) }
///         }
///         Ok(())
///     }
///     fn process_broadcast_element(&mut self, (kind, limit): (String, i64), ctx: &mut BroadcastContext<'_, String, (String, i64)>) -> weir_core::Result<()> {
///         ctx.broadcast_state(&self.thresholds)?.put(kind, limit);
///         Ok(())
///     }
/// }
///
/// let p = Pipeline::new();
/// let thresholds = BroadcastStateDescriptor::<String, i64>::new("thresholds");
/// let rules = p.from_collection(vec![("temp".to_string(), 30i64)]).broadcast_state(&thresholds);
/// let readings = p.from_collection(vec![("temp-1".to_string(), 35i64)]).key_by(|r| r.0.clone());
/// let desc = thresholds.clone();
/// let _alerts = readings
///     .connect(&rules)
///     .process(move || Alerts { thresholds: desc.clone() })
///     .collect();
/// ```
pub trait BroadcastProcessFunction<K, A, B, O>: 'static {
    /// Called once per subtask before any record. Functions built by a plain factory
    /// (`process`) create their keyed state handles here; with `process_with_state` the
    /// factory does, and `open` need not be implemented.
    fn open(&mut self, state: &mut StateContext<K>) -> Result<()> {
        let _ = state;
        Ok(())
    }
    /// Called for each record of the data stream, with its key current.
    fn process_element(&mut self, value: A, ctx: &mut ReadOnlyContext<'_, K, O>) -> Result<()>;
    /// Called on every parallel instance for each record of the broadcast stream.
    fn process_broadcast_element(
        &mut self,
        value: B,
        ctx: &mut BroadcastContext<'_, K, O>,
    ) -> Result<()>;
    /// Called when a timer of the current key fires (registered in `process_element`).
    fn on_timer(
        &mut self,
        time: Timestamp,
        domain: TimeDomain,
        ctx: &mut ReadOnlyContext<'_, K, O>,
    ) -> Result<()> {
        let _ = (time, domain, ctx);
        Ok(())
    }
}

/// What `process_element` and `on_timer` see: everything of a [`KeyedContext`] (key,
/// timestamps, timers, emit, side outputs; it dereferences to one) plus read-only
/// broadcast state.
pub struct ReadOnlyContext<'a, K, O> {
    keyed: KeyedContext<'a, K, O>,
    states: &'a BroadcastStates,
}

impl<'a, K, O> ReadOnlyContext<'a, K, O> {
    /// The broadcast state `desc`, to read.
    ///
    /// # Errors
    /// [`crate::Error::Config`] when the broadcast stream does not declare `desc`, or
    /// declares its name with other types.
    pub fn broadcast_state<BK: Ord + 'static, BV: 'static>(
        &self,
        desc: &BroadcastStateDescriptor<BK, BV>,
    ) -> Result<ReadOnlyBroadcastState<'a, BK, BV>> {
        Ok(ReadOnlyBroadcastState::new(self.states.map(desc)?))
    }
}

impl<'a, K, O> Deref for ReadOnlyContext<'a, K, O> {
    type Target = KeyedContext<'a, K, O>;
    fn deref(&self) -> &Self::Target {
        &self.keyed
    }
}

impl<K, O> DerefMut for ReadOnlyContext<'_, K, O> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.keyed
    }
}

/// What `process_broadcast_element` sees: the record's timestamp, the watermark, emit,
/// side outputs and writable broadcast state. No key is current and no timers can be set.
pub struct BroadcastContext<'a, K, O> {
    timestamp: Option<Timestamp>,
    watermark: Timestamp,
    processing_time: i64,
    subtask: usize,
    out: &'a mut Collector<O>,
    side: &'a mut SideOutputs,
    states: &'a mut BroadcastStates,
    _key: PhantomData<fn() -> K>,
}

impl<K, O> BroadcastContext<'_, K, O> {
    /// The broadcast state `desc`, to read and write.
    ///
    /// # Errors
    /// [`crate::Error::Config`] when the broadcast stream does not declare `desc`, or
    /// declares its name with other types.
    pub fn broadcast_state<BK: Ord + 'static, BV: 'static>(
        &mut self,
        desc: &BroadcastStateDescriptor<BK, BV>,
    ) -> Result<BroadcastState<'_, BK, BV>> {
        Ok(BroadcastState::new(self.states.map_mut(desc)?))
    }
    /// The timestamp of the broadcast record, if any.
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
    /// This instance's subtask index (every instance runs `process_broadcast_element`).
    pub fn subtask(&self) -> usize {
        self.subtask
    }
    /// Emits a record with the broadcast record's timestamp. Every parallel instance runs
    /// this function for the record: emit from one instance only if the output must not
    /// be repeated (`if ctx.subtask() == 0`), or emit per instance on purpose.
    pub fn emit(&mut self, value: O) {
        self.out.emit(value)
    }
    /// Emits a record with the given timestamp.
    pub fn emit_at(&mut self, value: O, ts: Timestamp) {
        self.out.emit_at(value, ts)
    }
    /// Emits a record to the side output `tag` (see [`KeyedContext::output`]).
    ///
    /// # Errors
    /// [`crate::Error::Config`] when the operator does not declare this side output.
    pub fn output<S: Data>(&mut self, tag: &OutputTag<S>, value: S) -> Result<()> {
        self.side.emit(tag, value)
    }
}

/// Runs the function's data side as a keyed process function.
struct DataSide<P, B> {
    f: P,
    states: Rc<RefCell<BroadcastStates>>,
    _b: PhantomData<fn(B)>,
}

impl<K: Key, A: 'static, B: 'static, O: 'static, P: BroadcastProcessFunction<K, A, B, O>>
    KeyedProcessFunction<K, A, O> for DataSide<P, B>
{
    fn open(&mut self, state: &mut StateContext<K>) -> Result<()> {
        self.f.open(state)
    }
    fn process(&mut self, value: A, ctx: &mut KeyedContext<'_, K, O>) -> Result<()> {
        let states = self.states.borrow();
        let mut ctx = ReadOnlyContext {
            keyed: ctx.reborrow(),
            states: &states,
        };
        self.f.process_element(value, &mut ctx)
    }
    fn on_timer(
        &mut self,
        time: Timestamp,
        domain: TimeDomain,
        ctx: &mut KeyedContext<'_, K, O>,
    ) -> Result<()> {
        let states = self.states.borrow();
        let mut ctx = ReadOnlyContext {
            keyed: ctx.reborrow(),
            states: &states,
        };
        self.f.on_timer(time, domain, &mut ctx)
    }
}

/// The operator: the keyed process operator for the data side (keyed state, timers,
/// side outputs), and the broadcast side on the same function and outputs.
struct BroadcastProcess<K, A, B, O, P> {
    inner: KeyedProcess<K, A, O, DataSide<P, B>>,
    states: Rc<RefCell<BroadcastStates>>,
}

impl<K: Key, A, B: 'static, O: Data, P: BroadcastProcessFunction<K, A, B, O>>
    BroadcastProcess<K, A, B, O, P>
{
    fn broadcast_record(&mut self, value: B, ts: Timestamp) -> Result<()> {
        let inner = &mut self.inner;
        // No key is current: keyed state used here fails instead of touching the last key.
        inner.key.clear();
        let mut states = self.states.borrow_mut();
        let (wm, now) = (inner.watermark, inner.now);
        let KeyedProcess {
            f, buf, info, side, ..
        } = inner;
        guard(info, || {
            let mut ctx = BroadcastContext {
                timestamp: (ts != NO_TIMESTAMP).then_some(ts),
                watermark: wm,
                processing_time: now,
                subtask: info.subtask,
                out: buf,
                side,
                states: &mut states,
                _key: PhantomData,
            };
            f.f.process_broadcast_element(value, &mut ctx)
        })?;
        if !inner.buf.is_empty() {
            inner.buf.drain_into(&mut *inner.out, ts)?;
        }
        inner.side.drain(ts)
    }
}

impl<K: Key, A: 'static, B: 'static, O: Data, P: BroadcastProcessFunction<K, A, B, O>>
    Output<Either<A, B>> for BroadcastProcess<K, A, B, O, P>
{
    fn record(&mut self, value: Either<A, B>, ts: Timestamp) -> Result<()> {
        match value {
            Either::Left(a) => self.inner.record(a, ts),
            Either::Right(b) => self.broadcast_record(b, ts),
        }
    }
    fn control(&mut self, event: Control) -> Result<()> {
        self.inner.control(event)
    }
}

/// The checkpoint hooks of the broadcast state: subtask 0 writes the operator's one copy
/// (all copies are identical); the others write none. See
/// docs/decisions/0034-broadcast-state.md.
struct Hooks {
    states: Rc<RefCell<BroadcastStates>>,
    writes: bool,
}

impl Checkpointed for Hooks {
    fn snapshot(&mut self, _id: CheckpointId) -> Result<OperatorSnapshot> {
        if !self.writes {
            return Ok(OperatorSnapshot::default());
        }
        let states = self.states.borrow();
        Ok(OperatorSnapshot {
            operator: Some(states.snapshot()?),
            description: Some(states.describe()),
            ..OperatorSnapshot::default()
        })
    }
    fn state_bytes(&self) -> Option<u64> {
        // Counted roughly as entries; the exact size would need encoding every entry.
        None
    }
}

/// Builds one subtask of a broadcast operator: restores the broadcast state (the one copy
/// in the checkpoint, whatever the old parallelism), registers its hooks and wraps the
/// data side in the keyed process operator.
#[allow(clippy::too_many_arguments)]
pub(crate) fn build<K: Key, A: Data, B: Data, O: Data, P: BroadcastProcessFunction<K, A, B, O>>(
    ctx: &BuildContext<'_>,
    key_fn: KeyFn<A, K>,
    decls: &[Declaration],
    f: P,
    state: StateContext<K>,
    out: Box<dyn Output<O>>,
    side: SideOutputs,
    info: OpInfo,
) -> Result<TwoInputs<A, B>> {
    let mut states = BroadcastStates::new(decls)?;
    if let Some(copy) = ctx.restore.and_then(|r| r.operator.first()) {
        states.restore(copy, ctx.name)?;
        tracing::info!(
            operator = ctx.name,
            subtask = ctx.subtask,
            entries = states.entries(),
            "broadcast state restored"
        );
    }
    let states = Rc::new(RefCell::new(states));
    ctx.participants.register(
        ctx.operator_id,
        Rc::new(RefCell::new(Hooks {
            states: states.clone(),
            writes: ctx.subtask == 0,
        })),
    );
    let data = DataSide {
        f,
        states: states.clone(),
        _b: PhantomData,
    };
    let inner = KeyedProcess::new(key_fn, data, state, out, info)?.with_side_outputs(side);
    Ok(split_inputs(Box::new(BroadcastProcess { inner, states })))
}

#[cfg(test)]
mod tests;
