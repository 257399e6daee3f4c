//! The APPLY protocol over a `processed_messages` table, independent of any job.
//!
//! ```text
//! APPLY(handler, key, payload):
//!   BEGIN
//!     try to take the key's advisory lock            -- held: a concurrent apply → Conflict
//!     INSERT (handler, key, IN_PROGRESS, hash, lease) ON CONFLICT DO NOTHING
//!     not inserted → SELECT ... FOR UPDATE NOWAIT:
//!        other payload hash      → KeyReuse (a caller error, never retried)
//!        DONE                    → the stored response (a duplicate; nothing runs)
//!        IN_PROGRESS, lease live → Conflict (someone else is applying it)
//!        IN_PROGRESS, lease gone → take it over (new lease) and go on
//!     response := EFFECT(transaction)                -- the business effect, same transaction
//!     UPDATE SET state = DONE, response, lease_until = NULL
//!   COMMIT
//! ```
//!
//! The key row and the effect commit together or not at all, so a crash at any point
//! leaves either both or neither. A concurrent apply of the same key answers `Conflict`
//! at once instead of queueing behind the lock. Rows in `IN_PROGRESS` are never committed
//! by this protocol; they come from services that mark a key in one transaction and run
//! an effect outside the database (the two-step variant), and their lease lets the key be
//! taken over when such a worker dies.

use postgres::{Client, Transaction};
use serde_json::Value;
use std::time::Duration;

/// The error a user's effect returns: a database error (classified by its SQLSTATE) or any
/// other error (not retried).
pub type EffectError = Box<dyn std::error::Error + Send + Sync>;

/// Where the protocol keeps its keys, and for how long an `IN_PROGRESS` row is leased.
#[derive(Debug, Clone)]
pub struct Store {
    table: String,
    lease: Duration,
}

/// What [`Store::apply`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// The effect ran and committed; its response.
    Fresh(Value),
    /// The key was already DONE: nothing ran; the stored response.
    Duplicate(Value),
    /// An `IN_PROGRESS` row whose lease had expired was taken over, and the effect ran.
    TakenOver(Value),
}

impl Applied {
    /// The response, new or stored.
    pub fn response(&self) -> &Value {
        match self {
            Applied::Fresh(v) | Applied::Duplicate(v) | Applied::TakenOver(v) => v,
        }
    }
}

/// Why [`Store::apply`] did not apply.
#[derive(Debug)]
pub enum ApplyError {
    /// Another transaction is applying this key right now (or holds its live lease).
    Conflict,
    /// The key was used before with a different payload: a caller error.
    KeyReuse {
        /// The key.
        key: String,
    },
    /// The effect failed; the transaction was rolled back.
    Effect(EffectError),
    /// The database failed around the protocol's own statements.
    Db(postgres::Error),
}

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApplyError::Conflict => write!(f, "idempotency key conflict: being applied right now"),
            ApplyError::KeyReuse { key } => write!(
                f,
                "idempotency_error: key '{key}' was already used with a different payload"
            ),
            ApplyError::Effect(e) => write!(f, "effect failed: {}", crate::describe(e.as_ref())),
            ApplyError::Db(e) => write!(f, "database error: {}", crate::describe(e)),
        }
    }
}

impl std::error::Error for ApplyError {}

impl From<postgres::Error> for ApplyError {
    fn from(e: postgres::Error) -> Self {
        // A row lock we asked for with NOWAIT is held by someone else: a conflict.
        if e.code() == Some(&postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
            ApplyError::Conflict
        } else {
            ApplyError::Db(e)
        }
    }
}

/// Checks that `name` is a plain SQL identifier (letters, digits, `_`, optionally one
/// `schema.` prefix), so it can be put into statements.
pub(crate) fn check_identifier(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.split('.').count() <= 2
        && name.split('.').all(|p| {
            !p.is_empty()
                && p.chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "'{name}' is not a plain SQL table name (letters, digits and '_', optionally schema.table)"
        ))
    }
}

impl Store {
    /// A store over `table` (`processed_messages` in the protocol's terms) with the given
    /// lease for `IN_PROGRESS` rows.
    ///
    /// ```
    /// let s = weir_postgres::Store::new("processed_messages", std::time::Duration::from_secs(60)).unwrap();
    /// assert_eq!(s.table(), "processed_messages");
    /// assert!(weir_postgres::Store::new("x; DROP TABLE y", std::time::Duration::from_secs(1)).is_err());
    /// ```
    pub fn new(table: &str, lease: Duration) -> Result<Self, String> {
        check_identifier(table)?;
        if lease.is_zero() {
            return Err("the lease must be longer than zero".into());
        }
        Ok(Store {
            table: table.to_string(),
            lease,
        })
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Creates the table and its `created_at` index if they do not exist. Safe to call
    /// from several processes at once (serialised by an advisory lock).
    pub fn ensure_schema(&self, client: &mut Client) -> Result<(), postgres::Error> {
        let t = &self.table;
        let index = format!("{}_created_at_idx", t.replace('.', "_"));
        let mut tx = client.transaction()?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            &[&format!("weir schema {t}")],
        )?;
        tx.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                handler         TEXT        NOT NULL,
                idempotency_key TEXT        NOT NULL,
                state           TEXT        NOT NULL CHECK (state IN ('IN_PROGRESS', 'DONE', 'FAILED')),
                payload_hash    TEXT,
                response        JSONB,
                lease_until     TIMESTAMPTZ,
                created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
                PRIMARY KEY (handler, idempotency_key)
            );
            CREATE INDEX IF NOT EXISTS {index} ON {t} (created_at);"
        ))?;
        tx.commit()
    }

    /// Applies `effect` for (`handler`, `key`) at most once; see the module docs.
    pub fn apply(
        &self,
        client: &mut Client,
        handler: &str,
        key: &str,
        payload_hash: &str,
        effect: &mut dyn FnMut(&mut Transaction<'_>) -> Result<Value, EffectError>,
    ) -> Result<Applied, ApplyError> {
        let t = &self.table;
        let lease_ms = self.lease.as_millis().min(i64::MAX as u128) as i64;
        let mut tx = client.transaction()?;
        let locked: bool = tx
            .query_one(
                "SELECT pg_try_advisory_xact_lock(hashtextextended(length($1) || ':' || $1 || $2, 0))",
                &[&handler, &key],
            )?
            .get(0);
        if !locked {
            return Err(ApplyError::Conflict);
        }
        let inserted = tx.execute(
            &format!(
                "INSERT INTO {t} (handler, idempotency_key, state, payload_hash, lease_until)
                 VALUES ($1, $2, 'IN_PROGRESS', $3, now() + $4 * interval '1 millisecond')
                 ON CONFLICT (handler, idempotency_key) DO NOTHING"
            ),
            &[&handler, &key, &payload_hash, &(lease_ms as f64)],
        )?;
        let mut taken_over = false;
        if inserted == 0 {
            let row = tx.query_one(
                &format!(
                    "SELECT state, payload_hash, response, coalesce(lease_until < now(), true)
                     FROM {t} WHERE handler = $1 AND idempotency_key = $2 FOR UPDATE NOWAIT"
                ),
                &[&handler, &key],
            )?;
            let state: String = row.get(0);
            let stored_hash: Option<String> = row.get(1);
            let response: Option<Value> = row.get(2);
            let expired: bool = row.get(3);
            if stored_hash.as_deref().is_some_and(|h| h != payload_hash) {
                return Err(ApplyError::KeyReuse {
                    key: key.to_string(),
                });
            }
            match state.as_str() {
                "DONE" => return Ok(Applied::Duplicate(response.unwrap_or(Value::Null))),
                "IN_PROGRESS" if !expired => return Err(ApplyError::Conflict),
                _ => {
                    tx.execute(
                        &format!(
                            "UPDATE {t} SET state = 'IN_PROGRESS', payload_hash = $3,
                                 lease_until = now() + $4 * interval '1 millisecond'
                             WHERE handler = $1 AND idempotency_key = $2"
                        ),
                        &[&handler, &key, &payload_hash, &(lease_ms as f64)],
                    )?;
                    taken_over = true;
                }
            }
        }
        let response = effect(&mut tx).map_err(ApplyError::Effect)?;
        tx.execute(
            &format!(
                "UPDATE {t} SET state = 'DONE', response = $3, lease_until = NULL
                 WHERE handler = $1 AND idempotency_key = $2"
            ),
            &[&handler, &key, &response],
        )?;
        weir_core::failpoint::hit("postgres.before_commit");
        tx.commit()?;
        weir_core::failpoint::hit("postgres.after_commit");
        Ok(if taken_over {
            Applied::TakenOver(response)
        } else {
            Applied::Fresh(response)
        })
    }

    /// Deletes the handler's keys created more than `retention` ago, in batches of at most
    /// `batch` rows; returns how many it deleted.
    pub fn cleanup(
        &self,
        client: &mut Client,
        handler: &str,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, postgres::Error> {
        let t = &self.table;
        let ms = retention.as_millis().min(i64::MAX as u128) as f64;
        let mut total = 0;
        loop {
            let n = client.execute(
                &format!(
                    "DELETE FROM {t} WHERE ctid IN (
                        SELECT ctid FROM {t}
                        WHERE handler = $1 AND created_at < now() - $2 * interval '1 millisecond'
                        LIMIT $3)"
                ),
                &[&handler, &ms, &batch],
            )?;
            total += n;
            if (n as i64) < batch {
                return Ok(total);
            }
        }
    }

    /// How many keys the handler holds, and the age of the oldest in seconds (0 if none).
    pub fn size(&self, client: &mut Client, handler: &str) -> Result<(i64, f64), postgres::Error> {
        let row = client.query_one(
            &format!(
                "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at))::float8, 0)
                 FROM {} WHERE handler = $1",
                self.table
            ),
            &[&handler],
        )?;
        Ok((row.get(0), row.get(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked() {
        assert!(check_identifier("processed_messages").is_ok());
        assert!(check_identifier("app.processed_messages").is_ok());
        assert!(check_identifier("_t1").is_ok());
        for bad in ["", "1t", "a.b.c", "t;drop", "t x", "a.", "\"t\""] {
            assert!(check_identifier(bad).is_err(), "{bad}");
        }
    }
}
