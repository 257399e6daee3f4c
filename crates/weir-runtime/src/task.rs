//! One task: a chain of operators for one subtask, built and run on its own thread.
//!
//! A source task polls its source, ticks, and injects checkpoint barriers when the
//! coordinator triggers them; an operator task selects over its input channels and its
//! command channel, tracks watermarks per channel, aligns barriers (exactly-once: a channel
//! that delivered barrier `n` is not read again until every channel has), snapshots its
//! operators and forwards the barrier. Both check the cancellation flag between batches,
//! and both end by sending the maximum watermark and end-of-input downstream. With
//! checkpoints on, a finished source waits for a final checkpoint to complete before it
//! ends its output, so sinks commit everything.

use crate::JobConfig;
use crate::plan::Plan;
use crossbeam_channel::{Receiver, Sender};
use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use weir_core::checkpoint::{OperatorSnapshot, Participants, RestoreState};
use weir_core::exchange::InputGate;
use weir_core::graph::{BuildContext, Built, Graph, SourceStatus, SourceTask};
use weir_core::ids::CheckpointId;
use weir_core::output::Control;
use weir_core::time::{MAX_WATERMARK, Timestamp};
use weir_core::{Error, Result};
use weir_state::BackendParams;

mod align;
mod build;
mod end_of_time;
mod operator;
mod source;
mod unaligned;
use build::Builder;

/// Key of a writer: (producer node, port, consumer node, consumer gate).
pub(crate) type WriterKey = (usize, usize, usize, usize);

/// Names one channel of the graph the same way in every process of a cluster: the
/// consuming node and its input gate, and the producer and consumer subtasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub(crate) struct LinkKey {
    pub node: u32,
    pub gate: u32,
    pub producer: u32,
    pub consumer: u32,
}

/// What the job thread tells a task.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub(crate) enum TaskCommand {
    /// Sources: inject barrier `n` now; `true` for the final checkpoint at end of input.
    Trigger(CheckpointId, bool),
    /// Checkpoint `n` is complete.
    Complete(CheckpointId),
    /// Checkpoint `n` was aborted.
    Abort(CheckpointId),
    /// Stop now (after a stop-with-savepoint completed and was notified).
    Stop,
}

/// What a task tells the job thread.
pub(crate) enum TaskEvent {
    /// The task snapshotted its operators for checkpoint `id`.
    Ack {
        task: usize,
        id: CheckpointId,
        snapshot: BTreeMap<String, OperatorSnapshot>,
        alignment: Duration,
        sync: Duration,
    },
    /// A source task read all of its input (checkpointing jobs only).
    SourceFinished { task: usize },
    /// The task ended.
    Done {
        task: usize,
        result: std::thread::Result<Result<u64>>,
    },
}

/// Everything a task thread needs.
pub(crate) struct TaskSpec {
    pub index: usize,
    pub head: usize,
    pub subtask: usize,
    pub writers: HashMap<WriterKey, Box<dyn Any + Send>>,
    pub readers: Vec<Option<Box<dyn Any + Send>>>,
    pub progress: Arc<AtomicU64>,
    pub commands: Receiver<TaskCommand>,
    pub events: Sender<TaskEvent>,
    pub cancel: Arc<AtomicBool>,
    /// Restored state of the nodes of this task's chain, by node index.
    pub restore: HashMap<usize, RestoreState>,
    /// Opens once every task of the attempt has built (restored and opened) its operators.
    pub start: Arc<StartGate>,
    /// The task's figures: records, watermarks, idle and backpressured time.
    pub metrics: Arc<crate::status::TaskMetrics>,
}

/// Holds every task back until every task of an attempt has restored and opened its
/// operators. A sink may need to finish its restore before anything new is written (the
/// Kafka sink re-produces uncommitted transactions of keys that, after a rescale, other
/// subtasks now own), so no record may flow until every sink subtask is ready: not from a
/// source, and not from an operator replaying the channel state of an unaligned checkpoint
/// or firing restored timers.
/// In a cluster the gate waits for one more arrival, made when the coordinator reports
/// that every worker has built its tasks; `on_built` tells the worker its own are built.
pub(crate) struct StartGate {
    remaining: std::sync::Mutex<usize>,
    opened: std::sync::Condvar,
    /// Called when only the cluster-wide arrival is missing.
    on_built: Option<Box<dyn Fn() + Send + Sync>>,
}

impl StartGate {
    pub(crate) fn new(tasks: usize) -> Self {
        StartGate {
            remaining: std::sync::Mutex::new(tasks),
            opened: std::sync::Condvar::new(),
            on_built: None,
        }
    }

    /// A gate for `tasks` local tasks plus the cluster-wide start.
    pub(crate) fn clustered(tasks: usize, on_built: Box<dyn Fn() + Send + Sync>) -> Self {
        let gate = StartGate {
            remaining: std::sync::Mutex::new(tasks + 1),
            opened: std::sync::Condvar::new(),
            on_built: Some(on_built),
        };
        if tasks == 0 {
            (gate.on_built.as_ref().expect("set"))();
        }
        gate
    }

    /// This task is built (or, for a cluster, every worker is).
    pub(crate) fn arrive(&self) {
        let mut r = self.remaining.lock().unwrap_or_else(|p| p.into_inner());
        *r = r.saturating_sub(1);
        if *r == 0 {
            self.opened.notify_all();
        }
        if *r == 1
            && let Some(f) = &self.on_built
        {
            f();
        }
    }

    /// Waits until every task is built; `Err(Cancelled)` if the attempt is cancelled first
    /// (a task failed to build).
    fn wait(&self, cancel: &AtomicBool) -> Result<()> {
        let mut r = self.remaining.lock().unwrap_or_else(|p| p.into_inner());
        while *r > 0 {
            if cancel.load(Ordering::Relaxed) {
                return Err(Error::Cancelled);
            }
            r = self
                .opened
                .wait_timeout(r, Duration::from_millis(20))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }
}

/// Shared, read-only job context.
pub(crate) struct JobShared {
    pub graph: Graph,
    pub plan: Plan,
    pub cfg: JobConfig,
    /// Set by the user (JobHandle::cancel): stop the job for good.
    pub cancel: AtomicBool,
    /// Savepoint requests from the user: 1 = take one, 2 = take one and stop.
    pub savepoint_request: std::sync::atomic::AtomicU8,
    /// What the job reports about itself (the REST API's views).
    pub status: Arc<crate::status::JobStatus>,
    /// The watermark alignment groups of the job's sources.
    pub alignment: crate::alignment::Groups,
}

/// Wall-clock time in ms since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
/// Checkpoint bookkeeping of one task.
struct Checkpoints<'a> {
    spec: &'a TaskSpec,
    participants: Participants,
    /// The last checkpoint this task snapshotted.
    last_snapshot: Option<CheckpointId>,
    /// The last checkpoint this task was told completed.
    last_complete: Option<CheckpointId>,
    /// When the live state size was last measured (see `measure_state`).
    state_measured: Option<Instant>,
}

impl Checkpoints<'_> {
    /// With the API on, stores the live state size of the task's operators (their state
    /// backends' estimates), at most once a second unless `now`.
    fn measure_state(&mut self, job: &JobShared, now: bool) {
        if !job.status.detailed()
            || (!now
                && self
                    .state_measured
                    .is_some_and(|t| t.elapsed() < Duration::from_secs(1)))
        {
            return;
        }
        self.state_measured = Some(Instant::now());
        let sizes = self.participants.state_bytes();
        for n in &self.spec.metrics.nodes {
            if let Some(b) = sizes.get(&job.graph.nodes[n.node].operator_id()) {
                n.state_bytes.store(*b, Ordering::Relaxed);
            }
        }
    }

    /// Snapshots the task's operators; `watermark` is the watermark of the task's inputs
    /// (tasks with inputs), recorded with each of its operators.
    fn snapshot(
        &mut self,
        id: CheckpointId,
        alignment: Duration,
        watermark: Option<Timestamp>,
    ) -> Result<()> {
        let (snapshot, sync) = self.take_snapshot(id, watermark)?;
        barrier_trace(format_args!(
            "task {} snapshot {id} (a source, or aligned)",
            self.spec.index
        ));
        self.ack(id, snapshot, alignment, sync);
        Ok(())
    }

    /// Snapshots the task's operators (see `snapshot`) without acknowledging yet; returns
    /// the snapshot and how long it took.
    fn take_snapshot(
        &mut self,
        id: CheckpointId,
        watermark: Option<Timestamp>,
    ) -> Result<(BTreeMap<String, OperatorSnapshot>, Duration)> {
        let t0 = Instant::now();
        let mut snapshot = self.participants.snapshot(id)?;
        if let Some(w) = watermark {
            for s in snapshot.values_mut() {
                s.watermark = Some(w);
            }
        }
        self.last_snapshot = Some(id);
        Ok((snapshot, t0.elapsed()))
    }

    /// Acknowledges checkpoint `id` to the job thread.
    fn ack(
        &mut self,
        id: CheckpointId,
        snapshot: BTreeMap<String, OperatorSnapshot>,
        alignment: Duration,
        sync: Duration,
    ) {
        barrier_trace(format_args!(
            "task {} ack {id} sync {}us",
            self.spec.index,
            sync.as_micros()
        ));
        let _ = self.spec.events.send(TaskEvent::Ack {
            task: self.spec.index,
            id,
            snapshot,
            alignment,
            sync,
        });
    }

    fn on_command(&mut self, cmd: TaskCommand) -> Result<()> {
        match cmd {
            TaskCommand::Complete(id) => {
                self.participants.notify_complete(id)?;
                self.last_complete = Some(id);
            }
            TaskCommand::Abort(id) => self.participants.notify_aborted(id)?,
            TaskCommand::Trigger(..) => {}
            TaskCommand::Stop => return Err(Error::Cancelled),
        }
        Ok(())
    }

    /// True while a snapshot this task took is not known to be complete.
    fn awaiting_completion(&self) -> bool {
        match (self.last_snapshot, self.last_complete) {
            (Some(s), Some(c)) => c < s,
            (Some(_), None) => true,
            _ => false,
        }
    }
}

/// Ends a task's accounting when its thread leaves [`run`], however it leaves.
struct Accounting<'a>(&'a crate::status::TaskMetrics);

impl Drop for Accounting<'_> {
    fn drop(&mut self) {
        weir_core::exchange::account_backpressure(None);
        weir_core::exchange::clear_outputs();
        weir_core::exchange::pause_delivery_when(None);
        weir_core::exchange::set_barrier_timeout(None);
        self.0.ended();
    }
}

/// Builds and runs one task to completion.
pub(crate) fn run(job: &JobShared, mut spec: TaskSpec) -> Result<u64> {
    let metrics = spec.metrics.clone();
    let _accounting = Accounting(&metrics);
    weir_core::exchange::clear_outputs();
    weir_core::exchange::account_backpressure(Some(metrics.backpressured_ns.clone()));
    // A batch being delivered pauses for a waiting command (a checkpoint's completion
    // commits the sinks' transactions), as for an unaligned barrier.
    let commands = spec.commands.clone();
    weir_core::exchange::pause_delivery_when(Some(Box::new(move || !commands.is_empty())));
    if let Some(crate::CheckpointMode::AlignedTimeout(t)) =
        job.cfg.checkpoint.as_ref().map(|c| c.mode)
    {
        weir_core::exchange::set_barrier_timeout(Some(t));
    }
    let counted = job.status.detailed().then_some(&*metrics);
    let participants = Participants::default();
    let mut writers = std::mem::take(&mut spec.writers);
    let aligner =
        job.alignment
            .source(spec.head, spec.subtask, metrics.alignment_paused_ns.clone());
    // The in-flight records of an unaligned checkpoint: replayed into the inputs, never
    // restored as the operator's keyed state.
    let channel_state = spec
        .restore
        .get_mut(&spec.head)
        .and_then(|r| r.keyed.remove(weir_core::exchange::CHANNEL_STATE_TABLE))
        .unwrap_or_default();
    let built = Builder {
        job,
        subtask: spec.subtask,
        writers: &mut writers,
        restore: &spec.restore,
        participants: &participants,
        metrics: counted,
        figures: &metrics,
        alignment: aligner.as_ref(),
    }
    .build_node(spec.head)?;
    spec.start.arrive();
    let mut readers = std::mem::take(&mut spec.readers);
    let mut ck = Checkpoints {
        spec: &spec,
        participants,
        last_snapshot: None,
        last_complete: None,
        state_measured: None,
    };
    match built {
        Built::Source(src) => {
            let waiting = Instant::now();
            ck.spec.start.wait(&ck.spec.cancel)?;
            metrics.idle(waiting.elapsed());
            let cells = counted.and_then(|m| m.node(spec.head));
            source::run_source(job, src, cells, aligner, &mut ck)
        }
        Built::Operator { inputs, control } => {
            let node = &job.graph.nodes[spec.head];
            let mut gates: Vec<Box<dyn InputGate>> = Vec::with_capacity(inputs.len());
            for ((edge, input), readers) in node.inputs.iter().zip(inputs).zip(readers.iter_mut()) {
                let readers = readers
                    .take()
                    .ok_or_else(|| Error::Config("internal: missing readers".into()))?;
                let bytes = counted
                    .filter(|_| job.cfg.measure_bytes)
                    .and_then(|m| m.node(spec.head)?.bytes_in.clone());
                gates.push(match bytes {
                    Some(b) => edge.exchange.bind_metered(readers, input, b)?,
                    None => edge.exchange.bind(readers, input)?,
                });
            }
            // The records in flight on the input channels, for the views and /metrics.
            if let Some(q) = metrics.node(spec.head).and_then(|c| c.queued_in.as_ref()) {
                gates.iter().for_each(|g| q.add(g.budgets()));
            }
            // An operator writes before any source does when it replays restored channel
            // state or fires restored timers: that output, too, must wait until every sink
            // subtask finished its restore.
            let waiting = Instant::now();
            ck.spec.start.wait(&ck.spec.cancel)?;
            metrics.idle(waiting.elapsed());
            // Records in are counted per batch and watermarks as they are forwarded.
            let cells = counted.and_then(|m| m.node(spec.head));
            operator::run_operator(job, gates, control, cells, &mut ck, &channel_state)
        }
    }
}

/// How long a task whose output has no room waits before it looks again (it wakes at once
/// for a command or an unaligned barrier).
const OUTPUT_WAIT: Duration = Duration::from_millis(1);

/// The timeline of checkpoint barriers at debug level (`RUST_LOG=weir::barriers=debug`):
/// when the coordinator triggered, when each task saw its trigger or barrier, snapshotted
/// and acknowledged; where a slow checkpoint waits shows as a gap.
pub(crate) fn barrier_trace(a: std::fmt::Arguments<'_>) {
    tracing::debug!(target: "weir::barriers", "{a}");
}

/// Adds the time until it is dropped to the task's idle time.
struct IdleTimer<'a>(&'a crate::status::TaskMetrics, Instant);

impl<'a> IdleTimer<'a> {
    fn start(m: &'a crate::status::TaskMetrics) -> Self {
        IdleTimer(m, Instant::now())
    }
}

impl Drop for IdleTimer<'_> {
    fn drop(&mut self) {
        self.0.idle(self.1.elapsed());
    }
}

/// True when the job's checkpoints are unaligned from the start (sources inject barriers
/// on the priority lanes).
fn unaligned_mode(job: &JobShared) -> bool {
    job.cfg
        .checkpoint
        .as_ref()
        .is_some_and(|c| c.mode == crate::CheckpointMode::Unaligned)
}

/// The job's checkpoint mode (aligned without checkpoints).
fn mode_of(job: &JobShared) -> crate::CheckpointMode {
    job.cfg
        .checkpoint
        .as_ref()
        .map_or(crate::CheckpointMode::Aligned, |c| c.mode)
}

fn cancelled(ck: &Checkpoints<'_>) -> bool {
    ck.spec.cancel.load(Ordering::Relaxed)
}
