//! Checkpoint storage in a directory (local disk or a mount shared by every process).
//!
//! Owns the on-disk layout, writing and verifying checkpoints, choosing the checkpoint to
//! restore, savepoints and retention. It does not decide *when* to checkpoint (that is the
//! [`coordinator`](crate::coordinator)) nor what the state files contain (the state backends).
//!
//! # Layout
//!
//! ```text
//! <dir>/
//!   chk-<id as 20-digit zero padded>/        a checkpoint
//!      <file name>                             state files written by tasks
//!      _metadata                               the manifest, written LAST and atomically
//!   sp-<id>-<timestamp or name>/             savepoints: same structure, self-contained, never deleted automatically
//!   shared/                                   files shared by several checkpoints (incremental), referenced by name from manifests
//! ```
//!
//! - A checkpoint is complete exactly when its `_metadata` exists: the manifest is written to
//!   `_metadata.tmp`, fsynced, renamed to `_metadata`, and the directory fsynced. A directory
//!   without `_metadata` is an aborted or crashed attempt and is never restored.
//! - `_metadata` is pretty JSON ([`Manifest`]) listing every file with its size and CRC-32;
//!   [`CheckpointStorage::load`] verifies all of them before returning the manifest.
//! - A manifest entry with `"shared": true` names a file in `shared/`, the sibling of the
//!   checkpoint's directory. Savepoints never reference `shared/`: their writer stores
//!   "shared" files in the savepoint's own directory, so a savepoint directory can be copied,
//!   moved or kept after the checkpoints (and `shared/`) are gone.
//! - Savepoint directories are `sp-<id>-<unix ms>` ([`CheckpointStorage::begin`] with
//!   [`CheckpointKind::Savepoint`]) or `sp-<id>-<name>` ([`CheckpointStorage::savepoint`]).
//!   The final checkpoint of a bounded job is stored like a checkpoint (its manifest says
//!   `"kind": "final"`).
//! - Names starting with `.` or `_` are weir's own (`_metadata`, temporary files); state file
//!   names are plain names without `/`.
//!
//! ```
//! use weir_checkpoint::{CheckpointId, CheckpointKind, CheckpointStorage, Manifest,
//!                       OperatorManifest, SubtaskManifest};
//!
//! let tmp = tempfile::tempdir()?;
//! let storage = CheckpointStorage::open(tmp.path().join("checkpoints"))?;
//! let id = storage.next_id()?;
//! let writer = storage.begin(id, CheckpointKind::Checkpoint)?;
//! let file = writer.write_file("sum-0.state", b"account-1=42")?;
//! let mut manifest = Manifest::new("balances", id, CheckpointKind::Checkpoint, 128);
//! manifest.operators.push(OperatorManifest {
//!     uid: "sum".into(),
//!     name: "running sum".into(),
//!     parallelism: 1,
//!     subtasks: vec![SubtaskManifest { subtask: 0, files: vec![file], operator_state: None }],
//! });
//! writer.finish(manifest)?;
//!
//! let latest = storage.latest_complete()?;
//! let restored = latest.checkpoint.expect("one complete checkpoint");
//! let entry = &restored.manifest.operators[0].subtasks[0].files[0];
//! assert_eq!(storage.read_file(&restored.path, entry)?, b"account-1=42");
//! assert!(latest.skipped.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub(crate) mod layout;
mod manifest;
mod owned;
mod retain;
mod writer;

pub use manifest::{
    FORMAT_VERSION, FileEntry, Manifest, ManifestStats, OperatorManifest, SubtaskManifest,
};
pub use retain::{DEFAULT_RETAINED, RetainReport};
pub use writer::CheckpointWriter;

use crate::error::{Error, Result};
use crate::kind::CheckpointKind;
use layout::{METADATA, SHARED_DIR};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weir_core::ids::CheckpointId;
use writer::Registry;

/// A checkpoint or savepoint directory found by [`CheckpointStorage::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// The id from the directory name.
    pub id: CheckpointId,
    /// [`CheckpointKind::Checkpoint`] for `chk-` directories (final checkpoints included),
    /// [`CheckpointKind::Savepoint`] for `sp-` directories.
    pub kind: CheckpointKind,
    /// The directory.
    pub path: PathBuf,
    /// True when `_metadata` exists (the files are not verified here).
    pub complete: bool,
}

/// A verified checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedCheckpoint {
    /// Its manifest.
    pub manifest: Manifest,
    /// Its directory.
    pub path: PathBuf,
}

/// A complete checkpoint that failed verification.
#[derive(Debug)]
pub struct SkippedCheckpoint {
    /// Its directory.
    pub path: PathBuf,
    /// Why it cannot be used (names the file and the problem).
    pub error: Error,
}

/// The result of [`CheckpointStorage::latest_complete`].
#[derive(Debug)]
pub struct LatestComplete {
    /// The newest complete checkpoint whose files all verify, if any.
    pub checkpoint: Option<LoadedCheckpoint>,
    /// Newer complete checkpoints that were skipped because they are corrupt, newest first.
    pub skipped: Vec<SkippedCheckpoint>,
}

/// Checkpoints and savepoints in one directory.
///
/// Clone it rather than opening the same directory twice in one process: clones share the
/// registry of checkpoints being written, which [`retain`](CheckpointStorage::retain) needs.
#[derive(Debug, Clone)]
pub struct CheckpointStorage {
    dir: PathBuf,
    registry: Arc<Registry>,
    /// The run's lease on the directory, checked before every durable act.
    owner: Option<crate::Ownership>,
}

impl CheckpointStorage {
    /// Opens the storage at `dir`, creating it (and `shared/`) if missing.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let dir = std::path::absolute(dir).map_err(|e| Error::io("resolve path", dir, e))?;
        let shared = dir.join(SHARED_DIR);
        std::fs::create_dir_all(&shared).map_err(|e| Error::io("create directory", &shared, e))?;
        Ok(CheckpointStorage {
            dir,
            registry: Arc::default(),
            owner: None,
        })
    }

    /// The storage directory (absolute).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every `chk-` and `sp-` directory, complete or not, sorted by id (then kind, then path).
    /// Other entries are ignored.
    pub fn list(&self) -> Result<Vec<CheckpointInfo>> {
        let entries =
            std::fs::read_dir(&self.dir).map_err(|e| Error::io("list directory", &self.dir, e))?;
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("list directory", &self.dir, e))?;
            let name = entry.file_name();
            let Some((id, kind)) = name.to_str().and_then(layout::parse_dir_name) else {
                continue;
            };
            let path = entry.path();
            if !path.is_dir() {
                continue;
            }
            let complete = path.join(METADATA).is_file();
            found.push(CheckpointInfo {
                id,
                kind,
                path,
                complete,
            });
        }
        found.sort_by(|a, b| (a.id, a.kind, &a.path).cmp(&(b.id, b.kind, &b.path)));
        Ok(found)
    }

    /// The id after every checkpoint and savepoint directory present (complete or not), or 1.
    /// Use it as the coordinator's `first_id` so that no directory is ever reused.
    pub fn next_id(&self) -> Result<CheckpointId> {
        let max = self.list()?.iter().map(|c| c.id.0).max();
        Ok(CheckpointId(max.map_or(1, |m| m.saturating_add(1))))
    }

    /// Starts writing checkpoint `id`: `chk-<id>` for [`CheckpointKind::Checkpoint`] and
    /// [`CheckpointKind::Final`], `sp-<id>-<unix ms>` for [`CheckpointKind::Savepoint`].
    ///
    /// Files left in an incomplete `chk-` directory by an earlier attempt stay (they are
    /// overwritten or ignored, never referenced); a complete one is an
    /// [`Error::AlreadyExists`]. A storage [`owned_by`](Self::owned_by) a run that lost the
    /// directory refuses with [`Error::OwnershipLost`].
    pub fn begin(&self, id: CheckpointId, kind: CheckpointKind) -> Result<CheckpointWriter> {
        if kind.is_savepoint() {
            return self.savepoint(id, &layout::unix_millis().to_string());
        }
        // A run that lost the directory must not write files into another run's attempt.
        self.check_owner()?;
        let dir = self.dir.join(layout::checkpoint_dir_name(id));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
        if dir.join(METADATA).exists() {
            return Err(Error::AlreadyExists { path: dir });
        }
        tracing::debug!(checkpoint = %id, %kind, path = %dir.display(), "writing checkpoint");
        CheckpointWriter::new(
            id,
            kind,
            dir,
            self.dir.join(SHARED_DIR),
            self.registry.clone(),
            self.owner.clone(),
        )
    }

    /// Starts writing savepoint `id` into `sp-<id>-<name>`. `name` may contain ASCII letters,
    /// digits, `.`, `_` and `-`; the directory must not exist yet.
    pub fn savepoint(&self, id: CheckpointId, name: &str) -> Result<CheckpointWriter> {
        layout::validate_savepoint_name(name)?;
        self.check_owner()?;
        let dir = self.dir.join(layout::savepoint_dir_name(id, name));
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(Error::AlreadyExists { path: dir });
            }
            Err(e) => return Err(Error::io("create directory", dir, e)),
        }
        tracing::debug!(checkpoint = %id, path = %dir.display(), "writing savepoint");
        let kind = CheckpointKind::Savepoint;
        CheckpointWriter::new(
            id,
            kind,
            dir,
            self.dir.join(SHARED_DIR),
            self.registry.clone(),
            self.owner.clone(),
        )
    }

    /// Reads and verifies the checkpoint at `path` — a `chk-` or `sp-` directory (also one
    /// outside this storage, e.g. a savepoint a user moved) or its `_metadata` file. Every
    /// referenced file must exist with the recorded size and CRC-32; the error of the first
    /// that does not names the checkpoint, the file and the problem.
    pub fn load(&self, path: impl AsRef<Path>) -> Result<Manifest> {
        let dir = layout::resolve(path.as_ref())?;
        let span = tracing::info_span!("checkpoint_load", path = %dir.display());
        let _enter = span.enter();
        let manifest = Manifest::read(&dir.join(METADATA))?;
        manifest.check(&dir)?;
        let shared = layout::shared_dir_of(&dir);
        for f in manifest.files() {
            let file = if f.shared {
                shared.join(&f.name)
            } else {
                dir.join(&f.name)
            };
            layout::verify(&dir, &file, f.size, f.crc32)?;
        }
        tracing::debug!(checkpoint = %manifest.checkpoint_id, files = manifest.files().count(), "checkpoint verified");
        Ok(manifest)
    }

    /// The newest complete checkpoint (`chk-` directories only; savepoints are restored by
    /// path) whose files all verify. Newer ones that are corrupt (unparsable, inconsistent or
    /// with a bad file) are skipped with a warning and listed in
    /// [`LatestComplete::skipped`]. An operating-system error (e.g. permission denied) is
    /// returned instead of skipping, since it does not prove the checkpoint bad.
    pub fn latest_complete(&self) -> Result<LatestComplete> {
        let mut skipped = Vec::new();
        let candidates = self.list()?.into_iter().rev();
        for info in candidates.filter(|c| c.complete && !c.kind.is_savepoint()) {
            match self.load(&info.path) {
                Ok(manifest) => {
                    let checkpoint = Some(LoadedCheckpoint {
                        manifest,
                        path: info.path,
                    });
                    return Ok(LatestComplete {
                        checkpoint,
                        skipped,
                    });
                }
                Err(error) if error.is_unusable_checkpoint() => {
                    tracing::warn!(checkpoint = %info.id, %error, "skipping corrupt checkpoint");
                    skipped.push(SkippedCheckpoint {
                        path: info.path,
                        error,
                    });
                }
                Err(error) => return Err(error),
            }
        }
        Ok(LatestComplete {
            checkpoint: None,
            skipped,
        })
    }

    /// Reads one file of the checkpoint at `checkpoint` (any form [`load`](Self::load)
    /// accepts), verifying its size and checksum again.
    pub fn read_file(&self, checkpoint: impl AsRef<Path>, entry: &FileEntry) -> Result<Vec<u8>> {
        let dir = layout::resolve(checkpoint.as_ref())?;
        layout::validate_file_name(&entry.name)?;
        let path = if entry.shared {
            layout::shared_dir_of(&dir).join(&entry.name)
        } else {
            dir.join(&entry.name)
        };
        let corrupt = |problem| Error::Corrupt {
            checkpoint: dir.clone(),
            file: path.clone(),
            problem,
        };
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(corrupt(crate::FileProblem::Missing));
            }
            Err(e) => return Err(Error::io("read", path, e)),
        };
        if bytes.len() as u64 != entry.size {
            let actual = bytes.len() as u64;
            return Err(corrupt(crate::FileProblem::Size {
                expected: entry.size,
                actual,
            }));
        }
        let actual = crc32fast::hash(&bytes);
        if actual != entry.crc32 {
            return Err(corrupt(crate::FileProblem::Checksum {
                expected: entry.crc32,
                actual,
            }));
        }
        Ok(bytes)
    }

    /// Deletes the directory of an aborted checkpoint `id` (after [`crate::Action::Abort`]).
    /// Returns false if there is none, or if it is complete (its metadata was written before
    /// the abort; such a checkpoint is valid and left to [`retain`](Self::retain), like the
    /// shared files of a discarded one).
    pub fn discard(&self, id: CheckpointId) -> Result<bool> {
        let dir = self.dir.join(layout::checkpoint_dir_name(id));
        if !dir.is_dir() {
            return Ok(false);
        }
        self.check_owner()?;
        if dir.join(METADATA).exists() {
            tracing::debug!(checkpoint = %id, "not discarding a complete checkpoint");
            return Ok(false);
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io("delete directory", dir, e)),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::FileProblem;
    use std::fs;

    pub(crate) fn storage() -> (tempfile::TempDir, CheckpointStorage) {
        let tmp = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::open(tmp.path().join("cp")).unwrap();
        (tmp, storage)
    }

    pub(crate) fn manifest(id: u64, kind: CheckpointKind, files: Vec<FileEntry>) -> Manifest {
        let mut m = Manifest::new("job", CheckpointId(id), kind, 128);
        m.operators.push(OperatorManifest {
            uid: "op".into(),
            name: "op".into(),
            parallelism: 1,
            subtasks: vec![SubtaskManifest {
                subtask: 0,
                files,
                operator_state: Some(serde_json::json!({ "offset": id })),
            }],
        });
        m
    }

    /// Writes checkpoint `id` with one own file and the given shared files.
    pub(crate) fn write(s: &CheckpointStorage, id: u64, shared: &[&str]) -> PathBuf {
        let w = s
            .begin(CheckpointId(id), CheckpointKind::Checkpoint)
            .unwrap();
        let mut files = vec![
            w.write_file("own", format!("state of {id}").as_bytes())
                .unwrap(),
        ];
        for name in shared {
            files.push(w.write_shared(name, name.as_bytes()).unwrap());
        }
        w.finish(manifest(id, CheckpointKind::Checkpoint, files))
            .unwrap()
    }

    fn corrupt_problem(r: Result<Manifest>) -> (PathBuf, FileProblem) {
        match r {
            Err(Error::Corrupt { file, problem, .. }) => (file, problem),
            other => panic!("expected corruption, got {other:?}"),
        }
    }

    #[test]
    fn open_creates_the_directory_or_names_it() {
        let tmp = tempfile::tempdir().unwrap();
        let s = CheckpointStorage::open(tmp.path().join("a/b")).unwrap();
        assert!(s.dir().join("shared").is_dir());
        assert!(s.dir().is_absolute());
        let file = tmp.path().join("file");
        fs::write(&file, b"").unwrap();
        let e = CheckpointStorage::open(&file).unwrap_err();
        assert!(e.to_string().contains(&*file.to_string_lossy()), "{e}");
    }

    #[test]
    fn round_trip() {
        let (_tmp, s) = storage();
        let path = write(&s, 1, &["sst-1"]);
        assert_eq!(path, s.dir().join("chk-00000000000000000001"));
        let m = s.load(&path).unwrap();
        assert_eq!(m, {
            let mut expected =
                manifest(1, CheckpointKind::Checkpoint, m.files().cloned().collect());
            expected.created_unix_ms = m.created_unix_ms;
            expected
        });
        let entries: Vec<FileEntry> = m.files().cloned().collect();
        assert_eq!(s.read_file(&path, &entries[0]).unwrap(), b"state of 1");
        assert_eq!(s.read_file(&path, &entries[1]).unwrap(), b"sst-1");
        assert!(entries[1].shared && !entries[0].shared);
        let json = fs::read_to_string(path.join("_metadata")).unwrap();
        assert!(json.contains("\n  \"job\": \"job\""), "pretty JSON: {json}");
        assert!(!path.join("_metadata.tmp").exists());
    }

    #[test]
    fn load_accepts_the_three_path_forms() {
        let (_tmp, s) = storage();
        let chk = write(&s, 3, &[]);
        let w = s.savepoint(CheckpointId(4), "before-upgrade").unwrap();
        let f = w.write_file("x", b"x").unwrap();
        let sp = w
            .finish(manifest(4, CheckpointKind::Savepoint, vec![f]))
            .unwrap();
        assert_eq!(sp.file_name().unwrap(), "sp-4-before-upgrade");
        for path in [
            chk.clone(),
            chk.join("_metadata"),
            sp.clone(),
            sp.join("_metadata"),
        ] {
            let m = s.load(&path).unwrap();
            assert_eq!(
                m.checkpoint_id.0,
                if path.starts_with(&chk) { 3 } else { 4 }
            );
            let entry = m.files().next().unwrap();
            s.read_file(&path, entry).unwrap();
        }
        // a savepoint moved elsewhere by a user still loads
        let moved = s.dir().parent().unwrap().join("my-savepoint");
        fs::rename(&sp, &moved).unwrap();
        assert_eq!(s.load(&moved).unwrap().kind, CheckpointKind::Savepoint);
    }

    #[test]
    fn corrupt_files_are_named() {
        let (_tmp, s) = storage();
        let path = write(&s, 1, &["sst-a"]);
        let own = path.join("own");
        let good = fs::read(&own).unwrap();

        let mut flipped = good.clone();
        flipped[0] ^= 0x01;
        fs::write(&own, &flipped).unwrap();
        let (file, problem) = corrupt_problem(s.load(&path));
        assert_eq!(file, own);
        assert!(matches!(problem, FileProblem::Checksum { .. }));
        let msg = s.load(&path).unwrap_err().to_string();
        assert!(
            msg.contains("chk-00000000000000000001 is corrupt")
                && msg.contains("own: the file's crc32"),
            "{msg}"
        );

        fs::write(&own, &good[..good.len() - 1]).unwrap();
        let (_, problem) = corrupt_problem(s.load(&path));
        assert_eq!(
            problem,
            FileProblem::Size {
                expected: good.len() as u64,
                actual: good.len() as u64 - 1
            }
        );

        fs::write(&own, &good).unwrap();
        s.load(&path).unwrap();
        let shared = s.dir().join("shared/sst-a");
        fs::remove_file(&shared).unwrap();
        assert_eq!(
            corrupt_problem(s.load(&path)),
            (shared, FileProblem::Missing)
        );
    }

    #[test]
    fn read_file_verifies_again() {
        let (_tmp, s) = storage();
        let path = write(&s, 1, &[]);
        let m = s.load(&path).unwrap();
        let entry = m.files().next().unwrap().clone();
        fs::write(path.join("own"), b"state of 2").unwrap(); // same size, other bytes
        let e = s.read_file(&path, &entry).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Corrupt {
                    problem: FileProblem::Checksum { .. },
                    ..
                }
            ),
            "{e}"
        );
        let escape = FileEntry {
            name: "../x".into(),
            ..entry
        };
        assert!(matches!(
            s.read_file(&path, &escape),
            Err(Error::InvalidName { .. })
        ));
    }

    #[test]
    fn latest_complete_falls_back_past_corrupt_checkpoints() {
        let (_tmp, s) = storage();
        assert!(s.latest_complete().unwrap().checkpoint.is_none());
        write(&s, 1, &[]);
        let p2 = write(&s, 2, &[]);
        let p3 = write(&s, 3, &[]);
        s.savepoint(CheckpointId(4), "sp").unwrap(); // savepoints are not candidates
        let latest = s.latest_complete().unwrap();
        assert_eq!(latest.checkpoint.unwrap().path, p3);

        fs::write(p3.join("own"), b"garbage!!!").unwrap();
        fs::write(p2.join("_metadata"), b"{ truncated").unwrap();
        let latest = s.latest_complete().unwrap();
        let found = latest.checkpoint.unwrap();
        assert_eq!(found.manifest.checkpoint_id, CheckpointId(1));
        let skipped: Vec<&Path> = latest.skipped.iter().map(|s| s.path.as_path()).collect();
        assert_eq!(skipped, [p3.as_path(), p2.as_path()]);
        assert!(matches!(latest.skipped[0].error, Error::Corrupt { .. }));
        assert!(matches!(
            latest.skipped[1].error,
            Error::ManifestParse { .. }
        ));
    }

    #[test]
    fn partial_checkpoint_is_not_complete_and_skipped() {
        let (_tmp, s) = storage();
        let p1 = write(&s, 1, &[]);
        let w = s
            .begin(CheckpointId(2), CheckpointKind::Checkpoint)
            .unwrap();
        w.write_file("own", b"half").unwrap();
        drop(w); // crashed before finish
        let list = s.list().unwrap();
        assert_eq!(list.len(), 2);
        assert!(list[0].complete && !list[1].complete);
        assert_eq!(list[1].id, CheckpointId(2));
        let latest = s.latest_complete().unwrap();
        assert_eq!(latest.checkpoint.unwrap().path, p1);
        assert!(latest.skipped.is_empty(), "incomplete is not corrupt");
        let e = s
            .load(s.dir().join("chk-00000000000000000002"))
            .unwrap_err();
        assert!(matches!(e, Error::NotComplete { .. }));
        assert!(e.to_string().contains("no _metadata"), "{e}");
        // a new attempt at the same id may overwrite the leftovers
        let w = s
            .begin(CheckpointId(2), CheckpointKind::Checkpoint)
            .unwrap();
        let f = w.write_file("own", b"whole").unwrap();
        w.finish(manifest(2, CheckpointKind::Checkpoint, vec![f]))
            .unwrap();
        assert_eq!(
            s.latest_complete()
                .unwrap()
                .checkpoint
                .unwrap()
                .manifest
                .checkpoint_id
                .0,
            2
        );
    }

    #[test]
    fn list_sorts_and_ignores_strangers_and_next_id_skips_everything() {
        let (_tmp, s) = storage();
        assert_eq!(s.next_id().unwrap(), CheckpointId(1));
        write(&s, 10, &[]);
        write(&s, 9, &[]);
        s.begin(CheckpointId(12), CheckpointKind::Checkpoint)
            .unwrap();
        let sp = s
            .begin(CheckpointId(11), CheckpointKind::Savepoint)
            .unwrap();
        assert!(
            sp.path()
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("sp-11-")
        );
        fs::create_dir(s.dir().join("chk-junk")).unwrap();
        fs::write(
            s.dir().join("chk-00000000000000000099"),
            b"a file, not a dir",
        )
        .unwrap();
        let ids: Vec<(u64, CheckpointKind, bool)> = s
            .list()
            .unwrap()
            .iter()
            .map(|c| (c.id.0, c.kind, c.complete))
            .collect();
        assert_eq!(
            ids,
            [
                (9, CheckpointKind::Checkpoint, true),
                (10, CheckpointKind::Checkpoint, true),
                (11, CheckpointKind::Savepoint, false),
                (12, CheckpointKind::Checkpoint, false),
            ]
        );
        assert_eq!(s.next_id().unwrap(), CheckpointId(13));
    }

    #[test]
    fn begin_refuses_to_overwrite() {
        let (_tmp, s) = storage();
        write(&s, 1, &[]);
        let e = s.begin(CheckpointId(1), CheckpointKind::Final).unwrap_err();
        assert!(matches!(e, Error::AlreadyExists { .. }), "{e}");
        let _w = s
            .begin(CheckpointId(2), CheckpointKind::Checkpoint)
            .unwrap();
        assert!(matches!(
            s.begin(CheckpointId(2), CheckpointKind::Checkpoint),
            Err(Error::AlreadyExists { .. })
        ));
        s.savepoint(CheckpointId(3), "x").unwrap();
        assert!(matches!(
            s.savepoint(CheckpointId(3), "x"),
            Err(Error::AlreadyExists { .. })
        ));
        assert!(matches!(
            s.savepoint(CheckpointId(3), "../x"),
            Err(Error::InvalidName { .. })
        ));
    }

    #[test]
    fn discard_removes_only_incomplete_checkpoints() {
        let (_tmp, s) = storage();
        let done = write(&s, 1, &[]);
        let w = s
            .begin(CheckpointId(2), CheckpointKind::Checkpoint)
            .unwrap();
        w.write_file("own", b"x").unwrap();
        assert!(s.discard(CheckpointId(2)).unwrap());
        assert!(!w.path().exists());
        assert!(!s.discard(CheckpointId(2)).unwrap());
        assert!(!s.discard(CheckpointId(1)).unwrap());
        assert!(done.join("_metadata").exists());
        // a writer of a discarded checkpoint fails cleanly
        assert!(matches!(w.write_file("more", b"x"), Err(Error::Io { .. })));
    }

    #[test]
    fn inconsistent_manifest_is_rejected() {
        let (_tmp, s) = storage();
        let p1 = write(&s, 1, &[]);
        let p2 = write(&s, 2, &[]);
        fs::copy(p1.join("_metadata"), p2.join("_metadata")).unwrap();
        let e = s.load(&p2).unwrap_err();
        assert!(e.to_string().contains("records checkpoint 1"), "{e}");
        assert_eq!(s.latest_complete().unwrap().checkpoint.unwrap().path, p1);
    }
}
