//! Running a job: channels, one thread per task, failure propagation, cancellation and
//! progress reporting.
//!
//! Shutdown protocol: every task reports its result on a completion channel. The first
//! root-cause failure (not a cancellation or a closed channel) sets the shared cancel
//! flag; tasks see it within one batch or 10 ms, or fail on a closed channel when their
//! neighbour exits. The job returns once every thread has been joined, with that first
//! failure, so it never hangs on a failed operator and never reports success after one.

use crate::JobConfig;
use crate::plan::Plan;
use crate::task::{self, JobShared, TaskSpec, WriterKey};
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use weir_core::exchange::ExchangeConfig;
use weir_core::graph::{Graph, NodeKind};
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

/// What a finished job reports.
#[derive(Debug, Clone)]
pub struct JobResult {
    /// The job's name.
    pub name: String,
    /// Wall-clock time from start to the end of the last task.
    pub elapsed: Duration,
    /// Per-task statistics.
    pub tasks: Vec<TaskStats>,
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
}

impl JobHandle {
    /// Asks every task to stop; `join` then returns [`Error::Cancelled`].
    pub fn cancel(&self) {
        self.shared.cancel.store(true, Ordering::SeqCst);
    }

    /// Waits for the job to end.
    pub fn join(self) -> Result<JobResult> {
        self.thread
            .join()
            .unwrap_or_else(|p| Err(Error::from_panic(p)))
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
    let shared = Arc::new(JobShared {
        graph,
        plan,
        cfg,
        cancel: AtomicBool::new(false),
    });
    let job = shared.clone();
    let name = name.to_string();
    let thread = std::thread::Builder::new()
        .name(format!("weir-job-{name}"))
        .spawn(move || run(&name, job))
        .map_err(|e| Error::io("spawning the job thread", e))?;
    Ok(JobHandle { shared, thread })
}

struct Running {
    name: String,
    subtask: usize,
    parallelism: usize,
    is_source: bool,
    progress: Arc<AtomicU64>,
}

fn run(name: &str, job: Arc<JobShared>) -> Result<JobResult> {
    let started = Instant::now();
    let specs = task_specs(&job)?;
    let (done_tx, done_rx) =
        crossbeam_channel::unbounded::<(usize, std::thread::Result<Result<u64>>)>();
    let mut running = Vec::new();
    let mut threads = Vec::new();
    for (i, spec) in specs.into_iter().enumerate() {
        let node = &job.graph.nodes[spec.head];
        running.push(Running {
            name: node.name.clone(),
            subtask: spec.subtask,
            parallelism: job.plan.parallelism[spec.head],
            is_source: node.kind == NodeKind::Source,
            progress: spec.progress.clone(),
        });
        let job = job.clone();
        let done = done_tx.clone();
        let t = std::thread::Builder::new()
            .name(format!("weir-{}-{}", node.name, spec.subtask))
            .spawn(move || {
                let r = catch_unwind(AssertUnwindSafe(|| task::run(&job, spec)));
                if matches!(r, Ok(Err(ref e)) if !e.is_secondary()) || r.is_err() {
                    job.cancel.store(true, Ordering::SeqCst);
                }
                let _ = done.send((i, r));
            })
            .map_err(|e| Error::io("spawning a task thread", e))?;
        threads.push(t);
    }
    drop(done_tx);
    let progress = job.cfg.progress_interval;
    let mut next_progress = progress.map(|p| Instant::now() + p);
    let mut stats: Vec<Option<u64>> = vec![None; running.len()];
    let mut first_error: Option<Error> = None;
    let mut secondary: Option<Error> = None;
    let mut remaining = running.len();
    while remaining > 0 {
        let wait = next_progress
            .map(|t| t.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_secs(3600));
        match done_rx.recv_timeout(wait) {
            Ok((i, r)) => {
                remaining -= 1;
                let t = &running[i];
                match r {
                    Ok(Ok(n)) => stats[i] = Some(n),
                    Ok(Err(e)) if e.is_secondary() => {
                        secondary.get_or_insert(e);
                    }
                    Ok(Err(e)) => {
                        tracing::error!(task = %t.name, subtask = t.subtask, error = %e, "task failed");
                        first_error.get_or_insert(e);
                    }
                    Err(panic) => {
                        let e = Error::from_panic(panic).at(|| weir_core::error::Location {
                            operator: t.name.clone(),
                            subtask: t.subtask,
                            parallelism: t.parallelism,
                        });
                        first_error.get_or_insert(e);
                    }
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                if let (Some(p), Some(_)) = (progress, next_progress) {
                    print_progress(name, &running, started);
                    next_progress = Some(Instant::now() + p);
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        }
    }
    for t in threads {
        let _ = t.join();
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    if let Some(e) = secondary {
        return Err(e);
    }
    if progress.is_some() {
        print_progress(name, &running, started);
    }
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
    Ok(JobResult {
        name: name.to_string(),
        elapsed: started.elapsed(),
        tasks,
    })
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

fn task_specs(job: &JobShared) -> Result<Vec<TaskSpec>> {
    let (graph, plan, cfg) = (&job.graph, &job.plan, &job.cfg);
    let xcfg = ExchangeConfig {
        batch_size: cfg.batch_size,
        channel_capacity: cfg.channel_capacity,
        flush_interval_ms: cfg.flush_interval.as_millis() as i64,
        max_parallelism: cfg.max_parallelism,
    };
    let mut specs: HashMap<(usize, usize), TaskSpec> = HashMap::new();
    for &h in &plan.heads {
        for s in 0..plan.parallelism[h] {
            specs.insert(
                (h, s),
                TaskSpec {
                    head: h,
                    subtask: s,
                    writers: HashMap::new(),
                    readers: (0..graph.nodes[h].inputs.len()).map(|_| None).collect(),
                    progress: Arc::new(AtomicU64::new(0)),
                },
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
            let set = edge
                .exchange
                .channels(plan.parallelism[f], plan.parallelism[c], xcfg);
            for (p, w) in set.writers.into_iter().enumerate() {
                let key: WriterKey = (f, edge.port, c, gate);
                let spec = specs
                    .get_mut(&(plan.head_of[f], p))
                    .ok_or_else(|| Error::Config("internal: no task".into()))?;
                spec.writers.insert(key, w);
            }
            for (s, r) in set.readers.into_iter().enumerate() {
                let spec = specs
                    .get_mut(&(c, s))
                    .ok_or_else(|| Error::Config("internal: no task".into()))?;
                spec.readers[gate] = Some(r);
            }
        }
    }
    let mut out: Vec<TaskSpec> = specs.into_values().collect();
    out.sort_by_key(|s| (s.head, s.subtask));
    Ok(out)
}
