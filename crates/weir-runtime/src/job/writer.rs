//! The job loop's checkpoint writer: the thread that writes completed checkpoints to
//! storage one after the other, and what the loop does with its reports (metrics, status,
//! the log line, the coordinator's next actions). It must not decide when checkpoints are
//! taken (the coordinator does) or what they contain (the tasks' acknowledgements).

use super::{Snapshots, noun};
use crate::checkpoints;
use crate::failpoint;
use crossbeam_channel::Sender;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use weir_checkpoint::{Action, CheckpointKind, CheckpointStorage, Coordinator, TaskKey};
use weir_core::ids::CheckpointId;
use weir_core::{Error, Result};

/// A checkpoint writer's report: checkpoint `id` is in storage (its path), or writing it
/// failed.
pub(super) struct Written {
    pub(super) id: CheckpointId,
    kind: CheckpointKind,
    bytes: u64,
    duration: Duration,
    alignment: Duration,
    result: Result<PathBuf>,
}

/// The job's checkpoint statistics as metrics (`weir::metrics`), labelled with the job.
pub(super) struct CheckpointMetrics {
    completed: weir_core::metrics::Counter,
    pub(super) failed: weir_core::metrics::Counter,
    duration_ms: weir_core::metrics::Gauge,
    size_bytes: weir_core::metrics::Gauge,
    alignment_ms: weir_core::metrics::Gauge,
    /// Every completed checkpoint's duration and size (the gauges keep only the last).
    duration_seconds: weir_core::metrics::Histogram,
    size_histogram: weir_core::metrics::Histogram,
}

impl CheckpointMetrics {
    pub(super) fn new(job: &str) -> Self {
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
    /// The checkpoint's span: events of the writing carry it.
    span: tracing::Span,
}

/// The thread that writes completed checkpoints to storage, one after the other.
pub(super) struct CheckpointWriter {
    jobs: Sender<WriteJob>,
    thread: std::thread::JoinHandle<()>,
    /// Set when the attempt ended without the writer ([`CheckpointWriter::abandon`]): it
    /// writes no checkpoint's metadata any more.
    abandoned: Arc<AtomicBool>,
}

impl CheckpointWriter {
    pub(super) fn start(
        storage: CheckpointStorage,
        job_name: &str,
        names: checkpoints::OperatorNames,
        max_parallelism: usize,
        done: Sender<Written>,
    ) -> Result<Self> {
        let (jobs, rx) = crossbeam_channel::unbounded::<WriteJob>();
        let job_name = job_name.to_string();
        let abandoned = Arc::new(AtomicBool::new(false));
        let fence = abandoned.clone();
        let thread = std::thread::Builder::new()
            .name("weir-checkpoint-writer".into())
            .spawn(move || {
                for WriteJob {
                    id,
                    kind,
                    stops_job,
                    acks,
                    stats,
                    span,
                } in rx
                {
                    let _span = span.entered();
                    failpoint::hit("checkpoint.before_metadata");
                    // Whether the checkpoint stores in-flight records (taken unaligned).
                    let in_flight = acks.iter().any(|(_, snaps)| {
                        snaps.values().any(|s| {
                            s.keyed
                                .get(weir_core::exchange::CHANNEL_STATE_TABLE)
                                .is_some_and(|t| !t.is_empty())
                        })
                    });
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
                            &fence,
                        )
                    }))
                    .unwrap_or_else(|p| Err(Error::from_panic(p)));
                    if result.is_ok() {
                        failpoint::hit("checkpoint.after_metadata");
                        if in_flight {
                            failpoint::hit("checkpoint.after_metadata_with_channel_state");
                        }
                    }
                    // What the checkpoint wrote: the tasks' acknowledgements do not
                    // count the files a persistent backend's snapshot stores here.
                    let bytes = result.as_ref().map_or(stats.bytes, |(_, written)| *written);
                    let result = result.map(|(path, _)| path);
                    let _ = done.send(Written {
                        id,
                        kind,
                        bytes,
                        duration: stats.duration,
                        alignment: stats.max_alignment,
                        result,
                    });
                }
            })
            .map_err(|e| {
                Error::Config(format!("cannot start the checkpoint writer thread: {e}"))
            })?;
        Ok(CheckpointWriter {
            jobs,
            thread,
            abandoned,
        })
    }

    /// Queues checkpoint `id` for writing; its [`Written`] report follows.
    pub(super) fn write(
        &self,
        id: CheckpointId,
        kind: CheckpointKind,
        stops_job: bool,
        acks: Vec<(TaskKey, Snapshots)>,
        stats: weir_checkpoint::CheckpointStats,
        span: tracing::Span,
    ) -> std::result::Result<(), String> {
        self.jobs
            .send(WriteJob {
                id,
                kind,
                stops_job,
                acks,
                stats,
                span,
            })
            .map_err(|_| "the checkpoint writer thread has stopped".to_string())
    }

    /// Writes what is queued, then ends the thread.
    pub(super) fn finish(self) {
        drop(self.jobs);
        let _ = self.thread.join();
    }

    /// Ends the writer without waiting for it, when the attempt left stuck tasks behind:
    /// the checkpoint it may be writing waits for their files. No checkpoint's metadata is
    /// written from now on, so a checkpoint of the abandoned attempt can never complete
    /// after the next attempt has started from an older one.
    pub(super) fn abandon(self) {
        self.abandoned.store(true, Ordering::SeqCst);
        drop(self.jobs);
        if self.thread.is_finished() {
            let _ = self.thread.join();
        }
    }
}

/// Tells the coordinator how writing a checkpoint ended; returns its next actions.
pub(super) fn on_written(
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
            status.checkpoint_completed(id, &path, bytes);
            let duration_ms = duration.as_millis() as u64;
            if kind == CheckpointKind::Savepoint {
                tracing::info!(
                    job = name,
                    checkpoint = id.0,
                    bytes,
                    duration_ms,
                    path = %path.display(),
                    "job '{name}': savepoint {id} written to {}",
                    path.display()
                );
                savepoints.push(path);
            } else {
                tracing::info!(
                    job = name,
                    checkpoint = id.0,
                    bytes,
                    duration_ms,
                    path = %path.display(),
                    "job '{name}': {} {id} complete ({bytes} bytes in {duration_ms} ms)",
                    noun(kind)
                );
            }
            c.completed(Instant::now(), id)
        }
        Err(e) => {
            // The abort that follows logs the reason.
            tracing::debug!(job = name, checkpoint = id.0, error = %e, "job '{name}': writing checkpoint {id} failed: {e}");
            c.completion_failed(Instant::now(), id, e.to_string())
        }
    }
}
