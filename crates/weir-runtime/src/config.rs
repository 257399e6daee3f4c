//! Job configuration: parallelism, key groups, exchange sizes, state backend, progress.

use std::time::Duration;
use weir_core::data::DEFAULT_MAX_PARALLELISM;
use weir_core::{Error, Result};
use weir_state::BackendKind;

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
    /// A partly filled batch is sent after this long.
    pub flush_interval: Duration,
    /// Keyed state backend.
    pub state_backend: BackendKind,
    /// Print a progress line to standard error this often (`None`: quiet).
    pub progress_interval: Option<Duration>,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            parallelism: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            max_parallelism: DEFAULT_MAX_PARALLELISM,
            batch_size: 1024,
            channel_capacity: 16,
            flush_interval: Duration::from_millis(10),
            state_backend: BackendKind::Memory,
            progress_interval: None,
        }
    }
}

impl JobConfig {
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
        if self.channel_capacity == 0 {
            return Err(Error::Config(
                "channel capacity must be at least 1 batch".into(),
            ));
        }
        Ok(())
    }
}
