//! Which directories a job run owns, and taking them before anything is restored or written.
//!
//! The run that drives the job (a single process, or a cluster's coordinator) leases its
//! checkpoint directory and the output directory of every exactly-once file sink
//! ([`weir_checkpoint::Ownership`]); cluster workers take none, they are fenced by their
//! coordinator. Owns the claims and the lease checks of the attempt loop; the lease protocol
//! is weir-checkpoint's.

use crate::task::JobShared;
use weir_checkpoint::{CheckpointStorage, Claim, Ownership};
use weir_core::{Error, Result};

/// Takes the job's directories, or fails naming their owner. With checkpointing, the
/// returned storage checks the lease before every durable act. The ownership is held until
/// the last clone (the storage's included) is dropped.
pub(crate) fn claim(
    name: &str,
    job: &JobShared,
    storage: Option<CheckpointStorage>,
) -> Result<(Option<CheckpointStorage>, Option<Ownership>)> {
    let mut claims = Vec::new();
    if let Some(s) = &storage {
        claims.push(Claim::new(s.dir(), "checkpoint directory"));
    }
    for node in &job.graph.nodes {
        for dir in &node.exclusive_dirs {
            claims.push(Claim::new(
                dir,
                format!("output directory of sink '{}'", node.name),
            ));
        }
    }
    if claims.is_empty() {
        return Ok((storage, None));
    }
    let lease = job
        .cfg
        .checkpoint
        .as_ref()
        .map_or(weir_checkpoint::DEFAULT_LEASE, |c| c.lease);
    let ownership = Ownership::acquire(name, claims, lease, &mut |msg| {
        tracing::info!(job = name, "job '{name}': {msg}");
    })
    .map_err(|e| Error::Config(e.to_string()))?;
    let storage = storage.map(|s| s.owned_by(ownership.clone()));
    Ok((storage, Some(ownership)))
}

/// Fails when this run no longer owns its directories (checked before an attempt restores
/// and before checkpoint completion is announced, when sinks commit).
pub(crate) fn verify(storage: Option<&CheckpointStorage>) -> Result<()> {
    match storage.and_then(CheckpointStorage::owner) {
        Some(o) => o.verify().map_err(|e| match e {
            // Final: another run owns the directories now.
            weir_checkpoint::Error::OwnershipLost { .. } => Error::Config(e.to_string()),
            // The owner record could not be read or written: perhaps a passing storage
            // problem, which a restart may get past.
            other => Error::User(format!(
                "cannot check this run's lease on its directories: {other}"
            )),
        }),
        None => Ok(()),
    }
}

/// The error to stop with once the lease renewal found the directories taken over.
pub(crate) fn lost(storage: Option<&CheckpointStorage>) -> Option<Error> {
    storage
        .and_then(CheckpointStorage::owner)
        .and_then(Ownership::lost)
        .map(|e| Error::Config(e.to_string()))
}
