//! What a checkpoint is for: [`CheckpointKind`].
//!
//! Shared by the coordinator (which triggers each kind) and the storage (which decides the
//! directory from it). Owns nothing else.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The three reasons a snapshot is taken.
///
/// Serialized in manifests as `"checkpoint"`, `"savepoint"` or `"final"`.
///
/// ```
/// use weir_checkpoint::CheckpointKind;
/// assert!(CheckpointKind::Savepoint.is_savepoint());
/// assert!(!CheckpointKind::Final.is_savepoint());
/// assert_eq!(CheckpointKind::Final.to_string(), "final");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointKind {
    /// A periodic (or explicitly requested) checkpoint, owned by weir: retained and deleted
    /// by retention, stored in a `chk-` directory.
    Checkpoint,
    /// A savepoint, owned by the user: self-contained, never deleted automatically, stored in
    /// an `sp-` directory.
    Savepoint,
    /// The checkpoint taken at the end of bounded input so that sinks commit everything they
    /// wrote. Stored like a [`CheckpointKind::Checkpoint`] (in a `chk-` directory).
    Final,
}

impl CheckpointKind {
    /// True for [`CheckpointKind::Savepoint`]: the snapshot goes to an `sp-` directory and
    /// must not reference `shared/`.
    pub fn is_savepoint(self) -> bool {
        self == CheckpointKind::Savepoint
    }

    /// The lowercase name used in manifests and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointKind::Checkpoint => "checkpoint",
            CheckpointKind::Savepoint => "savepoint",
            CheckpointKind::Final => "final",
        }
    }
}

impl fmt::Display for CheckpointKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_names_match_display() {
        for kind in [
            CheckpointKind::Checkpoint,
            CheckpointKind::Savepoint,
            CheckpointKind::Final,
        ] {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{kind}\""));
            let back: CheckpointKind = serde_json::from_str(&json).unwrap();
            assert_eq!(back, kind);
        }
    }

    #[test]
    fn only_savepoints_are_savepoints() {
        assert!(CheckpointKind::Savepoint.is_savepoint());
        assert!(!CheckpointKind::Checkpoint.is_savepoint());
        assert!(!CheckpointKind::Final.is_savepoint());
    }
}
