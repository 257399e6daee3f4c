//! Running a job: channels, one thread per task, failure propagation, cancellation and
//! progress reporting.
//!
//! Shutdown protocol: every task reports its result on a completion channel. The first
//! root-cause failure (not a cancellation or a closed channel) sets the shared cancel
//! flag; tasks see it within one batch or 10 ms, or fail on a closed channel when their
//! neighbour exits. The job returns once every thread has been joined, with that first
//! failure, so it never hangs on a failed operator and never reports success after one.

use crate::JobConfig;
use crate::checkpoints::{self, RestoreMap};
use crate::failpoint;
use crate::plan::Plan;
use crate::task::{self, JobShared, TaskCommand, TaskEvent, TaskSpec, WriterKey};
use crossbeam_channel::Sender;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir_checkpoint::{
    AckStats, Action, CheckpointKind, CheckpointStorage, Coordinator, CoordinatorConfig,
    Participants as CoordParticipants, TaskKey,
};
use weir_core::checkpoint::OperatorSnapshot;
use weir_core::exchange::ExchangeConfig;
use weir_core::graph::{Graph, NodeKind};
use weir_core::ids::CheckpointId;
use weir_core::{Error, Result};

/// Statistics of one finished task.
#[derive(Debug, Clone)]
pub struct TaskStats {
    /// Name of the task's first operator.
    pub name: String,
    /// Subtask index.
    pub subtask: usize,
    /// Records the task's source emitted, or records it received on its inputs.
    pub records: u64,
    /// True when the task starts with a source.
    pub is_source: bool,
}

/// One task's acknowledgement payload: its operators' snapshots by operator id.
type Snapshots = BTreeMap<String, OperatorSnapshot>;

/// A checkpoint writer's report: checkpoint `id` is in storage (its path), or writing it
/// failed.
struct Written {
    id: CheckpointId,
    kind: CheckpointKind,
    bytes: u64,
    duration: Duration,
    alignment: Duration,
    result: Result<PathBuf>,
}

/// The job's checkpoint statistics as metrics (`weir::metrics`), labelled with the job.
struct CheckpointMetrics {
    completed: weir_core::metrics::Counter,
    failed: weir_core::metrics::Counter,
    duration_ms: weir_core::metrics::Gauge,
    size_bytes: weir_core::metrics::Gauge,
    alignment_ms: weir_core::metrics::Gauge,
    /// Every completed checkpoint's duration and size (the gauges keep only the last).
    duration_seconds: weir_core::metrics::Histogram,
    size_histogram: weir_core::metrics::Histogram,
}

impl CheckpointMetrics {
    fn new(job: &str) -> Self {
        use weir_core::metrics::{DURATION_BUCKETS, SIZE_BUCKETS, counter, gauge, histogram};
        let l = [("job", job)];
        CheckpointMetrics {
            completed: counter(
                "checkpoints_completed_total",
                "Checkpoints and savepoints written completely.",
                &l,
            ),
            failed: counter(
                "checkpoints_failed_total",
                "Checkpoints aborted: timed out, declined, a task failed, writing failed, or subsumed.",
                &l,
            ),
            duration_ms: gauge(
                "checkpoint_last_duration_ms",
                "From trigger to the last acknowledgement, for the last completed checkpoint.",
                &l,
            ),
            size_bytes: gauge(
                "checkpoint_last_size_bytes",
                "Bytes the last completed checkpoint wrote (incremental files count once).",
                &l,
            ),
            alignment_ms: gauge(
                "checkpoint_last_alignment_ms",
                "Longest barrier alignment of any task in the last completed checkpoint.",
                &l,
            ),
            duration_seconds: histogram(
                "weir_checkpoint_duration_seconds",
                "From trigger to the last acknowledgement, for every completed checkpoint and savepoint.",
                &l,
                DURATION_BUCKETS,
            ),
            size_histogram: histogram(
                "weir_checkpoint_size_bytes",
                "Bytes every completed checkpoint and savepoint wrote (incremental files count once).",
                &l,
                SIZE_BUCKETS,
            ),
        }
    }
}

/// A checkpoint to write: the tasks' acknowledgements and the coordinator's statistics.
struct WriteJob {
    id: CheckpointId,
    kind: CheckpointKind,
    /// A savepoint that stops the job: a recovery point of its directory.
    stops_job: bool,
    acks: Vec<(TaskKey, Snapshots)>,
    stats: weir_checkpoint::CheckpointStats,
}

/// The thread that writes completed checkpoints to storage, one after the other.
struct CheckpointWriter {
    jobs: Sender<WriteJob>,
    thread: std::thread::JoinHandle<()>,
}

impl CheckpointWriter {
    fn start(
        storage: CheckpointStorage,
        job_name: &str,
        names: checkpoints::OperatorNames,
        max_parallelism: usize,
        done: Sender<Written>,
    ) -> Result<Self> {
        let (jobs, rx) = crossbeam_channel::unbounded::<WriteJob>();
        let job_name = job_name.to_string();
        let thread = std::thread::Builder::new()
            .name("weir-checkpoint-writer".into())
            .spawn(move || {
                for WriteJob {
                    id,
                    kind,
                    stops_job,
                    acks,
                    stats,
                } in rx
                {
                    failpoint::hit("checkpoint.before_metadata");
                    // A panic while writing must still end the checkpoint (as failed), or
                    // the coordinator would wait for it forever.
                    let result = catch_unwind(AssertUnwindSafe(|| {
                        checkpoints::write_checkpoint(
                            &storage,
                            &job_name,
                            &names,
                            max_parallelism,
                            id,
                            kind,
                            stops_job,
                            acks,
                            &stats,
                        )
                    }))
                    .unwrap_or_else(|p| Err(Error::from_panic(p)));
                    if result.is_ok() {
                        failpoint::hit("checkpoint.after_metadata");
                    }
                    let _ = done.send(Written {
                        id,
                        kind,
                        bytes: stats.bytes,
                        duration: stats.duration,
                        alignment: stats.max_alignment,
                        result,
                    });
                }
            })
            .map_err(|e| {
                Error::Config(format!("cannot start the checkpoint writer thread: {e}"))
            })?;
        Ok(CheckpointWriter { jobs, thread })
    }

    /// Queues checkpoint `id` for writing; its [`Written`] report follows.
    fn write(
        &self,
        id: CheckpointId,
        kind: CheckpointKind,
        stops_job: bool,
        acks: Vec<(TaskKey, Snapshots)>,
        stats: weir_checkpoint::CheckpointStats,
    ) -> std::result::Result<(), String> {
        self.jobs
            .send(WriteJob {
                id,
                kind,
                stops_job,
                acks,
                stats,
            })
            .map_err(|_| "the checkpoint writer thread has stopped".to_string())
    }

    /// Writes what is queued, then ends the thread.
    fn finish(self) {
        drop(self.jobs);
        let _ = self.thread.join();
    }
}

/// Tells the coordinator how writing a checkpoint ended; returns its next actions.
fn on_written(
    name: &str,
    w: Written,
    c: &mut Coordinator<Snapshots>,
    savepoints: &mut Vec<PathBuf>,
    m: &CheckpointMetrics,
    status: &crate::status::JobStatus,
) -> Vec<Action<Snapshots>> {
    let Written {
        id,
        kind,
        bytes,
        duration,
        alignment,
        result,
    } = w;
    match result {
        Ok(path) => {
            m.completed.inc();
            m.duration_ms.set(duration.as_millis() as i64);
            m.size_bytes.set(bytes as i64);
            m.alignment_ms.set(alignment.as_millis() as i64);
            m.duration_seconds.observe(duration.as_secs_f64());
            m.size_histogram.observe(bytes as f64);
            // After the metrics: whoever sees it complete in the API finds it counted.
            status.checkpoint_completed(id, &path);
            tracing::info!(checkpoint = %id, bytes, duration_ms = duration.as_millis() as u64, path = %path.display(), "checkpoint complete");
            if kind == CheckpointKind::Savepoint {
                eprintln!(
                    "[weir] job '{name}': savepoint {id} written to {}",
                    path.display()
                );
                savepoints.push(path);
            }
            c.completed(Instant::now(), id)
        }
        Err(e) => {
            tracing::warn!(checkpoint = %id, error = %e, "writing the checkpoint failed");
            c.completion_failed(Instant::now(), id, e.to_string())
        }
    }
}

/// What a finished job reports.
#[derive(Debug, Clone)]
pub struct JobResult {
    /// The job's name.
    pub name: String,
    /// Wall-clock time from start to the end of the last task.
    pub elapsed: Duration,
    /// Per-task statistics.
    pub tasks: Vec<TaskStats>,
    /// Savepoints taken while the job ran, in order.
    pub savepoints: Vec<PathBuf>,
    /// True when the job stopped with a savepoint instead of running to the end.
    pub stopped_with_savepoint: bool,
    /// Checkpoints (including savepoints) completed over all attempts.
    pub checkpoints_completed: u64,
    /// Restarts after failures.
    pub restarts: u32,
}

impl JobResult {
    /// Total records emitted by all sources.
    pub fn records_read(&self) -> u64 {
        self.tasks
            .iter()
            .filter(|t| t.is_source)
            .map(|t| t.records)
            .sum()
    }
}

/// A running job: cancel it or wait for it.
pub struct JobHandle {
    shared: Arc<JobShared>,
    thread: std::thread::JoinHandle<Result<JobResult>>,
    /// The REST API and metrics server; it ends with the handle.
    server: Option<crate::web::WebServer>,
}

impl JobHandle {
    /// Where the job serves its metrics (`GET /metrics`), when
    /// [`JobConfig::metrics_address`] or [`JobConfig::web_address`] is set: the bound
    /// address, with the actual port if port 0 was asked for. The server answers until
    /// the handle is joined (or dropped), so a finished job's final figures can still be
    /// read before [`JobHandle::join`].
    pub fn metrics_address(&self) -> Option<std::net::SocketAddr> {
        self.server.as_ref().map(|s| s.address())
    }

    /// Where the job serves its REST API (`/v1/...`) and metrics: the same server as
    /// [`JobHandle::metrics_address`].
    pub fn web_address(&self) -> Option<std::net::SocketAddr> {
        self.metrics_address()
    }

    /// Asks every task to stop; `join` then returns [`Error::Cancelled`].
    pub fn cancel(&self) {
        self.shared.cancel.store(true, Ordering::SeqCst);
        self.shared.status.cancelling();
    }

    /// Takes a savepoint while the job keeps running; its path is logged and listed in
    /// [`JobResult::savepoints`]. Requires checkpointing to be configured.
    pub fn trigger_savepoint(&self) {
        self.shared.savepoint_request.fetch_max(1, Ordering::SeqCst);
    }

    /// Takes a savepoint, commits the sinks up to it, and stops the job; `join` returns
    /// a result with `stopped_with_savepoint` set.
    pub fn stop_with_savepoint(&self) {
        self.shared.savepoint_request.store(2, Ordering::SeqCst);
    }

    /// Waits for the job to end; the REST API and metrics server then stop.
    pub fn join(mut self) -> Result<JobResult> {
        let r = self
            .thread
            .join()
            .unwrap_or_else(|p| Err(Error::from_panic(p)));
        if let Some(mut s) = self.server.take() {
            s.stop();
        }
        r
    }

    /// True when the job has ended (successfully or not).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
}

/// Runs `graph` to completion.
pub fn execute(name: &str, graph: Graph, cfg: JobConfig) -> Result<JobResult> {
    start(name, graph, cfg)?.join()
}

/// Starts `graph` in the background.
pub fn start(name: &str, graph: Graph, cfg: JobConfig) -> Result<JobHandle> {
    cfg.validate()?;
    let plan = Plan::new(&graph, &cfg)?;
    let web = cfg
        .web_address
        .as_ref()
        .map(|a| (a.clone(), "the REST API"))
        .or_else(|| cfg.metrics_address.as_ref().map(|a| (a.clone(), "metrics")));
    let status = Arc::new(crate::status::JobStatus::new(
        name,
        &graph,
        &plan,
        &cfg,
        cfg.web_address.is_some(),
    ));
    let shared = Arc::new(JobShared {
        graph,
        plan,
        cfg,
        cancel: AtomicBool::new(false),
        savepoint_request: std::sync::atomic::AtomicU8::new(0),
        status,
    });
    let job = shared.clone();
    let name = name.to_string();
    let server = match web {
        Some((address, what)) => Some(crate::web::WebServer::start(
            &address,
            what,
            shared.clone(),
        )?),
        None => None,
    };
    let thread = std::thread::Builder::new()
        .name(format!("weir-job-{name}"))
        .spawn(move || {
            let status = job.status.clone();
            let r = match job.cfg.cluster.clone() {
                Some(cluster) => crate::cluster::run(&name, job, &cluster),
                None => run(&name, job),
            };
            if let Err(e) = &r
                && !matches!(e, Error::Cancelled)
            {
                status.job_exception(e);
            }
            status.ended(&r);
            r
        })
        .map_err(|e| Error::io("spawning the job thread", e))?;
    Ok(JobHandle {
        shared,
        thread,
        server,
    })
}

/// A running task, as the attempt loop sees it.
pub(crate) struct Running {
    pub name: String,
    pub subtask: usize,
    pub parallelism: usize,
    pub is_source: bool,
    pub key: TaskKey,
    /// Records read or received so far (local tasks; remote ones report 0).
    pub progress: Arc<AtomicU64>,
    pub commands: Commands,
}

/// Where a task's commands go.
pub(crate) enum Commands {
    /// A task thread of this process.
    Local(Sender<TaskCommand>),
    /// A task on a cluster worker.
    Remote(Box<dyn Fn(TaskCommand) + Send>),
}

impl Commands {
    pub(crate) fn send(&self, cmd: TaskCommand) {
        match self {
            Commands::Local(s) => {
                let _ = s.send(cmd);
            }
            Commands::Remote(f) => f(cmd),
        }
    }
}

/// What one attempt of the job ended with.
struct Attempt {
    result: Result<Vec<TaskStats>>,
    /// The latest checkpoint completed during the attempt.
    completed: Option<CheckpointId>,
    /// Savepoints written during the attempt.
    savepoints: Vec<PathBuf>,
    /// The attempt ended because a stop-with-savepoint completed.
    stopped: bool,
    /// Checkpoints completed during the attempt.
    completed_count: u64,
}

fn run(name: &str, job: Arc<JobShared>) -> Result<JobResult> {
    run_with(name, job, &mut LocalExecutor::default())
}

/// Runs the job's attempts on `executor` until it ends, fails for good or is cancelled.
pub(crate) fn run_with(
    name: &str,
    job: Arc<JobShared>,
    executor: &mut dyn Executor,
) -> Result<JobResult> {
    let started = Instant::now();
    let storage = match &job.cfg.checkpoint {
        Some(c) => Some(CheckpointStorage::open(&c.dir).map_err(|e| Error::Config(e.to_string()))?),
        None => None,
    };
    // One run at a time owns the checkpoint and sink output directories: taken before
    // anything is restored, cleaned up or written.
    let (storage, _ownership) = crate::owner::claim(name, &job, storage)?;
    let mut attempt = 0u32;
    let mut restarts = job
        .cfg
        .checkpoint
        .as_ref()
        .map(|c| crate::restart::Restarts::new(c.restart, started, restart_seed()));
    let mut savepoints = Vec::new();
    let mut checkpoints_completed = 0u64;
    let mut explicit = job
        .cfg
        .checkpoint
        .as_ref()
        .and_then(|c| c.restore_from.clone());
    loop {
        let mut restore = None;
        let mut first_id = CheckpointId(1);
        if let Some(storage) = &storage {
            if let Some((manifest, path)) = checkpoints::find_restore(
                storage,
                explicit.as_deref(),
                job.cfg
                    .checkpoint
                    .as_ref()
                    .is_some_and(|c| c.start_fresh_if_unusable),
            )? {
                // A checkpoint directory belongs to one job: resuming another job's
                // checkpoint by accident would mix its state into this one. An explicit
                // restore path (a savepoint) may come from a job of another name.
                if explicit.is_none() && manifest.job != name {
                    return Err(Error::Config(format!(
                        "checkpoint directory {} holds checkpoints of job '{}', not of job '{name}': give this job its own checkpoint directory, or restore that checkpoint explicitly (CheckpointConfig::restore_from) if it is meant for this job",
                        storage.dir().display(),
                        manifest.job
                    )));
                }
                eprintln!("{}", resume_line(name, &manifest, &path));
                tracing::info!(checkpoint = %manifest.checkpoint_id, path = %path.display(), "restoring");
                restore = Some((manifest, path));
            }
            // Checkpoint ids never repeat within a job's lineage: above everything in this
            // directory, and above the checkpoint or savepoint restored (which may come from
            // another directory). Sinks name committed output by checkpoint id.
            first_id = storage
                .next_id()
                .map_err(|e| Error::Config(e.to_string()))?;
            if let Some((manifest, _)) = &restore {
                first_id = first_id.max(CheckpointId(manifest.checkpoint_id.0.saturating_add(1)));
            }
        }
        // A restore commits and deletes sink files: only while this run owns the directories.
        crate::owner::verify(storage.as_ref())?;
        job.status.attempt_started(attempt);
        let outcome = match executor.launch(&job, storage.as_ref(), restore.as_ref()) {
            Ok(launched) => run_attempt(name, &job, storage.as_ref(), launched, first_id, started),
            Err(e) => Err(e),
        };
        executor.attempt_ended();
        job.status.attempt_ended();
        let outcome = outcome?;
        savepoints.extend(outcome.savepoints.iter().cloned());
        checkpoints_completed += outcome.completed_count;
        if outcome.stopped {
            return Ok(JobResult {
                name: name.to_string(),
                elapsed: started.elapsed(),
                tasks: outcome.result.unwrap_or_default(),
                savepoints,
                stopped_with_savepoint: true,
                checkpoints_completed,
                restarts: attempt,
            });
        }
        match outcome.result {
            Ok(tasks) => {
                return Ok(JobResult {
                    name: name.to_string(),
                    elapsed: started.elapsed(),
                    tasks,
                    savepoints,
                    stopped_with_savepoint: false,
                    checkpoints_completed,
                    restarts: attempt,
                });
            }
            // After JobHandle::cancel, tasks stop with Cancelled or, depending on which one
            // noticed first, with a closed channel: report the cancellation itself.
            Err(e) if job.cancel.load(Ordering::SeqCst) && e.is_secondary() => {
                return Err(Error::Cancelled);
            }
            Err(e) if job.cancel.load(Ordering::SeqCst) => return Err(e),
            Err(e) => {
                let (Some(cfg), Some(restarts)) = (&job.cfg.checkpoint, restarts.as_mut()) else {
                    return Err(e);
                };
                if e.is_deterministic() {
                    eprintln!(
                        "[weir] job '{name}' failed: {e}; not restarting, since a restart would fail the same way"
                    );
                    return Err(e);
                }
                let delay = match restarts.on_failure(Instant::now()) {
                    crate::restart::Decision::GiveUp { reason } => {
                        eprintln!(
                            "[weir] job '{name}' failed after {attempt} restart{}: {e}; not restarting: {reason}",
                            if attempt == 1 { "" } else { "s" }
                        );
                        tracing::error!(restarts = attempt, strategy = %cfg.restart, %reason, "giving up");
                        return Err(e);
                    }
                    crate::restart::Decision::Restart { delay, note } => {
                        job.status.restarting();
                        attempt += 1;
                        eprintln!(
                            "[weir] job '{name}' failed: {e}; restarting from the last complete checkpoint \
                             in {} ms (restart {attempt}; {note})",
                            delay.as_millis()
                        );
                        delay
                    }
                };
                // After a restart, resume from the newest checkpoint, not an explicit old one.
                if outcome.completed.is_some() {
                    explicit = None;
                }
                let deadline = Instant::now() + delay;
                while Instant::now() < deadline {
                    if job.cancel.load(Ordering::SeqCst) {
                        return Err(Error::Cancelled);
                    }
                    std::thread::sleep(Duration::from_millis(10).min(deadline - Instant::now()));
                }
            }
        }
    }
}

/// A seed for the restart delays' jitter, different in every run.
fn restart_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ ((std::process::id() as u64) << 32)
}

/// One attempt's tasks, wherever they run: their handles, the events they report, and
/// how to cancel them.
pub(crate) struct Launched {
    pub running: Vec<Running>,
    pub events: crossbeam_channel::Receiver<TaskEvent>,
    /// Set when the attempt must stop (a task failed, or the job was cancelled).
    pub cancel: Arc<AtomicBool>,
    /// Called once when `cancel` is first seen set (a cluster tells its workers).
    pub on_cancel: Box<dyn Fn() + Send>,
    pub threads: Vec<std::thread::JoinHandle<()>>,
}

/// Where a job's tasks run: threads of this process, or the workers of a cluster.
pub(crate) trait Executor {
    /// Starts the tasks of one attempt, restored from `restore` when given.
    fn launch(
        &mut self,
        job: &Arc<JobShared>,
        storage: Option<&CheckpointStorage>,
        restore: Option<&(weir_checkpoint::Manifest, PathBuf)>,
    ) -> Result<Launched>;
    /// The attempt's tasks have all ended.
    fn attempt_ended(&mut self) {}
}

/// Runs every task on a thread of this process.
#[derive(Default)]
pub(crate) struct LocalExecutor {
    /// Local copies of restored backend files, removed when the attempt ends.
    restore_dir: Option<PathBuf>,
}

impl Drop for LocalExecutor {
    fn drop(&mut self) {
        self.attempt_ended();
    }
}

impl Executor for LocalExecutor {
    fn launch(
        &mut self,
        job: &Arc<JobShared>,
        storage: Option<&CheckpointStorage>,
        restore: Option<&(weir_checkpoint::Manifest, PathBuf)>,
    ) -> Result<Launched> {
        let mut map = RestoreMap::new();
        if let (Some(storage), Some((manifest, path))) = (storage, restore) {
            let local = restore_scratch_dir();
            let r = checkpoints::restore_map(
                storage,
                manifest,
                path,
                &job.graph,
                &job.plan,
                job.cfg.max_parallelism,
                &local,
            );
            self.restore_dir = Some(local);
            map = r?;
        }
        launch_local(job, map, None)
    }

    fn attempt_ended(&mut self) {
        if let Some(dir) = self.restore_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A fresh directory name for restored backend files (`weir-restore-{owner tag}-{nanos}`).
pub(crate) fn restore_scratch_dir() -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    remove_orphan_restore_dirs();
    let owner = weir_core::scratch::owner_tag();
    std::env::temp_dir().join(format!("weir-restore-{owner}-{nanos:x}"))
}

/// Which tasks of the graph this process runs, and how its channels to the other
/// processes are carried (cluster workers).
pub(crate) struct Subset<'a> {
    /// Tasks (head node, subtask) this process runs.
    pub local: &'a std::collections::HashSet<(usize, usize)>,
    /// Receives the channel links that cross to another process.
    pub links: &'a mut dyn FnMut(crate::task::LinkKey, weir_core::exchange::Link),
    /// The start gate also waits for one extra arrival (the cluster-wide start).
    pub start: Arc<task::StartGate>,
}

/// Spawns the threads of the tasks (all of them, or the `subset` of a cluster worker).
pub(crate) fn launch_local(
    job: &Arc<JobShared>,
    mut restore: RestoreMap,
    subset: Option<Subset<'_>>,
) -> Result<Launched> {
    let cancel = Arc::new(AtomicBool::new(false));
    let (events_tx, events_rx) = crossbeam_channel::unbounded::<TaskEvent>();
    let specs = task_specs(job, &cancel, &events_tx, &mut restore, subset)?;
    drop(events_tx);
    let mut running: Vec<Running> = Vec::new();
    let mut threads = Vec::new();
    for (spec, commands) in specs {
        let node = &job.graph.nodes[spec.head];
        running.push(Running {
            name: node.name.clone(),
            subtask: spec.subtask,
            parallelism: job.plan.parallelism[spec.head],
            is_source: node.kind == NodeKind::Source,
            key: TaskKey::new(spec.head, spec.subtask),
            progress: spec.progress.clone(),
            commands: Commands::Local(commands),
        });
        let job = job.clone();
        let cancel = cancel.clone();
        let events = spec.events.clone();
        let index = spec.index;
        let t = std::thread::Builder::new()
            .name(format!("weir-{}-{}", node.name, spec.subtask))
            .spawn(move || {
                let r = catch_unwind(AssertUnwindSafe(|| task::run(&job, spec)));
                if matches!(r, Ok(Err(ref e)) if !e.is_secondary()) || r.is_err() {
                    cancel.store(true, Ordering::SeqCst);
                }
                let _ = events.send(TaskEvent::Done {
                    task: index,
                    result: r,
                });
            })
            .map_err(|e| Error::io("spawning a task thread", e))?;
        threads.push(t);
    }
    Ok(Launched {
        running,
        events: events_rx,
        cancel,
        on_cancel: Box::new(|| {}),
        threads,
    })
}

fn run_attempt(
    name: &str,
    job: &Arc<JobShared>,
    storage: Option<&CheckpointStorage>,
    launched: Launched,
    first_id: CheckpointId,
    started: Instant,
) -> Result<Attempt> {
    let Launched {
        running,
        events: events_rx,
        cancel,
        on_cancel,
        threads,
    } = launched;
    let mut cancel_sent = false;
    let mut coordinator = match &job.cfg.checkpoint {
        Some(c) => {
            let sources = running.iter().filter(|t| t.is_source).map(|t| t.key);
            let others = running.iter().filter(|t| !t.is_source).map(|t| t.key);
            let cc = CoordinatorConfig {
                interval: c.interval,
                min_pause: c.min_pause,
                timeout: c.timeout,
                max_concurrent: 1,
            };
            Some(
                Coordinator::<Snapshots>::new(
                    cc,
                    CoordParticipants::new(sources, others),
                    first_id,
                )
                .map_err(|e| Error::Config(e.to_string()))?,
            )
        }
        None => None,
    };
    if let Some(c) = coordinator.as_mut() {
        // The first tick starts the interval clock.
        let first = c.tick(Instant::now());
        debug_assert!(first.is_empty(), "the first tick triggers nothing");
    }
    let by_key: HashMap<TaskKey, usize> = running
        .iter()
        .enumerate()
        .map(|(i, t)| (t.key, i))
        .collect();
    let progress = job.cfg.progress_interval;
    let mut next_progress = progress.map(|p| Instant::now() + p);
    let mut stats: Vec<Option<u64>> = vec![None; running.len()];
    let mut first_error: Option<Error> = None;
    let mut secondary: Option<Error> = None;
    let mut remaining = running.len();
    let mut sources_left: usize = running.iter().filter(|t| t.is_source).count();
    let mut completed: Option<CheckpointId> = None;
    let mut completed_count = 0u64;
    let mut savepoints = Vec::new();
    let mut stop_after: Option<CheckpointId> = None;
    let mut stopped = false;
    let mut finished_sources = std::collections::HashSet::new();
    // Checkpoints are written (files copied to storage, then the manifest) on a writer
    // thread, in the order they completed, so this loop keeps handling acknowledgements,
    // failures and progress while a large checkpoint uploads; the writer reports back on
    // `written_rx`.
    let (written_tx, written_rx) = crossbeam_channel::unbounded::<Written>();
    let ck_metrics = CheckpointMetrics::new(name);
    let writer = match storage {
        Some(storage) => Some(CheckpointWriter::start(
            storage.clone(),
            name,
            checkpoints::OperatorNames::new(&job.graph, &job.plan),
            job.cfg.max_parallelism,
            written_tx,
        )?),
        None => None,
    };
    while remaining > 0 {
        let now = Instant::now();
        let mut wake = now + Duration::from_millis(50);
        if let Some(t) = next_progress {
            wake = wake.min(t);
        }
        if let Some(d) = coordinator.as_ref().and_then(|c| c.next_deadline()) {
            wake = wake.min(d);
        }
        let mut actions = Vec::new();
        let received = crossbeam_channel::select! {
            recv(events_rx) -> m => m.map_err(|_| crossbeam_channel::RecvTimeoutError::Disconnected),
            recv(written_rx) -> w => {
                if let (Ok(w), Some(c)) = (w, coordinator.as_mut()) {
                    actions.extend(on_written(name, w, c, &mut savepoints, &ck_metrics, &job.status));
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout)
            }
            default(wake.saturating_duration_since(now)) => Err(crossbeam_channel::RecvTimeoutError::Timeout),
        };
        match received {
            Ok(TaskEvent::Ack {
                task,
                id,
                snapshot,
                alignment,
                sync,
            }) => {
                if let Some(c) = coordinator.as_mut() {
                    let bytes = snapshot.values().map(|s| s.bytes() as u64).sum();
                    let t = &running[task];
                    job.status.checkpoint_acked(
                        id,
                        t.key.node.0,
                        t.subtask,
                        bytes,
                        alignment,
                        sync,
                    );
                    let st = AckStats {
                        bytes,
                        alignment,
                        sync,
                        async_: Duration::ZERO,
                    };
                    actions.extend(c.ack(Instant::now(), running[task].key, id, snapshot, st));
                }
            }
            Ok(TaskEvent::SourceFinished { task }) => {
                if finished_sources.insert(task) {
                    sources_left = sources_left.saturating_sub(1);
                }
                if sources_left == 0
                    && let Some(c) = coordinator.as_mut()
                {
                    actions.extend(c.trigger_now(Instant::now(), CheckpointKind::Final));
                }
            }
            Ok(TaskEvent::Done { task, result }) => {
                remaining -= 1;
                let t = &running[task];
                match result {
                    Ok(Ok(n)) => stats[task] = Some(n),
                    Ok(Err(e)) if e.is_secondary() => {
                        secondary.get_or_insert(e);
                    }
                    Ok(Err(e)) => {
                        tracing::error!(task = %t.name, subtask = t.subtask, error = %e, "task failed");
                        job.status.exception(&t.name, t.subtask, &e);
                        cancel.store(true, Ordering::SeqCst);
                        first_error.get_or_insert(e);
                    }
                    Err(panic) => {
                        let e = Error::from_panic(panic).at(|| weir_core::error::Location {
                            operator: t.name.clone(),
                            subtask: t.subtask,
                            parallelism: t.parallelism,
                        });
                        job.status.exception(&t.name, t.subtask, &e);
                        cancel.store(true, Ordering::SeqCst);
                        first_error.get_or_insert(e);
                    }
                }
                if stats[task].is_none()
                    && let Some(c) = coordinator.as_mut()
                {
                    actions.extend(c.task_failed(Instant::now(), t.key));
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        }
        if job.cancel.load(Ordering::SeqCst) {
            cancel.store(true, Ordering::SeqCst);
        }
        if let Some(e) = crate::owner::lost(storage) {
            // Another run took the directories over: stop, with that as the reason.
            cancel.store(true, Ordering::SeqCst);
            first_error = Some(e);
        }
        if cancel.load(Ordering::SeqCst) && !cancel_sent {
            cancel_sent = true;
            on_cancel();
        }
        if let (Some(c), Some(storage)) = (coordinator.as_mut(), storage) {
            // Requests from JobHandle or from `weir savepoint` (a request file in the directory).
            let mut request = job.savepoint_request.swap(0, Ordering::SeqCst);
            request = request.max(take_request_file(storage.dir()));
            if request > 0 && stop_after.is_none() && !cancel.load(Ordering::SeqCst) {
                eprintln!(
                    "[weir] job '{name}': taking a savepoint{}",
                    if request == 2 { " and stopping" } else { "" }
                );
                let before = c.next_id();
                actions.extend(c.trigger_now(Instant::now(), CheckpointKind::Savepoint));
                if request == 2 {
                    stop_after = Some(before);
                }
            }
        }
        if let (Some(p), Some(t)) = (progress, next_progress)
            && Instant::now() >= t
        {
            print_progress(name, &running, started);
            next_progress = Some(Instant::now() + p);
        }
        let Some(c) = coordinator.as_mut() else {
            continue;
        };
        if !cancel.load(Ordering::SeqCst) {
            actions.extend(c.tick(Instant::now()));
        }
        let mut queue: std::collections::VecDeque<_> = actions.into();
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Trigger { id, sources, kind } => {
                    job.status.checkpoint_triggered(id, kind);
                    let is_final = kind == CheckpointKind::Final;
                    for k in sources {
                        running[by_key[&k]]
                            .commands
                            .send(TaskCommand::Trigger(id, is_final));
                    }
                }
                Action::Complete {
                    id,
                    kind,
                    acks,
                    stats,
                } => {
                    job.status.checkpoint_acknowledged(id, &stats);
                    let writer = writer.as_ref().expect("checkpointing has a writer");
                    let stops_job =
                        kind == CheckpointKind::Savepoint && stop_after.is_some_and(|s| id >= s);
                    if let Err(e) = writer.write(id, kind, stops_job, acks, stats) {
                        queue.extend(c.completion_failed(Instant::now(), id, e));
                    }
                }
                Action::Notify { id, kind } => {
                    // Sinks commit on this notification: only while this run owns the
                    // directories.
                    if let Err(e) = crate::owner::verify(storage) {
                        cancel.store(true, Ordering::SeqCst);
                        first_error = Some(e);
                        continue;
                    }
                    completed_count += 1;
                    let stops =
                        kind == CheckpointKind::Savepoint && stop_after.is_some_and(|s| id >= s);
                    // An intermediate savepoint commits nothing (decision 0017): its epoch is
                    // committed by the next checkpoint, so a crash after it resumes from the
                    // last checkpoint without output that no checkpoint covers. A savepoint
                    // that stops the job commits, and is a recovery point of its directory.
                    if kind != CheckpointKind::Savepoint || stops {
                        completed = Some(id);
                        for t in &running {
                            t.commands.send(TaskCommand::Complete(id));
                        }
                    }
                    if stops {
                        // Tasks handle commands in order: they commit, then stop.
                        stopped = true;
                        for t in &running {
                            t.commands.send(TaskCommand::Stop);
                        }
                    }
                    if let Some(cfg) = &job.cfg.checkpoint
                        && let Err(e) = storage.expect("storage").retain(cfg.retain)
                    {
                        tracing::warn!(error = %e, "removing old checkpoints failed");
                    }
                }
                Action::Abort { id, reason, kind } => {
                    tracing::info!(checkpoint = %id, %reason, "checkpoint aborted");
                    job.status.checkpoint_failed(id, reason.to_string());
                    ck_metrics.failed.inc();
                    if kind == CheckpointKind::Final && !cancel.load(Ordering::SeqCst) {
                        // The job cannot end without its final checkpoint: try again.
                        eprintln!(
                            "[weir] job '{name}': final checkpoint {id} aborted ({reason}); retrying"
                        );
                        queue.extend(c.trigger_now(Instant::now(), CheckpointKind::Final));
                    }
                    if let Some(storage) = storage
                        && let Err(e) = storage.discard(id)
                    {
                        tracing::warn!(checkpoint = %id, error = %e, "removing an aborted checkpoint failed");
                    }
                    for t in &running {
                        t.commands.send(TaskCommand::Abort(id));
                    }
                }
            }
        }
    }
    for t in threads {
        let _ = t.join();
    }
    // A checkpoint still being written when the job ended is finished (or fails) before
    // the job returns, so nothing writes to the checkpoint directory afterwards.
    if let Some(w) = writer {
        w.finish();
    }
    if let Some(e) = crate::owner::lost(storage) {
        first_error = Some(e);
    }
    let result = if stopped && first_error.is_none() {
        Ok(())
    } else if let Some(e) = first_error.or(secondary) {
        Err(e)
    } else {
        if progress.is_some() {
            print_progress(name, &running, started);
        }
        Ok(())
    };
    let stopped = stopped && result.is_ok();
    let tasks = running
        .into_iter()
        .zip(stats)
        .map(|(t, n)| TaskStats {
            name: t.name,
            subtask: t.subtask,
            records: n.unwrap_or(0),
            is_source: t.is_source,
        })
        .collect();
    Ok(Attempt {
        result: result.map(|()| tasks),
        completed,
        savepoints,
        stopped,
        completed_count,
    })
}

/// Removes restore directories (`weir-restore-{owner tag}-{nanos}`) of processes that are
/// gone.
fn remove_orphan_restore_dirs() {
    weir_core::scratch::remove_orphans(&std::env::temp_dir(), |name| {
        name.strip_prefix("weir-restore-")?.split('-').next()
    });
}

/// The name of the request file `weir savepoint` drops into the checkpoint directory.
pub const SAVEPOINT_REQUEST_FILE: &str = "_savepoint_request";

/// Consumes a savepoint request file: 0 = none, 1 = savepoint, 2 = savepoint and stop.
fn take_request_file(dir: &std::path::Path) -> u8 {
    let path = dir.join(SAVEPOINT_REQUEST_FILE);
    let Ok(content) = std::fs::read_to_string(&path) else {
        return 0;
    };
    let _ = std::fs::remove_file(&path);
    if content.trim() == "stop" { 2 } else { 1 }
}

fn print_progress(name: &str, running: &[Running], started: Instant) {
    let read: u64 = running
        .iter()
        .filter(|t| t.is_source)
        .map(|t| t.progress.load(Ordering::Relaxed))
        .sum();
    let processed: u64 = running
        .iter()
        .filter(|t| !t.is_source)
        .map(|t| t.progress.load(Ordering::Relaxed))
        .sum();
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "[weir] job '{name}': {read} records read, {processed} records received by downstream tasks, {secs:.1}s ({:.0} records/s)",
        read as f64 / secs.max(1e-9)
    );
}

fn task_specs(
    job: &JobShared,
    cancel: &Arc<AtomicBool>,
    events: &Sender<TaskEvent>,
    restore: &mut RestoreMap,
    mut subset: Option<Subset<'_>>,
) -> Result<Vec<(TaskSpec, Sender<TaskCommand>)>> {
    let (graph, plan, cfg) = (&job.graph, &job.plan, &job.cfg);
    let xcfg = ExchangeConfig {
        batch_size: cfg.batch_size,
        channel_capacity: cfg.channel_capacity,
        flush_interval_ms: cfg.flush_interval.as_millis() as i64,
        max_parallelism: cfg.max_parallelism,
    };
    let local_set = subset.as_ref().map(|x| x.local);
    let is_local = |head: usize, s: usize| local_set.is_none_or(|l| l.contains(&(head, s)));
    let mut specs: HashMap<(usize, usize), (TaskSpec, Sender<TaskCommand>)> = HashMap::new();
    let start = match &subset {
        Some(x) => x.start.clone(),
        None => {
            let tasks: usize = plan.heads.iter().map(|&h| plan.parallelism[h]).sum();
            Arc::new(task::StartGate::new(tasks))
        }
    };
    for &h in &plan.heads {
        for s in 0..plan.parallelism[h] {
            if !is_local(h, s) {
                continue;
            }
            let (ctx, crx) = crossbeam_channel::unbounded();
            // The restored state of every node of this task's chain, for this subtask.
            let mut chain_restore = HashMap::new();
            for n in 0..graph.nodes.len() {
                if plan.head_of[n] == h
                    && let Some(per) = restore.get_mut(&n)
                    && s < per.len()
                {
                    chain_restore.insert(n, std::mem::take(&mut per[s]));
                }
            }
            specs.insert(
                (h, s),
                (
                    TaskSpec {
                        index: 0,
                        head: h,
                        subtask: s,
                        writers: HashMap::new(),
                        readers: (0..graph.nodes[h].inputs.len()).map(|_| None).collect(),
                        progress: Arc::new(AtomicU64::new(0)),
                        commands: crx,
                        events: events.clone(),
                        cancel: cancel.clone(),
                        restore: chain_restore,
                        start: start.clone(),
                        metrics: job.status.task(graph, plan, h, s),
                    },
                    ctx,
                ),
            );
        }
    }
    for node in &graph.nodes {
        let c = node.id.0;
        if plan.chained[c] {
            continue;
        }
        for (gate, edge) in node.inputs.iter().enumerate() {
            let f = edge.from.0;
            let (producers, consumers) = (plan.parallelism[f], plan.parallelism[c]);
            let mut set = match &subset {
                Some(_) => edge.exchange.linked_channels(producers, consumers, xcfg),
                None => edge.exchange.channels(producers, consumers, xcfg),
            };
            if let Some(x) = subset.as_mut() {
                // A channel between two tasks of this process stays a plain channel; one
                // that crosses to another process is bridged over the network; one between
                // two other processes is none of this process's business.
                for link in std::mem::take(&mut set.links) {
                    let from_here = is_local(plan.head_of[f], link.producer);
                    let to_here = is_local(c, link.consumer);
                    if from_here != to_here {
                        let key = task::LinkKey {
                            node: c as u32,
                            gate: gate as u32,
                            producer: link.producer as u32,
                            consumer: link.consumer as u32,
                        };
                        (x.links)(key, link);
                    }
                }
            }
            for (p, w) in set.writers.into_iter().enumerate() {
                let key: WriterKey = (f, edge.port, c, gate);
                if let Some((spec, _)) = specs.get_mut(&(plan.head_of[f], p)) {
                    spec.writers.insert(key, w);
                } else if subset.is_none() {
                    return Err(Error::Config("internal: no task".into()));
                }
            }
            for (s, r) in set.readers.into_iter().enumerate() {
                if let Some((spec, _)) = specs.get_mut(&(c, s)) {
                    spec.readers[gate] = Some(r);
                } else if subset.is_none() {
                    return Err(Error::Config("internal: no task".into()));
                }
            }
        }
    }
    let mut out: Vec<(TaskSpec, Sender<TaskCommand>)> = specs.into_values().collect();
    out.sort_by_key(|(s, _)| (s.head, s.subtask));
    for (i, (s, _)) in out.iter_mut().enumerate() {
        s.index = i;
    }
    Ok(out)
}

/// The line a run prints when it resumes: which checkpoint or savepoint, and, for the final
/// checkpoint of a bounded job, that the job had already finished.
fn resume_line(name: &str, manifest: &weir_checkpoint::Manifest, path: &std::path::Path) -> String {
    if manifest.kind == weir_checkpoint::CheckpointKind::Final {
        format!(
            "[weir] job '{name}' had already finished: resuming after its end (final checkpoint {}, {}); sources that had reached their end read nothing more. To process the input again, give the job a new checkpoint directory.",
            manifest.checkpoint_id,
            path.display()
        )
    } else {
        format!(
            "[weir] job '{name}': resuming from {} {} ({})",
            manifest.kind,
            manifest.checkpoint_id,
            path.display()
        )
    }
}
