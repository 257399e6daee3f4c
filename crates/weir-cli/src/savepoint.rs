//! `weir savepoint trigger|stop DIR`: ask a running job for a savepoint and wait for it.
//!
//! The protocol with the runtime is a file: this module atomically creates
//! `DIR/_savepoint_request` ([`weir_runtime::SAVEPOINT_REQUEST_FILE`]; content `stop` for
//! stop-with-savepoint), the job's coordinator consumes it, and the savepoint appears as a new
//! complete `sp-…` directory in `DIR`. Owns writing and withdrawing the request and waiting;
//! never writes or deletes checkpoint data.

use crate::storage::open_existing;
use anyhow::{Context, Result};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use weir_checkpoint::CheckpointStorage;
use weir_runtime::SAVEPOINT_REQUEST_FILE;

/// How often the directory is checked for the new savepoint.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// What to ask the job for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Take a savepoint and keep running.
    Savepoint,
    /// Take a savepoint, commit the sinks up to it, and stop.
    Stop,
}

impl Request {
    /// The request file's content, as the runtime reads it.
    fn content(self) -> &'static str {
        match self {
            Request::Savepoint => "savepoint\n",
            Request::Stop => "stop\n",
        }
    }
}

/// Requests a savepoint of the job checkpointing into `dir`, waits up to `timeout` for a new
/// complete savepoint directory, and prints its path. On timeout the request is withdrawn
/// (if the job has not taken it yet) and an error explains the likely causes.
pub fn run(dir: &Path, request: Request, timeout: Duration, out: &mut dyn Write) -> Result<()> {
    let opened = open_existing(dir)?;
    let storage = &opened.storage;
    // Complete or not: one being written now is not the one this request asks for.
    let before = savepoints(storage)?;
    write_request(storage, request)?;
    eprintln!(
        "requested a savepoint{} from the job checkpointing into {}; waiting up to {}s",
        if request == Request::Stop {
            " and a stop"
        } else {
            ""
        },
        dir.display(),
        timeout.as_secs()
    );
    let found = wait_for_new(storage, &before, timeout);
    let path = match found {
        Ok(Some(path)) => path,
        Ok(None) => return Err(timed_out(storage, timeout)),
        Err(e) => {
            let _ = withdraw(storage);
            return Err(e);
        }
    };
    writeln!(out, "{}", path.display())?;
    Ok(())
}

/// Every savepoint directory in the storage, complete or not.
fn savepoints(storage: &CheckpointStorage) -> Result<HashSet<PathBuf>> {
    let infos = storage
        .list()
        .with_context(|| format!("cannot list {}", storage.dir().display()))?;
    Ok(infos
        .into_iter()
        .filter(|i| i.kind.is_savepoint())
        .map(|i| i.path)
        .collect())
}

/// Writes the request whole (a temporary file renamed into place, or one PUT on object
/// storage), so the job never reads a partly written request.
fn write_request(storage: &CheckpointStorage, request: Request) -> Result<()> {
    storage
        .write_control(SAVEPOINT_REQUEST_FILE, request.content().as_bytes())
        .with_context(|| {
            format!(
                "cannot write the savepoint request into {}",
                storage.dir().display()
            )
        })
}

/// Polls until a complete savepoint that is not in `before` appears, or `timeout` passes.
/// When several appear at once, returns the one listed last (the highest id).
fn wait_for_new(
    storage: &CheckpointStorage,
    before: &HashSet<PathBuf>,
    timeout: Duration,
) -> Result<Option<PathBuf>> {
    let deadline = Instant::now() + timeout;
    loop {
        let infos = storage
            .list()
            .with_context(|| format!("cannot list {}", storage.dir().display()))?;
        let new = infos
            .into_iter()
            .rev()
            .find(|i| i.kind.is_savepoint() && i.complete && !before.contains(&i.path));
        if let Some(info) = new {
            return Ok(Some(info.path));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        std::thread::sleep(POLL_INTERVAL.min(deadline - now));
    }
}

/// Removes the request file. `Ok(true)` if it was still there (the job never took it).
fn withdraw(storage: &CheckpointStorage) -> Result<bool> {
    storage
        .remove_control(SAVEPOINT_REQUEST_FILE)
        .with_context(|| {
            format!(
                "cannot withdraw the savepoint request in {}",
                storage.dir().display()
            )
        })
}

/// The error after waiting in vain; withdraws the request first.
fn timed_out(storage: &CheckpointStorage, timeout: Duration) -> anyhow::Error {
    let secs = timeout.as_secs();
    let dir = storage.dir();
    let request = dir.join(SAVEPOINT_REQUEST_FILE);
    match withdraw(storage) {
        Ok(true) => anyhow::anyhow!(
            "no savepoint appeared in {} within {secs}s and the request was never picked up: \
             the job may not be running, or checkpointing is not configured for it (a job reads \
             {} only while it checkpoints into {}); the request was withdrawn",
            dir.display(),
            request.display(),
            dir.display()
        ),
        Ok(false) => anyhow::anyhow!(
            "the job picked up the request but no savepoint was completed in {} within {secs}s; \
             it may still complete (see `weir checkpoints list {}`) or have failed (see the \
             job's log)",
            dir.display(),
            dir.display()
        ),
        Err(e) => e.context(format!(
            "no savepoint appeared in {} within {secs}s: the job may not be running, or \
             checkpointing is not configured for it; withdrawing the request failed, delete {} \
             by hand so that it does not fire later",
            dir.display(),
            request.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_contents_match_the_runtime() {
        assert_eq!(Request::Stop.content().trim(), "stop");
        assert_ne!(Request::Savepoint.content().trim(), "stop");
    }

    #[test]
    fn request_is_written_atomically_and_withdrawn() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::open(tmp.path()).unwrap();
        write_request(&storage, Request::Stop).unwrap();
        let mut names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [SAVEPOINT_REQUEST_FILE, "shared"],
            "no temporary file left"
        );
        let content = std::fs::read_to_string(tmp.path().join(SAVEPOINT_REQUEST_FILE)).unwrap();
        assert_eq!(content, "stop\n");
        assert!(withdraw(&storage).unwrap());
        assert!(!withdraw(&storage).unwrap());
    }

    #[test]
    fn requests_on_object_storage_are_one_object() {
        let storage = CheckpointStorage::open("memory://cli-request/ck").unwrap();
        write_request(&storage, Request::Savepoint).unwrap();
        let store = weir_objstore::Store::open("memory://cli-request/ck").unwrap();
        assert_eq!(
            store.get(SAVEPOINT_REQUEST_FILE).unwrap().unwrap(),
            b"savepoint\n"
        );
        assert!(withdraw(&storage).unwrap());
        assert!(!withdraw(&storage).unwrap());
    }
}
