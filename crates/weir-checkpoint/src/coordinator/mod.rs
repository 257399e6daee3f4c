//! The sans-IO checkpoint coordinator (Carbone et al. 2015; Flink's CheckpointCoordinator).
//!
//! Owns the protocol state only: which checkpoints are pending, who has acknowledged, when
//! the next one is due. It starts no threads, reads no clock and touches no file: the runtime
//! passes the time into every call (like raft-rs `RawNode`) and carries out the returned
//! [`Action`]s in order — sending triggers, writing metadata (see [`crate::storage`]),
//! notifying tasks.
//!
//! Lifecycle of checkpoint `n`: [`Action::Trigger`] → every task [`ack`](Coordinator::ack)s
//! → [`Action::Complete`] (the runtime writes the metadata) →
//! [`completed`](Coordinator::completed) → [`Action::Notify`]. Timeout, a
//! [`decline`](Coordinator::decline), a [`task_failed`](Coordinator::task_failed) or a newer
//! completed checkpoint end it with [`Action::Abort`] instead. Timeouts in a row beyond
//! [`CoordinatorConfig::tolerable_timeouts`] end the coordinator's work with
//! [`Action::Fail`]: the runtime restarts the tasks.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use weir_checkpoint::{AckStats, Action, Coordinator, CoordinatorConfig, Participants, TaskKey};
//! use weir_core::ids::CheckpointId;
//!
//! let source = TaskKey::new(0, 0);
//! let sink = TaskKey::new(1, 0);
//! let config = CoordinatorConfig::every(Duration::from_secs(1));
//! let mut c: Coordinator<&str> =
//!     Coordinator::new(config, Participants::new([source], [sink]), CheckpointId(1)).unwrap();
//!
//! let t0 = Instant::now();
//! assert!(c.tick(t0).is_empty()); // the first tick starts the clock
//! let actions = c.tick(t0 + Duration::from_secs(1));
//! assert!(matches!(&actions[..], [Action::Trigger { id: CheckpointId(1), .. }]));
//!
//! let t1 = t0 + Duration::from_millis(1200);
//! assert!(c.ack(t1, source, CheckpointId(1), "offsets", AckStats::default()).is_empty());
//! let actions = c.ack(t1, sink, CheckpointId(1), "sink-txn", AckStats::default());
//! let Action::Complete { acks, .. } = &actions[0] else { panic!() };
//! assert_eq!(acks, &[(source, "offsets"), (sink, "sink-txn")]);
//!
//! // ... the runtime writes the metadata, then:
//! let actions = c.completed(t1, CheckpointId(1));
//! assert!(matches!(&actions[..], [Action::Notify { id: CheckpointId(1), .. }]));
//! assert_eq!(c.latest_completed(), Some(CheckpointId(1)));
//! ```

mod acks;
mod action;
mod config;
#[cfg(test)]
mod props;
mod timeouts;

pub use action::{AbortReason, AckStats, Action, CheckpointStats, TaskKey, TimedOut};
pub use config::{CoordinatorConfig, MIN_INTERVAL};

use crate::error::{Error, Result};
use crate::kind::CheckpointKind;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};
use weir_core::ids::CheckpointId;

/// The tasks that take part in checkpoints: all of them acknowledge, the sources are
/// triggered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Participants {
    sources: BTreeSet<TaskKey>,
    tasks: BTreeSet<TaskKey>,
}

impl Participants {
    /// `sources` are triggered and acknowledge; `others` only acknowledge. A task listed in
    /// both is a source.
    pub fn new(
        sources: impl IntoIterator<Item = TaskKey>,
        others: impl IntoIterator<Item = TaskKey>,
    ) -> Self {
        let sources: BTreeSet<TaskKey> = sources.into_iter().collect();
        let mut tasks: BTreeSet<TaskKey> = others.into_iter().collect();
        tasks.extend(sources.iter().copied());
        Participants { sources, tasks }
    }
}

/// State of one pending checkpoint.
#[derive(Debug)]
struct Pending<T> {
    kind: CheckpointKind,
    triggered_at: Instant,
    acks: BTreeMap<TaskKey, (T, AckStats)>,
    /// All acknowledgements are in and [`Action::Complete`] was emitted; only `completed`,
    /// `completion_failed` or a newer completion end it now.
    finalizing: bool,
    /// Timeouts counted for it while finalizing (one per `timeout` it has taken).
    overdue: u32,
}

/// The checkpoint coordinator state machine; `T` is a task's snapshot handle.
///
/// Calls that are out of place (an ack for an unknown, aborted or already complete
/// checkpoint, a duplicate ack, an unknown task) are ignored and return no actions; none
/// panics.
#[derive(Debug)]
pub struct Coordinator<T> {
    config: CoordinatorConfig,
    participants: Participants,
    next_id: CheckpointId,
    pending: BTreeMap<CheckpointId, Pending<T>>,
    queued: VecDeque<CheckpointKind>,
    started_at: Option<Instant>,
    last_trigger: Option<Instant>,
    last_end: Option<Instant>,
    latest_completed: Option<CheckpointId>,
    final_requested: bool,
    /// Checkpoints timed out in a row (see [`CoordinatorConfig::tolerable_timeouts`]).
    timeouts_in_a_row: u32,
    /// [`Action::Fail`] was emitted: nothing is triggered any more.
    failed: bool,
}

impl<T> Coordinator<T> {
    /// A coordinator whose first checkpoint gets `first_id`. After a restore, pass
    /// [`CheckpointStorage::next_id`](crate::CheckpointStorage::next_id) so that numbering
    /// resumes after every checkpoint directory that exists.
    ///
    /// Fails when the configuration is invalid or there is no source.
    pub fn new(
        config: CoordinatorConfig,
        participants: Participants,
        first_id: CheckpointId,
    ) -> Result<Self> {
        config.validate()?;
        if participants.sources.is_empty() {
            return Err(Error::InvalidConfig(
                "the checkpoint coordinator has no source task to trigger; list the source \
                 subtasks in Participants::new"
                    .into(),
            ));
        }
        Ok(Coordinator {
            config,
            participants,
            next_id: first_id,
            pending: BTreeMap::new(),
            queued: VecDeque::new(),
            started_at: None,
            last_trigger: None,
            last_end: None,
            latest_completed: None,
            final_requested: false,
            timeouts_in_a_row: 0,
            failed: false,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CoordinatorConfig {
        &self.config
    }

    /// The tasks that must acknowledge every checkpoint, ordered.
    pub fn tasks(&self) -> impl Iterator<Item = TaskKey> + '_ {
        self.participants.tasks.iter().copied()
    }

    /// The tasks that are triggered, ordered.
    pub fn sources(&self) -> impl Iterator<Item = TaskKey> + '_ {
        self.participants.sources.iter().copied()
    }

    /// The id the next triggered checkpoint will get.
    pub fn next_id(&self) -> CheckpointId {
        self.next_id
    }

    /// The newest checkpoint confirmed with [`completed`](Coordinator::completed).
    pub fn latest_completed(&self) -> Option<CheckpointId> {
        self.latest_completed
    }

    /// The pending checkpoints (triggered, not yet completed or aborted), oldest first.
    pub fn pending(&self) -> impl Iterator<Item = (CheckpointId, CheckpointKind)> + '_ {
        self.pending.iter().map(|(id, p)| (*id, p.kind))
    }

    /// Explicit requests waiting for a free slot (`max_concurrent`), oldest first.
    pub fn queued(&self) -> impl Iterator<Item = CheckpointKind> + '_ {
        self.queued.iter().copied()
    }

    /// Advances time: aborts pending checkpoints older than the timeout, starts queued
    /// explicit requests when a slot is free, and triggers a periodic checkpoint when
    /// `interval` has passed since the last trigger and `min_pause` since the last completion
    /// or abort (at most one per call). The first call only starts the clock (unless an
    /// explicit request did before): the first periodic checkpoint comes one interval later.
    ///
    /// Periodic triggering stops once a [`CheckpointKind::Final`] checkpoint was requested,
    /// and every triggering once [`Action::Fail`] was returned.
    pub fn tick(&mut self, now: Instant) -> Vec<Action<T>> {
        self.started_at.get_or_insert(now);
        let mut actions = Vec::new();
        self.time_out(now, &mut actions);
        self.drain_queue(now, &mut actions);
        if self.periodic_due_at().is_some_and(|due| now >= due) {
            self.trigger(now, CheckpointKind::Checkpoint, &mut actions);
        }
        actions
    }

    /// Requests a checkpoint of `kind` now (a savepoint, the final checkpoint at the end of
    /// bounded input, or a manual checkpoint). It is triggered at once when fewer than
    /// `max_concurrent` are pending, otherwise queued and triggered as soon as one ends.
    /// Explicit requests do not wait for `min_pause`.
    pub fn trigger_now(&mut self, now: Instant, kind: CheckpointKind) -> Vec<Action<T>> {
        self.started_at.get_or_insert(now);
        if kind == CheckpointKind::Final {
            self.final_requested = true;
        }
        self.queued.push_back(kind);
        let mut actions = Vec::new();
        self.drain_queue(now, &mut actions);
        actions
    }

    /// The earliest time at which [`tick`](Coordinator::tick) may have something to do (a
    /// periodic trigger or a timeout), so the runtime can sleep until then. `None` when only
    /// an external event can change anything, or before the first tick.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timeout_deadline()
            .into_iter()
            .chain(self.periodic_due_at())
            .min()
    }

    /// When the next periodic checkpoint is due, if one can be triggered at all now.
    fn periodic_due_at(&self) -> Option<Instant> {
        let started = self.started_at?;
        if !self.config.is_periodic()
            || self.failed
            || self.final_requested
            || !self.queued.is_empty()
            || self.pending.len() >= self.config.max_concurrent
        {
            return None;
        }
        let after_interval = self
            .last_trigger
            .unwrap_or(started)
            .checked_add(self.config.interval)?;
        match self.last_end {
            Some(end) => Some(after_interval.max(end.checked_add(self.config.min_pause)?)),
            None => Some(after_interval),
        }
    }

    fn drain_queue(&mut self, now: Instant, actions: &mut Vec<Action<T>>) {
        while !self.failed && self.pending.len() < self.config.max_concurrent {
            let Some(kind) = self.queued.pop_front() else {
                break;
            };
            self.trigger(now, kind, actions);
        }
    }

    fn trigger(&mut self, now: Instant, kind: CheckpointKind, actions: &mut Vec<Action<T>>) {
        let id = self.next_id;
        self.next_id = CheckpointId(id.0 + 1);
        self.last_trigger = Some(now);
        self.pending.insert(
            id,
            Pending {
                kind,
                triggered_at: now,
                acks: BTreeMap::new(),
                finalizing: false,
                overdue: 0,
            },
        );
        tracing::debug!(checkpoint = %id, %kind, "triggering checkpoint");
        actions.push(Action::Trigger {
            id,
            kind,
            sources: self.sources().collect(),
        });
    }

    fn abort(
        &mut self,
        now: Instant,
        id: CheckpointId,
        reason: AbortReason,
        actions: &mut Vec<Action<T>>,
    ) {
        if let Some(p) = self.pending.remove(&id) {
            self.last_end = Some(now);
            // The runtime reports it, naming the job.
            tracing::debug!(checkpoint = %id, kind = %p.kind, %reason, "checkpoint aborted");
            actions.push(Action::Abort {
                id,
                kind: p.kind,
                reason,
            });
        }
    }
}

/// Time since `t`, for statistics.
fn since(now: Instant, t: Instant) -> Duration {
    now.saturating_duration_since(t)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    pub(crate) fn src() -> TaskKey {
        TaskKey::new(0, 0)
    }
    pub(crate) fn sink() -> TaskKey {
        TaskKey::new(1, 0)
    }

    pub(crate) fn coordinator(config: CoordinatorConfig) -> Coordinator<u32> {
        Coordinator::new(
            config,
            Participants::new([src()], [sink()]),
            CheckpointId(1),
        )
        .unwrap()
    }

    pub(crate) fn config(interval: u64, min_pause: u64, timeout: u64) -> CoordinatorConfig {
        CoordinatorConfig {
            interval: ms(interval),
            min_pause: ms(min_pause),
            timeout: ms(timeout),
            max_concurrent: 1,
            tolerable_timeouts: None,
        }
    }

    pub(crate) fn triggered(actions: &[Action<u32>]) -> Vec<(u64, CheckpointKind)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Trigger { id, kind, .. } => Some((id.0, *kind)),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn aborted(actions: &[Action<u32>]) -> Vec<(u64, AbortReason)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Abort { id, reason, .. } => Some((id.0, reason.clone())),
                _ => None,
            })
            .collect()
    }

    /// Acks `id` from both tasks and confirms completion at `now`.
    pub(crate) fn finish(c: &mut Coordinator<u32>, now: Instant, id: u64) -> Vec<Action<u32>> {
        let id = CheckpointId(id);
        let mut actions = c.ack(now, src(), id, 0, AckStats::default());
        actions.extend(c.ack(now, sink(), id, 1, AckStats::default()));
        assert!(
            matches!(actions.last(), Some(Action::Complete { .. })),
            "{actions:?}"
        );
        c.completed(now, id)
    }

    #[test]
    fn new_rejects_invalid_config_and_missing_sources() {
        let bad = CoordinatorConfig {
            max_concurrent: 0,
            ..CoordinatorConfig::default()
        };
        let e = Coordinator::<u32>::new(bad, Participants::new([src()], []), CheckpointId(1));
        assert!(matches!(e, Err(Error::InvalidConfig(_))));
        let e = Coordinator::<u32>::new(
            CoordinatorConfig::default(),
            Participants::new([], [sink()]),
            CheckpointId(1),
        );
        assert!(e.unwrap_err().to_string().contains("no source"));
    }

    #[test]
    fn sources_are_also_tasks() {
        let c = coordinator(CoordinatorConfig::default());
        assert_eq!(c.tasks().collect::<Vec<_>>(), [src(), sink()]);
        assert_eq!(c.sources().collect::<Vec<_>>(), [src()]);
    }

    #[test]
    fn first_tick_starts_the_clock_and_interval_triggers() {
        let mut c = coordinator(config(100, 0, 10_000));
        let t0 = Instant::now();
        assert!(c.tick(t0).is_empty());
        assert!(c.tick(t0 + ms(99)).is_empty());
        let a = c.tick(t0 + ms(100));
        assert_eq!(triggered(&a), [(1, CheckpointKind::Checkpoint)]);
        let Action::Trigger { sources, .. } = &a[0] else {
            panic!()
        };
        assert_eq!(sources, &[src()]);
        assert_eq!(
            c.pending().collect::<Vec<_>>(),
            [(CheckpointId(1), CheckpointKind::Checkpoint)]
        );
    }

    #[test]
    fn cadence_follows_interval_from_last_trigger() {
        let mut c = coordinator(config(100, 0, 10_000));
        let t0 = Instant::now();
        c.tick(t0);
        assert_eq!(
            triggered(&c.tick(t0 + ms(100))),
            [(1, CheckpointKind::Checkpoint)]
        );
        finish(&mut c, t0 + ms(130), 1);
        assert!(c.tick(t0 + ms(199)).is_empty());
        assert_eq!(
            triggered(&c.tick(t0 + ms(200))),
            [(2, CheckpointKind::Checkpoint)]
        );
        assert_eq!(c.next_id(), CheckpointId(3));
    }

    #[test]
    fn late_tick_triggers_only_once() {
        let mut c = coordinator(config(100, 0, 10_000));
        let t0 = Instant::now();
        c.tick(t0);
        let a = c.tick(t0 + ms(1000));
        assert_eq!(triggered(&a), [(1, CheckpointKind::Checkpoint)]);
    }

    #[test]
    fn min_pause_delays_the_next_trigger_after_completion() {
        let mut c = coordinator(config(100, 80, 10_000));
        let t0 = Instant::now();
        c.tick(t0);
        c.tick(t0 + ms(100));
        finish(&mut c, t0 + ms(190), 1);
        // interval since trigger has passed at 200, but min pause runs until 270.
        assert!(c.tick(t0 + ms(200)).is_empty());
        assert!(c.tick(t0 + ms(269)).is_empty());
        assert_eq!(c.next_deadline(), Some(t0 + ms(270)));
        assert_eq!(
            triggered(&c.tick(t0 + ms(270))),
            [(2, CheckpointKind::Checkpoint)]
        );
    }

    #[test]
    fn min_pause_also_counts_from_an_abort() {
        let mut c = coordinator(config(100, 50, 30));
        let t0 = Instant::now();
        c.tick(t0);
        c.tick(t0 + ms(100));
        let a = c.tick(t0 + ms(130));
        assert_eq!(aborted(&a), [(1, AbortReason::Timeout { after: ms(30) })]);
        assert!(c.tick(t0 + ms(179)).is_empty());
        assert_eq!(
            triggered(&c.tick(t0 + ms(200))),
            [(2, CheckpointKind::Checkpoint)]
        );
    }

    #[test]
    fn max_concurrent_one_blocks_periodic_triggers() {
        let mut c = coordinator(config(100, 0, 10_000));
        let t0 = Instant::now();
        c.tick(t0);
        c.tick(t0 + ms(100));
        assert!(c.tick(t0 + ms(250)).is_empty());
        assert!(c.tick(t0 + ms(900)).is_empty());
        finish(&mut c, t0 + ms(950), 1);
        // overdue: triggers on the next tick
        assert_eq!(
            triggered(&c.tick(t0 + ms(951))),
            [(2, CheckpointKind::Checkpoint)]
        );
    }

    #[test]
    fn max_concurrent_two_allows_overlap() {
        let mut c = coordinator(CoordinatorConfig {
            max_concurrent: 2,
            ..config(100, 0, 10_000)
        });
        let t0 = Instant::now();
        c.tick(t0);
        assert_eq!(triggered(&c.tick(t0 + ms(100))).len(), 1);
        assert_eq!(triggered(&c.tick(t0 + ms(200))).len(), 1);
        assert!(c.tick(t0 + ms(300)).is_empty());
        assert_eq!(c.pending().count(), 2);
    }

    #[test]
    fn timeout_aborts_and_frees_the_slot() {
        let mut c = coordinator(config(100, 0, 500));
        let t0 = Instant::now();
        c.tick(t0);
        c.tick(t0 + ms(100));
        assert_eq!(c.next_deadline(), Some(t0 + ms(600)));
        assert!(c.tick(t0 + ms(599)).is_empty());
        let a = c.tick(t0 + ms(600));
        // the abort comes first; the freed slot immediately takes the overdue periodic trigger
        assert_eq!(aborted(&a), [(1, AbortReason::Timeout { after: ms(500) })]);
        assert!(matches!(a[0], Action::Abort { .. }));
        assert_eq!(triggered(&a), [(2, CheckpointKind::Checkpoint)]);
    }

    #[test]
    fn disabled_interval_never_triggers_periodically() {
        let mut c = coordinator(CoordinatorConfig::default());
        let t0 = Instant::now();
        for s in 0..100 {
            assert!(c.tick(t0 + Duration::from_secs(s * 60)).is_empty());
        }
        assert_eq!(c.next_deadline(), None);
        let a = c.trigger_now(t0, CheckpointKind::Checkpoint);
        assert_eq!(triggered(&a), [(1, CheckpointKind::Checkpoint)]);
    }

    #[test]
    fn first_id_sets_numbering() {
        let mut c: Coordinator<u32> = Coordinator::new(
            config(100, 0, 10_000),
            Participants::new([src()], [sink()]),
            CheckpointId(42),
        )
        .unwrap();
        let t0 = Instant::now();
        assert_eq!(
            triggered(&c.trigger_now(t0, CheckpointKind::Savepoint)),
            [(42, CheckpointKind::Savepoint)]
        );
        finish(&mut c, t0, 42);
        assert_eq!(c.latest_completed(), Some(CheckpointId(42)));
        assert_eq!(
            triggered(&c.tick(t0 + ms(100))),
            [(43, CheckpointKind::Checkpoint)]
        );
    }

    #[test]
    fn explicit_request_is_queued_not_lost() {
        let mut c = coordinator(config(100, 1000, 10_000));
        let t0 = Instant::now();
        c.tick(t0);
        c.tick(t0 + ms(100));
        assert!(
            c.trigger_now(t0 + ms(110), CheckpointKind::Savepoint)
                .is_empty()
        );
        assert!(
            c.trigger_now(t0 + ms(120), CheckpointKind::Checkpoint)
                .is_empty()
        );
        assert_eq!(
            c.queued().collect::<Vec<_>>(),
            [CheckpointKind::Savepoint, CheckpointKind::Checkpoint]
        );
        // still blocked on the next tick
        assert!(c.tick(t0 + ms(130)).is_empty());
        // completion starts the first queued request right away, ignoring min_pause
        let a = finish(&mut c, t0 + ms(150), 1);
        assert!(matches!(
            a[0],
            Action::Notify {
                id: CheckpointId(1),
                ..
            }
        ));
        assert_eq!(triggered(&a), [(2, CheckpointKind::Savepoint)]);
        assert_eq!(c.queued().count(), 1);
        // an abort also frees the slot for the next queued request
        let a = c.decline(t0 + ms(160), sink(), CheckpointId(2), "no space");
        assert_eq!(triggered(&a), [(3, CheckpointKind::Checkpoint)]);
        assert_eq!(c.queued().count(), 0);
    }

    #[test]
    fn queued_requests_take_priority_over_periodic() {
        let mut c = coordinator(config(100, 0, 300));
        let t0 = Instant::now();
        c.tick(t0);
        c.tick(t0 + ms(100));
        c.trigger_now(t0 + ms(150), CheckpointKind::Savepoint);
        // checkpoint 1 times out; the queued savepoint takes the slot, not a periodic one
        let a = c.tick(t0 + ms(400));
        assert_eq!(aborted(&a).len(), 1);
        assert_eq!(triggered(&a), [(2, CheckpointKind::Savepoint)]);
    }

    #[test]
    fn final_request_stops_periodic_checkpoints() {
        let mut c = coordinator(config(100, 0, 10_000));
        let t0 = Instant::now();
        c.tick(t0);
        let a = c.trigger_now(t0 + ms(10), CheckpointKind::Final);
        assert_eq!(triggered(&a), [(1, CheckpointKind::Final)]);
        finish(&mut c, t0 + ms(20), 1);
        assert!(c.tick(t0 + ms(1000)).is_empty());
        assert_eq!(c.next_deadline(), None);
        // a failed final checkpoint can be requested again explicitly
        assert_eq!(
            triggered(&c.trigger_now(t0 + ms(1100), CheckpointKind::Final)),
            [(2, CheckpointKind::Final)]
        );
    }

    #[test]
    fn explicit_trigger_resets_the_interval() {
        let mut c = coordinator(config(100, 0, 10_000));
        let t0 = Instant::now();
        c.tick(t0);
        c.trigger_now(t0 + ms(50), CheckpointKind::Checkpoint);
        finish(&mut c, t0 + ms(60), 1);
        assert!(c.tick(t0 + ms(100)).is_empty());
        assert_eq!(
            triggered(&c.tick(t0 + ms(150))),
            [(2, CheckpointKind::Checkpoint)]
        );
    }

    #[test]
    fn time_going_backwards_is_harmless() {
        let mut c = coordinator(config(100, 0, 500));
        let t0 = Instant::now() + Duration::from_secs(10);
        c.tick(t0);
        c.tick(t0 + ms(100));
        assert!(c.tick(t0 - Duration::from_secs(5)).is_empty());
        assert_eq!(c.pending().count(), 1);
    }
}
