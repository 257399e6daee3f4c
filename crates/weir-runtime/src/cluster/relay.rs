//! Relays a worker's task reports (acknowledgements, sources finished, tasks ended) to the
//! coordinator, one lane per task.
//!
//! A task's acknowledgement can wait: its files are read (or stored in object storage)
//! once its state backend has written them, and a backend's snapshot can hang. With one
//! relay for all the worker's tasks, such an acknowledgement held back every later report
//! of the worker's other tasks, and the coordinator, cancelling the attempt, named them
//! all as not stopped. Each task's reports now go through a thread of its own, in the
//! order the task sent them; a waiting acknowledgement delays only its own task's.

use super::sent::{SentFiles, ack_files, resolve_files};
use super::wire::{WireError, WireEvent};
use super::worker_attempt::send_event;
use crate::TaskStats;
use crate::task::TaskEvent;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex};
use weir_core::Error;

/// One task's reports on their way to its relay thread.
type Lane = (
    crossbeam_channel::Sender<TaskEvent>,
    std::thread::JoinHandle<()>,
);

/// Where one attempt's task reports go, and what relaying them needs.
pub(super) struct Relay {
    pub(super) attempt: u64,
    pub(super) out: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    pub(super) stats: Arc<Mutex<HashMap<(usize, usize), TaskStats>>>,
    /// Which checkpoint files the coordinator holds for each task.
    pub(super) sent: Arc<Mutex<SentFiles>>,
    /// By task index: (head, subtask), the task's name, whether it is a source.
    pub(super) keys: Vec<((usize, usize), String, bool)>,
    /// The checkpoint storage the worker stores its tasks' files in, when checkpoints are
    /// on object storage; `None`: the files go to the coordinator.
    pub(super) storage: Option<(
        weir_checkpoint::CheckpointStorage,
        crate::checkpoints::OperatorNames,
    )>,
    /// Held while one lane stores an acknowledgement's files in `storage`.
    pub(super) storing: Mutex<()>,
}

impl Relay {
    /// Starts relaying `events` until every task's sender is gone: a thread that hands each
    /// report to its task's lane, starting the lane at the task's first report.
    pub(super) fn start(
        self,
        events: crossbeam_channel::Receiver<TaskEvent>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let relay = Arc::new(self);
        std::thread::Builder::new()
            .name("weir-worker-events".into())
            .spawn(move || {
                let mut lanes: HashMap<usize, Lane> = HashMap::new();
                for ev in events {
                    let lane = match lanes.entry(task_of(&ev)) {
                        Entry::Occupied(lane) => lane.into_mut(),
                        Entry::Vacant(slot) => match relay.lane(*slot.key()) {
                            Ok(lane) => slot.insert(lane),
                            Err(e) => {
                                // No thread for it: relay here, as before lanes.
                                tracing::warn!(error = %e, "cannot start a task's report relay");
                                relay.relay(ev);
                                continue;
                            }
                        },
                    };
                    let _ = lane.0.send(ev);
                }
                // Every task has ended: each lane relays what it holds and ends. Waiting
                // for them keeps this thread (which the attempt waits for when it stops)
                // running until every report is out.
                for (_, (tx, thread)) in lanes {
                    drop(tx);
                    let _ = thread.join();
                }
            })
    }

    /// A thread relaying one task's reports in order; ends when the sender is dropped.
    fn lane(self: &Arc<Self>, task: usize) -> std::io::Result<Lane> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let relay = self.clone();
        let thread = std::thread::Builder::new()
            .name(format!("weir-task-events-{task}"))
            .spawn(move || {
                for ev in rx {
                    relay.relay(ev);
                }
            })?;
        Ok((tx, thread))
    }

    /// Sends one report to the coordinator (an acknowledgement with its files, or their
    /// references in object storage).
    fn relay(&self, ev: TaskEvent) {
        let attempt = self.attempt;
        match ev {
            TaskEvent::Ack {
                task,
                id,
                mut snapshot,
                alignment,
                sync,
            } => {
                let ((h, s), _, _) = &self.keys[task];
                let (files, failed, stored) = match &self.storage {
                    Some((storage, names)) => {
                        self.store_acknowledged((storage, names), id, *s, &mut snapshot)
                    }
                    None => {
                        let (files, failed) = ack_files(&mut snapshot, &self.sent, (*h, *s), id.0);
                        (files, failed, Vec::new())
                    }
                };
                send_event(
                    &self.out,
                    attempt,
                    *h,
                    *s,
                    WireEvent::Ack {
                        id: id.0,
                        snapshot,
                        files,
                        failed,
                        stored,
                        alignment_us: alignment.as_micros() as u64,
                        sync_us: sync.as_micros() as u64,
                    },
                );
            }
            TaskEvent::SourceFinished { task } => {
                let ((h, s), _, _) = &self.keys[task];
                send_event(&self.out, attempt, *h, *s, WireEvent::SourceFinished);
            }
            TaskEvent::Done { task, result } => {
                let ((h, s), name, is_source) = &self.keys[task];
                let (records, error) = match result {
                    Ok(Ok(n)) => (n, None),
                    Ok(Err(e)) => (0, Some(WireError::from_error(&e))),
                    Err(p) => (0, Some(WireError::from_error(&Error::from_panic(p)))),
                };
                self.stats.lock().unwrap_or_else(|p| p.into_inner()).insert(
                    (*h, *s),
                    TaskStats {
                        name: name.clone(),
                        subtask: *s,
                        records,
                        is_source: *is_source,
                    },
                );
                send_event(
                    &self.out,
                    attempt,
                    *h,
                    *s,
                    WireEvent::Done { records, error },
                );
            }
        }
    }

    /// Stores a task's snapshots of checkpoint `id` in object storage: the acknowledgement's
    /// references, or why it failed (the coordinator then fails the checkpoint).
    ///
    /// Waits for the files the task's state backends are still writing first, on the task's
    /// own lane; then stores them holding [`Relay::storing`], one acknowledgement at a time: a
    /// process writes a checkpoint's files through one writer at a time.
    fn store_acknowledged(
        &self,
        (storage, names): (
            &weir_checkpoint::CheckpointStorage,
            &crate::checkpoints::OperatorNames,
        ),
        id: weir_core::ids::CheckpointId,
        subtask: usize,
        snapshot: &mut std::collections::BTreeMap<String, weir_core::checkpoint::OperatorSnapshot>,
    ) -> AckFiles {
        let stored = resolve_files(snapshot).and_then(|()| {
            let _one = self.storing.lock().unwrap_or_else(|p| p.into_inner());
            crate::checkpoints::store_task_snapshots(storage, names, id, subtask, snapshot).map_err(
                |e| {
                    tracing::warn!(checkpoint = id.0, error = %e, "storing checkpoint files failed");
                    format!("storing them in {} failed: {e}", storage.dir().display())
                },
            )
        });
        match stored {
            Ok(()) => {
                let stored = snapshot
                    .iter_mut()
                    .filter_map(|(op, snap)| snap.stored.take().map(|s| (op.clone(), s)))
                    .collect();
                (Vec::new(), None, stored)
            }
            Err(reason) => {
                for snap in snapshot.values_mut() {
                    *snap = weir_core::checkpoint::OperatorSnapshot::default();
                }
                (Vec::new(), Some(reason), Vec::new())
            }
        }
    }
}

/// What an acknowledgement carries: files sent to the coordinator, why they could not be
/// produced, references to files stored in object storage.
type AckFiles = (
    Vec<(String, Vec<u8>)>,
    Option<String>,
    Vec<(String, weir_core::checkpoint::StoredSnapshot)>,
);

/// The task a report is from.
fn task_of(ev: &TaskEvent) -> usize {
    match ev {
        TaskEvent::Ack { task, .. }
        | TaskEvent::SourceFinished { task }
        | TaskEvent::Done { task, .. } => *task,
    }
}
