//! [`CoordinatorConfig`]: when checkpoints are triggered and how long they may take.
//!
//! Owns the settings and their validation only; the coordinator reads them.

use crate::error::{Error, Result};
use std::time::Duration;

/// The shortest non-zero interval accepted (as in Flink): shorter intervals spend the job's
/// time on checkpointing.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// When the coordinator triggers checkpoints and when it gives up on one.
///
/// ```
/// use std::time::Duration;
/// use weir_checkpoint::CoordinatorConfig;
///
/// let config = CoordinatorConfig {
///     interval: Duration::from_secs(1),
///     min_pause: Duration::from_millis(500),
///     ..CoordinatorConfig::default()
/// };
/// config.validate().unwrap();
/// assert!(config.is_periodic());
/// assert_eq!(config.max_concurrent, 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// Time between two triggers. `Duration::ZERO` disables periodic checkpoints: only
    /// explicit requests ([`Coordinator::trigger_now`](crate::Coordinator::trigger_now)) run.
    pub interval: Duration,
    /// Minimum time between the end (completion or abort) of one checkpoint and the periodic
    /// trigger of the next, so that a slow job still makes progress between checkpoints.
    pub min_pause: Duration,
    /// A checkpoint not acknowledged by every task within this time is aborted.
    pub timeout: Duration,
    /// How many checkpoints may be pending at once (default 1). Explicit requests beyond it
    /// are queued, never dropped.
    pub max_concurrent: usize,
    /// How many checkpoints in a row may time out before the coordinator gives up on the
    /// running tasks with [`Action::Fail`](crate::Action::Fail): Flink's
    /// `execution.checkpointing.tolerable-failed-checkpoints`, counting timeouts only. A
    /// checkpoint that every task acknowledged but that is not yet
    /// [`completed`](crate::Coordinator::completed) (its files are being written) counts
    /// once for every `timeout` it takes. A completed checkpoint starts the count again.
    /// `None` (the default): timeouts abort checkpoints and nothing more.
    pub tolerable_timeouts: Option<u32>,
}

impl Default for CoordinatorConfig {
    /// Periodic checkpoints disabled, no minimum pause, a 10-minute timeout, one at a time,
    /// timeouts tolerated without end.
    fn default() -> Self {
        CoordinatorConfig {
            interval: Duration::ZERO,
            min_pause: Duration::ZERO,
            timeout: Duration::from_secs(600),
            max_concurrent: 1,
            tolerable_timeouts: None,
        }
    }
}

impl CoordinatorConfig {
    /// A configuration with periodic checkpoints every `interval` and defaults otherwise.
    pub fn every(interval: Duration) -> Self {
        CoordinatorConfig {
            interval,
            ..CoordinatorConfig::default()
        }
    }

    /// True when periodic checkpoints are enabled (`interval > 0`).
    pub fn is_periodic(&self) -> bool {
        !self.interval.is_zero()
    }

    /// Checks the settings; the error says which one to change and to what.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weir_checkpoint::CoordinatorConfig;
    ///
    /// let bad = CoordinatorConfig { max_concurrent: 0, ..CoordinatorConfig::default() };
    /// assert!(bad.validate().unwrap_err().to_string().contains("max_concurrent"));
    /// ```
    pub fn validate(&self) -> Result<()> {
        if !self.interval.is_zero() && self.interval < MIN_INTERVAL {
            return Err(Error::InvalidConfig(format!(
                "checkpoint interval is {:?}; use at least {:?}, or 0 to disable periodic \
                 checkpoints",
                self.interval, MIN_INTERVAL
            )));
        }
        if self.timeout.is_zero() {
            return Err(Error::InvalidConfig(
                "checkpoint timeout is 0, so every checkpoint would be aborted at once; set it \
                 to how long a checkpoint may take (e.g. 10 minutes)"
                    .into(),
            ));
        }
        if self.max_concurrent == 0 {
            return Err(Error::InvalidConfig(
                "max_concurrent checkpoints is 0, so none could ever run; set it to 1 (the \
                 default) or more"
                    .into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_disabled() {
        let c = CoordinatorConfig::default();
        c.validate().unwrap();
        assert!(!c.is_periodic());
        assert_eq!(c.max_concurrent, 1);
    }

    #[test]
    fn every_enables_periodic() {
        let c = CoordinatorConfig::every(Duration::from_secs(1));
        c.validate().unwrap();
        assert!(c.is_periodic());
    }

    #[test]
    fn tiny_interval_is_rejected_with_the_minimum() {
        let c = CoordinatorConfig::every(Duration::from_millis(1));
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("interval"), "{msg}");
        assert!(msg.contains("10ms"), "{msg}");
        CoordinatorConfig::every(MIN_INTERVAL).validate().unwrap();
    }

    #[test]
    fn zero_timeout_is_rejected() {
        let c = CoordinatorConfig {
            timeout: Duration::ZERO,
            ..CoordinatorConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("timeout"));
    }

    #[test]
    fn zero_max_concurrent_is_rejected() {
        let c = CoordinatorConfig {
            max_concurrent: 0,
            ..CoordinatorConfig::default()
        };
        let e = c.validate().unwrap_err();
        assert!(matches!(e, Error::InvalidConfig(_)));
        assert!(e.to_string().contains("max_concurrent"));
    }

    #[test]
    fn min_pause_longer_than_interval_is_allowed() {
        let c = CoordinatorConfig {
            interval: Duration::from_secs(1),
            min_pause: Duration::from_secs(5),
            ..CoordinatorConfig::default()
        };
        c.validate().unwrap();
    }
}
