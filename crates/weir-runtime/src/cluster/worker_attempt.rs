//! One attempt's share on a worker: starting its tasks (restoring their state, wiring the
//! channels that cross to other workers), relaying their reports to the coordinator,
//! storing their checkpoint files when checkpoints are on object storage, and stopping
//! them when the attempt ends.
//!
//! Does not talk to the coordinator's connection itself; `worker` hands it the messages.

use super::data::{DataPlane, RemoteLink};
use super::relay::Relay;
use super::sent::SentFiles;
use super::wire::{self, Deploy, Wire, WireError, WireEvent};
use super::worker_restore::{operators_of, restore, restored_files};
use crate::TaskStats;
use crate::job::{Commands, Subset};
use crate::task::{JobShared, StartGate, TaskCommand};
use crossbeam_channel::Sender;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use weir_core::{Error, Result};

/// One attempt's share on this worker.
pub(super) struct WorkerAttempt {
    pub(super) attempt: u64,
    pub(super) cancel: Arc<AtomicBool>,
    pub(super) gate: Option<Arc<StartGate>>,
    pub(super) commands: HashMap<(usize, usize), Sender<TaskCommand>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    restore_dir: Option<PathBuf>,
    /// Which checkpoint files the coordinator holds for each task.
    sent: Arc<Mutex<SentFiles>>,
}

impl WorkerAttempt {
    fn idle(attempt: u64) -> Self {
        WorkerAttempt {
            attempt,
            cancel: Arc::new(AtomicBool::new(false)),
            gate: None,
            commands: HashMap::new(),
            threads: Vec::new(),
            restore_dir: None,
            sent: Arc::default(),
        }
    }

    pub(super) fn sent(&self) -> std::sync::MutexGuard<'_, SentFiles> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cancels the tasks and waits for them, each for at most `timeout` after the call
    /// (zero: without end); a task still running then is stuck in a call that does not
    /// return, and its thread is left behind, as the coordinator left it behind already.
    pub(super) fn stop(self, timeout: std::time::Duration) {
        self.cancel.store(true, Ordering::SeqCst);
        let deadline = (!timeout.is_zero()).then(|| std::time::Instant::now() + timeout);
        let mut stuck = Vec::new();
        for t in self.threads {
            while let Some(d) = deadline
                && !t.is_finished()
                && std::time::Instant::now() < d
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            if deadline.is_none() || t.is_finished() {
                let _ = t.join();
            } else {
                stuck.push(t.thread().name().unwrap_or("a task").to_string());
            }
        }
        if !stuck.is_empty() {
            tracing::error!(
                attempt = self.attempt,
                "{} did not stop within {timeout:?} of being cancelled; left behind (stuck \
                 in a call that does not return)",
                stuck.join(", ")
            );
            // Their restore directory may still be in use.
            return;
        }
        if let Some(d) = self.restore_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Starts this worker's share of an attempt. Failures are reported to the coordinator as
/// failures of the tasks, which restarts the attempt.
pub(super) fn start_attempt(
    job: &Arc<JobShared>,
    data: &DataPlane,
    me: u32,
    d: Deploy,
    out: &tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    stats: &Arc<Mutex<HashMap<(usize, usize), TaskStats>>>,
) -> WorkerAttempt {
    let attempt = d.attempt;
    // The tasks' events carry the worker and the coordinator's attempt number.
    let _span = tracing::info_span!("attempt", cluster_attempt = attempt, worker = me).entered();
    let local: HashSet<(usize, usize)> = d
        .tasks
        .iter()
        .filter(|(_, _, w)| *w == me)
        .map(|(h, s, _)| (*h as usize, *s as usize))
        .collect();
    if local.is_empty() {
        data.clear(attempt);
        return WorkerAttempt::idle(attempt);
    }
    let fail = |e: &Error| {
        for (h, s) in &local {
            send_event(
                out,
                attempt,
                *h,
                *s,
                WireEvent::Done {
                    records: 0,
                    error: Some(WireError::from_error(e)),
                },
            );
        }
    };
    let mut restore_dir = None;
    let mut map = crate::checkpoints::RestoreMap::new();
    let mut restored_from = None;
    if let Some(path) = &d.restore {
        let dir = crate::job::restore_scratch_dir();
        restore_dir = Some(dir.clone());
        let restored = tracing::info_span!("restore", path = %path.display())
            .in_scope(|| restore(job, path, &dir, &operators_of(job, &local)));
        match restored {
            Ok((m, manifest)) => {
                map = m;
                restored_from = Some(manifest);
            }
            Err(e) => {
                fail(&e);
                let mut a = WorkerAttempt::idle(attempt);
                a.restore_dir = restore_dir;
                return a;
            }
        }
    }
    // The files each task was restored with are in checkpoint storage already: its first
    // acknowledgement leaves out those it still uses (a savepoint's are its own copies).
    let sent: Arc<Mutex<SentFiles>> = Arc::default();
    if restored_from
        .as_ref()
        .is_some_and(|m| !m.kind.is_savepoint())
    {
        let mut sent = sent.lock().unwrap_or_else(|p| p.into_inner());
        for (task, names) in restored_files(job, &map, &local) {
            sent.restored(task, names);
        }
    }
    let built_out = out.clone();
    let gate = Arc::new(StartGate::clustered(
        local.len(),
        Box::new(move || {
            let _ = built_out.send(wire::encode(&Wire::Built { attempt }));
        }),
    ));
    let mut links = Vec::new();
    let launched = crate::job::launch_local(
        job,
        map,
        Some(Subset {
            local: &local,
            links: &mut |key, link| links.push((key, link)),
            start: gate.clone(),
        }),
    );
    let launched = match launched {
        Ok(l) => l,
        Err(e) => {
            fail(&e);
            let mut a = WorkerAttempt::idle(attempt);
            a.restore_dir = restore_dir;
            return a;
        }
    };
    let placement: HashMap<(usize, usize), u32> = d
        .tasks
        .iter()
        .map(|(h, s, w)| ((*h as usize, *s as usize), *w))
        .collect();
    let remote: Vec<RemoteLink> = links
        .into_iter()
        .map(|(key, link)| {
            let consumer = (key.node as usize, key.consumer as usize);
            let from = job.graph.nodes[key.node as usize].inputs[key.gate as usize]
                .from
                .0;
            let producer = (job.plan.head_of[from], key.producer as usize);
            let outgoing = local.contains(&producer);
            let peer = placement[if outgoing { &consumer } else { &producer }];
            RemoteLink {
                key,
                link,
                outgoing,
                peer,
            }
        })
        .collect();
    let addresses: HashMap<u32, String> = d.workers.iter().cloned().collect();
    let mut threads = launched.threads;
    let cancel = launched.cancel.clone();
    match data.wire_attempt(
        attempt,
        me,
        &addresses,
        remote,
        &cancel,
        &job.cfg.exchange_config(),
    ) {
        Ok(t) => threads.extend(t),
        Err(e) => {
            // The tasks are running: cancelling them makes each report its end; the
            // coordinator learns the cause from this report.
            cancel.store(true, Ordering::SeqCst);
            if let Some((h, s)) = local.iter().next() {
                send_event(
                    out,
                    attempt,
                    *h,
                    *s,
                    WireEvent::Done {
                        records: 0,
                        error: Some(WireError::from_error(&e)),
                    },
                );
            }
        }
    }
    let mut commands = HashMap::new();
    let mut keys = Vec::new();
    for r in &launched.running {
        let key = (r.key.node.0, r.key.subtask.0);
        keys.push((key, r.name.clone(), r.is_source));
        if let Commands::Local(s) = &r.commands {
            commands.insert(key, s.clone());
        }
    }
    // With checkpoints on object storage this worker stores its tasks' files itself and
    // acknowledges with references; otherwise it sends them to the coordinator.
    let task_storage = match task_storage(job, restored_from.as_ref()) {
        Ok(s) => s,
        Err(e) => {
            cancel.store(true, Ordering::SeqCst);
            fail(&e);
            None
        }
    };
    // Relays the tasks' reports to the coordinator.
    let relay = Relay {
        attempt,
        out: out.clone(),
        stats: stats.clone(),
        sent: sent.clone(),
        keys,
        storage: task_storage,
        storing: Mutex::new(()),
    };
    let forwarder = relay.start(launched.events);
    match forwarder {
        Ok(t) => threads.push(t),
        Err(e) => {
            cancel.store(true, Ordering::SeqCst);
            tracing::error!(error = %e, "cannot start the event relay thread");
        }
    }
    WorkerAttempt {
        attempt,
        cancel,
        gate: Some(gate),
        commands,
        threads,
        restore_dir,
        sent,
    }
}

/// The checkpoint storage this worker stores its tasks' files in, when the job's
/// checkpoints are on object storage (with the operators' names for the file names); `None`
/// in a directory, whose files go to the coordinator's staging area. When the attempt
/// restored checkpoint `restored`, that storage knows its files are stored: the first
/// checkpoint uploads only what changed since.
fn task_storage(
    job: &JobShared,
    restored: Option<&weir_checkpoint::Manifest>,
) -> Result<
    Option<(
        weir_checkpoint::CheckpointStorage,
        crate::checkpoints::OperatorNames,
    )>,
> {
    let Some(cfg) = &job.cfg.checkpoint else {
        return Ok(None);
    };
    if !cfg.dir.to_str().is_some_and(weir_objstore::is_url) {
        return Ok(None);
    }
    let storage = weir_checkpoint::CheckpointStorage::open(&cfg.dir).map_err(|e| {
        Error::Config(format!(
            "this worker cannot open checkpoint storage {}: {e}; every process needs the \
             same object storage settings (AWS_* environment variables)",
            cfg.dir.display()
        ))
    })?;
    if let Some(m) = restored {
        storage.remember_restored(m);
    }
    let names = crate::checkpoints::OperatorNames::new(&job.graph, &job.plan);
    Ok(Some((storage, names)))
}

pub(super) fn send_event(
    out: &tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    attempt: u64,
    head: usize,
    subtask: usize,
    event: WireEvent,
) {
    let _ = out.send(wire::encode(&Wire::Event {
        attempt,
        head: head as u32,
        subtask: subtask as u32,
        event,
    }));
}
