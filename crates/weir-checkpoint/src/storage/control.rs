//! Control files at the top of the storage: small requests between an operator's tools and
//! a running job (the savepoint request of `weir savepoint trigger|stop`), in a directory or
//! on object storage alike.

use super::CheckpointStorage;
use super::layout::validate_file_name;
use crate::error::{Error, Result};

impl CheckpointStorage {
    /// Writes control file `name` at the top of the storage, whole: a reader sees all of it
    /// or nothing (a temporary file renamed into place, or one PUT).
    ///
    /// ```
    /// let tmp = tempfile::tempdir()?;
    /// let storage = weir_checkpoint::CheckpointStorage::open(tmp.path())?;
    /// storage.write_control("_savepoint_request", b"stop")?;
    /// assert_eq!(storage.take_control("_savepoint_request")?.as_deref(), Some(&b"stop"[..]));
    /// assert_eq!(storage.take_control("_savepoint_request")?, None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write_control(&self, name: &str, bytes: &[u8]) -> Result<()> {
        check_name(name)?;
        if let Some(store) = self.remote() {
            return Ok(store.put(name, bytes.to_vec())?);
        }
        let target = self.dir().join(name);
        let tmp = self
            .dir()
            .join(format!(".{name}.{}.tmp", std::process::id()));
        let written = std::fs::write(&tmp, bytes)
            .map_err(|e| Error::io("write", &tmp, e))
            .and_then(|()| {
                std::fs::rename(&tmp, &target).map_err(|e| Error::io("rename into place", &tmp, e))
            });
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    /// Reads control file `name` and removes it; `None` when there is none, or when the file
    /// is empty and less than a second old (created by hand and not yet written: it is taken
    /// on a later look, whole).
    pub fn take_control(&self, name: &str) -> Result<Option<Vec<u8>>> {
        check_name(name)?;
        if let Some(store) = self.remote() {
            let got = store.get(name)?;
            if got.is_some() {
                store.delete(name)?;
            }
            return Ok(got);
        }
        let path = self.dir().join(name);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("read", path, e)),
        };
        if bytes.is_empty() && just_created(&path) {
            // Written by hand (`echo stop > DIR/_savepoint_request`): the shell creates the
            // file before it writes, and a reader in between sees it empty. Left for the
            // next look; an empty file that stays empty is taken as it is.
            return Ok(None);
        }
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(Some(bytes)),
            // Taken by someone else meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("delete", path, e)),
        }
    }

    /// Removes control file `name`: true when it was there.
    pub fn remove_control(&self, name: &str) -> Result<bool> {
        check_name(name)?;
        if let Some(store) = self.remote() {
            let there = store.head(name)?.is_some();
            store.delete(name)?;
            return Ok(there);
        }
        let path = self.dir().join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io("delete", path, e)),
        }
    }
}

/// How long an empty control file is taken for one still being written.
const EMPTY_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether `path` was modified less than [`EMPTY_GRACE`] ago.
fn just_created(path: &std::path::Path) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age < EMPTY_GRACE)
}

fn check_name(name: &str) -> Result<()> {
    if !name.starts_with('_') {
        return Err(Error::InvalidConfig(format!(
            "control file names start with '_' (weir's own names), not {name:?}"
        )));
    }
    validate_file_name(name.trim_start_matches('_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tried as an operator would from a shell: `echo stop > DIR/_savepoint_request` creates
    /// the file before it writes. A look in between leaves the empty file; the next look
    /// takes the whole request.
    #[test]
    fn a_request_caught_between_create_and_write_is_taken_whole_later() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::open(tmp.path()).unwrap();
        let path = tmp.path().join("_savepoint_request");
        std::fs::File::create(&path).unwrap();
        assert_eq!(storage.take_control("_savepoint_request").unwrap(), None);
        assert!(path.exists(), "the empty request was removed");
        std::fs::write(&path, "stop\n").unwrap();
        assert_eq!(
            storage
                .take_control("_savepoint_request")
                .unwrap()
                .as_deref(),
            Some(&b"stop\n"[..])
        );
        assert!(!path.exists());
    }

    /// An empty file older than the grace is a request as it is (a plain savepoint).
    #[test]
    fn an_empty_request_that_stays_empty_is_taken() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::open(tmp.path()).unwrap();
        let path = tmp.path().join("_savepoint_request");
        let f = std::fs::File::create(&path).unwrap();
        f.set_modified(std::time::SystemTime::now() - 2 * EMPTY_GRACE)
            .unwrap();
        drop(f);
        assert_eq!(
            storage
                .take_control("_savepoint_request")
                .unwrap()
                .as_deref(),
            Some(&b""[..])
        );
    }
}
