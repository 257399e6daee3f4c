//! Retrying writes to external systems (a database, an HTTP API) from a sink, sans-IO.
//!
//! A sink that calls out to another system sees failures that go away on their own (a
//! timeout, a reset connection, an overloaded server) and failures that never will (a
//! malformed request, a refused permission). This module decides which is which and
//! when to try again; it does no I/O and keeps no clock, so the same rules run under a
//! blocking client, an async one, or a test that only records what would have happened.
//!
//! The rules a [`Retrier`] follows:
//!
//! - **Only retryable failures are retried.** The caller sorts each failure into an
//!   [`Outcome`]: [`classify_http`] and [`classify_io`] do it for HTTP statuses and
//!   `std::io` errors (timeouts, connection resets, HTTP 408, 429 and 5xx are retryable;
//!   400, 403, 422 and every other 4xx are not).
//! - **A fenced write is never retried.** [`Outcome::Fenced`] means the system refused the
//!   sink's fencing token as stale: a newer instance of the sink has taken over, and
//!   trying again could only fail again or, worse, overwrite the newer writer.
//! - **Exponential backoff with full jitter and a cap.** Before retry `r` (`r` = 1 for the
//!   first retry) the delay is drawn uniformly from `[0, min(cap, base × 2^(r-1))]`
//!   ([`RetryPolicy::backoff`]), so sinks that failed together do not retry together.
//! - **Retry-After is honoured**, even above the cap: the delay is the larger of the drawn
//!   backoff and the server's Retry-After ([`parse_retry_after`] reads the header).
//! - **An attempt limit**: at most [`RetryPolicy::max_attempts`] attempts per request,
//!   the first one included.
//! - **A retry budget**, so retries cannot multiply the load on a system that is already
//!   failing: retries may be at most a share ([`RetryPolicy::budget_ratio`], 10% by
//!   default) of requests, plus a small reserve. See [`Retrier`] for the token bucket.
//!
//! How often retries happen is the `retry_ratio` metric (retries ÷ requests), which a
//! retrier keeps current in a [`FloatGauge`] given to [`Retrier::with_metric`].
//!
//! # Idempotency keys belong above the retry loop
//!
//! A retried write may already have been applied: the request reached the other system
//! and only the answer was lost. The other system can recognise the repeat only if every
//! attempt carries the same idempotency key, so make the key **once per record, before
//! the first attempt**, and send that same key with every attempt. [`Retrier::run`] calls
//! the operation with nothing but the attempt number, so the key is naturally made
//! outside and captured by the closure; a key made inside the closure would be a new
//! identity for every attempt and turn a retry into a duplicate.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use weir_core::retry::{Retrier, RetryPolicy, classify_http};
//!
//! // One retrier per sink instance; the seed makes its jitter reproducible.
//! let mut retrier = Retrier::new(RetryPolicy::default(), 7);
//!
//! // The idempotency key is made once for the record, above the retry loop.
//! let key = format!("order-{}", 42);
//! let mut sent = Vec::new();
//! let mut delays = Vec::new();
//! let result = retrier.run(
//!     |attempt| {
//!         // Every attempt sends the same key (here: the server answers 503 twice).
//!         sent.push((key.clone(), attempt));
//!         if attempt < 3 { Err(503_u16) } else { Ok("stored") }
//!     },
//!     |status| classify_http(*status, None),
//!     |delay| delays.push(delay), // a real sink passes `std::thread::sleep`
//! );
//! assert_eq!(result, Ok("stored"));
//! assert_eq!(sent, [("order-42".to_string(), 1), ("order-42".to_string(), 2), ("order-42".to_string(), 3)]);
//! // Two retries, each delay within its full-jitter range.
//! assert_eq!(delays.len(), 2);
//! assert!(delays[0] <= Duration::from_millis(100));
//! assert!(delays[1] <= Duration::from_millis(200));
//! assert_eq!((retrier.requests(), retrier.retries()), (1, 2));
//! ```

use crate::metrics::FloatGauge;
use std::fmt;
use std::time::Duration;

mod classify;
pub use classify::{classify_http, classify_io, parse_retry_after};

/// How a failed attempt should be treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The failure may go away: try again, no sooner than `retry_after` if the other
    /// system said when (an HTTP Retry-After header).
    Retryable {
        /// The other system's own wait, honoured even above [`RetryPolicy::cap`].
        retry_after: Option<Duration>,
    },
    /// Trying again cannot help (a malformed or forbidden request).
    Permanent,
    /// The other system refused the sink's fencing token as stale: a newer instance of
    /// the sink has taken over. Never retried.
    Fenced,
}

/// Why a request was given up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// The failure was [`Outcome::Permanent`].
    NotRetryable,
    /// The failure was [`Outcome::Fenced`].
    Fenced,
    /// [`RetryPolicy::max_attempts`] attempts were made.
    AttemptsExhausted,
    /// The retry budget had no token left.
    BudgetExhausted,
}

impl fmt::Display for GiveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GiveUp::NotRetryable => "the failure is not retryable",
            GiveUp::Fenced => {
                "fenced: the fencing token is stale, a newer writer has taken over (never retried)"
            }
            GiveUp::AttemptsExhausted => "the attempt limit was reached",
            GiveUp::BudgetExhausted => {
                "the retry budget is exhausted (retries are limited to a share of requests)"
            }
        })
    }
}

impl std::error::Error for GiveUp {}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Wait `after`, then make the next attempt.
    Retry {
        /// How long to wait before the next attempt.
        after: Duration,
    },
    /// Stop: the last failure is the request's result.
    GiveUp(GiveUp),
}

/// How a [`Retrier`] retries: backoff, attempt limit and retry budget.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// The ceiling of the first retry's delay; each further retry doubles it.
    pub base: Duration,
    /// The largest ceiling a delay is drawn under (a Retry-After may still exceed it).
    pub cap: Duration,
    /// Attempts per request, the first one included (1: never retry).
    pub max_attempts: u32,
    /// Retries allowed per request, on average: each request adds this many tokens to
    /// the retry budget, each retry takes one (0.1: retries add at most 10% load).
    pub budget_ratio: f64,
    /// Retries allowed before any request has added to the budget: the budget's initial
    /// balance, and the part of its capacity that does not depend on the ratio.
    pub budget_reserve: f64,
}

impl Default for RetryPolicy {
    /// Base 100 ms, cap 10 s, 5 attempts, a budget of 10% of requests plus a reserve of
    /// 10 retries.
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(10),
            max_attempts: 5,
            budget_ratio: 0.1,
            budget_reserve: 10.0,
        }
    }
}

impl RetryPolicy {
    /// Checks the policy: `base > 0`, `cap >= base`, `max_attempts >= 1`,
    /// `0 <= budget_ratio <= 1` and `budget_reserve >= 0`, both finite.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weir_core::retry::RetryPolicy;
    /// assert!(RetryPolicy::default().validate().is_ok());
    /// let p = RetryPolicy { cap: Duration::from_millis(10), ..RetryPolicy::default() };
    /// assert!(p.validate().unwrap_err().contains("cap"));
    /// ```
    pub fn validate(&self) -> Result<(), String> {
        if self.base.is_zero() {
            return Err("retry policy: base must be greater than zero".to_string());
        }
        if self.cap < self.base {
            return Err(format!(
                "retry policy: cap ({:?}) must be at least base ({:?})",
                self.cap, self.base
            ));
        }
        if self.max_attempts == 0 {
            return Err(
                "retry policy: max_attempts must be at least 1 (the first attempt counts)"
                    .to_string(),
            );
        }
        if !(self.budget_ratio.is_finite() && (0.0..=1.0).contains(&self.budget_ratio)) {
            return Err(format!(
                "retry policy: budget_ratio must be a finite number between 0 and 1 (got {})",
                self.budget_ratio
            ));
        }
        if !(self.budget_reserve.is_finite() && self.budget_reserve >= 0.0) {
            return Err(format!(
                "retry policy: budget_reserve must be a finite number of at least 0 (got {})",
                self.budget_reserve
            ));
        }
        Ok(())
    }

    /// The ceiling of retry `retry`'s delay: `min(cap, base × 2^(retry-1))`, computed
    /// without overflow (retry 0 is read as 1).
    ///
    /// ```
    /// use std::time::Duration;
    /// use weir_core::retry::RetryPolicy;
    /// let p = RetryPolicy::default(); // base 100 ms, cap 10 s
    /// assert_eq!(p.max_backoff(1), Duration::from_millis(100));
    /// assert_eq!(p.max_backoff(4), Duration::from_millis(800));
    /// assert_eq!(p.max_backoff(u32::MAX), Duration::from_secs(10));
    /// ```
    pub fn max_backoff(&self, retry: u32) -> Duration {
        let doublings = retry.max(1) - 1;
        2u32.checked_pow(doublings)
            .and_then(|factor| self.base.checked_mul(factor))
            .map_or(self.cap, |d| d.min(self.cap))
    }

    /// Full jitter: the delay before retry `retry` (1 for the first retry), uniform in
    /// `[0, min(cap, base × 2^(retry-1))]`, where `unit` is a uniform draw from `[0, 1)`.
    /// Saturating: huge retry numbers give the cap; `unit` outside `[0, 1]` (or NaN) is
    /// clamped into it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weir_core::retry::RetryPolicy;
    /// let p = RetryPolicy::default(); // base 100 ms, cap 10 s
    /// assert_eq!(p.backoff(1, 0.0), Duration::ZERO);
    /// assert_eq!(p.backoff(3, 0.5), Duration::from_millis(200));
    /// assert_eq!(p.backoff(30, 0.5), Duration::from_secs(5));
    /// ```
    pub fn backoff(&self, retry: u32, unit: f64) -> Duration {
        let bound = self.max_backoff(retry);
        let unit = if unit.is_nan() {
            0.0
        } else {
            unit.clamp(0.0, 1.0)
        };
        // f64 seconds lose nothing that matters here (nanoseconds up to about 104 days);
        // `try_` because a bound near `Duration::MAX` times 1.0 can round past it.
        Duration::try_from_secs_f64(bound.as_secs_f64() * unit).map_or(bound, |d| d.min(bound))
    }
}

/// Budget tokens are counted in millionths, so that depositing a ratio such as 0.1 ten
/// times makes exactly one token (binary floating point would make 0.9999999999999999).
const MICROS_PER_TOKEN: u64 = 1_000_000;

/// How many requests' worth of deposits the retry budget can save up beyond its reserve:
/// its capacity is `budget_reserve + budget_ratio × BUDGET_WINDOW` tokens.
pub const BUDGET_WINDOW: u64 = 1000;

/// The name of the metric [`Retrier::with_metric`] is meant for: retries ÷ requests.
pub const RETRY_RATIO_METRIC: &str = "retry_ratio";

/// Registers (or finds) the `retry_ratio` float gauge with `labels`, for
/// [`Retrier::with_metric`]; label it like the sink's other series (operator, subtask).
pub fn retry_ratio_gauge(labels: &[(&str, &str)]) -> FloatGauge {
    crate::metrics::float_gauge(
        RETRY_RATIO_METRIC,
        "Retries per request of a sink writing to an external system (retries / requests).",
        labels,
    )
}

/// Rounds a non-negative token amount to millionths, saturating.
fn micros(tokens: f64) -> u64 {
    // `as` saturates, and turns NaN into 0.
    (tokens * MICROS_PER_TOKEN as f64).round() as u64
}

/// Retry decisions for one sink instance: the [`RetryPolicy`], its retry budget, the
/// request and retry counts, and a deterministic random source for the jitter.
///
/// # The retry budget
///
/// A token bucket, counted exactly in millionths of a token:
///
/// - it starts holding `budget_reserve` tokens;
/// - [`begin`](Retrier::begin) (one per request, before its first attempt) adds
///   `budget_ratio` tokens, but never fills it beyond its capacity of
///   `budget_reserve + budget_ratio × BUDGET_WINDOW` tokens (1000 requests' worth of
///   deposits on top of the reserve), so a long healthy spell cannot save up for an
///   unbounded storm of retries later;
/// - every retry takes one whole token, and a retryable failure with less than one
///   token left gives up with [`GiveUp::BudgetExhausted`].
///
/// So after `n` requests there have been at most `budget_reserve + budget_ratio × n`
/// retries (with the defaults: 10 + n / 10), and in any stretch of requests the retries
/// are at most the capacity plus `budget_ratio` per request of the stretch. With
/// `budget_ratio` 0 the reserve is all the retries there will ever be.
#[derive(Debug, Clone)]
pub struct Retrier {
    policy: RetryPolicy,
    /// Budget balance, in millionths of a token.
    tokens: u64,
    /// `budget_ratio` in millionths of a token.
    deposit: u64,
    /// The bucket's capacity, in millionths of a token.
    capacity: u64,
    requests: u64,
    retries: u64,
    rng: SplitMix64,
    metric: Option<FloatGauge>,
}

impl Retrier {
    /// A retrier following `policy`, with its jitter drawn from a generator seeded with
    /// `seed` (give each sink instance its own seed, for instance from its subtask index,
    /// so instances that failed together spread out).
    ///
    /// # Panics
    /// When `policy` is invalid ([`RetryPolicy::validate`] says why); use
    /// [`try_new`](Retrier::try_new) to get the message instead.
    pub fn new(policy: RetryPolicy, seed: u64) -> Self {
        match Self::try_new(policy, seed) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        }
    }

    /// A retrier following `policy`, or why the policy is invalid.
    pub fn try_new(policy: RetryPolicy, seed: u64) -> Result<Self, String> {
        policy.validate()?;
        let reserve = micros(policy.budget_reserve);
        let deposit = micros(policy.budget_ratio);
        Ok(Retrier {
            tokens: reserve,
            deposit,
            capacity: reserve.saturating_add(deposit.saturating_mul(BUDGET_WINDOW)),
            requests: 0,
            retries: 0,
            rng: SplitMix64(seed),
            metric: None,
            policy,
        })
    }

    /// Keeps `gauge` set to [`retry_ratio`](Retrier::retry_ratio) from now on (see
    /// [`retry_ratio_gauge`]).
    ///
    /// ```
    /// use weir_core::{metrics, retry::{Retrier, RetryPolicy, retry_ratio_gauge}};
    /// let labels = [("operator", "doc-sink"), ("subtask", "0")];
    /// let mut r = Retrier::new(RetryPolicy::default(), 1).with_metric(retry_ratio_gauge(&labels));
    /// let mut fails = 1;
    /// let _ = r.run(
    ///     |_| if fails > 0 { fails -= 1; Err(()) } else { Ok(()) },
    ///     |_| weir_core::retry::Outcome::Retryable { retry_after: None },
    ///     |_| {},
    /// );
    /// r.run(|_| Ok::<_, ()>(()), |_| unreachable!(), |_| {}).unwrap();
    /// assert_eq!(metrics::value("retry_ratio", &labels), Some(0.5));
    /// ```
    pub fn with_metric(mut self, gauge: FloatGauge) -> Self {
        gauge.set(self.retry_ratio());
        self.metric = Some(gauge);
        self
    }

    /// The policy this retrier follows.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Starts a request (before its first attempt): counts it and adds `budget_ratio`
    /// tokens to the retry budget, up to its capacity.
    pub fn begin(&mut self) {
        self.requests += 1;
        self.tokens = self.tokens.saturating_add(self.deposit).min(self.capacity);
        self.publish();
    }

    /// Decides what follows a failed attempt, `attempts` being the attempts made so far
    /// for this request (1 after the first; 0 is read as 1).
    ///
    /// In order: [`Outcome::Permanent`] gives up with [`GiveUp::NotRetryable`],
    /// [`Outcome::Fenced`] with [`GiveUp::Fenced`]; after `max_attempts` attempts it gives
    /// up with [`GiveUp::AttemptsExhausted`], and with less than one budget token left with
    /// [`GiveUp::BudgetExhausted`]. Otherwise it takes a token, counts a retry and says
    /// to wait the larger of the full-jitter backoff for retry number `attempts` and the
    /// outcome's Retry-After.
    ///
    /// For callers that drive the attempts themselves (an async client, say):
    ///
    /// ```
    /// use weir_core::retry::{Decision, Outcome, Retrier, RetryPolicy};
    /// let mut r = Retrier::new(RetryPolicy::default(), 3);
    /// r.begin(); // once per record, where its idempotency key is made
    /// let timeout = Outcome::Retryable { retry_after: None };
    /// match r.decide(1, &timeout) {
    ///     Decision::Retry { after } => assert!(after <= r.policy().max_backoff(1)),
    ///     Decision::GiveUp(why) => panic!("gave up: {why}"),
    /// }
    /// ```
    pub fn decide(&mut self, attempts: u32, outcome: &Outcome) -> Decision {
        let attempts = attempts.max(1);
        let retry_after = match *outcome {
            Outcome::Permanent => return Decision::GiveUp(GiveUp::NotRetryable),
            Outcome::Fenced => return Decision::GiveUp(GiveUp::Fenced),
            Outcome::Retryable { retry_after } => retry_after,
        };
        if attempts >= self.policy.max_attempts {
            return Decision::GiveUp(GiveUp::AttemptsExhausted);
        }
        if self.tokens < MICROS_PER_TOKEN {
            return Decision::GiveUp(GiveUp::BudgetExhausted);
        }
        self.tokens -= MICROS_PER_TOKEN;
        self.retries += 1;
        self.publish();
        let backoff = self.policy.backoff(attempts, self.rng.unit());
        Decision::Retry {
            after: retry_after.map_or(backoff, |ra| ra.max(backoff)),
        }
    }

    /// Requests started ([`begin`](Retrier::begin) calls).
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Retries granted ([`Decision::Retry`] answers).
    pub fn retries(&self) -> u64 {
        self.retries
    }

    /// Retries ÷ requests (0 before the first request).
    pub fn retry_ratio(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.retries as f64 / self.requests as f64
        }
    }

    /// The retry budget's balance: how many retries it would grant now (fractional).
    pub fn budget(&self) -> f64 {
        self.tokens as f64 / MICROS_PER_TOKEN as f64
    }

    /// Runs one request: [`begin`](Retrier::begin), then `op(attempt)` (attempt 1, 2, …)
    /// until it succeeds or [`decide`](Retrier::decide) gives up, passing each failure
    /// through `classify` and each wait to `sleep` (`std::thread::sleep` in a real sink;
    /// injected so tests can record the delays instead).
    ///
    /// `op` gets only the attempt number: whatever identifies the record to the other
    /// system — above all its idempotency key — is made before `run` and captured, so
    /// every attempt sends the same one.
    ///
    /// # Errors
    /// The last attempt's error, how many attempts were made and why they stopped.
    pub fn run<T, E>(
        &mut self,
        mut op: impl FnMut(u32) -> Result<T, E>,
        classify: impl Fn(&E) -> Outcome,
        mut sleep: impl FnMut(Duration),
    ) -> Result<T, Failed<E>> {
        self.begin();
        let mut attempt = 1u32;
        loop {
            let error = match op(attempt) {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            match self.decide(attempt, &classify(&error)) {
                Decision::Retry { after } => {
                    sleep(after);
                    // `decide` gives up at `max_attempts`, which is at most u32::MAX.
                    attempt = attempt.saturating_add(1);
                }
                Decision::GiveUp(reason) => {
                    return Err(Failed {
                        error,
                        attempts: attempt,
                        reason,
                    });
                }
            }
        }
    }

    fn publish(&self) {
        if let Some(g) = &self.metric {
            g.set(self.retry_ratio());
        }
    }
}

/// A request [`Retrier::run`] gave up on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed<E> {
    /// The last attempt's error.
    pub error: E,
    /// Attempts made, the first one included.
    pub attempts: u32,
    /// Why there was no further attempt.
    pub reason: GiveUp,
}

impl<E: fmt::Display> fmt::Display for Failed<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.attempts == 1 { "" } else { "s" };
        write!(
            f,
            "gave up after {} attempt{s} ({}): {}",
            self.attempts, self.reason, self.error
        )
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Failed<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// SplitMix64: small, fast and good enough to spread retries; deterministic per seed.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`: the top 53 bits, scaled.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests;
