//! The upsert sink's configuration: a table, the columns a changelog's keys and values map
//! to, and the guarantee. The sink itself is in `upsert_sink`, the SQL in `upsert_table`.

use crate::delivery::Common;
use crate::sink::SqlParams;
use crate::upsert_sink::UpsertSink;
use crate::upsert_table::TableSpec;
use std::sync::Arc;
use std::time::Duration;
use weir_core::retry::RetryPolicy;

pub(crate) type ParamsFn<T> = Arc<dyn Fn(&T) -> SqlParams + Send + Sync>;

/// What an [`Upserts`] sink promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpsertGuarantee {
    /// The changes between two checkpoints are written in one transaction when the later
    /// checkpoint completes, through the APPLY protocol (the transaction also marks the
    /// batch's idempotency key in `processed_messages`): every batch is applied exactly
    /// once, even when a restore replays it, and readers only ever see the table as of a
    /// completed checkpoint. The default.
    ExactlyOnce,
    /// The changes are written as they come (in batches, at every checkpoint barrier and at
    /// the end of input): rows appear sooner, and after a failure the changes since the last
    /// checkpoint are written again. Upserts and deletes by key are idempotent, so the table
    /// ends the same; in between, a reader may see a row go back to an older value while
    /// the replay catches up.
    AtLeastOnce,
}

/// A PostgreSQL sink for a changelog (`Stream<Change<K, V>>`): an insert or update of a key
/// becomes `INSERT ... ON CONFLICT (key columns) DO UPDATE SET value columns = ...`, a delete
/// becomes `DELETE ... WHERE (key columns) = ...`. Write it with
/// [`Stream::sink_changes`](weir_core::dsl::Stream::sink_changes), which sends every change
/// of a key to one sink subtask, in order.
///
/// You map a key to the key columns and a value to the value columns with closures that
/// return the statement's parameters, in column order; the table needs a primary key or a
/// unique constraint on exactly the key columns. The sink checks the table, the columns and
/// the constraint when the job starts, and says what is missing.
///
/// **Several changes of one key between two checkpoints collapse to the last**: the table
/// gets the key's latest value (or loses the row), never the intermediate ones. This is
/// what makes the sink cheap — one row written per key and checkpoint — and it is all a
/// table can show anyway.
///
/// Exactly-once (the default, [`UpsertGuarantee::ExactlyOnce`]): the collapsed changes of a
/// checkpoint are kept in the checkpoint and written in one transaction when it completes;
/// the same transaction marks the batch's idempotency key (operator, subtask, checkpoint,
/// run) in the `processed_messages` table of the APPLY protocol ([`Store`](crate::Store)).
/// A restore writes the batches of its checkpoint again; their keys are DONE if they were
/// written before, and nothing happens twice. Without checkpoints, everything is written
/// in one transaction at the end of input. At-least-once
/// ([`UpsertGuarantee::AtLeastOnce`]) writes sooner; see there.
///
/// Failures (a lost connection, a serialization failure) are retried under the
/// [`RetryPolicy`]; a batch that still fails, or fails for a reason a retry cannot fix (a
/// constraint violation, a value of the wrong type), fails the job with the table and the
/// cause.
///
/// ```no_run
/// use weir::prelude::*;
/// use weir_postgres::Upserts;
///
/// // CREATE TABLE totals (account TEXT PRIMARY KEY, total BIGINT NOT NULL, updates BIGINT NOT NULL)
/// let totals = Upserts::new("postgres://weir@127.0.0.1:15432/weir", "totals")
///     .key_columns(&["account"], |account: &String| vec![Box::new(account.clone())])
///     .value_columns(&["total", "updates"], |(total, updates): &(i64, i64)| {
///         vec![Box::new(*total), Box::new(*updates)]
///     });
///
/// let env = Env::new();
/// env.from_iter(vec![
///     Change::Insert { key: "alice".to_string(), value: (10, 1) },
///     Change::Update { key: "alice".to_string(), old: (10, 1), new: (25, 2) },
///     Change::Insert { key: "bob".to_string(), value: (5, 1) },
///     Change::Delete { key: "bob".to_string(), old: (5, 1) },
/// ])
/// .sink_changes("totals", totals.make());
/// env.execute("totals").unwrap();
/// // totals now holds one row: ('alice', 25, 2).
/// ```
pub struct Upserts<K, V> {
    pub(crate) common: Common,
    pub(crate) spec: TableSpec,
    pub(crate) key: Option<ParamsFn<K>>,
    pub(crate) value: Option<ParamsFn<V>>,
    pub(crate) guarantee: UpsertGuarantee,
    pub(crate) keys_table: String,
    pub(crate) retention: Duration,
    pub(crate) batch_size: usize,
    pub(crate) flush_interval: Duration,
}

impl<K, V> Clone for Upserts<K, V> {
    fn clone(&self) -> Self {
        Upserts {
            common: self.common.clone(),
            spec: self.spec.clone(),
            key: self.key.clone(),
            value: self.value.clone(),
            guarantee: self.guarantee,
            keys_table: self.keys_table.clone(),
            retention: self.retention,
            batch_size: self.batch_size,
            flush_interval: self.flush_interval,
        }
    }
}

impl<K, V> Upserts<K, V> {
    /// A sink writing the changelog into `table` (`name` or `schema.name`) of the database at
    /// `url`. Name the columns with [`key_columns`](Self::key_columns) and
    /// [`value_columns`](Self::value_columns).
    ///
    /// Defaults: exactly-once, keys of the APPLY protocol in `processed_messages` kept for 7
    /// days, [`RetryPolicy::default`], statement timeout 30 s; at-least-once batches of at
    /// most 5000 keys, written at least every second while records arrive.
    ///
    /// ```
    /// use weir_postgres::{UpsertGuarantee, Upserts};
    /// let sink = Upserts::new("postgres://weir@127.0.0.1/weir", "shop.prices")
    ///     .key_columns(&["sku"], |sku: &String| vec![Box::new(sku.clone())])
    ///     .value_columns(&["cents"], |cents: &i64| vec![Box::new(*cents)])
    ///     .guarantee(UpsertGuarantee::AtLeastOnce);
    /// let _make = sink.make(); // for changes.sink_changes("prices", _make)
    /// ```
    pub fn new(url: &str, table: &str) -> Self {
        Upserts {
            common: Common::new(url),
            spec: TableSpec {
                table: table.to_string(),
                key_columns: Vec::new(),
                value_columns: Vec::new(),
            },
            key: None,
            value: None,
            guarantee: UpsertGuarantee::ExactlyOnce,
            keys_table: "processed_messages".to_string(),
            retention: Duration::from_secs(7 * 24 * 3600),
            batch_size: 5000,
            flush_interval: Duration::from_secs(1),
        }
    }

    /// The key columns (the table's primary key or a unique constraint on exactly them),
    /// and how a key becomes their values, in the same order.
    pub fn key_columns(
        mut self,
        columns: &[&str],
        params: impl Fn(&K) -> SqlParams + Send + Sync + 'static,
    ) -> Self {
        self.spec.key_columns = columns.iter().map(|c| c.to_string()).collect();
        self.key = Some(Arc::new(params));
        self
    }

    /// The value columns (set on insert and update), and how a value becomes their values,
    /// in the same order. None: a table of keys only (`ON CONFLICT DO NOTHING`).
    pub fn value_columns(
        mut self,
        columns: &[&str],
        params: impl Fn(&V) -> SqlParams + Send + Sync + 'static,
    ) -> Self {
        self.spec.value_columns = columns.iter().map(|c| c.to_string()).collect();
        self.value = Some(Arc::new(params));
        self
    }

    /// Exactly-once (the default) or at-least-once; see [`UpsertGuarantee`].
    pub fn guarantee(mut self, guarantee: UpsertGuarantee) -> Self {
        self.guarantee = guarantee;
        self
    }

    /// The table of the APPLY protocol's keys (default `processed_messages`, created if
    /// missing; exactly-once only).
    pub fn keys_table(mut self, table: &str) -> Self {
        self.keys_table = table.to_string();
        self
    }

    /// How long the batches' keys are kept (default 7 days): a restore from a checkpoint
    /// older than this would write that checkpoint's last batch again.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// At-least-once: the most keys buffered before they are written (default 5000).
    pub fn batch_size(mut self, keys: usize) -> Self {
        self.batch_size = keys.max(1);
        self
    }

    /// At-least-once: the longest a change waits in the buffer while records keep arriving
    /// (default 1 s); checkpoint barriers and the end of input write it too.
    pub fn flush_interval(mut self, every: Duration) -> Self {
        self.flush_interval = every;
        self
    }

    /// The retry policy for failed writes.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.common.retry = policy;
        self
    }

    /// The statement timeout of the sink's sessions (default 30 s).
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.common.statement_timeout = timeout;
        self
    }

    /// The table written.
    pub fn table(&self) -> &str {
        &self.spec.table
    }

    /// One sink instance per subtask, for
    /// [`Stream::sink_changes`](weir_core::dsl::Stream::sink_changes).
    pub fn make(self) -> impl Fn() -> UpsertSink<K, V> + Send + Sync + 'static
    where
        K: 'static,
        V: 'static,
    {
        move || UpsertSink::new(self.clone())
    }
}
