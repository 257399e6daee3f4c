//! Checkpoint storage on object storage (`s3://`, `gs://`, `az://`, `memory://`): the same
//! layout as a directory, for a store that has no rename, no directories and no append.
//!
//! ```text
//! <url>/
//!   chk-<id>/_metadata                   the manifest: ONE PUT, written last (the commit point)
//!   chk-<id>/<writer token>/<file>       the checkpoint's own files, under its writer's token
//!                                        (or under each worker's, in a cluster)
//!   sp-<id>-<name>/...                   savepoints, the same way (self-contained)
//!   shared/<file>                        files shared by checkpoints (names identify contents)
//!   _stopped_with_savepoint              the stop record (one PUT)
//!   .weir-owner-<seq>-<token>            the directory's owner records (see ownership)
//! ```
//!
//! - A PUT is atomic (readers see the whole object or none of it) and, on S3 and the stores
//!   `object_store` serves, strongly consistent: once it returns, GET and LIST see it. So a
//!   checkpoint is complete exactly when `chk-<id>/_metadata` exists, and it is written only
//!   after every file it lists has been written. No rename is needed.
//! - A checkpoint's own files live under a token of the run that wrote them, named in the
//!   manifest (`"objects"`). Two runs writing the same checkpoint id by mistake (a frozen
//!   owner that thaws) write different objects, and whichever manifest lands last refers only
//!   to its own writer's files: a checkpoint is never a mix of two writers. Shared files are
//!   named by the state backend for their contents (an instance id and a file number), so
//!   two writers never write different contents under one shared name.
//! - In a cluster, workers store their tasks' files themselves
//!   ([`CheckpointStorage::task_files`](super::CheckpointStorage::task_files)): each under
//!   its own token, named in each file's entry (`"objects"` per file), and the coordinator
//!   writes only the manifest, after checking that every object it lists exists with its
//!   size. A worker's checkpoint is visible under `chk-<id>/` (its first own file, or an
//!   `_in_flight` marker) before it writes or reuses anything in `shared/`, so retention in
//!   the coordinator leaves `shared/` alone while it writes. A savepoint stays
//!   self-contained: the coordinator copies the workers' objects into it on the server.
//! - Loading a checkpoint checks that every file exists with its size (one listing per
//!   checkpoint and one of `shared/`); each file's CRC-32 is checked when it is read. Object
//!   stores keep their own checksums, so what a size check misses (a damaged object of the
//!   right size) is not expected; it is still caught on reading, and fails the restore.
//! - Nothing here relies on conditional writes (`If-None-Match`): some S3-compatible servers
//!   ignore them.

use super::layout::{self, METADATA, SHARED_DIR};
use super::manifest::{FileEntry, Manifest};
use super::stop::STOP_RECORD;
use crate::error::{Error, FileProblem, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use weir_objstore::Store;

/// True when `path` is an object-storage URL rather than a local path.
pub(crate) fn is_remote(path: &Path) -> bool {
    path.to_str().is_some_and(weir_objstore::is_url)
}

fn url_of(path: &Path) -> &str {
    path.to_str().unwrap_or_default().trim_end_matches('/')
}

/// Opens the store at `path` (a URL).
pub(crate) fn open(path: &Path) -> Result<Store> {
    Ok(Store::open(url_of(path))?)
}

/// A new random token for a writer's objects.
pub(crate) fn new_token() -> String {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        let nanos = layout::unix_millis().wrapping_mul(1_000_003) ^ u64::from(std::process::id());
        bytes = nanos.to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The checkpoint directory a URL names: the URL itself, or its parent when it names the
/// `_metadata` object.
pub(crate) fn resolve(path: &Path) -> PathBuf {
    let url = url_of(path);
    PathBuf::from(url.strip_suffix(&format!("/{METADATA}")).unwrap_or(url))
}

/// The store holding a checkpoint directory (its parent) and the directory's name.
fn parent_and_name(dir: &Path) -> Result<(Store, String)> {
    let url = url_of(dir);
    let (parent, name) = url
        .rsplit_once('/')
        .filter(|(p, _)| p.contains("://") && !p.ends_with('/'))
        .ok_or_else(|| Error::NotComplete {
            path: dir.to_path_buf(),
        })?;
    Ok((Store::open(parent)?, name.to_string()))
}

/// The writer tokens of manifests read or written by this process, by checkpoint URL.
fn tokens() -> &'static Mutex<HashMap<PathBuf, Option<String>>> {
    static TOKENS: OnceLock<Mutex<HashMap<PathBuf, Option<String>>>> = OnceLock::new();
    TOKENS.get_or_init(Default::default)
}

pub(crate) fn remember_token(dir: &Path, token: Option<String>) {
    tokens()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(dir.to_path_buf(), token);
}

/// The name of a checkpoint's file relative to the checkpoint's parent: under the token of
/// the writer that stored it (the entry's own, else the manifest's `token`).
fn object_name(dir_name: &str, token: Option<&str>, entry: &FileEntry) -> String {
    if entry.shared {
        format!("{SHARED_DIR}/{}", entry.name)
    } else {
        match entry.objects.as_deref().or(token) {
            Some(t) => format!("{dir_name}/{t}/{}", entry.name),
            None => format!("{dir_name}/{}", entry.name),
        }
    }
}

/// Reads and parses the manifest of the checkpoint at `dir`.
fn read_manifest(parent: &Store, name: &str, dir: &Path) -> Result<Manifest> {
    let meta = dir.join(METADATA);
    match parent.get(&format!("{name}/{METADATA}"))? {
        Some(bytes) => Manifest::parse(&bytes, &meta),
        None => Err(Error::NotComplete {
            path: dir.to_path_buf(),
        }),
    }
}

/// [`CheckpointStorage::load`](super::CheckpointStorage::load) for a URL.
pub(crate) fn load(path: &Path) -> Result<Manifest> {
    let dir = resolve(path);
    let span = tracing::info_span!("checkpoint_load", path = %dir.display());
    let _enter = span.enter();
    let (parent, name) = parent_and_name(&dir)?;
    let manifest = read_manifest(&parent, &name, &dir)?;
    manifest.check(&dir)?;
    let own: HashMap<String, u64> = parent
        .list(&format!("{name}/"))?
        .into_iter()
        .map(|o| (o.name, o.size))
        .collect();
    let shared: HashMap<String, u64> = if manifest.files().any(|f| f.shared) {
        parent
            .list(&format!("{SHARED_DIR}/"))?
            .into_iter()
            .map(|o| (o.name, o.size))
            .collect()
    } else {
        HashMap::new()
    };
    for f in manifest.files() {
        let object = object_name(&name, manifest.objects.as_deref(), f);
        let found = if f.shared { &shared } else { &own };
        let problem = match found.get(&object) {
            Some(&size) if size == f.size => continue,
            Some(&size) => FileProblem::Size {
                expected: f.size,
                actual: size,
            },
            None => FileProblem::Missing,
        };
        return Err(Error::Corrupt {
            checkpoint: dir.clone(),
            file: PathBuf::from(parent.url_of(&object)),
            problem,
        });
    }
    remember_token(&dir, manifest.objects.clone());
    tracing::debug!(checkpoint = %manifest.checkpoint_id, files = manifest.files().count(), "checkpoint verified");
    Ok(manifest)
}

/// Reads the manifest of a complete checkpoint at `dir` without verifying its files.
pub(crate) fn read_manifest_at(dir: &Path) -> Result<Manifest> {
    let dir = resolve(dir);
    let (parent, name) = parent_and_name(&dir)?;
    read_manifest(&parent, &name, &dir)
}

/// [`CheckpointStorage::fetch_file`](super::CheckpointStorage::fetch_file) for a URL:
/// streamed into `target`, its size and checksum checked on the way.
pub(crate) fn fetch_file(checkpoint: &Path, entry: &FileEntry, target: &Path) -> Result<()> {
    let (dir, parent, object) = locate(checkpoint, entry)?;
    let corrupt = |problem| Error::Corrupt {
        checkpoint: dir.clone(),
        file: PathBuf::from(parent.url_of(&object)),
        problem,
    };
    let Some((size, crc)) = parent.download(&object, target)? else {
        let _ = std::fs::remove_file(target);
        return Err(corrupt(FileProblem::Missing));
    };
    let problem = if size != entry.size {
        Some(FileProblem::Size {
            expected: entry.size,
            actual: size,
        })
    } else if crc != entry.crc32 {
        Some(FileProblem::Checksum {
            expected: entry.crc32,
            actual: crc,
        })
    } else {
        None
    };
    match problem {
        Some(p) => {
            let _ = std::fs::remove_file(target);
            Err(corrupt(p))
        }
        None => Ok(()),
    }
}

/// The checkpoint's directory, its parent store and the object name of `entry`.
fn locate(checkpoint: &Path, entry: &FileEntry) -> Result<(PathBuf, Store, String)> {
    let dir = resolve(checkpoint);
    layout::validate_file_name(&entry.name)?;
    let (parent, name) = parent_and_name(&dir)?;
    let known = tokens()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&dir)
        .cloned();
    let token = match known {
        Some(t) => t,
        None => {
            let m = read_manifest(&parent, &name, &dir)?;
            remember_token(&dir, m.objects.clone());
            m.objects
        }
    };
    let object = object_name(&name, token.as_deref(), entry);
    Ok((dir, parent, object))
}

/// [`CheckpointStorage::read_file`](super::CheckpointStorage::read_file) for a URL.
pub(crate) fn read_file(checkpoint: &Path, entry: &FileEntry) -> Result<Vec<u8>> {
    let dir = resolve(checkpoint);
    layout::validate_file_name(&entry.name)?;
    let (parent, name) = parent_and_name(&dir)?;
    let known = tokens()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&dir)
        .cloned();
    let token = match known {
        Some(t) => t,
        None => {
            let m = read_manifest(&parent, &name, &dir)?;
            remember_token(&dir, m.objects.clone());
            m.objects
        }
    };
    let object = object_name(&name, token.as_deref(), entry);
    let corrupt = |problem| Error::Corrupt {
        checkpoint: dir.clone(),
        file: PathBuf::from(parent.url_of(&object)),
        problem,
    };
    let Some(bytes) = parent.get(&object)? else {
        return Err(corrupt(FileProblem::Missing));
    };
    if bytes.len() as u64 != entry.size {
        return Err(corrupt(FileProblem::Size {
            expected: entry.size,
            actual: bytes.len() as u64,
        }));
    }
    let actual = crc32fast::hash(&bytes);
    if actual != entry.crc32 {
        return Err(corrupt(FileProblem::Checksum {
            expected: entry.crc32,
            actual,
        }));
    }
    Ok(bytes)
}

/// The `chk-` and `sp-` directories of the store, with whether each has its manifest.
pub(crate) fn list(store: &Store, dir: &Path) -> Result<Vec<super::CheckpointInfo>> {
    let mut found = Vec::new();
    for name in store.list_dirs("")? {
        let Some((id, kind)) = layout::parse_dir_name(&name) else {
            continue;
        };
        let complete = store.head(&format!("{name}/{METADATA}"))?.is_some();
        found.push(super::CheckpointInfo {
            id,
            kind,
            path: dir.join(&name),
            complete,
        });
    }
    found.sort_by(|a, b| (a.id, a.kind, &a.path).cmp(&(b.id, b.kind, &b.path)));
    Ok(found)
}

/// Deletes every object of the checkpoint directory `name`, its manifest first, so that an
/// interrupted deletion leaves an incomplete checkpoint rather than a corrupt complete one.
pub(crate) fn delete_dir(store: &Store, name: &str) -> Result<usize> {
    store.delete(&format!("{name}/{METADATA}"))?;
    let objects = store.list(&format!("{name}/"))?;
    for o in &objects {
        store.delete(&o.name)?;
    }
    Ok(objects.len())
}

/// The names of the objects in `shared/`, without the prefix.
pub(crate) fn shared_names(store: &Store) -> Result<Vec<String>> {
    Ok(store
        .list(&format!("{SHARED_DIR}/"))?
        .into_iter()
        .filter_map(|o| {
            o.name
                .strip_prefix(&format!("{SHARED_DIR}/"))
                .map(str::to_string)
        })
        .collect())
}

/// Writes the stop record.
pub(crate) fn write_stop(store: &Store, bytes: Vec<u8>) -> Result<()> {
    Ok(store.put(STOP_RECORD, bytes)?)
}

/// Reads the stop record.
pub(crate) fn read_stop(store: &Store) -> Result<Option<Vec<u8>>> {
    Ok(store.get(STOP_RECORD)?)
}

/// A checkpoint being written to object storage: where its objects go.
#[derive(Debug)]
pub(crate) struct RemoteDir {
    /// The checkpoint's parent (the storage).
    pub(crate) parent: Store,
    /// The checkpoint directory's name (`chk-…`, `sp-…`).
    pub(crate) name: String,
    /// The token its own files are stored under.
    pub(crate) token: String,
    /// Shared files known to exist, by name, with their size (listed once).
    pub(crate) shared: Mutex<Option<HashMap<String, u64>>>,
    /// True once an object of this writer exists under `<name>/<token>/`, which makes the
    /// checkpoint visible (as incomplete) to retention in every process.
    visible: AtomicBool,
}

/// The object a writer puts under its token before it writes or reuses a shared file, when
/// it has written none of its own yet (see [`RemoteDir::ensure_visible`]).
pub(crate) const IN_FLIGHT_MARKER: &str = "_in_flight";

impl RemoteDir {
    pub(crate) fn new(parent: Store, name: String) -> RemoteDir {
        RemoteDir {
            parent,
            name,
            token: new_token(),
            shared: Mutex::new(None),
            visible: AtomicBool::new(false),
        }
    }

    /// Makes this writer's checkpoint visible before it touches `shared/`: retention (in
    /// any process) leaves `shared/` alone while an incomplete checkpoint newer than every
    /// complete one exists, and sees a checkpoint on object storage only through its
    /// objects. Writes a small marker unless one of the writer's own files is stored.
    pub(crate) fn ensure_visible(&self) -> Result<()> {
        if self.visible.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.parent.put(&self.own(IN_FLIGHT_MARKER), Vec::new())?;
        self.visible.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Copies a file another writer stored for checkpoint directory `from_dir` (its own
    /// file, or a shared one) into this writer's own objects, on the server.
    pub(crate) fn copy_own(&self, from_dir: &str, stored: &FileEntry) -> Result<()> {
        let source = object_name(from_dir, None, stored);
        self.parent.copy(&source, &self.own(&stored.name))?;
        self.visible.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn own(&self, file: &str) -> String {
        format!("{}/{}/{file}", self.name, self.token)
    }

    /// Writes one of the checkpoint's own files.
    pub(crate) fn write_own(&self, file: &str, bytes: &[u8]) -> Result<()> {
        self.parent.put(&self.own(file), bytes.to_vec())?;
        self.visible.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Uploads a local file as one of the checkpoint's own files; returns its size and CRC.
    pub(crate) fn upload_own(&self, file: &str, source: &Path) -> Result<(u64, u32)> {
        let stored = self.parent.put_file(&self.own(file), source)?;
        self.visible.store(true, Ordering::SeqCst);
        Ok(stored)
    }

    /// The size of shared file `file` if it exists.
    pub(crate) fn shared_size(&self, file: &str) -> Result<Option<u64>> {
        let mut known = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        if known.is_none() {
            *known = Some(
                self.parent
                    .list(&format!("{SHARED_DIR}/"))?
                    .into_iter()
                    .map(|o| (o.name, o.size))
                    .collect(),
            );
        }
        let key = format!("{SHARED_DIR}/{file}");
        if let Some(size) = known.as_ref().and_then(|k| k.get(&key)) {
            return Ok(Some(*size));
        }
        drop(known);
        // Written since the listing (by another writer), or not there.
        Ok(self.parent.head(&key)?.map(|o| o.size))
    }

    /// Writes a shared file.
    pub(crate) fn write_shared(&self, file: &str, bytes: &[u8]) -> Result<()> {
        self.parent
            .put(&format!("{SHARED_DIR}/{file}"), bytes.to_vec())?;
        self.note_shared(file, bytes.len() as u64);
        Ok(())
    }

    /// Uploads a local file as a shared file; returns its size and CRC.
    pub(crate) fn upload_shared(&self, file: &str, source: &Path) -> Result<(u64, u32)> {
        let (size, crc) = self
            .parent
            .put_file(&format!("{SHARED_DIR}/{file}"), source)?;
        self.note_shared(file, size);
        Ok((size, crc))
    }

    fn note_shared(&self, file: &str, size: u64) {
        if let Some(k) = self
            .shared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            k.insert(format!("{SHARED_DIR}/{file}"), size);
        }
    }

    /// Checks that every file `manifest` lists exists with its size: this writer's own,
    /// those other writers stored under their tokens (workers of a cluster), shared ones.
    pub(crate) fn check_files(&self, manifest: &Manifest, dir: &Path) -> Result<()> {
        let own: HashMap<String, u64> = self
            .parent
            .list(&format!("{}/", self.name))?
            .into_iter()
            .map(|o| (o.name, o.size))
            .collect();
        for f in manifest.files() {
            let object = object_name(&self.name, Some(&self.token), f);
            let size = if f.shared {
                self.shared_size(&f.name)?
            } else {
                own.get(&object).copied()
            };
            let problem = match size {
                Some(s) if s == f.size => continue,
                Some(s) => FileProblem::Size {
                    expected: f.size,
                    actual: s,
                },
                None => FileProblem::Missing,
            };
            return Err(Error::Corrupt {
                checkpoint: dir.to_path_buf(),
                file: PathBuf::from(self.parent.url_of(&object)),
                problem,
            });
        }
        Ok(())
    }

    /// Writes the manifest: the checkpoint is complete once this returns.
    pub(crate) fn write_manifest(&self, json: Vec<u8>) -> Result<()> {
        Ok(self
            .parent
            .put(&format!("{}/{METADATA}", self.name), json)?)
    }
}
