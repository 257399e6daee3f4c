//! Property test of the coordinator: random sequences of ticks, explicit triggers, acks,
//! declines, failures and completions never complete a checkpoint without every ack, never
//! complete out of order, and never lose an explicit request.

use super::{AckStats, Action, Coordinator, CoordinatorConfig, Participants, TaskKey};
use crate::CheckpointKind;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use weir_core::ids::CheckpointId;

#[derive(Debug, Clone)]
enum Op {
    Tick(u64),
    TriggerNow(u8),
    Ack(u8, u8),
    AckAll(u8),
    Decline(u8, u8),
    TaskFailed(u8),
    Completed(u8),
    CompletionFailed(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u64..40).prop_map(Op::Tick),
        1 => (0u8..3).prop_map(Op::TriggerNow),
        12 => (0u8..3, any::<u8>()).prop_map(|(t, s)| Op::Ack(t, s)),
        3 => any::<u8>().prop_map(Op::AckAll),
        1 => (0u8..3, any::<u8>()).prop_map(|(t, s)| Op::Decline(t, s)),
        1 => (0u8..3).prop_map(Op::TaskFailed),
        3 => any::<u8>().prop_map(Op::Completed),
        1 => any::<u8>().prop_map(Op::CompletionFailed),
    ]
}

const FIRST: u64 = 10;

#[derive(Default)]
struct Model {
    triggered: Vec<u64>,
    ended: BTreeSet<u64>,
    complete_emitted: BTreeSet<u64>,
    notified: Vec<u64>,
    /// First payload each task sent while the checkpoint could accept it.
    first_payload: BTreeMap<(u64, TaskKey), u32>,
    explicit_requested: usize,
    explicit_triggered: usize,
}

impl Model {
    fn live(&self, id: u64) -> bool {
        self.triggered.contains(&id)
            && !self.ended.contains(&id)
            && !self.complete_emitted.contains(&id)
    }

    /// One of the few newest triggered ids, or (rarely) one that never existed.
    fn pick(&self, sel: u8) -> u64 {
        if self.triggered.is_empty() || sel >= 230 {
            return if sel.is_multiple_of(2) {
                FIRST - 1
            } else {
                FIRST + 1000
            };
        }
        let newest = self.triggered.len() - 1;
        if sel < 150 {
            return self.triggered[newest];
        }
        let n = self.triggered.len().min(4);
        self.triggered[newest - (sel as usize % n)]
    }

    fn check(&mut self, actions: &[Action<u32>], tasks: &[TaskKey]) -> Result<(), TestCaseError> {
        for a in actions {
            match a {
                Action::Trigger { id, kind, .. } => {
                    let expected = FIRST + self.triggered.len() as u64;
                    prop_assert_eq!(id.0, expected, "ids are consecutive from first_id");
                    self.triggered.push(id.0);
                    if *kind != CheckpointKind::Checkpoint {
                        self.explicit_triggered += 1;
                    }
                }
                Action::Complete { id, acks, .. } => {
                    prop_assert!(self.live(id.0), "Complete for {} which is not live", id);
                    let keys: Vec<TaskKey> = acks.iter().map(|(t, _)| *t).collect();
                    prop_assert_eq!(&keys[..], tasks, "Complete without every ack");
                    for (t, payload) in acks {
                        prop_assert_eq!(self.first_payload.get(&(id.0, *t)), Some(payload));
                    }
                    self.complete_emitted.insert(id.0);
                }
                Action::Notify { id, .. } => {
                    prop_assert!(self.complete_emitted.contains(&id.0));
                    prop_assert!(
                        !self.ended.contains(&id.0),
                        "Notify after the end of {}",
                        id
                    );
                    if let Some(last) = self.notified.last() {
                        prop_assert!(
                            id.0 > *last,
                            "completed out of order: {} after {}",
                            id,
                            last
                        );
                    }
                    self.notified.push(id.0);
                    self.ended.insert(id.0);
                }
                Action::Abort { id, .. } => {
                    prop_assert!(self.triggered.contains(&id.0));
                    prop_assert!(!self.ended.contains(&id.0), "second end of {}", id);
                    self.ended.insert(id.0);
                }
                Action::Fail { .. } => {
                    prop_assert!(false, "Fail without tolerable_timeouts");
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn coordinator_invariants(
        ops in prop::collection::vec(op(), 1..120),
        max_concurrent in 1usize..4,
        interval in 10u64..60,
        min_pause in 0u64..40,
        timeout in 20u64..500,
    ) {
        let config = CoordinatorConfig {
            interval: Duration::from_millis(interval),
            min_pause: Duration::from_millis(min_pause),
            timeout: Duration::from_millis(timeout),
            max_concurrent,
            tolerable_timeouts: None,
        };
        let sources = [TaskKey::new(0, 0), TaskKey::new(0, 1)];
        let tasks = [TaskKey::new(0, 0), TaskKey::new(0, 1), TaskKey::new(1, 0)];
        let mut c: Coordinator<u32> =
            Coordinator::new(config, Participants::new(sources, [tasks[2]]), CheckpointId(FIRST)).unwrap();
        let mut model = Model::default();
        let mut now = Instant::now();
        let mut payload = 0u32;
        for op in ops {
            let actions = match op {
                Op::Tick(ms) => {
                    now += Duration::from_millis(ms);
                    c.tick(now)
                }
                Op::TriggerNow(k) => {
                    let kind = [CheckpointKind::Checkpoint, CheckpointKind::Savepoint, CheckpointKind::Final][k as usize];
                    if kind != CheckpointKind::Checkpoint {
                        model.explicit_requested += 1;
                    }
                    c.trigger_now(now, kind)
                }
                Op::Ack(t, sel) => {
                    let id = model.pick(sel);
                    let task = tasks[t as usize];
                    payload += 1;
                    if model.live(id) {
                        model.first_payload.entry((id, task)).or_insert(payload);
                    }
                    c.ack(now, task, CheckpointId(id), payload, AckStats::default())
                }
                Op::AckAll(sel) => {
                    let id = model.pick(sel);
                    for task in tasks.iter().rev() {
                        payload += 1;
                        if model.live(id) {
                            model.first_payload.entry((id, *task)).or_insert(payload);
                        }
                        let a = c.ack(now, *task, CheckpointId(id), payload, AckStats::default());
                        model.check(&a, &tasks)?;
                    }
                    Vec::new() // already checked, one ack at a time
                }
                Op::Decline(t, sel) => c.decline(now, tasks[t as usize], CheckpointId(model.pick(sel)), "no"),
                Op::TaskFailed(t) => c.task_failed(now, tasks[t as usize]),
                Op::Completed(sel) => {
                    // mostly confirm a checkpoint that is waiting for it
                    let waiting: Vec<u64> = model.complete_emitted.iter().copied().filter(|id| !model.ended.contains(id)).collect();
                    let id = if !waiting.is_empty() && sel < 200 { waiting[sel as usize % waiting.len()] } else { model.pick(sel) };
                    c.completed(now, CheckpointId(id))
                }
                Op::CompletionFailed(sel) => c.completion_failed(now, CheckpointId(model.pick(sel)), "io"),
            };
            model.check(&actions, &tasks)?;
            prop_assert!(c.pending().count() <= max_concurrent);
            let live = model.triggered.iter().filter(|id| !model.ended.contains(id)).count();
            prop_assert_eq!(c.pending().count(), live);
        }
        let queued_explicit = c.queued().filter(|k| *k != CheckpointKind::Checkpoint).count();
        prop_assert_eq!(model.explicit_triggered + queued_explicit, model.explicit_requested, "an explicit request was lost");
        prop_assert_eq!(c.latest_completed().map(|id| id.0), model.notified.last().copied());
    }
}
