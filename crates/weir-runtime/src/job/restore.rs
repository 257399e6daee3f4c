//! What an attempt of a job resumes from: the checkpoint or savepoint found in its
//! checkpoint storage (or given explicitly), the background check of its files, and the
//! first checkpoint id the attempt takes.

use super::{JobShared, checkpoints, verify};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use weir_checkpoint::{CheckpointStorage, Manifest};
use weir_core::ids::CheckpointId;
use weir_core::{Error, Result};

/// Where an attempt starts.
pub(super) struct Resume {
    /// The checkpoint or savepoint restored, and where it is.
    pub(super) restore: Option<(Manifest, PathBuf)>,
    /// The check of its files while the attempt runs, when they were not read first.
    pub(super) verification: Option<verify::BackgroundVerify>,
    /// The id of the attempt's first checkpoint.
    pub(super) first_id: CheckpointId,
}

impl Resume {
    /// A start without checkpoint storage.
    pub(super) fn fresh() -> Self {
        Resume {
            restore: None,
            verification: None,
            first_id: CheckpointId(1),
        }
    }
}

/// Finds what the attempt of job `name` resumes from in `storage`: `explicit` (a restore
/// path) or the newest usable checkpoint, its checksums read first when `verify_first`,
/// in the background otherwise (an explicit restore path is always read first).
pub(super) fn find(
    name: &str,
    job: &JobShared,
    storage: &CheckpointStorage,
    explicit: Option<&Path>,
    verify_first: bool,
    refused: &Refused,
) -> Result<Resume> {
    let found = checkpoints::find_restore(
        storage,
        explicit,
        job.cfg
            .checkpoint
            .as_ref()
            .is_some_and(|c| c.start_fresh_if_unusable),
        !verify_first,
        &refused.0,
    )?;
    let mut resume = Resume::fresh();
    if let Some((manifest, path)) = found {
        // A checkpoint directory belongs to one job: resuming another job's checkpoint by
        // accident would mix its state into this one. An explicit restore path (a
        // savepoint) may come from a job of another name.
        if explicit.is_none() && manifest.job != name {
            return Err(Error::Config(format!(
                "checkpoint directory {} holds checkpoints of job '{}', not of job '{name}': give this job its own checkpoint directory, or restore that checkpoint explicitly (CheckpointConfig::restore_from) if it is meant for this job",
                storage.dir().display(),
                manifest.job
            )));
        }
        restore_span(&manifest, &path).in_scope(|| {
            tracing::info!(
                job = name,
                checkpoint = manifest.checkpoint_id.0,
                kind = %manifest.kind,
                path = %path.display(),
                "{}",
                resume_line(name, &manifest, &path)
            )
        });
        if !verify_first && explicit.is_none() {
            resume.verification = Some(verify::BackgroundVerify::start(
                storage,
                manifest.checkpoint_id,
                path.clone(),
            ));
        }
        resume.restore = Some((manifest, path));
    }
    // Checkpoint ids never repeat within a job's lineage: above everything in this
    // directory, and above the checkpoint or savepoint restored (which may come from
    // another directory). Sinks name committed output by checkpoint id.
    resume.first_id = storage
        .next_id()
        .map_err(|e| Error::Config(e.to_string()))?;
    if let Some((manifest, _)) = &resume.restore {
        resume.first_id = resume
            .first_id
            .max(CheckpointId(manifest.checkpoint_id.0.saturating_add(1)));
    }
    Ok(resume)
}

/// The checkpoints of this run whose state did not restore (directory → how it failed):
/// the next attempts skip them (docs/checkpoints.md, section 4).
#[derive(Default)]
pub(super) struct Refused(BTreeMap<PathBuf, String>);

impl Refused {
    /// After an attempt of job `name` that restored `restored` (from the explicit restore
    /// path when `explicit`) ended, with `failure` if it failed: `Ok(true)` when it failed
    /// because that checkpoint's state cannot be restored ([`Error::is_unrestorable`]),
    /// which is then skipped, so that the job falls back to the checkpoint before it;
    /// `Ok(false)` otherwise. An explicit restore path that does not restore fails the
    /// job, since the user chose it.
    pub(super) fn after(
        &mut self,
        name: &str,
        restored: Option<&(Manifest, PathBuf)>,
        explicit: bool,
        failure: Option<&Error>,
    ) -> Result<bool> {
        let Some(e) = failure.filter(|e| e.is_unrestorable()) else {
            return Ok(false);
        };
        let Some((manifest, path)) = restored else {
            return Ok(false);
        };
        let id = manifest.checkpoint_id;
        if explicit {
            tracing::error!(job = name, checkpoint = id.0, error = %e, "job '{name}' failed: {e}; not restarting, since a restart would fail the same way");
            return Err(Error::Config(format!(
                "{} {id} ({}) cannot be restored: {}. Restoring it again would fail the same \
                 way: restore another savepoint or checkpoint",
                manifest.kind,
                path.display(),
                e.to_string().trim_end_matches('.')
            )));
        }
        tracing::warn!(
            job = name,
            checkpoint = id.0,
            path = %path.display(),
            error = %e,
            "job '{name}': {} {id} ({}) cannot be restored: {e}; restoring the newest checkpoint before it",
            manifest.kind,
            path.display()
        );
        self.0.insert(path.clone(), e.to_string());
        Ok(true)
    }
}

/// The span of a restore: events about restoring `manifest` carry its id and path.
pub(crate) fn restore_span(manifest: &Manifest, path: &Path) -> tracing::Span {
    tracing::info_span!(
        "restore",
        checkpoint = manifest.checkpoint_id.0,
        path = %path.display()
    )
}

/// The line a run prints when it resumes: which checkpoint or savepoint, and, for the final
/// checkpoint of a bounded job, that the job had already finished.
fn resume_line(name: &str, manifest: &Manifest, path: &Path) -> String {
    if manifest.kind == weir_checkpoint::CheckpointKind::Final {
        format!(
            "job '{name}' had already finished: resuming after its end (final checkpoint {}, {}); sources that had reached their end read nothing more. To process the input again, give the job a new checkpoint directory.",
            manifest.checkpoint_id,
            path.display()
        )
    } else {
        format!(
            "job '{name}': resuming from {} {} ({})",
            manifest.kind,
            manifest.checkpoint_id,
            path.display()
        )
    }
}
