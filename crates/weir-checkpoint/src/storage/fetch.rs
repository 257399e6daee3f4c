//! Bringing a checkpoint's files back to local disk for a restore, one file at a time and
//! never whole in memory: hard-linked out of a local storage directory when the target is
//! on the same file system (files in storage are never changed in place), else copied or
//! downloaded as a stream, with size and checksum checked on the way. Also tells the
//! storage which shared files a restored checkpoint holds, so that the next checkpoint
//! reuses them by name instead of storing them again.
//!
//! Does not choose what to restore ([`super::CheckpointStorage::latest_complete`]) nor
//! what a backend does with the files.

use super::layout;
use super::manifest::{FileEntry, Manifest};
use super::{CheckpointStorage, remote};
use crate::error::{Error, FileProblem, Result};
use std::io::{Read, Write};
use std::path::Path;

impl CheckpointStorage {
    /// Puts file `entry` of the checkpoint at `checkpoint` (any form
    /// [`load`](Self::load) accepts) at `target`, which must not exist.
    ///
    /// In a local directory the file is hard-linked when `target` is on the same file
    /// system (after its size is checked: [`load`](Self::load) verified its checksum
    /// already), else copied through a 1 MiB buffer and verified; on object storage it is
    /// downloaded as a stream and verified. A missing or corrupt file is an
    /// [`Error::Corrupt`] that names it.
    ///
    /// ```
    /// use weir_checkpoint::{CheckpointKind, CheckpointStorage, Manifest};
    /// let tmp = tempfile::tempdir()?;
    /// let storage = CheckpointStorage::open(tmp.path().join("checkpoints"))?;
    /// let id = storage.next_id()?;
    /// let writer = storage.begin(id, CheckpointKind::Checkpoint)?;
    /// let entry = writer.write_shared("000012.sst", b"immutable contents")?;
    /// let path = writer.finish(Manifest::new("job", id, CheckpointKind::Checkpoint, 128))?;
    /// let target = tmp.path().join("000012.sst");
    /// storage.fetch_file(&path, &entry, &target)?;
    /// assert_eq!(std::fs::read(&target)?, b"immutable contents");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fetch_file(
        &self,
        checkpoint: impl AsRef<Path>,
        entry: &FileEntry,
        target: &Path,
    ) -> Result<()> {
        if remote::is_remote(checkpoint.as_ref()) {
            return remote::fetch_file(checkpoint.as_ref(), entry, target);
        }
        let dir = layout::resolve(checkpoint.as_ref())?;
        let source = file_in(&dir, entry)?;
        let corrupt = |problem| Error::Corrupt {
            checkpoint: dir.clone(),
            file: source.clone(),
            problem,
        };
        let size = match std::fs::metadata(&source) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(corrupt(FileProblem::Missing));
            }
            Err(e) => return Err(Error::io("read", source, e)),
        };
        if size != entry.size {
            return Err(corrupt(FileProblem::Size {
                expected: entry.size,
                actual: size,
            }));
        }
        if std::fs::hard_link(&source, target).is_ok() {
            return Ok(());
        }
        let copied = copy_with_crc(&source, target, false);
        let (size, crc) = match copied {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_file(target);
                return Err(e);
            }
        };
        let problem = if size != entry.size {
            FileProblem::Size {
                expected: entry.size,
                actual: size,
            }
        } else if crc != entry.crc32 {
            FileProblem::Checksum {
                expected: entry.crc32,
                actual: crc,
            }
        } else {
            return Ok(());
        };
        let _ = std::fs::remove_file(target);
        Err(corrupt(problem))
    }

    /// Where file `entry` of the checkpoint at `checkpoint` (any form
    /// [`load`](Self::load) accepts) lies when the checkpoint is in a directory: in the
    /// checkpoint's own directory, or in `shared/` beside it. `None` on object storage.
    ///
    /// ```
    /// use weir_checkpoint::{CheckpointKind, CheckpointStorage, Manifest};
    /// let tmp = tempfile::tempdir()?;
    /// let storage = CheckpointStorage::open(tmp.path().join("checkpoints"))?;
    /// let id = storage.next_id()?;
    /// let writer = storage.begin(id, CheckpointKind::Checkpoint)?;
    /// let entry = writer.write_shared("000012.sst", b"immutable contents")?;
    /// let path = writer.finish(Manifest::new("job", id, CheckpointKind::Checkpoint, 128))?;
    /// let file = storage.file_path(&path, &entry)?.expect("a directory");
    /// assert_eq!(file, tmp.path().join("checkpoints").join("shared").join("000012.sst"));
    /// assert_eq!(std::fs::read(&file)?, b"immutable contents");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn file_path(
        &self,
        checkpoint: impl AsRef<Path>,
        entry: &FileEntry,
    ) -> Result<Option<std::path::PathBuf>> {
        if remote::is_remote(checkpoint.as_ref()) {
            return Ok(None);
        }
        let dir = layout::resolve(checkpoint.as_ref())?;
        file_in(&dir, entry).map(Some)
    }

    /// Records that the shared files of `manifest` (a checkpoint this process restores
    /// from) are stored, so that [`CheckpointWriter::reuse_shared`](super::CheckpointWriter::reuse_shared)
    /// hands them out by name: the first checkpoint after a restore stores only the files
    /// that changed since. Reuse still checks that each file is there with its size.
    pub fn remember_restored(&self, manifest: &Manifest) {
        if manifest.kind.is_savepoint() {
            // A savepoint's files are its own, not in `shared/`.
            return;
        }
        for f in manifest.files().filter(|f| f.shared) {
            self.registry.remember_stored(f);
        }
    }
}

/// Where `entry` of the checkpoint in directory `dir` is.
fn file_in(dir: &Path, entry: &FileEntry) -> Result<std::path::PathBuf> {
    layout::validate_file_name(&entry.name)?;
    Ok(if entry.shared {
        layout::shared_dir_of(dir).join(&entry.name)
    } else {
        dir.join(&entry.name)
    })
}

/// Copies `source` to `target` (created or truncated) through a 1 MiB buffer, fsynced when
/// `sync`; its size and CRC-32. Never holds the file in memory.
pub(crate) fn copy_with_crc(source: &Path, target: &Path, sync: bool) -> Result<(u64, u32)> {
    let mut from = std::fs::File::open(source).map_err(|e| Error::io("read", source, e))?;
    let mut to = std::fs::File::create(target).map_err(|e| Error::io("create", target, e))?;
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io("read", source, e)),
        };
        crc.update(&buf[..n]);
        size += n as u64;
        to.write_all(&buf[..n])
            .map_err(|e| Error::io("write", target, e))?;
    }
    if sync {
        to.sync_all().map_err(|e| Error::io("fsync", target, e))?;
    }
    Ok((size, crc.finalize()))
}
