//! Restart strategies: whether a job with checkpoints restarts after a failure inside it,
//! and after how long.
//!
//! Owns [`RestartStrategy`] (what the user configures) and [`Restarts`], a sans-IO state
//! machine that the attempt loop asks, at each failure and with the current time, "restart
//! after which delay, or give up, and why". It keeps no clock and does no I/O, so every
//! rule is unit-tested with explicit instants. Whether an error is worth a restart at all
//! (`Error::is_deterministic`) is the attempt loop's business, not this module's.
//! See docs/decisions/0020-restart-strategies.md.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};
use weir_core::{Error, Result};

/// How a job with checkpoints restarts after a failure inside it (a failure a restart would
/// run into again, such as an invalid setting or a malformed record, fails the job at once
/// whatever the strategy).
///
/// The default is [`RestartStrategy::ExponentialDelay`] with unlimited attempts, fit for a
/// job that runs for months: the delay doubles from 100 ms up to 1 min while failures
/// follow each other, and goes back to 100 ms once the job has run 10 minutes without one.
///
/// ```
/// use std::time::Duration;
/// use weir_runtime::{ExponentialDelay, RestartStrategy};
/// // The default, with a limit: give up after 10 restarts that follow each other with
/// // less than 10 minutes of running between them.
/// let s = RestartStrategy::ExponentialDelay(ExponentialDelay {
///     max_attempts: Some(10),
///     ..ExponentialDelay::default()
/// });
/// s.validate().unwrap();
/// // At most 3 failures in any 5 minutes, 10 s between restarts.
/// let s = RestartStrategy::failure_rate(3, Duration::from_secs(300), Duration::from_secs(10));
/// assert_eq!(s.to_string(), "failure rate (at most 3 failures per 5 min, 10 s apart)");
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RestartStrategy {
    /// Exponentially growing delays that reset after a stable period (the default).
    ExponentialDelay(ExponentialDelay),
    /// Restarts while no more than `max_failures` failures fall within `interval`.
    FailureRate(FailureRate),
    /// A fixed number of restarts over the whole run, a fixed delay apart.
    FixedDelay(FixedDelay),
    /// Never restart: the first failure fails the job.
    None,
}

/// Exponential delay between restarts, reset after a stable period (Flink's
/// `exponential-delay`).
///
/// Restart `n` in a row waits `initial_backoff × multiplier^(n-1)`, at most `max_backoff`,
/// give or take `jitter` (0.1: ±10 %). When the job ran at least `reset_threshold` since
/// its last restart before it failed again, the delay starts over at `initial_backoff` and
/// the count of restarts in a row at 0. With `max_attempts` set, the job gives up when a
/// failure would be restart `max_attempts + 1` in a row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExponentialDelay {
    /// The first delay (default 100 ms).
    pub initial_backoff: Duration,
    /// The longest delay (default 1 min).
    pub max_backoff: Duration,
    /// Factor by which the delay grows with each restart in a row (default 2.0; at least 1).
    pub multiplier: f64,
    /// Running this long without a failure resets the delay and the count (default 10 min).
    pub reset_threshold: Duration,
    /// Random spread of each delay, as a fraction of it (default 0.1; between 0 and 1).
    pub jitter: f64,
    /// Restarts in a row allowed before the job fails (default `None`: unlimited).
    pub max_attempts: Option<u32>,
}

impl Default for ExponentialDelay {
    fn default() -> Self {
        ExponentialDelay {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(60),
            multiplier: 2.0,
            reset_threshold: Duration::from_secs(600),
            jitter: 0.1,
            max_attempts: None,
        }
    }
}

/// At most `max_failures` failures in any window of `interval`, `delay` between restarts
/// (Flink's `failure-rate`): failure number `max_failures + 1` within `interval` of the
/// first of them fails the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureRate {
    /// Failures tolerated within `interval` (at least 1).
    pub max_failures: u32,
    /// The window the failures are counted in (positive).
    pub interval: Duration,
    /// Delay before each restart.
    pub delay: Duration,
}

/// At most `attempts` restarts over the whole run of the job, `delay` apart (Flink's
/// `fixed-delay`). The count never resets: fit for bounded jobs and tests, not for a job
/// that runs for months.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedDelay {
    /// Restarts allowed over the whole run (0: none).
    pub attempts: u32,
    /// Delay before each restart.
    pub delay: Duration,
}

impl Default for RestartStrategy {
    fn default() -> Self {
        RestartStrategy::ExponentialDelay(ExponentialDelay::default())
    }
}

impl RestartStrategy {
    /// The default exponential delay (see [`ExponentialDelay`]).
    pub fn exponential_delay() -> Self {
        RestartStrategy::default()
    }

    /// At most `max_failures` failures per `interval`, `delay` between restarts.
    pub fn failure_rate(max_failures: u32, interval: Duration, delay: Duration) -> Self {
        RestartStrategy::FailureRate(FailureRate {
            max_failures,
            interval,
            delay,
        })
    }

    /// At most `attempts` restarts over the whole run, `delay` apart.
    pub fn fixed_delay(attempts: u32, delay: Duration) -> Self {
        RestartStrategy::FixedDelay(FixedDelay { attempts, delay })
    }

    /// Checks the settings; the error says what to change.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("restart strategy: {m}")));
        match self {
            RestartStrategy::ExponentialDelay(e) => {
                if !(e.multiplier.is_finite() && e.multiplier >= 1.0) {
                    return bad(format!(
                        "the multiplier must be a number of at least 1.0, got {}",
                        e.multiplier
                    ));
                }
                if !(0.0..=1.0).contains(&e.jitter) {
                    return bad(format!(
                        "the jitter must be between 0.0 and 1.0, got {}",
                        e.jitter
                    ));
                }
                if e.initial_backoff > e.max_backoff {
                    return bad(format!(
                        "the initial backoff ({}) is longer than the maximum backoff ({})",
                        human(e.initial_backoff),
                        human(e.max_backoff)
                    ));
                }
                if e.reset_threshold.is_zero() {
                    return bad(
                        "the reset threshold must be positive (it is the stable running time after which the delay starts over)".into(),
                    );
                }
            }
            RestartStrategy::FailureRate(f) => {
                if f.max_failures == 0 {
                    return bad(
                        "a failure rate of at most 0 failures never restarts; use RestartStrategy::None for that, or allow at least 1".into(),
                    );
                }
                if f.interval.is_zero() {
                    return bad("the failure-rate interval must be positive".into());
                }
            }
            RestartStrategy::FixedDelay(_) | RestartStrategy::None => {}
        }
        Ok(())
    }
}

impl fmt::Display for RestartStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RestartStrategy::ExponentialDelay(e) => {
                write!(
                    f,
                    "exponential delay ({} growing ×{} up to {}, reset after {} without failure, ",
                    human(e.initial_backoff),
                    e.multiplier,
                    human(e.max_backoff),
                    human(e.reset_threshold)
                )?;
                match e.max_attempts {
                    Some(n) => write!(f, "at most {n} restarts in a row)"),
                    None => write!(f, "unlimited restarts)"),
                }
            }
            RestartStrategy::FailureRate(r) => write!(
                f,
                "failure rate (at most {} failures per {}, {} apart)",
                r.max_failures,
                human(r.interval),
                human(r.delay)
            ),
            RestartStrategy::FixedDelay(d) => write!(
                f,
                "fixed delay ({} restarts over the run, {} apart)",
                d.attempts,
                human(d.delay)
            ),
            RestartStrategy::None => write!(f, "no restarts"),
        }
    }
}

/// What to do about a failure.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    /// Restart after `delay`; `note` says where the strategy stands, for the log.
    Restart { delay: Duration, note: String },
    /// Fail the job; `reason` names the strategy and why it gave up.
    GiveUp { reason: String },
}

/// A [`RestartStrategy`] applied to one run of a job: it remembers past failures and
/// decides about the next one. Driven with explicit instants.
#[derive(Debug, Clone)]
pub(crate) struct Restarts {
    strategy: RestartStrategy,
    /// When the job (re)started running: the start of the run, or the end of the last delay.
    resumed_at: Instant,
    /// Restarts since the strategy's count last reset (exponential delay, fixed delay).
    in_a_row: u32,
    /// The next exponential delay, before jitter.
    backoff: Duration,
    /// Failure-rate: the instants of the latest failures, oldest first.
    failures: VecDeque<Instant>,
    rng: u64,
}

impl Restarts {
    /// A run that started at `started`; `seed` drives the jitter.
    pub(crate) fn new(strategy: RestartStrategy, started: Instant, seed: u64) -> Self {
        let backoff = match &strategy {
            RestartStrategy::ExponentialDelay(e) => e.initial_backoff,
            _ => Duration::ZERO,
        };
        Restarts {
            strategy,
            resumed_at: started,
            in_a_row: 0,
            backoff,
            failures: VecDeque::new(),
            rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    /// The job failed at `now` (with an error a restart may get past).
    pub(crate) fn on_failure(&mut self, now: Instant) -> Decision {
        let ran = now.saturating_duration_since(self.resumed_at);
        let decision = match self.strategy {
            RestartStrategy::None => Decision::GiveUp {
                reason: "restarts are turned off (RestartStrategy::None)".into(),
            },
            RestartStrategy::FixedDelay(d) => {
                if self.in_a_row >= d.attempts {
                    Decision::GiveUp {
                        reason: format!(
                            "the fixed-delay strategy allows {} restart{} over the whole run, and {} used",
                            d.attempts,
                            plural(d.attempts),
                            if d.attempts == 1 { "it is" } else { "all are" }
                        ),
                    }
                } else {
                    self.in_a_row += 1;
                    Decision::Restart {
                        delay: d.delay,
                        note: format!("fixed delay: restart {} of {}", self.in_a_row, d.attempts),
                    }
                }
            }
            RestartStrategy::FailureRate(r) => {
                self.failures.push_back(now);
                while self.failures.len() > r.max_failures as usize + 1 {
                    self.failures.pop_front();
                }
                // Failures at least `interval` before this one no longer count.
                while self
                    .failures
                    .front()
                    .is_some_and(|t| now.saturating_duration_since(*t) >= r.interval)
                {
                    self.failures.pop_front();
                }
                let n = self.failures.len() as u32;
                if n > r.max_failures {
                    let first = now.saturating_duration_since(self.failures[0]);
                    Decision::GiveUp {
                        reason: format!(
                            "the failure-rate strategy allows at most {} failure{} per {}, and this is failure {n} within {}",
                            r.max_failures,
                            plural(r.max_failures),
                            human(r.interval),
                            human(first)
                        ),
                    }
                } else {
                    Decision::Restart {
                        delay: r.delay,
                        note: format!(
                            "failure rate: failure {n} of at most {} per {}",
                            r.max_failures,
                            human(r.interval)
                        ),
                    }
                }
            }
            RestartStrategy::ExponentialDelay(e) => {
                if ran >= e.reset_threshold {
                    self.in_a_row = 0;
                    self.backoff = e.initial_backoff;
                }
                match e.max_attempts {
                    Some(max) if self.in_a_row >= max => Decision::GiveUp {
                        reason: format!(
                            "the exponential-delay strategy allows at most {max} restart{} in a row, and the job failed again after running {} (the count resets after {} without failure)",
                            plural(max),
                            human(ran),
                            human(e.reset_threshold)
                        ),
                    },
                    _ => {
                        self.in_a_row += 1;
                        let delay = self.jittered(self.backoff, e.jitter);
                        self.backoff = self
                            .backoff
                            .mul_f64(e.multiplier)
                            .min(e.max_backoff)
                            .max(e.initial_backoff);
                        let of = e
                            .max_attempts
                            .map(|m| format!(" of {m}"))
                            .unwrap_or_default();
                        Decision::Restart {
                            delay,
                            note: format!(
                                "exponential delay: restart {}{of} in a row; the delay resets after {} without failure",
                                self.in_a_row,
                                human(e.reset_threshold)
                            ),
                        }
                    }
                }
            }
        };
        if let Decision::Restart { delay, .. } = &decision {
            self.resumed_at = now + *delay;
        }
        decision
    }

    /// `base` give or take `jitter × base`, uniformly.
    fn jittered(&mut self, base: Duration, jitter: f64) -> Duration {
        if jitter <= 0.0 || base.is_zero() {
            return base;
        }
        // xorshift64*: a uniform u in [0, 1).
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let u = (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
        base.mul_f64((1.0 + jitter * (2.0 * u - 1.0)).max(0.0))
    }
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// A duration as a person would write it: `250 ms`, `1.5 s`, `10 min`, `2 h`.
pub(crate) fn human(d: Duration) -> String {
    let ms = d.as_millis();
    let trim = |x: f64| {
        let s = format!("{x:.1}");
        s.strip_suffix(".0").map(str::to_string).unwrap_or(s)
    };
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{} s", trim(d.as_secs_f64()))
    } else if ms < 3_600_000 {
        format!("{} min", trim(d.as_secs_f64() / 60.0))
    } else {
        format!("{} h", trim(d.as_secs_f64() / 3600.0))
    }
}

#[cfg(test)]
#[path = "restart_tests.rs"]
mod tests;
