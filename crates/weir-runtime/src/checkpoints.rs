//! Glue between running tasks and checkpoint storage: writing a completed checkpoint
//! (state files, then the manifest) and turning a stored checkpoint back into the
//! per-subtask [`RestoreState`] of a job, at any parallelism.

use crate::plan::Plan;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use weir_checkpoint::{
    CheckpointKind, CheckpointStorage, Manifest, OperatorManifest, SubtaskManifest, TaskKey,
};
use weir_core::checkpoint::{OperatorSnapshot, RestoreState, StoredFile, StoredSnapshot};
use weir_core::data::key_group_range;
use weir_core::graph::Graph;
use weir_core::ids::CheckpointId;
use weir_core::{Error, Result, codec};

/// Restored state by node index, then by new subtask index.
pub(crate) type RestoreMap = HashMap<usize, Vec<RestoreState>>;

pub(crate) fn storage_err(e: weir_checkpoint::Error) -> Error {
    match &e {
        // Object storage that failed after its retries may work again (a server that
        // restarts): not a configuration error, so a restart of the job tries again.
        weir_checkpoint::Error::ObjectStore(s) if s.is_transient() => {
            Error::io("checkpoint storage", std::io::Error::other(e.to_string()))
        }
        _ => Error::Config(e.to_string()),
    }
}

/// What a manifest records of each operator, by operator id: node index, display name and
/// parallelism. Owned, so that a checkpoint can be written on another thread.
pub(crate) struct OperatorNames(HashMap<String, (usize, String, usize)>);

impl OperatorNames {
    /// The node index of operator `op_id`.
    fn node(&self, op_id: &str) -> Result<usize> {
        self.0.get(op_id).map(|(node, _, _)| *node).ok_or_else(|| {
            Error::Config(format!("internal: snapshot of unknown operator '{op_id}'"))
        })
    }

    pub(crate) fn new(graph: &Graph, plan: &Plan) -> Self {
        OperatorNames(
            graph
                .nodes
                .iter()
                .map(|n| {
                    (
                        n.operator_id(),
                        (n.id.0, n.name.clone(), plan.parallelism[n.id.0]),
                    )
                })
                .collect(),
        )
    }
}

/// Writes checkpoint `id` from the tasks' acknowledgements; returns its path and the bytes
/// it wrote (files it shares with earlier checkpoints not counted).
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_checkpoint(
    storage: &CheckpointStorage,
    job_name: &str,
    names: &OperatorNames,
    max_parallelism: usize,
    id: CheckpointId,
    kind: CheckpointKind,
    stops_job: bool,
    acks: Vec<(TaskKey, BTreeMap<String, OperatorSnapshot>)>,
    stats: &weir_checkpoint::CheckpointStats,
    abandoned: &std::sync::atomic::AtomicBool,
) -> Result<(PathBuf, u64)> {
    let writer = storage.begin(id, kind).map_err(storage_err)?;
    let mut operators: BTreeMap<usize, OperatorManifest> = BTreeMap::new();
    // Sizes of what this checkpoint writes, and of everything it references.
    let mut written = 0u64;
    // Files workers stored themselves (checkpoints on object storage, in a cluster).
    let mut adopted = false;
    let mut pieces: Vec<(usize, String, OperatorSnapshot)> = Vec::new();
    // In-flight records of an unaligned checkpoint (a task that took it unaligned stores
    // the table, empty or not).
    let mut channel_state_bytes = 0u64;
    let mut unaligned = false;
    for (task, snapshots) in acks {
        for (op_id, mut snap) in snapshots {
            if let Some(t) = snap.keyed.get(weir_core::exchange::CHANNEL_STATE_TABLE) {
                unaligned = true;
                channel_state_bytes += t.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
                if t.is_empty() {
                    snap.keyed.remove(weir_core::exchange::CHANNEL_STATE_TABLE);
                }
            }
            pieces.push((task.subtask.0, op_id, snap));
        }
    }
    // Each snapshot's files are stored independently of the others': several at once, since
    // on object storage every file is a request that mostly waits for the network.
    let stored = parallel_map(
        &mut pieces,
        STORE_THREADS,
        |(subtask, op_id, snap)| match snap.stored.take() {
            Some(stored) => {
                let node = names.node(op_id)?;
                let entries = stored
                    .files
                    .iter()
                    .map(|f| writer.adopt(&stored_entry(f)))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(storage_err)?;
                Ok((node, entries, stored.written, true))
            }
            None => {
                let (node, entries, bytes) = store_snapshot(&writer, names, *subtask, op_id, snap)?;
                Ok((node, entries, bytes, false))
            }
        },
    );
    for ((subtask, op_id, snap), result) in pieces.into_iter().zip(stored) {
        let (node, entries, bytes, by_worker) = result?;
        written += bytes;
        adopted |= by_worker;
        let (_, op_name, parallelism) = &names.0[&op_id];
        let op = operators.entry(node).or_insert_with(|| OperatorManifest {
            uid: op_id.clone(),
            name: op_name.clone(),
            parallelism: *parallelism,
            subtasks: Vec::new(),
        });
        op.subtasks.push(SubtaskManifest {
            subtask,
            files: entries,
            operator_state: snap.description.map(serde_json::Value::String),
            watermark: snap.watermark,
        });
    }
    let full: u64 = operators
        .values()
        .flat_map(|o| &o.subtasks)
        .flat_map(|s| &s.files)
        .map(|f| f.size)
        .sum::<u64>();
    if kind.is_savepoint() {
        // Every file is written; the savepoint exists once its manifest is.
        crate::failpoint::hit("savepoint.before_metadata");
    }
    let mut manifest = Manifest::new(job_name, id, kind, max_parallelism);
    manifest.stops_job = stops_job;
    manifest.stats = stats.into();
    manifest.stats.bytes = written;
    manifest.stats.full_bytes = full;
    manifest.stats.channel_state_bytes = channel_state_bytes;
    manifest.stats.unaligned = unaligned;
    manifest.operators = operators
        .into_values()
        .map(|mut o| {
            o.subtasks.sort_by_key(|s| s.subtask);
            o
        })
        .collect();
    if abandoned.load(std::sync::atomic::Ordering::SeqCst) {
        // The attempt that took it ended without waiting for it (its tasks were stuck):
        // the job may already run from an older checkpoint, so this one must not appear.
        return Err(Error::User(format!(
            "checkpoint {id} was not completed: the attempt that took it was abandoned"
        )));
    }
    let path = writer.finish(manifest).map_err(storage_err)?;
    if adopted && kind.is_savepoint() {
        // The savepoint holds copies: the workers' objects of this id are not needed.
        if let Err(e) = storage.discard(id) {
            tracing::warn!(checkpoint = %id, error = %e, "removing the workers' files of a savepoint failed");
        }
    }
    if stops_job {
        // The sinks commit up to this savepoint next: no older point of this directory may
        // be restored afterwards, even when the savepoint is moved away.
        storage.record_stop(id, &path).map_err(storage_err)?;
    }
    Ok((path, written))
}

/// Stores one operator's snapshot of one subtask through `writer`: its state file, then the
/// state backend's files (each immutable one stored once). Returns the operator's node, the
/// entries, and the bytes written.
/// Snapshots stored at once by [`write_checkpoint`].
const STORE_THREADS: usize = 8;

/// Files of one snapshot stored at once.
const FILE_THREADS: usize = 4;

/// `f` over every item, on up to `threads` threads; the results in the items' order.
fn parallel_map<T: Send, R: Send>(
    items: &mut [T],
    threads: usize,
    f: impl Fn(&mut T) -> Result<R> + Sync,
) -> Vec<Result<R>> {
    if items.len() <= 1 || threads <= 1 {
        return items.iter_mut().map(f).collect();
    }
    let queue = std::sync::Mutex::new(items.iter_mut().enumerate());
    let results = std::sync::Mutex::new(Vec::with_capacity(queue.lock().unwrap().len()));
    std::thread::scope(|scope| {
        for _ in 0..threads.min(queue.lock().unwrap().len()) {
            scope.spawn(|| {
                loop {
                    let next = queue.lock().unwrap_or_else(|p| p.into_inner()).next();
                    let Some((i, item)) = next else { break };
                    let r = f(item);
                    results
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((i, r));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

fn store_snapshot(
    writer: &weir_checkpoint::CheckpointWriter,
    names: &OperatorNames,
    subtask: usize,
    op_id: &str,
    snap: &mut OperatorSnapshot,
) -> Result<(usize, Vec<weir_checkpoint::FileEntry>, u64)> {
    // The backend's asynchronous part may still be writing its files.
    snap.resolve_files()?;
    let node = names.node(op_id)?;
    let bytes = encode_state_file(snap)?;
    let name = format!("op{node}-{subtask}.state");
    // The state file first: on object storage it makes the checkpoint visible before any
    // shared file is touched (the writer makes sure of that anyway).
    let mut entries = vec![writer.write_file(&name, &bytes).map_err(storage_err)?];
    let mut written = bytes.len() as u64;
    // The asynchronous part: persistent-backend files, each immutable one stored once.
    // Storage knows which shared files it still holds (retention may have deleted one since
    // an earlier checkpoint stored it); savepoints copy every file.
    // Several files at once: on object storage each is a request that mostly waits.
    let mut files: Vec<&weir_core::checkpoint::LocalFile> = snap.files.iter().collect();
    let stored = parallel_map(&mut files, FILE_THREADS, |f| {
        let reused = if f.shared {
            writer.reuse_shared(&f.name).map_err(storage_err)?
        } else {
            None
        };
        Ok(match reused {
            Some(e) => (e, 0),
            None => {
                // Shared files are immutable: linked into storage where it can.
                let e = if f.shared {
                    writer.link_shared(&f.name, &f.path)
                } else {
                    writer.write_file_from(&f.name, &f.path)
                }
                .map_err(storage_err)?;
                let size = e.size;
                (e, size)
            }
        })
    });
    for r in stored {
        let (entry, bytes) = r?;
        written += bytes;
        entries.push(entry);
    }
    Ok((node, entries, written))
}

/// A worker of a cluster whose checkpoints are on object storage: stores a task's
/// snapshots for checkpoint `id` itself
/// ([`CheckpointStorage::task_files`](weir_checkpoint::CheckpointStorage::task_files)) and
/// leaves in each only what the acknowledgement carries: its description, its watermark,
/// and what was stored ([`OperatorSnapshot::stored`]). The coordinator lists the files in
/// the manifest it writes.
pub(crate) fn store_task_snapshots(
    storage: &CheckpointStorage,
    names: &OperatorNames,
    id: CheckpointId,
    subtask: usize,
    snapshots: &mut BTreeMap<String, OperatorSnapshot>,
) -> Result<()> {
    let writer = storage.task_files(id).map_err(storage_err)?;
    for (op_id, snap) in snapshots.iter_mut() {
        let (_, entries, written) = store_snapshot(&writer, names, subtask, op_id, snap)?;
        *snap = OperatorSnapshot {
            description: snap.description.take(),
            watermark: snap.watermark,
            stored: Some(StoredSnapshot {
                files: entries
                    .into_iter()
                    .map(|e| StoredFile {
                        name: e.name,
                        size: e.size,
                        crc32: e.crc32,
                        shared: e.shared,
                        objects: e.objects,
                    })
                    .collect(),
                written,
            }),
            ..OperatorSnapshot::default()
        };
    }
    Ok(())
}

/// The manifest entry of a file a worker stored.
fn stored_entry(f: &StoredFile) -> weir_checkpoint::FileEntry {
    weir_checkpoint::FileEntry {
        name: f.name.clone(),
        size: f.size,
        crc32: f.crc32,
        shared: f.shared,
        objects: f.objects.clone(),
    }
}

/// Finds the checkpoint to restore from: the explicit path, or the latest complete recovery
/// point of the directory (a checkpoint, or a savepoint that stopped the job).
///
/// Never starts over silently: when the directory holds complete checkpoints and none of
/// them verifies, it fails naming each one and why, unless `start_fresh_if_unusable`; and
/// when the job last stopped with a savepoint that is no longer among the recovery points,
/// it fails naming that savepoint, since an older point would replay committed output.
///
/// With `unread`, the latest checkpoint's files are checked for their sizes only (their
/// checksums are then the caller's to verify while the job runs); an explicit path is
/// always verified in full. The checkpoints in `refused` (directory → how restoring it
/// failed) are skipped like corrupt ones: their files verified, but their state did not
/// restore.
pub(crate) fn find_restore(
    storage: &CheckpointStorage,
    explicit: Option<&Path>,
    start_fresh_if_unusable: bool,
    unread: bool,
    refused: &BTreeMap<PathBuf, String>,
) -> Result<Option<(Manifest, PathBuf)>> {
    if let Some(p) = explicit {
        let m = storage.load(p).map_err(storage_err)?;
        let dir = if p.file_name().is_some_and(|n| n == "_metadata") {
            p.parent().unwrap_or(p)
        } else {
            p
        };
        return Ok(Some((m, dir.to_path_buf())));
    }
    let latest = storage
        .latest_complete_by(|path| match refused.get(path) {
            Some(problem) => Err(weir_checkpoint::Error::DoesNotRestore {
                checkpoint: path.to_path_buf(),
                problem: problem.clone(),
            }),
            None if unread => storage.load_unread(path),
            None => storage.load(path),
        })
        .map_err(storage_err)?;
    for s in &latest.skipped {
        let what = match s.error {
            weir_checkpoint::Error::DoesNotRestore { .. } => "",
            _ => "corrupt ",
        };
        tracing::warn!(
            path = %s.path.display(),
            error = %s.error,
            "skipping {what}checkpoint {}: {}",
            s.path.display(),
            s.error
        );
    }
    let found = latest.checkpoint.as_ref().map(|c| c.manifest.checkpoint_id);
    if let Some(stop) = storage.stop_record().map_err(storage_err)?
        && found.is_none_or(|id| id < stop.checkpoint_id)
    {
        let instead = match &latest.checkpoint {
            Some(c) => format!(
                "only checkpoint {} ({})",
                c.manifest.checkpoint_id,
                c.path.display()
            ),
            None => "no checkpoint that can be restored".to_string(),
        };
        return Err(Error::Config(format!(
            "the job last stopped with savepoint {} ({}), and its sinks committed output up to it, but checkpoint directory {} now holds {instead}{}: restoring an older point would write that output again. Resume from that savepoint or a copy of it (restore_from, file_sum --from-savepoint PATH)",
            stop.checkpoint_id,
            stop.path.display(),
            storage.dir().display(),
            if refused.contains_key(&stop.path) {
                " (the savepoint's state cannot be restored)"
            } else if stop.path.join("_metadata").exists() {
                " (the savepoint does not verify)"
            } else {
                ""
            },
        )));
    }
    if latest.checkpoint.is_none() && !latest.skipped.is_empty() {
        let each: Vec<String> = latest
            .skipped
            .iter()
            .map(|s| format!("  {}: {}", s.path.display(), s.error))
            .collect();
        if !start_fresh_if_unusable {
            return Err(Error::Config(format!(
                "checkpoint directory {} holds {} complete checkpoint(s), and none can be restored:\n{}\nStarting from scratch would process the input again and duplicate what the sinks already committed. Restore a savepoint explicitly (restore_from), or, to start from scratch anyway, set CheckpointConfig::start_fresh_if_unusable (file_sum --start-fresh-if-unusable)",
                storage.dir().display(),
                latest.skipped.len(),
                each.join("\n")
            )));
        }
        tracing::warn!(
            dir = %storage.dir().display(),
            "no checkpoint in {} can be restored; starting from scratch as configured (start_fresh_if_unusable):\n{}",
            storage.dir().display(),
            each.join("\n")
        );
    }
    Ok(latest.checkpoint.map(|c| (c.manifest, c.path)))
}

/// The layout of a `.state` file: the snapshot without its watermark, which the manifest
/// holds (so files written before watermarks were stored decode unchanged).
type StateFile = (
    BTreeMap<String, weir_core::checkpoint::KeyGroupBlobs>,
    Option<Vec<u8>>,
    Option<String>,
    Vec<weir_core::checkpoint::LocalFile>,
);

fn encode_state_file(snap: &OperatorSnapshot) -> Result<Vec<u8>> {
    codec::encode(&(&snap.keyed, &snap.operator, &snap.description, &snap.files))
}

fn decode_state_file(bytes: &[u8]) -> Result<OperatorSnapshot> {
    let (keyed, operator, description, files): StateFile = codec::decode(bytes)?;
    Ok(OperatorSnapshot {
        keyed,
        operator,
        description,
        files,
        ..OperatorSnapshot::default()
    })
}

/// Loads every operator's snapshots and splits them for the job's current parallelism.
/// True when no subtask of `op` in the checkpoint at `path` holds state: no keyed state,
/// no operator state, no files beyond its state file; a watermark assigner's watermark
/// alone does not count.
fn holds_no_state(
    storage: &CheckpointStorage,
    path: &Path,
    op: &weir_checkpoint::OperatorManifest,
) -> Result<bool> {
    for st in &op.subtasks {
        if st.files.iter().any(|f| !f.name.ends_with(".state")) {
            return Ok(false);
        }
        for f in &st.files {
            let bytes = storage.read_file(path, f).map_err(storage_err)?;
            let snap = decode_state_file(&bytes).map_err(|e| {
                Error::Config(format!("{}: cannot decode {}: {e}", path.display(), f.name))
            })?;
            let empty = snap.keyed.is_empty() && snap.operator.is_none() && snap.files.is_empty();
            if !empty && !weir_core::watermark::is_watermark_only(&snap) {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Splits the checkpoint `manifest` at `path` for the job's current parallelism and brings
/// the state backends' files that the subtasks `runs` ((node, subtask) pairs; `None`: every
/// subtask, a process running the whole job) need into `local`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn restore_map(
    storage: &CheckpointStorage,
    manifest: &Manifest,
    path: &Path,
    graph: &Graph,
    plan: &Plan,
    max_parallelism: usize,
    local: &Path,
    local_recovery: bool,
    runs: Option<&HashSet<(usize, usize)>>,
) -> Result<RestoreMap> {
    if manifest.max_parallelism != max_parallelism {
        return Err(Error::Config(format!(
            "checkpoint {} at {} was taken with max parallelism {}, but the job now has {}: keyed state \
             cannot be redistributed across a different number of key groups; set max_parallelism back to {}",
            manifest.checkpoint_id,
            path.display(),
            manifest.max_parallelism,
            max_parallelism,
            manifest.max_parallelism
        )));
    }
    let ids: HashMap<String, usize> = graph
        .nodes
        .iter()
        .map(|n| (n.operator_id(), n.id.0))
        .collect();
    for op in &manifest.operators {
        if !ids.contains_key(&op.uid) {
            // An operator that kept nothing but its watermark (a `with_watermarks` that
            // the new version of the job no longer has) loses nothing by being left out.
            if holds_no_state(storage, path, op)? {
                tracing::info!(operator = %op.uid, "the checkpoint's operator is not in this job and held no state: left out");
                continue;
            }
            return Err(Error::Config(format!(
                "checkpoint {} holds state of operator '{}' ({}) that this job does not have; give the \
                 operator the same uid as before, or start without this checkpoint",
                manifest.checkpoint_id, op.uid, op.name
            )));
        }
    }
    let mut out = RestoreMap::new();
    let mut instances = Vec::new();
    for node in &graph.nodes {
        let Some(op) = manifest.operator(&node.operator_id()) else {
            continue;
        };
        let mut old: Vec<OperatorSnapshot> = Vec::with_capacity(op.subtasks.len());
        for st in &op.subtasks {
            let Some(state_file) = st.files.iter().find(|f| f.name.ends_with(".state")) else {
                continue;
            };
            let bytes = storage.read_file(path, state_file).map_err(storage_err)?;
            let snap = decode_state_file(&bytes).map_err(|e| {
                Error::Config(format!(
                    "{}: cannot decode {}: {e}",
                    path.display(),
                    state_file.name
                ))
            })?;
            if !snap.files.is_empty() {
                let entries = snap
                    .files
                    .iter()
                    .map(|f| {
                        st.files
                            .iter()
                            .find(|e| e.name == f.name)
                            .cloned()
                            .ok_or_else(|| {
                                Error::Config(format!(
                                    "checkpoint {} is missing file {} of operator '{}'",
                                    path.display(),
                                    f.name,
                                    op.uid
                                ))
                            })
                    })
                    .collect::<Result<Vec<_>>>()?;
                instances.push(backend_files::OldInstance {
                    node: node.id.0,
                    subtask: st.subtask,
                    key_groups: key_group_range(st.subtask, max_parallelism, op.parallelism),
                    files: snap.files.clone(),
                    entries,
                });
            }
            old.push(snap);
        }
        // Every old subtask's input had passed its own watermark, so all of them had passed
        // the minimum; a subtask without one (an older checkpoint) leaves none to resume from.
        let watermark = op
            .subtasks
            .iter()
            .map(|st| st.watermark)
            .collect::<Option<Vec<_>>>()
            .and_then(|w| w.into_iter().min());
        let p = plan.parallelism[node.id.0];
        let mut per_subtask = Vec::with_capacity(p);
        for s in 0..p {
            let range = key_group_range(s, max_parallelism, p);
            let mut r = RestoreState {
                checkpoint: Some(manifest.checkpoint_id),
                watermark,
                ..Default::default()
            };
            for snap in &old {
                for (table, blobs) in &snap.keyed {
                    let e = r.keyed.entry(table.clone()).or_default();
                    if table == weir_core::exchange::CHANNEL_STATE_TABLE {
                        // In-flight records: every subtask sees all of them and replays
                        // those the edge assigns to it (by key group, or by old subtask).
                        e.extend(blobs.iter().cloned());
                    } else {
                        e.extend(blobs.iter().filter(|(g, _)| range.contains(g)).cloned());
                    }
                }
                if let Some(op_state) = &snap.operator {
                    r.operator.push(op_state.clone());
                }
            }
            per_subtask.push(r);
        }
        out.insert(node.id.0, per_subtask);
    }
    // The backends' files: those of the old instances this process's subtasks need,
    // several files at once.
    let instances = backend_files::needed_by(instances, runs, &plan.parallelism, max_parallelism);
    let names: Vec<String> = instances
        .iter()
        .map(|i| format!("{} {}", graph.nodes[i.node].operator_id(), i.subtask))
        .collect();
    let (instances, fetched) =
        backend_files::fetch(storage, path, instances, local, local_recovery)?;
    if fetched != backend_files::Fetched::default() {
        tracing::info!(
            local_copies = fetched.local,
            fetched_instances = fetched.fetched,
            fetched_files = fetched.files,
            fetched_bytes = fetched.bytes,
            old_subtasks = %names.join(", "),
            "restored the state backends' files"
        );
    }
    for (node, inst) in instances {
        let Some(subtasks) = out.get_mut(&node) else {
            continue;
        };
        let p = subtasks.len();
        for (s, r) in subtasks.iter_mut().enumerate() {
            let range = key_group_range(s, max_parallelism, p);
            if inst.key_groups.start < range.end && range.start < inst.key_groups.end {
                r.backend.push(inst.clone());
            }
        }
    }
    // The restored checkpoint's shared files are stored: the next checkpoint reuses them.
    storage.remember_restored(manifest);
    Ok(out)
}

mod backend_files;
#[cfg(test)]
mod tests;
