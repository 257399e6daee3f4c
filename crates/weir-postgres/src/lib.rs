//! weir's PostgreSQL sinks: effects outside weir's own state, applied once.
//!
//! Checkpoints make weir's state exactly-once, and Kafka transactions extend that to
//! Kafka. A database is outside both: after a crash weir replays records from the last
//! checkpoint, and a plain database sink would apply them again. This crate closes that
//! gap the way the effect's owner would:
//!
//! - [`ApplyOnce`]: the APPLY protocol — the record's idempotency key and the business
//!   effect commit in **one** database transaction (a `processed_messages` table keyed by
//!   handler and key); a replayed or duplicated record finds its key DONE and gets the stored
//!   response instead of a second effect; the same key with a different payload is a caller
//!   error; a concurrent apply of one key answers "conflict" at once; expired leases are taken
//!   over; a cleanup task deletes keys older than the retention window. See [`Store`] for the
//!   protocol itself.
//! - [`FencedWrites`]: writes applied only when their fencing token is newer than the
//!   stored one (`... WHERE fence < $new`); a stale token is counted and given up, never
//!   retried.
//! - [`Upserts`]: a table kept up to date from a changelog (`Stream<Change<K, V>>`):
//!   `INSERT ... ON CONFLICT DO UPDATE` and `DELETE` by key, exactly once through the APPLY
//!   protocol (one transaction per checkpoint and subtask, written when the checkpoint
//!   completes) or at-least-once.
//!
//! Both retry transient failures with weir's [`RetryPolicy`](weir_core::retry::RetryPolicy)
//! (exponential backoff with full jitter, an attempt limit, a retry budget) and can set
//! records they give up on aside in a dead-letter queue ([`weir_core::dlq`]) with their
//! idempotency key, so the job goes on.
//!
//! Run a development server with `scripts/postgres.sh start` (it prints the URL); the
//! `payments_apply_once` example shows a whole job.
//!
//! ```no_run
//! use weir::prelude::*;
//! use weir_postgres::ApplyOnce;
//!
//! #[derive(Clone, serde::Serialize, serde::Deserialize)]
//! struct Payment { payment_id: String, order_id: i64, amount: i64 }
//!
//! let env = Env::new();
//! let payments = env.from_iter(vec![
//!     Payment { payment_id: "p-1".into(), order_id: 1, amount: 500 },
//!     Payment { payment_id: "p-1".into(), order_id: 1, amount: 500 }, // a duplicate
//! ]);
//! let pay = ApplyOnce::new("postgres://weir@127.0.0.1:15432/weir", "payments", |p: &Payment| {
//!     p.payment_id.clone()
//! })
//! .effect_sql(
//!     "UPDATE orders SET status = 'paid', paid = $2 WHERE id = $1 AND status = 'pending'",
//!     |p: &Payment| vec![Box::new(p.order_id), Box::new(p.amount)],
//! );
//! payments.sink("pay", pay.make());
//! env.execute("payments").unwrap();
//! ```

mod apply;
mod delivery;
mod fenced;
mod sink;
mod upsert;
mod upsert_sink;
mod upsert_table;

pub use apply::{Applied, ApplyError, EffectError, Store};
pub use fenced::{FencedSink, FencedWrites};
pub use postgres;
pub use sink::{ApplyOnce, ApplyOnceSink, SqlParams};
pub use upsert::{UpsertGuarantee, Upserts};
pub use upsert_sink::UpsertSink;

use postgres::error::SqlState;
use weir_core::retry::Outcome;

/// The message of an error and of its sources, joined (postgres errors keep the server's
/// message in their source).
pub(crate) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// Whether a PostgreSQL error is worth retrying: connection failures, serialization
/// failures, deadlocks, a lock not available, the server shutting down, lack of resources
/// and statement timeouts are; constraint violations, bad data and SQL errors are not.
///
/// ```
/// // (Database errors come from a server; see the crate's tests for real ones.)
/// use weir_core::retry::Outcome;
/// assert!(matches!(weir_postgres::classify_sqlstate(Some("40001")), Outcome::Retryable { .. }));
/// assert!(matches!(weir_postgres::classify_sqlstate(Some("23514")), Outcome::Permanent));
/// assert!(matches!(weir_postgres::classify_sqlstate(None), Outcome::Retryable { .. }));
/// ```
pub fn classify_sqlstate(code: Option<&str>) -> Outcome {
    let retryable = match code {
        // No SQLSTATE: the connection broke or timed out before the server answered.
        None => true,
        Some(c) => {
            c.starts_with("08") // connection exception
                || c.starts_with("53") // insufficient resources
                || c == SqlState::T_R_SERIALIZATION_FAILURE.code()
                || c == SqlState::T_R_DEADLOCK_DETECTED.code()
                || c == SqlState::LOCK_NOT_AVAILABLE.code()
                || c == SqlState::QUERY_CANCELED.code() // statement_timeout
                || c == SqlState::ADMIN_SHUTDOWN.code()
                || c == SqlState::CRASH_SHUTDOWN.code()
                || c == SqlState::CANNOT_CONNECT_NOW.code()
        }
    };
    if retryable {
        Outcome::Retryable { retry_after: None }
    } else {
        Outcome::Permanent
    }
}

/// [`classify_sqlstate`] for a `postgres` error.
pub fn classify_pg(e: &postgres::Error) -> Outcome {
    if e.is_closed() {
        return Outcome::Retryable { retry_after: None };
    }
    classify_sqlstate(e.code().map(|c| c.code()))
}

/// How the sinks treat an [`ApplyError`]: conflicts are retried (the other apply will
/// finish), key reuse never is, database and effect errors by their SQLSTATE; an effect's
/// own non-database error is not retried.
pub fn classify_apply(e: &ApplyError) -> Outcome {
    match e {
        ApplyError::Conflict => Outcome::Retryable { retry_after: None },
        ApplyError::KeyReuse { .. } => Outcome::Permanent,
        ApplyError::Db(e) => classify_pg(e),
        ApplyError::Effect(e) => match e.downcast_ref::<postgres::Error>() {
            Some(pg) => classify_pg(pg),
            None => Outcome::Permanent,
        },
    }
}

/// The URL with any password replaced by `***`, for messages.
pub(crate) fn redact(url: &str) -> String {
    // postgres://user:password@host/db → postgres://user:***@host/db
    if let Some((scheme, rest)) = url.split_once("://")
        && let Some((auth, host)) = rest.split_once('@')
        && let Some((user, _)) = auth.split_once(':')
    {
        return format!("{scheme}://{user}:***@{host}");
    }
    url.to_string()
}

/// Connects to `url` with the given statement timeout, with a message a user can act on.
pub(crate) fn connect(
    url: &str,
    statement_timeout: std::time::Duration,
    connect_timeout: std::time::Duration,
) -> Result<postgres::Client, postgres::Error> {
    let mut config: postgres::Config = url.parse()?;
    config.connect_timeout(connect_timeout);
    let mut client = config.connect(postgres::NoTls)?;
    client.batch_execute(&format!(
        "SET statement_timeout = {}",
        statement_timeout.as_millis().max(1)
    ))?;
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("host=h user=u"), "host=h user=u");
    }

    #[test]
    fn sqlstates_are_classified() {
        for c in [
            "08006", "08001", "40001", "40P01", "55P03", "57014", "57P01", "53300",
        ] {
            assert!(
                matches!(classify_sqlstate(Some(c)), Outcome::Retryable { .. }),
                "{c}"
            );
        }
        for c in ["23505", "23514", "22P02", "42P01", "42601", "P0001"] {
            assert!(
                matches!(classify_sqlstate(Some(c)), Outcome::Permanent),
                "{c}"
            );
        }
        assert!(matches!(
            classify_apply(&ApplyError::Conflict),
            Outcome::Retryable { .. }
        ));
        assert!(matches!(
            classify_apply(&ApplyError::KeyReuse { key: "k".into() }),
            Outcome::Permanent
        ));
        assert!(matches!(
            classify_apply(&ApplyError::Effect("business rule".into())),
            Outcome::Permanent
        ));
    }
}

/// The snippets of docs/edges.md, compiled as doc tests (they need a server, so they are
/// `no_run`).
#[cfg(doctest)]
#[doc = include_str!("../../../docs/edges.md")]
pub struct EdgesDoc;
