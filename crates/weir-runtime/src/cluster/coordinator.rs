//! The coordinator: accepts workers, places each attempt's tasks on their slots, relays
//! task events and checkpoint commands, declares silent workers lost, and answers
//! `weir cluster` requests. The job's attempt loop and checkpoint coordination are the
//! single-process ones ([`crate::job::run_with`]); this is their [`Executor`].
//! A worker's connection, from its admission to its loss, is `connection`'s.

mod admin;
mod connection;

use super::ClusterConfig;
use super::staging::Staging;
use super::wire::{self, Deploy, Wire};
use crate::job::{Commands, Executor, Launched, Running};
use crate::task::{JobShared, TaskCommand, TaskEvent};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::mpsc::UnboundedSender;
use weir_checkpoint::{CheckpointStorage, Manifest, TaskKey};
use weir_core::graph::NodeKind;
use weir_core::{Error, Result};

struct WorkerEntry {
    slots: u32,
    /// Where other workers reach its data listener.
    data: String,
    peer: SocketAddr,
    out: UnboundedSender<Vec<u8>>,
}

/// The current attempt, as the connection handlers see it.
struct Route {
    attempt: u64,
    /// Task index by (head, subtask).
    index: HashMap<(usize, usize), usize>,
    /// Worker of every task.
    worker_of: Vec<u32>,
    done: Vec<bool>,
    events: crossbeam_channel::Sender<TaskEvent>,
    /// Workers running tasks, and those that reported them built.
    workers: HashSet<u32>,
    built: HashSet<u32>,
    started: bool,
}

struct State {
    next_worker: u32,
    workers: BTreeMap<u32, WorkerEntry>,
    route: Option<Route>,
    phase: &'static str,
}

struct Shared {
    name: String,
    args: Vec<String>,
    fingerprint: u64,
    job: Arc<JobShared>,
    heartbeat: Duration,
    timeout: Duration,
    /// Checkpoint files received from workers (see `staging`).
    staging: Arc<Staging>,
    state: Mutex<State>,
    /// Woken when a worker joins or is lost.
    changed: crossbeam_channel::Sender<()>,
    stale_messages: weir_core::metrics::Counter,
    /// The attempt whose tasks' figures the REST API shows.
    figures_attempt: AtomicU64,
    workers_lost: weir_core::metrics::Counter,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs the job as the cluster's coordinator.
pub(crate) fn run(
    name: &str,
    job: Arc<JobShared>,
    listen: &str,
    workers: usize,
    args: Vec<String>,
    cfg: &ClusterConfig,
) -> Result<crate::JobResult> {
    let rt = super::runtime("coordinator")?;
    let listener = rt.block_on(TcpListener::bind(listen)).map_err(|e| {
        Error::Config(format!(
            "the coordinator cannot listen on {listen}: {e}; pick a free host:port"
        ))
    })?;
    let address = listener
        .local_addr()
        .map_err(|e| Error::io("the coordinator's listening socket", e))?;
    tracing::info!(
        job = name,
        address = %address,
        workers,
        "job '{name}': coordinator listening on {address}, waiting for {workers} worker(s)"
    );
    if !address.ip().is_loopback() {
        if job.cfg.tls.is_none() {
            tracing::warn!(
                "the cluster's connections are plain text on {address}: give \
                 every process TLS settings (--tls-dir) to encrypt them"
            );
        }
        if job.cfg.secret.is_none() {
            tracing::warn!(
                "anyone who reaches {address} can join this job as a worker: \
                 give every process the job's secret (--secret-file)"
            );
        }
    }
    let staging_root = staging_dir();
    let staging = Arc::new(Staging::new(staging_root.clone(), name)?);
    let (changed, changed_rx) = crossbeam_channel::unbounded();
    let labels = [("job", name)];
    let shared = Arc::new(Shared {
        name: name.to_string(),
        args,
        fingerprint: super::fingerprint(&job.graph, &job.plan, &job.cfg),
        job: job.clone(),
        heartbeat: cfg.heartbeat_interval,
        timeout: cfg.heartbeat_timeout,
        staging: staging.clone(),
        state: Mutex::new(State {
            next_worker: 0,
            workers: BTreeMap::new(),
            route: None,
            phase: "waiting for workers",
        }),
        changed,
        figures_attempt: AtomicU64::new(0),
        stale_messages: weir_core::metrics::counter(
            "cluster_stale_messages_total",
            "Messages from tasks of an older job attempt, dropped (zombie fencing).",
            &labels,
        ),
        workers_lost: weir_core::metrics::counter(
            "cluster_workers_lost_total",
            "Workers declared lost: connection closed or no heartbeat within the timeout.",
            &labels,
        ),
    });
    rt.spawn(connection::accept(listener, shared.clone()));
    // The REST API's view of the workers and slots (weak: the status outlives nothing here).
    let weak = Arc::downgrade(&shared);
    job.status.set_cluster_view(Box::new(move || {
        let Some(shared) = weak.upgrade() else {
            return serde_json::Value::Null;
        };
        let s = admin::status(&shared);
        serde_json::json!({
            "role": "coordinator",
            "address": address.to_string(),
            "phase": s["state"],
            "workers": s["workers"],
            "slots": s["slots"],
        })
    }));
    let mut executor = ClusterExecutor {
        shared: shared.clone(),
        changed: changed_rx,
        expected: workers,
        first: true,
        last_attempt: 0,
    };
    let result = crate::job::run_with(name, job, &mut executor);
    // Tell every worker the job is over, then give them a moment to read it.
    let error = result.as_ref().err().map(|e| e.to_string());
    {
        let mut st = shared.state();
        st.phase = if error.is_some() {
            "failed"
        } else {
            "finished"
        };
        st.route = None;
        for w in st.workers.values() {
            let _ = w.out.send(wire::encode(&Wire::JobEnded {
                error: error.clone(),
            }));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !shared.state().workers.is_empty() && Instant::now() < deadline {
        let _ = executor.changed.recv_timeout(Duration::from_millis(50));
    }
    rt.shutdown_timeout(Duration::from_secs(1));
    let _ = std::fs::remove_dir_all(&staging_root);
    super::report_object_storage(&shared.job, "coordinator");
    result
}

/// Scratch directory for checkpoint files received from workers.
fn staging_dir() -> PathBuf {
    let tmp = std::env::temp_dir();
    weir_core::scratch::remove_orphans(&tmp, |name| {
        name.strip_prefix("weir-coordinator-")?.split('-').next()
    });
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let owner = weir_core::scratch::owner_tag();
    tmp.join(format!("weir-coordinator-{owner}-{nanos:x}"))
}

struct ClusterExecutor {
    shared: Arc<Shared>,
    changed: crossbeam_channel::Receiver<()>,
    expected: usize,
    first: bool,
    last_attempt: u64,
}

impl ClusterExecutor {
    /// Waits until the workers offer enough slots (and, the first time, until the expected
    /// number of workers joined).
    fn wait_for_slots(&self, needed: usize) -> Result<()> {
        let mut said = None;
        loop {
            if self.shared.job.cancel.load(Ordering::SeqCst) {
                return Err(Error::Cancelled);
            }
            let (count, slots) = {
                let st = self.shared.state();
                (
                    st.workers.len(),
                    st.workers.values().map(|w| w.slots as usize).sum::<usize>(),
                )
            };
            let enough_workers = !self.first || count >= self.expected;
            if enough_workers && slots >= needed {
                return Ok(());
            }
            if said != Some((count, slots)) {
                said = Some((count, slots));
                tracing::info!(
                    job = %self.shared.name,
                    workers = count,
                    slots,
                    "job '{}': {count} worker(s) with {slots} slot(s) joined; waiting for {} worker(s) and {needed} slot(s)",
                    self.shared.name,
                    if self.first { self.expected } else { 1 }
                );
            }
            let _ = self.changed.recv_timeout(Duration::from_millis(100));
        }
    }
}

impl Executor for ClusterExecutor {
    fn launch(
        &mut self,
        job: &Arc<JobShared>,
        storage: Option<&CheckpointStorage>,
        restore: Option<&(Manifest, PathBuf)>,
        _verified: &weir_core::checkpoint::RestoreGate,
    ) -> Result<Launched> {
        // A slot runs one subtask of every operator (slot sharing): the job needs as many
        // slots as its largest parallelism.
        let needed = job
            .plan
            .heads
            .iter()
            .map(|&h| job.plan.parallelism[h])
            .max()
            .unwrap_or(1);
        self.shared.state().phase = "waiting for workers";
        self.wait_for_slots(needed)?;
        self.first = false;
        // Attempt numbers grow across coordinator restarts too (wall-clock milliseconds,
        // strictly increasing in this process), so a restarted coordinator fences the
        // workers' old attempts as well.
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let attempt = now_ms.max(self.last_attempt + 1);
        self.last_attempt = attempt;

        let mut st = self.shared.state();
        // Slots interleaved across workers, so subtasks spread over machines.
        let mut slots: Vec<u32> = Vec::new();
        let max_slots = st.workers.values().map(|w| w.slots).max().unwrap_or(0);
        for round in 0..max_slots {
            for (id, w) in &st.workers {
                if round < w.slots {
                    slots.push(*id);
                }
            }
        }
        if slots.len() < needed {
            // A worker was lost between the wait and now: the attempt fails and restarts.
            return Err(Error::Remote {
                message: format!(
                    "only {} slot(s) left for {needed} subtasks: a worker was lost",
                    slots.len()
                ),
                deterministic: false,
                secondary: false,
            });
        }
        let (events_tx, events_rx) = crossbeam_channel::unbounded();
        let mut running = Vec::new();
        let mut tasks = Vec::new();
        let mut worker_of = Vec::new();
        let mut index = HashMap::new();
        for &h in &job.plan.heads {
            let node = &job.graph.nodes[h];
            for (s, &worker) in slots.iter().enumerate().take(job.plan.parallelism[h]) {
                index.insert((h, s), running.len());
                worker_of.push(worker);
                tasks.push((h as u32, s as u32, worker));
                let out = st.workers[&worker].out.clone();
                let staging = self.shared.staging.clone();
                running.push(Running {
                    name: node.name.clone(),
                    subtask: s,
                    parallelism: job.plan.parallelism[h],
                    is_source: node.kind == NodeKind::Source,
                    key: TaskKey::new(h, s),
                    progress: Arc::new(AtomicU64::new(0)),
                    commands: Commands::Remote(Box::new(move |command: TaskCommand| {
                        // The staging area follows the checkpoints' ends as the workers do.
                        match command {
                            TaskCommand::Complete(id) => staging.completed(id.0),
                            TaskCommand::Abort(id) => staging.aborted(id.0),
                            _ => {}
                        }
                        let _ = out.send(wire::encode(&Wire::Command {
                            attempt,
                            head: h as u32,
                            subtask: s as u32,
                            command,
                        }));
                    })),
                });
            }
        }
        let used: HashSet<u32> = worker_of.iter().copied().collect();
        // The workers of the new attempt send every checkpoint file again.
        self.shared.staging.begin_attempt(attempt);
        if let (Some(storage), Some((manifest, path))) = (storage, restore) {
            // Its shared files are stored: the next checkpoints reuse them by name.
            storage.remember_restored(manifest);
            let files = super::staging::restored_files(storage, manifest, path);
            self.shared.staging.restored(attempt, files);
        }
        let deploy = Deploy {
            attempt,
            restore: restore.map(|(_, p)| p.clone()),
            tasks,
            workers: st
                .workers
                .iter()
                .filter(|(id, _)| used.contains(id))
                .map(|(id, w)| (*id, w.data.clone()))
                .collect(),
            count_records: self.shared.job.status.detailed(),
        };
        self.shared.figures_attempt.store(attempt, Ordering::SeqCst);
        // Every live worker hears of the new attempt (idle ones drop what they ran).
        let frame = wire::encode(&Wire::Deploy(deploy));
        let outs: Vec<UnboundedSender<Vec<u8>>> =
            st.workers.values().map(|w| w.out.clone()).collect();
        for out in &outs {
            let _ = out.send(frame.clone());
        }
        let placement: Vec<String> = used
            .iter()
            .map(|w| {
                let n = worker_of.iter().filter(|x| *x == w).count();
                format!("worker {w}: {n} task(s)")
            })
            .collect();
        tracing::info!(
            job = %self.shared.name,
            cluster_attempt = attempt,
            "job '{}': attempt {attempt} deployed ({})",
            self.shared.name,
            placement.join(", ")
        );
        let n = running.len();
        st.route = Some(Route {
            attempt,
            index,
            worker_of,
            done: vec![false; n],
            events: events_tx,
            workers: used,
            built: HashSet::new(),
            started: false,
        });
        st.phase = "running";
        drop(st);
        let cancel = Arc::new(AtomicBool::new(false));
        let on_cancel: Box<dyn Fn() + Send> = Box::new(move || {
            for out in &outs {
                let _ = out.send(wire::encode(&Wire::Cancel { attempt }));
            }
        });
        Ok(Launched {
            running,
            events: events_rx,
            cancel,
            on_cancel,
            threads: Vec::new(),
        })
    }

    fn attempt_ended(&mut self) {
        let mut st = self.shared.state();
        st.route = None;
        st.phase = "restarting";
    }
}
