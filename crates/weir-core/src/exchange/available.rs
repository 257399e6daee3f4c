//! Output availability (as Flink's): a task does not start work that would block on a full
//! output channel. Every [`super::ChannelWriter`] that has sent something on a thread is
//! registered with that thread; [`output_available`] says whether all of them have room
//! (each channel below its in-flight budget and not full). A task checks it before it polls
//! its source or delivers its next input records, and while the output has no room it waits
//! for room while still taking checkpoint triggers and unaligned barriers: a barrier is
//! then never stuck behind a send that waits for a slow consumer.

use super::ChannelBudget;
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
pub(super) fn register(lanes: Weak<dyn Room>) {
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
