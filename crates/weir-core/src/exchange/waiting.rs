//! Commands that wait (checkpoint completions and aborts, as in Flink's mailbox): a task
//! takes them between batches, so a batch that takes long to deliver (a slow sink, a
//! throttled stage) pauses for them too, as it pauses for an unaligned barrier. A sink's
//! transactions of completed checkpoints are then committed promptly even while its input
//! is a long backlog; otherwise they pile up (the Kafka sink runs out of its pool of
//! transactional producers).

use std::cell::RefCell;

/// The check a task registers: true when a command waits for it.
type Check = Box<dyn Fn() -> bool>;

thread_local! {
    static WAITING: RefCell<Option<Check>> = const { RefCell::new(None) };
}

/// Makes the delivery of a batch on this thread pause (between two records, checked every
/// 64) while `check` returns true: the rest of the batch is delivered after the task took
/// what waits. `None` turns it off. The runtime sets it on each task thread to "a command
/// waits in the task's queue".
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicBool, Ordering};
/// let waiting = Arc::new(AtomicBool::new(false));
/// let w = waiting.clone();
/// weir_core::exchange::pause_delivery_when(Some(Box::new(move || w.load(Ordering::Relaxed))));
/// waiting.store(true, Ordering::Relaxed); // deliveries on this thread now pause
/// weir_core::exchange::pause_delivery_when(None);
/// ```
pub fn pause_delivery_when(check: Option<Box<dyn Fn() -> bool>>) {
    WAITING.with(|w| *w.borrow_mut() = check);
}

/// True when the check registered on this thread says something waits.
pub(super) fn commands_waiting() -> bool {
    WAITING.with(|w| w.borrow().as_ref().is_some_and(|check| check()))
}
