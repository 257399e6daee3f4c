//! # weir
//!
//! A stream processor in Rust in the tradition of Apache Flink: pipelines in a typed DSL,
//! keyed state, event time with watermarks and windows, run on every core of one machine.
//!
//! ```
//! use weir::prelude::*;
//!
//! let env = Env::new().parallelism(2);
//! let sums = env
//!     .from_collection(vec![("a".to_string(), 1i64), ("b".into(), 2), ("a".into(), 3)])
//!     .key_by(|(k, _)| k.clone())
//!     .reduce(|a, b| (a.0, a.1 + b.1))
//!     .collect();
//! env.execute("sums").unwrap();
//! assert_eq!(sums.sorted(), vec![("a".into(), 1), ("a".into(), 4), ("b".into(), 2)]);
//! ```
#![deny(missing_docs)]

use std::ops::Deref;
use std::time::Duration;

pub use weir_core::{
    Error, Result, async_io, codec, data, dlq, dsl, error, exchange, graph, ids, metrics, ops,
    output, retry, state, time, timer, watermark, window,
};
pub use weir_runtime::logging;
pub use weir_runtime::{
    CheckpointConfig, CheckpointMode, ExponentialDelay, FailureRate, FixedDelay, JobConfig,
    JobHandle, JobResult, RestartStrategy, SAVEPOINT_REQUEST_FILE, Secret, TaskStats, Tls,
};
pub use weir_state::BackendKind;

/// Cluster mode: one job across a coordinator and worker processes running this program.
///
/// The coordinator is started with the job's arguments and hands them to every worker
/// that joins; a worker builds the same pipeline from them and runs the tasks it is
/// given. See docs/cluster.md.
///
/// ```no_run
/// use weir::prelude::*;
/// use weir::cluster::{ClusterConfig, join};
///
/// fn build(env: &Env, args: &[String]) {
///     env.from_collection(args.to_vec()).print();
/// }
///
/// let args: Vec<String> = vec!["a".into(), "b".into()];
/// if std::env::var("ROLE").as_deref() == Ok("worker") {
///     let joined = join("127.0.0.1:7700", 2, std::time::Duration::from_secs(60))?;
///     let job_args = joined.args().to_vec();
///     let env = Env::new().cluster(ClusterConfig::worker(joined));
///     build(&env, &job_args);
///     env.execute("example")?;
/// } else {
///     let env = Env::new().cluster(ClusterConfig::coordinator("0.0.0.0:7700", 3, args.clone()));
///     build(&env, &args);
///     env.execute("example")?;
/// }
/// # Ok::<(), weir::Error>(())
/// ```
pub mod cluster {
    pub use weir_runtime::cluster::{
        ClusterConfig, ClusterRole, Credentials, Joined, join, join_with,
    };
}
#[cfg(feature = "rocksdb")]
pub use weir_state::RocksDbConfig;

/// Everything a pipeline author needs: `use weir::prelude::*;`.
pub mod prelude {
    pub use crate::Env;
    pub use weir_core::prelude::*;
    pub use weir_runtime::{CheckpointConfig, CheckpointMode, JobConfig, JobHandle, JobResult};
    pub use weir_state::BackendKind;
}

/// The execution environment: a pipeline under construction plus how to run it.
///
/// Build the pipeline through it (it dereferences to [`weir_core::dsl::Pipeline`]), then
/// call [`Env::execute`]. The defaults run on every core with in-memory state.
#[derive(Clone)]
pub struct Env {
    pipeline: weir_core::dsl::Pipeline,
    config: JobConfig,
}

impl Default for Env {
    fn default() -> Self {
        Self::new()
    }
}

impl Deref for Env {
    type Target = weir_core::dsl::Pipeline;
    fn deref(&self) -> &Self::Target {
        &self.pipeline
    }
}

impl Env {
    /// A new environment with the default configuration.
    pub fn new() -> Self {
        Env {
            pipeline: weir_core::dsl::Pipeline::new(),
            config: JobConfig::default(),
        }
    }

    /// A new environment with the given configuration.
    pub fn with_config(config: JobConfig) -> Self {
        Env {
            pipeline: weir_core::dsl::Pipeline::new(),
            config,
        }
    }

    /// Sets the default parallelism (operators may override it).
    pub fn parallelism(mut self, parallelism: usize) -> Self {
        self.config.parallelism = parallelism;
        self
    }

    /// Sets the number of key groups (the largest parallelism keyed operators can take).
    pub fn max_parallelism(mut self, max: usize) -> Self {
        self.config.max_parallelism = max;
        self
    }

    /// Chooses the keyed state backend.
    pub fn state_backend(mut self, kind: BackendKind) -> Self {
        self.config.state_backend = kind;
        self
    }

    /// Prints a progress line to standard error at this interval while the job runs.
    pub fn progress(mut self, every: Duration) -> Self {
        self.config.progress_interval = Some(every);
        self
    }

    /// Sets records per batch and batches per channel (the memory bound of the exchange).
    pub fn exchange(mut self, batch_size: usize, channel_capacity: usize) -> Self {
        self.config.batch_size = batch_size;
        self.config.channel_capacity = channel_capacity;
        self
    }

    /// Sets how long a partly filled batch may wait for more records before it is sent
    /// (Flink's buffer timeout; default 10 ms, whole milliseconds, 0 = at every
    /// millisecond tick). A task with nothing else to do sends its batches at once
    /// whatever the interval, so this matters only for producers that stay busy: lower
    /// it (1 ms, or 0) when their records must not wait, raise it for fewer, fuller
    /// batches.
    ///
    /// ```
    /// use std::time::Duration;
    /// let env = weir::Env::new().flush_interval(Duration::from_millis(1));
    /// assert_eq!(env.config().flush_interval, Duration::from_millis(1));
    /// ```
    pub fn flush_interval(mut self, interval: Duration) -> Self {
        self.config.flush_interval = interval;
        self
    }

    /// Sets the time of data a channel between tasks holds (bounded in-flight data; default
    /// 1 s of its consumer's throughput); `None` keeps every channel at its full capacity.
    ///
    /// ```
    /// use weir::prelude::*;
    /// use std::time::Duration;
    /// let env = Env::new().in_flight_target(Some(Duration::from_millis(500)));
    /// assert_eq!(env.config().in_flight_target, Some(Duration::from_millis(500)));
    /// let fixed = Env::new().in_flight_target(None);
    /// assert_eq!(fixed.config().in_flight_target, None);
    /// ```
    pub fn in_flight_target(mut self, target: Option<Duration>) -> Self {
        self.config.in_flight_target = target;
        self
    }

    /// Turns on checkpoints (and restarts from them after a failure); a job started with a
    /// directory that holds a complete checkpoint of the same job resumes from it.
    pub fn checkpoints(mut self, config: CheckpointConfig) -> Self {
        self.config.checkpoint = Some(config);
        self
    }

    /// Serves the job's metrics (`weir::metrics`, checkpoint statistics included) in the
    /// Prometheus text format on `http://ADDRESS/metrics` while the job runs. `ADDRESS` is
    /// `host:port`; port 0 picks a free port, which `JobHandle::metrics_address` tells.
    ///
    /// ```
    /// let env = weir::Env::new().metrics_address("127.0.0.1:9464");
    /// assert_eq!(env.config().metrics_address.as_deref(), Some("127.0.0.1:9464"));
    /// ```
    pub fn metrics_address(mut self, address: &str) -> Self {
        self.config.metrics_address = Some(address.to_string());
        self
    }

    /// Serves the job's REST API (`http://ADDRESS/v1/job`, `/v1/operators`,
    /// `/v1/checkpoints`, `/v1/exceptions`, and the actions `POST /v1/savepoints` and
    /// `POST /v1/job/cancel`; see docs/operations.md) and its metrics (`/metrics`) while the
    /// job runs. `ADDRESS` is `host:port`; port 0 picks a free port, which
    /// `JobHandle::web_address` tells. Operators then also count their records in and out
    /// and keep their watermarks for the API.
    ///
    /// ```
    /// let env = weir::Env::new().web_address("127.0.0.1:8081");
    /// assert_eq!(env.config().web_address.as_deref(), Some("127.0.0.1:8081"));
    /// ```
    pub fn web_address(mut self, address: &str) -> Self {
        self.config.web_address = Some(address.to_string());
        self
    }

    /// Requires `secret` of every client that acts on the job through the REST API (take a
    /// savepoint, stop, cancel): the request must carry `Authorization: Bearer SECRET`, as
    /// `weir job … --secret-file PATH` sends it. The read-only views stay open. A cluster's
    /// coordinator serves the API, so set it there.
    ///
    /// ```
    /// use weir::Secret;
    /// let env = weir::Env::new()
    ///     .web_address("127.0.0.1:0")
    ///     .secret(Secret::new("0123456789abcdef0123456789abcdef")?);
    /// assert!(env.config().secret.is_some());
    /// # Ok::<(), weir::Error>(())
    /// ```
    pub fn secret(mut self, secret: weir_runtime::Secret) -> Self {
        self.config.secret = Some(secret);
        self
    }

    /// Encrypts the job's connections with TLS: a cluster's connections (mutually
    /// authenticated with certificates of one CA; workers give theirs to
    /// [`cluster::join_with`]) and the REST API (`https://`). See docs/cluster.md.
    ///
    /// ```no_run
    /// let env = weir::Env::new().tls(weir::Tls::from_dir("/etc/weir/tls")?);
    /// # Ok::<(), weir::Error>(())
    /// ```
    pub fn tls(mut self, tls: weir_runtime::Tls) -> Self {
        self.config.tls = Some(tls);
        self
    }

    /// The format of weir's log lines on standard error (see [`logging`]): human lines, or
    /// one JSON object per line for log collectors. Without it, the `WEIR_LOG_FORMAT`
    /// environment variable decides (`human` or `json`). It applies when the job installs
    /// the default subscriber: not when the program installed its own, or an earlier job
    /// of the process installed one.
    ///
    /// ```
    /// use weir::logging::LogFormat;
    /// let env = weir::Env::new().log_format(LogFormat::Json);
    /// assert_eq!(env.config().log_format, Some(LogFormat::Json));
    /// ```
    pub fn log_format(mut self, format: logging::LogFormat) -> Self {
        self.config.log_format = Some(format);
        self
    }

    /// With the REST API on ([`Env::web_address`]), also measures the encoded size of the
    /// records that cross channels between tasks (`bytes_in` / `bytes_out`). Off by
    /// default: it costs a walk of every such record on each side of its channel. On a
    /// cluster, set it on the workers too (they measure).
    ///
    /// ```
    /// let env = weir::Env::new().web_address("127.0.0.1:0").measure_bytes(true);
    /// assert!(env.config().measure_bytes);
    /// ```
    pub fn measure_bytes(mut self, on: bool) -> Self {
        self.config.measure_bytes = on;
        self
    }

    /// Turns on latency tracking, as Flink's latency markers: every source subtask sends a
    /// marker `interval` apart that travels with the records (through chains and channels,
    /// to one downstream channel in turn, never to a user function) and each sink subtask
    /// it reaches observes its age into the histogram
    /// `weir_end_to_end_latency_seconds{job,source,sink}` (see docs/operations.md). Off by
    /// default; an interval of zero is refused when the job starts.
    ///
    /// ```
    /// use std::time::Duration;
    /// let env = weir::Env::new().latency_tracking_interval(Duration::from_millis(500));
    /// assert_eq!(env.config().latency_tracking_interval, Some(Duration::from_millis(500)));
    /// ```
    pub fn latency_tracking_interval(mut self, interval: std::time::Duration) -> Self {
        self.config.latency_tracking_interval = Some(interval);
        self
    }

    /// How long a failing or cancelled job waits for each task to stop before it leaves a
    /// stuck one behind (default 3 minutes, as Flink's `task.cancellation.timeout`; zero
    /// waits without end). See [`JobConfig::cancellation_timeout`].
    ///
    /// ```
    /// use std::time::Duration;
    /// let env = weir::Env::new().cancellation_timeout(Duration::from_secs(30));
    /// assert_eq!(env.config().cancellation_timeout, Duration::from_secs(30));
    /// ```
    pub fn cancellation_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.config.cancellation_timeout = timeout;
        self
    }

    /// Runs the job as part of a cluster: as its coordinator, or as a worker on a
    /// connection made by [`cluster::join`]. Every process builds the same pipeline.
    pub fn cluster(mut self, cluster: weir_runtime::ClusterConfig) -> Self {
        self.config.cluster = Some(cluster);
        self
    }

    /// The configuration the job will run with.
    pub fn config(&self) -> &JobConfig {
        &self.config
    }

    /// Runs the pipeline to completion on this machine and returns its statistics.
    ///
    /// # Errors
    /// The first operator failure (with the operator's name, subtask and cause), an invalid
    /// configuration, or [`Error::Config`] when the pipeline is empty or already ran.
    pub fn execute(&self, name: &str) -> Result<JobResult> {
        self.execute_async(name)?.join()
    }

    /// Starts the pipeline in the background; the handle can cancel it or wait for it.
    pub fn execute_async(&self, name: &str) -> Result<JobHandle> {
        let graph = self.pipeline.take_graph();
        if graph.nodes.is_empty() {
            return Err(Error::Config(
                "the pipeline is empty or was already executed: build a pipeline (source → sink) first".into(),
            ));
        }
        weir_runtime::start(name, graph, self.config.clone())
    }
}
