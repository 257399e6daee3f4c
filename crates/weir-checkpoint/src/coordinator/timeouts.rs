//! Checkpoints that take longer than the timeout: those still waiting for acknowledgements
//! are aborted, those being written are left to the runtime, and both are counted against
//! [`CoordinatorConfig::tolerable_timeouts`](super::CoordinatorConfig::tolerable_timeouts).
//!
//! Part of [`Coordinator`]'s implementation. A timeout is the one checkpoint failure
//! nothing reports: a task, its state backend or the checkpoint storage stopped answering.
//! A checkpoint being written cannot be aborted (the runtime is writing it) and holds the
//! only slot of `max_concurrent` 1, so no later checkpoint could time out instead; it
//! counts once for every timeout it takes.

use super::{AbortReason, Action, Coordinator, TimedOut};
use std::time::Instant;
use weir_core::ids::CheckpointId;

impl<T> Coordinator<T> {
    /// Aborts the checkpoints waiting for acknowledgements longer than the timeout, counts
    /// the timeouts of those being written, and fails when the count passes the tolerance.
    pub(super) fn time_out(&mut self, now: Instant, actions: &mut Vec<Action<T>>) {
        if self.failed {
            return;
        }
        let timeout = self.config.timeout;
        let expired: Vec<CheckpointId> = self
            .pending
            .iter()
            .filter(|(_, p)| {
                !p.finalizing && now.saturating_duration_since(p.triggered_at) >= timeout
            })
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.abort(now, id, AbortReason::Timeout { after: timeout }, actions);
            self.count_timeouts(id, 1, false, actions);
        }
        let writing: Vec<(CheckpointId, u32)> = self
            .pending
            .iter_mut()
            .filter(|(_, p)| p.finalizing)
            .filter_map(|(id, p)| {
                let periods = now.saturating_duration_since(p.triggered_at).as_nanos()
                    / timeout.as_nanos().max(1);
                let periods = u32::try_from(periods).unwrap_or(u32::MAX);
                let new = periods.checked_sub(p.overdue).filter(|n| *n > 0)?;
                p.overdue = periods;
                Some((*id, new))
            })
            .collect();
        for (id, new) in writing {
            tracing::warn!(checkpoint = %id, after = ?timeout, "checkpoint acknowledged by every task but not written within the timeout");
            self.count_timeouts(id, new, true, actions);
        }
    }

    /// When [`time_out`](Self::time_out) has something to do next: a checkpoint waiting for
    /// acknowledgements reaches the timeout, or one being written another multiple of it
    /// (only when timeouts are counted).
    pub(super) fn timeout_deadline(&self) -> Option<std::time::Instant> {
        if self.failed {
            return None;
        }
        let timeout = self.config.timeout;
        let counted = self.config.tolerable_timeouts.is_some();
        self.pending
            .values()
            .filter(|p| !p.finalizing || counted)
            .filter_map(|p| {
                let periods = if p.finalizing { p.overdue + 1 } else { 1 };
                p.triggered_at.checked_add(timeout.checked_mul(periods)?)
            })
            .min()
    }

    /// Counts `new` timeouts of checkpoint `id`; past the tolerance, emits [`Action::Fail`]
    /// (once) and stops triggering.
    fn count_timeouts(
        &mut self,
        id: CheckpointId,
        new: u32,
        writing: bool,
        actions: &mut Vec<Action<T>>,
    ) {
        self.timeouts_in_a_row = self.timeouts_in_a_row.saturating_add(new);
        let Some(tolerable) = self.config.tolerable_timeouts else {
            return;
        };
        if self.failed || self.timeouts_in_a_row <= tolerable {
            return;
        }
        self.failed = true;
        self.queued.clear();
        let reason = TimedOut {
            in_a_row: self.timeouts_in_a_row,
            tolerable,
            after: self.config.timeout,
            writing,
        };
        tracing::debug!(checkpoint = %id, %reason, "giving up on the running tasks");
        actions.push(Action::Fail { id, reason });
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{aborted, coordinator, finish, ms, sink, src, triggered};
    use super::super::{AckStats, CoordinatorConfig};
    use super::*;
    use std::time::Duration;

    fn tolerating(n: Option<u32>) -> CoordinatorConfig {
        CoordinatorConfig {
            interval: ms(100),
            timeout: ms(1000),
            tolerable_timeouts: n,
            ..CoordinatorConfig::default()
        }
    }

    fn ids(actions: &[Action<u32>]) -> Vec<u64> {
        triggered(actions).into_iter().map(|(id, _)| id).collect()
    }

    fn failed(actions: &[Action<u32>]) -> Vec<(u64, TimedOut)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Fail { id, reason } => Some((id.0, reason.clone())),
                _ => None,
            })
            .collect()
    }

    fn acked_by_all(c: &mut Coordinator<u32>, t: Instant, id: u64) -> Vec<Action<u32>> {
        let id = CheckpointId(id);
        let mut a = c.ack(t, src(), id, 1, AckStats::default());
        a.extend(c.ack(t, sink(), id, 2, AckStats::default()));
        a
    }

    #[test]
    fn timeouts_in_a_row_past_the_tolerance_fail_once_and_stop_triggering() {
        let t0 = Instant::now();
        let mut c = coordinator(tolerating(Some(1)));
        c.tick(t0);
        assert_eq!(ids(&c.tick(t0 + ms(100))), [1]);
        // The first timeout is tolerated: aborted, and the next one triggers.
        let a = c.tick(t0 + ms(1100));
        assert_eq!(aborted(&a), [(1, AbortReason::Timeout { after: ms(1000) })]);
        assert!(failed(&a).is_empty());
        assert_eq!(ids(&a), [2]);
        // The second in a row is not.
        let a = c.tick(t0 + ms(2100));
        assert_eq!(aborted(&a), [(2, AbortReason::Timeout { after: ms(1000) })]);
        let reason = TimedOut {
            in_a_row: 2,
            tolerable: 1,
            after: ms(1000),
            writing: false,
        };
        assert_eq!(failed(&a), [(2, reason)]);
        // Nothing more: no trigger, no second failure, not even for an explicit request.
        assert!(c.tick(t0 + ms(10_000)).is_empty());
        assert!(
            c.trigger_now(t0 + ms(10_000), crate::CheckpointKind::Savepoint)
                .is_empty()
        );
        assert_eq!(c.next_deadline(), None);
    }

    #[test]
    fn a_completed_checkpoint_starts_the_count_again() {
        let t0 = Instant::now();
        let mut c = coordinator(tolerating(Some(1)));
        c.tick(t0);
        c.tick(t0 + ms(100));
        // 1 times out, 2 is triggered.
        assert_eq!(ids(&c.tick(t0 + ms(1100))), [2]);
        finish(&mut c, t0 + ms(1300), 2);
        assert_eq!(ids(&c.tick(t0 + ms(1400))), [3]);
        // 3 is the first timeout in a row again.
        let a = c.tick(t0 + ms(2400));
        assert_eq!(aborted(&a).len(), 1);
        assert!(failed(&a).is_empty(), "{a:?}");
    }

    #[test]
    fn a_checkpoint_being_written_counts_a_timeout_for_every_timeout_it_takes() {
        let t0 = Instant::now();
        let mut c = coordinator(tolerating(Some(2)));
        c.tick(t0);
        c.tick(t0 + ms(100));
        let a = acked_by_all(&mut c, t0 + ms(200), 1);
        assert!(matches!(a[..], [Action::Complete { .. }]));
        // Never aborted (the runtime is writing it), counted at 1 s and 2 s after its
        // trigger, and failed at the third.
        assert_eq!(c.next_deadline(), Some(t0 + ms(1100)));
        assert!(c.tick(t0 + ms(1100)).is_empty());
        assert_eq!(c.next_deadline(), Some(t0 + ms(2100)));
        assert!(c.tick(t0 + ms(2500)).is_empty());
        let a = c.tick(t0 + ms(3100));
        let reason = TimedOut {
            in_a_row: 3,
            tolerable: 2,
            after: ms(1000),
            writing: true,
        };
        assert_eq!(failed(&a), [(1, reason)]);
        assert!(aborted(&a).is_empty());
    }

    #[test]
    fn a_checkpoint_written_late_but_within_the_tolerance_resets_the_count() {
        let t0 = Instant::now();
        let mut c = coordinator(tolerating(Some(1)));
        c.tick(t0);
        c.tick(t0 + ms(100));
        acked_by_all(&mut c, t0 + ms(200), 1);
        // Only one tick after a long pause: the periods passed count at once.
        assert!(c.tick(t0 + ms(1500)).is_empty());
        let a = c.completed(t0 + ms(1600), CheckpointId(1));
        assert!(matches!(a[..], [Action::Notify { .. }]));
        assert_eq!(ids(&c.tick(t0 + ms(1700))), [2]);
        let a = c.tick(t0 + ms(2700));
        assert_eq!(aborted(&a).len(), 1);
        assert!(failed(&a).is_empty(), "{a:?}");
        // Skipping two periods at once passes the tolerance of 1 in a single tick.
        assert_eq!(ids(&a), [3]);
        acked_by_all(&mut c, t0 + ms(2900), 3);
        let a = c.tick(t0 + ms(5000));
        assert_eq!(failed(&a).len(), 1, "{a:?}");
        assert_eq!(failed(&a)[0].1.in_a_row, 3);
    }

    #[test]
    fn without_a_tolerance_timeouts_only_abort() {
        let t0 = Instant::now();
        let mut c = coordinator(tolerating(None));
        c.tick(t0);
        let mut t = t0 + ms(100);
        assert_eq!(ids(&c.tick(t)), [1]);
        // Each tick at a timeout aborts one and triggers the next.
        for id in 1..=5 {
            t += ms(1000);
            let a = c.tick(t);
            let ended: Vec<u64> = aborted(&a).into_iter().map(|(id, _)| id).collect();
            assert_eq!(ended, [id]);
            assert!(failed(&a).is_empty());
            assert_eq!(ids(&a), [id + 1]);
        }
        // A checkpoint being written wakes nobody up while uncounted.
        acked_by_all(&mut c, t, 6);
        assert_eq!(c.next_deadline(), None);
        assert!(c.tick(t + Duration::from_secs(3600)).is_empty());
    }
}
