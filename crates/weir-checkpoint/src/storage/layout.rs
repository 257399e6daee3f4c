//! Names and low-level file operations of the storage layout: directory names, file-name
//! rules, path resolution, checksums, fsync.
//!
//! Knows nothing of manifests or retention; everything here is a small pure helper or a
//! single file-system call with the path attached to its error.

use crate::error::{Error, FileProblem, Result};
use crate::kind::CheckpointKind;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use weir_core::ids::CheckpointId;

/// The manifest's file name inside a checkpoint directory.
pub(crate) const METADATA: &str = "_metadata";
/// The manifest's temporary name while it is written.
pub(crate) const METADATA_TMP: &str = "_metadata.tmp";
/// The directory of files shared by several checkpoints.
pub(crate) const SHARED_DIR: &str = "shared";
/// Prefix of temporary files in `shared/`: `.tmp-<writer token>-<seq>-<name>`.
const TMP_PREFIX: &str = ".tmp-";

pub(crate) fn checkpoint_dir_name(id: CheckpointId) -> String {
    format!("chk-{:020}", id.0)
}

pub(crate) fn savepoint_dir_name(id: CheckpointId, name: &str) -> String {
    format!("sp-{}-{}", id.0, name)
}

/// `chk-<digits>` → (id, Checkpoint); `sp-<digits>-<name>` → (id, Savepoint).
pub(crate) fn parse_dir_name(name: &str) -> Option<(CheckpointId, CheckpointKind)> {
    fn id(digits: &str) -> Option<CheckpointId> {
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok().map(CheckpointId)
    }
    if let Some(rest) = name.strip_prefix("chk-") {
        return Some((id(rest)?, CheckpointKind::Checkpoint));
    }
    let rest = name.strip_prefix("sp-")?;
    let (digits, label) = rest.split_once('-')?;
    if label.is_empty() {
        return None;
    }
    Some((id(digits)?, CheckpointKind::Savepoint))
}

/// A state file name: one plain path component, not starting with `.` or `_` (reserved for
/// weir's own files such as `_metadata` and temporary files).
pub(crate) fn validate_file_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "a file name must not be empty"
    } else if name.len() > 200 {
        "a file name must be at most 200 bytes"
    } else if name.contains(['/', '\\', '\0']) {
        "a file name must be a single path component (no '/', '\\' or NUL)"
    } else if name.starts_with('.') || name.starts_with('_') {
        "a file name must not start with '.' or '_' (reserved for weir's own files)"
    } else {
        return Ok(());
    };
    Err(Error::InvalidName {
        name: name.to_string(),
        reason,
    })
}

/// A savepoint name: ASCII letters, digits, '.', '_' and '-', not starting with '.'.
pub(crate) fn validate_savepoint_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() || name.len() > 100 {
        "a savepoint name must have 1 to 100 characters"
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        "a savepoint name may contain only ASCII letters, digits, '.', '_' and '-'"
    } else if name.starts_with('.') {
        "a savepoint name must not start with '.'"
    } else {
        return Ok(());
    };
    Err(Error::InvalidName {
        name: name.to_string(),
        reason,
    })
}

/// Accepts a checkpoint directory, a savepoint directory or a `_metadata` file and returns
/// the checkpoint directory, which must contain `_metadata`.
pub(crate) fn resolve(path: &Path) -> Result<PathBuf> {
    let meta = fs::metadata(path).map_err(|e| Error::io("open checkpoint", path, e))?;
    if meta.is_file() {
        if path.file_name().is_some_and(|n| n == METADATA) {
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
            return Ok(parent.unwrap_or(Path::new(".")).to_path_buf());
        }
        return Err(Error::NotComplete {
            path: path.to_path_buf(),
        });
    }
    if path.join(METADATA).is_file() {
        Ok(path.to_path_buf())
    } else {
        Err(Error::NotComplete {
            path: path.to_path_buf(),
        })
    }
}

/// The `shared/` directory that belongs to a checkpoint directory (its sibling).
pub(crate) fn shared_dir_of(checkpoint_dir: &Path) -> PathBuf {
    let parent = checkpoint_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty());
    parent.unwrap_or(Path::new(".")).join(SHARED_DIR)
}

/// Size and CRC-32 of a file, read in 64 KiB blocks.
pub(crate) fn file_crc(path: &Path) -> io::Result<(u64, u32)> {
    let mut file = File::open(path)?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hasher.finalize()))
}

/// Checks that `file` is there with the expected size (without reading it).
pub(crate) fn verify_size(checkpoint: &Path, file: &Path, size: u64) -> Result<()> {
    let corrupt = |problem| Error::Corrupt {
        checkpoint: checkpoint.to_path_buf(),
        file: file.to_path_buf(),
        problem,
    };
    let actual_size = match fs::metadata(file) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(corrupt(FileProblem::Missing)),
        Err(e) => return Err(Error::io("read", file, e)),
    };
    if actual_size != size {
        return Err(corrupt(FileProblem::Size {
            expected: size,
            actual: actual_size,
        }));
    }
    Ok(())
}

/// Checks that `file` has the expected size and checksum.
pub(crate) fn verify(checkpoint: &Path, file: &Path, size: u64, crc32: u32) -> Result<()> {
    let corrupt = |problem| Error::Corrupt {
        checkpoint: checkpoint.to_path_buf(),
        file: file.to_path_buf(),
        problem,
    };
    // Cheap size check first: a truncated file needs no checksum.
    verify_size(checkpoint, file, size)?;
    let (actual_size, actual) = file_crc(file).map_err(|e| Error::io("read", file, e))?;
    if actual_size != size {
        return Err(corrupt(FileProblem::Size {
            expected: size,
            actual: actual_size,
        }));
    }
    if actual != crc32 {
        return Err(corrupt(FileProblem::Checksum {
            expected: crc32,
            actual,
        }));
    }
    Ok(())
}

/// Creates (or truncates) `path`, writes `bytes` and fsyncs the file.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = File::create(path).map_err(|e| Error::io("create", path, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io("write", path, e))
}

/// Fsyncs a directory so that entries created or renamed in it survive a crash.
pub(crate) fn sync_dir(path: &Path) -> Result<()> {
    fsync_dir(path).map_err(|e| Error::io("fsync directory", path, e))
}

fn fsync_dir(path: &Path) -> io::Result<()> {
    #[cfg(test)]
    SYNCED_DIRS.with(|s| s.borrow_mut().push(path.to_path_buf()));
    #[cfg(unix)]
    {
        File::open(path).and_then(|d| d.sync_all())
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(())
    }
}

/// Creates directory `dir`, whose parent exists, and fsyncs the parent so that the new
/// entry survives a crash (a checkpoint whose files and `_metadata` were fsynced is lost
/// all the same if its directory's own entry is not). An `AlreadyExists` error is returned
/// as is; if the fsync fails, the new directory is removed again.
pub(crate) fn create_dir_synced(dir: &Path) -> io::Result<()> {
    fs::create_dir(dir)?;
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    fsync_dir(parent.unwrap_or(Path::new("."))).inspect_err(|_| {
        let _ = fs::remove_dir(dir);
    })
}

/// Like `fs::create_dir_all`, fsyncing the parent of every directory it creates.
pub(crate) fn create_dir_all_synced(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_all_synced(parent)?;
    }
    match create_dir_synced(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        other => other,
    }
}

#[cfg(test)]
thread_local! {
    /// Every directory [`sync_dir`] fsynced on this thread, in order: the seam through which
    /// tests see that a new directory's entry is made durable (a crash cannot be staged in a
    /// unit test, but the call can be observed).
    pub(crate) static SYNCED_DIRS: std::cell::RefCell<Vec<PathBuf>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Takes the directories fsynced on this thread since the last call.
#[cfg(test)]
pub(crate) fn take_synced_dirs() -> Vec<PathBuf> {
    SYNCED_DIRS.with(|s| std::mem::take(&mut *s.borrow_mut()))
}

pub(crate) fn tmp_name(token: u64, seq: u64, name: &str) -> String {
    format!("{TMP_PREFIX}{token}-{seq}-{name}")
}

/// The writer token of a temporary file in `shared/`, if `name` is one.
pub(crate) fn tmp_token(name: &str) -> Option<u64> {
    let rest = name.strip_prefix(TMP_PREFIX)?;
    rest.split('-').next()?.parse().ok()
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_names_round_trip() {
        let chk = checkpoint_dir_name(CheckpointId(42));
        assert_eq!(chk, "chk-00000000000000000042");
        assert_eq!(
            parse_dir_name(&chk),
            Some((CheckpointId(42), CheckpointKind::Checkpoint))
        );
        let max = checkpoint_dir_name(CheckpointId(u64::MAX));
        assert_eq!(max.len(), 24);
        assert_eq!(
            parse_dir_name(&max),
            Some((CheckpointId(u64::MAX), CheckpointKind::Checkpoint))
        );
        let sp = savepoint_dir_name(CheckpointId(7), "before-upgrade");
        assert_eq!(sp, "sp-7-before-upgrade");
        assert_eq!(
            parse_dir_name(&sp),
            Some((CheckpointId(7), CheckpointKind::Savepoint))
        );
        assert_eq!(
            parse_dir_name("sp-7-a-b"),
            Some((CheckpointId(7), CheckpointKind::Savepoint))
        );
    }

    #[test]
    fn other_names_are_not_checkpoints() {
        for n in [
            "shared",
            "chk-",
            "chk-1a",
            "chk--1",
            "sp-7",
            "sp-7-",
            "sp-x-y",
            "x-1",
            ".tmp-1",
            "chk-99999999999999999999999",
        ] {
            assert_eq!(parse_dir_name(n), None, "{n}");
        }
    }

    #[test]
    fn file_names_are_plain_components() {
        for ok in ["a", "op-1-000012.sst", "state.bin", "a b"] {
            validate_file_name(ok).unwrap();
        }
        for bad in [
            "",
            "../x",
            "a/b",
            "a\\b",
            "_metadata",
            ".hidden",
            "..",
            "a\0b",
        ] {
            assert!(
                matches!(validate_file_name(bad), Err(Error::InvalidName { .. })),
                "{bad:?}"
            );
        }
        assert!(validate_file_name(&"x".repeat(201)).is_err());
    }

    #[test]
    fn savepoint_names() {
        validate_savepoint_name("before-upgrade_2.1").unwrap();
        for bad in ["", ".x", "a/b", "a b", "é"] {
            assert!(validate_savepoint_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tmp_names_carry_the_token() {
        let n = tmp_name(17, 3, "000012.sst");
        assert_eq!(n, ".tmp-17-3-000012.sst");
        assert_eq!(tmp_token(&n), Some(17));
        assert_eq!(tmp_token("000012.sst"), None);
        assert!(
            validate_file_name(&n).is_err(),
            "temporary names never clash with state files"
        );
    }

    #[test]
    fn resolve_accepts_dir_and_metadata_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("chk-1");
        fs::create_dir(&dir).unwrap();
        assert!(matches!(resolve(&dir), Err(Error::NotComplete { .. })));
        fs::write(dir.join(METADATA), b"{}").unwrap();
        assert_eq!(resolve(&dir).unwrap(), dir);
        assert_eq!(resolve(&dir.join(METADATA)).unwrap(), dir);
        fs::write(dir.join("other"), b"").unwrap();
        assert!(matches!(
            resolve(&dir.join("other")),
            Err(Error::NotComplete { .. })
        ));
        let missing = tmp.path().join("nope");
        let e = resolve(&missing).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        assert_eq!(shared_dir_of(&dir), tmp.path().join(SHARED_DIR));
        assert_eq!(shared_dir_of(Path::new("chk-1")), Path::new("./shared"));
    }

    #[test]
    fn verify_reports_each_problem() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("f");
        write_synced(&f, b"hello").unwrap();
        let crc = crc32fast::hash(b"hello");
        assert_eq!(file_crc(&f).unwrap(), (5, crc));
        verify(tmp.path(), &f, 5, crc).unwrap();
        let problem = |r: Result<()>| match r {
            Err(Error::Corrupt { problem, .. }) => problem,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            problem(verify(tmp.path(), &f, 6, crc)),
            FileProblem::Size {
                expected: 6,
                actual: 5
            }
        );
        assert_eq!(
            problem(verify(tmp.path(), &f, 5, 1)),
            FileProblem::Checksum {
                expected: 1,
                actual: crc
            }
        );
        assert_eq!(
            problem(verify(tmp.path(), &tmp.path().join("g"), 5, crc)),
            FileProblem::Missing
        );
        sync_dir(tmp.path()).unwrap();
    }
}
