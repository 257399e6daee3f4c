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
use crate::plan::Plan;
use crate::task::{self, JobShared, TaskCommand, TaskEvent, TaskSpec, WriterKey};
use attempt::run_attempt;
use crossbeam_channel::Sender;
use specs::task_specs;
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
use weir_core::checkpoint::{OperatorSnapshot, RestoreGate};
use weir_core::exchange::ExchangeConfig;
use weir_core::graph::{Graph, NodeKind};
use weir_core::ids::CheckpointId;
use weir_core::{Error, Result};
use writer::{CheckpointMetrics, CheckpointWriter, Written, on_written};

mod attempt;
mod requests;
mod restore;
pub(crate) use restore::restore_span;
mod specs;
mod verify;
mod writer;

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
    crate::logging::init_with(cfg.log_format)?;
    let plan = Plan::new(&graph, &cfg)?;
    let alignment = crate::alignment::Groups::new(&graph, &plan)?;
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
        alignment,
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
            let _span = tracing::info_span!("job", job = %name).entered();
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
    /// Whether the restored checkpoint's checksums, read while the attempt ran, verified
    /// (`None`: not read in the background, or not finished).
    verdict: Option<bool>,
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
    let mut refused = restore::Refused::default();
    // Read the checksums of the latest checkpoint before resuming from it, rather than while
    // the job runs: as configured, or after a checkpoint read that way failed to verify.
    let mut verify_first = !executor.verifies_in_background()
        || job
            .cfg
            .checkpoint
            .as_ref()
            .is_none_or(|c| c.verify_before_restore);
    loop {
        let _attempt = tracing::info_span!("attempt", attempt).entered();
        let mut resume = restore::Resume::fresh();
        if let Some(storage) = &storage {
            let found = restore::find(
                name,
                &job,
                storage,
                explicit.as_deref(),
                verify_first,
                &refused,
            );
            resume = match (found, job.cfg.checkpoint.as_ref(), restarts.as_mut()) {
                // A restart that cannot read its checkpoints (object storage restarting
                // after the very failure that stopped the attempt) waits and tries again,
                // as far as the restart strategy allows; a first start reports it at once.
                (Err(e), Some(cfg), Some(restarts)) if attempt > 0 && !e.is_deterministic() => {
                    let delay = restart_delay(name, &job, cfg, restarts, &mut attempt, e)?;
                    wait_for_restart(&job, delay)?;
                    continue;
                }
                (found, _, _) => found?,
            };
        }
        let restore::Resume {
            restore,
            verification,
            first_id,
        } = resume;
        // A restore commits and deletes sink files: only while this run owns the directories.
        crate::owner::verify(storage.as_ref())?;
        job.status.attempt_started(attempt);
        let gate = verification
            .as_ref()
            .map_or_else(RestoreGate::default, verify::BackgroundVerify::gate);
        let outcome = match executor.launch(&job, storage.as_ref(), restore.as_ref(), &gate) {
            Ok(launched) => run_attempt(
                name,
                &job,
                storage.as_ref(),
                launched,
                first_id,
                started,
                verification.as_ref(),
            ),
            Err(e) => Err(e),
        };
        executor.attempt_ended();
        job.status.attempt_ended();
        let verdict = verify::settle(name, &job, verification, &outcome);
        if verdict == Some(false) && !job.cancel.load(Ordering::SeqCst) {
            // Nothing of the attempt was committed: restore again, now verifying every
            // checkpoint in full first, which skips the bad one (not a failure of the job).
            tracing::info!(
                job = name,
                "job '{name}': restoring again from the newest checkpoint whose files all verify"
            );
            verify_first = true;
            continue;
        }
        // A checkpoint whose state does not restore would fail every restart the same way:
        // fall back to the one before it (not a failure of the job either).
        let failure = match &outcome {
            Err(e) => Some(e),
            Ok(a) => a.result.as_ref().err(),
        };
        if !job.cancel.load(Ordering::SeqCst)
            && refused.after(name, restore.as_ref(), explicit.is_some(), failure)?
        {
            continue;
        }
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
                    tracing::error!(
                        job = name,
                        error = %e,
                        "job '{name}' failed: {e}; not restarting, since a restart would fail the same way"
                    );
                    return Err(e);
                }
                let delay = restart_delay(name, &job, cfg, restarts, &mut attempt, e)?;
                // After a restart, resume from the newest checkpoint, not an explicit old one.
                if outcome.completed.is_some() {
                    explicit = None;
                }
                wait_for_restart(&job, delay)?;
            }
        }
    }
}

/// What the restart strategy says after the attempt failed with `e`: the delay before the
/// next attempt (counted in `attempt` and reported), or `e` when it gives up.
fn restart_delay(
    name: &str,
    job: &JobShared,
    cfg: &crate::config::CheckpointConfig,
    restarts: &mut crate::restart::Restarts,
    attempt: &mut u32,
    e: Error,
) -> Result<Duration> {
    match restarts.on_failure(Instant::now()) {
        crate::restart::Decision::GiveUp { reason } => {
            let attempt = *attempt;
            tracing::error!(
                job = name,
                restarts = attempt,
                strategy = %cfg.restart,
                error = %e,
                %reason,
                "job '{name}' failed after {attempt} restart{}: {e}; not restarting: {reason}",
                if attempt == 1 { "" } else { "s" }
            );
            Err(e)
        }
        crate::restart::Decision::Restart { delay, note } => {
            job.status.restarting();
            *attempt += 1;
            let attempt = *attempt;
            tracing::warn!(
                job = name,
                restart = attempt,
                delay_ms = delay.as_millis() as u64,
                error = %e,
                "job '{name}' failed: {e}; restarting from the last complete checkpoint \
                 in {} ms (restart {attempt}; {note})",
                delay.as_millis()
            );
            Ok(delay)
        }
    }
}

/// Sleeps `delay` before the next attempt, unless the job is cancelled meanwhile.
fn wait_for_restart(job: &JobShared, delay: Duration) -> Result<()> {
    let deadline = Instant::now() + delay;
    while Instant::now() < deadline {
        if job.cancel.load(Ordering::SeqCst) {
            return Err(Error::Cancelled);
        }
        std::thread::sleep(Duration::from_millis(10).min(deadline - Instant::now()));
    }
    Ok(())
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
    /// Starts the tasks of one attempt, restored from `restore` when given; its sinks
    /// commit restored output once `verified` passes.
    fn launch(
        &mut self,
        job: &Arc<JobShared>,
        storage: Option<&CheckpointStorage>,
        restore: Option<&(weir_checkpoint::Manifest, PathBuf)>,
        verified: &RestoreGate,
    ) -> Result<Launched>;
    /// True when its tasks can wait on a [`RestoreGate`]: a restore may then start them
    /// before the checkpoint's checksums are read (a cluster's workers verify what they
    /// restore themselves, so its coordinator reads the checksums first).
    fn verifies_in_background(&self) -> bool {
        false
    }
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
        verified: &RestoreGate,
    ) -> Result<Launched> {
        let mut map = RestoreMap::new();
        if let (Some(storage), Some((manifest, path))) = (storage, restore) {
            let _span = restore_span(manifest, path).entered();
            let local = restore_scratch_dir();
            let r = checkpoints::restore_map(
                storage,
                manifest,
                path,
                &job.graph,
                &job.plan,
                job.cfg.max_parallelism,
                &local,
                job.cfg.state_backend.local_recovery(),
                None,
            );
            self.restore_dir = Some(local);
            map = r?;
            for r in map.values_mut().flatten() {
                r.verified = verified.clone();
            }
        }
        launch_local(job, map, None)
    }

    fn verifies_in_background(&self) -> bool {
        true
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
    // Each task's events carry the job's and the attempt's spans, and its own.
    let parent = tracing::Span::current();
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
        let span = tracing::info_span!(
            parent: &parent,
            "task",
            operator = %node.name,
            subtask = spec.subtask
        );
        let t = std::thread::Builder::new()
            .name(format!("weir-{}-{}", node.name, spec.subtask))
            .spawn(move || {
                let _span = span.entered();
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

/// Removes restore directories (`weir-restore-{owner tag}-{nanos}`) of processes that are
/// gone.
fn remove_orphan_restore_dirs() {
    weir_core::scratch::remove_orphans(&std::env::temp_dir(), |name| {
        name.strip_prefix("weir-restore-")?.split('-').next()
    });
}

/// The name of the request file `weir savepoint` drops into the checkpoint directory.
pub const SAVEPOINT_REQUEST_FILE: &str = "_savepoint_request";

/// How log lines name a checkpoint of `kind`: "checkpoint", "final checkpoint", "savepoint".
pub(crate) fn noun(kind: CheckpointKind) -> &'static str {
    match kind {
        CheckpointKind::Checkpoint => "checkpoint",
        CheckpointKind::Final => "final checkpoint",
        CheckpointKind::Savepoint => "savepoint",
    }
}
