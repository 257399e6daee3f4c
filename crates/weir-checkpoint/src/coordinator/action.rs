//! What the coordinator talks about: [`TaskKey`], [`AckStats`], [`CheckpointStats`],
//! [`AbortReason`] and the [`Action`]s it asks the runtime to carry out.
//!
//! Plain data; the state machine lives in the parent module.

use crate::kind::CheckpointKind;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::{Duration, Instant};
use weir_core::ids::{CheckpointId, NodeId, SubtaskIndex};

/// One task (a subtask of a node of the graph) that takes part in checkpoints.
///
/// ```
/// use weir_checkpoint::TaskKey;
/// let t = TaskKey::new(2, 0);
/// assert_eq!(t.to_string(), "node 2 subtask 0");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskKey {
    /// The node in the logical graph (for a chain of operators: its head).
    pub node: NodeId,
    /// The subtask index within the node's parallelism.
    pub subtask: SubtaskIndex,
}

impl TaskKey {
    /// The task of subtask `subtask` of node `node`.
    pub fn new(node: usize, subtask: usize) -> Self {
        TaskKey {
            node: NodeId(node),
            subtask: SubtaskIndex(subtask),
        }
    }
}

impl fmt::Display for TaskKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} subtask {}", self.node, self.subtask)
    }
}

/// Measurements a task reports with its acknowledgement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AckStats {
    /// Bytes of state the task wrote for this checkpoint (not counting reused shared files).
    pub bytes: u64,
    /// Time between the first and the last barrier of this checkpoint on the task's inputs.
    pub alignment: Duration,
    /// The synchronous part of the snapshot (the task's processing was paused).
    pub sync: Duration,
    /// The asynchronous part (uploading files in the background).
    pub async_: Duration,
}

/// Statistics of a checkpoint whose acknowledgements are all in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointStats {
    /// When the checkpoint was triggered (the `now` given to the triggering call).
    pub triggered_at: Instant,
    /// From trigger to the last acknowledgement.
    pub duration: Duration,
    /// Sum of [`AckStats::bytes`] over all tasks.
    pub bytes: u64,
    /// Longest [`AckStats::alignment`] of any task.
    pub max_alignment: Duration,
    /// Longest [`AckStats::sync`] of any task.
    pub max_sync: Duration,
    /// Longest [`AckStats::async_`] of any task.
    pub max_async: Duration,
    /// Each task's own report, ordered by task.
    pub tasks: Vec<(TaskKey, AckStats)>,
}

/// Why a checkpoint was aborted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AbortReason {
    /// Not every task acknowledged within the configured timeout.
    Timeout {
        /// The configured timeout.
        after: Duration,
    },
    /// A task declined the checkpoint (for example it could not snapshot its state).
    Declined {
        /// The task that declined.
        task: TaskKey,
        /// The task's explanation.
        reason: String,
    },
    /// A task failed while the checkpoint was pending.
    TaskFailed {
        /// The failed task.
        task: TaskKey,
    },
    /// A newer checkpoint completed first.
    Subsumed {
        /// The newer, completed checkpoint.
        by: CheckpointId,
    },
    /// The runtime could not write the checkpoint's metadata.
    CompletionFailed {
        /// The runtime's explanation.
        reason: String,
    },
}

impl fmt::Display for AbortReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AbortReason::Timeout { after } => write!(f, "timed out after {after:?}"),
            AbortReason::Declined { task, reason } => write!(f, "declined by {task}: {reason}"),
            AbortReason::TaskFailed { task } => write!(f, "{task} failed"),
            AbortReason::Subsumed { by } => write!(f, "subsumed by checkpoint {by}"),
            AbortReason::CompletionFailed { reason } => {
                write!(f, "writing the metadata failed: {reason}")
            }
        }
    }
}

/// Why the coordinator gave up on the running tasks ([`Action::Fail`]): checkpoints timed
/// out more often in a row than [`CoordinatorConfig::tolerable_timeouts`](crate::CoordinatorConfig::tolerable_timeouts) allows.
///
/// ```
/// use std::time::Duration;
/// use weir_checkpoint::TimedOut;
/// let t = TimedOut { in_a_row: 1, tolerable: 0, after: Duration::from_secs(600), writing: true };
/// assert_eq!(
///     t.to_string(),
///     "every task acknowledged it, but its files were not written within 600s \
///      (1 timeout in a row, 0 tolerated)"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut {
    /// Timeouts in a row, this one included.
    pub in_a_row: u32,
    /// The configured number tolerated.
    pub tolerable: u32,
    /// The configured timeout.
    pub after: Duration,
    /// The last checkpoint had every acknowledgement and was being written (its state
    /// backends' files or its metadata); otherwise a task had not acknowledged it.
    pub writing: bool,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let TimedOut {
            in_a_row,
            tolerable,
            after,
            writing,
        } = self;
        if *writing {
            write!(
                f,
                "every task acknowledged it, but its files were not written within {after:?}"
            )?;
        } else {
            write!(f, "not every task acknowledged it within {after:?}")?;
        }
        let s = if *in_a_row == 1 { "" } else { "s" };
        write!(
            f,
            " ({in_a_row} timeout{s} in a row, {tolerable} tolerated)"
        )
    }
}

/// Something the runtime must do, returned by every coordinator call.
///
/// Carry out the actions in the order returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<T> {
    /// Start checkpoint `id`: tell every source task to snapshot and emit `Barrier(id)`.
    Trigger {
        /// The new checkpoint.
        id: CheckpointId,
        /// Why it is taken.
        kind: CheckpointKind,
        /// The tasks to trigger (the sources), ordered.
        sources: Vec<TaskKey>,
    },
    /// Every task acknowledged `id`: write its metadata (last, atomically), then call
    /// [`Coordinator::completed`](crate::Coordinator::completed) — or
    /// [`Coordinator::completion_failed`](crate::Coordinator::completion_failed) if writing
    /// failed.
    Complete {
        /// The checkpoint.
        id: CheckpointId,
        /// Why it was taken.
        kind: CheckpointKind,
        /// Every task's snapshot handle, ordered by task.
        acks: Vec<(TaskKey, T)>,
        /// Aggregated statistics.
        stats: CheckpointStats,
    },
    /// Checkpoint `id` is complete and the latest one: call `notify_checkpoint_complete(id)`
    /// on every task (sinks commit).
    Notify {
        /// The checkpoint.
        id: CheckpointId,
        /// Why it was taken.
        kind: CheckpointKind,
    },
    /// Checkpoint `id` will never complete: tell the tasks to drop what they hold for it;
    /// its directory may be discarded.
    Abort {
        /// The checkpoint.
        id: CheckpointId,
        /// Why it was taken.
        kind: CheckpointKind,
        /// Why it was aborted.
        reason: AbortReason,
    },
    /// Checkpoints time out, more of them in a row than
    /// [`CoordinatorConfig::tolerable_timeouts`](crate::CoordinatorConfig::tolerable_timeouts)
    /// allows: something in the job stopped answering, and only a restart ends that. Stop
    /// the running tasks and restart them from the latest completed checkpoint. The
    /// coordinator triggers nothing more; the runtime starts a new one for the new tasks.
    Fail {
        /// The checkpoint that timed out last (still pending when it was being written).
        id: CheckpointId,
        /// How it timed out.
        reason: TimedOut,
    },
}

impl<T> Action<T> {
    /// The checkpoint the action is about.
    pub fn id(&self) -> CheckpointId {
        match self {
            Action::Trigger { id, .. }
            | Action::Complete { id, .. }
            | Action::Notify { id, .. }
            | Action::Abort { id, .. }
            | Action::Fail { id, .. } => *id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_well() {
        let t = TaskKey::new(1, 3);
        assert_eq!(
            AbortReason::Declined {
                task: t,
                reason: "disk full".into()
            }
            .to_string(),
            "declined by node 1 subtask 3: disk full"
        );
        assert_eq!(
            AbortReason::Subsumed {
                by: CheckpointId(9)
            }
            .to_string(),
            "subsumed by checkpoint 9"
        );
        assert_eq!(
            AbortReason::Timeout {
                after: Duration::from_secs(2)
            }
            .to_string(),
            "timed out after 2s"
        );
        assert_eq!(
            AbortReason::TaskFailed { task: t }.to_string(),
            "node 1 subtask 3 failed"
        );
    }

    #[test]
    fn task_keys_order_by_node_then_subtask() {
        let mut v = vec![TaskKey::new(1, 0), TaskKey::new(0, 1), TaskKey::new(0, 0)];
        v.sort();
        assert_eq!(
            v,
            [TaskKey::new(0, 0), TaskKey::new(0, 1), TaskKey::new(1, 0)]
        );
    }

    #[test]
    fn action_id() {
        let a: Action<()> = Action::Notify {
            id: CheckpointId(4),
            kind: CheckpointKind::Final,
        };
        assert_eq!(a.id(), CheckpointId(4));
    }
}
