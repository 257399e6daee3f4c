//! A worker's record of which immutable checkpoint files the coordinator holds for each of
//! its tasks, so an acknowledgement can leave them out.
//!
//! The rule mirrors the coordinator's staging area (`staging`): a task leaves out exactly
//! the shared files of its acknowledgement of the latest checkpoint it knows to be
//! complete (its *basis*). A file that was sent but never became part of a completed
//! checkpoint (its staging failed, or its checkpoint was aborted) is sent again. The
//! worker learns of completions and aborts from the commands it relays to its tasks; it
//! may learn later than the coordinator moved on, which only makes it send more. A
//! `Resend` from the coordinator empties the task's basis. [`ack_files`] applies the rule to
//! an acknowledgement.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

/// A task of an attempt: (head node, subtask).
type Task = (usize, usize);

#[derive(Debug, Default)]
struct TaskFiles {
    /// Shared files of the acknowledgement of the latest completed checkpoint.
    basis: HashSet<String>,
    /// Shared files of each acknowledgement sent since, by checkpoint.
    acked: BTreeMap<u64, HashSet<String>>,
}

/// Per task of one attempt on this worker (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct SentFiles(HashMap<Task, TaskFiles>);

impl SentFiles {
    /// True when `task`'s acknowledgement may leave out the shared file `name`.
    pub(crate) fn leave_out(&self, task: Task, name: &str) -> bool {
        self.0.get(&task).is_some_and(|t| t.basis.contains(name))
    }

    /// `task` acknowledges `checkpoint` with these shared files (sent or left out). Call
    /// before the acknowledgement goes out, so its completion cannot overtake this.
    pub(crate) fn acknowledged(
        &mut self,
        task: Task,
        checkpoint: u64,
        shared: impl IntoIterator<Item = String>,
    ) {
        let t = self.0.entry(task).or_default();
        t.acked.insert(checkpoint, shared.into_iter().collect());
    }

    /// Checkpoint `checkpoint` completed: `task`'s acknowledgement of it becomes its basis.
    pub(crate) fn completed(&mut self, task: Task, checkpoint: u64) {
        let t = self.0.entry(task).or_default();
        if let Some(files) = t.acked.remove(&checkpoint) {
            t.basis = files;
        }
        t.acked.retain(|c, _| *c > checkpoint);
    }

    /// Checkpoint `checkpoint` was aborted.
    pub(crate) fn aborted(&mut self, task: Task, checkpoint: u64) {
        if let Some(t) = self.0.get_mut(&task) {
            t.acked.remove(&checkpoint);
        }
    }

    /// `task` was restored from a checkpoint whose immutable files `stored` are in
    /// checkpoint storage (and the coordinator's staging area knows where): its basis
    /// starts with them, so its first acknowledgement leaves out those it still uses.
    pub(crate) fn restored(&mut self, task: Task, stored: impl IntoIterator<Item = String>) {
        self.0.entry(task).or_default().basis = stored.into_iter().collect();
    }

    /// The coordinator lost `task`'s files: send them all next time.
    pub(crate) fn resend(&mut self, task: Task) {
        if let Some(t) = self.0.get_mut(&task) {
            t.basis.clear();
        }
    }
}

/// Waits for the files the state backends of an acknowledged snapshot are still writing
/// in the background; or says why they failed (the snapshot is then incomplete and must
/// not be stored).
pub(crate) fn resolve_files(
    snapshot: &mut std::collections::BTreeMap<String, weir_core::checkpoint::OperatorSnapshot>,
) -> Result<(), String> {
    for snap in snapshot.values_mut() {
        if let Err(e) = snap.resolve_files() {
            tracing::warn!(error = %e, "a state backend snapshot failed");
            return Err(format!("the state backend's snapshot failed: {e}"));
        }
    }
    Ok(())
}

/// The files an acknowledgement of `checkpoint` by `task` carries: every file of the
/// snapshot except the shared ones the coordinator holds already; or why they could not
/// be read (the coordinator then fails the checkpoint at once).
pub(crate) fn ack_files(
    snapshot: &mut std::collections::BTreeMap<String, weir_core::checkpoint::OperatorSnapshot>,
    sent: &Mutex<SentFiles>,
    task: (usize, usize),
    checkpoint: u64,
) -> (Vec<(String, Vec<u8>)>, Option<String>) {
    if let Err(why) = resolve_files(snapshot) {
        return (Vec::new(), Some(why));
    }
    let lock = || sent.lock().unwrap_or_else(|p| p.into_inner());
    let to_send: Vec<&weir_core::checkpoint::LocalFile> = {
        let sent = lock();
        snapshot
            .values()
            .flat_map(|s| &s.files)
            .filter(|f| !(f.shared && sent.leave_out(task, &f.name)))
            .collect()
    };
    let mut files = Vec::new();
    for f in to_send {
        match std::fs::read(&f.path) {
            Ok(b) => files.push((f.name.clone(), b)),
            Err(e) => {
                tracing::warn!(file = %f.path.display(), error = %e, "reading a checkpoint file failed");
                return (
                    Vec::new(),
                    Some(format!("reading {}: {e}", f.path.display())),
                );
            }
        }
    }
    let shared = snapshot
        .values()
        .flat_map(|s| &s.files)
        .filter(|f| f.shared)
        .map(|f| f.name.clone());
    lock().acknowledged(task, checkpoint, shared);
    (files, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Task = (2, 0);

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_files_of_a_completed_checkpoint_are_left_out() {
        let mut s = SentFiles::default();
        assert!(!s.leave_out(T, "a.sst"));
        s.acknowledged(T, 1, names(&["a.sst"]));
        // Not known complete yet: sent again.
        assert!(!s.leave_out(T, "a.sst"));
        s.completed(T, 1);
        assert!(s.leave_out(T, "a.sst"));
        assert!(
            !s.leave_out((2, 1), "a.sst"),
            "another task's basis is its own"
        );
        // Checkpoint 2 adds b.sst; it is aborted (or its staging failed): b is sent again.
        s.acknowledged(T, 2, names(&["a.sst", "b.sst"]));
        s.aborted(T, 2);
        assert!(!s.leave_out(T, "b.sst"));
        s.acknowledged(T, 3, names(&["b.sst"]));
        s.completed(T, 3);
        assert!(s.leave_out(T, "b.sst"));
        assert!(
            !s.leave_out(T, "a.sst"),
            "compacted away: no longer in the basis"
        );
    }

    #[test]
    fn a_restored_task_leaves_out_its_restored_files_until_its_basis_moves_on() {
        let mut s = SentFiles::default();
        s.restored(T, names(&["a.sst", "b.sst"]));
        assert!(s.leave_out(T, "a.sst") && s.leave_out(T, "b.sst"));
        assert!(!s.leave_out(T, "c.sst") && !s.leave_out((2, 1), "a.sst"));
        s.acknowledged(T, 7, names(&["b.sst", "c.sst"]));
        s.completed(T, 7);
        assert!(!s.leave_out(T, "a.sst"), "compacted away since");
        assert!(s.leave_out(T, "b.sst") && s.leave_out(T, "c.sst"));
        s.resend(T);
        assert!(!s.leave_out(T, "b.sst"));
    }

    #[test]
    fn a_completion_subsumes_older_acknowledgements_and_a_resend_empties_the_basis() {
        let mut s = SentFiles::default();
        s.acknowledged(T, 1, names(&["a.sst"]));
        s.acknowledged(T, 2, names(&["a.sst", "b.sst"]));
        s.completed(T, 2);
        assert!(s.leave_out(T, "b.sst"));
        // A late completion of 1 (never happens in order, but must not go backwards).
        s.completed(T, 1);
        assert!(s.leave_out(T, "b.sst"));
        s.resend(T);
        assert!(!s.leave_out(T, "a.sst") && !s.leave_out(T, "b.sst"));
    }
}
