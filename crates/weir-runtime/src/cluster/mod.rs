//! Cluster mode: one job on a coordinator and several worker processes.
//!
//! Closures cannot be shipped, so every process runs the same program and builds the same
//! graph. The coordinator hands each worker the job's arguments when it joins, the worker
//! builds the graph from them and registers with the graph's fingerprint (a worker running
//! another binary or other arguments is refused). The coordinator runs the checkpoint
//! coordinator and the restart loop exactly as a single process does; only the tasks run
//! elsewhere: it places them on the workers' slots, relays checkpoint commands and
//! acknowledgements, and writes checkpoints to the storage every process sees. With a
//! checkpoint directory the workers' files travel with their acknowledgements and the
//! coordinator stages and stores them (`staging`); with checkpoints on object storage each
//! worker stores its tasks' files itself and acknowledges with references, and the
//! coordinator writes only the manifest.
//!
//! Workers exchange record batches over TCP with credit-based flow control per channel
//! (`data`); barriers, watermarks and end-of-input travel in-band. A worker that stops
//! answering heartbeats is declared lost: the attempt is cancelled, the job attempt number
//! goes up (messages of older attempts are dropped) and the job restarts on the live
//! workers from the last complete checkpoint. A worker that cannot reach the coordinator
//! for longer than its lease stops its tasks before the coordinator can have given up on
//! it, so a worker cut off from the cluster never commits output of an old attempt.
//! See docs/cluster.md.

mod auth;
mod coordinator;
mod credit;
mod data;
mod relay;
mod sent;
mod staging;
mod transport;
pub(crate) mod wire;
mod worker;
mod worker_attempt;
mod worker_restore;

pub use worker::{Credentials, Joined, join, join_with};

use crate::plan::Plan;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir_core::graph::Graph;

/// How a process takes part in a cluster.
#[derive(Clone)]
pub enum ClusterRole {
    /// Runs the job's coordination: listens on `listen` (`host:port`), waits for
    /// `workers` workers, and hands every worker `args` to build the job from.
    Coordinator {
        /// Address to listen on for workers and `weir cluster` requests.
        listen: String,
        /// Workers to wait for before the first attempt starts.
        workers: usize,
        /// The job's arguments, handed to every worker (see [`Joined::args`]).
        args: Vec<String>,
    },
    /// Runs the tasks the coordinator assigns, on a connection made by [`join`].
    Worker(WorkerSlot),
}

impl std::fmt::Debug for ClusterRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterRole::Coordinator {
                listen, workers, ..
            } => write!(f, "Coordinator {{ listen: {listen}, workers: {workers} }}"),
            ClusterRole::Worker(_) => write!(f, "Worker"),
        }
    }
}

/// A joined worker's connection, handed to the job configuration; taken when it runs.
#[derive(Clone)]
pub struct WorkerSlot(pub(crate) Arc<Mutex<Option<Joined>>>);

/// Cluster settings of a job.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This process's role.
    pub role: ClusterRole,
    /// How often a worker sends a heartbeat (coordinator setting, sent to workers).
    pub heartbeat_interval: Duration,
    /// A worker silent for this long is declared lost (coordinator setting). A worker
    /// stops its tasks after three quarters of it without an answer.
    pub heartbeat_timeout: Duration,
}

impl ClusterConfig {
    /// A coordinator listening on `listen` that waits for `workers` workers and hands them
    /// `args`; heartbeats every 500 ms, a worker lost after 5 s of silence.
    ///
    /// ```
    /// let c = weir_runtime::ClusterConfig::coordinator("127.0.0.1:7700", 3, vec!["--input".into(), "in.csv".into()]);
    /// assert_eq!(c.heartbeat_timeout, std::time::Duration::from_secs(5));
    /// ```
    pub fn coordinator(listen: &str, workers: usize, args: Vec<String>) -> Self {
        ClusterConfig {
            role: ClusterRole::Coordinator {
                listen: listen.to_string(),
                workers,
                args,
            },
            heartbeat_interval: Duration::from_millis(500),
            heartbeat_timeout: Duration::from_secs(5),
        }
    }

    /// A worker on a connection made by [`join`].
    pub fn worker(joined: Joined) -> Self {
        ClusterConfig {
            role: ClusterRole::Worker(WorkerSlot(Arc::new(Mutex::new(Some(joined))))),
            heartbeat_interval: Duration::from_millis(500),
            heartbeat_timeout: Duration::from_secs(5),
        }
    }

    pub(crate) fn validate(&self) -> weir_core::Result<()> {
        if self.heartbeat_interval.is_zero() || self.heartbeat_timeout < 2 * self.heartbeat_interval
        {
            return Err(weir_core::Error::Config(format!(
                "the heartbeat timeout ({:?}) must be at least twice the heartbeat interval ({:?})",
                self.heartbeat_timeout, self.heartbeat_interval
            )));
        }
        if let ClusterRole::Coordinator { workers: 0, .. } = self.role {
            return Err(weir_core::Error::Config(
                "a coordinator needs at least 1 worker".into(),
            ));
        }
        Ok(())
    }
}

/// A stable fingerprint of the physical graph: operator ids, names, kinds, parallelism,
/// edges and the settings that shape state. Workers built from another program (or other
/// arguments) have another fingerprint.
pub(crate) fn fingerprint(graph: &Graph, plan: &Plan, cfg: &crate::JobConfig) -> u64 {
    let mut text = format!(
        "max_parallelism={} checkpointing={} exactly_once={} state={:?}\n",
        cfg.max_parallelism,
        cfg.checkpoint.is_some(),
        cfg.checkpoint.as_ref().is_none_or(|c| c.exactly_once),
        // The backend's kind, not its local settings (directories differ per machine).
        format!("{:?}", cfg.state_backend)
            .split('(')
            .next()
            .unwrap_or_default()
            .to_string()
    );
    for node in &graph.nodes {
        text.push_str(&format!(
            "{} {:?} {:?} p={} chained={}",
            node.operator_id(),
            node.name,
            node.kind,
            plan.parallelism[node.id.0],
            plan.chained[node.id.0]
        ));
        for e in &node.inputs {
            text.push_str(&format!(" <-{}:{}:{:?}", e.from.0, e.port, e.kind()));
        }
        text.push('\n');
    }
    // FNV-1a: stable across processes, platforms and releases.
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A tokio runtime for the cluster's network work.
pub(crate) fn runtime(name: &str) -> weir_core::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(format!("weir-{name}-net"))
        .enable_all()
        .build()
        .map_err(|e| weir_core::Error::io("starting the network runtime", e))
}

/// Microseconds since the first call in this process (monotonic).
pub(crate) fn mono_us() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_micros() as u64
}

/// Logs what this process wrote to object storage, when the job's checkpoints are there:
/// with checkpoints on object storage the workers store the state and the coordinator
/// only manifests, which this line lets an operator (and the tests) see.
pub(crate) fn report_object_storage(job: &crate::task::JobShared, who: &str) {
    let remote = job
        .cfg
        .checkpoint
        .as_ref()
        .is_some_and(|c| c.dir.to_str().is_some_and(weir_objstore::is_url));
    if remote {
        let s = weir_objstore::stats();
        tracing::info!(
            bytes_written = s.bytes_written,
            bytes_read = s.bytes_read,
            "{who}: object storage: {} bytes written, {} bytes read by this process",
            s.bytes_written,
            s.bytes_read
        );
    }
}

/// Starts a job in cluster mode; see [`crate::start`].
pub(crate) fn run(
    name: &str,
    job: Arc<crate::task::JobShared>,
    cluster: &ClusterConfig,
) -> weir_core::Result<crate::JobResult> {
    match &cluster.role {
        ClusterRole::Coordinator {
            listen,
            workers,
            args,
        } => coordinator::run(name, job, listen, *workers, args.clone(), cluster),
        ClusterRole::Worker(slot) => {
            let joined = slot
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .ok_or_else(|| {
                    weir_core::Error::Config(
                        "this worker connection was already used by another job run".into(),
                    )
                })?;
            worker::run(name, job, joined)
        }
    }
}
