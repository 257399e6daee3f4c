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

    /// Reads control file `name` and removes it; `None` when there is none.
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

fn check_name(name: &str) -> Result<()> {
    if !name.starts_with('_') {
        return Err(Error::InvalidConfig(format!(
            "control file names start with '_' (weir's own names), not {name:?}"
        )));
    }
    validate_file_name(name.trim_start_matches('_'))
}
