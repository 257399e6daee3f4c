//! Output availability (as Flink's): a task does not start work that would block on a full
//! output channel. Every [`super::ChannelWriter`] that has sent something on a thread is
//! registered with that thread; [`output_available`] says whether all of them have room
//! (each channel below its in-flight budget and not full). A task checks it before it polls
//! its source or delivers its next input records, and while the output has no room it waits
//! for room while still taking checkpoint triggers and unaligned barriers: a barrier is
//! then never stuck behind a send that waits for a slow consumer.

use super::{ChannelBudget, ChannelWriter, Msg};
use crate::data::Data;
use crate::error::{Error, Result};
use crossbeam_channel::Sender;
use std::cell::RefCell;
use std::sync::{Arc, Weak};

/// One writer's channels, as the availability check sees them.
pub(super) trait Room {
    /// True when every channel of the writer takes one more batch without waiting.
    fn has_room(&self) -> bool;
}

/// The producer end of one writer's channels: data lanes and their budgets.
pub(super) struct WriterLanes<T> {
    pub senders: Vec<Sender<super::Msg<T>>>,
    pub budgets: Vec<Arc<ChannelBudget>>,
}

impl<T> WriterLanes<T> {
    /// True when channel `t` takes one more batch without waiting (a channel whose
    /// consumers are gone counts as having room: sending to it fails at once).
    pub fn target_has_room(&self, t: usize) -> bool {
        let b = &self.budgets[t];
        b.is_closed() || (b.queued() < b.limit() && !self.senders[t].is_full())
    }
}

impl<T: Send> Room for WriterLanes<T> {
    fn has_room(&self) -> bool {
        (0..self.senders.len()).all(|t| self.target_has_room(t))
    }
}

thread_local! {
    /// The writers used on this thread (weak: a dropped writer's channels close).
    static WRITERS: RefCell<Vec<Weak<dyn Room>>> = const { RefCell::new(Vec::new()) };
}

/// Registers a writer's lanes with the current thread (once, at its first send).
pub(super) fn register_lanes(lanes: Weak<dyn Room>) {
    WRITERS.with(|w| w.borrow_mut().push(lanes));
}

/// True when every channel writer used on this thread has room for one more batch on every
/// channel: work started now does not wait on a slow consumer (unless it fills more than
/// a batch per channel). A thread that never sent anything has room.
///
/// ```
/// assert!(weir_core::exchange::output_available());
/// ```
pub fn output_available() -> bool {
    WRITERS.with(|w| {
        let mut w = w.borrow_mut();
        let mut all = true;
        w.retain(|lanes| match lanes.upgrade() {
            Some(l) => {
                all = all && l.has_room();
                true
            }
            None => false,
        });
        all
    })
}

/// Forgets the writers registered on this thread (the runtime calls it when a task's
/// thread starts and ends).
pub fn clear_outputs() {
    WRITERS.with(|w| w.borrow_mut().clear());
}

/// The parts of [`ChannelWriter`] that keep a task from waiting on a full output.
impl<T: Data> ChannelWriter<T> {
    /// Registers the lanes with the sending thread's output availability, once.
    pub(super) fn register(&mut self) {
        if !self.registered {
            self.registered = true;
            let lanes: Arc<dyn Room> = self.lanes.clone();
            register_lanes(Arc::downgrade(&lanes));
        }
    }

    /// Sends the records held at an unaligned barrier for `target` at once when its
    /// channel has a free slot, even over its in-flight budget (an overdraft of one batch,
    /// as Flink's overdraft buffers): the consumer's channel state is complete only once
    /// they arrived, and the budget would make it wait for its own backlog. With no free
    /// slot they stay held, sent before anything newer.
    pub(super) fn send_held_now(&mut self, target: usize) -> Result<()> {
        if self.lanes.senders[target].is_full() {
            return Ok(());
        }
        let Some(held) = self.held[target].take() else {
            return Ok(());
        };
        self.register();
        self.lanes.budgets[target].acquire_overdraft(held.len());
        self.sent[target] += 1;
        // This writer is the channel's only sender: the free slot is still free.
        self.lanes.senders[target]
            .send(Msg::Batch(held))
            .map_err(|_| Error::ChannelClosed("downstream subtask stopped".into()))
    }

    /// A timed or idle flush: sends what is buffered (and held) to every target that
    /// takes it without waiting. A target with no room keeps its records for the next
    /// flush or a full batch: a task never waits in a flush, deaf to barriers, for records
    /// that are only late, not due.
    pub(super) fn flush_ready(&mut self) -> Result<()> {
        for t in 0..self.lanes.senders.len() {
            if self.held[t].is_some() && self.lanes.target_has_room(t) {
                let held = self.held[t].take().expect("held");
                self.send_now(t, Msg::Batch(held))?;
            }
            if self.held[t].is_none()
                && !self.buffers[t].is_empty()
                && self.lanes.target_has_room(t)
            {
                let batch = std::mem::replace(
                    &mut self.buffers[t],
                    Vec::with_capacity(self.cfg.batch_size),
                );
                self.send_now(t, Msg::Batch(batch))?;
            }
        }
        Ok(())
    }
}
