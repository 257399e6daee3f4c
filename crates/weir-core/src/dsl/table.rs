//! [`Table`]: the latest value per key, and its changes as a stream (Kafka Streams'
//! `KTable`). Built from a keyed stream ([`KeyedStream::to_table`]), from upserts
//! ([`Table::from_upserts`]) or from a changelog ([`Table::from_changelog`]); joined with
//! a stream ([`KeyedStream::join_table`]) and aggregated by a new key
//! ([`Table::group_by`], in `table_group`).
//!
//! This module wires operators only; the functions they run live in `crate::ops::table`.

use super::{KeyedStream, Stream};
use crate::changelog::Change;
use crate::data::{Data, Key};
use crate::ops::table::{JoinKind, Joiner, RowOf, TableJoinFn, TableRow, new_value};
use std::sync::Arc;

/// A table: the latest value of type `V` per key of type `K`, kept in keyed state (heap
/// or RocksDB, checkpointed and rescaled by key group like any keyed state). What a table
/// offers downstream is its changelog, [`Table::changes`]: `Insert` when a key gets its
/// first value, `Update` with the old and the new value when the value is replaced, and
/// `Delete` with the old value when the row goes away. Every replacement is an `Update`,
/// even one with an equal value (as in Kafka Streams and Flink).
///
/// ```
/// use weir_core::prelude::*;
///
/// let p = Pipeline::new();
/// let prices: Table<String, i64> = p
///     .from_collection(vec![("apple".to_string(), 3i64), ("pear".into(), 5), ("apple".into(), 4)])
///     .key_by(|(fruit, _)| fruit.clone())
///     .to_table()
///     .map_values(|(_, price)| price);
/// // apple: Insert 3, then Update 3 -> 4; pear: Insert 5.
/// let _changes = prices.changes().collect();
/// ```
pub struct Table<K, V> {
    changes: Stream<Change<K, V>>,
}

impl<K, V> Clone for Table<K, V> {
    fn clone(&self) -> Self {
        Table {
            changes: self.changes.clone(),
        }
    }
}

/// The keyed operator that keeps one row per key of `keyed`, its value taken from each
/// record by `row_of`.
fn table_of<K: Key, I: Data, V: Data>(
    keyed: &KeyedStream<K, I>,
    row_of: RowOf<I, V>,
) -> Table<K, V> {
    let changes = keyed.process_with_state(move |state| {
        Ok(TableRow {
            row: state.value_state("row")?,
            row_of,
        })
    });
    // Built on a process function, but a user cannot emit to side outputs from it.
    changes.p.refuse_side_outputs(changes.node);
    Table::from_stream(changes.name("table"))
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// A table of the latest record per key: each record replaces its key's row. The
    /// table's [`Table::changes`] has one change per record (an `Insert` for the key's
    /// first record, an `Update` with the old and the new record after), with the
    /// record's timestamp. Rows are never deleted this way; use [`Table::from_upserts`]
    /// or [`Table::from_changelog`] for a stream that deletes.
    ///
    /// ```
    /// use weir_core::prelude::*;
    ///
    /// let p = Pipeline::new();
    /// let latest = p
    ///     .from_collection(vec![(1u32, "on".to_string()), (1, "off".into())])
    ///     .key_by(|(device, _)| *device)
    ///     .to_table();
    /// // Insert {1, (1, "on")}, then Update {1, (1, "on") -> (1, "off")}.
    /// let _changes = latest.changes().collect();
    /// ```
    pub fn to_table(&self) -> Table<K, T> {
        table_of(self, Some)
    }

    /// Joins each record with the row its key has in `table` at the moment the record is
    /// processed (Kafka Streams' stream–table join); pick [`TableJoin::inner`] or
    /// [`TableJoin::left`]. See [`TableJoin`].
    pub fn join_table<V: Data>(&self, table: &Table<K, V>) -> TableJoin<K, T, V> {
        TableJoin {
            stream: self.clone(),
            table: table.clone(),
        }
    }
}

impl<K, V> Table<K, V> {
    /// A table over `changes`, which must be consistent (each change's old value is the
    /// row's value before it): produced by a keyed operator that keeps the rows.
    pub(crate) fn from_stream(changes: Stream<Change<K, V>>) -> Self {
        Table { changes }
    }
}

impl<K: Key, V: Data> Table<K, V> {
    /// A table from upserts: `(key, Some(value))` sets the key's row, `(key, None)`
    /// deletes it (a tombstone; Kafka's compacted topics, a CDC feed). A tombstone for a
    /// key the table does not hold changes nothing and emits nothing.
    ///
    /// ```
    /// use weir_core::prelude::*;
    ///
    /// let p = Pipeline::new();
    /// let upserts = p.from_collection(vec![
    ///     ("eur".to_string(), Some(1.10)),
    ///     ("eur".to_string(), Some(1.12)),
    ///     ("eur".to_string(), None),
    /// ]);
    /// // Insert eur 1.10, Update eur 1.10 -> 1.12, Delete eur 1.12.
    /// let _changes = Table::from_upserts(&upserts).changes().collect();
    /// ```
    pub fn from_upserts(upserts: &Stream<(K, Option<V>)>) -> Table<K, V> {
        table_of(&upserts.key_by(|(k, _)| k.clone()), |(_, v)| v)
    }

    /// A table from a changelog (another table's changes, or a feed of [`Change`]s): each
    /// change sets or deletes its key's row. The table's own changes are recomputed from
    /// its rows, so they are consistent even if the input is not: an `Insert` for a key
    /// the table holds comes out as an `Update` with the row's actual old value, a
    /// `Delete` of an unknown key emits nothing.
    ///
    /// ```
    /// use weir_core::prelude::*;
    ///
    /// let p = Pipeline::new();
    /// let feed = p.from_collection(vec![
    ///     Change::Insert { key: 7u64, value: "ann".to_string() },
    ///     Change::Insert { key: 7u64, value: "anne".to_string() },
    /// ]);
    /// // Insert 7 "ann", then Update 7 "ann" -> "anne".
    /// let _changes = Table::from_changelog(&feed).changes().collect();
    /// ```
    pub fn from_changelog(changes: &Stream<Change<K, V>>) -> Table<K, V> {
        table_of(&changes.key_by(|c| c.key().clone()), new_value)
    }

    /// The table's changelog: one [`Change`] per change of a row, in the order the rows
    /// changed (per key), each with the timestamp of the record that changed it. Write it
    /// to a sink, or read it back into a table with [`Table::from_changelog`].
    ///
    /// ```
    /// use weir_core::prelude::*;
    ///
    /// let p = Pipeline::new();
    /// let table = p.from_collection(vec![(1u8, 'x')]).key_by(|r| r.0).to_table();
    /// let _lines = table
    ///     .changes()
    ///     .map(|c| match c {
    ///         Change::Insert { key, value } => format!("+{key} {value:?}"),
    ///         Change::Update { key, old, new } => format!("~{key} {old:?} -> {new:?}"),
    ///         Change::Delete { key, old } => format!("-{key} {old:?}"),
    ///     })
    ///     .collect();
    /// ```
    pub fn changes(&self) -> Stream<Change<K, V>> {
        self.changes.clone()
    }

    /// Transforms every value of the table (Kafka Streams' `mapValues`): a stateless map
    /// of its changes, old values included. `f` runs on old values again, so it must be
    /// deterministic.
    ///
    /// ```
    /// use weir_core::prelude::*;
    ///
    /// let p = Pipeline::new();
    /// let users = p
    ///     .from_collection(vec![(7u64, "Ann".to_string(), 31u32)])
    ///     .key_by(|(id, _, _)| *id)
    ///     .to_table();
    /// let names: Table<u64, String> = users.map_values(|(_, name, _)| name);
    /// let _changes = names.changes().collect();
    /// ```
    pub fn map_values<W: Data>(&self, f: impl Fn(V) -> W + Send + Sync + 'static) -> Table<K, W> {
        let changes = self
            .changes
            .map(move |c| match c {
                Change::Insert { key, value } => Change::Insert {
                    key,
                    value: f(value),
                },
                Change::Update { key, old, new } => Change::Update {
                    key,
                    old: f(old),
                    new: f(new),
                },
                Change::Delete { key, old } => Change::Delete { key, old: f(old) },
            })
            .name("map_values");
        Table { changes }
    }

    /// Sets the display name of the operator that keeps (or maps) the table.
    pub fn name(self, name: &str) -> Self {
        Table {
            changes: self.changes.name(name),
        }
    }

    /// Sets a stable id for the operator that keeps the table: its rows are matched by it
    /// on restore.
    pub fn uid(self, uid: &str) -> Self {
        Table {
            changes: self.changes.uid(uid),
        }
    }

    /// Sets the parallelism of the operator that keeps the table.
    ///
    /// # Panics
    /// When `parallelism` is 0.
    pub fn parallelism(self, parallelism: usize) -> Self {
        Table {
            changes: self.changes.parallelism(parallelism),
        }
    }
}

/// A stream joined with a table, waiting for its join function: [`TableJoin::inner`]
/// drops records whose key has no row, [`TableJoin::left`] keeps them (with `None`).
///
/// Each record is joined with the row its key has when the join operator processes the
/// record, and changes of the table emit nothing (Kafka Streams' KStream–KTable join):
/// a record that arrives before its row does not wait for it, and a row changed after a
/// record does not revise that record's result. Which of a record and a change arriving
/// at the same time goes first is the order they reach the operator, which a restart
/// can change. For a result that depends only on event time (each record with the
/// version of the row valid at its timestamp), use an event-time temporal join instead.
///
/// The join keeps its own copy of the table's rows (keyed state, checkpointed and
/// rescaled by key group like the table).
///
/// ```
/// use weir_core::prelude::*;
///
/// let p = Pipeline::new();
/// let names = p
///     .from_collection(vec![(1u32, "ann".to_string())])
///     .key_by(|(id, _)| *id)
///     .to_table()
///     .map_values(|(_, name)| name);
/// let orders = p.from_collection(vec![(1u32, 250i64), (2, 40)]);
/// let _named = orders
///     .key_by(|(customer, _)| *customer)
///     .join_table(&names)
///     .left(|(customer, amount), name| (customer, amount, name.unwrap_or_default()))
///     .collect();
/// ```
pub struct TableJoin<K, T, V> {
    stream: KeyedStream<K, T>,
    table: Table<K, V>,
}

impl<K: Key, T: Data, V: Data> TableJoin<K, T, V> {
    /// Emits `f(record, row)` for each record whose key has a row; other records are
    /// dropped.
    ///
    /// ```
    /// use weir_core::prelude::*;
    ///
    /// let p = Pipeline::new();
    /// let rates = Table::from_upserts(&p.from_collection(vec![("usd".to_string(), Some(110i64))]));
    /// let _in_euro_cents = p
    ///     .from_collection(vec![("usd".to_string(), 220i64)])
    ///     .key_by(|(currency, _)| currency.clone())
    ///     .join_table(&rates)
    ///     .inner(|(_, cents), rate| cents * 100 / rate)
    ///     .collect();
    /// ```
    pub fn inner<O: Data>(self, f: impl Fn(T, V) -> O + Send + Sync + 'static) -> Stream<O> {
        self.build(
            JoinKind::Inner,
            Arc::new(move |t, v: Option<V>| {
                f(
                    t,
                    v.expect("an inner join calls its function with a row only"),
                )
            }),
        )
    }

    /// Emits `f(record, row)` for each record, with `None` as the row when its key has
    /// none.
    pub fn left<O: Data>(self, f: impl Fn(T, Option<V>) -> O + Send + Sync + 'static) -> Stream<O> {
        self.build(JoinKind::Left, Arc::new(f))
    }

    fn build<O: Data>(self, kind: JoinKind, f: Joiner<T, V, O>) -> Stream<O> {
        let rows = self.table.changes.key_by(|c| c.key().clone());
        let out = self.stream.connect(&rows).process_with_state(move |state| {
            Ok(TableJoinFn {
                row: state.value_state("row")?,
                kind,
                f: f.clone(),
            })
        });
        out.p.refuse_side_outputs(out.node);
        out.name(match kind {
            JoinKind::Inner => "table-join",
            JoinKind::Left => "table-left-join",
        })
    }
}
