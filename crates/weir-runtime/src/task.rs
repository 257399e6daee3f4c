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
use crossbeam_channel::{Receiver, Select, Sender};
use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use weir_core::checkpoint::{OperatorSnapshot, Participants, RestoreState};
use weir_core::exchange::{GateEvent, InputGate};
use weir_core::graph::{BuildContext, Built, ControlSink, Graph, SourceStatus, SourceTask};
use weir_core::ids::CheckpointId;
use weir_core::output::Control;
use weir_core::time::{MAX_WATERMARK, MIN_WATERMARK, Timestamp};
use weir_core::watermark::WatermarkTracker;
use weir_core::{Error, Result};
use weir_state::BackendParams;

mod align;
mod build;
mod end_of_time;
mod source;
mod unaligned;
use align::{Aligned, Aligner};
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
            run_operator(job, gates, control, cells, &mut ck, &channel_state)
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

/// True when checkpoint `id` is the final one: handles the commands waiting first, since
/// the job thread names the final checkpoint to operator tasks before its barrier leaves
/// the sources.
fn final_or_told(
    commands: &Receiver<TaskCommand>,
    final_checkpoint: &mut Option<CheckpointId>,
    ck: &mut Checkpoints<'_>,
    id: CheckpointId,
) -> Result<bool> {
    while let Ok(cmd) = commands.try_recv() {
        if let TaskCommand::Trigger(f, true) = cmd {
            *final_checkpoint = Some(f);
        }
        ck.on_command(cmd)?;
    }
    Ok(final_checkpoint.is_some_and(|f| f == id))
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
enum ControlTarget<'a> {
    Gate(&'a dyn InputGate),
    Sink(Box<dyn ControlSink>),
}

impl ControlTarget<'_> {
    fn send(&mut self, event: Control) -> Result<()> {
        match self {
            ControlTarget::Gate(g) => g.control(event),
            ControlTarget::Sink(s) => s.control(event),
        }
    }
}

/// A control target that keeps the last watermark forwarded to the operator (its
/// watermark in, for the REST API).
struct Watched<'a> {
    target: ControlTarget<'a>,
    watermark: Option<Arc<std::sync::atomic::AtomicI64>>,
}

impl Watched<'_> {
    fn send(&mut self, event: Control) -> Result<()> {
        if let (Control::Watermark(w), Some(cell)) = (event, &self.watermark) {
            cell.store(w, Ordering::Relaxed);
        }
        self.target.send(event)
    }
}

fn run_operator(
    job: &JobShared,
    gates: Vec<Box<dyn InputGate>>,
    control: Option<Box<dyn ControlSink>>,
    cells: Option<&crate::status::NodeCells>,
    ck: &mut Checkpoints<'_>,
    channel_state: &[(u32, Vec<u8>)],
) -> Result<u64> {
    let exactly_once = job.cfg.checkpoint.as_ref().is_none_or(|c| c.exactly_once);
    let mut target = Watched {
        target: match control {
            Some(c) => ControlTarget::Sink(c),
            None => ControlTarget::Gate(&*gates[0]),
        },
        watermark: cells.map(|c| c.watermark_in.clone()),
    };
    // Flat channel index -> (gate, channel within the gate).
    let channels: Vec<(usize, usize)> = gates
        .iter()
        .enumerate()
        .flat_map(|(g, gate)| (0..gate.len()).map(move |c| (g, c)))
        .collect();
    let mut tracker = WatermarkTracker::new(channels.len());
    // Resuming: the chain's operators had reached this event time at the checkpoint. It is
    // re-established before any record (a window must not reopen a window it purged, a
    // record late before the crash stays late), and the inputs' watermarks, which start
    // over, do not move it back.
    let restored = ck
        .spec
        .restore
        .values()
        .filter_map(|r| r.watermark)
        .min()
        .filter(|w| *w > MIN_WATERMARK);
    if let Some(w) = restored {
        tracker.resume_at(w);
    }
    let mut aligner = Aligner::new(channels.len(), exactly_once);
    let mode = mode_of(job);
    let mut end_of_time = end_of_time::EndOfTime::new(channels.len());
    let mut unaligned = unaligned::Unaligned::default();
    let head_operator = job.graph.nodes[ck.spec.head].operator_id();
    let parallelism = job.plan.parallelism[ck.spec.head];
    let mut ended = vec![false; channels.len()];
    // Channels whose producer let go of the priority lane.
    let mut no_priority = vec![false; channels.len()];
    let mut open = channels.len();
    let mut idle = false;
    let mut records = 0u64;
    // As in run_source: the processing time is known before the first record.
    let mut last_tick = now_ms();
    target.send(Control::Tick(last_tick))?;
    if let Some(w) = restored {
        target.send(Control::Watermark(w))?;
    }
    // The records that were in flight at an unaligned checkpoint come before any new one.
    let replayed = unaligned::replay(
        &gates,
        channel_state,
        ck.spec.subtask,
        parallelism,
        job.cfg.max_parallelism,
    )?;
    if replayed > 0 {
        tracing::info!(
            records = replayed,
            "replayed the in-flight records of the restored unaligned checkpoint"
        );
        records += replayed as u64;
    }
    let commands = ck.spec.commands.clone();
    enum Got {
        Gate(usize, GateEvent),
        Command(TaskCommand),
    }
    let mut events: Vec<(usize, GateEvent)> = Vec::new();
    let mut gots: Vec<Got> = Vec::new();
    // The final checkpoint, once the job thread said which it is.
    let mut final_checkpoint: Option<CheckpointId> = None;
    while open > 0 {
        if cancelled(ck) {
            return Err(Error::Cancelled);
        }
        // With no room on the output, no record is delivered (it would wait in a send,
        // deaf to barriers): only barriers and commands are taken until there is room.
        let out_ok = weir_core::exchange::output_available();
        // Unaligned barriers first, then the messages taken when one was seen.
        events.clear();
        if mode != crate::CheckpointMode::Aligned {
            for (flat, &(g, c)) in channels.iter().enumerate() {
                if ended[flat] {
                    continue;
                }
                while let Some(e) = gates[g].poll_priority(c) {
                    events.push((flat, e));
                }
            }
        }
        // Commands that wait go before any record (the rest of a batch paused for them
        // included): a completed checkpoint's transactions are committed now, not after a
        // backlog that a slow sink takes long to write. A barrier just seen came after the
        // completions of the checkpoints before it, so its snapshot finds them committed.
        while let Ok(cmd) = commands.try_recv() {
            gots.push(Got::Command(cmd));
        }
        // Messages kept back (or the rest of a batch whose delivery paused) go after the
        // barriers just seen are handled, before anything read later.
        for (flat, &(g, c)) in channels.iter().enumerate() {
            if out_ok
                && events.is_empty()
                && gots.is_empty()
                && !ended[flat]
                && !aligner.blocked(flat)
                && let Some(e) = gates[g].resume(c)?
            {
                events.push((flat, e));
            }
        }
        let mut got_command = None;
        if events.is_empty() && gots.is_empty() {
            let mut sel = Select::new();
            let mut index = Vec::with_capacity(channels.len());
            for (flat, &(g, c)) in channels.iter().enumerate() {
                if out_ok && !ended[flat] && !aligner.blocked(flat) {
                    gates[g].select(&mut sel, c);
                    index.push((flat, false));
                }
            }
            if mode != crate::CheckpointMode::Aligned {
                for (flat, &(g, c)) in channels.iter().enumerate() {
                    if !ended[flat] && !no_priority[flat] {
                        gates[g].select_priority(&mut sel, c);
                        index.push((flat, true));
                    }
                }
            }
            let cmd_index = sel.recv(&commands);
            let selected = match sel.try_select() {
                Ok(op) => Some(op),
                Err(_) if !out_ok => {
                    let waiting = Instant::now();
                    let op = sel.select_timeout(OUTPUT_WAIT).ok();
                    ck.spec
                        .metrics
                        .backpressured_ns
                        .fetch_add(waiting.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    op
                }
                Err(_) => {
                    // Nothing to read: what the chain buffered goes out now, not at the
                    // next flush interval (no record would join it while the task waits).
                    target.send(Control::Flush)?;
                    let _waited = IdleTimer::start(&ck.spec.metrics);
                    sel.select_timeout(Duration::from_millis(10)).ok()
                }
            };
            match selected {
                Some(op) if op.index() == cmd_index => match op.recv(&commands) {
                    Ok(cmd) => got_command = Some(Got::Command(cmd)),
                    Err(_) => return Err(Error::Cancelled),
                },
                Some(op) => {
                    let (flat, priority) = index[op.index()];
                    let (g, c) = channels[flat];
                    if priority {
                        match gates[g].complete_priority(c, op) {
                            Some(e) => events.push((flat, e)),
                            None => no_priority[flat] = true,
                        }
                    } else {
                        events.push((flat, gates[g].complete(c, op)?));
                    }
                }
                None => {}
            }
        }
        let mut aligned = Aligned::Wait;
        // (After the commands taken above.)
        gots.extend(events.drain(..).map(|(f, e)| Got::Gate(f, e)));
        gots.extend(got_command);
        for got in gots.drain(..) {
            match got {
                Got::Command(cmd) => {
                    if let TaskCommand::Trigger(id, true) = cmd {
                        final_checkpoint = Some(id);
                    }
                    if let TaskCommand::Abort(id) = cmd {
                        aligner.on_abort(id);
                        if unaligned.collecting.as_ref().is_some_and(|c| c.id == id) {
                            let inputs = unaligned::Inputs {
                                gates: &gates,
                                channels: &channels,
                                ended: &ended,
                                subtask: ck.spec.subtask,
                                parallelism,
                            };
                            unaligned.cancel(&inputs);
                        }
                    }
                    ck.on_command(cmd)?;
                }
                Got::Gate(flat, event) => {
                    // An unaligned barrier: its checkpoint, and the data messages before it
                    // (None for one that came in band).
                    let mut barrier: Option<(CheckpointId, Option<u64>)> = None;
                    match event {
                        GateEvent::Records(n) => {
                            records += n as u64;
                            ck.spec.progress.store(records, Ordering::Relaxed);
                            if let Some(c) = cells {
                                c.records_in[channels[flat].0]
                                    .fetch_add(n as u64, Ordering::Relaxed);
                            }
                            tracker.on_record(flat);
                        }
                        GateEvent::Watermark(w) => {
                            end_of_time.on_watermark(flat, w);
                            if let Some(wm) = tracker.on_watermark(flat, w) {
                                target.send(Control::Watermark(wm))?;
                            }
                        }
                        GateEvent::Idle(i) => {
                            if let Some(wm) = tracker.on_idle(flat, i) {
                                target.send(Control::Watermark(wm))?;
                            }
                        }
                        // (A writer's copy of the final checkpoint's in-band barrier is
                        // ignored: that checkpoint stays aligned.)
                        GateEvent::Priority(id, upto) => {
                            barrier_trace(format_args!(
                                "op {} prio {id} ch {flat} upto {upto}",
                                ck.spec.index
                            ));
                            if mode == crate::CheckpointMode::Unaligned
                                || !final_or_told(&commands, &mut final_checkpoint, ck, id)?
                            {
                                barrier = Some((id, Some(upto)))
                            }
                        }
                        // In band: an aligned barrier (the final checkpoint's, in the
                        // unaligned mode), or one of a checkpoint that went on unaligned.
                        GateEvent::Barrier(id)
                            if unaligned.collecting.as_ref().is_some_and(|c| c.id == id) =>
                        {
                            barrier = Some((id, None))
                        }
                        GateEvent::Barrier(id) => {
                            if !unaligned.is_stale(id) {
                                aligned = aligner.on_barrier(flat, id, &ended)
                            }
                        }
                        // Passed on as it came: no watermark, alignment or record count.
                        GateEvent::LatencyMarker(m) => target.send(Control::LatencyMarker(m))?,
                        GateEvent::End => {
                            ended[flat] = true;
                            open -= 1;
                            if let Some(wm) = tracker.on_end(flat) {
                                target.send(Control::Watermark(wm))?;
                            }
                            aligned = aligner.check(&ended);
                        }
                        GateEvent::Disconnected => {
                            return Err(Error::ChannelClosed(
                                "an upstream subtask stopped without finishing".into(),
                            ));
                        }
                    }
                    let inputs = unaligned::Inputs {
                        gates: &gates,
                        channels: &channels,
                        ended: &ended,
                        subtask: ck.spec.subtask,
                        parallelism,
                    };
                    if let Some((id, upto)) = barrier {
                        let current = unaligned.collecting.as_ref().is_some_and(|c| c.id == id);
                        let stale = unaligned.is_stale(id) || aligner.last.is_some_and(|l| id <= l);
                        if !current && !stale {
                            // The first barrier of `id` at this task: snapshot now, and
                            // send the barrier on ahead of the queued records.
                            let arrived = aligner.switch(id);
                            let in_band = mode != crate::CheckpointMode::Unaligned;
                            unaligned.start(
                                ck,
                                &inputs,
                                id,
                                tracker.current(),
                                &arrived,
                                in_band,
                            )?;
                            weir_core::exchange::with_unaligned_barriers(|| {
                                target.send(Control::Barrier(id))
                            })?;
                        }
                        if current || !stale {
                            unaligned.barrier(&inputs, flat, upto)?;
                        }
                    }
                    unaligned.drain(&inputs)?;
                    unaligned.finish_if_done(ck, &inputs, &head_operator, tracker.current())?;
                    let now_idle = tracker.all_idle();
                    if now_idle != idle {
                        idle = now_idle;
                        target.send(Control::Idle(idle))?;
                    }
                }
            }
        }
        if let Aligned::Complete(id, alignment) = aligned {
            ck.snapshot(id, alignment, Some(tracker.current()))?;
            let after_end = tracker.current() == MAX_WATERMARK;
            end_of_time::send_barrier(mode, after_end, || target.send(Control::Barrier(id)))?;
        }
        // Aligned with a timeout: an alignment that has taken too long goes on unaligned
        // (not the final checkpoint's: the sinks commit everything at it; see end_of_time).
        if let crate::CheckpointMode::AlignedTimeout(limit) = mode
            && let Some((id, started)) = aligner.pending()
            && started.elapsed() >= limit
            && !end_of_time.all_arrived_reached(aligner.arrived())
            && !final_or_told(&commands, &mut final_checkpoint, ck, id)?
        {
            tracing::debug!(checkpoint = %id, "alignment timed out: the checkpoint goes on unaligned");
            let inputs = unaligned::Inputs {
                gates: &gates,
                channels: &channels,
                ended: &ended,
                subtask: ck.spec.subtask,
                parallelism,
            };
            let arrived = aligner.switch(id);
            unaligned.start(ck, &inputs, id, tracker.current(), &arrived, true)?;
            weir_core::exchange::with_unaligned_barriers(|| target.send(Control::Barrier(id)))?;
            unaligned.drain(&inputs)?;
            unaligned.finish_if_done(ck, &inputs, &head_operator, tracker.current())?;
        }
        // A tick may flush the chain's buffers: not while the output has no room.
        let now = now_ms();
        if now != last_tick && weir_core::exchange::output_available() {
            last_tick = now;
            target.send(Control::Tick(now))?;
            ck.measure_state(job, false);
        }
    }
    // Sinks commit on completion: stay until the last snapshot is known complete.
    while ck.awaiting_completion() {
        if cancelled(ck) {
            return Err(Error::Cancelled);
        }
        let _idle = IdleTimer::start(&ck.spec.metrics);
        match commands.recv_timeout(Duration::from_millis(10)) {
            Ok(cmd) => ck.on_command(cmd)?,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Err(Error::Cancelled),
        }
    }
    // The state at the end, after the last snapshot.
    ck.measure_state(job, true);
    if tracker.current() < MAX_WATERMARK {
        target.send(Control::Watermark(MAX_WATERMARK))?;
    }
    target.send(Control::End)?;
    Ok(records)
}
