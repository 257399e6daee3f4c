//! Job configuration: parallelism, key groups, exchange sizes, state backend, progress.

use std::path::PathBuf;
use std::time::Duration;
use weir_core::data::DEFAULT_MAX_PARALLELISM;
use weir_core::{Error, Result};
use weir_state::BackendKind;

pub use crate::restart::RestartStrategy;

/// How a job runs. Every field has a default; `validate` explains what to fix.
///
/// ```
/// use weir_runtime::JobConfig;
/// let cfg = JobConfig { parallelism: 4, ..JobConfig::default() };
/// cfg.validate().unwrap();
/// let bad = JobConfig { parallelism: 0, ..JobConfig::default() };
/// assert!(bad.validate().unwrap_err().to_string().contains("parallelism"));
/// ```
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// Default parallelism of operators that do not set their own.
    pub parallelism: usize,
    /// Number of key groups: the largest parallelism keyed operators can ever take.
    pub max_parallelism: usize,
    /// Records per batch on channels between subtasks.
    pub batch_size: usize,
    /// Batches a channel holds before its writer blocks (the backpressure bound).
    pub channel_capacity: usize,
    /// Bounded in-flight data (Flink's buffer debloating): a channel holds about this long
    /// of its consumer's throughput, measured per channel every 200 ms, between one batch
    /// (at least 64 records) and `channel_capacity` batches; its writer waits (counted as
    /// backpressured time) above it. Keeps an aligned barrier from waiting behind seconds
    /// of records queued for a slow operator. `None`: every channel holds
    /// `channel_capacity` batches whatever its throughput. Default 1 s.
    pub in_flight_target: Option<Duration>,
    /// A partly filled batch is sent after this long at the latest, in whole milliseconds
    /// (0: at every millisecond tick). A task that has nothing else to do (an idle
    /// source, an operator whose inputs are drained) sends its batches at once, so this
    /// bounds latency only while a producer stays busy. Default 10 ms.
    pub flush_interval: Duration,
    /// Keyed state backend.
    pub state_backend: BackendKind,
    /// Print a progress line to standard error this often (`None`: quiet).
    pub progress_interval: Option<Duration>,
    /// Checkpointing (`None`: off; a failure then fails the job).
    pub checkpoint: Option<CheckpointConfig>,
    /// Serve the metrics in the Prometheus text format on `http://ADDRESS/metrics` while
    /// the job runs (`host:port`; port 0 picks a free one, see `JobHandle::metrics_address`).
    /// The same server as [`JobConfig::web_address`]: set either, or both to one address.
    pub metrics_address: Option<String>,
    /// Serve the REST API (`http://ADDRESS/v1/...`, see docs/operations.md) and the
    /// metrics while the job runs (`host:port`; port 0 picks a free one, see
    /// `JobHandle::web_address`). With it set, operators also count their records in and
    /// out and keep their watermarks for the API.
    pub web_address: Option<String>,
    /// The shared secret a client must present (`Authorization: Bearer SECRET`) to act on
    /// the job through the REST API: savepoints, stop, cancel. `None`: the actions are
    /// open to anyone who reaches the address. The views never need it.
    pub secret: Option<crate::Secret>,
    /// TLS on the cluster's connections (mutual: certificates of one CA) and on the REST
    /// API (`None`: plain text).
    pub tls: Option<crate::Tls>,
    /// With the REST API on, also measure the bytes records take on channels between tasks
    /// (`bytes_in` / `bytes_out` of `/v1/operators`; otherwise `null`). Records cross
    /// channels in one process unencoded, so their encoded size is computed on each side:
    /// a cost per record that a job of small records notices (docs/operations.md).
    pub measure_bytes: bool,
    /// Runs the job as part of a cluster (coordinator or worker); `None` runs it in this
    /// process alone.
    pub cluster: Option<crate::cluster::ClusterConfig>,
    /// The format of weir's log lines on standard error when the job installs the default
    /// subscriber (see `weir_runtime::logging`); `None` (the default) follows the
    /// `WEIR_LOG_FORMAT` environment variable. It has no effect when the program installed
    /// a subscriber of its own, or when an earlier job of the process installed one.
    pub log_format: Option<crate::logging::LogFormat>,
    /// Latency tracking, as Flink's latency markers: every source subtask sends a marker
    /// this often, and each sink subtask it reaches observes its age into the histogram
    /// `weir_end_to_end_latency_seconds{job,source,sink}` (`None`: off, the default).
    pub latency_tracking_interval: Option<Duration>,
    /// How long a failing or cancelled job waits for each of its tasks to stop (Flink's
    /// `task.cancellation.timeout`; default 3 minutes). A task still running then is stuck
    /// in a call that does not return (a hung state backend, storage or user function): the
    /// job leaves its thread behind, says so, and restarts or ends without it; a cluster
    /// worker does the same with its tasks when the next attempt is deployed. Zero: wait
    /// without end.
    pub cancellation_timeout: Duration,
}

/// How and where a job checkpoints, and how it restarts after a failure.
///
/// ```
/// use weir_runtime::CheckpointConfig;
/// use std::time::Duration;
/// let c = CheckpointConfig::new("/tmp/ck").interval(Duration::from_secs(1));
/// c.validate().unwrap();
/// assert!(c.exactly_once);
/// ```
#[derive(Debug, Clone)]
pub struct CheckpointConfig {
    /// Checkpoint storage directory (local or a shared mount).
    pub dir: PathBuf,
    /// Time between checkpoint triggers (0: only the final checkpoint at end of input).
    pub interval: Duration,
    /// Minimum time between the end of one checkpoint and the start of the next.
    pub min_pause: Duration,
    /// A checkpoint not complete after this long is aborted (default 10 minutes); one whose
    /// files are still being written then is left to finish, and counts as a timeout for
    /// every period of this length it takes.
    pub timeout: Duration,
    /// Checkpoints that may time out in a row before the job stops its tasks and restarts
    /// them from the latest completed checkpoint, under `restart` (Flink's
    /// `execution.checkpointing.tolerable-failed-checkpoints`, which weir counts for
    /// timeouts only). Default 0, as in Flink: the first timeout restarts the job. A
    /// timeout is the one checkpoint failure nothing reports: a task, its state backend or
    /// the checkpoint storage stopped answering, and until a restart no checkpoint would
    /// complete again and no sink would commit. Failures that report themselves (writing
    /// failed, a task declined) abort the checkpoint, and the next one tries again. `None`:
    /// timeouts only abort checkpoints. See docs/checkpoints.md, "Checkpoints that time out".
    pub tolerable_timeouts: Option<u32>,
    /// Number of complete checkpoints kept (older ones are deleted).
    pub retain: usize,
    /// Align barriers (exactly-once state); `false` gives at-least-once without alignment.
    pub exactly_once: bool,
    /// How barriers pass records in flight: aligned (the default), unaligned, or aligned
    /// until a timeout and unaligned after it (exactly-once only; docs/checkpoints.md).
    pub mode: CheckpointMode,
    /// Restore from this checkpoint or savepoint instead of the latest one in `dir`.
    pub restore_from: Option<PathBuf>,
    /// Start from scratch when `dir` holds complete checkpoints but none of them verifies.
    /// Off by default: such a job fails, naming each checkpoint and why it cannot be
    /// restored, since starting over would process the input again and duplicate what the
    /// sinks committed.
    pub start_fresh_if_unusable: bool,
    /// Read every file of the latest checkpoint and check its checksum before the job
    /// resumes from it. Off by default: the job resumes after checking the manifest and the
    /// files' sizes, and the checksums are read while it runs; no checkpoint completes (and
    /// no sink commits) until they all verify, and if one does not, the job goes back to
    /// the newest checkpoint that verifies in full (docs/checkpoints.md, section 4).
    /// An explicit `restore_from` is always verified before the job starts.
    pub verify_before_restore: bool,
    /// Restarts after a failure inside a running job (default: exponential delay with
    /// unlimited attempts that resets after 10 minutes without failure).
    pub restart: RestartStrategy,
    /// The lease the job holds on its checkpoint directory and its exactly-once file sinks'
    /// output directories (renewed every third of it). Another run is refused while it
    /// holds; it takes over a SIGKILLed run on the same machine at once, and a frozen run
    /// (or one on a dead host of a shared volume) after this long without renewal.
    /// Default 15 s; at least 300 ms.
    pub lease: Duration,
}

impl CheckpointConfig {
    /// Checkpoints into `dir`, every second, exactly-once.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CheckpointConfig {
            dir: dir.into(),
            interval: Duration::from_secs(1),
            min_pause: Duration::ZERO,
            timeout: Duration::from_secs(600),
            tolerable_timeouts: Some(0),
            retain: 3,
            exactly_once: true,
            mode: CheckpointMode::Aligned,
            restore_from: None,
            start_fresh_if_unusable: false,
            verify_before_restore: false,
            restart: RestartStrategy::default(),
            lease: weir_checkpoint::DEFAULT_LEASE,
        }
    }

    /// Sets the interval.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Sets how barriers pass records in flight.
    pub fn mode(mut self, mode: CheckpointMode) -> Self {
        self.mode = mode;
        self
    }

    /// Checks the configuration; the error says what to change.
    pub fn validate(&self) -> Result<()> {
        self.restart.validate()?;
        if !self.exactly_once && self.mode != CheckpointMode::Aligned {
            return Err(Error::Config(format!(
                "checkpoint mode {} needs exactly-once checkpoints: at-least-once checkpoints \
                 never align, so leave the mode at aligned or turn exactly-once on",
                self.mode
            )));
        }
        if self.mode == CheckpointMode::AlignedTimeout(Duration::ZERO) {
            return Err(Error::Config(
                "an aligned-timeout of 0 ms is unaligned: use the unaligned mode, or a positive timeout"
                    .into(),
            ));
        }
        if self.retain == 0 {
            return Err(Error::Config("retain at least 1 checkpoint".into()));
        }
        if self.timeout.is_zero() {
            return Err(Error::Config(
                "the checkpoint timeout must be positive".into(),
            ));
        }
        if self.lease < weir_checkpoint::ownership::MIN_LEASE {
            return Err(Error::Config(format!(
                "the ownership lease {:?} is too short; use at least {:?} (the default is {:?})",
                self.lease,
                weir_checkpoint::ownership::MIN_LEASE,
                weir_checkpoint::DEFAULT_LEASE
            )));
        }
        if !self.interval.is_zero() && self.interval < Duration::from_millis(10) {
            return Err(Error::Config(format!(
                "checkpoint interval {:?} is too short; use at least 10 ms, or 0 for only a final checkpoint",
                self.interval
            )));
        }
        Ok(())
    }
}

/// How a checkpoint barrier passes the records queued ahead of it (Flink's aligned and
/// unaligned checkpoints).
///
/// ```
/// use weir_runtime::{CheckpointConfig, CheckpointMode};
/// use std::time::Duration;
/// let c = CheckpointConfig::new("/tmp/ck").mode("unaligned".parse().unwrap());
/// assert_eq!(c.mode, CheckpointMode::Unaligned);
/// let t: CheckpointMode = "aligned-timeout:250".parse().unwrap();
/// assert_eq!(t, CheckpointMode::AlignedTimeout(Duration::from_millis(250)));
/// assert_eq!(t.to_string(), "aligned-timeout:250");
/// assert!("sideways".parse::<CheckpointMode>().unwrap_err().to_string().contains("aligned"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CheckpointMode {
    /// A task with several input channels stops reading each channel once its barrier came
    /// and snapshots when every barrier has: nothing in flight is stored, but a barrier
    /// waits behind every record queued before it.
    #[default]
    Aligned,
    /// Aligned, until a task has waited this long for the checkpoint's barriers; then that
    /// checkpoint goes on unaligned.
    AlignedTimeout(Duration),
    /// Barriers overtake the records queued in channels; those records are stored with the
    /// checkpoint (channel state) and given to the operators again on restore. The final
    /// checkpoint of a bounded job is aligned in every mode.
    Unaligned,
}

/// The timeout of `aligned-timeout` written without one.
pub const DEFAULT_ALIGNED_TIMEOUT: Duration = Duration::from_millis(200);

impl std::fmt::Display for CheckpointMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckpointMode::Aligned => f.write_str("aligned"),
            CheckpointMode::AlignedTimeout(t) => write!(f, "aligned-timeout:{}", t.as_millis()),
            CheckpointMode::Unaligned => f.write_str("unaligned"),
        }
    }
}

impl std::str::FromStr for CheckpointMode {
    type Err = Error;

    /// `aligned`, `unaligned`, `aligned-timeout` (200 ms) or `aligned-timeout:MS`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::Config(format!(
                "unknown checkpoint mode {s:?}: use aligned, unaligned, aligned-timeout or \
                 aligned-timeout:MS (MS a positive number of milliseconds)"
            ))
        };
        match s {
            "aligned" => Ok(CheckpointMode::Aligned),
            "unaligned" => Ok(CheckpointMode::Unaligned),
            "aligned-timeout" => Ok(CheckpointMode::AlignedTimeout(DEFAULT_ALIGNED_TIMEOUT)),
            _ => {
                let ms = s.strip_prefix("aligned-timeout:").ok_or_else(bad)?;
                let ms: u64 = ms.parse().map_err(|_| bad())?;
                if ms == 0 {
                    return Err(bad());
                }
                Ok(CheckpointMode::AlignedTimeout(Duration::from_millis(ms)))
            }
        }
    }
}

/// The time of data a channel holds by default (see [`JobConfig::in_flight_target`]).
pub const DEFAULT_IN_FLIGHT_TARGET: Duration = Duration::from_secs(1);

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            parallelism: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            max_parallelism: DEFAULT_MAX_PARALLELISM,
            batch_size: 1024,
            channel_capacity: 16,
            in_flight_target: Some(DEFAULT_IN_FLIGHT_TARGET),
            flush_interval: Duration::from_millis(10),
            state_backend: BackendKind::Memory,
            progress_interval: None,
            checkpoint: None,
            metrics_address: None,
            web_address: None,
            secret: None,
            tls: None,
            measure_bytes: false,
            cluster: None,
            log_format: None,
            latency_tracking_interval: None,
            cancellation_timeout: DEFAULT_CANCELLATION_TIMEOUT,
        }
    }
}

/// [`JobConfig::cancellation_timeout`]'s default: 3 minutes, as Flink's.
pub const DEFAULT_CANCELLATION_TIMEOUT: Duration = Duration::from_secs(180);

impl JobConfig {
    /// The exchange's settings of this job.
    pub(crate) fn exchange_config(&self) -> weir_core::exchange::ExchangeConfig {
        weir_core::exchange::ExchangeConfig {
            batch_size: self.batch_size,
            channel_capacity: self.channel_capacity,
            flush_interval_ms: self.flush_interval.as_millis() as i64,
            max_parallelism: self.max_parallelism,
            in_flight_target: self.in_flight_target,
        }
    }

    /// Checks the configuration; the error says which setting to change and how.
    pub fn validate(&self) -> Result<()> {
        if self.parallelism == 0 {
            return Err(Error::Config("parallelism must be at least 1".into()));
        }
        if self.max_parallelism == 0 || self.max_parallelism > 32768 {
            return Err(Error::Config(format!(
                "max parallelism must be between 1 and 32768, got {}",
                self.max_parallelism
            )));
        }
        if self.batch_size == 0 {
            return Err(Error::Config("batch size must be at least 1 record".into()));
        }
        if !self.flush_interval.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(Error::Config(format!(
                "flush interval {:?} is not a whole number of milliseconds: partly filled \
                 batches are sent on the runtime's millisecond ticks (and at once whenever a \
                 task has nothing else to do), so use 0 (every tick) or whole milliseconds",
                self.flush_interval
            )));
        }
        if let Some(c) = &self.cluster {
            c.validate()?;
        }
        if let Some(c) = &self.checkpoint {
            c.validate()?;
        }
        if self.channel_capacity == 0 {
            return Err(Error::Config(
                "channel capacity must be at least 1 batch".into(),
            ));
        }
        if self.in_flight_target == Some(Duration::ZERO) {
            return Err(Error::Config(
                "the in-flight target must be longer than 0 ms (1 s is the default); set it to \
                 None for channels of a fixed capacity"
                    .into(),
            ));
        }
        if self.latency_tracking_interval == Some(Duration::ZERO) {
            return Err(Error::Config(
                "the latency tracking interval must be longer than 0 ms; leave it unset to turn \
                 latency tracking off"
                    .into(),
            ));
        }
        if let (Some(w), Some(m)) = (&self.web_address, &self.metrics_address)
            && w != m
        {
            return Err(Error::Config(format!(
                "the web address {w} and the metrics address {m} differ: one server answers both \
                 the REST API and /metrics, so set one of them (or both to the same address)"
            )));
        }
        Ok(())
    }
}
