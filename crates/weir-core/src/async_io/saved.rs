//! The async I/O operator's part in checkpoints: what a subtask stores at a barrier (its
//! queued records in arrival order, with their routes), how a restore shares the stored
//! records among the new subtasks, and the description `weir checkpoints inspect` shows.
//! It must not issue requests: the operator re-issues what [`share`] gives it.

use super::queue::{Queue, Stored};
use crate::checkpoint::{Checkpointed, OperatorSnapshot};
use crate::data::Data;
use crate::error::Result;
use crate::ids::CheckpointId;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

/// The operator state of one subtask in a checkpoint.
#[derive(Serialize, Deserialize)]
pub(super) struct SavedState<T, O> {
    pub(super) subtask: u32,
    pub(super) parallelism: u32,
    /// In arrival order, each with its route (key group or 0).
    pub(super) records: Vec<(u32, Stored<T, O>)>,
}

/// Subtask `me` of `p`'s share of the records the old subtasks stored, in their order:
/// on a keyed stream those of its key groups (`groups`); on a plain stream its own
/// subtask's at the same parallelism, every `p`-th record round-robin at another.
pub(super) fn share<T, O>(
    mut old: Vec<SavedState<T, O>>,
    groups: Option<std::ops::Range<u32>>,
    me: usize,
    p: usize,
) -> Vec<(u32, Stored<T, O>)> {
    old.sort_by_key(|s| s.subtask);
    match groups {
        Some(mine) => old
            .into_iter()
            .flat_map(|s| s.records)
            .filter(|(g, _)| mine.contains(g))
            .collect(),
        None if old.iter().all(|s| s.parallelism as usize == p) => old
            .into_iter()
            .filter(|s| s.subtask as usize == me)
            .flat_map(|s| s.records)
            .collect(),
        None => old
            .into_iter()
            .flat_map(|s| s.records)
            .enumerate()
            .filter(|(i, _)| i % p == me)
            .map(|(_, r)| r)
            .collect(),
    }
}

/// What the operator and its checkpoint hooks share.
pub(super) struct Core<T, O> {
    pub(super) queue: Queue<T, O>,
    /// Restored records not yet admitted (more than the capacity after a rescale), in order.
    pub(super) backlog: VecDeque<(u32, Stored<T, O>)>,
    pub(super) subtask: u32,
    pub(super) parallelism: u32,
}

/// The checkpoint hooks of an async I/O subtask.
pub(super) struct Hooks<T, O>(pub(super) Rc<RefCell<Core<T, O>>>);

impl<T: Data, O: Data> Checkpointed for Hooks<T, O> {
    fn snapshot(&mut self, id: CheckpointId) -> Result<OperatorSnapshot> {
        let core = self.0.borrow();
        let records: Vec<(u32, Stored<&T, &O>)> = core
            .queue
            .snapshot()
            .chain(core.backlog.iter().map(|(r, s)| {
                (
                    *r,
                    match s {
                        Stored::Pending(t, ts) => Stored::Pending(t, *ts),
                        Stored::Done(o, ts) => Stored::Done(o.as_ref(), *ts),
                    },
                )
            }))
            .collect();
        let in_flight = records
            .iter()
            .filter(|(_, s)| matches!(s, Stored::Pending(..)))
            .count();
        let state = SavedState {
            subtask: core.subtask,
            parallelism: core.parallelism,
            records,
        };
        tracing::debug!(
            checkpoint = id.0,
            in_flight,
            "async I/O stores its in-flight records"
        );
        Ok(OperatorSnapshot {
            operator: Some(crate::codec::encode(&state)?),
            description: Some(describe(&state.records, in_flight)),
            ..Default::default()
        })
    }
}

/// Records listed by name in a checkpoint's description, at most.
const DESCRIBED: usize = 100;

/// The summary `weir checkpoints inspect` shows: the counts, and the first records in
/// flight as a JSON array (so an operator can see which requests a restore re-issues).
fn describe<T: Serialize, O>(records: &[(u32, Stored<&T, &O>)], in_flight: usize) -> String {
    let listed: Vec<serde_json::Value> = records
        .iter()
        .filter_map(|(_, s)| match s {
            Stored::Pending(t, _) => serde_json::to_value(t).ok(),
            Stored::Done(..) => None,
        })
        .take(DESCRIBED)
        .collect();
    let more = match in_flight.saturating_sub(listed.len()) {
        0 => String::new(),
        n => format!(" (and {n} more)"),
    };
    format!(
        "async I/O: {in_flight} requests in flight, {} results waiting; in flight: {}{more}",
        records.len() - in_flight,
        serde_json::Value::Array(listed)
    )
}
