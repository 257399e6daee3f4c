//! What operators contribute to checkpoints and get back on restore.
//!
//! Owns [`Checkpointed`] (the hooks an operator implements), [`OperatorSnapshot`] (its
//! state at a barrier: keyed state split by key group, plus opaque operator state such as
//! source positions) and [`RestoreState`] (what a subtask receives when a job resumes,
//! already clipped to its key groups). Storage and coordination live elsewhere.

use crate::error::Result;
use crate::ids::CheckpointId;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::{Arc, Condvar, Mutex};

/// Keyed state of one table: encoded entries per key group.
pub type KeyGroupBlobs = Vec<(u32, Vec<u8>)>;

/// The state of one operator subtask at a checkpoint barrier.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OperatorSnapshot {
    /// Keyed state: table name → encoded entries per key group.
    pub keyed: BTreeMap<String, KeyGroupBlobs>,
    /// Operator state (not keyed): opaque bytes, e.g. a source's splits and positions.
    pub operator: Option<Vec<u8>>,
    /// A human-readable summary of the operator state (shown by `weir checkpoints inspect`).
    pub description: Option<String>,
    /// Files of a persistent state backend (e.g. RocksDB's SST files) to copy into the
    /// checkpoint after the synchronous part; immutable `shared` files are stored once and
    /// referenced by later checkpoints (incremental checkpoints).
    #[serde(default)]
    pub files: Vec<LocalFile>,
    /// Files the backend is still writing in the background when the synchronous part
    /// ends; [`OperatorSnapshot::resolve_files`] waits for them and moves them to `files`.
    #[serde(skip)]
    pub deferred: Vec<DeferredFiles>,
    /// The event time the operator had reached at the barrier: the watermark of its
    /// inputs (set by the runtime for the operators of a task with inputs), or the
    /// watermark a source emitted itself. Stored in the checkpoint's manifest, not in the
    /// state file, so checkpoints taken before it existed still restore (without one).
    #[serde(default)]
    pub watermark: Option<crate::time::Timestamp>,
    /// Set when the task already stored this snapshot in checkpoint storage itself (a
    /// worker of a cluster whose checkpoints are on object storage): the entries of what it
    /// stored. `keyed`, `operator` and `files` are then empty; `description` and
    /// `watermark` still go into the manifest. Never sent with the snapshot: the cluster's
    /// acknowledgement carries it separately.
    #[serde(skip)]
    pub stored: Option<StoredSnapshot>,
}

/// What a task stored in checkpoint storage for one operator's snapshot (see
/// [`OperatorSnapshot::stored`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSnapshot {
    /// The files, as the checkpoint's manifest lists them.
    pub files: Vec<StoredFile>,
    /// Bytes the task wrote for them (shared files already in storage count nothing).
    pub written: u64,
}

/// One file a task stored in checkpoint storage: the manifest's entry for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFile {
    /// Its name (in `shared/` when `shared`).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// CRC-32 (IEEE) of the contents.
    pub crc32: u32,
    /// True when it is a shared file.
    pub shared: bool,
    /// The token of the writer whose objects hold it (own files on object storage).
    pub objects: Option<String>,
}

/// A local file that belongs to a snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalFile {
    /// Where it is now.
    pub path: std::path::PathBuf,
    /// Its name in checkpoint storage (unique per content when shared).
    pub name: String,
    /// Immutable and shareable across checkpoints.
    pub shared: bool,
}

/// Files of a snapshot that a background thread is still producing (the asynchronous
/// phase of a persistent backend's snapshot). Cloning shares the slot.
///
/// ```
/// use weir_core::checkpoint::{DeferredFiles, LocalFile};
/// let files = DeferredFiles::default();
/// let producer = files.clone();
/// std::thread::spawn(move || {
///     producer.set(Ok(vec![LocalFile { path: "a.sst".into(), name: "a.sst".into(), shared: true }]))
/// });
/// assert_eq!(files.wait().unwrap()[0].name, "a.sst");
/// ```
#[derive(Clone, Default)]
pub struct DeferredFiles(Arc<(Mutex<Outcome>, Condvar)>);

/// What a background snapshot produced, once it has.
type Outcome = Option<Result<Vec<LocalFile>>>;

impl DeferredFiles {
    /// Publishes the outcome and wakes the waiters.
    pub fn set(&self, files: Result<Vec<LocalFile>>) {
        let (slot, ready) = &*self.0;
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(files);
        ready.notify_all();
    }

    /// Blocks until the outcome is published and returns it (an error goes to the first
    /// waiter as it was; later waiters get its message).
    pub fn wait(&self) -> Result<Vec<LocalFile>> {
        let (slot, ready) = &*self.0;
        let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match guard.take() {
                Some(Ok(files)) => {
                    *guard = Some(Ok(files.clone()));
                    return Ok(files);
                }
                Some(Err(e)) => {
                    *guard = Some(Err(crate::Error::User(e.to_string())));
                    return Err(e);
                }
                None => guard = ready.wait(guard).unwrap_or_else(|p| p.into_inner()),
            }
        }
    }
}

impl std::fmt::Debug for DeferredFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let done = self.0.0.lock().map(|s| s.is_some()).unwrap_or(true);
        write!(
            f,
            "DeferredFiles({})",
            if done { "ready" } else { "pending" }
        )
    }
}

impl OperatorSnapshot {
    /// Waits for the files still being written in the background and adds them to
    /// [`OperatorSnapshot::files`]. Whoever stores the snapshot calls this first.
    pub fn resolve_files(&mut self) -> Result<()> {
        for d in std::mem::take(&mut self.deferred) {
            self.files.extend(d.wait()?);
        }
        Ok(())
    }

    /// Total bytes of keyed and operator state.
    pub fn bytes(&self) -> usize {
        self.keyed
            .values()
            .flat_map(|t| t.iter().map(|(_, b)| b.len()))
            .sum::<usize>()
            + self.operator.as_ref().map_or(0, |b| b.len())
    }
}

/// The state a subtask restores from: keyed state of its key groups and the operator
/// state of the old subtasks assigned to it.
#[derive(Debug, Clone, Default)]
pub struct RestoreState {
    /// The checkpoint restored from.
    pub checkpoint: Option<CheckpointId>,
    /// Keyed state: table name → entries of the key groups this subtask owns.
    pub keyed: BTreeMap<String, KeyGroupBlobs>,
    /// Operator state of every old subtask (sources redistribute their splits from it;
    /// each new subtask sees all of them and picks its share).
    pub operator: Vec<Vec<u8>>,
    /// The persistent-backend instances of the old subtasks whose key groups overlap this
    /// subtask's, with local copies of their files, to restore from.
    pub backend: Vec<RestoredInstance>,
    /// The event time to resume from: the minimum of the old subtasks' watermarks, or
    /// `None` when one of them had none (a checkpoint from before watermarks were stored).
    pub watermark: Option<crate::time::Timestamp>,
    /// Passes once the checkpoint restored from is known sound: a sink waits on it before
    /// it restores (and so commits) the checkpoint's pending output.
    pub verified: RestoreGate,
}

/// Waits until the checkpoint a job restores from is known sound.
///
/// A restore may start the job while the checkpoint's files are still being verified
/// (docs/checkpoints.md, section 4). Nothing may be committed from a checkpoint that turns
/// out corrupt, so a sink waits on the gate before it commits the output the checkpoint
/// pre-committed. The default gate is open.
///
/// ```
/// use weir_core::checkpoint::RestoreGate;
/// assert!(RestoreGate::default().wait().is_ok());
/// let bad = RestoreGate::new(|| Err(weir_core::Error::Config("000012.sst is corrupt".into())));
/// assert!(bad.wait().unwrap_err().to_string().contains("000012.sst"));
/// ```
#[derive(Clone, Default)]
pub struct RestoreGate(Option<std::sync::Arc<dyn Fn() -> crate::Result<()> + Send + Sync>>);

impl RestoreGate {
    /// A gate that passes when `wait` returns `Ok` (blocking until it knows).
    pub fn new(wait: impl Fn() -> crate::Result<()> + Send + Sync + 'static) -> Self {
        RestoreGate(Some(std::sync::Arc::new(wait)))
    }

    /// Blocks until the restored checkpoint is known sound (`Ok`) or not (the error says
    /// why).
    pub fn wait(&self) -> crate::Result<()> {
        self.0.as_ref().map_or(Ok(()), |wait| wait())
    }
}

impl std::fmt::Debug for RestoreGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "RestoreGate(verifying)"
        } else {
            "RestoreGate(open)"
        })
    }
}

/// One old subtask's persistent-backend instance as a restore finds it: the key groups it
/// owned and its files, already on local disk (fetched from checkpoint storage, or the
/// copy the old process kept: local recovery).
#[derive(Debug, Clone, Default)]
pub struct RestoredInstance {
    /// The key groups the old subtask owned.
    pub key_groups: std::ops::Range<u32>,
    /// Its files: `path` is the local copy (whose file name is the backend's own name for
    /// it), `name` the name in checkpoint storage. A backend that keeps a file as it is
    /// names it the same in its next checkpoint, so that the file is not stored again.
    pub files: Vec<LocalFile>,
    /// The files are the copy the old process kept (local recovery), not ones fetched
    /// from checkpoint storage: if they do not restore, the copy may be what is damaged,
    /// so the failure is not [`Error::Unrestorable`](crate::Error::Unrestorable) and the
    /// next attempt fetches them.
    pub local_copy: bool,
}

/// Checkpoint hooks of an operator. Called on the subtask's thread, between records.
///
/// Ordering guarantees: `snapshot(n)` is called when barrier `n` has arrived on every
/// input (exactly-once mode; with unaligned checkpoints when the first barrier `n` arrives,
/// and the records in flight before the others are given to the operator after it, as
/// belonging to the next checkpoint) and before the barrier is forwarded downstream;
/// `notify_complete(n)` after checkpoint `n` is durable for the whole job (a sink commits
/// there); `notify_aborted(n)` when `n` will never complete.
pub trait Checkpointed {
    /// Captures the operator's state. Keep it short: copy or serialize, don't upload.
    fn snapshot(&mut self, id: CheckpointId) -> Result<OperatorSnapshot>;
    /// Checkpoint `id` completed.
    fn notify_complete(&mut self, id: CheckpointId) -> Result<()> {
        let _ = id;
        Ok(())
    }
    /// Checkpoint `id` was aborted.
    fn notify_aborted(&mut self, id: CheckpointId) -> Result<()> {
        let _ = id;
        Ok(())
    }
    /// The size of the live state these hooks snapshot, in bytes, if known (the keyed
    /// state backend's estimate). Asked at most once a second, on the task's thread.
    fn state_bytes(&self) -> Option<u64> {
        None
    }
}

/// One registered participant of a task.
pub struct Participant {
    /// The operator's stable id (uid or generated from its position in the graph).
    pub operator_id: String,
    /// The hooks.
    pub hooks: Rc<RefCell<dyn Checkpointed>>,
}

/// The participants of one task, in registration order (upstream before downstream).
#[derive(Clone, Default)]
pub struct Participants {
    inner: Rc<RefCell<Vec<Participant>>>,
}

impl Participants {
    /// Registers an operator's hooks.
    pub fn register(&self, operator_id: &str, hooks: Rc<RefCell<dyn Checkpointed>>) {
        self.inner.borrow_mut().push(Participant {
            operator_id: operator_id.to_string(),
            hooks,
        });
    }

    /// Snapshots every participant; snapshots of one operator are merged.
    pub fn snapshot(&self, id: CheckpointId) -> Result<BTreeMap<String, OperatorSnapshot>> {
        let mut out: BTreeMap<String, OperatorSnapshot> = BTreeMap::new();
        for p in self.inner.borrow().iter() {
            let s = p.hooks.borrow_mut().snapshot(id)?;
            let e = out.entry(p.operator_id.clone()).or_default();
            e.keyed.extend(s.keyed);
            e.files.extend(s.files);
            e.deferred.extend(s.deferred);
            if s.operator.is_some() {
                e.operator = s.operator;
                e.description = s.description;
            }
            if s.watermark.is_some() {
                e.watermark = s.watermark;
            }
        }
        Ok(out)
    }

    /// The live state size each operator's participants know of (see
    /// [`Checkpointed::state_bytes`]), summed per operator id; operators that know none
    /// are left out.
    pub fn state_bytes(&self) -> BTreeMap<String, u64> {
        let mut out: BTreeMap<String, u64> = BTreeMap::new();
        for p in self.inner.borrow().iter() {
            if let Some(b) = p.hooks.borrow().state_bytes() {
                *out.entry(p.operator_id.clone()).or_default() += b;
            }
        }
        out
    }

    /// Tells every participant that `id` completed.
    pub fn notify_complete(&self, id: CheckpointId) -> Result<()> {
        for p in self.inner.borrow().iter() {
            p.hooks.borrow_mut().notify_complete(id)?;
        }
        Ok(())
    }

    /// Tells every participant that `id` was aborted.
    pub fn notify_aborted(&self, id: CheckpointId) -> Result<()> {
        for p in self.inner.borrow().iter() {
            p.hooks.borrow_mut().notify_aborted(id)?;
        }
        Ok(())
    }

    /// Number of participants.
    pub fn len(&self) -> usize {
        self.inner.borrow().len()
    }

    /// True when no operator registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
