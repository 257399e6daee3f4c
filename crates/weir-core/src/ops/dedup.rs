//! Deduplication by idempotency key (`Stream::dedup_by`): the first record of each key
//! passes, a repeat with the same payload is suppressed and counted, and a repeat with a
//! different payload is an [`IdempotencyError`] on a side output — never silently dropped.

use super::OpInfo;
use super::keyed::{KeyedContext, KeyedProcessFunction};
use crate::data::{Data, Key, key_hash};
use crate::error::Result;
use crate::metrics::{self, AgeGauge, Counter, Gauge};
use crate::output::{Control, Output};
use crate::state::{StateContext, ValueState};
use crate::time::Timestamp;
use crate::timer::TimeDomain;
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;

/// A record whose idempotency key was seen within the retention window with a different
/// payload: the caller reused a key for another request. It goes to the error side output
/// given to `dedup_by`, and the first record of the key stays the one that passed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyError<T> {
    /// The idempotency key, as `{:?}` shows it.
    pub key: String,
    /// The record that reused the key.
    pub record: T,
    /// When the key was first seen (processing time, Unix milliseconds).
    pub first_seen_ms: i64,
    /// What happened, for logs and dead-letter queues.
    pub message: String,
}

/// What the dedup function emits: routed to the main output or the error side output.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) enum Deduped<T> {
    Unique(T),
    Conflict(IdempotencyError<T>),
}

/// The dedup operator's series, labelled with the operator's name and subtask.
struct DedupMetrics {
    suppressed: Counter,
    conflicts: Counter,
    entries: Gauge,
    oldest: AgeGauge,
}

impl DedupMetrics {
    fn new(info: &OpInfo) -> Self {
        let subtask = info.subtask.to_string();
        let l = [("operator", &*info.name), ("subtask", subtask.as_str())];
        DedupMetrics {
            suppressed: metrics::counter(
                "duplicates_suppressed_total",
                "Records dropped by dedup_by because their idempotency key and payload were seen within the retention window.",
                &l,
            ),
            conflicts: metrics::counter(
                "idempotency_errors_total",
                "Records sent to dedup_by's error output: an idempotency key seen before with a different payload.",
                &l,
            ),
            entries: metrics::gauge(
                "dedup_state_entries",
                "Idempotency keys dedup_by remembers (within the retention window).",
                &l,
            ),
            oldest: metrics::age_gauge(
                "dedup_oldest_entry_age_seconds",
                "Age of the oldest idempotency key dedup_by remembers (0 when none).",
                &l,
            ),
        }
    }
}

/// The keyed function behind `dedup_by`: per key, the payload hash and first-seen time,
/// in value state with the retention as TTL, and a processing-time timer that frees the
/// entry when the retention has passed.
pub(crate) struct DedupFn<K, T> {
    retention_ms: i64,
    seen: Option<ValueState<(u64, i64)>>,
    metrics: DedupMetrics,
    _p: PhantomData<fn(K, T)>,
}

impl<K: Key, T> DedupFn<K, T> {
    pub(crate) fn new(retention: std::time::Duration, info: &OpInfo) -> Self {
        DedupFn {
            retention_ms: i64::try_from(retention.as_millis()).unwrap_or(i64::MAX),
            seen: None,
            metrics: DedupMetrics::new(info),
            _p: PhantomData,
        }
    }

    /// Every remembered key has exactly one pending cleanup timer, so the timers tell the
    /// state's size and its oldest entry (correct after a restore too: timers are
    /// checkpointed).
    fn update_gauges<O>(&self, ctx: &mut KeyedContext<'_, K, O>) {
        let (n, next) = ctx.processing_timers();
        self.metrics.entries.set(n as i64);
        match next {
            Some(t) => self
                .metrics
                .oldest
                .set_since(t.saturating_sub(self.retention_ms)),
            None => self.metrics.oldest.clear(),
        }
    }
}

impl<K: Key, T: Data> KeyedProcessFunction<K, T, Deduped<T>> for DedupFn<K, T> {
    fn open(&mut self, state: &mut StateContext<K>) -> Result<()> {
        let retention = std::time::Duration::from_millis(self.retention_ms.max(0) as u64);
        self.seen = Some(state.value_state_with_ttl("dedup", retention)?);
        Ok(())
    }

    fn process(&mut self, value: T, ctx: &mut KeyedContext<'_, K, Deduped<T>>) -> Result<()> {
        let hash = key_hash(&crate::codec::encode(&value)?[..]);
        let seen = self.seen.as_mut().expect("opened");
        match seen.get()? {
            None => {
                let now = ctx.current_processing_time();
                seen.set((hash, now))?;
                ctx.register_processing_time_timer(now.saturating_add(self.retention_ms));
                ctx.emit(Deduped::Unique(value));
            }
            Some((h, _)) if h == hash => {
                self.metrics.suppressed.inc();
                tracing::debug!(key = ?ctx.key(), "duplicate suppressed by dedup_by");
            }
            Some((_, first_seen_ms)) => {
                self.metrics.conflicts.inc();
                let key = format!("{:?}", ctx.key());
                ctx.emit(Deduped::Conflict(IdempotencyError {
                    message: format!(
                        "idempotency_error: key {key} was first seen at {first_seen_ms} (Unix ms) \
                         with a different payload; the record was not applied"
                    ),
                    key,
                    record: value,
                    first_seen_ms,
                }));
            }
        }
        self.update_gauges(ctx);
        Ok(())
    }

    fn on_timer(
        &mut self,
        time: Timestamp,
        domain: TimeDomain,
        ctx: &mut KeyedContext<'_, K, Deduped<T>>,
    ) -> Result<()> {
        if domain == TimeDomain::ProcessingTime {
            let seen = self.seen.as_mut().expect("opened");
            match seen.get()? {
                // Seen again after it expired: the newer entry's own timer frees it.
                Some((_, first)) if first.saturating_add(self.retention_ms) > time => {}
                _ => seen.clear()?,
            }
        }
        self.update_gauges(ctx);
        Ok(())
    }
}

/// Sends unique records to the main output and idempotency errors to the side output;
/// control events (watermarks, barriers, end of input) to both.
pub(crate) struct Route<T> {
    pub(crate) main: Box<dyn Output<T>>,
    pub(crate) errors: Box<dyn Output<IdempotencyError<T>>>,
}

impl<T> Output<Deduped<T>> for Route<T> {
    fn record(&mut self, value: Deduped<T>, ts: Timestamp) -> Result<()> {
        match value {
            Deduped::Unique(v) => self.main.record(v, ts),
            Deduped::Conflict(e) => self.errors.record(e, ts),
        }
    }
    fn control(&mut self, event: Control) -> Result<()> {
        self.errors.control(event)?;
        self.main.control(event)
    }
}
