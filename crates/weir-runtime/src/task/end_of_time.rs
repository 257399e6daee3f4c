//! Keeps the final checkpoint aligned under "aligned with a timeout", however late a task
//! hears which checkpoint is the final one.
//!
//! The sinks commit everything at the final checkpoint and the job ends after it, so a
//! record it left in flight would never be committed: it must be aligned. The job thread
//! names it to the operator tasks before its barriers leave the sources, which settles it
//! in one process. In a cluster that notice travels from the coordinator to each worker
//! while the barriers travel from worker to worker, and a barrier may come first. What a
//! task sees for itself instead: the final checkpoint is requested only once every source
//! has finished, and a finished source emits the end of event time ([`MAX_WATERMARK`])
//! before any later barrier; a task forwards that watermark once all its inputs reached it,
//! before it forwards an aligned barrier. So on every channel the final checkpoint's
//! barrier follows the end of event time, and a barrier that does is never taken nor sent
//! unaligned here. Checkpoints after the end of a bounded input are the only others this
//! keeps aligned; that costs nothing, the channels then drain without new input. (See
//! docs/decisions/0047-final-checkpoint-aligned-without-the-notice.md.) This module owns only
//! that rule; alignment itself is `align.rs`, unaligned checkpoints `unaligned.rs`.

use crate::CheckpointMode;
use weir_core::time::{MAX_WATERMARK, Timestamp};

/// Which input channels of a task have delivered the end of event time.
pub(super) struct EndOfTime {
    reached: Vec<bool>,
}

impl EndOfTime {
    pub(super) fn new(channels: usize) -> Self {
        EndOfTime {
            reached: vec![false; channels],
        }
    }

    /// Channel `flat` delivered watermark `w`.
    pub(super) fn on_watermark(&mut self, flat: usize, w: Timestamp) {
        if w == MAX_WATERMARK {
            self.reached[flat] = true;
        }
    }

    /// True when every channel in `arrived` (those whose barrier came) had delivered the
    /// end of event time before it: the barrier may be the final checkpoint's, so its
    /// alignment must not time out into an unaligned checkpoint.
    pub(super) fn all_arrived_reached(&self, arrived: &[bool]) -> bool {
        arrived.iter().any(|a| *a)
            && arrived
                .iter()
                .zip(&self.reached)
                .all(|(arrived, reached)| !arrived || *reached)
    }
}

/// Runs `send` (the forwarding of an aligned barrier) so that, under aligned-with-timeout,
/// the task's writers send the barrier in band only, without the priority copy they send
/// after the timeout on a full channel, when `in_band_only` (the barrier follows the end of
/// event time, or the task knows it is the final checkpoint's).
pub(super) fn send_barrier<R>(
    mode: CheckpointMode,
    in_band_only: bool,
    send: impl FnOnce() -> R,
) -> R {
    match mode {
        CheckpointMode::AlignedTimeout(limit) if in_band_only => {
            weir_core::exchange::set_barrier_timeout(None);
            let r = send();
            weir_core::exchange::set_barrier_timeout(Some(limit));
            r
        }
        _ => send(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_barrier_after_the_end_of_event_time_on_every_arrived_channel_stays_aligned() {
        let mut e = EndOfTime::new(3);
        assert!(!e.all_arrived_reached(&[true, false, false]));
        e.on_watermark(0, 5);
        assert!(!e.all_arrived_reached(&[true, false, false]));
        e.on_watermark(0, MAX_WATERMARK);
        assert!(e.all_arrived_reached(&[true, false, false]));
        // Channel 1's barrier came before its end of event time: not the final checkpoint.
        assert!(!e.all_arrived_reached(&[true, true, false]));
        e.on_watermark(1, MAX_WATERMARK);
        assert!(e.all_arrived_reached(&[true, true, false]));
        // No barrier yet: nothing to keep aligned.
        assert!(!e.all_arrived_reached(&[false, false, false]));
    }
}
