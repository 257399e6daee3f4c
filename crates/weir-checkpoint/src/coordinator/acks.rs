//! The coordinator's reactions to tasks and to the runtime: acknowledgements, declines,
//! task failures, and the end of a checkpoint's metadata write.
//!
//! Part of [`Coordinator`]'s implementation; triggering and time live in the parent module.

use super::{AbortReason, AckStats, Action, CheckpointStats, Coordinator, since};
use std::time::Instant;
use weir_core::ids::CheckpointId;

use super::TaskKey;

impl<T> Coordinator<T> {
    /// Task `task` acknowledges checkpoint `id` with its snapshot handle and statistics.
    ///
    /// When this is the last missing acknowledgement, returns [`Action::Complete`] with every
    /// task's payload; the checkpoint stays pending (it counts against `max_concurrent` and
    /// is no longer aborted on timeout, though its time still counts against
    /// [`tolerable_timeouts`](crate::CoordinatorConfig::tolerable_timeouts)) until
    /// [`completed`](Coordinator::completed) or
    /// [`completion_failed`](Coordinator::completion_failed).
    ///
    /// Ignored (no actions, the payload is dropped): an id that is not pending (unknown,
    /// aborted, subsumed, already complete), a task that is not a participant, a second
    /// acknowledgement from the same task.
    pub fn ack(
        &mut self,
        now: Instant,
        task: TaskKey,
        id: CheckpointId,
        payload: T,
        stats: AckStats,
    ) -> Vec<Action<T>> {
        if !self.participants.tasks.contains(&task) {
            tracing::warn!(checkpoint = %id, %task, "ignoring ack from a task that does not take part in checkpoints");
            return Vec::new();
        }
        let expected = self.participants.tasks.len();
        let Some(p) = self.pending.get_mut(&id) else {
            tracing::debug!(checkpoint = %id, %task, "ignoring ack for a checkpoint that is not pending");
            return Vec::new();
        };
        if p.finalizing || p.acks.contains_key(&task) {
            tracing::debug!(checkpoint = %id, %task, "ignoring duplicate ack");
            return Vec::new();
        }
        p.acks.insert(task, (payload, stats));
        if p.acks.len() < expected {
            return Vec::new();
        }
        p.finalizing = true;
        let mut stats = CheckpointStats {
            triggered_at: p.triggered_at,
            duration: since(now, p.triggered_at),
            bytes: 0,
            max_alignment: Default::default(),
            max_sync: Default::default(),
            max_async: Default::default(),
            tasks: Vec::with_capacity(expected),
        };
        let mut acks = Vec::with_capacity(expected);
        for (task, (payload, s)) in std::mem::take(&mut p.acks) {
            stats.bytes += s.bytes;
            stats.max_alignment = stats.max_alignment.max(s.alignment);
            stats.max_sync = stats.max_sync.max(s.sync);
            stats.max_async = stats.max_async.max(s.async_);
            stats.tasks.push((task, s));
            acks.push((task, payload));
        }
        tracing::debug!(checkpoint = %id, kind = %p.kind, duration = ?stats.duration, bytes = stats.bytes, "all tasks acknowledged");
        vec![Action::Complete {
            id,
            kind: p.kind,
            acks,
            stats,
        }]
    }

    /// Task `task` cannot take checkpoint `id`: aborts it (unless all acknowledgements are
    /// already in) and starts a queued explicit request if one waits. Ignored for ids that
    /// are not pending and for tasks that are not participants.
    pub fn decline(
        &mut self,
        now: Instant,
        task: TaskKey,
        id: CheckpointId,
        reason: impl Into<String>,
    ) -> Vec<Action<T>> {
        let mut actions = Vec::new();
        if !self.participants.tasks.contains(&task) {
            tracing::warn!(checkpoint = %id, %task, "ignoring decline from a task that does not take part in checkpoints");
            return actions;
        }
        if self.pending.get(&id).is_some_and(|p| !p.finalizing) {
            let reason = AbortReason::Declined {
                task,
                reason: reason.into(),
            };
            self.abort(now, id, reason, &mut actions);
            self.drain_queue(now, &mut actions);
        }
        actions
    }

    /// Task `task` failed: aborts every pending checkpoint that still waits for
    /// acknowledgements. Checkpoints whose acknowledgements are all in (their metadata is
    /// being written) are left to [`completed`](Coordinator::completed).
    ///
    /// Queued explicit requests stay queued (the runtime is about to restart the tasks); they
    /// start on the next [`tick`](Coordinator::tick) — tick again only once the tasks run.
    pub fn task_failed(&mut self, now: Instant, task: TaskKey) -> Vec<Action<T>> {
        let mut actions = Vec::new();
        let ids: Vec<CheckpointId> = self
            .pending
            .iter()
            .filter(|(_, p)| !p.finalizing)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.abort(now, id, AbortReason::TaskFailed { task }, &mut actions);
        }
        actions
    }

    /// The runtime has durably written the metadata of checkpoint `id` (after
    /// [`Action::Complete`]). It becomes the latest completed checkpoint: older pending ones
    /// are aborted as subsumed, then [`Action::Notify`] is returned, then a queued explicit
    /// request may be triggered.
    ///
    /// Ignored when `id` is not pending with all acknowledgements in (unknown, aborted,
    /// subsumed, or `Complete` was never emitted for it).
    pub fn completed(&mut self, now: Instant, id: CheckpointId) -> Vec<Action<T>> {
        let mut actions = Vec::new();
        if !self.pending.get(&id).is_some_and(|p| p.finalizing) {
            tracing::warn!(checkpoint = %id, "ignoring completion of a checkpoint that is not waiting for it");
            return actions;
        }
        let Some(p) = self.pending.remove(&id) else {
            return actions;
        };
        self.last_end = Some(now);
        self.latest_completed = Some(id);
        self.timeouts_in_a_row = 0;
        let older: Vec<CheckpointId> = self.pending.range(..id).map(|(id, _)| *id).collect();
        for old in older {
            self.abort(now, old, AbortReason::Subsumed { by: id }, &mut actions);
        }
        // The runtime reports it once written, naming the job.
        tracing::debug!(checkpoint = %id, kind = %p.kind, duration = ?since(now, p.triggered_at), "checkpoint complete");
        actions.push(Action::Notify { id, kind: p.kind });
        self.drain_queue(now, &mut actions);
        actions
    }

    /// Writing the metadata of checkpoint `id` failed: aborts it and starts a queued explicit
    /// request if one waits. Ignored when `id` is not waiting for its metadata.
    pub fn completion_failed(
        &mut self,
        now: Instant,
        id: CheckpointId,
        reason: impl Into<String>,
    ) -> Vec<Action<T>> {
        let mut actions = Vec::new();
        if self.pending.get(&id).is_some_and(|p| p.finalizing) {
            let reason = AbortReason::CompletionFailed {
                reason: reason.into(),
            };
            self.abort(now, id, reason, &mut actions);
            self.drain_queue(now, &mut actions);
        }
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{aborted, config, coordinator, finish, ms, sink, src, triggered};
    use super::super::{CoordinatorConfig, Participants};
    use super::*;
    use crate::CheckpointKind;
    use std::time::Duration;

    fn started() -> (Coordinator<u32>, Instant) {
        let mut c = coordinator(config(100, 0, 1000));
        let t0 = Instant::now();
        c.tick(t0);
        assert_eq!(triggered(&c.tick(t0 + ms(100))).len(), 1);
        (c, t0)
    }

    const C1: CheckpointId = CheckpointId(1);

    fn stats(bytes: u64, alignment: u64, sync: u64, async_: u64) -> AckStats {
        AckStats {
            bytes,
            alignment: ms(alignment),
            sync: ms(sync),
            async_: ms(async_),
        }
    }

    #[test]
    fn complete_only_when_every_task_acked() {
        let (mut c, t0) = started();
        assert!(
            c.ack(t0 + ms(150), sink(), C1, 7, AckStats::default())
                .is_empty()
        );
        let a = c.ack(t0 + ms(180), src(), C1, 3, AckStats::default());
        let [
            Action::Complete {
                id,
                kind,
                acks,
                stats,
            },
        ] = &a[..]
        else {
            panic!("{a:?}")
        };
        assert_eq!((*id, *kind), (C1, CheckpointKind::Checkpoint));
        assert_eq!(acks, &[(src(), 3), (sink(), 7)]);
        assert_eq!(stats.triggered_at, t0 + ms(100));
        assert_eq!(stats.duration, ms(80));
        // still pending until the runtime confirms, and no longer subject to the timeout
        assert_eq!(c.pending().count(), 1);
        assert!(aborted(&c.tick(t0 + ms(5000))).is_empty());
        assert_eq!(c.latest_completed(), None);
        let a = c.completed(t0 + ms(190), C1);
        assert_eq!(
            a,
            [Action::Notify {
                id: C1,
                kind: CheckpointKind::Checkpoint
            }]
        );
        assert_eq!(c.latest_completed(), Some(C1));
        assert_eq!(c.pending().count(), 0);
    }

    #[test]
    fn stats_are_aggregated() {
        let (mut c, t0) = started();
        c.ack(t0 + ms(110), src(), C1, 0, stats(100, 0, 2, 30));
        let a = c.ack(t0 + ms(140), sink(), C1, 0, stats(250, 12, 1, 40));
        let Action::Complete { stats: s, .. } = &a[0] else {
            panic!()
        };
        assert_eq!(s.bytes, 350);
        assert_eq!(s.max_alignment, ms(12));
        assert_eq!(s.max_sync, ms(2));
        assert_eq!(s.max_async, ms(40));
        assert_eq!(s.duration, ms(40));
        assert_eq!(
            s.tasks,
            [
                (src(), stats(100, 0, 2, 30)),
                (sink(), stats(250, 12, 1, 40))
            ]
        );
    }

    #[test]
    fn duplicate_acks_are_ignored_and_keep_the_first_payload() {
        let (mut c, t0) = started();
        assert!(c.ack(t0, src(), C1, 1, AckStats::default()).is_empty());
        assert!(c.ack(t0, src(), C1, 2, AckStats::default()).is_empty());
        let a = c.ack(t0, sink(), C1, 3, AckStats::default());
        let Action::Complete { acks, .. } = &a[0] else {
            panic!()
        };
        assert_eq!(acks, &[(src(), 1), (sink(), 3)]);
        // after Complete, a repeated ack changes nothing
        assert!(c.ack(t0, sink(), C1, 4, AckStats::default()).is_empty());
    }

    #[test]
    fn acks_for_unknown_future_or_completed_ids_are_ignored() {
        let (mut c, t0) = started();
        assert!(
            c.ack(t0, src(), CheckpointId(0), 0, AckStats::default())
                .is_empty()
        );
        assert!(
            c.ack(t0, src(), CheckpointId(99), 0, AckStats::default())
                .is_empty()
        );
        finish(&mut c, t0 + ms(150), 1);
        assert!(c.ack(t0, src(), C1, 0, AckStats::default()).is_empty());
        assert!(c.completed(t0, C1).is_empty());
    }

    #[test]
    fn acks_from_unknown_tasks_are_ignored() {
        let (mut c, t0) = started();
        assert!(
            c.ack(t0, TaskKey::new(9, 9), C1, 0, AckStats::default())
                .is_empty()
        );
        assert!(c.decline(t0, TaskKey::new(9, 9), C1, "?").is_empty());
        assert!(c.ack(t0, src(), C1, 0, AckStats::default()).is_empty());
        assert_eq!(c.ack(t0, sink(), C1, 0, AckStats::default()).len(), 1);
    }

    #[test]
    fn late_acks_after_timeout_are_ignored() {
        let (mut c, t0) = started();
        c.ack(t0 + ms(150), src(), C1, 0, AckStats::default());
        let a = c.tick(t0 + ms(1100));
        assert_eq!(aborted(&a), [(1, AbortReason::Timeout { after: ms(1000) })]);
        assert!(
            c.ack(t0 + ms(1200), sink(), C1, 0, AckStats::default())
                .is_empty()
        );
        assert!(c.completed(t0 + ms(1200), C1).is_empty());
        assert!(c.decline(t0 + ms(1200), sink(), C1, "late").is_empty());
    }

    #[test]
    fn decline_aborts_and_later_acks_are_ignored() {
        let (mut c, t0) = started();
        c.ack(t0, src(), C1, 0, AckStats::default());
        let a = c.decline(t0 + ms(120), sink(), C1, "snapshot failed: disk full");
        assert_eq!(
            a,
            [Action::Abort {
                id: C1,
                kind: CheckpointKind::Checkpoint,
                reason: AbortReason::Declined {
                    task: sink(),
                    reason: "snapshot failed: disk full".into()
                },
            }]
        );
        assert!(c.ack(t0, sink(), C1, 0, AckStats::default()).is_empty());
        assert!(c.decline(t0, sink(), C1, "again").is_empty());
        assert_eq!(c.pending().count(), 0);
    }

    #[test]
    fn decline_after_all_acks_is_ignored() {
        let (mut c, t0) = started();
        c.ack(t0, src(), C1, 0, AckStats::default());
        c.ack(t0, sink(), C1, 0, AckStats::default());
        assert!(c.decline(t0, sink(), C1, "too late").is_empty());
        assert_eq!(c.completed(t0, C1).len(), 1);
    }

    #[test]
    fn task_failure_aborts_all_waiting_checkpoints() {
        let mut c = coordinator(CoordinatorConfig {
            max_concurrent: 3,
            ..config(100, 0, 10_000)
        });
        let t0 = Instant::now();
        for k in 0..3 {
            c.trigger_now(
                t0,
                [
                    CheckpointKind::Checkpoint,
                    CheckpointKind::Savepoint,
                    CheckpointKind::Checkpoint,
                ][k],
            );
        }
        // checkpoint 3 has all acks: its metadata is being written, it survives
        c.ack(t0, src(), CheckpointId(3), 0, AckStats::default());
        c.ack(t0, sink(), CheckpointId(3), 0, AckStats::default());
        let a = c.task_failed(t0 + ms(10), sink());
        assert_eq!(
            aborted(&a),
            [
                (1, AbortReason::TaskFailed { task: sink() }),
                (2, AbortReason::TaskFailed { task: sink() })
            ]
        );
        assert_eq!(
            c.pending().map(|(id, _)| id).collect::<Vec<_>>(),
            [CheckpointId(3)]
        );
        assert_eq!(c.completed(t0, CheckpointId(3)).len(), 1);
    }

    #[test]
    fn task_failure_keeps_queued_requests_for_the_next_tick() {
        let (mut c, t0) = started();
        c.trigger_now(t0 + ms(110), CheckpointKind::Savepoint);
        let a = c.task_failed(t0 + ms(120), src());
        assert_eq!(aborted(&a).len(), 1);
        assert!(triggered(&a).is_empty());
        assert_eq!(
            triggered(&c.tick(t0 + ms(130))),
            [(2, CheckpointKind::Savepoint)]
        );
    }

    #[test]
    fn newer_completion_subsumes_older_pending() {
        let mut c = coordinator(CoordinatorConfig {
            max_concurrent: 3,
            ..config(100, 0, 10_000)
        });
        let t0 = Instant::now();
        c.tick(t0);
        c.tick(t0 + ms(100));
        c.tick(t0 + ms(200));
        c.tick(t0 + ms(300));
        // 2 acks fully before 1
        c.ack(t0 + ms(310), src(), CheckpointId(1), 0, AckStats::default());
        let a = finish(&mut c, t0 + ms(320), 2);
        assert_eq!(
            aborted(&a),
            [(
                1,
                AbortReason::Subsumed {
                    by: CheckpointId(2)
                }
            )]
        );
        assert!(matches!(
            a.last(),
            Some(Action::Notify {
                id: CheckpointId(2),
                ..
            })
        ));
        assert_eq!(
            c.pending().map(|(id, _)| id).collect::<Vec<_>>(),
            [CheckpointId(3)]
        );
        // late ack for the subsumed checkpoint
        assert!(
            c.ack(t0, sink(), CheckpointId(1), 0, AckStats::default())
                .is_empty()
        );
    }

    #[test]
    fn subsumption_also_ends_an_older_finalizing_checkpoint() {
        let mut c = coordinator(CoordinatorConfig {
            max_concurrent: 2,
            ..config(100, 0, 10_000)
        });
        let t0 = Instant::now();
        c.trigger_now(t0, CheckpointKind::Checkpoint);
        c.trigger_now(t0, CheckpointKind::Checkpoint);
        for id in [1, 2] {
            c.ack(t0, src(), CheckpointId(id), 0, AckStats::default());
            c.ack(t0, sink(), CheckpointId(id), 0, AckStats::default());
        }
        let a = c.completed(t0, CheckpointId(2));
        assert_eq!(
            aborted(&a),
            [(
                1,
                AbortReason::Subsumed {
                    by: CheckpointId(2)
                }
            )]
        );
        // completing the older one afterwards would be out of order: ignored
        assert!(c.completed(t0, CheckpointId(1)).is_empty());
        assert_eq!(c.latest_completed(), Some(CheckpointId(2)));
    }

    #[test]
    fn completed_before_all_acks_is_ignored() {
        let (mut c, t0) = started();
        c.ack(t0, src(), C1, 0, AckStats::default());
        assert!(c.completed(t0, C1).is_empty());
        assert_eq!(c.latest_completed(), None);
        assert_eq!(c.pending().count(), 1);
    }

    #[test]
    fn completion_failure_aborts_and_starts_queued() {
        let (mut c, t0) = started();
        c.trigger_now(t0, CheckpointKind::Savepoint);
        assert!(c.completion_failed(t0, C1, "not yet").is_empty());
        c.ack(t0, src(), C1, 0, AckStats::default());
        c.ack(t0, sink(), C1, 0, AckStats::default());
        let a = c.completion_failed(t0 + ms(300), C1, "disk full");
        assert_eq!(
            aborted(&a),
            [(
                1,
                AbortReason::CompletionFailed {
                    reason: "disk full".into()
                }
            )]
        );
        assert_eq!(triggered(&a), [(2, CheckpointKind::Savepoint)]);
        assert!(c.completed(t0, C1).is_empty());
    }

    #[test]
    fn a_single_task_job_completes_on_its_own_ack() {
        let mut c: Coordinator<()> = Coordinator::new(
            CoordinatorConfig::default(),
            Participants::new([src()], [src()]),
            CheckpointId(5),
        )
        .unwrap();
        let t0 = Instant::now();
        c.trigger_now(t0, CheckpointKind::Final);
        let a = c.ack(
            t0 + Duration::from_secs(1),
            src(),
            CheckpointId(5),
            (),
            AckStats::default(),
        );
        assert!(matches!(
            &a[..],
            [Action::Complete {
                kind: CheckpointKind::Final,
                ..
            }]
        ));
        let a = c.completed(t0, CheckpointId(5));
        assert_eq!(
            a,
            [Action::Notify {
                id: CheckpointId(5),
                kind: CheckpointKind::Final
            }]
        );
    }
}
