//! The consumer side of an edge: [`InputGate`], which reads a subtask's channels of one
//! input, delivers their records to the operator input, and keeps the channel state of
//! unaligned checkpoints (see [`super::unaligned`]).

use super::unaligned::{self, Capture, ChannelEnd};
use super::{Msg, Partitioning, record_size};
use crate::data::Data;
use crate::error::Result;
use crate::ids::CheckpointId;
use crate::output::{Control, LatencyMarker, Output};
use crate::time::Timestamp;
use crossbeam_channel::SelectedOperation;
use std::cell::RefCell;
use std::sync::Arc;

/// What reading one message from a channel produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateEvent {
    /// A batch of this many records was delivered to the operator.
    Records(usize),
    /// A watermark arrived.
    Watermark(Timestamp),
    /// The channel became idle or active.
    Idle(bool),
    /// A checkpoint barrier arrived in band.
    Barrier(CheckpointId),
    /// An unaligned barrier arrived on the priority lane: the checkpoint and how many data
    /// messages of the channel come before it. A data message taken when it was seen
    /// waits (see [`InputGate::resume`]).
    Priority(CheckpointId, u64),
    /// The channel ended.
    End,
    /// A latency marker arrived.
    LatencyMarker(LatencyMarker),
    /// The sender disappeared without ending (it failed).
    Disconnected,
}

/// The consumer side of one logical input of a subtask: its channels and the operator
/// input they feed. Methods take `&self` so a select can borrow the receivers.
///
/// Unaligned checkpoints: the gate counts the data messages it takes per channel; while a
/// channel's capture is on ([`InputGate::capture`]) the records it delivers up to
/// the capture's limit are also kept as the channel's state.
pub trait InputGate {
    /// Number of channels.
    fn len(&self) -> usize;
    /// True when the gate has no channel.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Adds channel `ch`'s data receiver to a select; returns the select index.
    fn select<'a>(&'a self, sel: &mut crossbeam_channel::Select<'a>, ch: usize) -> usize;
    /// Adds channel `ch`'s priority lane to a select; returns the select index.
    fn select_priority<'a>(&'a self, sel: &mut crossbeam_channel::Select<'a>, ch: usize) -> usize;
    /// Completes a selected receive on channel `ch`'s data lane and delivers its records;
    /// when an unaligned barrier is waiting on the channel's priority lane, returns that
    /// instead and keeps the message for [`InputGate::resume`].
    fn complete(&self, ch: usize, op: SelectedOperation<'_>) -> Result<GateEvent>;
    /// Completes a selected receive on channel `ch`'s priority lane; `None` when the
    /// producer let go of the lane (it ended or failed; its data lane says which), after
    /// which the lane is not to be selected again.
    fn complete_priority(&self, ch: usize, op: SelectedOperation<'_>) -> Option<GateEvent>;
    /// An unaligned barrier waiting on channel `ch`'s priority lane, if any.
    fn poll_priority(&self, ch: usize) -> Option<GateEvent>;
    /// Delivers the oldest data message taken from channel `ch` and not yet delivered
    /// (kept back by [`InputGate::complete`] or [`InputGate::drain`]), if any. Such
    /// messages go before anything read from the channel later.
    fn resume(&self, ch: usize) -> Result<Option<GateEvent>>;
    /// Sends a control event into the operator input (single-input operators only).
    fn control(&self, event: Control) -> Result<()>;
    /// The in-flight budgets of the gate's channels (records queued, for the metrics).
    fn budgets(&self) -> Vec<Arc<super::ChannelBudget>> {
        Vec::new()
    }
    /// Data messages taken from channel `ch` so far.
    fn taken(&self, ch: usize) -> u64;
    /// Starts keeping channel `ch`'s records as channel state (after a snapshot), up to
    /// data message `upto` when known; a running capture only gets its limit (and drops
    /// what it kept beyond it).
    fn capture(&self, ch: usize, upto: Option<u64>) -> Result<()>;
    /// Channel `ch`'s barrier `id` comes in band: [`InputGate::drain`] takes messages up
    /// to it, and it sets the capture's limit.
    fn capture_until_barrier(&self, ch: usize, id: CheckpointId);
    /// Takes what channel `ch` already holds of its capture's messages (up to its limit,
    /// or up to its in-band barrier) without waiting, keeping them as channel state and
    /// queueing them for delivery ([`InputGate::resume`]), so that the checkpoint need
    /// not wait until the operator has processed them.
    fn drain(&self, ch: usize) -> Result<()>;
    /// True when channel `ch`'s capture has everything before its barrier.
    fn capture_done(&self, ch: usize) -> bool;
    /// Ends every capture and drops what they kept (the checkpoint was given up).
    fn cancel_captures(&self);
    /// Ends channel `ch`'s capture and returns its state as an entry of
    /// [`CHANNEL_STATE_TABLE`](super::CHANNEL_STATE_TABLE) (none when it kept nothing).
    fn channel_state(
        &self,
        ch: usize,
        gate: usize,
        subtask: usize,
        parallelism: usize,
    ) -> Result<Option<(u32, Vec<u8>)>>;
    /// Replays the channel state of this gate from a checkpoint (the entries of
    /// [`CHANNEL_STATE_TABLE`](super::CHANNEL_STATE_TABLE)) into the operator input: the records the edge assigns to
    /// `subtask` of `parallelism`, in order per channel. Returns how many.
    fn replay(
        &self,
        blobs: &[(u32, Vec<u8>)],
        gate: usize,
        subtask: usize,
        parallelism: usize,
        max_parallelism: usize,
    ) -> Result<usize>;
}

pub(super) struct TypedGate<T> {
    pub(super) ends: Vec<ChannelEnd<T>>,
    pub(super) input: RefCell<Box<dyn Output<T>>>,
    /// Where the encoded size of delivered records is added (the REST API is on).
    pub(super) bytes: Option<Arc<std::sync::atomic::AtomicU64>>,
    pub(super) partitioning: Partitioning<T>,
    pub(super) taken: Vec<std::cell::Cell<u64>>,
    /// Per channel: messages taken and not delivered yet (number, kept as channel state
    /// already, message).
    pub(super) pending: Vec<RefCell<std::collections::VecDeque<Pending<T>>>>,
    pub(super) captures: Vec<RefCell<Option<Capture>>>,
}

/// A message taken and not delivered yet: its number, whether it is kept as channel state
/// already, the message, and the records of it not yet reported to the channel's budget.
pub(super) type Pending<T> = (u64, bool, Msg<T>, usize);

impl<T: Data> TypedGate<T> {
    /// Counts a message taken from channel `ch`; returns its number.
    fn take(&self, ch: usize) -> u64 {
        let index = self.taken[ch].get() + 1;
        self.taken[ch].set(index);
        index
    }

    /// Keeps message `index` of channel `ch` as channel state if its capture wants it;
    /// true when it did.
    fn keep(&self, ch: usize, index: u64, msg: &Msg<T>) -> Result<bool> {
        if let (Some(c), Msg::Batch(batch)) = (self.captures[ch].borrow_mut().as_mut(), msg)
            && c.upto.is_none_or(|u| index <= u)
        {
            c.batches.push((index, crate::codec::encode(batch)?));
            return Ok(true);
        }
        Ok(false)
    }

    /// True when the delivery of a batch should stop at the next record: an unaligned
    /// barrier waits on one of the gate's priority lanes, the task's output has no room
    /// (see [`super::output_available`]), or a command waits for the task (see
    /// [`super::pause_delivery_when`]).
    fn should_pause(&self) -> bool {
        self.ends.iter().any(|e| !e.priority.is_empty())
            || !super::output_available()
            || super::waiting::commands_waiting()
    }

    fn process(&self, ch: usize, index: u64, kept: bool, msg: Msg<T>) -> Result<GateEvent> {
        let kept = kept || self.keep(ch, index, &msg)?;
        Ok(match msg {
            Msg::Batch(batch) => self.deliver(ch, index, kept, batch)?,
            Msg::Watermark(w) => GateEvent::Watermark(w),
            Msg::Idle(i) => GateEvent::Idle(i),
            Msg::End => GateEvent::End,
            Msg::Barrier(id) => GateEvent::Barrier(id),
            Msg::LatencyMarker(m) => GateEvent::LatencyMarker(m),
        })
    }
}

/// Records delivered between two checks of [`TypedGate::should_pause`].
const PAUSE_CHECK_EVERY: usize = 64;

impl<T: Data> TypedGate<T> {
    /// Delivers the records of message `index` of channel `ch` to the operator input. It
    /// stops early when [`TypedGate::should_pause`] (checked every
    /// [`PAUSE_CHECK_EVERY`] records): the records not delivered go back in front of the
    /// channel's pending messages, as the rest of the same message (`kept`: the whole
    /// message is channel state of the running capture already). A barrier then taken
    /// counts them as before it (the message was before it), so a snapshot taken between
    /// two records of a batch is consistent: what was delivered is in the operators'
    /// state, the rest in the channel state.
    fn deliver(
        &self,
        ch: usize,
        index: u64,
        kept: bool,
        batch: Vec<(T, Timestamp)>,
    ) -> Result<GateEvent> {
        let n = batch.len();
        let mut input = self.input.borrow_mut();
        input.prefetch(&batch)?;
        let mut records = batch.into_iter();
        let mut delivered = 0;
        let mut size = 0;
        while let Some((v, ts)) = records.next() {
            if self.bytes.is_some() {
                size += record_size(&v, ts);
            }
            input.record(v, ts)?;
            delivered += 1;
            if delivered % PAUSE_CHECK_EVERY == 0 && delivered < n && self.should_pause() {
                let rest: Vec<_> = records.collect();
                self.pending[ch]
                    .borrow_mut()
                    .push_front((index, kept, Msg::Batch(rest), 0));
                break;
            }
        }
        if let Some(bytes) = &self.bytes {
            bytes.fetch_add(size as u64, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(GateEvent::Records(delivered))
    }
}

impl<T: Data> InputGate for TypedGate<T> {
    fn len(&self) -> usize {
        self.ends.len()
    }

    fn select<'a>(&'a self, sel: &mut crossbeam_channel::Select<'a>, ch: usize) -> usize {
        sel.recv(&self.ends[ch].data)
    }

    fn select_priority<'a>(&'a self, sel: &mut crossbeam_channel::Select<'a>, ch: usize) -> usize {
        sel.recv(&self.ends[ch].priority)
    }

    fn complete(&self, ch: usize, op: SelectedOperation<'_>) -> Result<GateEvent> {
        let msg = match op.recv(&self.ends[ch].data) {
            Ok(m) => m,
            Err(_) => return Ok(GateEvent::Disconnected),
        };
        self.ends[ch].budget.consumed(super::batch_len(&msg));
        let index = self.take(ch);
        // A barrier put on the priority lane before this message was written is visible
        // now: it goes first, so no record after it is taken before it is known.
        if let Some(p) = self.poll_priority(ch) {
            self.pending[ch]
                .borrow_mut()
                .push_back((index, false, msg, 0));
            return Ok(p);
        }
        self.process(ch, index, false, msg)
    }

    fn complete_priority(&self, ch: usize, op: SelectedOperation<'_>) -> Option<GateEvent> {
        op.recv(&self.ends[ch].priority)
            .ok()
            .map(|(id, upto)| GateEvent::Priority(id, upto))
    }

    fn poll_priority(&self, ch: usize) -> Option<GateEvent> {
        self.ends[ch]
            .priority
            .try_recv()
            .ok()
            .map(|(id, upto)| GateEvent::Priority(id, upto))
    }

    fn resume(&self, ch: usize) -> Result<Option<GateEvent>> {
        let next = self.pending[ch].borrow_mut().pop_front();
        next.map(|(i, kept, m, owed)| {
            if owed > 0 {
                self.ends[ch].budget.consumed(owed);
            }
            self.process(ch, i, kept, m)
        })
        .transpose()
    }

    fn control(&self, event: Control) -> Result<()> {
        self.input.borrow_mut().control(event)
    }

    fn budgets(&self) -> Vec<Arc<super::ChannelBudget>> {
        self.ends
            .iter()
            .map(|e| e.budget.budget().clone())
            .collect()
    }

    fn taken(&self, ch: usize) -> u64 {
        self.taken[ch].get()
    }

    fn capture(&self, ch: usize, upto: Option<u64>) -> Result<()> {
        let fresh = self.captures[ch].borrow().is_none();
        if fresh {
            *self.captures[ch].borrow_mut() = Some(Capture::default());
        }
        // Taken but not delivered yet: in flight, so state (a fresh capture keeps again
        // what an earlier checkpoint's kept).
        for (i, kept, msg, _) in self.pending[ch].borrow_mut().iter_mut() {
            if fresh || !*kept {
                self.keep(ch, *i, msg)?;
                *kept = true;
            }
        }
        let mut c = self.captures[ch].borrow_mut();
        let c = c.get_or_insert_with(Capture::default);
        if let Some(u) = upto
            && c.upto.is_none()
        {
            c.upto = Some(u);
            c.batches.retain(|(i, _)| *i <= u);
        }
        Ok(())
    }

    fn capture_until_barrier(&self, ch: usize, id: CheckpointId) {
        let mut c = self.captures[ch].borrow_mut();
        c.get_or_insert_with(Capture::default).in_band = Some(id);
    }

    fn drain(&self, ch: usize) -> Result<()> {
        loop {
            let want = match self.captures[ch].borrow().as_ref() {
                Some(c) => match c.upto {
                    Some(u) => self.taken[ch].get() < u,
                    None => c.in_band.is_some(),
                },
                None => false,
            };
            if !want {
                return Ok(());
            }
            let Ok(msg) = self.ends[ch].data.try_recv() else {
                return Ok(());
            };
            // Its records stay in flight, in this end's queue, until they are delivered:
            // the budget learns of them then (counted now, every checkpoint's drain would
            // look like a burst of throughput and raise the channel's limit).
            let owed = super::batch_len(&msg);
            let index = self.take(ch);
            if let Msg::Barrier(id) = &msg
                && let Some(c) = self.captures[ch].borrow_mut().as_mut()
                && c.in_band == Some(*id)
                && c.upto.is_none()
            {
                c.upto = Some(index);
            }
            self.keep(ch, index, &msg)?;
            self.pending[ch]
                .borrow_mut()
                .push_back((index, true, msg, owed));
        }
    }

    fn capture_done(&self, ch: usize) -> bool {
        self.captures[ch]
            .borrow()
            .as_ref()
            .is_some_and(|c| c.upto.is_some_and(|u| self.taken[ch].get() >= u))
    }

    fn cancel_captures(&self) {
        for c in &self.captures {
            *c.borrow_mut() = None;
        }
    }

    fn channel_state(
        &self,
        ch: usize,
        gate: usize,
        subtask: usize,
        parallelism: usize,
    ) -> Result<Option<(u32, Vec<u8>)>> {
        let Some(c) = self.captures[ch].borrow_mut().take() else {
            return Ok(None);
        };
        if c.batches.is_empty() {
            return Ok(None);
        }
        unaligned::encode_blob(gate, ch, subtask, parallelism, c.batches).map(Some)
    }

    fn replay(
        &self,
        blobs: &[(u32, Vec<u8>)],
        gate: usize,
        subtask: usize,
        parallelism: usize,
        max_parallelism: usize,
    ) -> Result<usize> {
        let records = unaligned::records_to_replay(
            &self.partitioning,
            max_parallelism,
            blobs,
            gate,
            subtask,
            parallelism,
        )
        .map_err(unaligned::bad_state)?;
        let n = records.len();
        let mut input = self.input.borrow_mut();
        for (v, ts) in records {
            input.record(v, ts)?;
        }
        Ok(n)
    }
}
