//! Savepoint requests from `weir savepoint trigger|stop DIR`: a control file in the checkpoint
//! storage, taken by the running job.
//!
//! In a directory the attempt loop looks for the file on every turn (a failed `open`, cheap).
//! On object storage every look is a request that may wait for its retries while the store
//! is unreachable, so a thread of its own looks once a second and hands what it finds to the
//! loop: an outage never holds up checkpoints or the tasks' events.

use super::SAVEPOINT_REQUEST_FILE;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;
use weir_checkpoint::CheckpointStorage;

/// How often a job on object storage looks for a savepoint request.
const REMOTE_POLL: Duration = Duration::from_secs(1);

/// Takes the request: 1 for a savepoint, 2 for a savepoint and a stop, 0 for none.
pub(super) fn take(storage: &CheckpointStorage) -> u8 {
    match storage.take_control(SAVEPOINT_REQUEST_FILE) {
        Ok(Some(content)) if String::from_utf8_lossy(&content).trim() == "stop" => 2,
        Ok(Some(_)) => 1,
        Ok(None) => 0,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the savepoint request: {e}");
            0
        }
    }
}

/// Looks for requests for one attempt.
pub(super) enum Requests {
    /// Looks in the directory when asked.
    Local(CheckpointStorage),
    /// A thread looks; its findings wait here.
    Remote {
        found: Arc<AtomicU8>,
        stop: Arc<AtomicBool>,
    },
}

impl Requests {
    pub(super) fn new(storage: &CheckpointStorage) -> Requests {
        if !storage.is_remote() {
            return Requests::Local(storage.clone());
        }
        let found = Arc::new(AtomicU8::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s, storage) = (found.clone(), stop.clone(), storage.clone());
        let spawned = std::thread::Builder::new()
            .name("weir-savepoint-requests".into())
            .spawn(move || {
                while !s.load(Ordering::SeqCst) {
                    let r = take(&storage);
                    if r > 0 {
                        f.fetch_max(r, Ordering::SeqCst);
                    }
                    let mut waited = Duration::ZERO;
                    while waited < REMOTE_POLL && !s.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(50));
                        waited += Duration::from_millis(50);
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the thread that looks for savepoint requests");
        }
        Requests::Remote { found, stop }
    }

    /// The request found since the last call (0 for none).
    pub(super) fn take(&self) -> u8 {
        match self {
            Requests::Local(storage) => take(storage),
            Requests::Remote { found, .. } => found.swap(0, Ordering::SeqCst),
        }
    }
}

impl Drop for Requests {
    fn drop(&mut self) {
        if let Requests::Remote { stop, .. } = self {
            stop.store(true, Ordering::SeqCst);
        }
    }
}
