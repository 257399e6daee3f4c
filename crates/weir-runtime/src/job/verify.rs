//! The checksums of a restored checkpoint, read on a thread of their own while the restored
//! attempt already runs (docs/checkpoints.md, section 4): reading every file of a large
//! state from disk took most of a restart. The attempt completes no checkpoint, so no sink
//! commits, until they all verify; if one does not, the job restores again from the newest
//! checkpoint that verifies in full.

use super::{Attempt, JobShared};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use weir_checkpoint::CheckpointStorage;
use weir_core::checkpoint::RestoreGate;
use weir_core::ids::CheckpointId;

/// What reading the checksums found: `Ok(true)` every file verified, `Ok(false)` the
/// reading was stopped, else the first bad file.
pub(crate) type Verdict = weir_checkpoint::Result<bool>;

/// The verdict as the restored attempt's sinks wait for it.
#[derive(Default)]
struct Settled {
    /// `None` while reading; `Some(Ok(()))` sound; `Some(Err(why))` corrupt or stopped.
    verdict: Mutex<Option<Result<(), Option<String>>>>,
    changed: Condvar,
}

impl Settled {
    fn set(&self, verdict: &Verdict) {
        let v = match verdict {
            Ok(true) => Ok(()),
            Ok(false) => Err(None),
            Err(e) => Err(Some(e.to_string())),
        };
        *self.verdict.lock().unwrap_or_else(PoisonError::into_inner) = Some(v);
        self.changed.notify_all();
    }

    fn wait(&self) -> weir_core::Result<()> {
        let mut v = self.verdict.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match &*v {
                Some(Ok(())) => return Ok(()),
                Some(Err(Some(why))) => return Err(weir_core::Error::Config(why.clone())),
                Some(Err(None)) => return Err(weir_core::Error::Cancelled),
                None => {
                    v = self.changed.wait(v).unwrap_or_else(PoisonError::into_inner);
                }
            }
        }
    }
}

/// A running check of a restored checkpoint's checksums.
pub(crate) struct BackgroundVerify {
    pub(crate) id: CheckpointId,
    pub(crate) path: PathBuf,
    stop: Arc<AtomicBool>,
    settled: Arc<Settled>,
    rx: crossbeam_channel::Receiver<Verdict>,
    thread: Option<JoinHandle<()>>,
}

impl BackgroundVerify {
    /// Starts reading the checksums of checkpoint `id` at `path` on a thread of its own.
    pub(crate) fn start(storage: &CheckpointStorage, id: CheckpointId, path: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let settled = Arc::new(Settled::default());
        let (tx, rx) = crossbeam_channel::bounded(1);
        let no_thread = tx.clone();
        let read = {
            let (storage, path, stop, settled) =
                (storage.clone(), path.clone(), stop.clone(), settled.clone());
            let span = tracing::Span::current();
            move || {
                let _span = span.entered();
                let started = std::time::Instant::now();
                let verdict = storage.verify_checksums(&path, &stop);
                if let Ok(true) = verdict {
                    let elapsed_ms = started.elapsed().as_millis() as u64;
                    tracing::info!(
                        checkpoint = id.0,
                        elapsed_ms,
                        "the files of restored checkpoint {id} verified in {elapsed_ms} ms"
                    );
                }
                settled.set(&verdict);
                let _ = tx.send(verdict);
            }
        };
        let thread = std::thread::Builder::new()
            .name("weir-verify".into())
            .spawn(read)
            .map_err(|e| {
                // Without a thread nothing verifies: the gate stays shut and the attempt
                // stops, to be restored again with the checksums read first.
                let verdict = Err(weir_checkpoint::Error::Io {
                    action: "start a thread to verify",
                    path: path.clone(),
                    source: e,
                });
                settled.set(&verdict);
                let _ = no_thread.send(verdict);
            })
            .ok();
        BackgroundVerify {
            id,
            path,
            stop,
            settled,
            rx,
            thread,
        }
    }

    /// Where the verdict arrives, once.
    pub(crate) fn verdict(&self) -> crossbeam_channel::Receiver<Verdict> {
        self.rx.clone()
    }

    /// The gate the restored sinks wait on before they commit restored output.
    pub(crate) fn gate(&self) -> RestoreGate {
        let settled = self.settled.clone();
        RestoreGate::new(move || settled.wait())
    }

    /// Ends the check after its attempt ended: waits for the verdict when `wait` (an attempt
    /// that failed must know whether its checkpoint was sound before choosing what to
    /// restore next), else stops reading. `None` when it was stopped or had already
    /// reported its verdict on [`verdict`](Self::verdict).
    pub(crate) fn end(mut self, wait: bool) -> Option<Verdict> {
        if !wait {
            self.stop.store(true, Ordering::SeqCst);
        }
        let verdict = if wait { self.rx.recv().ok() } else { None };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        verdict
    }
}

/// Whether the checkpoint an attempt restored verified, once the attempt ended: `Some(true)`
/// or `Some(false)` when its checksums were read in the background (`verification`), `None`
/// when they were not or the reading was stopped. An attempt that failed (at launch or
/// while running) waits for the verdict, since what the next attempt restores depends on
/// it; one that ended otherwise stops the reading.
pub(super) fn settle(
    name: &str,
    job: &JobShared,
    verification: Option<BackgroundVerify>,
    outcome: &weir_core::Result<Attempt>,
) -> Option<bool> {
    let v = verification?;
    let failed = match outcome {
        Ok(a) if a.verdict.is_some() => return a.verdict,
        Ok(a) => a.result.is_err(),
        Err(_) => true,
    } && !job.cancel.load(Ordering::SeqCst);
    let (id, path) = (v.id, v.path.clone());
    match v.end(failed)? {
        Ok(true) => Some(true),
        Ok(false) => None,
        Err(e) => {
            report_bad(name, id, &path, &e);
            Some(false)
        }
    }
}

/// Says that the restored checkpoint `id` at `path` does not verify, and why.
pub(super) fn report_bad(name: &str, id: CheckpointId, path: &Path, e: &weir_checkpoint::Error) {
    tracing::warn!(
        job = name,
        checkpoint = id.0,
        path = %path.display(),
        error = %e,
        "job '{name}': the restored checkpoint {id} ({}) does not verify: {e}",
        path.display()
    );
}

impl Drop for BackgroundVerify {
    fn drop(&mut self) {
        // Stopped, the reading settles the gate (Cancelled) for any sink still waiting.
        self.stop.store(true, Ordering::SeqCst);
    }
}
