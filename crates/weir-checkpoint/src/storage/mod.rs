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
//! - `_metadata` is pretty JSON ([`Manifest`]) listing every file with its size and CRC-32,
//!   and carrying its own CRC-32 as its first member, `metadata_crc32` (see [`Manifest`]);
//!   [`CheckpointStorage::load`] verifies the manifest and all of the files before
//!   returning it.
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
//!     subtasks: vec![SubtaskManifest { subtask: 0, files: vec![file], operator_state: None, watermark: None }],
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

mod control;
mod fetch;
pub(crate) mod layout;
mod manifest;
mod owned;
mod registry;
pub(crate) mod remote;
#[cfg(test)]
mod remote_tests;
mod retain;
mod stop;
#[cfg(test)]
pub(crate) mod tests;
mod verify;
mod writer;

pub use manifest::{
    FORMAT_VERSION, FileEntry, Manifest, ManifestStats, OperatorManifest, SubtaskManifest,
};
pub use retain::{DEFAULT_RETAINED, RetainReport};
pub use stop::{STOP_RECORD, StopRecord};
pub use writer::CheckpointWriter;

use crate::error::{Error, Result};
use crate::kind::CheckpointKind;
use layout::{METADATA, SHARED_DIR};
use registry::Registry;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use weir_core::ids::CheckpointId;

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
    /// The store when `dir` is an object-storage URL.
    remote: Option<weir_objstore::Store>,
    registry: Arc<Registry>,
    /// The run's lease on the directory, checked before every durable act.
    owner: Option<crate::Ownership>,
}

impl CheckpointStorage {
    /// Opens the storage at `dir`, creating it (and `shared/`) if missing.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        if let Some(local) = dir.to_str().and_then(|d| d.strip_prefix("file://")) {
            return CheckpointStorage::open(local);
        }
        if remote::is_remote(dir) {
            let store = remote::open(dir)?;
            return Ok(CheckpointStorage {
                dir: PathBuf::from(store.url()),
                remote: Some(store),
                registry: Arc::default(),
                owner: None,
            });
        }
        let dir = std::path::absolute(dir).map_err(|e| Error::io("resolve path", dir, e))?;
        let shared = dir.join(SHARED_DIR);
        layout::create_dir_all_synced(&shared)
            .map_err(|e| Error::io("create directory", &shared, e))?;
        Ok(CheckpointStorage {
            dir,
            remote: None,
            registry: Arc::default(),
            owner: None,
        })
    }

    /// The object store, when the storage is on object storage.
    pub(crate) fn remote(&self) -> Option<&weir_objstore::Store> {
        self.remote.as_ref()
    }

    /// True when the storage is on object storage (its [`dir`](Self::dir) is a URL).
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// The storage directory (absolute), or its URL on object storage.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every `chk-` and `sp-` directory, complete or not, sorted by id (then kind, then path).
    /// Other entries are ignored.
    pub fn list(&self) -> Result<Vec<CheckpointInfo>> {
        if let Some(store) = &self.remote {
            return remote::list(store, &self.dir);
        }
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
        if let Some(store) = &self.remote {
            let name = layout::checkpoint_dir_name(id);
            if store.head(&format!("{name}/{METADATA}"))?.is_some() {
                return Err(Error::AlreadyExists { path: dir });
            }
            tracing::debug!(checkpoint = %id, %kind, path = %dir.display(), "writing checkpoint");
            return CheckpointWriter::new_remote(
                id,
                kind,
                dir,
                remote::RemoteDir::new(store.clone(), name),
                self.registry.clone(),
                self.owner.clone(),
            );
        }
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
        if dir.join(METADATA).exists() {
            return Err(Error::AlreadyExists { path: dir });
        }
        // The directory's entry must be durable before anything in it counts: `finish`
        // fsyncs the files and the directory itself, not the storage directory. (Also when
        // the directory was left by a crashed attempt: its entry may never have been synced.)
        layout::sync_dir(&self.dir)?;
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

    /// Starts writing one task's files of checkpoint `id` on object storage, for a
    /// checkpoint whose manifest another process writes: a worker of a cluster stores its
    /// tasks' files itself and acknowledges with their entries, and the coordinator adopts
    /// them ([`CheckpointWriter::adopt`]) into the manifest it writes. The writer's own
    /// files go under `chk-<id>/<its token>/` and their entries name that token
    /// ([`FileEntry::objects`]); shared files go into `shared/`, reused by name as for any
    /// writer. Before it writes or reuses a shared file the checkpoint is visible under
    /// `chk-<id>/` (its own file, or a marker), so retention in any process leaves
    /// `shared/` alone meanwhile. Whether the checkpoint turns out to be a savepoint does
    /// not matter here: the coordinator copies what a savepoint needs into it.
    ///
    /// The writer cannot [`finish`](CheckpointWriter::finish). Only on object storage: in a
    /// directory, [`Error::InvalidConfig`].
    pub fn task_files(&self, id: CheckpointId) -> Result<CheckpointWriter> {
        let Some(store) = &self.remote else {
            return Err(Error::InvalidConfig(format!(
                "{}: tasks store their checkpoint files themselves only on object storage",
                self.dir.display()
            )));
        };
        let name = layout::checkpoint_dir_name(id);
        CheckpointWriter::new_task_files(
            id,
            self.dir.join(&name),
            remote::RemoteDir::new(store.clone(), name),
            self.registry.clone(),
        )
    }

    /// Starts writing savepoint `id` into `sp-<id>-<name>`. `name` may contain ASCII letters,
    /// digits, `.`, `_` and `-`; the directory must not exist yet.
    pub fn savepoint(&self, id: CheckpointId, name: &str) -> Result<CheckpointWriter> {
        layout::validate_savepoint_name(name)?;
        self.check_owner()?;
        let dir = self.dir.join(layout::savepoint_dir_name(id, name));
        if let Some(store) = &self.remote {
            let dir_name = layout::savepoint_dir_name(id, name);
            if !store.list(&format!("{dir_name}/"))?.is_empty() {
                return Err(Error::AlreadyExists { path: dir });
            }
            tracing::debug!(checkpoint = %id, path = %dir.display(), "writing savepoint");
            return CheckpointWriter::new_remote(
                id,
                CheckpointKind::Savepoint,
                dir,
                remote::RemoteDir::new(store.clone(), dir_name),
                self.registry.clone(),
                self.owner.clone(),
            );
        }
        // Fsyncs the storage directory, so that the new entry survives a crash.
        match layout::create_dir_synced(&dir) {
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
        if remote::is_remote(path.as_ref()) {
            return remote::load(path.as_ref());
        }
        let dir = layout::resolve(path.as_ref())?;
        let span = tracing::info_span!("checkpoint_load", path = %dir.display());
        let _enter = span.enter();
        // Sizes first (a truncated or missing file needs no checksum), then the checksums,
        // several files at once: reading them is most of a restore's time at large state.
        let manifest = self.load_unread(&dir)?;
        verify::checksums(&dir, &manifest, &std::sync::atomic::AtomicBool::new(false))?;
        tracing::debug!(checkpoint = %manifest.checkpoint_id, "checkpoint verified");
        Ok(manifest)
    }

    /// Like [`load`](Self::load), without reading the files: checks the manifest (its own
    /// checksum and consistency) and that every file it lists is there with its size, but
    /// not the files' checksums.
    ///
    /// For a process restoring a checkpoint that another process chose and verified with
    /// [`load`](Self::load) moments before (a cluster worker, after its coordinator): files
    /// in storage are never changed in place, and [`fetch_file`](Self::fetch_file) verifies
    /// the checksum of every file it copies or downloads. On object storage
    /// [`load`](Self::load) checks sizes only anyway.
    ///
    /// ```
    /// use weir_checkpoint::{CheckpointKind, CheckpointStorage, Manifest};
    /// let tmp = tempfile::tempdir()?;
    /// let storage = CheckpointStorage::open(tmp.path().join("checkpoints"))?;
    /// let id = storage.next_id()?;
    /// let writer = storage.begin(id, CheckpointKind::Checkpoint)?;
    /// writer.write_shared("000012.sst", b"immutable contents")?;
    /// let path = writer.finish(Manifest::new("job", id, CheckpointKind::Checkpoint, 128))?;
    /// assert_eq!(storage.load_unread(&path)?, storage.load(&path)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_unread(&self, path: impl AsRef<Path>) -> Result<Manifest> {
        if remote::is_remote(path.as_ref()) {
            return remote::load(path.as_ref());
        }
        let dir = layout::resolve(path.as_ref())?;
        let manifest = Manifest::read(&dir.join(METADATA))?;
        manifest.check(&dir)?;
        let shared = layout::shared_dir_of(&dir);
        for f in manifest.files() {
            let file = if f.shared {
                shared.join(&f.name)
            } else {
                dir.join(&f.name)
            };
            layout::verify_size(&dir, &file, f.size)?;
        }
        Ok(manifest)
    }

    /// The newest complete recovery point whose files all verify: a checkpoint (`chk-`
    /// directory), or a savepoint that stopped the job ([`Manifest::stops_job`]; its sinks
    /// committed up to it). Intermediate savepoints commit nothing and are restored only by
    /// path. Newer candidates that are corrupt (unparsable, inconsistent or with a bad file)
    /// are skipped with a warning and listed in [`LatestComplete::skipped`]. An
    /// operating-system error (e.g. permission denied) is returned instead of skipping,
    /// since it does not prove the checkpoint bad.
    pub fn latest_complete(&self) -> Result<LatestComplete> {
        self.latest_complete_by(|path| self.load(path))
    }

    /// Like [`latest_complete`](Self::latest_complete), checking each candidate with
    /// [`load_unread`](Self::load_unread) (its manifest and its files' sizes) instead of
    /// reading every file: for a restore that verifies the checksums while the job runs
    /// ([`verify_checksums`](Self::verify_checksums)) and falls back to
    /// [`latest_complete`](Self::latest_complete) if they fail.
    ///
    /// ```
    /// use weir_checkpoint::{CheckpointKind, CheckpointStorage, Manifest, OperatorManifest,
    ///                       SubtaskManifest};
    /// let tmp = tempfile::tempdir()?;
    /// let storage = CheckpointStorage::open(tmp.path().join("checkpoints"))?;
    /// for _ in 0..2 {
    ///     let id = storage.next_id()?;
    ///     let writer = storage.begin(id, CheckpointKind::Checkpoint)?;
    ///     let file = writer.write_shared(&format!("{}.sst", id.0), b"immutable contents")?;
    ///     let mut manifest = Manifest::new("job", id, CheckpointKind::Checkpoint, 128);
    ///     manifest.operators.push(OperatorManifest {
    ///         uid: "sum".into(),
    ///         name: "sum".into(),
    ///         parallelism: 1,
    ///         subtasks: vec![SubtaskManifest { subtask: 0, files: vec![file], operator_state: None, watermark: None }],
    ///     });
    ///     writer.finish(manifest)?;
    /// }
    /// // Same length, other bytes: only a checksum tells.
    /// std::fs::write(tmp.path().join("checkpoints/shared/2.sst"), b"immutable CONTENTS")?;
    /// let unread = storage.latest_complete_unread()?.checkpoint.expect("a checkpoint");
    /// assert_eq!(unread.manifest.checkpoint_id.0, 2);
    /// assert!(storage.verify_checksums(&unread.path, &Default::default()).is_err());
    /// let verified = storage.latest_complete()?.checkpoint.expect("a checkpoint");
    /// assert_eq!(verified.manifest.checkpoint_id.0, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn latest_complete_unread(&self) -> Result<LatestComplete> {
        self.latest_complete_by(|path| self.load_unread(path))
    }

    /// Checks the checksum of every file of the checkpoint at `path` (any form
    /// [`load`](Self::load) accepts) against its manifest, several files at once, the part
    /// of [`load`](Self::load) that [`load_unread`](Self::load_unread) leaves out. Returns
    /// `Ok(false)` if `stop` was set before every file was read, `Ok(true)` when all
    /// verify, and the error of the first bad file otherwise. On object storage, where
    /// [`load`](Self::load) checks sizes only, it checks nothing more.
    pub fn verify_checksums(
        &self,
        path: impl AsRef<Path>,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Result<bool> {
        if remote::is_remote(path.as_ref()) {
            return Ok(true);
        }
        let dir = layout::resolve(path.as_ref())?;
        let manifest = Manifest::read(&dir.join(METADATA))?;
        manifest.check(&dir)?;
        verify::checksums(&dir, &manifest, stop)
    }

    /// Like [`latest_complete`](Self::latest_complete), checking each candidate with
    /// `load` (for instance [`load_unread`](Self::load_unread), or one that refuses a
    /// checkpoint whose restore already failed with [`Error::DoesNotRestore`]). A candidate
    /// `load` refuses with an error for which [`Error::is_unusable_checkpoint`] holds is
    /// skipped; any other error is returned.
    ///
    /// ```
    /// use weir_checkpoint::{CheckpointKind, CheckpointStorage, Error, Manifest};
    /// let tmp = tempfile::tempdir()?;
    /// let storage = CheckpointStorage::open(tmp.path().join("checkpoints"))?;
    /// for _ in 0..2 {
    ///     let id = storage.next_id()?;
    ///     storage.begin(id, CheckpointKind::Checkpoint)?.finish(Manifest::new("job", id, CheckpointKind::Checkpoint, 128))?;
    /// }
    /// let newest = storage.latest_complete()?.checkpoint.expect("a checkpoint").path;
    /// let found = storage.latest_complete_by(|path| {
    ///     if path == newest {
    ///         return Err(Error::DoesNotRestore { checkpoint: path.into(), problem: "RocksDB: Corruption".into() });
    ///     }
    ///     storage.load(path)
    /// })?;
    /// assert_eq!(found.checkpoint.expect("the older one").manifest.checkpoint_id.0, 1);
    /// assert!(found.skipped[0].error.to_string().ends_with("cannot be restored: RocksDB: Corruption"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn latest_complete_by(
        &self,
        load: impl Fn(&Path) -> Result<Manifest>,
    ) -> Result<LatestComplete> {
        let mut skipped = Vec::new();
        let candidates = self.list()?.into_iter().rev();
        for info in candidates.filter(|c| c.complete) {
            if info.kind.is_savepoint() {
                // Only a savepoint that stopped the job is a recovery point; one that cannot
                // even be read is not known to be one (the stop record still names it).
                match Manifest::read(&info.path.join(METADATA)) {
                    Ok(m) if m.stops_job => {}
                    _ => continue,
                }
            }
            match load(&info.path) {
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
                    // The caller reports it (LatestComplete::skipped), with what it does instead.
                    tracing::debug!(checkpoint = info.id.0, %error, "skipping corrupt checkpoint");
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
        if remote::is_remote(checkpoint.as_ref()) {
            return remote::read_file(checkpoint.as_ref(), entry);
        }
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

    /// Deletes the directory of an aborted checkpoint or savepoint `id` (after
    /// [`crate::Action::Abort`]): `chk-<id>`, or every `sp-<id>-…` directory, whichever
    /// exists. Returns false if there is none, or if it is complete (its metadata was
    /// written before the abort; such a checkpoint is valid and left to
    /// [`retain`](Self::retain), like the shared files of a discarded one, and such a
    /// savepoint is the user's). A writer still writing it fails from then on.
    pub fn discard(&self, id: CheckpointId) -> Result<bool> {
        if let Some(store) = &self.remote {
            let mut removed = false;
            for c in self.list()?.into_iter().filter(|c| c.id == id) {
                if c.complete {
                    tracing::debug!(checkpoint = %id, path = %c.path.display(), "not discarding a complete checkpoint");
                    continue;
                }
                self.check_owner()?;
                let name = c
                    .path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default();
                remote::delete_dir(store, name)?;
                tracing::debug!(checkpoint = %id, path = %c.path.display(), "discarded");
                removed = true;
            }
            return Ok(removed);
        }
        let mut dirs = vec![self.dir.join(layout::checkpoint_dir_name(id))];
        dirs.extend(
            self.list()?
                .into_iter()
                .filter(|c| c.id == id && c.kind.is_savepoint())
                .map(|c| c.path),
        );
        let mut removed = false;
        for dir in dirs {
            if !dir.is_dir() {
                continue;
            }
            self.check_owner()?;
            if dir.join(METADATA).exists() {
                tracing::debug!(checkpoint = %id, path = %dir.display(), "not discarding a complete checkpoint");
                continue;
            }
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {
                    tracing::debug!(checkpoint = %id, path = %dir.display(), "discarded");
                    removed = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("delete directory", dir, e)),
            }
        }
        Ok(removed)
    }
}
