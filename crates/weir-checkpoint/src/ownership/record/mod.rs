//! Owner records on disk and what this machine can tell about their processes.
//!
//! A record is a small JSON file `.weir-owner-<seq as 20 digits>` in the owned directory.
//! Records are never changed or replaced: each renewal creates the next sequence number with
//! an exclusive create (`O_EXCL`, atomic on local file systems and NFS v3+), so of two
//! processes writing the same number exactly one succeeds. The record with the highest
//! number is the current one. Owns the file names, reading and writing records and
//! deleting old ones, and the liveness probe (weir-core's [`ProcessId`]); it makes no
//! decisions (that is [`lease`](super::lease)'s).

mod remote;

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
pub(crate) use weir_core::scratch::Liveness;
use weir_core::scratch::ProcessId;

/// Prefix of record file names. A dot keeps the files out of the way of readers of an output
/// directory, who skip dot files (uncommitted output).
const PREFIX: &str = ".weir-owner-";
/// Prefix of a record being written: `.weir-owner-tmp-<token>-<seq>`.
const TMP_PREFIX: &str = ".weir-owner-tmp-";

/// Who owns a directory: one record, as written by its owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRecord {
    /// Random token of the owning run (one per [`Ownership`](super::Ownership)).
    pub token: String,
    /// The owning job's name.
    pub job: String,
    /// Host name of the owning process.
    pub host: String,
    /// Kernel boot id and pid namespace of the owning process (`None` off Linux). Two
    /// processes can compare pids only when these match.
    pub machine: Option<String>,
    /// Process id of the owner.
    pub pid: u32,
    /// The owner process's start time in clock ticks after boot (`/proc/<pid>/stat`), so a
    /// reused pid is not taken for the owner.
    pub pid_start: Option<u64>,
    /// Unix milliseconds when the owner took the directory.
    pub since_ms: u64,
    /// Unix milliseconds of this record (the last renewal), by the owner's clock.
    pub renewed_ms: u64,
    /// The owner's lease: another process may take over once it has seen no new record for
    /// this long.
    pub lease_ms: u64,
    /// The owner let go of the directory (it ended); anyone may take it at once.
    pub released: bool,
    /// Every directory the owner holds (its checkpoint directory and sink output
    /// directories), so that a refusal can say which job a directory is bound to.
    pub dirs: Vec<PathBuf>,
}

/// The current (highest) record of a directory, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// No record: nobody owns the directory.
    Nothing,
    /// Record `seq` parsed.
    Record {
        /// Its sequence number.
        seq: u64,
        /// Its content.
        record: OwnerRecord,
    },
    /// Record `seq` exists but cannot be parsed (being written, or damaged).
    Unreadable {
        /// Its sequence number.
        seq: u64,
    },
}

impl Seen {
    /// The sequence number of the current record (0 when there is none).
    pub fn seq(&self) -> u64 {
        match self {
            Seen::Nothing => 0,
            Seen::Record { seq, .. } | Seen::Unreadable { seq } => *seq,
        }
    }

    /// The record, when one was read.
    pub fn record(&self) -> Option<&OwnerRecord> {
        match self {
            Seen::Record { record, .. } => Some(record),
            _ => None,
        }
    }
}

fn file_name(seq: u64) -> String {
    format!("{PREFIX}{seq:020}")
}

fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Sequence numbers of the records in `dir`, ascending (none if `dir` does not exist).
pub(crate) fn list(dir: &Path) -> Result<Vec<u64>> {
    if crate::storage::remote::is_remote(dir) {
        return remote::list(dir);
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list directory", dir, e)),
    };
    let mut seqs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("list directory", dir, e))?;
        if let Some(seq) = entry.file_name().to_str().and_then(parse_name) {
            seqs.push(seq);
        }
    }
    seqs.sort_unstable();
    Ok(seqs)
}

/// The current record of `dir`.
pub(crate) fn read_current(dir: &Path) -> Result<Seen> {
    if crate::storage::remote::is_remote(dir) {
        return remote::read_current(dir);
    }
    // A record may be deleted by its owner's clean-up between listing and reading: then a
    // newer one exists, so list again.
    for _ in 0..10 {
        let Some(&seq) = list(dir)?.last() else {
            return Ok(Seen::Nothing);
        };
        let path = dir.join(file_name(seq));
        match std::fs::read(&path) {
            Ok(bytes) => {
                return Ok(match serde_json::from_slice(&bytes) {
                    Ok(record) => Seen::Record { seq, record },
                    Err(_) => Seen::Unreadable { seq },
                });
            }
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io("read", path, e)),
        }
    }
    Err(Error::io(
        "read the owner record of",
        dir,
        std::io::Error::other("records keep disappearing while being read"),
    ))
}

/// Creates record `seq` in `dir` exclusively: `Ok(false)` when it exists already.
///
/// The record is written and fsynced under a temporary name, then hard-linked to its name
/// (which fails if the name exists: atomic, also on NFS), so a record is never seen half
/// written — not even one of a process killed or frozen while writing it. On a file
/// system without hard links it is created exclusively and written in place.
pub(crate) fn create(dir: &Path, seq: u64, record: &OwnerRecord) -> Result<bool> {
    let path = dir.join(file_name(seq));
    let json = serde_json::to_vec_pretty(record).map_err(|e| {
        Error::io(
            "encode the owner record for",
            &path,
            std::io::Error::other(e),
        )
    })?;
    if crate::storage::remote::is_remote(dir) {
        return remote::create(dir, seq, &record.token, json);
    }
    let tmp = dir.join(format!("{TMP_PREFIX}{}-{seq}", record.token));
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(&json).and_then(|()| f.sync_all()));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io("write", tmp, e));
    }
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(false),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::Unsupported | ErrorKind::PermissionDenied
            ) =>
        {
            return create_in_place(dir, &path, &json);
        }
        Err(e) => return Err(Error::io("create", path, e)),
    }
    crate::storage::layout::sync_dir(dir)?;
    Ok(true)
}

/// [`create`] without hard links: exclusive create, then write.
fn create_in_place(dir: &Path, path: &Path, json: &[u8]) -> Result<bool> {
    let mut file = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(Error::io("create", path, e)),
    };
    if let Err(e) = file.write_all(json).and_then(|()| file.sync_all()) {
        // This process created the file: remove it, so that the number stays free.
        let _ = std::fs::remove_file(path);
        return Err(Error::io("write", path, e));
    }
    crate::storage::layout::sync_dir(dir)?;
    Ok(true)
}

/// Deletes the records of `dir` numbered below `below` (clean-up after a new record), and
/// temporary record files of other runs (left by a process killed while writing one).
pub(crate) fn delete_below(dir: &Path, below: u64, token: &str) {
    if crate::storage::remote::is_remote(dir) {
        return remote::delete_below(dir, below);
    }
    let Ok(seqs) = list(dir) else { return };
    for seq in seqs.into_iter().filter(|s| *s < below) {
        let _ = std::fs::remove_file(dir.join(file_name(seq)));
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mine = format!("{TMP_PREFIX}{token}-");
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(TMP_PREFIX) && !name.starts_with(&mine) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The newest record this process created on object storage, by directory and token: a
/// reader in this process knows it for the winner of its number (see `remote`).
type Created = std::collections::HashMap<(PathBuf, String), u64>;

fn created() -> &'static std::sync::Mutex<Created> {
    static CREATED: std::sync::OnceLock<std::sync::Mutex<Created>> = std::sync::OnceLock::new();
    CREATED.get_or_init(Default::default)
}

fn remember_created(dir: &Path, seq: u64, token: &str) {
    created()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert((dir.to_path_buf(), token.to_string()), seq);
}

fn created_here(dir: &Path, seq: u64, token: &str) -> bool {
    created()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(dir.to_path_buf(), token.to_string()))
        == Some(&seq)
}

/// This process as an owner.
pub(crate) fn me() -> &'static ProcessId {
    ProcessId::current()
}

/// Whether the process of `record` still runs, seen from this process.
pub(crate) fn probe(record: &OwnerRecord) -> Liveness {
    me().liveness_of(&ProcessId {
        host: record.host.clone(),
        machine: record.machine.clone(),
        pid: record.pid,
        start: record.pid_start,
    })
}

/// `unix ms` as `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(token: &str) -> OwnerRecord {
        let me = me();
        OwnerRecord {
            token: token.into(),
            job: "job".into(),
            host: me.host.clone(),
            machine: me.machine.clone(),
            pid: me.pid,
            pid_start: me.start,
            since_ms: 1,
            renewed_ms: 2,
            lease_ms: 1000,
            released: false,
            dirs: vec![],
        }
    }

    #[test]
    fn names_round_trip_and_order() {
        assert_eq!(parse_name(&file_name(7)), Some(7));
        assert_eq!(parse_name(&file_name(u64::MAX)), Some(u64::MAX));
        for bad in [
            ".weir-owner-",
            ".weir-owner-12",
            "_metadata",
            ".weir-owner-0000000000000000000x",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
        assert!(file_name(9) < file_name(10), "names sort like numbers");
    }

    #[test]
    fn create_is_exclusive_and_the_highest_is_current() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(read_current(tmp.path()).unwrap(), Seen::Nothing);
        assert!(create(tmp.path(), 1, &record("a")).unwrap());
        assert!(
            !create(tmp.path(), 1, &record("b")).unwrap(),
            "one writer wins"
        );
        assert!(create(tmp.path(), 2, &record("b")).unwrap());
        let seen = read_current(tmp.path()).unwrap();
        assert_eq!(seen.seq(), 2);
        assert_eq!(seen.record().unwrap().token, "b");
        std::fs::write(tmp.path().join(file_name(3)), b"{\"tok").unwrap();
        assert_eq!(
            read_current(tmp.path()).unwrap(),
            Seen::Unreadable { seq: 3 }
        );
        std::fs::write(tmp.path().join(format!("{TMP_PREFIX}dead-9")), b"{").unwrap();
        std::fs::write(tmp.path().join(format!("{TMP_PREFIX}me-9")), b"{").unwrap();
        assert_eq!(
            list(tmp.path()).unwrap(),
            [1, 2, 3],
            "temporary files are no records"
        );
        delete_below(tmp.path(), 3, "me");
        assert_eq!(list(tmp.path()).unwrap(), [3]);
        let mut left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [file_name(3), format!("{TMP_PREFIX}me-9")]);
        assert_eq!(
            list(&tmp.path().join("missing")).unwrap(),
            Vec::<u64>::new()
        );
    }

    #[test]
    fn probe_tells_this_process_from_a_gone_one() {
        if me().machine.is_none() {
            return; // no /proc: every probe is Unknown
        }
        assert_eq!(probe(&record("x")), Liveness::Alive);
        let mut reused = record("x");
        reused.pid_start = reused.pid_start.map(|s| s + 1);
        assert_eq!(
            probe(&reused),
            Liveness::Gone,
            "a reused pid is not the owner"
        );
        let mut gone = record("x");
        gone.pid = u32::MAX - 1;
        assert_eq!(probe(&gone), Liveness::Gone);
        let mut elsewhere = record("x");
        elsewhere.host = "another-host".into();
        assert_eq!(probe(&elsewhere), Liveness::Unknown);
        let mut other_ns = record("x");
        other_ns.machine = Some("boot/pid:[1]".into());
        assert_eq!(probe(&other_ns), Liveness::Unknown);
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000_123), "2023-11-14 22:13:20 UTC");
    }
}
