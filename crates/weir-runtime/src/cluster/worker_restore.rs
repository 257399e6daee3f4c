//! A worker's restore: which of the job's operators' subtasks it runs, loading the
//! checkpoint the coordinator chose (without reading every file again: the coordinator
//! verified them) and bringing back only the state backends' files its own subtasks
//! need, and which restored files its tasks need not send to the coordinator again.
//!
//! Does not run tasks or talk to the coordinator; `worker_attempt` and `worker` do.

use crate::task::JobShared;
use std::collections::{HashMap, HashSet};
use weir_core::{Error, Result};

/// The (node, subtask) pairs of every operator of this worker's tasks `local` ((chain
/// head, subtask) pairs).
pub(super) fn operators_of(
    job: &JobShared,
    local: &HashSet<(usize, usize)>,
) -> HashSet<(usize, usize)> {
    (0..job.graph.nodes.len())
        .flat_map(|node| {
            let head = job.plan.head_of[node];
            (0..job.plan.parallelism[node])
                .filter(move |s| local.contains(&(head, *s)))
                .map(move |s| (node, s))
        })
        .collect()
}

/// The shared files each task of `local` was restored with (their storage names), by task.
pub(super) fn restored_files(
    job: &JobShared,
    map: &crate::checkpoints::RestoreMap,
    local: &HashSet<(usize, usize)>,
) -> HashMap<(usize, usize), Vec<String>> {
    let mut out: HashMap<(usize, usize), Vec<String>> = HashMap::new();
    for (node, states) in map {
        let head = job.plan.head_of[*node];
        for (s, r) in states.iter().enumerate() {
            if !local.contains(&(head, s)) {
                continue;
            }
            let names = r
                .backend
                .iter()
                .flat_map(|i| &i.files)
                .filter(|f| f.shared)
                .map(|f| f.name.clone());
            out.entry((head, s)).or_default().extend(names);
        }
    }
    out
}

/// Loads the state of checkpoint `path` for this job, from the storage every process sees:
/// the backends' files only of the old instances that the operators' subtasks `runs`
/// ((node, subtask) pairs) of this worker need. Returns the checkpoint's manifest too.
pub(super) fn restore(
    job: &JobShared,
    path: &std::path::Path,
    local: &std::path::Path,
    runs: &HashSet<(usize, usize)>,
) -> Result<(crate::checkpoints::RestoreMap, weir_checkpoint::Manifest)> {
    let cfg = job.cfg.checkpoint.as_ref().ok_or_else(|| {
        Error::Config(
            "the coordinator restores a checkpoint but this worker has no checkpoint configuration"
                .into(),
        )
    })?;
    let storage = weir_checkpoint::CheckpointStorage::open(&cfg.dir)
        .map_err(|e| Error::Config(e.to_string()))?;
    // The coordinator verified every file's checksum when it chose this checkpoint; fetching
    // verifies what it copies or downloads. Reading every file again here, on every worker,
    // made a cluster's restore time grow with the whole state.
    let manifest = storage.load_unread(path).map_err(|e| {
        let hint = if storage.is_remote() {
            "does every process have the same object storage settings (AWS_* environment)?"
        } else {
            "is the checkpoint directory shared by every process?"
        };
        Error::Config(format!(
            "this worker cannot read checkpoint {}: {e}; {hint}",
            path.display()
        ))
    })?;
    let map = crate::checkpoints::restore_map(
        &storage,
        &manifest,
        path,
        &job.graph,
        &job.plan,
        job.cfg.max_parallelism,
        local,
        job.cfg.state_backend.local_recovery(),
        Some(runs),
    )?;
    Ok((map, manifest))
}
