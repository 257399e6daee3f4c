//! Fencing-token writes: a write is applied only if its token is newer than the stored one.

use crate::delivery::{Common, Delivery, Undelivered, undelivered_error};
use crate::sink::SqlParams;
use crate::{classify_pg, describe};
use postgres::types::ToSql;
use serde::Serialize;
use std::sync::Arc;
use weir_core::dlq::DeadLetterFactory;
use weir_core::ids::CheckpointId;
use weir_core::metrics::{self, Counter};
use weir_core::ops::sink::{SinkContext, SinkFunction};
use weir_core::retry::{Outcome, RetryPolicy};
use weir_core::time::Timestamp;
use weir_core::{Error, Result};

/// A sink of conditional writes guarded by a fencing token.
///
/// Dedup removes repeats, not reordering: a writer that paused and comes back with an old
/// value must not overwrite a newer one. Each record carries a monotonically increasing
/// token (a version, an epoch, a lease number) and the statement applies only when the
/// stored token is older — `UPDATE ... SET ..., fence = $new WHERE key = $k AND fence < $new`,
/// or an upsert with `ON CONFLICT ... DO UPDATE ... WHERE t.fence < EXCLUDED.fence`. The
/// statement must affect no row exactly when the token is stale: zero rows is taken as "a
/// newer write already won", counted in `fencing_stale_writes_total` and given up — never
/// retried, never dead-lettered, because retrying cannot make an old token new. Other
/// failures are retried under the [`RetryPolicy`] and then dead-lettered (or fail the job).
///
/// ```
/// use weir_postgres::FencedWrites;
/// // (item, value, version)
/// let sink = FencedWrites::new(
///     "postgres://weir@127.0.0.1/weir",
///     "items",
///     "INSERT INTO items (id, value, fence) VALUES ($1, $2, $3)
///      ON CONFLICT (id) DO UPDATE SET value = EXCLUDED.value, fence = EXCLUDED.fence
///      WHERE items.fence < EXCLUDED.fence",
///     |r: &(String, String, i64)| vec![Box::new(r.0.clone()), Box::new(r.1.clone()), Box::new(r.2)],
/// )
/// .key(|r| format!("{}@{}", r.0, r.2));
/// let _make = sink.make(); // for stream.sink("items", _make)
/// ```
pub struct FencedWrites<T> {
    common: Common,
    handler: String,
    sql: String,
    params: Arc<dyn Fn(&T) -> SqlParams + Send + Sync>,
    key: Arc<dyn Fn(&T) -> String + Send + Sync>,
}

impl<T> Clone for FencedWrites<T> {
    fn clone(&self) -> Self {
        FencedWrites {
            common: self.common.clone(),
            handler: self.handler.clone(),
            sql: self.sql.clone(),
            params: self.params.clone(),
            key: self.key.clone(),
        }
    }
}

/// Why a fenced write was not applied.
#[derive(Debug)]
pub(crate) enum FenceError {
    Stale,
    Db(postgres::Error),
}

impl std::fmt::Display for FenceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FenceError::Stale => write!(f, "stale fencing token: a newer write was applied"),
            FenceError::Db(e) => write!(f, "database error: {}", describe(e)),
        }
    }
}

fn classify(e: &FenceError) -> Outcome {
    match e {
        FenceError::Stale => Outcome::Fenced,
        FenceError::Db(e) => classify_pg(e),
    }
}

impl<T: Serialize + 'static> FencedWrites<T> {
    /// Writes with `sql`, its `$1, $2, ...` bound from the record by `params`, as `handler`.
    pub fn new(
        url: &str,
        handler: &str,
        sql: &str,
        params: impl Fn(&T) -> SqlParams + Send + Sync + 'static,
    ) -> Self {
        FencedWrites {
            common: Common::new(url),
            handler: handler.to_string(),
            sql: sql.to_string(),
            params: Arc::new(params),
            key: Arc::new(|_| String::new()),
        }
    }

    /// A record's idempotency key, for logs and dead letters (default: none).
    pub fn key(mut self, key: impl Fn(&T) -> String + Send + Sync + 'static) -> Self {
        self.key = Arc::new(key);
        self
    }

    /// The retry policy for failed writes (stale tokens are never retried).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.common.retry = policy;
        self
    }

    /// Where writes that keep failing go; without one, such a write fails the job.
    pub fn dead_letters(mut self, dlq: DeadLetterFactory) -> Self {
        self.common.dead_letters = Some(dlq);
        self
    }

    /// One sink instance per subtask, for `Stream::sink`.
    pub fn make(self) -> impl Fn() -> FencedSink<T> + Send + Sync + 'static {
        move || FencedSink {
            config: self.clone(),
            open: None,
        }
    }
}

/// One subtask of a [`FencedWrites`] sink.
pub struct FencedSink<T> {
    config: FencedWrites<T>,
    open: Option<(Delivery, String, Counter, Counter)>,
}

impl<T: Serialize + 'static> SinkFunction<T> for FencedSink<T> {
    fn open(&mut self, ctx: &SinkContext) -> Result<()> {
        let delivery = Delivery::open(&self.config.common, &self.config.handler, ctx)?;
        let subtask = ctx.subtask.to_string();
        let l = [
            ("operator", ctx.name.as_str()),
            ("subtask", subtask.as_str()),
        ];
        self.open = Some((
            delivery,
            ctx.name.clone(),
            metrics::counter(
                "fenced_writes_applied_total",
                "Fenced writes applied (their token was newer).",
                &l,
            ),
            metrics::counter(
                "fencing_stale_writes_total",
                "Fenced writes given up because a newer token was already applied.",
                &l,
            ),
        ));
        Ok(())
    }

    fn invoke(&mut self, record: T, _ts: Timestamp) -> Result<()> {
        let (delivery, name, applied, stale) = self
            .open
            .as_mut()
            .ok_or_else(|| Error::User("fenced sink used before open".into()))?;
        let key = (self.config.key)(&record);
        let params = (self.config.params)(&record);
        let sql = self.config.sql.as_str();
        let result = delivery.run(
            &mut |client, _| {
                let refs: Vec<&(dyn ToSql + Sync)> =
                    params.iter().map(|b| &**b as &(dyn ToSql + Sync)).collect();
                match client.execute(sql, &refs) {
                    Ok(0) => Err(FenceError::Stale),
                    Ok(_) => Ok(()),
                    Err(e) => Err(FenceError::Db(e)),
                }
            },
            FenceError::Db,
            classify,
        );
        match result {
            Ok(()) => applied.inc(),
            Err(failed) => {
                let payload = || serde_json::to_value(&record).unwrap_or_default();
                match delivery.give_up(failed, &key, payload)? {
                    Undelivered::Fenced => {
                        stale.inc();
                        tracing::info!(sink = %name, key = %key, "stale fencing token: write given up");
                    }
                    Undelivered::DeadLettered => {}
                    Undelivered::Failed(f) => return Err(undelivered_error(name, &key, &f)),
                }
            }
        }
        Ok(())
    }

    fn snapshot(&mut self, _checkpoint: CheckpointId) -> Result<Option<(Vec<u8>, String)>> {
        if let Some((d, ..)) = self.open.as_mut() {
            d.flush()?;
        }
        Ok(None)
    }

    fn finish(&mut self) -> Result<()> {
        if let Some((d, ..)) = self.open.as_mut() {
            d.flush()?;
        }
        Ok(())
    }
}
