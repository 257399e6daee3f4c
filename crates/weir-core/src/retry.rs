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
use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

/// Sorts an HTTP response status: 408 (request timeout), 429 (too many requests) and
/// every 5xx are retryable, carrying `retry_after` (the parsed Retry-After header, if
/// any); 400, 403, 422 and every other 4xx are permanent.
///
/// Statuses that are not failures (1xx, 2xx, 3xx) and numbers that are not statuses give
/// [`Outcome::Permanent`] too, so a success passed here by mistake is never retried: check
/// for success before classifying.
///
/// ```
/// use std::time::Duration;
/// use weir_core::retry::{Outcome, classify_http};
/// let wait = Some(Duration::from_secs(2));
/// assert_eq!(classify_http(429, wait), Outcome::Retryable { retry_after: wait });
/// assert_eq!(classify_http(422, wait), Outcome::Permanent);
/// ```
pub fn classify_http(status: u16, retry_after: Option<Duration>) -> Outcome {
    match status {
        408 | 429 | 500..=599 => Outcome::Retryable { retry_after },
        _ => Outcome::Permanent,
    }
}

/// Sorts an I/O error: timeouts, refused, reset, aborted or missing connections, broken
/// pipes, interruptions, would-block and unexpected end of file are retryable (without a
/// Retry-After); every other kind is permanent.
///
/// ```
/// use std::io::{Error, ErrorKind};
/// use weir_core::retry::{Outcome, classify_io};
/// let reset = Error::from(ErrorKind::ConnectionReset);
/// assert_eq!(classify_io(&reset), Outcome::Retryable { retry_after: None });
/// assert_eq!(classify_io(&Error::from(ErrorKind::PermissionDenied)), Outcome::Permanent);
/// ```
pub fn classify_io(e: &io::Error) -> Outcome {
    use io::ErrorKind::*;
    match e.kind() {
        TimedOut | ConnectionReset | ConnectionAborted | ConnectionRefused | BrokenPipe
        | Interrupted | WouldBlock | UnexpectedEof | NotConnected => {
            Outcome::Retryable { retry_after: None }
        }
        _ => Outcome::Permanent,
    }
}

/// Parses a Retry-After header value: delay-seconds (`"120"`: only ASCII digits, with
/// optional surrounding spaces or tabs) or an IMF-fixdate HTTP-date
/// (`"Wed, 21 Oct 2015 07:28:00 GMT"`), which is read relative to `now`. A date at or
/// before `now` gives [`Duration::ZERO`]. Anything else gives `None` — signs, fractions,
/// numbers beyond `u64`, impossible dates and the obsolete RFC 850 and asctime date
/// formats — and the caller falls back to its backoff.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use weir_core::retry::parse_retry_after;
/// let now = UNIX_EPOCH + Duration::from_secs(1_445_412_450); // 07:27:30 GMT that day
/// assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
/// assert_eq!(
///     parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
///     Some(Duration::from_secs(30))
/// );
/// assert_eq!(parse_retry_after("soon", now), None);
/// ```
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim_matches([' ', '\t']);
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value.parse::<u64>().ok().map(Duration::from_secs);
    }
    let secs = parse_imf_fixdate(value)?;
    let at = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(secs.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
    }?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Seconds since the Unix epoch of an IMF-fixdate (`"Sun, 06 Nov 1994 08:49:37 GMT"`,
/// exactly 29 characters, case-sensitive). The day name must be a day name but need not
/// match the date; second 60 (a leap second) is accepted.
fn parse_imf_fixdate(s: &str) -> Option<i64> {
    const DAYS: [&[u8]; 7] = [b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun"];
    const MONTHS: [&[u8]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let b = s.as_bytes();
    if b.len() != 29
        || !DAYS.contains(&&b[0..3])
        || &b[3..5] != b", "
        || b[7] != b' '
        || b[11] != b' '
        || b[16] != b' '
        || b[19] != b':'
        || b[22] != b':'
        || &b[25..] != b" GMT"
    {
        return None;
    }
    let day = digits(&b[5..7])?;
    let month = MONTHS.iter().position(|m| *m == &b[8..11])? as i64 + 1;
    let year = digits(&b[12..16])?;
    let (hour, minute, second) = (
        digits(&b[17..19])?,
        digits(&b[20..22])?,
        digits(&b[23..25])?,
    );
    if day == 0 || day > days_in_month(year, month) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// The value of a run of ASCII digits.
fn digits(b: &[u8]) -> Option<i64> {
    b.iter().try_fold(0i64, |n, &c| {
        c.is_ascii_digit().then(|| n * 10 + i64::from(c - b'0'))
    })
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the proleptic Gregorian date `year-month-day` (Howard
/// Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    /// `min(cap, base × 2^(retry-1))` in nanoseconds, computed independently of the code
    /// under test (in u128, where nothing here can overflow).
    fn bound_nanos(p: &RetryPolicy, retry: u32) -> u128 {
        let doublings = retry.max(1) - 1;
        let cap = p.cap.as_nanos();
        if doublings >= 64 {
            return cap;
        }
        (p.base.as_nanos() << doublings).min(cap)
    }

    /// The largest f64 below 1.
    const ALMOST_ONE: f64 = 1.0 - f64::EPSILON / 2.0;

    fn retryable() -> Outcome {
        Outcome::Retryable { retry_after: None }
    }

    /// A policy with a budget that never runs out in these tests.
    fn unbudgeted(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            budget_reserve: 1e9,
            ..RetryPolicy::default()
        }
    }

    #[test]
    fn backoff_is_full_jitter_under_the_capped_exponential_bound() {
        let p = RetryPolicy::default();
        let units = [0.0, 1e-9, 0.1, 0.25, 0.5, 0.75, 0.9, 0.999_999, ALMOST_ONE];
        for retry in 1..=80 {
            let bound = bound_nanos(&p, retry);
            assert_eq!(p.max_backoff(retry).as_nanos(), bound, "retry {retry}");
            for unit in units {
                let d = p.backoff(retry, unit).as_nanos();
                assert!(d <= bound, "retry {retry} unit {unit}: {d} > {bound}");
                // Uniform scaling: the delay is the unit's share of the bound.
                let want = bound as f64 * unit;
                assert!(
                    (d as f64 - want).abs() <= 1.0,
                    "retry {retry} unit {unit}: {d} vs {want}"
                );
            }
            assert_eq!(p.backoff(retry, 0.0), Duration::ZERO, "retry {retry}");
            let near = p.backoff(retry, ALMOST_ONE).as_nanos();
            assert!(
                bound - near <= 1,
                "retry {retry}: {near} does not approach {bound}"
            );
        }
    }

    #[test]
    fn backoff_bound_doubles_then_stops_at_the_cap() {
        let p = RetryPolicy::default(); // base 100 ms, cap 10 s
        let want = [
            100, 200, 400, 800, 1_600, 3_200, 6_400, 10_000, 10_000, 10_000,
        ];
        for (i, ms) in want.into_iter().enumerate() {
            let retry = i as u32 + 1;
            assert_eq!(p.max_backoff(retry), MS(ms), "retry {retry}");
            assert_eq!(p.backoff(retry, 0.5), MS(ms / 2), "retry {retry}");
        }
        // Retry 0 is read as the first retry.
        assert_eq!(p.max_backoff(0), MS(100));
        assert_eq!(p.backoff(0, 0.5), MS(50));
        // Units outside [0, 1] are clamped.
        assert_eq!(p.backoff(1, -3.0), Duration::ZERO);
        assert_eq!(p.backoff(1, f64::NAN), Duration::ZERO);
        assert_eq!(p.backoff(1, 7.0), MS(100));
    }

    #[test]
    fn backoff_does_not_overflow_for_huge_retry_numbers() {
        let p = RetryPolicy::default();
        for retry in [32, 33, 63, 64, 65, 1_000, u32::MAX - 1, u32::MAX] {
            assert_eq!(
                p.max_backoff(retry),
                Duration::from_secs(10),
                "retry {retry}"
            );
            assert_eq!(
                p.backoff(retry, 0.5),
                Duration::from_secs(5),
                "retry {retry}"
            );
        }
        // Even the largest durations saturate instead of overflowing or panicking.
        let huge = RetryPolicy {
            base: Duration::MAX / 2,
            cap: Duration::MAX,
            ..RetryPolicy::default()
        };
        assert_eq!(huge.max_backoff(2), Duration::MAX - Duration::from_nanos(1));
        assert_eq!(huge.max_backoff(3), Duration::MAX);
        assert_eq!(huge.max_backoff(u32::MAX), Duration::MAX);
        // f64 seconds near 2^64 are 2048 s apart: close to the top, never past it.
        let near_top = huge.backoff(u32::MAX, ALMOST_ONE);
        assert!(
            near_top >= Duration::MAX - Duration::from_secs(4_096),
            "{near_top:?}"
        );
        assert_eq!(huge.backoff(u32::MAX, 1.0), Duration::MAX);
        assert_eq!(huge.backoff(u32::MAX, 0.0), Duration::ZERO);
    }

    proptest! {
        #[test]
        fn backoff_stays_within_bounds(
            base_ns in 1u64..=1_000_000_000_000,
            cap_extra_ns in 0u64..=1_000_000_000_000,
            retry in prop_oneof![0u32..=80, any::<u32>()],
            unit in 0.0f64..1.0,
        ) {
            let p = RetryPolicy {
                base: Duration::from_nanos(base_ns),
                cap: Duration::from_nanos(base_ns + cap_extra_ns),
                ..RetryPolicy::default()
            };
            prop_assert!(p.validate().is_ok());
            let bound = bound_nanos(&p, retry);
            let d = p.backoff(retry, unit).as_nanos();
            prop_assert!(d <= bound, "{} > {}", d, bound);
            let want = bound as f64 * unit;
            prop_assert!((d as f64 - want).abs() <= 2.0, "{} vs {}", d, want);
        }
    }

    #[test]
    fn jitter_is_uniform_over_the_range() {
        // Deterministic: the seed fixes every draw.
        let mut r = Retrier::new(unbudgeted(10), 0x5EED);
        let bound = r.policy().max_backoff(3).as_secs_f64(); // 400 ms
        let delays: Vec<f64> = (0..10_000)
            .map(|_| match r.decide(3, &retryable()) {
                Decision::Retry { after } => after.as_secs_f64(),
                other => panic!("{other:?}"),
            })
            .collect();
        let mean = delays.iter().sum::<f64>() / delays.len() as f64;
        assert!(
            (mean - bound / 2.0).abs() <= 0.05 * bound / 2.0,
            "mean {mean} vs {}",
            bound / 2.0
        );
        // Full jitter reaches both ends of the range and fills each quarter evenly.
        let min = delays.iter().copied().fold(f64::INFINITY, f64::min);
        let max = delays.iter().copied().fold(0.0, f64::max);
        assert!(
            min < 0.01 * bound && max > 0.99 * bound && max <= bound,
            "{min} {max}"
        );
        for q in 0..4 {
            let (lo, hi) = (q as f64 * bound / 4.0, (q + 1) as f64 * bound / 4.0);
            let n = delays.iter().filter(|&&d| lo <= d && d < hi).count();
            assert!((2_300..=2_700).contains(&n), "quarter {q}: {n}");
        }
    }

    #[test]
    fn the_seed_fixes_the_delays() {
        let draw = |seed| {
            let mut r = Retrier::new(unbudgeted(10), seed);
            (0..20)
                .map(|_| r.decide(5, &retryable()))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    /// Runs `op` through `r`, recording the attempt numbers it saw and the sleeps.
    fn run_recorded(
        r: &mut Retrier,
        mut op: impl FnMut(u32) -> Result<&'static str, Outcome>,
    ) -> (
        Result<&'static str, Failed<Outcome>>,
        Vec<u32>,
        Vec<Duration>,
    ) {
        let (mut seen, mut sleeps) = (Vec::new(), Vec::new());
        let result = r.run(
            |attempt| {
                seen.push(attempt);
                op(attempt)
            },
            |outcome| *outcome,
            |d| sleeps.push(d),
        );
        (result, seen, sleeps)
    }

    #[test]
    fn run_sleeps_once_per_failure_then_succeeds() {
        for k in 0..5u32 {
            let mut r = Retrier::new(RetryPolicy::default(), u64::from(k));
            let (result, seen, sleeps) = run_recorded(&mut r, |attempt| {
                if attempt <= k {
                    Err(retryable())
                } else {
                    Ok("done")
                }
            });
            assert_eq!(result, Ok("done"), "k {k}");
            assert_eq!(seen, (1..=k + 1).collect::<Vec<_>>(), "k {k}");
            assert_eq!(sleeps.len(), k as usize, "k {k}");
            for (i, d) in sleeps.iter().enumerate() {
                let retry = i as u32 + 1;
                assert!(
                    *d <= r.policy().max_backoff(retry),
                    "k {k} retry {retry}: {d:?}"
                );
            }
            assert_eq!((r.requests(), r.retries()), (1, u64::from(k)));
        }
    }

    #[test]
    fn run_stops_at_the_attempt_limit() {
        let mut r = Retrier::new(RetryPolicy::default(), 9);
        let (result, seen, sleeps) = run_recorded(&mut r, |_| Err(retryable()));
        assert_eq!(
            result,
            Err(Failed {
                error: retryable(),
                attempts: 5,
                reason: GiveUp::AttemptsExhausted
            })
        );
        assert_eq!(seen, [1, 2, 3, 4, 5]);
        assert_eq!(sleeps.len(), 4);
        for (i, d) in sleeps.iter().enumerate() {
            assert!(*d <= r.policy().max_backoff(i as u32 + 1), "{i}: {d:?}");
        }
        // One attempt only: never a retry.
        let mut once = Retrier::new(unbudgeted(1), 9);
        let (result, seen, sleeps) = run_recorded(&mut once, |_| Err(retryable()));
        assert_eq!(result.unwrap_err().reason, GiveUp::AttemptsExhausted);
        assert_eq!((seen.len(), sleeps.len()), (1, 0));
    }

    #[test]
    fn permanent_failures_are_not_retried() {
        let mut r = Retrier::new(RetryPolicy::default(), 1);
        let (result, seen, sleeps) = run_recorded(&mut r, |_| Err(Outcome::Permanent));
        assert_eq!(
            result,
            Err(Failed {
                error: Outcome::Permanent,
                attempts: 1,
                reason: GiveUp::NotRetryable
            })
        );
        assert_eq!((seen, sleeps), (vec![1], vec![]));
        assert_eq!((r.requests(), r.retries()), (1, 0));
    }

    #[test]
    fn fenced_writes_are_never_retried() {
        let mut r = Retrier::new(unbudgeted(100), 1);
        let (result, seen, sleeps) = run_recorded(&mut r, |_| Err(Outcome::Fenced));
        assert_eq!(
            result,
            Err(Failed {
                error: Outcome::Fenced,
                attempts: 1,
                reason: GiveUp::Fenced
            })
        );
        assert_eq!((seen, sleeps), (vec![1], vec![]));
        // Not even mid-way through a request whose earlier failures were retryable.
        let mut n = 0;
        let (result, seen, sleeps) = run_recorded(&mut r, |_| {
            n += 1;
            Err(if n < 3 { retryable() } else { Outcome::Fenced })
        });
        assert_eq!(result.unwrap_err().reason, GiveUp::Fenced);
        assert_eq!((seen.len(), sleeps.len()), (3, 2));
        assert_eq!(r.retries(), 2);
    }

    #[test]
    fn retry_after_is_honoured_above_the_cap() {
        let mut r = Retrier::new(RetryPolicy::default(), 4);
        let wait = Duration::from_secs(30); // cap is 10 s
        let mut first = true;
        let (result, _, sleeps) = run_recorded(&mut r, |_| {
            if std::mem::take(&mut first) {
                Err(Outcome::Retryable {
                    retry_after: Some(wait),
                })
            } else {
                Ok("ok")
            }
        });
        assert_eq!(result, Ok("ok"));
        assert_eq!(sleeps, [wait]);
        // A Retry-After shorter than the drawn backoff does not shorten it.
        let p = RetryPolicy {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(1),
            ..unbudgeted(100)
        };
        let mut r = Retrier::new(p, 4);
        let short = Outcome::Retryable {
            retry_after: Some(MS(500)),
        };
        let mut above_half = 0;
        for _ in 0..100 {
            let Decision::Retry { after } = r.decide(1, &short) else {
                panic!("budgeted out")
            };
            assert!(MS(500) <= after && after <= MS(1_000), "{after:?}");
            above_half += usize::from(after > MS(500));
        }
        // About half the draws exceed 500 ms: the backoff, not the Retry-After, wins.
        assert!((30..=70).contains(&above_half), "{above_half}");
    }

    #[test]
    fn the_budget_limits_retries_to_a_share_of_requests() {
        // Defaults: ratio 0.1, reserve 10, 5 attempts; every attempt fails.
        let mut r = Retrier::new(RetryPolicy::default(), 11);
        let (mut attempts_exhausted, mut budget_exhausted) = (0, 0);
        for _ in 0..1000 {
            let (result, seen, sleeps) = run_recorded(&mut r, |_| Err(retryable()));
            let failed = result.unwrap_err();
            assert_eq!(failed.attempts as usize, seen.len());
            assert_eq!(sleeps.len(), seen.len() - 1);
            match failed.reason {
                GiveUp::AttemptsExhausted => attempts_exhausted += 1,
                GiveUp::BudgetExhausted => budget_exhausted += 1,
                other => panic!("{other:?}"),
            }
        }
        // 10 reserve + 0.1 × 1000 deposits, each used up (exact in millionths): requests 1
        // and 2 retry 4 times each on the reserve, request 3 twice, then one retry every
        // tenth request.
        assert_eq!(r.requests(), 1000);
        assert_eq!(r.retries(), 110);
        assert!(r.retries() as f64 <= 10.0 + 0.1 * 1000.0);
        assert_eq!((attempts_exhausted, budget_exhausted), (2, 998));
        assert_eq!(r.retry_ratio(), 110.0 / 1000.0);
        assert!(r.budget() < 1.0, "{}", r.budget());
    }

    #[test]
    fn the_budget_saves_up_no_more_than_its_capacity() {
        let mut r = Retrier::new(RetryPolicy::default(), 12);
        // It starts at the reserve; each request adds the ratio.
        assert_eq!(r.budget(), 10.0);
        r.begin();
        assert_eq!(r.budget(), 10.1);
        for _ in 0..100_000 {
            r.run(|_| Ok::<_, Outcome>(()), |o| *o, |_| {}).unwrap();
        }
        // 10 reserve + 0.1 × BUDGET_WINDOW (1000) requests' worth.
        assert_eq!(r.budget(), 110.0);
        let mut retries = 0;
        while let Decision::Retry { .. } = r.decide(1, &retryable()) {
            retries += 1;
            assert!(retries <= 110, "the budget grants more than its capacity");
        }
        assert_eq!(retries, 110);
        assert_eq!(
            r.decide(1, &retryable()),
            Decision::GiveUp(GiveUp::BudgetExhausted)
        );
        // A new request deposits a tenth of a token: not yet a retry.
        r.begin();
        assert_eq!(
            r.decide(1, &retryable()),
            Decision::GiveUp(GiveUp::BudgetExhausted)
        );
        // With no ratio, the reserve is all there ever is.
        let mut r = Retrier::new(
            RetryPolicy {
                budget_ratio: 0.0,
                budget_reserve: 2.0,
                ..unbudgeted(100)
            },
            13,
        );
        for _ in 0..1000 {
            r.begin();
        }
        assert!(matches!(r.decide(1, &retryable()), Decision::Retry { .. }));
        assert!(matches!(r.decide(1, &retryable()), Decision::Retry { .. }));
        assert_eq!(
            r.decide(1, &retryable()),
            Decision::GiveUp(GiveUp::BudgetExhausted)
        );
    }

    #[test]
    fn decide_checks_the_outcome_before_the_limits() {
        let mut r = Retrier::new(
            RetryPolicy {
                budget_reserve: 0.0,
                ..RetryPolicy::default()
            },
            14,
        );
        // Out of attempts and out of budget, but the outcome says why first.
        assert_eq!(
            r.decide(9, &Outcome::Permanent),
            Decision::GiveUp(GiveUp::NotRetryable)
        );
        assert_eq!(
            r.decide(9, &Outcome::Fenced),
            Decision::GiveUp(GiveUp::Fenced)
        );
        // Attempts before budget.
        assert_eq!(
            r.decide(5, &retryable()),
            Decision::GiveUp(GiveUp::AttemptsExhausted)
        );
        assert_eq!(
            r.decide(4, &retryable()),
            Decision::GiveUp(GiveUp::BudgetExhausted)
        );
        assert_eq!(r.retries(), 0);
    }

    #[test]
    fn retry_ratio_is_retries_over_requests() {
        let mut r = Retrier::new(RetryPolicy::default(), 15);
        assert_eq!(r.retry_ratio(), 0.0);
        let labels = [("operator", "retry-test-sink"), ("subtask", "3")];
        let mut r2 =
            Retrier::new(RetryPolicy::default(), 15).with_metric(retry_ratio_gauge(&labels));
        assert_eq!(
            crate::metrics::value(RETRY_RATIO_METRIC, &labels),
            Some(0.0)
        );
        for fails in [0, 2, 1] {
            for r in [&mut r, &mut r2] {
                let mut left = fails;
                r.run(
                    |_| {
                        if left > 0 {
                            left -= 1;
                            Err(retryable())
                        } else {
                            Ok(())
                        }
                    },
                    |o| *o,
                    |_| {},
                )
                .unwrap();
            }
        }
        assert_eq!((r.requests(), r.retries()), (3, 3));
        assert_eq!(r.retry_ratio(), 1.0);
        assert_eq!(r2.retry_ratio(), 1.0);
        assert_eq!(
            crate::metrics::value(RETRY_RATIO_METRIC, &labels),
            Some(1.0)
        );
        r2.begin();
        assert_eq!(
            crate::metrics::value(RETRY_RATIO_METRIC, &labels),
            Some(0.75)
        );
    }

    #[test]
    fn policy_validation_names_the_bad_field() {
        let d = RetryPolicy::default();
        assert_eq!(d.validate(), Ok(()));
        let bad = [
            (
                RetryPolicy {
                    base: Duration::ZERO,
                    ..d.clone()
                },
                "base",
            ),
            (
                RetryPolicy {
                    cap: MS(99),
                    ..d.clone()
                },
                "cap",
            ),
            (
                RetryPolicy {
                    max_attempts: 0,
                    ..d.clone()
                },
                "max_attempts",
            ),
            (
                RetryPolicy {
                    budget_ratio: -0.1,
                    ..d.clone()
                },
                "budget_ratio",
            ),
            (
                RetryPolicy {
                    budget_ratio: 1.5,
                    ..d.clone()
                },
                "budget_ratio",
            ),
            (
                RetryPolicy {
                    budget_ratio: f64::NAN,
                    ..d.clone()
                },
                "budget_ratio",
            ),
            (
                RetryPolicy {
                    budget_reserve: -1.0,
                    ..d.clone()
                },
                "budget_reserve",
            ),
            (
                RetryPolicy {
                    budget_reserve: f64::INFINITY,
                    ..d.clone()
                },
                "budget_reserve",
            ),
        ];
        for (p, field) in bad {
            let e = p.validate().unwrap_err();
            assert!(
                e.starts_with(&format!("retry policy: {field} ")),
                "{field}: {e}"
            );
            assert_eq!(Retrier::try_new(p, 0).unwrap_err(), e);
        }
        // Edge values that are fine.
        let edge = RetryPolicy {
            cap: d.base,
            max_attempts: 1,
            budget_ratio: 1.0,
            budget_reserve: 0.0,
            ..d
        };
        assert_eq!(edge.validate(), Ok(()));
    }

    #[test]
    #[should_panic(expected = "retry policy: max_attempts")]
    fn new_rejects_an_invalid_policy() {
        let _ = Retrier::new(
            RetryPolicy {
                max_attempts: 0,
                ..RetryPolicy::default()
            },
            0,
        );
    }

    #[test]
    fn failures_and_reasons_read_clearly() {
        let f = Failed {
            error: "HTTP 503",
            attempts: 5,
            reason: GiveUp::AttemptsExhausted,
        };
        assert_eq!(
            f.to_string(),
            "gave up after 5 attempts (the attempt limit was reached): HTTP 503"
        );
        let f = Failed {
            error: io::Error::from(io::ErrorKind::PermissionDenied),
            attempts: 1,
            reason: GiveUp::NotRetryable,
        };
        assert!(
            f.to_string()
                .starts_with("gave up after 1 attempt (the failure is not retryable): "),
            "{f}"
        );
        assert!(std::error::Error::source(&f).is_some());
        assert!(
            GiveUp::Fenced
                .to_string()
                .contains("fencing token is stale")
        );
        assert!(GiveUp::BudgetExhausted.to_string().contains("retry budget"));
    }

    #[test]
    fn http_statuses_sort_into_retryable_and_permanent() {
        let wait = Some(Duration::from_secs(3));
        let retry = Outcome::Retryable { retry_after: wait };
        for status in [408, 429, 500, 502, 503, 504, 599] {
            assert_eq!(classify_http(status, wait), retry, "{status}");
        }
        assert_eq!(classify_http(503, None), retryable());
        for status in [400, 401, 403, 404, 409, 410, 422, 499] {
            assert_eq!(classify_http(status, wait), Outcome::Permanent, "{status}");
        }
        // Not failures (documented): permanent, so never retried by mistake.
        for status in [0, 100, 200, 204, 301, 304, 600, u16::MAX] {
            assert_eq!(classify_http(status, wait), Outcome::Permanent, "{status}");
        }
    }

    #[test]
    fn retry_after_parses_seconds_and_http_dates() {
        // Wed, 21 Oct 2015 07:27:30 GMT.
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_450);
        let secs = Duration::from_secs;
        assert_eq!(parse_retry_after("120", now), Some(secs(120)));
        assert_eq!(parse_retry_after(" 5 ", now), Some(secs(5)));
        assert_eq!(parse_retry_after("\t0", now), Some(Duration::ZERO));
        for garbage in [
            "-1",
            "+5",
            "1.5",
            "abc",
            "",
            "  ",
            "5s",
            "99999999999999999999",
        ] {
            assert_eq!(parse_retry_after(garbage, now), None, "{garbage:?}");
        }
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
            Some(secs(30))
        );
        // Relative to `now` to the nanosecond.
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now + MS(250)),
            Some(MS(29_750))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:27:30 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::ZERO)
        );
        // Dates across months, leap years and centuries.
        assert_eq!(
            parse_retry_after("Thu, 01 Jan 1970 00:00:01 GMT", UNIX_EPOCH),
            Some(secs(1))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", UNIX_EPOCH),
            Some(secs(784_111_777))
        );
        assert_eq!(
            parse_retry_after("Fri, 01 Jan 2100 00:00:00 GMT", UNIX_EPOCH),
            Some(secs(4_102_444_800))
        );
        assert_eq!(
            parse_retry_after("Mon, 29 Feb 2016 00:00:00 GMT", UNIX_EPOCH),
            Some(secs(1_456_704_000))
        );
        for bad in [
            "Wed, 32 Oct 2015 07:28:00 GMT",
            "Wed, 00 Oct 2015 07:28:00 GMT",
            "Wed, 21 Foo 2015 07:28:00 GMT",
            "Sun, 29 Feb 2015 07:28:00 GMT",
            "Sat, 31 Apr 2015 07:28:00 GMT",
            "Wed, 21 Oct 2015 24:00:00 GMT",
            "Wed, 21 Oct 2015 07:60:00 GMT",
            "Wed, 21 Oct 2015 07:28:00 UTC",
            "wed, 21 Oct 2015 07:28:00 GMT",
            "Wed, 21 oct 2015 07:28:00 GMT",
            "Wed, 21 Oct 15 07:28:00 GMT",
            "Wed 21 Oct 2015 07:28:00 GMT",
            "Wed, 21 Oct 2015 07:28 GMT",
            "Wed, 2a Oct 2015 07:28:00 GMT",
            "Wednesday, 21-Oct-15 07:28:00 GMT",
            "Wed Oct 21 07:28:00 2015",
            "Wed, 21 Oct 2015 07:28:00 GMT junk",
        ] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn io_errors_sort_into_retryable_and_permanent() {
        use io::ErrorKind::*;
        for kind in [
            TimedOut,
            ConnectionReset,
            ConnectionAborted,
            ConnectionRefused,
            BrokenPipe,
            Interrupted,
            WouldBlock,
            UnexpectedEof,
            NotConnected,
        ] {
            assert_eq!(classify_io(&io::Error::from(kind)), retryable(), "{kind:?}");
        }
        for kind in [
            NotFound,
            PermissionDenied,
            InvalidInput,
            InvalidData,
            AlreadyExists,
            Unsupported,
            Other,
        ] {
            assert_eq!(
                classify_io(&io::Error::from(kind)),
                Outcome::Permanent,
                "{kind:?}"
            );
        }
    }
}
