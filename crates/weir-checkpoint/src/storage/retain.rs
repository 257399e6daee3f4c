//! Retention: deleting old checkpoints, abandoned attempts and unreferenced shared files.
//!
//! Never touches a complete savepoint, nor anything a writer of this process is still
//! writing. A shared file it deletes is forgotten by the registry of stored files, so no
//! later checkpoint reuses it without storing it again.

use super::layout::{self, METADATA, SHARED_DIR};
use super::{CheckpointInfo, CheckpointStorage, Manifest};
use crate::error::{Error, Result};
use std::collections::HashSet;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// How many complete checkpoints are kept by default.
pub const DEFAULT_RETAINED: usize = 3;

/// What [`CheckpointStorage::retain`] deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetainReport {
    /// Checkpoint directories deleted: older complete ones and abandoned incomplete ones.
    pub deleted: Vec<PathBuf>,
    /// Files deleted from `shared/` (unreferenced files and stale temporary files).
    pub deleted_shared: Vec<String>,
    /// Why `shared/` was left alone this time, if it was.
    pub shared_skipped: Option<String>,
}

impl CheckpointStorage {
    /// Keeps the newest `keep` complete checkpoints ([`DEFAULT_RETAINED`] is 3) and deletes:
    /// older complete checkpoint directories; incomplete checkpoint and savepoint directories
    /// older than the newest complete checkpoint (aborted or crashed attempts); and files in
    /// `shared/` that no retained checkpoint references. Complete savepoints are never
    /// deleted (and never reference `shared/`). Checkpoints being written through this
    /// storage (or a clone) are left alone, and so are the shared files they wrote or reuse.
    ///
    /// A checkpoint being written by another process cannot be seen except through its
    /// directory: while an incomplete directory newer than the newest complete checkpoint
    /// exists, `shared/` is not cleaned ([`RetainReport::shared_skipped`] says so). With
    /// several processes writing, call `retain` when no checkpoint is pending (right after
    /// [`Coordinator::completed`](crate::Coordinator::completed) with `max_concurrent = 1`).
    /// Retention verifies the manifests it reads, not the state files.
    pub fn retain(&self, keep: usize) -> Result<RetainReport> {
        if keep == 0 {
            return Err(Error::InvalidConfig(
                "retaining 0 checkpoints would delete the one a restart needs; keep at least 1 \
                 (the default is 3)"
                    .into(),
            ));
        }
        let span = tracing::info_span!("checkpoint_retain", keep);
        let _enter = span.enter();
        self.check_owner()?;
        // List shared/ before the checkpoint directories: a shared file in this listing was
        // written by a writer whose directory the listing below sees.
        let shared_dir = self.dir.join(SHARED_DIR);
        let shared_names = match self.remote() {
            Some(store) => super::remote::shared_names(store)?,
            None => list_names(&shared_dir)?,
        };
        let all = self.list()?;
        let in_flight: HashSet<PathBuf> = self
            .registry
            .lock()
            .writers
            .values()
            .map(|w| w.dir.clone())
            .collect();

        let checkpoints: Vec<&CheckpointInfo> =
            all.iter().filter(|c| !c.kind.is_savepoint()).collect();
        let complete: Vec<&CheckpointInfo> =
            checkpoints.iter().copied().filter(|c| c.complete).collect();
        let (old, kept) = complete.split_at(complete.len().saturating_sub(keep));
        let newest = kept.last().map(|c| c.id);

        let mut report = RetainReport::default();
        let mut busy = None;
        for c in checkpoints
            .iter()
            .filter(|c| !c.complete && !in_flight.contains(&c.path))
        {
            if newest.is_some_and(|n| c.id < n) {
                self.delete_checkpoint_dir(&c.path, &mut report)?;
            } else {
                busy = Some(c.path.clone());
            }
        }
        for c in old {
            self.delete_checkpoint_dir(&c.path, &mut report)?;
        }
        // An incomplete savepoint older than the newest complete checkpoint was aborted, or
        // its process crashed while writing it: it can never complete. (A savepoint being
        // written elsewhere is newer: ids grow.) Savepoints use no shared files, so a newer
        // one does not hold back the clean-up of `shared/`.
        for c in all.iter().filter(|c| {
            c.kind.is_savepoint()
                && !c.complete
                && !in_flight.contains(&c.path)
                && newest.is_some_and(|n| c.id < n)
        }) {
            self.delete_checkpoint_dir(&c.path, &mut report)?;
        }

        if let Some(path) = busy {
            report.shared_skipped = Some(format!(
                "{} is incomplete and newer than every complete checkpoint: it may be being \
                 written and use shared files",
                path.display()
            ));
            return Ok(report);
        }
        let mut referenced = HashSet::new();
        for c in kept {
            match Manifest::read(&c.path.join(METADATA)) {
                Ok(m) => referenced.extend(m.files().filter(|f| f.shared).map(|f| f.name.clone())),
                Err(e) => {
                    report.shared_skipped =
                        Some(format!("cannot tell which shared files are used: {e}"));
                    return Ok(report);
                }
            }
        }
        // Hold the registry while deleting so that no writer of this process starts reusing a
        // file between the check and the deletion.
        let mut books = self.registry.lock();
        let protected: HashSet<String> = books
            .writers
            .values()
            .flat_map(|w| w.shared.iter().cloned())
            .collect();
        for name in shared_names {
            let keep_it = match layout::tmp_token(&name) {
                Some(token) => books.writers.contains_key(&token),
                None => referenced.contains(&name) || protected.contains(&name),
            };
            if keep_it {
                continue;
            }
            // Forgotten before it is deleted: a writer never reuses a file being deleted.
            books.stored.remove(&name);
            let path = shared_dir.join(&name);
            if let Some(store) = self.remote() {
                store.delete(&format!("{SHARED_DIR}/{name}"))?;
                report.deleted_shared.push(name);
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => report.deleted_shared.push(name),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("delete", path, e)),
            }
        }
        drop(books);
        tracing::debug!(
            deleted = report.deleted.len(),
            deleted_shared = report.deleted_shared.len(),
            "retention done"
        );
        Ok(report)
    }
}

impl CheckpointStorage {
    /// Deletes a checkpoint directory or its objects, the manifest first.
    fn delete_checkpoint_dir(&self, dir: &Path, report: &mut RetainReport) -> Result<()> {
        let Some(store) = self.remote() else {
            return delete_dir(dir, report);
        };
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        super::remote::delete_dir(store, name)?;
        tracing::debug!(path = %dir.display(), "deleted checkpoint");
        report.deleted.push(dir.to_path_buf());
        Ok(())
    }
}

/// Names of the files in `dir` (none if it does not exist).
fn list_names(dir: &Path) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list directory", dir, e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("list directory", dir, e))?;
        if let (Some(name), true) = (entry.file_name().to_str(), entry.path().is_file()) {
            names.push(name.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// Deletes a checkpoint directory, `_metadata` first so that an interrupted deletion leaves
/// an incomplete checkpoint rather than a corrupt complete one.
fn delete_dir(dir: &Path, report: &mut RetainReport) -> Result<()> {
    match std::fs::remove_file(dir.join(METADATA)) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("delete", dir.join(METADATA), e)),
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {
            tracing::debug!(path = %dir.display(), "deleted checkpoint directory");
            report.deleted.push(dir.to_path_buf());
            Ok(())
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("delete directory", dir, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{manifest, storage, write};
    use super::*;
    use crate::CheckpointKind;
    use std::fs;
    use weir_core::ids::CheckpointId;

    fn shared_files(s: &CheckpointStorage) -> Vec<String> {
        list_names(&s.dir().join(SHARED_DIR)).unwrap()
    }

    fn ids(s: &CheckpointStorage) -> Vec<(u64, bool)> {
        s.list()
            .unwrap()
            .iter()
            .map(|c| (c.id.0, c.complete))
            .collect()
    }

    #[test]
    fn zero_is_rejected() {
        let (_tmp, s) = storage();
        assert!(matches!(s.retain(0), Err(Error::InvalidConfig(_))));
    }

    #[test]
    fn keeps_the_newest_and_their_shared_files() {
        let (_tmp, s) = storage();
        write(&s, 1, &["a", "b"]);
        write(&s, 2, &["b", "c"]);
        write(&s, 3, &["c", "d"]);
        write(&s, 4, &["d", "e"]);
        let report = s.retain(2).unwrap();
        assert_eq!(ids(&s), [(3, true), (4, true)]);
        assert_eq!(report.deleted.len(), 2);
        assert_eq!(report.deleted_shared, ["a", "b"]);
        assert_eq!(report.shared_skipped, None);
        assert_eq!(shared_files(&s), ["c", "d", "e"]);
        for c in s.list().unwrap() {
            s.load(&c.path).unwrap();
        }
        // idempotent
        assert_eq!(s.retain(2).unwrap(), RetainReport::default());
        let report = s.retain(1).unwrap();
        assert_eq!(report.deleted_shared, ["c"]);
        assert_eq!(shared_files(&s), ["d", "e"]);
    }

    #[test]
    fn savepoints_are_never_deleted() {
        let (_tmp, s) = storage();
        let w = s.savepoint(CheckpointId(1), "keep-me").unwrap();
        let f = w.write_shared("a", b"a").unwrap();
        w.finish(manifest(1, CheckpointKind::Savepoint, vec![f]))
            .unwrap();
        write(&s, 3, &["a"]);
        write(&s, 4, &[]);
        let report = s.retain(1).unwrap();
        assert_eq!(
            report.deleted_shared,
            ["a"],
            "the savepoint has its own copy"
        );
        let kinds: Vec<(u64, CheckpointKind)> =
            s.list().unwrap().iter().map(|c| (c.id.0, c.kind)).collect();
        assert_eq!(
            kinds,
            [
                (1, CheckpointKind::Savepoint),
                (4, CheckpointKind::Checkpoint)
            ]
        );
        s.load(s.dir().join("sp-1-keep-me")).unwrap();
    }

    #[test]
    fn abandoned_savepoint_attempts_are_deleted_like_checkpoint_attempts() {
        let (_tmp, s) = storage();
        // A savepoint whose process crashed while writing it, and one still being written.
        let crashed = s.savepoint(CheckpointId(1), "crashed").unwrap();
        crashed.write_file("own", b"half").unwrap();
        let crashed_dir = crashed.path().to_path_buf();
        drop(crashed);
        let live = s.begin(CheckpointId(2), CheckpointKind::Savepoint).unwrap();
        write(&s, 3, &[]);
        // Newer than every complete checkpoint: perhaps being written elsewhere.
        let newer = s.savepoint(CheckpointId(4), "newer").unwrap();
        let newer_dir = newer.path().to_path_buf();
        drop(newer);
        let report = s.retain(3).unwrap();
        assert_eq!(report.deleted, [crashed_dir]);
        assert_eq!(
            report.shared_skipped, None,
            "savepoints use no shared files"
        );
        let left: Vec<(u64, CheckpointKind, bool)> = s
            .list()
            .unwrap()
            .iter()
            .map(|c| (c.id.0, c.kind, c.complete))
            .collect();
        assert_eq!(
            left,
            [
                (2, CheckpointKind::Savepoint, false),
                (3, CheckpointKind::Checkpoint, true),
                (4, CheckpointKind::Savepoint, false)
            ]
        );
        assert!(newer_dir.is_dir());
        drop(live);
    }

    #[test]
    fn abandoned_attempts_older_than_the_newest_complete_are_deleted() {
        let (_tmp, s) = storage();
        write(&s, 1, &[]);
        let aborted = s
            .begin(CheckpointId(2), CheckpointKind::Checkpoint)
            .unwrap();
        aborted.write_shared("orphan", b"o").unwrap();
        drop(aborted);
        write(&s, 3, &[]);
        let report = s.retain(3).unwrap();
        assert_eq!(ids(&s), [(1, true), (3, true)]);
        assert_eq!(report.deleted, [s.dir().join("chk-00000000000000000002")]);
        assert_eq!(report.deleted_shared, ["orphan"]);
    }

    #[test]
    fn live_writers_and_their_shared_files_are_protected() {
        let (_tmp, s) = storage();
        write(&s, 1, &["old"]);
        write(&s, 2, &[]);
        // a lagging older attempt and a newer one, both still being written in this process
        let lagging = s
            .begin(CheckpointId(1_000), CheckpointKind::Checkpoint)
            .unwrap();
        lagging.write_shared("old", b"old").unwrap(); // reuses a file only checkpoint 1 had
        lagging.write_shared("new", b"new").unwrap();
        // a stale temporary file of a writer that no longer exists, and one of a live writer
        fs::write(
            s.dir()
                .join("shared")
                .join(layout::tmp_name(999_999, 0, "x")),
            b"",
        )
        .unwrap();
        let live_tmp = layout::tmp_name(lagging.inner_token(), 7, "y");
        fs::write(s.dir().join("shared").join(&live_tmp), b"").unwrap();
        let report = s.retain(1).unwrap();
        assert_eq!(ids(&s), [(2, true), (1_000, false)]);
        assert_eq!(report.deleted_shared, [layout::tmp_name(999_999, 0, "x")]);
        let mut expected = vec![live_tmp, "new".to_string(), "old".to_string()];
        expected.sort();
        assert_eq!(shared_files(&s), expected);
        let f = lagging.write_file("own", b"x").unwrap();
        let mut files = vec![f];
        files.push(lagging.write_shared("old", b"old").unwrap());
        lagging
            .finish(manifest(1_000, CheckpointKind::Checkpoint, files))
            .unwrap();
        assert_eq!(
            s.latest_complete()
                .unwrap()
                .checkpoint
                .unwrap()
                .manifest
                .checkpoint_id
                .0,
            1_000
        );
    }

    #[test]
    fn a_newer_foreign_attempt_pauses_shared_cleanup() {
        let (_tmp, s) = storage();
        write(&s, 1, &["a"]);
        write(&s, 2, &[]);
        // another process is writing checkpoint 3 (only its directory is visible here)
        fs::create_dir(s.dir().join("chk-00000000000000000003")).unwrap();
        fs::write(s.dir().join("shared/b"), b"b").unwrap();
        let report = s.retain(1).unwrap();
        assert_eq!(ids(&s), [(2, true), (3, false)]);
        assert!(
            report
                .shared_skipped
                .unwrap()
                .contains("chk-00000000000000000003")
        );
        assert_eq!(shared_files(&s), ["a", "b"]);
    }

    #[test]
    fn an_unreadable_retained_manifest_pauses_shared_cleanup() {
        let (_tmp, s) = storage();
        write(&s, 1, &["a"]);
        let p2 = write(&s, 2, &["b"]);
        fs::write(p2.join("_metadata"), b"not json").unwrap();
        let report = s.retain(1).unwrap();
        assert!(report.shared_skipped.unwrap().contains("cannot parse"));
        assert_eq!(shared_files(&s), ["a", "b"]);
    }

    #[test]
    fn deletion_removes_metadata_first() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("chk-1");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join(METADATA), b"{}").unwrap();
        let mut report = RetainReport::default();
        delete_dir(&dir, &mut report).unwrap();
        assert!(!dir.exists());
        delete_dir(&dir, &mut report).unwrap();
        assert_eq!(report.deleted, [dir]);
    }
}
