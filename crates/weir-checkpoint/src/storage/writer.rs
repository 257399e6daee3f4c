//! [`CheckpointWriter`]: writing the files of one checkpoint or savepoint, then its manifest.
//!
//! Registers every writer, and every shared file it stores or reuses, in the storage's
//! [`Registry`], which retention consults. Knows nothing of retention itself.

use super::layout::{self, METADATA, METADATA_TMP};
use super::manifest::{FileEntry, Manifest};
use super::registry::Registry;
use crate::error::{Error, Result};
use crate::kind::CheckpointKind;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use weir_core::ids::CheckpointId;

/// Writes the files of one checkpoint (or savepoint) and finally its manifest.
///
/// Cheap to clone and `Send + Sync`: hand a clone to every task (thread) that writes files
/// of this checkpoint. Files are fsynced when written; the checkpoint exists only once
/// [`finish`](CheckpointWriter::finish) has renamed `_metadata` into place.
#[derive(Debug, Clone)]
pub struct CheckpointWriter {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    id: CheckpointId,
    kind: CheckpointKind,
    dir: PathBuf,
    shared_dir: PathBuf,
    registry: Arc<Registry>,
    /// The run's lease, checked right before the manifest is renamed into place.
    owner: Option<crate::Ownership>,
    /// Where the objects go, on object storage.
    remote: Option<super::remote::RemoteDir>,
    /// Writes one task's files of a checkpoint another process completes (see
    /// [`CheckpointStorage::task_files`](super::CheckpointStorage::task_files)): its own
    /// files' entries name its token, and it cannot finish.
    task_files: bool,
    token: u64,
    seq: AtomicU64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Names written so far, and whether through `write_shared`.
    names: HashMap<String, bool>,
    finished: bool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.registry.unregister(self.token);
    }
}

impl CheckpointWriter {
    pub(crate) fn new(
        id: CheckpointId,
        kind: CheckpointKind,
        dir: PathBuf,
        shared_dir: PathBuf,
        registry: Arc<Registry>,
        owner: Option<crate::Ownership>,
    ) -> Result<Self> {
        Self::build(id, kind, dir, shared_dir, None, registry, owner)
    }

    /// A writer of checkpoint `id` into object storage.
    pub(crate) fn new_remote(
        id: CheckpointId,
        kind: CheckpointKind,
        dir: PathBuf,
        remote: super::remote::RemoteDir,
        registry: Arc<Registry>,
        owner: Option<crate::Ownership>,
    ) -> Result<Self> {
        let shared_dir = layout::shared_dir_of(&dir);
        Self::build(id, kind, dir, shared_dir, Some(remote), registry, owner)
    }

    /// A writer of one task's files of checkpoint `id` on object storage, for a checkpoint
    /// whose manifest another process writes.
    pub(crate) fn new_task_files(
        id: CheckpointId,
        dir: PathBuf,
        remote: super::remote::RemoteDir,
        registry: Arc<Registry>,
    ) -> Result<Self> {
        let shared_dir = layout::shared_dir_of(&dir);
        let mut w = Self::build(
            id,
            CheckpointKind::Checkpoint,
            dir,
            shared_dir,
            Some(remote),
            registry,
            None,
        )?;
        Arc::get_mut(&mut w.inner)
            .expect("a new writer has no clones")
            .task_files = true;
        Ok(w)
    }

    fn build(
        id: CheckpointId,
        kind: CheckpointKind,
        dir: PathBuf,
        shared_dir: PathBuf,
        remote: Option<super::remote::RemoteDir>,
        registry: Arc<Registry>,
        owner: Option<crate::Ownership>,
    ) -> Result<Self> {
        let token = registry.register(&dir)?;
        let inner = Inner {
            id,
            kind,
            dir,
            shared_dir,
            registry,
            owner,
            remote,
            task_files: false,
            token,
            seq: AtomicU64::new(0),
            state: Mutex::new(State::default()),
        };
        Ok(CheckpointWriter {
            inner: Arc::new(inner),
        })
    }

    /// The checkpoint's id.
    pub fn id(&self) -> CheckpointId {
        self.inner.id
    }

    /// The checkpoint's kind.
    pub fn kind(&self) -> CheckpointKind {
        self.inner.kind
    }

    /// The checkpoint's directory.
    pub fn path(&self) -> &Path {
        &self.inner.dir
    }

    /// Writes (and fsyncs) a file into the checkpoint's directory.
    ///
    /// `name` must be a plain file name not starting with `.` or `_`, unique within the
    /// checkpoint (prefix it with the operator uid and subtask).
    pub fn write_file(&self, name: &str, bytes: &[u8]) -> Result<FileEntry> {
        layout::validate_file_name(name)?;
        self.reserve(name, false)?;
        let path = self.inner.dir.join(name);
        let written = match &self.inner.remote {
            Some(r) => r.write_own(name, bytes),
            None => layout::write_synced(&path, bytes),
        };
        if written.is_err() {
            self.state().names.remove(name);
        }
        written?;
        Ok(self.own_entry(entry(name, bytes, false)))
    }

    /// Like [`write_file`](Self::write_file) for a local file, copied (or uploaded) as a
    /// stream: never held whole in memory.
    pub fn write_file_from(&self, name: &str, source: &Path) -> Result<FileEntry> {
        layout::validate_file_name(name)?;
        self.reserve(name, false)?;
        let path = self.inner.dir.join(name);
        let written = match &self.inner.remote {
            Some(r) => r.upload_own(name, source),
            None => super::fetch::copy_with_crc(source, &path, true),
        };
        let (size, crc32) = match written {
            Ok(w) => w,
            Err(e) => {
                self.state().names.remove(name);
                return Err(e);
            }
        };
        Ok(self.own_entry(FileEntry {
            name: name.to_string(),
            size,
            crc32,
            shared: false,
            objects: None,
        }))
    }

    /// An entry of one of this writer's own files: a task-files writer's names its token.
    fn own_entry(&self, mut e: FileEntry) -> FileEntry {
        if self.inner.task_files && !e.shared {
            e.objects = self.inner.remote.as_ref().map(|r| r.token.clone());
        }
        e
    }

    /// The entry of a file another writer stored for this checkpoint (a worker's task
    /// files, see [`CheckpointStorage::task_files`](super::CheckpointStorage::task_files)),
    /// as this checkpoint's manifest must list it. A checkpoint refers to the object where
    /// it is: the entry is returned as it is. A savepoint must be self-contained: the
    /// object is copied into the savepoint's own objects on the server (the bytes do not
    /// pass through this process), and the entry names that copy.
    ///
    /// [`finish`](Self::finish) checks that every object the manifest lists exists with
    /// its size, as for files this writer wrote.
    pub fn adopt(&self, stored: &FileEntry) -> Result<FileEntry> {
        layout::validate_file_name(&stored.name)?;
        let Some(r) = &self.inner.remote else {
            return Err(Error::InvalidConfig(format!(
                "{}: files stored by another writer are adopted only on object storage",
                self.inner.dir.display()
            )));
        };
        if !stored.shared && stored.objects.is_none() {
            return Err(Error::InvalidConfig(format!(
                "{}: file {} names no writer's objects",
                self.inner.dir.display(),
                stored.name
            )));
        }
        if !self.inner.kind.is_savepoint() {
            self.reserve(&stored.name, stored.shared)?;
            if stored.shared {
                self.inner
                    .registry
                    .protect_shared(self.inner.token, &stored.name);
            }
            return Ok(stored.clone());
        }
        self.reserve(&stored.name, stored.shared)?;
        let id_dir = layout::checkpoint_dir_name(self.inner.id);
        r.copy_own(&id_dir, stored)?;
        Ok(FileEntry {
            shared: false,
            objects: None,
            ..stored.clone()
        })
    }

    /// Writes a file that several checkpoints may share (e.g. an immutable SST file of an
    /// incremental RocksDB snapshot) into `shared/`, returning an entry with `shared: true`.
    /// If the file already exists with the same size and checksum it is not rewritten; if it
    /// exists with other contents that is an [`Error::SharedConflict`]: shared names must
    /// identify their contents.
    ///
    /// For a savepoint, which must be self-contained, the file is written into the
    /// savepoint's own directory instead and the entry has `shared: false`; state backends
    /// need not tell the two cases apart.
    pub fn write_shared(&self, name: &str, bytes: &[u8]) -> Result<FileEntry> {
        let new = entry(name, bytes, !self.inner.kind.is_savepoint());
        if let Some(r) = &self.inner.remote {
            if self.place_remote(r, &new)? {
                if new.shared {
                    r.write_shared(name, bytes)?;
                } else {
                    r.write_own(name, bytes)?;
                }
            }
            self.stored(&new);
            return Ok(self.own_entry(new));
        }
        let Some((path, tmp)) = self.place_shared(&new)? else {
            return Ok(new);
        };
        let written = layout::write_synced(&tmp, bytes).and_then(|()| {
            std::fs::rename(&tmp, &path).map_err(|e| Error::io("rename into place", &tmp, e))
        });
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written?;
        self.stored(&new);
        Ok(new)
    }

    /// Reuses a shared file that a writer of this storage (or a clone of it) stored before
    /// and that is still in `shared/`, without reading it: returns its entry and keeps the
    /// file from retention until this checkpoint is finished or dropped. Returns `None` when
    /// the file must be stored with [`link_shared`](Self::link_shared) or
    /// [`write_shared`](Self::write_shared) instead: no writer of this process stored it, it
    /// was deleted since (by [`retain`](crate::CheckpointStorage::retain), or by anyone: its
    /// size is checked), or this writer writes a savepoint (which keeps its own copies).
    ///
    /// This is how a state backend's immutable files are stored once, by name, across
    /// checkpoints, without a cache of its own that could outlive a deletion.
    pub fn reuse_shared(&self, name: &str) -> Result<Option<FileEntry>> {
        layout::validate_file_name(name)?;
        if self.inner.kind.is_savepoint() {
            return Ok(None);
        }
        self.reserve(name, true)?;
        let path = self.inner.shared_dir.join(name);
        // Under the registry's lock: retention either deleted the file (and forgot it)
        // before, or sees it protected and keeps it.
        let mut books = self.inner.registry.lock();
        let Some(entry) = books.stored.get(name).cloned() else {
            return Ok(None);
        };
        let found = match &self.inner.remote {
            Some(r) => r
                .ensure_visible()
                .and_then(|()| r.shared_size(name))
                .map(|s| s.map(|size| (true, size))),
            None => match std::fs::metadata(&path) {
                Ok(m) => Ok(Some((m.is_file(), m.len()))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Error::io("read", path, e)),
            },
        };
        match found? {
            Some((true, size)) if size == entry.size => {}
            _ => {
                books.stored.remove(name);
                return Ok(None);
            }
        }
        if let Some(w) = books.writers.get_mut(&self.inner.token) {
            w.shared.insert(name.to_string());
        }
        Ok(Some(entry))
    }

    /// Like [`CheckpointWriter::write_shared`], for a file that is already on disk and never
    /// changes (an SST file of RocksDB): it is hard-linked into storage when storage is on
    /// the same file system, and copied otherwise. Linking costs no copy, so a checkpoint's
    /// upload reads each new file once (for its checksum) instead of reading and writing it.
    pub fn link_shared(&self, name: &str, source: &Path) -> Result<FileEntry> {
        layout::validate_file_name(name)?;
        if let Some(r) = &self.inner.remote {
            return self.upload_shared(r, name, source);
        }
        let (size, crc32) = layout::file_crc(source).map_err(|e| Error::io("read", source, e))?;
        let new = FileEntry {
            name: name.to_string(),
            size,
            crc32,
            shared: !self.inner.kind.is_savepoint(),
            objects: None,
        };
        let Some((path, tmp)) = self.place_shared(&new)? else {
            return Ok(new);
        };
        // The source's contents must be durable before a checkpoint refers to them.
        let linked = std::fs::File::open(source)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::io("fsync", source, e))
            .and_then(|()| match std::fs::hard_link(source, &tmp) {
                Ok(()) => Ok(()),
                // Another file system (or no links there): copy, as a stream.
                Err(_) => super::fetch::copy_with_crc(source, &tmp, true).and_then(|copied| {
                    if copied != (size, crc32) {
                        return Err(Error::io(
                            "read",
                            source,
                            std::io::Error::other("the file changed while it was stored"),
                        ));
                    }
                    Ok(())
                }),
            })
            .and_then(|()| {
                std::fs::rename(&tmp, &path).map_err(|e| Error::io("rename into place", &tmp, e))
            });
        if linked.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        linked?;
        self.stored(&new);
        Ok(new)
    }

    /// [`link_shared`](Self::link_shared) on object storage: uploaded, streamed, unless an
    /// object of that name and size is there already.
    fn upload_shared(
        &self,
        r: &super::remote::RemoteDir,
        name: &str,
        source: &Path,
    ) -> Result<FileEntry> {
        let shared = !self.inner.kind.is_savepoint();
        self.reserve(name, true)?;
        if shared {
            r.ensure_visible()?;
            self.inner.registry.protect_shared(self.inner.token, name);
            let size = std::fs::metadata(source)
                .map_err(|e| Error::io("read", source, e))?
                .len();
            if r.shared_size(name)? == Some(size) {
                let (size, crc32) =
                    layout::file_crc(source).map_err(|e| Error::io("read", source, e))?;
                let new = FileEntry {
                    name: name.to_string(),
                    size,
                    crc32,
                    shared,
                    objects: None,
                };
                self.stored(&new);
                return Ok(new);
            }
        }
        let (size, crc32) = if shared {
            r.upload_shared(name, source)?
        } else {
            r.upload_own(name, source)?
        };
        let new = self.own_entry(FileEntry {
            name: name.to_string(),
            size,
            crc32,
            shared,
            objects: None,
        });
        self.stored(&new);
        Ok(new)
    }

    /// Claims a shared file's name on object storage: true when it must be written (no
    /// object of that name and size exists; names identify contents).
    fn place_remote(&self, r: &super::remote::RemoteDir, new: &FileEntry) -> Result<bool> {
        let name = new.name.as_str();
        layout::validate_file_name(name)?;
        self.reserve(name, true)?;
        if !new.shared {
            return Ok(true);
        }
        r.ensure_visible()?;
        self.inner.registry.protect_shared(self.inner.token, name);
        match r.shared_size(name)? {
            Some(size) if size == new.size => Ok(false),
            Some(existing_size) => Err(Error::SharedConflict {
                path: self.inner.shared_dir.join(name),
                existing_size,
                existing_crc: 0,
                new_size: new.size,
                new_crc: new.crc32,
            }),
            None => Ok(true),
        }
    }

    /// Records a file this writer stored in (or found in) `shared/`.
    fn stored(&self, entry: &FileEntry) {
        if entry.shared {
            self.inner.registry.remember_stored(entry);
        }
    }

    /// Claims a shared file's name for this checkpoint and finds its place: `None` when an
    /// identical file is stored already, else its final path and a temporary path to write
    /// it to first. A file of that name with other contents is a conflict.
    fn place_shared(&self, new: &FileEntry) -> Result<Option<(PathBuf, PathBuf)>> {
        let name = new.name.as_str();
        layout::validate_file_name(name)?;
        self.reserve(name, true)?;
        let dir = if self.inner.kind.is_savepoint() {
            &self.inner.dir
        } else {
            // Register before looking at the file, so that a concurrent retain either sees the
            // name protected or has already deleted the file (which is then rewritten).
            self.inner.registry.protect_shared(self.inner.token, name);
            &self.inner.shared_dir
        };
        let path = dir.join(name);
        match layout::file_crc(&path) {
            Ok((size, crc)) if size == new.size && crc == new.crc32 => {
                self.stored(new);
                return Ok(None);
            }
            Ok((existing_size, existing_crc)) => {
                return Err(Error::SharedConflict {
                    path,
                    existing_size,
                    existing_crc,
                    new_size: new.size,
                    new_crc: new.crc32,
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("read", path, e)),
        }
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create directory", dir, e))?;
        let seq = self.inner.seq.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(layout::tmp_name(self.inner.token, seq, name));
        Ok(Some((path, tmp)))
    }

    /// Completes the checkpoint: checks that `manifest` belongs to it and that every file it
    /// references exists with the recorded size, writes the manifest as pretty JSON to
    /// `_metadata.tmp`, fsyncs it, renames it to `_metadata` and fsyncs the directory. Only
    /// then is the checkpoint complete. Returns the checkpoint's directory.
    ///
    /// Other clones of this writer can write no more files afterwards.
    pub fn finish(self, manifest: Manifest) -> Result<PathBuf> {
        let inner = &self.inner;
        let span =
            tracing::info_span!("checkpoint_finish", checkpoint = %inner.id, kind = %inner.kind);
        let _enter = span.enter();
        if inner.task_files {
            return Err(Error::InvalidConfig(format!(
                "{}: a writer of task files does not finish the checkpoint; the process that \
                 writes its manifest adopts the files (CheckpointWriter::adopt)",
                inner.dir.display()
            )));
        }
        let mut state = self.state();
        if state.finished {
            return Err(Error::WriterFinished {
                path: inner.dir.clone(),
            });
        }
        let invalid = |problem: String| Error::InvalidManifest {
            path: inner.dir.clone(),
            problem,
        };
        if manifest.checkpoint_id != inner.id {
            return Err(invalid(format!(
                "the manifest is for checkpoint {} but this writer writes checkpoint {}",
                manifest.checkpoint_id, inner.id
            )));
        }
        if manifest.kind.is_savepoint() != inner.kind.is_savepoint() {
            return Err(invalid(format!(
                "the manifest says {} but this writer writes a {}",
                manifest.kind, inner.kind
            )));
        }
        manifest.check(&inner.dir)?;
        if let Some(r) = &inner.remote {
            return self.finish_remote(r, state, manifest);
        }
        let mut any_shared = false;
        for f in manifest.files() {
            any_shared |= f.shared;
            let path = if f.shared {
                inner.shared_dir.join(&f.name)
            } else {
                inner.dir.join(&f.name)
            };
            let problem = match std::fs::metadata(&path) {
                Ok(m) if m.len() == f.size => continue,
                Ok(m) => crate::FileProblem::Size {
                    expected: f.size,
                    actual: m.len(),
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => crate::FileProblem::Missing,
                Err(e) => return Err(Error::io("read", path, e)),
            };
            return Err(Error::Corrupt {
                checkpoint: inner.dir.clone(),
                file: path,
                problem,
            });
        }
        if any_shared {
            layout::sync_dir(&inner.shared_dir)?;
        }
        let json = manifest.encode().map_err(|source| Error::ManifestEncode {
            path: inner.dir.clone(),
            source,
        })?;
        let tmp = inner.dir.join(METADATA_TMP);
        layout::write_synced(&tmp, &json)?;
        let target = inner.dir.join(METADATA);
        // The checkpoint becomes a restore point with this rename: only while this run
        // still owns the directory.
        if let Some(owner) = &inner.owner {
            owner.verify()?;
        }
        std::fs::rename(&tmp, &target).map_err(|e| Error::io("rename into place", &tmp, e))?;
        layout::sync_dir(&inner.dir)?;
        state.finished = true;
        drop(state);
        inner.registry.unregister(inner.token);
        tracing::debug!(path = %inner.dir.display(), files = manifest.files().count(), "checkpoint written");
        Ok(inner.dir.clone())
    }

    /// [`finish`](Self::finish) on object storage: checks the files, then writes the
    /// manifest with one PUT (the commit point; see `remote`).
    fn finish_remote(
        &self,
        r: &super::remote::RemoteDir,
        mut state: MutexGuard<'_, State>,
        mut manifest: Manifest,
    ) -> Result<PathBuf> {
        let inner = &self.inner;
        manifest.objects = Some(r.token.clone());
        r.check_files(&manifest, &inner.dir)?;
        let json = manifest.encode().map_err(|source| Error::ManifestEncode {
            path: inner.dir.clone(),
            source,
        })?;
        // The checkpoint becomes a restore point with this write: only while this run still
        // owns the storage.
        if let Some(owner) = &inner.owner {
            owner.verify()?;
        }
        r.write_manifest(json)?;
        super::remote::remember_token(&inner.dir, manifest.objects.clone());
        state.finished = true;
        drop(state);
        inner.registry.unregister(inner.token);
        tracing::debug!(path = %inner.dir.display(), files = manifest.files().count(), "checkpoint written");
        Ok(inner.dir.clone())
    }

    #[cfg(test)]
    pub(crate) fn inner_token(&self) -> u64 {
        self.inner.token
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims `name` for this checkpoint; the same shared name may be claimed again.
    fn reserve(&self, name: &str, shared: bool) -> Result<()> {
        let mut state = self.state();
        if state.finished {
            return Err(Error::WriterFinished {
                path: self.inner.dir.clone(),
            });
        }
        match state.names.get(name) {
            Some(&was_shared) if was_shared && shared => Ok(()),
            Some(_) => Err(Error::DuplicateFile {
                checkpoint: self.inner.dir.clone(),
                name: name.to_string(),
            }),
            None => {
                state.names.insert(name.to_string(), shared);
                Ok(())
            }
        }
    }
}

fn entry(name: &str, bytes: &[u8], shared: bool) -> FileEntry {
    FileEntry {
        name: name.to_string(),
        size: bytes.len() as u64,
        crc32: crc32fast::hash(bytes),
        shared,
        objects: None,
    }
}

#[cfg(test)]
mod tests;
