//! What a job reports about itself while it runs: its state, its graph, per-subtask
//! figures, checkpoint history and exceptions, as the JSON views of the REST API
//! (`crate::web`).
//!
//! The runtime feeds it: the job loop sets the state, attempts and restarts and records
//! checkpoints and failures; each task thread updates its own [`TaskMetrics`] with relaxed
//! atomic stores (records in and out per operator, the last watermark, the time it was idle
//! and the time it waited on full output channels). Readers take a snapshot; rates and
//! time fractions are computed over a sliding window of samples ([`JobStatus::sample`]).

use crate::plan::Plan;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use weir_checkpoint::CheckpointKind;
use weir_core::exchange::PartitionKind;
use weir_core::graph::{Graph, NodeKind};
use weir_core::ids::CheckpointId;
use weir_core::time::{MAX_WATERMARK, MIN_WATERMARK};

mod in_flight;
mod partitions;
mod prometheus;
mod task;
mod views;
use task::Totals;
pub(crate) use task::{NodeCells, NodeFigures, TaskFigures, TaskMetrics};

/// Checkpoints and exceptions kept for the views (older ones are dropped).
const HISTORY: usize = 50;
/// Rates and fractions are computed over at most this long.
const WINDOW: Duration = Duration::from_secs(5);

/// The lifecycle state of a job, as `/v1/job` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub(crate) enum JobState {
    /// Started, tasks not launched yet.
    Created,
    /// An attempt's tasks run.
    Running,
    /// An attempt failed; the job restarts after its delay.
    Restarting,
    /// Cancellation was requested; tasks are stopping.
    Cancelling,
    /// Ended: read its input to the end, or stopped with a savepoint.
    Finished,
    /// Ended with a failure it did not restart from.
    Failed,
    /// Ended by cancellation.
    Cancelled,
}

/// One node of the graph, by the plan.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OperatorInfo {
    pub id: usize,
    pub name: String,
    pub kind: &'static str,
    pub parallelism: usize,
    /// The node heading the task (chain) this node runs in.
    pub task: usize,
    pub chained: bool,
}

/// One edge of the graph.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct EdgeInfo {
    pub from: usize,
    pub port: usize,
    pub to: usize,
    pub gate: usize,
    pub partitioning: &'static str,
    /// Runs inside one task (a function call, no channel).
    pub chained: bool,
}

/// All tasks' totals at one moment of one attempt.
struct Sample {
    at: Instant,
    attempt: u32,
    tasks: Vec<Totals>,
}

/// One subtask's acknowledgement of a checkpoint.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AckView {
    #[serde(skip)]
    head: usize,
    pub operator: String,
    pub subtask: usize,
    /// From the trigger to the acknowledgement.
    pub ack_ms: u64,
    pub alignment_ms: u64,
    pub sync_ms: u64,
    pub size_bytes: u64,
}

/// One checkpoint or savepoint.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CheckpointView {
    pub id: u64,
    pub kind: &'static str,
    pub status: &'static str,
    pub attempt: u32,
    pub trigger_time_ms: i64,
    pub duration_ms: Option<u64>,
    pub alignment_ms: Option<u64>,
    pub size_bytes: Option<u64>,
    /// Bytes of in-flight records stored with the checkpoint (unaligned checkpoints).
    pub channel_state_bytes: u64,
    /// A task took the checkpoint unaligned.
    pub unaligned: bool,
    pub path: Option<String>,
    pub failure: Option<String>,
    pub acks: Vec<AckView>,
    #[serde(skip)]
    triggered: Instant,
}

/// A failure of a task.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ExceptionView {
    pub time_ms: i64,
    pub attempt: u32,
    pub operator: Option<String>,
    pub subtask: Option<usize>,
    pub message: String,
    pub root_cause: String,
}

struct Inner {
    state: JobState,
    attempt: u32,
    restarts: u32,
    ended_ms: Option<i64>,
    failure: Option<String>,
    stopped_with_savepoint: bool,
    tasks: Vec<Arc<TaskMetrics>>,
    checkpoints: VecDeque<CheckpointView>,
    completed: u64,
    failed: u64,
    exceptions: VecDeque<ExceptionView>,
}

/// A job's status, shared by the runtime that feeds it and the REST API that reads it.
pub(crate) struct JobStatus {
    pub name: String,
    start_ms: i64,
    /// Operators count their records out and keep their watermarks (a wrapper around
    /// every output; see `task`): on when the job serves its REST API, or, on a cluster
    /// worker, when its coordinator does.
    detailed: AtomicBool,
    /// Channel bytes are measured too (`JobConfig::measure_bytes`).
    measure_bytes: bool,
    operators: Vec<OperatorInfo>,
    edges: Vec<EdgeInfo>,
    parallelism: usize,
    checkpoint_config: Option<serde_json::Value>,
    inner: Mutex<Inner>,
    samples: Mutex<VecDeque<Sample>>,
    /// A cluster coordinator's workers and slots, for `/v1/job`.
    cluster: Mutex<Option<ClusterView>>,
}

/// Describes a cluster's workers and slots as JSON.
pub(crate) type ClusterView = Box<dyn Fn() -> serde_json::Value + Send + Sync>;

fn partitioning(k: PartitionKind) -> &'static str {
    match k {
        PartitionKind::Forward => "FORWARD",
        PartitionKind::Rebalance => "REBALANCE",
        PartitionKind::Broadcast => "BROADCAST",
        PartitionKind::Hash => "HASH",
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl JobStatus {
    pub(crate) fn new(
        name: &str,
        graph: &Graph,
        plan: &Plan,
        cfg: &crate::JobConfig,
        detailed: bool,
    ) -> Self {
        let operators = graph
            .nodes
            .iter()
            .map(|n| OperatorInfo {
                id: n.id.0,
                name: n.name.clone(),
                kind: match n.kind {
                    NodeKind::Source => "source",
                    NodeKind::Operator => "operator",
                    NodeKind::Sink => "sink",
                },
                parallelism: plan.parallelism[n.id.0],
                task: plan.head_of[n.id.0],
                chained: plan.chained[n.id.0],
            })
            .collect();
        let mut edges = Vec::new();
        for n in &graph.nodes {
            for (gate, e) in n.inputs.iter().enumerate() {
                // The plan's view: a forward edge between different parallelisms is a
                // rebalance (see the exchange).
                let kind = match e.kind() {
                    PartitionKind::Forward
                        if plan.parallelism[e.from.0] != plan.parallelism[n.id.0] =>
                    {
                        PartitionKind::Rebalance
                    }
                    k => k,
                };
                edges.push(EdgeInfo {
                    from: e.from.0,
                    port: e.port,
                    to: n.id.0,
                    gate,
                    partitioning: partitioning(kind),
                    chained: plan.chained[n.id.0],
                });
            }
        }
        let checkpoint_config = cfg.checkpoint.as_ref().map(|c| {
            serde_json::json!({
                "dir": c.dir.display().to_string(),
                "interval_ms": ms(c.interval),
                "min_pause_ms": ms(c.min_pause),
                "timeout_ms": ms(c.timeout),
                "retain": c.retain,
                "exactly_once": c.exactly_once,
                "mode": c.mode.to_string(),
                "restart_strategy": c.restart.to_string(),
            })
        });
        JobStatus {
            name: name.to_string(),
            start_ms: crate::task::now_ms(),
            detailed: AtomicBool::new(detailed),
            measure_bytes: cfg.measure_bytes,
            operators,
            edges,
            parallelism: cfg.parallelism,
            checkpoint_config,
            inner: Mutex::new(Inner {
                state: JobState::Created,
                attempt: 0,
                restarts: 0,
                ended_ms: None,
                failure: None,
                stopped_with_savepoint: false,
                tasks: Vec::new(),
                checkpoints: VecDeque::new(),
                completed: 0,
                failed: 0,
                exceptions: VecDeque::new(),
            }),
            samples: Mutex::new(VecDeque::new()),
            cluster: Mutex::new(None),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ---- fed by the runtime ----

    /// True when operators count their records (see the field).
    pub(crate) fn detailed(&self) -> bool {
        self.detailed.load(Ordering::Relaxed)
    }

    /// True when channel bytes are measured (the API is on and the job asked for them).
    fn bytes(&self) -> bool {
        self.measure_bytes && self.detailed()
    }

    /// A cluster worker whose coordinator serves the API counts records too.
    pub(crate) fn set_detailed(&self, on: bool) {
        self.detailed.store(on, Ordering::Relaxed);
    }

    /// A cluster worker starts another attempt: its tasks replace the last one's.
    pub(crate) fn clear_tasks(&self) {
        self.inner().tasks.clear();
    }

    /// The figures of this process's tasks, for a cluster worker's report.
    pub(crate) fn figures(&self) -> Vec<TaskFigures> {
        let tasks = self.inner().tasks.clone();
        tasks
            .iter()
            .map(|t| {
                let totals = t.totals();
                let load = |c: &[Arc<AtomicU64>]| -> Vec<u64> {
                    c.iter().map(|c| c.load(Ordering::Relaxed)).collect()
                };
                TaskFigures {
                    head: t.head as u32,
                    subtask: t.subtask as u32,
                    elapsed_ns: totals.elapsed,
                    ended: t.ended_ns.load(Ordering::Relaxed) > 0,
                    idle_ns: totals.idle,
                    backpressured_ns: totals.backpressured,
                    alignment_paused_ns: t
                        .alignment_paused_ns
                        .as_ref()
                        .map(|c| c.load(Ordering::Relaxed)),
                    nodes: t
                        .nodes
                        .iter()
                        .map(|n| NodeFigures {
                            node: n.node as u32,
                            records_in: load(&n.records_in),
                            records_out: load(&n.records_out),
                            watermark_in: n.watermark_in.load(Ordering::Relaxed),
                            watermark_out: n.watermark_out.load(Ordering::Relaxed),
                            bytes_in: task::load(&n.bytes_in).filter(|_| self.measure_bytes),
                            bytes_out: task::load(&n.bytes_out).filter(|_| self.measure_bytes),
                            state_bytes: task::state(&n.state_bytes),
                            partitions: n.partition_figures(),
                            in_flight: n
                                .queued_in
                                .as_ref()
                                .and_then(|q| q.figures())
                                .map(Into::into),
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// A cluster coordinator: a worker reported its tasks' figures (of the current
    /// attempt).
    pub(crate) fn remote_figures(&self, graph: &Graph, plan: &Plan, figures: Vec<TaskFigures>) {
        let mut i = self.inner();
        for f in figures {
            let (head, subtask) = (f.head as usize, f.subtask as usize);
            if head >= graph.nodes.len() || plan.head_of[head] != head {
                continue;
            }
            let t = match i
                .tasks
                .iter()
                .find(|t| t.head == head && t.subtask == subtask)
            {
                Some(t) => t.clone(),
                None => {
                    let mut t = TaskMetrics::new(graph, plan, head, subtask);
                    t.remote_elapsed_ns = Some(AtomicU64::new(0));
                    let t = Arc::new(t);
                    i.tasks.push(t.clone());
                    i.tasks.sort_by_key(|t| (t.head, t.subtask));
                    t
                }
            };
            if let Some(e) = &t.remote_elapsed_ns {
                e.store(f.elapsed_ns, Ordering::Relaxed);
            }
            if f.ended {
                t.ended_ns.store(f.elapsed_ns.max(1), Ordering::Relaxed);
            }
            t.idle_ns.store(f.idle_ns, Ordering::Relaxed);
            t.backpressured_ns
                .store(f.backpressured_ns, Ordering::Relaxed);
            if let (Some(cell), Some(ns)) = (&t.alignment_paused_ns, f.alignment_paused_ns) {
                cell.store(ns, Ordering::Relaxed);
            }
            for n in f.nodes {
                let Some(cells) = t.node(n.node as usize) else {
                    continue;
                };
                for (c, v) in cells.records_in.iter().zip(n.records_in) {
                    c.store(v, Ordering::Relaxed);
                }
                for (c, v) in cells.records_out.iter().zip(n.records_out) {
                    c.store(v, Ordering::Relaxed);
                }
                cells.watermark_in.store(n.watermark_in, Ordering::Relaxed);
                cells
                    .watermark_out
                    .store(n.watermark_out, Ordering::Relaxed);
                cells
                    .state_bytes
                    .store(n.state_bytes.unwrap_or(task::NO_STATE), Ordering::Relaxed);
                for (c, v) in [
                    (&cells.bytes_in, n.bytes_in),
                    (&cells.bytes_out, n.bytes_out),
                ] {
                    if let (Some(c), Some(v)) = (c, v) {
                        c.store(v, Ordering::Relaxed);
                    }
                }
                if let Some(q) = &cells.queued_in {
                    q.report(n.in_flight.map(Into::into));
                }
                *cells
                    .remote_partitions
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = n.partitions;
            }
        }
    }

    /// The job runs as a cluster's coordinator: `view` describes its workers and slots.
    pub(crate) fn set_cluster_view(&self, view: ClusterView) {
        *self.cluster.lock().unwrap_or_else(|p| p.into_inner()) = Some(view);
    }

    /// The figures of a new task of the current attempt (registered for the views).
    pub(crate) fn task(
        &self,
        graph: &Graph,
        plan: &Plan,
        head: usize,
        subtask: usize,
    ) -> Arc<TaskMetrics> {
        let t = Arc::new(TaskMetrics::new(graph, plan, head, subtask));
        self.inner().tasks.push(t.clone());
        t
    }

    /// A new attempt starts (the first one, or a restart): its tasks replace the last
    /// attempt's.
    pub(crate) fn attempt_started(&self, attempt: u32) {
        let mut i = self.inner();
        i.attempt = attempt + 1;
        i.restarts = attempt;
        i.tasks.clear();
        if i.state != JobState::Cancelling {
            i.state = JobState::Running;
        }
    }

    /// The attempt failed and the job restarts.
    pub(crate) fn restarting(&self) {
        let mut i = self.inner();
        if i.state == JobState::Running {
            i.state = JobState::Restarting;
        }
    }

    /// Cancellation was requested.
    pub(crate) fn cancelling(&self) {
        let mut i = self.inner();
        if i.ended_ms.is_none() {
            i.state = JobState::Cancelling;
        }
    }

    /// The job ended with `result`.
    pub(crate) fn ended(&self, result: &weir_core::Result<crate::JobResult>) {
        let mut i = self.inner();
        i.ended_ms = Some(crate::task::now_ms());
        match result {
            Ok(r) => {
                i.state = JobState::Finished;
                i.stopped_with_savepoint = r.stopped_with_savepoint;
            }
            Err(weir_core::Error::Cancelled) => i.state = JobState::Cancelled,
            Err(e) => {
                i.state = JobState::Failed;
                i.failure = Some(e.to_string());
            }
        }
    }

    /// A task of the current attempt failed (a root cause, not a consequence).
    pub(crate) fn exception(&self, operator: &str, subtask: usize, e: &weir_core::Error) {
        let (operator, subtask) = match e {
            weir_core::Error::Operator { location, .. } => {
                (location.operator.clone(), location.subtask)
            }
            _ => (operator.to_string(), subtask),
        };
        let mut root: &dyn std::error::Error = e;
        while let Some(s) = root.source() {
            root = s;
        }
        let mut i = self.inner();
        let attempt = i.attempt;
        i.exceptions.push_front(ExceptionView {
            time_ms: crate::task::now_ms(),
            attempt,
            operator: Some(operator),
            subtask: Some(subtask),
            message: e.to_string(),
            root_cause: root.to_string(),
        });
        i.exceptions.truncate(HISTORY);
    }

    /// The job failed outside any task (configuration, restore, checkpoint storage).
    pub(crate) fn job_exception(&self, e: &weir_core::Error) {
        let mut i = self.inner();
        let attempt = i.attempt;
        if i.exceptions
            .front()
            .is_some_and(|x| x.message == e.to_string())
        {
            return;
        }
        i.exceptions.push_front(ExceptionView {
            time_ms: crate::task::now_ms(),
            attempt,
            operator: None,
            subtask: None,
            message: e.to_string(),
            root_cause: e.to_string(),
        });
        i.exceptions.truncate(HISTORY);
    }

    fn checkpoint(&self, i: &mut Inner, id: CheckpointId) -> Option<usize> {
        i.checkpoints.iter().position(|c| c.id == id.0)
    }

    /// Checkpoint `id` was triggered.
    pub(crate) fn checkpoint_triggered(&self, id: CheckpointId, kind: CheckpointKind) {
        let mut i = self.inner();
        let attempt = i.attempt;
        i.checkpoints.push_front(CheckpointView {
            id: id.0,
            kind: kind.as_str(),
            status: "IN_PROGRESS",
            attempt,
            trigger_time_ms: crate::task::now_ms(),
            duration_ms: None,
            alignment_ms: None,
            size_bytes: None,
            channel_state_bytes: 0,
            unaligned: false,
            path: None,
            failure: None,
            acks: Vec::new(),
            triggered: Instant::now(),
        });
        i.checkpoints.truncate(HISTORY);
    }

    /// A task acknowledged checkpoint `id`.
    pub(crate) fn checkpoint_acked(
        &self,
        id: CheckpointId,
        head: usize,
        subtask: usize,
        bytes: u64,
        alignment: Duration,
        sync: Duration,
    ) {
        let operator = self.operators[head].name.clone();
        let mut i = self.inner();
        if let Some(c) = self.checkpoint(&mut i, id) {
            let c = &mut i.checkpoints[c];
            let ack_ms = ms(c.triggered.elapsed());
            c.acks.push(AckView {
                head,
                operator,
                subtask,
                ack_ms,
                alignment_ms: ms(alignment),
                sync_ms: ms(sync),
                size_bytes: bytes,
            });
        }
    }

    /// A task took checkpoint `id` unaligned, with `bytes` of in-flight records.
    pub(crate) fn checkpoint_channel_state(&self, id: CheckpointId, bytes: u64) {
        let mut i = self.inner();
        if let Some(c) = self.checkpoint(&mut i, id) {
            let c = &mut i.checkpoints[c];
            c.unaligned = true;
            c.channel_state_bytes += bytes;
        }
    }

    /// Every task acknowledged checkpoint `id`; it is being written.
    pub(crate) fn checkpoint_acknowledged(
        &self,
        id: CheckpointId,
        stats: &weir_checkpoint::CheckpointStats,
    ) {
        let mut i = self.inner();
        if let Some(c) = self.checkpoint(&mut i, id) {
            let c = &mut i.checkpoints[c];
            c.duration_ms = Some(ms(stats.duration));
            c.alignment_ms = Some(ms(stats.max_alignment));
            c.size_bytes = Some(stats.bytes);
        }
    }

    /// Checkpoint `id` is in storage at `path`, having written `bytes` (the files of a
    /// persistent backend included, those shared with earlier checkpoints not).
    pub(crate) fn checkpoint_completed(
        &self,
        id: CheckpointId,
        path: &std::path::Path,
        bytes: u64,
    ) {
        let mut i = self.inner();
        i.completed += 1;
        if let Some(c) = self.checkpoint(&mut i, id) {
            i.checkpoints[c].status = "COMPLETED";
            i.checkpoints[c].size_bytes = Some(bytes);
            i.checkpoints[c].path = Some(path.display().to_string());
            let acks = i.checkpoints[c].acks.clone();
            for t in &i.tasks {
                if let Some(a) = acks
                    .iter()
                    .find(|a| a.head == t.head && a.subtask == t.subtask)
                {
                    t.checkpointed_bytes.store(a.size_bytes, Ordering::Relaxed);
                }
            }
        }
    }

    /// Checkpoint `id` failed or was aborted.
    pub(crate) fn checkpoint_failed(&self, id: CheckpointId, reason: String) {
        let mut i = self.inner();
        i.failed += 1;
        if let Some(c) = self.checkpoint(&mut i, id) {
            i.checkpoints[c].status = "FAILED";
            i.checkpoints[c].failure = Some(reason);
        }
    }

    /// The attempt ended: checkpoints still in progress will never complete.
    pub(crate) fn attempt_ended(&self) {
        let mut i = self.inner();
        let mut n = 0;
        for c in i
            .checkpoints
            .iter_mut()
            .filter(|c| c.status == "IN_PROGRESS")
        {
            c.status = "FAILED";
            c.failure = Some("the attempt ended before it completed".into());
            n += 1;
        }
        i.failed += n;
    }

    // ---- read by the REST API ----

    /// True while the job has not ended.
    pub(crate) fn is_running(&self) -> bool {
        self.inner().ended_ms.is_none()
    }

    /// Takes a sample of every task's totals for the rates, keeping those of the last
    /// window. Called about once a second.
    pub(crate) fn sample(&self) {
        let (attempt, tasks) = {
            let i = self.inner();
            (i.attempt, i.tasks.clone())
        };
        let now = Instant::now();
        let mut s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        s.retain(|x| x.attempt == attempt);
        s.push_back(Sample {
            at: now,
            attempt,
            tasks: tasks.iter().map(|t| t.totals()).collect(),
        });
        // Keep the newest sample older than the window (the base of the rates) and the
        // ones after it.
        while s.len() > 2 && now.duration_since(s[1].at) >= WINDOW {
            s.pop_front();
        }
    }
}

#[cfg(test)]
mod tests;
