//! The checkpoint manifest (`_metadata`): what a checkpoint contains, as pretty JSON.
//!
//! Owns the format ([`Manifest`] and its parts), encoding and parsing with the manifest's
//! own checksum and a version check, and the consistency rules a manifest must follow.
//! Verifying the referenced files is the storage's job.
//!
//! # The manifest's own checksum
//!
//! Every file a manifest lists carries its CRC-32 in the manifest; since format 2 the
//! manifest carries its own too, as its first member:
//!
//! ```text
//! {
//!   "metadata_crc32": 1234567890,
//!   "format_version": 2,
//!   …
//! ```
//!
//! The number is the CRC-32 of the file without that line, i.e. of the manifest's pretty
//! JSON exactly as serde writes it. The line stays valid JSON, so `jq` and older tools read
//! the file unchanged; readers of this crate verify the checksum before parsing, so a
//! changed byte anywhere (a source position, a file's size) is a corrupt checkpoint rather
//! than a wrong restore. Format 1 manifests (written before the checksum existed) have no
//! such line and are still read: their state files are verified as always, the manifest
//! itself cannot be. A manifest of format 2 or later without the line is corrupt.

use super::layout::{self, parse_dir_name};
use crate::coordinator::CheckpointStats;
use crate::error::{Error, FileProblem, Result};
use crate::kind::CheckpointKind;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::path::Path;
use weir_core::ids::CheckpointId;

/// The newest manifest format this build writes and reads. Format 2 added the manifest's
/// own checksum (the `metadata_crc32` line); format 1 manifests are still read.
pub const FORMAT_VERSION: u32 = 2;

/// The first format whose manifests must carry their own checksum.
const FIRST_CHECKSUMMED_FORMAT: u64 = 2;

/// How the checksum line begins: right after the opening brace, as the first member.
const CHECKSUM_LINE_START: &[u8] = b"{\n  \"metadata_crc32\": ";

/// One state file of a checkpoint, as recorded in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FileEntry {
    /// The file name: in the checkpoint directory, or in `shared/` when `shared` is true.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// CRC-32 (IEEE) of the contents.
    pub crc32: u32,
    /// True when the file lives in `shared/` (incremental checkpoints); never in savepoints.
    #[serde(default)]
    pub shared: bool,
    /// Object storage only: the token of the writer that stored this (own) file, when it
    /// is not the manifest's writer ([`Manifest::objects`]): a worker of a cluster stores
    /// its tasks' files itself, under `chk-<id>/<its token>/<name>`, and the coordinator
    /// writes only the manifest. Absent otherwise (and in manifests written before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<String>,
}

/// Statistics recorded in the manifest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestStats {
    /// From trigger to the last acknowledgement, in milliseconds.
    pub duration_ms: u64,
    /// Bytes this checkpoint wrote to storage: every file it holds, except shared files an
    /// earlier checkpoint already wrote (the incremental size).
    pub bytes: u64,
    /// Bytes of every file the checkpoint references, shared or not (the full size: what a
    /// restore reads).
    #[serde(default)]
    pub full_bytes: u64,
    /// The longest barrier alignment of any task, in milliseconds.
    pub alignment_ms: u64,
    /// Bytes of in-flight records stored with the checkpoint (channel state of an
    /// unaligned checkpoint; counted in `bytes` too).
    #[serde(default)]
    pub channel_state_bytes: u64,
    /// True when a task took the checkpoint unaligned (unaligned mode, or an aligned
    /// checkpoint whose alignment timed out).
    #[serde(default)]
    pub unaligned: bool,
}

impl From<&CheckpointStats> for ManifestStats {
    fn from(s: &CheckpointStats) -> Self {
        ManifestStats {
            duration_ms: s.duration.as_millis() as u64,
            bytes: s.bytes,
            full_bytes: s.bytes,
            alignment_ms: s.max_alignment.as_millis() as u64,
            channel_state_bytes: 0,
            unaligned: false,
        }
    }
}

/// The snapshot of one subtask of an operator.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SubtaskManifest {
    /// The subtask index.
    pub subtask: usize,
    /// Its state files.
    #[serde(default)]
    pub files: Vec<FileEntry>,
    /// Small, human-readable operator state (e.g. a source's positions), stored inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_state: Option<serde_json::Value>,
    /// The event time the subtask had reached (its inputs' watermark, or a source's own);
    /// a resumed job starts from the minimum over the subtasks. Absent in checkpoints taken
    /// before weir stored watermarks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<i64>,
}

/// The snapshot of one operator.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OperatorManifest {
    /// The operator's stable id (`.uid(..)` or derived from the DSL position).
    pub uid: String,
    /// The operator's display name.
    pub name: String,
    /// The parallelism it ran with.
    pub parallelism: usize,
    /// One entry per subtask that has state.
    #[serde(default)]
    pub subtasks: Vec<SubtaskManifest>,
}

/// The manifest of a checkpoint or savepoint, stored as `_metadata`.
///
/// The file is this struct as pretty JSON with one more member first, `metadata_crc32`: the
/// CRC-32 of the file without that line. Loading a checkpoint verifies it before parsing,
/// so a changed byte anywhere in `_metadata` makes the checkpoint corrupt
/// ([`Error::Corrupt`] naming `_metadata`). Manifests of format 1, written before the
/// checksum existed, have no such line and are still read.
///
/// ```
/// use weir_checkpoint::{CheckpointId, CheckpointKind, Manifest};
/// let m = Manifest::new("balances", CheckpointId(3), CheckpointKind::Checkpoint, 128);
/// let json = serde_json::to_string_pretty(&m).unwrap();
/// assert!(json.contains("\"kind\": \"checkpoint\""));
/// assert_eq!(serde_json::from_str::<Manifest>(&json).unwrap(), m);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The format of this manifest ([`FORMAT_VERSION`] when written by this build).
    pub format_version: u32,
    /// The job's name.
    pub job: String,
    /// The checkpoint's id.
    pub checkpoint_id: CheckpointId,
    /// Checkpoint, savepoint or final checkpoint.
    pub kind: CheckpointKind,
    /// When the manifest was created, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The number of key groups (fixed for the job's lifetime).
    pub max_parallelism: usize,
    /// Statistics.
    pub stats: ManifestStats,
    /// Every operator's snapshot.
    #[serde(default)]
    pub operators: Vec<OperatorManifest>,
    /// True for a savepoint that stopped the job (stop-with-savepoint): its sinks committed
    /// their output up to it, so it is a recovery point of the directory it was written to,
    /// like a checkpoint. Intermediate savepoints commit nothing and are restored only by
    /// path.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stops_job: bool,
    /// Object storage only: the token of the writer whose objects hold the checkpoint's own
    /// files (`chk-<id>/<token>/<file>`), set when the manifest is written. `None` in a
    /// directory, where the files are `chk-<id>/<file>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects: Option<String>,
}

impl Manifest {
    /// An empty manifest created now (wall clock) in the current format.
    pub fn new(
        job: impl Into<String>,
        checkpoint_id: CheckpointId,
        kind: CheckpointKind,
        max_parallelism: usize,
    ) -> Self {
        Manifest {
            format_version: FORMAT_VERSION,
            job: job.into(),
            checkpoint_id,
            kind,
            created_unix_ms: layout::unix_millis(),
            max_parallelism,
            stats: ManifestStats::default(),
            operators: Vec::new(),
            stops_job: false,
            objects: None,
        }
    }

    /// Every file entry of every subtask of every operator.
    pub fn files(&self) -> impl Iterator<Item = &FileEntry> {
        self.operators
            .iter()
            .flat_map(|o| &o.subtasks)
            .flat_map(|s| &s.files)
    }

    /// The operator with the given uid.
    pub fn operator(&self, uid: &str) -> Option<&OperatorManifest> {
        self.operators.iter().find(|o| o.uid == uid)
    }

    /// The bytes of `_metadata`: pretty JSON with the checksum line first (see the
    /// [module documentation](self)).
    pub(crate) fn encode(&self) -> serde_json::Result<Vec<u8>> {
        let body = serde_json::to_vec_pretty(self)?;
        // A struct with fields serializes as "{\n  ..."; the line goes after "{\n".
        let Some(rest) = body.strip_prefix(b"{\n".as_slice()) else {
            return Err(serde::ser::Error::custom(
                "a manifest must serialize as a pretty JSON object",
            ));
        };
        let line = format!("  \"metadata_crc32\": {},\n", crc32fast::hash(&body));
        let mut out = Vec::with_capacity(body.len() + line.len());
        out.extend_from_slice(b"{\n");
        out.extend_from_slice(line.as_bytes());
        out.extend_from_slice(rest);
        Ok(out)
    }

    /// Reads a `_metadata` file: verifies the manifest's own checksum first (a mismatch is
    /// [`Error::Corrupt`] naming the file), then checks the format version before the
    /// structure so that a newer format is reported as such. The state files it lists are
    /// not verified: [`CheckpointStorage::load`](crate::CheckpointStorage::load) does that.
    ///
    /// ```
    /// use weir_checkpoint::{CheckpointId, CheckpointKind, CheckpointStorage, Manifest};
    /// let tmp = tempfile::tempdir()?;
    /// let storage = CheckpointStorage::open(tmp.path())?;
    /// let w = storage.begin(CheckpointId(1), CheckpointKind::Checkpoint)?;
    /// let dir = w.finish(Manifest::new("job", CheckpointId(1), CheckpointKind::Checkpoint, 128))?;
    /// let meta = dir.join("_metadata");
    /// assert_eq!(Manifest::read(&meta)?.job, "job");
    /// let damaged = std::fs::read_to_string(&meta)?.replace("\"job\"", "\"jib\"");
    /// std::fs::write(&meta, damaged)?;
    /// assert!(Manifest::read(&meta).unwrap_err().to_string().contains("_metadata: the file's crc32"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read(path: &Path) -> Result<Manifest> {
        if super::remote::is_remote(path) {
            return super::remote::read_manifest_at(path);
        }
        let bytes = std::fs::read(path).map_err(|e| Error::io("read", path, e))?;
        Manifest::parse(&bytes, path)
    }

    /// [`read`](Self::read) for the bytes of a `_metadata` file read from `path`.
    pub(crate) fn parse(bytes: &[u8], path: &Path) -> Result<Manifest> {
        let corrupt = |problem| Error::Corrupt {
            checkpoint: path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf(),
            file: path.to_path_buf(),
            problem,
        };
        let (recorded, body) = match split_checksum(bytes) {
            Some(Ok((crc, body))) => (Some(crc), Cow::Owned(body)),
            Some(Err(())) => return Err(corrupt(FileProblem::ManifestChecksumMissing)),
            None => (None, Cow::Borrowed(bytes)),
        };
        if let Some(expected) = recorded {
            let actual = crc32fast::hash(&body);
            if actual != expected {
                return Err(corrupt(FileProblem::Checksum { expected, actual }));
            }
        }
        let parse = |source| Error::ManifestParse {
            path: path.to_path_buf(),
            source,
        };
        let value: serde_json::Value = serde_json::from_slice(&body).map_err(parse)?;
        let version = value.get("format_version").and_then(|v| v.as_u64());
        if let Some(found) = version
            && found > u64::from(FORMAT_VERSION)
        {
            return Err(Error::UnsupportedFormat {
                path: path.to_path_buf(),
                found: u32::try_from(found).unwrap_or(u32::MAX),
                supported: FORMAT_VERSION,
            });
        }
        if recorded.is_none() && version.is_some_and(|v| v >= FIRST_CHECKSUMMED_FORMAT) {
            return Err(corrupt(FileProblem::ManifestChecksumMissing));
        }
        serde_json::from_value(value).map_err(parse)
    }

    /// Checks the rules a manifest stored in `dir` must follow: the id and kind match the
    /// directory name (when it has a weir name), savepoints do not reference `shared/`, and
    /// every file name is a plain name.
    pub(crate) fn check(&self, dir: &Path) -> Result<()> {
        let invalid = |problem: String| Error::InvalidManifest {
            path: dir.join(layout::METADATA),
            problem,
        };
        let dir_name = dir.file_name().and_then(|n| n.to_str());
        if let Some((id, kind)) = dir_name.and_then(parse_dir_name) {
            if id != self.checkpoint_id {
                return Err(invalid(format!(
                    "it records checkpoint {} but its directory is for checkpoint {id}",
                    self.checkpoint_id
                )));
            }
            if kind.is_savepoint() != self.kind.is_savepoint() {
                return Err(invalid(format!(
                    "it records a {} but its directory is named like a {kind}",
                    self.kind
                )));
            }
        }
        for f in self.files() {
            if self.kind.is_savepoint() && f.shared {
                return Err(invalid(format!(
                    "savepoints must be self-contained, but it references shared file {:?}",
                    f.name
                )));
            }
            layout::validate_file_name(&f.name)
                .map_err(|e| invalid(format!("bad file entry: {e}")))?;
        }
        Ok(())
    }
}

/// Finds the checksum line of `_metadata`: `None` when the file does not start with it (a
/// format 1 manifest, or not a manifest), `Some(Err(()))` when it starts like it but the
/// number is unreadable, else the recorded checksum and the bytes it covers (the file
/// without the line).
fn split_checksum(bytes: &[u8]) -> Option<std::result::Result<(u32, Vec<u8>), ()>> {
    let rest = bytes.strip_prefix(CHECKSUM_LINE_START)?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    let crc = std::str::from_utf8(&rest[..digits])
        .ok()
        .and_then(|d| d.parse::<u32>().ok());
    let Some(after) = rest[digits..].strip_prefix(b",\n".as_slice()) else {
        return Some(Err(()));
    };
    let Some(crc) = crc else {
        return Some(Err(()));
    };
    let mut body = Vec::with_capacity(2 + after.len());
    body.extend_from_slice(b"{\n");
    body.extend_from_slice(after);
    Some(Ok((crc, body)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn sample() -> Manifest {
        let mut m = Manifest::new("job", CheckpointId(5), CheckpointKind::Checkpoint, 128);
        m.operators.push(OperatorManifest {
            uid: "src".into(),
            name: "kafka source".into(),
            parallelism: 2,
            subtasks: vec![SubtaskManifest {
                subtask: 1,
                files: vec![FileEntry {
                    name: "a".into(),
                    size: 3,
                    crc32: 9,
                    shared: true,
                    objects: None,
                }],
                operator_state: Some(serde_json::json!({"payments/0": 42})),
                watermark: Some(17),
            }],
        });
        m
    }

    #[test]
    fn json_round_trip_is_readable() {
        let m = sample();
        let json = serde_json::to_string_pretty(&m).unwrap();
        for needle in [
            "\"format_version\": 2",
            "\"checkpoint_id\": 5",
            "\"payments/0\": 42",
            "\"shared\": true",
        ] {
            assert!(json.contains(needle), "{needle} in {json}");
        }
        assert_eq!(serde_json::from_str::<Manifest>(&json).unwrap(), m);
        assert_eq!(m.files().count(), 1);
        assert_eq!(m.operator("src").unwrap().parallelism, 2);
        assert!(m.operator("nope").is_none());
    }

    #[test]
    fn shared_defaults_to_false() {
        let e: FileEntry = serde_json::from_str(r#"{"name":"x","size":1,"crc32":2}"#).unwrap();
        assert!(!e.shared);
    }

    #[test]
    fn stats_from_coordinator() {
        let s = CheckpointStats {
            triggered_at: Instant::now(),
            duration: Duration::from_millis(1500),
            bytes: 10,
            max_alignment: Duration::from_millis(7),
            max_sync: Duration::ZERO,
            max_async: Duration::ZERO,
            tasks: vec![],
        };
        assert_eq!(
            ManifestStats::from(&s),
            ManifestStats {
                duration_ms: 1500,
                bytes: 10,
                full_bytes: 10,
                alignment_ms: 7,
                channel_state_bytes: 0,
                unaligned: false,
            }
        );
    }

    #[test]
    fn newer_format_is_reported_as_such() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("_metadata");
        std::fs::write(&path, br#"{"format_version": 99, "something": "new"}"#).unwrap();
        let e = Manifest::read(&path).unwrap_err();
        assert!(
            matches!(
                e,
                Error::UnsupportedFormat {
                    found: 99,
                    supported: FORMAT_VERSION,
                    ..
                }
            ),
            "{e}"
        );
        std::fs::write(&path, b"{not json").unwrap();
        assert!(matches!(
            Manifest::read(&path),
            Err(Error::ManifestParse { .. })
        ));
    }

    #[test]
    fn check_enforces_directory_and_savepoint_rules() {
        let tmp = tempfile::tempdir().unwrap();
        let m = sample();
        m.check(&tmp.path().join("chk-00000000000000000005"))
            .unwrap();
        m.check(&tmp.path().join("renamed-by-user")).unwrap();
        let e = m.check(&tmp.path().join("chk-6")).unwrap_err();
        assert!(e.to_string().contains("records checkpoint 5"), "{e}");
        let e = m.check(&tmp.path().join("sp-5-x")).unwrap_err();
        assert!(e.to_string().contains("named like a savepoint"), "{e}");

        let mut sp = m.clone();
        sp.kind = CheckpointKind::Savepoint;
        let e = sp.check(&tmp.path().join("sp-5-x")).unwrap_err();
        assert!(e.to_string().contains("self-contained"), "{e}");

        let mut bad = m;
        bad.operators[0].subtasks[0].files[0].name = "../../etc/passwd".into();
        assert!(matches!(
            bad.check(tmp.path()),
            Err(Error::InvalidManifest { .. })
        ));
    }
}
