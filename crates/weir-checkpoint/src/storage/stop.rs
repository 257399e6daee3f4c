//! The stop record: which savepoint a job last stopped with.
//!
//! A stop-with-savepoint commits the sinks' output up to the savepoint, so a restore from
//! any older point of the same directory would write that output again. The savepoint
//! itself is a recovery point while it stays in the directory
//! ([`Manifest::stops_job`](super::Manifest::stops_job)); this record (`_stopped_with_savepoint`,
//! JSON) remembers it after it was moved or deleted, so the restore can refuse and name it
//! instead of falling back. Owns that file and nothing else.

use super::CheckpointStorage;
use super::layout::{sync_dir, write_synced};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use weir_core::ids::CheckpointId;

/// The file name of the stop record in a checkpoint directory.
pub const STOP_RECORD: &str = "_stopped_with_savepoint";

/// The savepoint a job last stopped with ([`CheckpointStorage::stop_record`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopRecord {
    /// The savepoint's checkpoint id.
    pub checkpoint_id: CheckpointId,
    /// Where it was written.
    pub path: PathBuf,
}

impl CheckpointStorage {
    /// Records that the job stopped with savepoint `id` at `path` (written atomically:
    /// a temporary file, fsync, rename, fsync of the directory).
    pub fn record_stop(&self, id: CheckpointId, path: &Path) -> Result<()> {
        let record = StopRecord {
            checkpoint_id: id,
            path: path.to_path_buf(),
        };
        let bytes = serde_json::to_vec_pretty(&record).expect("a stop record serializes");
        if let Some(store) = self.remote() {
            return super::remote::write_stop(store, bytes);
        }
        let target = self.dir().join(STOP_RECORD);
        let tmp = self.dir().join(format!("{STOP_RECORD}.tmp"));
        write_synced(&tmp, &bytes)?;
        std::fs::rename(&tmp, &target).map_err(|e| Error::io("rename into place", &tmp, e))?;
        sync_dir(self.dir())
    }

    /// The savepoint the job last stopped with, if it ever stopped with one here.
    pub fn stop_record(&self) -> Result<Option<StopRecord>> {
        let path = self.dir().join(STOP_RECORD);
        if let Some(store) = self.remote() {
            return match super::remote::read_stop(store)? {
                Some(bytes) => serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|source| Error::ManifestParse { path, source }),
                None => Ok(None),
            };
        }
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("read", &path, e)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| Error::ManifestParse { path, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stop_record_round_trips_and_is_absent_until_written() {
        let tmp = tempfile::tempdir().unwrap();
        let s = CheckpointStorage::open(tmp.path().join("cp")).unwrap();
        assert_eq!(s.stop_record().unwrap(), None);
        let sp = s.dir().join("sp-7-1700000000000");
        s.record_stop(CheckpointId(7), &sp).unwrap();
        s.record_stop(CheckpointId(9), &sp).unwrap();
        let r = s.stop_record().unwrap().unwrap();
        assert_eq!((r.checkpoint_id, r.path), (CheckpointId(9), sp));
        assert!(!s.dir().join(format!("{STOP_RECORD}.tmp")).exists());
        // A record is not a checkpoint: listing ignores it.
        assert!(s.list().unwrap().is_empty());
    }
}
