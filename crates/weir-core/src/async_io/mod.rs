//! Async I/O: calling an external service (an HTTP API, a database) for every record
//! without waiting for one answer before sending the next request — Flink's async I/O.
//!
//! Owns the pipeline author's side of it: [`AsyncOptions`] (capacity, timeout, result
//! order, retries), [`AsyncFunction`] (the full interface: a request, a timeout handler,
//! the classification of errors for retries) and the process's async runtime
//! ([`handle`], [`install`]). The DSL methods are `Stream::map_async`,
//! `Stream::try_map_async`, `Stream::process_async` and their `KeyedStream` twins; the
//! operator behind them lives in this module too. It must not know about channels between
//! subtasks or checkpoint storage: it hands its in-flight records to the checkpoint as
//! operator state and gets them back on restore.
//!
//! # Semantics
//!
//! - At most [`AsyncOptions::capacity`] records per subtask are in the operator (requests
//!   in flight plus results waiting for their turn); when it is full the operator stops
//!   taking input until a request completes, and the backpressure reaches the sources.
//! - Every request has [`AsyncOptions::timeout`], counted from its first attempt over all
//!   its retries; when it passes, [`AsyncFunction::on_timeout`] decides what to emit (the
//!   default fails the job, naming the operator).
//! - With [`AsyncOptions::retry`], a failed attempt is retried through a
//!   [`crate::retry::Retrier`] (backoff with jitter, attempt limit, retry budget); a
//!   request that is given up fails the job with its last error.
//! - [`OutputOrder::Ordered`] emits results in input order; [`OutputOrder::Unordered`] as
//!   they complete. In both, a watermark is emitted only after the results of every record
//!   before it, and no result of a record after it is emitted before it.
//! - Exactly-once: at a checkpoint barrier the records whose requests are in flight (and the
//!   results still waiting) are stored in the checkpoint; a job resuming from it issues
//!   those requests again, so each record's result is emitted once — downstream of the
//!   barrier — also at another parallelism. The external service may see a request twice
//!   (once before the crash, once after): make the request idempotent.

mod operator;
mod queue;
mod runtime;
mod saved;

pub use queue::OutputOrder;
pub use runtime::{handle, install};

pub(crate) use operator::{AsyncOp, Erased, KeyHash, Route};

use crate::error::Result;
use crate::retry::{Outcome, RetryPolicy};
use std::future::Future;
use std::time::Duration;

/// The settings of an async I/O operator: how many records it may hold, how long a
/// request may take, the order of its results and whether failed attempts are retried.
///
/// ```
/// use std::time::Duration;
/// use weir_core::async_io::{AsyncOptions, OutputOrder};
/// let opts = AsyncOptions::new(100, Duration::from_secs(2)).unordered();
/// assert_eq!((opts.capacity, opts.order), (100, OutputOrder::Unordered));
/// assert!(AsyncOptions::new(0, Duration::from_secs(1)).validate().unwrap_err().contains("capacity"));
/// ```
#[derive(Debug, Clone)]
pub struct AsyncOptions {
    /// Records a subtask may hold: requests in flight plus results waiting to be emitted.
    pub capacity: usize,
    /// How long a request may take, from its first attempt over all retries.
    pub timeout: Duration,
    /// In which order results are emitted.
    pub order: OutputOrder,
    /// Retries of failed attempts (`None`: a failed attempt fails the job).
    pub retry: Option<RetryPolicy>,
}

impl AsyncOptions {
    /// `capacity` records per subtask, `timeout` per request, results in input order, no
    /// retries.
    pub fn new(capacity: usize, timeout: Duration) -> Self {
        AsyncOptions {
            capacity,
            timeout,
            order: OutputOrder::Ordered,
            retry: None,
        }
    }

    /// Emits results as they complete (watermarks still wait for the records before them).
    pub fn unordered(mut self) -> Self {
        self.order = OutputOrder::Unordered;
        self
    }

    /// Emits results in input order (the default).
    pub fn ordered(mut self) -> Self {
        self.order = OutputOrder::Ordered;
        self
    }

    /// Retries failed attempts under `policy` (backoff, attempt limit, retry budget).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// Checks the settings; the error says what to change.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.capacity == 0 {
            return Err(
                "async I/O: capacity must be at least 1 (the records a subtask may have in flight)"
                    .to_string(),
            );
        }
        if self.timeout.is_zero() {
            return Err(
                "async I/O: timeout must be greater than zero (how long one request may take)"
                    .to_string(),
            );
        }
        if let Some(p) = &self.retry {
            p.validate().map_err(|e| format!("async I/O: {e}"))?;
        }
        Ok(())
    }
}

/// The full interface of an async request: what `map_async` and `try_map_async` build
/// from a closure, for when a timeout should emit a fallback or errors need sorting into
/// retryable and permanent ones. Give it to `Stream::process_async`.
///
/// `call` runs on the subtask's thread and returns the request's future, which runs on the
/// process's async runtime (so it must be `Send + 'static`: move what it needs into it).
/// Write it as a function returning an `async move` block, as below, not as an
/// `async fn`, whose future would borrow `self` (clippy's `manual_async_fn` suggests the
/// latter; allow it on the method).
///
/// ```
/// use std::future::Future;
/// use std::time::Duration;
/// use weir_core::async_io::{AsyncFunction, AsyncOptions};
/// use weir_core::retry::Outcome;
///
/// struct Price;
/// impl AsyncFunction<u32, (u32, f64)> for Price {
///     type Error = String;
///     fn call(&self, item: u32) -> impl Future<Output = Result<(u32, f64), String>> + Send + 'static {
///         async move { if item == 0 { Err("unknown item".into()) } else { Ok((item, item as f64 * 1.5)) } }
///     }
///     fn on_timeout(&self, item: &u32, _after: Duration) -> weir_core::Result<Option<(u32, f64)>> {
///         Ok(Some((*item, f64::NAN))) // a fallback instead of failing the job
///     }
///     fn classify(&self, e: &String) -> Outcome {
///         if e.contains("unknown") { Outcome::Permanent } else { Outcome::Retryable { retry_after: None } }
///     }
/// }
///
/// use weir_core::prelude::*;
/// let p = Pipeline::new();
/// let prices = p.from_collection(vec![1u32, 2, 3])
///     .process_async(AsyncOptions::new(10, Duration::from_secs(5)), Price)
///     .collect();
/// # let _ = prices;
/// ```
pub trait AsyncFunction<T, O>: Send + Sync + 'static {
    /// What a failed attempt reports (shown in the job's error when it is given up).
    type Error: std::fmt::Display + Send + 'static;

    /// Starts the request for `input`.
    fn call(
        &self,
        input: T,
    ) -> impl Future<Output = std::result::Result<O, Self::Error>> + Send + 'static;

    /// The request for `input` took longer than `timeout`: `Ok(Some(o))` emits `o` in its
    /// place, `Ok(None)` emits nothing, an error fails the job. The default fails the job.
    fn on_timeout(&self, input: &T, timeout: Duration) -> Result<Option<O>> {
        let _ = input;
        Err(crate::Error::User(timeout_message(timeout)))
    }

    /// Whether a failed attempt may be retried (used with [`AsyncOptions::retry`]). The
    /// default retries every error.
    fn classify(&self, error: &Self::Error) -> Outcome {
        let _ = error;
        Outcome::Retryable { retry_after: None }
    }
}

pub(crate) fn timeout_message(timeout: Duration) -> String {
    format!(
        "an async request timed out after {timeout:?}; raise AsyncOptions::timeout, or use \
         process_async with an AsyncFunction whose on_timeout emits a fallback or nothing"
    )
}

/// `map_async`'s closure as an [`AsyncFunction`] that never fails.
pub(crate) struct Infallible<F>(pub(crate) F);

impl<T, O, F, Fut> AsyncFunction<T, O> for Infallible<F>
where
    F: Fn(T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = O> + Send + 'static,
{
    type Error = std::convert::Infallible;
    fn call(
        &self,
        input: T,
    ) -> impl Future<Output = std::result::Result<O, Self::Error>> + Send + 'static {
        let fut = (self.0)(input);
        async move { Ok(fut.await) }
    }
}

/// `try_map_async`'s closure as an [`AsyncFunction`].
pub(crate) struct Fallible<F>(pub(crate) F);

impl<T, O, E, F, Fut> AsyncFunction<T, O> for Fallible<F>
where
    F: Fn(T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::result::Result<O, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    type Error = E;
    fn call(&self, input: T) -> impl Future<Output = std::result::Result<O, E>> + Send + 'static {
        (self.0)(input)
    }
}

#[cfg(test)]
mod tests;
