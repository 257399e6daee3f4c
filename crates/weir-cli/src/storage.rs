//! Opening checkpoint storage from the CLI without side effects.
//!
//! `CheckpointStorage::open` creates the directory and its `shared/` subdirectory, which a
//! job wants but a read-only tool must not do: `weir checkpoints list ~` by mistake must not
//! leave `~/shared` behind. This module owns the workarounds; it never touches checkpoints.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use weir_checkpoint::CheckpointStorage;

/// The storage's directory of shared files (weir-checkpoint's layout).
const SHARED_DIR: &str = "shared";

/// A storage opened on an existing directory; dropping it removes the `shared/` directory
/// that opening created, if it is still empty.
pub struct Opened {
    /// The storage.
    pub storage: CheckpointStorage,
    created_shared: Option<PathBuf>,
}

impl Drop for Opened {
    fn drop(&mut self) {
        if let Some(shared) = &self.created_shared {
            // Fails (and keeps it) if a job has written into it meanwhile.
            let _ = std::fs::remove_dir(shared);
        }
    }
}

/// Opens the storage at `dir`, which must be an existing directory (the error names it).
pub fn open_existing(dir: &Path) -> Result<Opened> {
    if dir.to_str().is_some_and(weir_objstore::is_url) {
        // Object storage: nothing is created by opening; an empty prefix lists nothing.
        let storage = CheckpointStorage::open(dir)
            .with_context(|| format!("cannot open checkpoint storage {}", dir.display()))?;
        return Ok(Opened {
            storage,
            created_shared: None,
        });
    }
    require_dir(dir)?;
    let shared = dir.join(SHARED_DIR);
    let created_shared = (!shared.exists()).then_some(shared);
    let storage = CheckpointStorage::open(dir)
        .with_context(|| format!("cannot open checkpoint directory {}", dir.display()))?;
    Ok(Opened {
        storage,
        created_shared,
    })
}

/// Fails with a message naming `dir` unless it is an existing directory.
fn require_dir(dir: &Path) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bail!("{} is not a directory", dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("checkpoint directory {} does not exist", dir.display())
        }
        Err(e) => {
            Err(e).with_context(|| format!("cannot open checkpoint directory {}", dir.display()))
        }
    }
}

/// A storage in a temporary directory, for `CheckpointStorage::load`, which reads only the
/// path it is given (and the `shared/` next to it) but is a method of an opened storage.
/// Keep the returned `TempDir` alive while using the storage.
pub fn scratch() -> Result<(tempfile::TempDir, CheckpointStorage)> {
    let tmp = tempfile::tempdir().context("cannot create a temporary directory")?;
    let storage = CheckpointStorage::open(tmp.path())
        .context("cannot open a temporary checkpoint storage")?;
    Ok((tmp, storage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_leaves_nothing_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let opened = open_existing(tmp.path()).unwrap();
        assert!(tmp.path().join(SHARED_DIR).is_dir());
        assert!(opened.storage.list().unwrap().is_empty());
        drop(opened);
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn an_existing_shared_dir_is_kept() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join(SHARED_DIR)).unwrap();
        drop(open_existing(tmp.path()).unwrap());
        assert!(tmp.path().join(SHARED_DIR).is_dir());
    }

    #[test]
    fn missing_or_non_directories_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("nope");
        let e = open_existing(&missing).err().unwrap();
        assert_eq!(
            e.to_string(),
            format!("checkpoint directory {} does not exist", missing.display())
        );
        assert!(!missing.exists());
        let file = tmp.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let e = open_existing(&file).err().unwrap();
        assert_eq!(
            e.to_string(),
            format!("{} is not a directory", file.display())
        );
    }
}
