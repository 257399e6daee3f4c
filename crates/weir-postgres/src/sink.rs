//! The apply-once sink: every record through the APPLY protocol ([`Store::apply`]), under a
//! retry policy, with a dead-letter queue and a cleanup task.

use crate::apply::{Applied, ApplyError, EffectError, Store};
use crate::delivery::{Common, Delivery, Undelivered, undelivered_error};
use crate::{classify_apply, connect, describe, redact};
use postgres::Transaction;
use postgres::types::ToSql;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;
use weir_core::dlq::DeadLetterFactory;
use weir_core::ids::CheckpointId;
use weir_core::metrics::{self, Counter};
use weir_core::ops::sink::{SinkContext, SinkFunction};
use weir_core::retry::RetryPolicy;
use weir_core::time::Timestamp;
use weir_core::{Error, Result};

/// Parameters of an SQL effect, built from a record.
pub type SqlParams = Vec<Box<dyn ToSql + Sync + Send>>;

type KeyFn<T> = Arc<dyn Fn(&T) -> String + Send + Sync>;
type EffectFn<T> =
    Arc<dyn Fn(&mut Transaction<'_>, &T) -> std::result::Result<Value, EffectError> + Send + Sync>;

/// An apply-once PostgreSQL sink, configured: pass [`make`](Self::make) to `Stream::sink`.
///
/// Every record gets an idempotency key from `key` — once, before any attempt, so every
/// retry and every replay after a restart carries the same key — and a payload hash (SHA-256
/// of its JSON form). Then, in one transaction: the key is marked in the `processed_messages`
/// table, the effect runs, the key is marked DONE with the effect's response. A record whose
/// key is DONE already (a duplicate in the input, or a record replayed from a checkpoint
/// after a crash) changes nothing; it is counted in `duplicates_suppressed_total` and logged
/// at info level. See the [crate docs](crate) for an example.
///
/// Failures are retried under the [`RetryPolicy`] (a concurrent apply of the same key, a
/// serialization failure, a broken connection); a record that still fails — or fails for a
/// reason retrying cannot fix: a constraint violation, the same key with a different payload
/// (`idempotency_error`) — goes to the dead-letter queue if one is set, and otherwise fails
/// the job with the key and the error.
///
/// Metrics (labels `operator`, `subtask`): `apply_once_applied_total`,
/// `duplicates_suppressed_total`, `idempotency_key_conflicts_total`,
/// `idempotency_errors_total`, `apply_once_lease_takeovers_total`, `retry_ratio`,
/// `dead_letters_total` (label `handler`); from the cleanup task (subtask 0):
/// `apply_once_keys`, `apply_once_oldest_key_age_seconds`, `apply_once_keys_deleted_total`.
pub struct ApplyOnce<T> {
    common: Common,
    handler: String,
    table: String,
    lease: Duration,
    retention: Duration,
    cleanup_interval: Duration,
    key: KeyFn<T>,
    effect: Option<EffectFn<T>>,
}

impl<T> Clone for ApplyOnce<T> {
    fn clone(&self) -> Self {
        ApplyOnce {
            common: self.common.clone(),
            handler: self.handler.clone(),
            table: self.table.clone(),
            lease: self.lease,
            retention: self.retention,
            cleanup_interval: self.cleanup_interval,
            key: self.key.clone(),
            effect: self.effect.clone(),
        }
    }
}

impl<T: Serialize + 'static> ApplyOnce<T> {
    /// A sink applying records to the database at `url` as `handler` (the keys' scope: the
    /// same key under two handlers is two keys), with `key` giving each record's idempotency
    /// key. Set the effect with [`effect`](Self::effect) or [`effect_sql`](Self::effect_sql).
    ///
    /// Defaults: table `processed_messages`, lease 60 s, retention 7 days, cleanup every
    /// 60 s, [`RetryPolicy::default`], statement timeout 30 s, no dead-letter queue.
    ///
    /// ```
    /// let sink = weir_postgres::ApplyOnce::new("postgres://weir@127.0.0.1/weir", "payments",
    ///     |p: &(String, i64)| p.0.clone())
    ///     .effect_sql("UPDATE accounts SET balance = balance + $2 WHERE id = $1",
    ///         |p: &(String, i64)| vec![Box::new(p.0.clone()), Box::new(p.1)])
    ///     .retention(std::time::Duration::from_secs(24 * 3600));
    /// let _make = sink.make(); // for stream.sink("payments", _make)
    /// ```
    pub fn new(
        url: &str,
        handler: &str,
        key: impl Fn(&T) -> String + Send + Sync + 'static,
    ) -> Self {
        ApplyOnce {
            common: Common::new(url),
            handler: handler.to_string(),
            table: "processed_messages".to_string(),
            lease: Duration::from_secs(60),
            retention: Duration::from_secs(7 * 24 * 3600),
            cleanup_interval: Duration::from_secs(60),
            key: Arc::new(key),
            effect: None,
        }
    }

    /// The effect as a closure over the transaction the key is marked in. What it returns is
    /// stored as the key's response (JSONB) and returned to duplicates.
    pub fn effect(
        mut self,
        f: impl Fn(&mut Transaction<'_>, &T) -> std::result::Result<Value, EffectError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.effect = Some(Arc::new(f));
        self
    }

    /// The effect as one SQL statement with `$1, $2, ...` bound from the record; the
    /// response is `{"rows": <rows affected>}`.
    pub fn effect_sql(
        self,
        sql: &str,
        params: impl Fn(&T) -> SqlParams + Send + Sync + 'static,
    ) -> Self {
        let sql = sql.to_string();
        self.effect(move |tx, record| {
            let p = params(record);
            let refs: Vec<&(dyn ToSql + Sync)> =
                p.iter().map(|b| &**b as &(dyn ToSql + Sync)).collect();
            let rows = tx.execute(sql.as_str(), &refs)?;
            Ok(serde_json::json!({ "rows": rows }))
        })
    }

    /// The table holding the keys (created if missing). Default `processed_messages`.
    pub fn table(mut self, table: &str) -> Self {
        self.table = table.to_string();
        self
    }

    /// How long an `IN_PROGRESS` row stays leased before another apply may take it over.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long keys are kept (at least as long as the longest delay a duplicate can have:
    /// replay after a restore, a producer's retries, a manual replay of the dead letters).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How often subtask 0 deletes keys older than the retention window.
    pub fn cleanup_interval(mut self, every: Duration) -> Self {
        self.cleanup_interval = every;
        self
    }

    /// The retry policy for failed applies.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.common.retry = policy;
        self
    }

    /// Where records the sink gives up on go (see [`weir_core::dlq`]); without one, such a
    /// record fails the job.
    pub fn dead_letters(mut self, dlq: DeadLetterFactory) -> Self {
        self.common.dead_letters = Some(dlq);
        self
    }

    /// The statement timeout of the sink's sessions (default 30 s); a statement that runs
    /// longer fails and is retried.
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.common.statement_timeout = timeout;
        self
    }

    /// One sink instance per subtask, for `Stream::sink`.
    pub fn make(self) -> impl Fn() -> ApplyOnceSink<T> + Send + Sync + 'static {
        move || ApplyOnceSink {
            config: self.clone(),
            open: None,
        }
    }
}

/// One subtask of an [`ApplyOnce`] sink.
pub struct ApplyOnceSink<T> {
    config: ApplyOnce<T>,
    open: Option<Open>,
}

struct Open {
    store: Store,
    delivery: Delivery,
    name: String,
    applied: Counter,
    suppressed: Counter,
    conflicts: Counter,
    key_errors: Counter,
    takeovers: Counter,
    stop_cleanup: Option<mpsc::Sender<()>>,
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(stop) = self.stop_cleanup.take() {
            let _ = stop.send(());
        }
    }
}

/// SHA-256 of the record's JSON form, in hex: the payload hash of the APPLY protocol.
pub(crate) fn payload_hash<T: Serialize>(record: &T) -> Result<String> {
    let json = serde_json::to_vec(record)
        .map_err(|e| Error::Codec(format!("record to JSON for its payload hash: {e}")))?;
    let digest = Sha256::digest(&json);
    Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
}

impl<T: Serialize + 'static> SinkFunction<T> for ApplyOnceSink<T> {
    fn open(&mut self, ctx: &SinkContext) -> Result<()> {
        let c = &self.config;
        let bad = |m: String| Error::Config(format!("apply-once sink '{}': {m}", ctx.name));
        let Some(_) = &c.effect else {
            return Err(bad(
                "no effect: set one with .effect(...) or .effect_sql(...)".into(),
            ));
        };
        if c.handler.is_empty() {
            return Err(bad("the handler name is empty".into()));
        }
        let store = Store::new(&c.table, c.lease).map_err(bad)?;
        if c.retention.is_zero() {
            return Err(bad("the retention must be longer than zero".into()));
        }
        let mut delivery = Delivery::open(&c.common, &c.handler, ctx)?;
        let client = delivery
            .client()
            .map_err(|e| bad(format!("connection lost: {}", describe(&e))))?;
        store.ensure_schema(client).map_err(|e| {
            bad(format!(
                "cannot create the table '{}': {}",
                c.table,
                describe(&e)
            ))
        })?;
        let subtask = ctx.subtask.to_string();
        let l = [
            ("operator", ctx.name.as_str()),
            ("subtask", subtask.as_str()),
        ];
        let stop_cleanup = if ctx.subtask == 0 {
            Some(start_cleanup(c, &store, &ctx.name)?)
        } else {
            None
        };
        self.open = Some(Open {
            store,
            delivery,
            name: ctx.name.clone(),
            applied: metrics::counter(
                "apply_once_applied_total",
                "Records whose effect an apply-once sink committed.",
                &l,
            ),
            suppressed: metrics::counter(
                "duplicates_suppressed_total",
                "Records dropped because their idempotency key was already applied.",
                &l,
            ),
            conflicts: metrics::counter(
                "idempotency_key_conflicts_total",
                "Applies that found their key being applied concurrently (answered at once, then retried).",
                &l,
            ),
            key_errors: metrics::counter(
                "idempotency_errors_total",
                "Records whose idempotency key was used before with a different payload.",
                &l,
            ),
            takeovers: metrics::counter(
                "apply_once_lease_takeovers_total",
                "IN_PROGRESS keys taken over after their lease expired.",
                &l,
            ),
            stop_cleanup,
        });
        Ok(())
    }

    fn invoke(&mut self, record: T, _ts: Timestamp) -> Result<()> {
        let open = self
            .open
            .as_mut()
            .ok_or_else(|| Error::User("apply-once sink used before open".into()))?;
        let effect = self.config.effect.as_ref().expect("checked in open");
        // The key and the hash are made once, above the retry loop.
        let key = (self.config.key)(&record);
        let hash = payload_hash(&record)?;
        let handler = self.config.handler.as_str();
        let (store, conflicts) = (&open.store, &open.conflicts);
        let result = open.delivery.run(
            &mut |client, _attempt| {
                let r = store.apply(client, handler, &key, &hash, &mut |tx| effect(tx, &record));
                if matches!(r, Err(ApplyError::Conflict)) {
                    conflicts.inc();
                }
                r
            },
            ApplyError::Db,
            classify_apply,
        );
        match result {
            Ok(Applied::Fresh(_)) => open.applied.inc(),
            Ok(Applied::TakenOver(_)) => {
                open.applied.inc();
                open.takeovers.inc();
                tracing::info!(handler = %handler, key = %key, "took over an expired lease");
            }
            Ok(Applied::Duplicate(_)) => {
                open.suppressed.inc();
                tracing::debug!(handler = %handler, key = %key, "duplicate suppressed: key already applied");
            }
            Err(failed) => {
                if matches!(failed.error, ApplyError::KeyReuse { .. }) {
                    open.key_errors.inc();
                }
                let payload = || serde_json::to_value(&record).unwrap_or(Value::Null);
                match open.delivery.give_up(failed, &key, payload)? {
                    Undelivered::DeadLettered | Undelivered::Fenced => {}
                    Undelivered::Failed(f) => {
                        return Err(undelivered_error(&open.name, &key, &f));
                    }
                }
            }
        }
        Ok(())
    }

    fn snapshot(&mut self, _checkpoint: CheckpointId) -> Result<Option<(Vec<u8>, String)>> {
        if let Some(open) = self.open.as_mut() {
            open.delivery.flush()?;
        }
        Ok(None)
    }

    fn finish(&mut self) -> Result<()> {
        if let Some(open) = self.open.as_mut() {
            open.delivery.flush()?;
        }
        Ok(())
    }
}

/// Subtask 0's cleanup thread: every interval, deletes the handler's keys older than the
/// retention and publishes the table's size and oldest key age. Stops when the sink goes.
fn start_cleanup<T>(c: &ApplyOnce<T>, store: &Store, name: &str) -> Result<mpsc::Sender<()>> {
    let (tx, rx) = mpsc::channel::<()>();
    let l = [("operator", name), ("handler", c.handler.as_str())];
    let keys = metrics::gauge(
        "apply_once_keys",
        "Idempotency keys an apply-once handler holds (within the retention window).",
        &l,
    );
    let oldest = metrics::float_gauge(
        "apply_once_oldest_key_age_seconds",
        "Age of the oldest idempotency key an apply-once handler holds.",
        &l,
    );
    let deleted = metrics::counter(
        "apply_once_keys_deleted_total",
        "Idempotency keys deleted by the cleanup task after the retention window.",
        &l,
    );
    let (url, st, ct) = (
        c.common.url.clone(),
        c.common.statement_timeout,
        c.common.connect_timeout,
    );
    let (store, handler, retention, every) = (
        store.clone(),
        c.handler.clone(),
        c.retention,
        c.cleanup_interval,
    );
    std::thread::Builder::new()
        .name(format!("{name}-cleanup"))
        .spawn(move || {
            let mut client = None;
            loop {
                let round = (|| -> std::result::Result<(), postgres::Error> {
                    if client
                        .as_ref()
                        .is_none_or(|c: &postgres::Client| c.is_closed())
                    {
                        client = Some(connect(&url, st, ct)?);
                    }
                    let cl = client.as_mut().expect("connected");
                    let n = store.cleanup(cl, &handler, retention, 10_000)?;
                    deleted.add(n);
                    let (count, age) = store.size(cl, &handler)?;
                    keys.set(count);
                    oldest.set(age);
                    Ok(())
                })();
                if let Err(e) = round {
                    tracing::warn!(handler = %handler, url = %redact(&url), error = %describe(&e),
                        "apply-once cleanup failed; trying again next round");
                }
                match rx.recv_timeout(every) {
                    Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    _ => return,
                }
            }
        })
        .map_err(|e| Error::io("apply-once cleanup thread", e))?;
    Ok(tx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_hash_is_sha256_of_the_json() {
        // `printf '[1,"a"]' | sha256sum`
        assert_eq!(
            payload_hash(&(1, "a")).unwrap(),
            "2010945388e2de98f5651051478912aa4ff38bb13a2cdb1a2c257bb97fbf98ff"
        );
        assert_ne!(
            payload_hash(&(1, "b")).unwrap(),
            payload_hash(&(1, "a")).unwrap()
        );
    }
}
