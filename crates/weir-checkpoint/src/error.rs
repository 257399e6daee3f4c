//! The crate's one error type, [`Error`], and [`FileProblem`] for corrupt files.
//!
//! Every message names the path involved and, where there is one, what the user can do.
//! Owns no logic besides formatting.

use std::fmt;
use std::path::PathBuf;

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What is wrong with a file a manifest references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileProblem {
    /// The file does not exist.
    Missing,
    /// The file's size differs from the manifest's.
    Size {
        /// The size recorded in the manifest.
        expected: u64,
        /// The size found on disk.
        actual: u64,
    },
    /// The file's CRC-32 differs from the manifest's.
    Checksum {
        /// The checksum recorded in the manifest.
        expected: u32,
        /// The checksum of the bytes on disk.
        actual: u32,
    },
    /// The manifest (`_metadata`) lacks its own checksum line, or the line is unreadable,
    /// although its format requires one.
    ManifestChecksumMissing,
}

impl fmt::Display for FileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileProblem::Missing => f.write_str("the file is missing"),
            FileProblem::Size { expected, actual } => write!(
                f,
                "the file has {actual} bytes but the manifest records {expected}"
            ),
            FileProblem::Checksum { expected, actual } => write!(
                f,
                "the file's crc32 is {actual:#010x} but the manifest records {expected:#010x}"
            ),
            FileProblem::ManifestChecksumMissing => f.write_str(
                "the manifest's own checksum (its first member, \"metadata_crc32\") is missing \
                 or unreadable",
            ),
        }
    }
}

/// Everything that can go wrong in the coordinator's configuration or in checkpoint storage.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A [`CoordinatorConfig`](crate::CoordinatorConfig), the coordinator's participants or a
    /// retention count is invalid; the message says what to change.
    #[error("invalid checkpoint configuration: {0}")]
    InvalidConfig(String),

    /// Object storage failed (after its retries): the message names the operation and the
    /// object's URL.
    #[error("{0}")]
    ObjectStore(#[from] weir_objstore::Error),

    /// A file system operation failed.
    #[error("could not {action} {}: {source}", path.display())]
    Io {
        /// What was attempted, e.g. "create directory".
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The path has no `_metadata` file: the checkpoint is incomplete or this is not a
    /// checkpoint directory.
    #[error(
        "{} is not a complete checkpoint: it has no _metadata file (the checkpoint was aborted \
         or the job crashed while writing it, or this is the wrong directory); pass a chk-… or \
         sp-… directory, or its _metadata file",
        path.display()
    )]
    NotComplete {
        /// The directory (or file) given.
        path: PathBuf,
    },

    /// `_metadata` is not valid JSON or not a weir manifest.
    #[error("cannot parse checkpoint manifest {}: {source}; the file is damaged or not a weir manifest", path.display())]
    ManifestParse {
        /// The `_metadata` file.
        path: PathBuf,
        /// The JSON error, with line and column.
        #[source]
        source: serde_json::Error,
    },

    /// The manifest could not be serialized.
    #[error("cannot serialize the manifest for {}: {source}", path.display())]
    ManifestEncode {
        /// The checkpoint directory being finished.
        path: PathBuf,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },

    /// The manifest was written by a newer weir with a format this build cannot read.
    #[error(
        "checkpoint manifest {} has format_version {found}, but this build of weir reads \
         versions up to {supported}; restore it with a newer weir",
        path.display()
    )]
    UnsupportedFormat {
        /// The `_metadata` file.
        path: PathBuf,
        /// The version in the file.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },

    /// The manifest parses but is inconsistent (wrong id for its directory, a savepoint that
    /// references `shared/`, a file name that escapes the directory, …).
    #[error("invalid checkpoint manifest {}: {problem}", path.display())]
    InvalidManifest {
        /// The `_metadata` file or the checkpoint directory.
        path: PathBuf,
        /// What is inconsistent.
        problem: String,
    },

    /// A file referenced by a manifest is missing or damaged; the checkpoint cannot be used.
    #[error("checkpoint {} is corrupt: {}: {problem}", checkpoint.display(), file.display())]
    Corrupt {
        /// The checkpoint directory.
        checkpoint: PathBuf,
        /// The exact file that failed verification.
        file: PathBuf,
        /// What was wrong with it.
        problem: FileProblem,
    },

    /// The checkpoint's files verify, but restoring its state from them failed in a way
    /// that restoring it again would repeat (RocksDB finds them corrupt, or a file the
    /// state needs is not among them).
    #[error("checkpoint {} cannot be restored: {problem}", checkpoint.display())]
    DoesNotRestore {
        /// The checkpoint directory.
        checkpoint: PathBuf,
        /// How the restore failed.
        problem: String,
    },

    /// A state file or savepoint name is not usable as a plain file name.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A file of that name already exists in `shared/` with different contents.
    #[error(
        "shared file {} already exists with {existing_size} bytes and crc32 {existing_crc:#010x}, \
         but the new contents have {new_size} bytes and crc32 {new_crc:#010x}; shared file names \
         must identify their contents (e.g. include a unique id)",
        path.display()
    )]
    SharedConflict {
        /// The file in `shared/`.
        path: PathBuf,
        /// Size of the existing file.
        existing_size: u64,
        /// CRC-32 of the existing file.
        existing_crc: u32,
        /// Size of the rejected contents.
        new_size: u64,
        /// CRC-32 of the rejected contents.
        new_crc: u32,
    },

    /// A complete checkpoint or a savepoint already exists at the target directory.
    #[error(
        "{} already exists; refusing to overwrite it (for checkpoints, start numbering at \
         CheckpointStorage::next_id(); for savepoints, choose another name or delete it)",
        path.display()
    )]
    AlreadyExists {
        /// The existing directory.
        path: PathBuf,
    },

    /// Two files of one checkpoint were given the same name.
    #[error(
        "file {name:?} was already written to {}; give each task's files distinct names (e.g. \
         prefix them with the operator uid and subtask)",
        checkpoint.display()
    )]
    DuplicateFile {
        /// The checkpoint directory.
        checkpoint: PathBuf,
        /// The repeated name.
        name: String,
    },

    /// Another live run owns the directory (a checkpoint directory or a sink's output
    /// directory); the message names it (job, pid, host, since when) and what to do.
    #[error("{message}")]
    Owned {
        /// The directory.
        dir: PathBuf,
        /// The whole explanation.
        message: String,
    },

    /// This run owned the directory but another run has taken it over (this process was
    /// frozen for longer than its lease): it must stop without writing or committing.
    #[error("{message}")]
    OwnershipLost {
        /// The directory.
        dir: PathBuf,
        /// The whole explanation.
        message: String,
    },

    /// A file was written after the checkpoint was finished.
    #[error("checkpoint {} is already finished; no more files can be written to it", path.display())]
    WriterFinished {
        /// The checkpoint directory.
        path: PathBuf,
    },
}

impl Error {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// True when the error says that a checkpoint on disk is unusable (incomplete, corrupt,
    /// unparsable or inconsistent), as opposed to an operating-system or usage error.
    ///
    /// ```
    /// use weir_checkpoint::{Error, FileProblem};
    /// let e = Error::Corrupt {
    ///     checkpoint: "chk-1".into(),
    ///     file: "chk-1/a".into(),
    ///     problem: FileProblem::Missing,
    /// };
    /// assert!(e.is_unusable_checkpoint());
    /// assert!(e.to_string().contains("chk-1/a: the file is missing"));
    /// ```
    pub fn is_unusable_checkpoint(&self) -> bool {
        matches!(
            self,
            Error::NotComplete { .. }
                | Error::ManifestParse { .. }
                | Error::UnsupportedFormat { .. }
                | Error::InvalidManifest { .. }
                | Error::Corrupt { .. }
                | Error::DoesNotRestore { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_path_and_the_problem() {
        let e = Error::Corrupt {
            checkpoint: "/cp/chk-00000000000000000003".into(),
            file: "/cp/chk-00000000000000000003/op-0.bin".into(),
            problem: FileProblem::Size {
                expected: 10,
                actual: 9,
            },
        };
        let msg = e.to_string();
        assert!(
            msg.contains("/cp/chk-00000000000000000003 is corrupt"),
            "{msg}"
        );
        assert!(msg.contains("op-0.bin: the file has 9 bytes but the manifest records 10"));

        let e = Error::io(
            "create directory",
            "/nope/x",
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        assert!(
            e.to_string()
                .starts_with("could not create directory /nope/x: ")
        );
        assert!(!e.is_unusable_checkpoint());
    }

    #[test]
    fn checksum_problem_is_hex() {
        let p = FileProblem::Checksum {
            expected: 0xdead_beef,
            actual: 1,
        };
        assert_eq!(
            p.to_string(),
            "the file's crc32 is 0x00000001 but the manifest records 0xdeadbeef"
        );
    }
}
