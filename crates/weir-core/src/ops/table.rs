//! The keyed functions behind tables: keeping the latest row per key and reporting each
//! change of it ([`TableRow`]), and joining a stream with the rows of a table
//! ([`TableJoinFn`]). The DSL in `crate::dsl::table` wires them; the aggregation of
//! tables lives in [`super::table_agg`].
//!
//! Rows are one [`ValueState`] per key, so they live in the job's state backend (heap or
//! RocksDB), are part of every checkpoint and move by key group on a rescale.

use super::co::{CoContext, CoProcessFunction};
use super::keyed::{KeyedContext, KeyedProcessFunction};
use crate::changelog::Change;
use crate::data::{Data, Key};
use crate::error::Result;
use crate::state::ValueState;
use std::sync::Arc;

/// What a table does with one input record: the row's new value, or `None` to delete it.
pub(crate) type RowOf<I, V> = fn(I) -> Option<V>;

/// Keeps the latest value per key and emits every change as a [`Change`]: `Insert` for a
/// key's first value, `Update` (old and new) for a later one, `Delete` (old) when the
/// input removes the row. Removing a row the table does not hold changes nothing and
/// emits nothing.
pub(crate) struct TableRow<I, V> {
    pub(crate) row: ValueState<V>,
    pub(crate) row_of: RowOf<I, V>,
}

impl<K: Key, I: 'static, V: Data> KeyedProcessFunction<K, I, Change<K, V>> for TableRow<I, V> {
    fn process(&mut self, input: I, ctx: &mut KeyedContext<'_, K, Change<K, V>>) -> Result<()> {
        let key = ctx.key().clone();
        let old = self.row.get()?;
        match ((self.row_of)(input), old) {
            (Some(value), None) => {
                self.row.set(value.clone())?;
                ctx.emit(Change::Insert { key, value });
            }
            (Some(new), Some(old)) => {
                self.row.set(new.clone())?;
                ctx.emit(Change::Update { key, old, new });
            }
            (None, Some(old)) => {
                self.row.clear()?;
                ctx.emit(Change::Delete { key, old });
            }
            (None, None) => {}
        }
        Ok(())
    }
}

/// The value a change leaves in its row (`None` when it deletes the row).
pub(crate) fn new_value<K, V>(change: Change<K, V>) -> Option<V> {
    match change {
        Change::Insert { value, .. } => Some(value),
        Change::Update { new, .. } => Some(new),
        Change::Delete { .. } => None,
    }
}

/// How a stream–table join treats a record whose key has no row.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum JoinKind {
    /// The record is dropped.
    Inner,
    /// The record is joined with `None`.
    Left,
}

/// A user's join function, over the record and the row (`None` only in a left join).
pub(crate) type Joiner<T, V, O> = Arc<dyn Fn(T, Option<V>) -> O + Send + Sync>;

/// Joins each record of input 1 with the current row of its key, kept from the changes of
/// input 2 (Kafka Streams' KStream–KTable join): a change of the table updates the row and
/// emits nothing; a record emits at most one result, with the record's timestamp.
pub(crate) struct TableJoinFn<T, V, O> {
    pub(crate) row: ValueState<V>,
    pub(crate) kind: JoinKind,
    pub(crate) f: Joiner<T, V, O>,
}

impl<K: Key, T: 'static, V: Data, O: 'static> CoProcessFunction<K, T, Change<K, V>, O>
    for TableJoinFn<T, V, O>
{
    fn process1(&mut self, record: T, ctx: &mut CoContext<'_, K, O>) -> Result<()> {
        match (self.row.get()?, self.kind) {
            (Some(row), _) => ctx.emit((self.f)(record, Some(row))),
            (None, JoinKind::Left) => ctx.emit((self.f)(record, None)),
            (None, JoinKind::Inner) => {}
        }
        Ok(())
    }

    fn process2(&mut self, change: Change<K, V>, _ctx: &mut CoContext<'_, K, O>) -> Result<()> {
        match new_value(change) {
            Some(v) => self.row.set(v),
            None => self.row.clear(),
        }
    }
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
