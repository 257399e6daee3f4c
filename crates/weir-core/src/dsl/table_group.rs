//! [`Table::group_by`] and [`GroupedTable`]: a table's rows aggregated by a new key, with
//! retractions, into a table again (Kafka Streams' `KTable.groupBy(..).aggregate(..)`).
//!
//! This module wires operators only; the aggregation lives in `crate::ops::table_agg`.

use super::Table;
use crate::data::{Data, Key};
use crate::ops::table_agg::{CountRows, GroupAggregateFn, SumOf, TableAggregate, TableSum, deltas};
use std::marker::PhantomData;
use std::sync::Arc;

/// The group of a row, from its key and value.
type GroupOf<K, V, G> = Arc<dyn Fn(&K, &V) -> G + Send + Sync>;

impl<K: Key, V: Data> Table<K, V> {
    /// Groups the table's rows by a new key `group_of(key, value)`, to aggregate each
    /// group with [`GroupedTable::count`], [`GroupedTable::sum`], [`GroupedTable::sum_by`]
    /// or [`GroupedTable::aggregate`]. The result is a table keyed by the group.
    ///
    /// A row counts in exactly one group at a time: when its value changes, the old value
    /// is retracted and the new one added, in the same group or — when the new value
    /// belongs elsewhere — in another; a deleted row is retracted. A group whose last row
    /// leaves is deleted from the result.
    ///
    /// ```
    /// use weir_core::prelude::*;
    ///
    /// let p = Pipeline::new();
    /// // (account, (region, balance)) upserts.
    /// let accounts = Table::from_upserts(&p.from_collection(vec![
    ///     ("a1".to_string(), Some(("eu".to_string(), 100i64))),
    ///     ("a2".to_string(), Some(("eu".to_string(), 50))),
    ///     ("a1".to_string(), Some(("us".to_string(), 100))), // a1 moves to us
    ///     ("a2".to_string(), None),                           // a2 goes away
    /// ]));
    /// let per_region = accounts.group_by(|_account, (region, _)| region.clone());
    /// // eu: Insert 100, Update 100 -> 150, Update 150 -> 50, Delete 50; us: Insert 100.
    /// let _balances = per_region.sum_by(|(_, balance)| *balance).changes().collect();
    /// ```
    pub fn group_by<G: Key>(
        &self,
        group_of: impl Fn(&K, &V) -> G + Send + Sync + 'static,
    ) -> GroupedTable<K, V, G> {
        GroupedTable {
            table: self.clone(),
            group_of: Arc::new(group_of),
        }
    }
}

/// A table's rows grouped by a new key of type `G`, waiting for its aggregation. See
/// [`Table::group_by`].
pub struct GroupedTable<K, V, G> {
    table: Table<K, V>,
    group_of: GroupOf<K, V, G>,
}

impl<K: Key, V: Data, G: Key> GroupedTable<K, V, G> {
    /// The number of rows per group.
    ///
    /// ```
    /// use weir_core::prelude::*;
    ///
    /// let p = Pipeline::new();
    /// // (user, country): users per country.
    /// let users = p
    ///     .from_collection(vec![(1u32, "fr".to_string()), (2, "de".into()), (1, "de".into())])
    ///     .key_by(|(user, _)| *user)
    ///     .to_table();
    /// // fr: Insert 1, Delete 1 (user 1 moved); de: Insert 1, Update 1 -> 2.
    /// let _per_country = users.group_by(|_, (_, country)| country.clone()).count().changes().collect();
    /// ```
    pub fn count(&self) -> Table<G, u64> {
        self.aggregate(CountRows).name("count")
    }

    /// The sum of the values per group, for a table of numbers. See [`TableSum`] for
    /// exactness under retractions.
    ///
    /// ```
    /// use weir_core::prelude::*;
    ///
    /// let p = Pipeline::new();
    /// // (("eu", "a1"), balance): balances per region.
    /// let balances = Table::from_upserts(&p.from_collection(vec![
    ///     (("eu".to_string(), "a1".to_string()), Some(10i64)),
    ///     (("eu".to_string(), "a2".to_string()), Some(5)),
    /// ]));
    /// let _per_region = balances.group_by(|(region, _), _| region.clone()).sum().changes().collect();
    /// ```
    pub fn sum(&self) -> Table<G, V>
    where
        V: TableSum,
    {
        self.aggregate(SumOf::new(|v: &V| *v)).name("sum")
    }

    /// The sum of a number taken from each row (`field(value)`), per group. See
    /// [`Table::group_by`] for an example.
    pub fn sum_by<N: TableSum>(
        &self,
        field: impl Fn(&V) -> N + Send + Sync + 'static,
    ) -> Table<G, N> {
        self.aggregate(SumOf::new(field)).name("sum")
    }

    /// Aggregates each group with `agg`, which rows join ([`TableAggregate::add`]) and
    /// leave ([`TableAggregate::retract`]). The result table has a row per group with at
    /// least one row: `Insert` when the group gets its first row, `Update` when its
    /// result changes (a change that leaves the result equal emits nothing), `Delete` when
    /// its last row leaves.
    ///
    /// The accumulator and the number of rows of each group are keyed state (heap or
    /// RocksDB), checkpointed and rescaled by key group.
    ///
    /// ```
    /// use weir_core::prelude::*;
    ///
    /// /// The mean balance of a group: (sum, rows) in, sum / rows out.
    /// struct Mean;
    /// impl TableAggregate<i64, (i64, i64), i64> for Mean {
    ///     fn create(&self) -> (i64, i64) { (0, 0) }
    ///     fn add(&self, acc: &mut (i64, i64), v: i64) { acc.0 += v; acc.1 += 1; }
    ///     fn retract(&self, acc: &mut (i64, i64), v: i64) { acc.0 -= v; acc.1 -= 1; }
    ///     fn result(&self, acc: &(i64, i64)) -> i64 { acc.0 / acc.1 }
    /// }
    ///
    /// let p = Pipeline::new();
    /// let balances = Table::from_upserts(&p.from_collection(vec![
    ///     (("eu".to_string(), 1u32), Some(10i64)),
    ///     (("eu".to_string(), 2u32), Some(30)),
    /// ]));
    /// let _means = balances
    ///     .group_by(|(region, _), _| region.clone())
    ///     .aggregate(Mean)
    ///     .changes()
    ///     .collect();
    /// ```
    pub fn aggregate<Acc: Data, O: Data + PartialEq>(
        &self,
        agg: impl TableAggregate<V, Acc, O>,
    ) -> Table<G, O> {
        let group_of = self.group_of.clone();
        let deltas = self
            .table
            .changes()
            .flat_map(move |c| deltas(c, &*group_of))
            .name("group_by");
        let agg = Arc::new(agg);
        let changes = deltas
            .key_by(|(g, _)| g.clone())
            .process_with_state(move |state| {
                Ok(GroupAggregateFn {
                    agg: agg.clone(),
                    group: state.value_state("group")?,
                    _types: PhantomData,
                })
            });
        changes.p.refuse_side_outputs(changes.node);
        Table::from_stream(changes.name("aggregate"))
    }
}
