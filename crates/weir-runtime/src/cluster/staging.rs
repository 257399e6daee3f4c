//! The coordinator's staging area: the checkpoint files workers send with their
//! acknowledgements, kept on the coordinator's disk until the checkpoint writer has copied
//! them into checkpoint storage, and for as long as a worker may refer to them without
//! sending them again.
//!
//! What it holds, and nothing more: for every task, the files of its acknowledgement of the
//! latest completed checkpoint (its *basis*: the worker leaves out the immutable ones when
//! it acknowledges the next checkpoint, see the worker's `SentFiles`), and the files of the
//! acknowledgements of checkpoints not yet completed or aborted. A completed checkpoint
//! moves each task's basis forward; an aborted one is forgotten; a file nobody refers to
//! any more is deleted at once; a new attempt starts empty. So the area never grows with
//! the run time of the job: it holds at most one completed checkpoint and the ones in
//! flight.
//!
//! A failure to stage an acknowledgement (a full disk, a file a worker left out that is not
//! here) fails that acknowledgement only: what it wrote is removed, the task's basis stays
//! as it was, so the worker sends the files again with its next acknowledgement.
//!
//! After a restore, the workers leave out the immutable files their tasks were restored
//! with as well (their basis starts with them): those are in checkpoint storage already,
//! and [`Staging::restored`] tells the area which. It accepts them left out, never holds,
//! copies or deletes them, and leaves the snapshot's file where the worker has it, under
//! the name the state backend gave it (a restore of the new checkpoint places the file
//! under that name); the checkpoint writer reuses the stored copy by its storage name. So
//! the first checkpoint after a restore sends and stores only what changed.
//!
//! Used only when the checkpoint storage is a directory (local or a shared mount). With
//! checkpoints on object storage the workers store their tasks' files themselves and
//! acknowledge with references (`checkpoints::store_task_snapshots`); such an
//! acknowledgement stages nothing, and the coordinator writes only the manifest.
//!
//! Owns the files under its directory and nothing else; it does not talk to workers or
//! to the checkpoint coordinator.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use weir_core::checkpoint::OperatorSnapshot;
use weir_core::{Error, Result};

/// A task of an attempt: (head node, subtask).
pub(crate) type Task = (u32, u32);

/// A staged file.
#[derive(Debug, Clone)]
struct Held {
    path: PathBuf,
    size: u64,
}

#[derive(Debug, Default)]
struct Inner {
    attempt: u64,
    /// Staged files by storage name.
    held: HashMap<String, Held>,
    /// Per task: the files of its acknowledgement of the latest completed checkpoint.
    basis: HashMap<Task, BTreeSet<String>>,
    /// Per checkpoint not yet completed or aborted: the files of each task's acknowledgement.
    pending: BTreeMap<u64, HashMap<Task, BTreeSet<String>>>,
    /// The storage names of the stored files of the checkpoint this attempt restored
    /// (never held or deleted here).
    restored: BTreeSet<String>,
}

impl Inner {
    /// Forgets the files no task's basis and no pending acknowledgement refers to; returns
    /// their paths, to delete outside the lock.
    fn collect(&mut self) -> Vec<PathBuf> {
        let live: BTreeSet<&String> = self
            .basis
            .values()
            .chain(self.pending.values().flat_map(|p| p.values()))
            .flatten()
            .collect();
        let dead: Vec<String> = self
            .held
            .keys()
            .filter(|n| !live.contains(n))
            .cloned()
            .collect();
        dead.into_iter()
            .filter_map(|n| self.held.remove(&n))
            .map(|h| h.path)
            .collect()
    }
}

/// The staging area of one coordinator (see the module documentation).
pub(crate) struct Staging {
    root: PathBuf,
    inner: Mutex<Inner>,
    files: weir_core::metrics::Gauge,
    bytes: weir_core::metrics::Gauge,
}

impl Staging {
    /// An empty staging area in `root` (created), for job `job`'s metrics.
    pub(crate) fn new(root: PathBuf, job: &str) -> Result<Self> {
        std::fs::create_dir_all(&root).map_err(|e| Error::io(root.display(), e))?;
        let l = [("job", job)];
        Ok(Staging {
            root,
            inner: Mutex::new(Inner::default()),
            files: weir_core::metrics::gauge(
                "cluster_staged_files",
                "Checkpoint files the coordinator holds for workers (latest completed checkpoint and those in flight).",
                &l,
            ),
            bytes: weir_core::metrics::gauge(
                "cluster_staged_bytes",
                "Bytes of the checkpoint files the coordinator holds for workers.",
                &l,
            ),
        })
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts attempt `attempt`: everything staged before is deleted (the workers of the new
    /// attempt send every file again).
    pub(crate) fn begin_attempt(&self, attempt: u64) {
        let mut inner = self.inner();
        *inner = Inner {
            attempt,
            ..Inner::default()
        };
        if let Ok(rd) = std::fs::read_dir(&self.root) {
            for e in rd.flatten() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        self.publish(&inner);
    }

    /// The attempt `attempt` restored a checkpoint whose immutable files `files` (storage
    /// names; storage holds them) the workers may leave out of their acknowledgements.
    pub(crate) fn restored(&self, attempt: u64, files: impl IntoIterator<Item = String>) {
        let mut inner = self.inner();
        if inner.attempt == attempt {
            inner.restored.extend(files);
        }
    }

    /// Stages the acknowledgement of checkpoint `checkpoint` by `task` of `attempt`: writes
    /// the `files` it carries (by storage name) and points every file of `snapshot` at its
    /// staged copy. A file the snapshot refers to without carrying it must be staged
    /// already. On error nothing of this acknowledgement stays staged.
    pub(crate) fn stage(
        &self,
        attempt: u64,
        task: Task,
        checkpoint: u64,
        snapshot: &mut BTreeMap<String, OperatorSnapshot>,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<()> {
        let mut data: HashMap<String, Vec<u8>> = files.into_iter().collect();
        let mut targets: Vec<(String, PathBuf)> = Vec::new();
        for f in snapshot.values().flat_map(|s| &s.files) {
            let file_name = f
                .path
                .file_name()
                .ok_or_else(|| Error::Config(format!("bad checkpoint file {}", f.name)))?;
            // `<name>/<file name>`: the file keeps its own name, which a restore needs.
            targets.push((f.name.clone(), self.root.join(&f.name).join(file_name)));
        }
        // What to write: the files sent that are not staged already (immutable files a
        // worker sends again while its basis lags behind ours).
        let to_write: Vec<(String, PathBuf, Vec<u8>)> = {
            let inner = self.inner();
            if inner.attempt != attempt {
                return Err(stale(attempt, inner.attempt));
            }
            targets
                .iter()
                .filter(|(name, _)| !inner.held.contains_key(name))
                .filter_map(|(name, path)| {
                    data.remove(name)
                        .map(|bytes| (name.clone(), path.clone(), bytes))
                })
                .collect()
        };
        let mut written: Vec<(String, Held)> = Vec::new();
        let outcome = (|| {
            for (name, path, bytes) in to_write {
                let size = bytes.len() as u64;
                write_new(&path, &bytes)?;
                written.push((name, Held { path, size }));
            }
            weir_core::failpoint::check("cluster.stage")
        })();
        let mut inner = self.inner();
        let outcome = outcome.and_then(|()| {
            if inner.attempt != attempt {
                return Err(stale(attempt, inner.attempt));
            }
            let just: BTreeSet<&String> = written.iter().map(|(n, _)| n).collect();
            match targets
                .iter()
                .find(|(n, _)| {
                    !just.contains(n)
                        && !inner.held.contains_key(n)
                        && !inner.restored.contains(n)
                })
            {
                Some((name, _)) => Err(Error::Config(format!(
                    "the worker left out checkpoint file {name}, which the coordinator does not hold"
                ))),
                None => Ok(()),
            }
        });
        if let Err(e) = outcome {
            drop(inner);
            for (_, h) in written {
                remove(&h.path);
            }
            return Err(e);
        }
        for (name, h) in written {
            inner.held.insert(name, h);
        }
        let names: BTreeSet<String> = targets.iter().map(|(n, _)| n.clone()).collect();
        inner
            .pending
            .entry(checkpoint)
            .or_default()
            .insert(task, names);
        // A restored file keeps the worker's path: its last component is the name the
        // state backend gave it, which a restore of this checkpoint places it under. (Its
        // stored copy is named by the storage name; pointing at that made checkpoints
        // taken after a restore impossible to restore again.)
        for f in snapshot.values_mut().flat_map(|s| &mut s.files) {
            if let Some(h) = inner.held.get(&f.name) {
                f.path = h.path.clone();
            }
        }
        self.publish(&inner);
        Ok(())
    }

    /// Checkpoint `checkpoint` completed: each task that acknowledged it takes its files as
    /// its basis; older pending acknowledgements (written already, or subsumed) are dropped.
    pub(crate) fn completed(&self, checkpoint: u64) {
        let mut inner = self.inner();
        if let Some(acks) = inner.pending.remove(&checkpoint) {
            for (task, names) in acks {
                inner.basis.insert(task, names);
            }
        }
        let older: Vec<u64> = inner.pending.range(..checkpoint).map(|(c, _)| *c).collect();
        for c in older {
            inner.pending.remove(&c);
        }
        self.sweep(inner);
    }

    /// Checkpoint `checkpoint` was aborted: its acknowledgements are forgotten.
    pub(crate) fn aborted(&self, checkpoint: u64) {
        let mut inner = self.inner();
        inner.pending.remove(&checkpoint);
        self.sweep(inner);
    }

    /// Deletes what nobody refers to any more.
    fn sweep(&self, mut inner: std::sync::MutexGuard<'_, Inner>) {
        let dead = inner.collect();
        self.publish(&inner);
        drop(inner);
        for path in dead {
            remove(&path);
        }
    }

    fn publish(&self, inner: &Inner) {
        self.files.set(inner.held.len() as i64);
        self.bytes
            .set(inner.held.values().map(|h| h.size).sum::<u64>() as i64);
    }

    /// Files and bytes staged now.
    #[cfg(test)]
    fn usage(&self) -> (usize, u64) {
        let inner = self.inner();
        (inner.held.len(), inner.held.values().map(|h| h.size).sum())
    }
}

/// The storage names of the shared files of checkpoint `manifest` at `path` that storage
/// holds (for [`Staging::restored`]); none for a savepoint, whose files are its own copies that the
/// next checkpoint stores again, or on object storage.
pub(crate) fn restored_files(
    storage: &weir_checkpoint::CheckpointStorage,
    manifest: &weir_checkpoint::Manifest,
    path: &Path,
) -> Vec<String> {
    if manifest.kind.is_savepoint() {
        return Vec::new();
    }
    manifest
        .files()
        .filter(|f| f.shared)
        .filter(|f| storage.file_path(path, f).ok().flatten().is_some())
        .map(|f| f.name.clone())
        .collect()
}

fn stale(attempt: u64, current: u64) -> Error {
    Error::Remote {
        message: format!(
            "an acknowledgement of attempt {attempt} arrived during attempt {current}"
        ),
        deterministic: false,
        secondary: true,
    }
}

/// Writes `bytes` to `path` through a temporary name, so a reader never sees half a file.
/// On error nothing is left behind.
fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = path
        .parent()
        .expect("a staged file is in its own directory");
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".staging-{n}"));
    let r = std::fs::write(&tmp, bytes)
        .map_err(|e| Error::io(tmp.display(), e))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| Error::io(path.display(), e)));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
        let _ = std::fs::remove_dir(dir);
    }
    r
}

/// Removes a staged file and its directory.
fn remove(path: &Path) {
    let _ = std::fs::remove_file(path);
    if let Some(dir) = path.parent() {
        let _ = std::fs::remove_dir(dir);
    }
}

#[cfg(test)]
#[path = "staging_tests.rs"]
mod tests;
