//! Aggregating a table by a new key, with retractions: the [`TableAggregate`] trait (add
//! and retract), the built-in [`CountRows`] and [`SumOf`], and the keyed function that
//! keeps one accumulator per group and emits each group's changes.
//!
//! A change of a row becomes `GroupDelta`s for the groups it touches: an update within
//! one group replaces the old value by the new one; an update that moves the row retracts
//! the old value from the old group and adds the new one to the new group. The group's
//! accumulator and its number of rows are one [`ValueState`] per group key.

use super::keyed::{KeyedContext, KeyedProcessFunction};
use crate::changelog::Change;
use crate::data::{Data, Key};
use crate::error::{Error, Result};
use crate::state::ValueState;
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;
use std::sync::Arc;

/// An aggregation over the rows of a group of a table, which rows join and leave: Kafka
/// Streams' adder and subtractor, Flink's `accumulate` and `retract`. Used by
/// [`crate::dsl::GroupedTable::aggregate`].
///
/// `retract` is only ever given a value that was added to the same accumulator before,
/// and a group whose last row leaves is removed (its accumulator too), so `retract` need
/// not handle an empty group.
///
/// ```
/// use weir_core::prelude::*;
///
/// /// The largest value of a group, kept exactly under retractions: every value with
/// /// its multiplicity.
/// struct Max;
/// impl TableAggregate<i64, std::collections::BTreeMap<i64, u32>, i64> for Max {
///     fn create(&self) -> std::collections::BTreeMap<i64, u32> { Default::default() }
///     fn add(&self, acc: &mut std::collections::BTreeMap<i64, u32>, v: i64) {
///         *acc.entry(v).or_default() += 1;
///     }
///     fn retract(&self, acc: &mut std::collections::BTreeMap<i64, u32>, v: i64) {
///         if let Some(n) = acc.get_mut(&v) {
///             *n -= 1;
///             if *n == 0 { acc.remove(&v); }
///         }
///     }
///     fn result(&self, acc: &std::collections::BTreeMap<i64, u32>) -> i64 {
///         acc.keys().next_back().copied().unwrap_or(i64::MIN)
///     }
/// }
///
/// let mut acc = Max.create();
/// Max.add(&mut acc, 3);
/// Max.add(&mut acc, 7);
/// Max.retract(&mut acc, 7);
/// assert_eq!(Max.result(&acc), 3);
/// ```
pub trait TableAggregate<V, Acc, O>: Send + Sync + 'static {
    /// The accumulator of a group without rows.
    fn create(&self) -> Acc;
    /// A row with `value` joins the group.
    fn add(&self, acc: &mut Acc, value: V);
    /// A row with `value`, added before, leaves the group.
    fn retract(&self, acc: &mut Acc, value: V);
    /// The group's value.
    fn result(&self, acc: &Acc) -> O;
}

/// Counts the rows of a group ([`crate::dsl::GroupedTable::count`]).
///
/// ```
/// use weir_core::ops::table_agg::{CountRows, TableAggregate};
///
/// let mut rows = TableAggregate::<&str, u64, u64>::create(&CountRows);
/// CountRows.add(&mut rows, "a1");
/// CountRows.add(&mut rows, "a2");
/// CountRows.retract(&mut rows, "a1");
/// assert_eq!(TableAggregate::<&str, u64, u64>::result(&CountRows, &rows), 1);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct CountRows;

impl<V> TableAggregate<V, u64, u64> for CountRows {
    fn create(&self) -> u64 {
        0
    }
    fn add(&self, acc: &mut u64, _value: V) {
        *acc += 1;
    }
    fn retract(&self, acc: &mut u64, _value: V) {
        *acc -= 1;
    }
    fn result(&self, acc: &u64) -> u64 {
        *acc
    }
}

/// A number a table can sum with retractions. Integers add and subtract with wraparound,
/// so a retraction undoes its addition exactly whatever came in between (the sum is
/// exact whenever the true sum fits the type); floats add and subtract as usual, so a
/// retraction may leave a rounding error.
///
/// ```
/// use weir_core::prelude::*;
///
/// // Wraparound in between does not matter once the large value is retracted.
/// assert_eq!(i64::MAX.plus(10).minus(i64::MAX), 10);
/// assert_eq!(0.1f64.plus(0.2).minus(0.2), 0.10000000000000003);
/// ```
pub trait TableSum: Data + Copy + PartialEq {
    /// Zero.
    fn zero() -> Self;
    /// `self + other`.
    fn plus(self, other: Self) -> Self;
    /// `self - other`.
    fn minus(self, other: Self) -> Self;
}

macro_rules! int_sum {
    ($($t:ty),*) => {$(
        impl TableSum for $t {
            fn zero() -> Self { 0 }
            fn plus(self, other: Self) -> Self { self.wrapping_add(other) }
            fn minus(self, other: Self) -> Self { self.wrapping_sub(other) }
        }
    )*};
}
int_sum!(
    i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize
);

macro_rules! float_sum {
    ($($t:ty),*) => {$(
        impl TableSum for $t {
            fn zero() -> Self { 0.0 }
            fn plus(self, other: Self) -> Self { self + other }
            fn minus(self, other: Self) -> Self { self - other }
        }
    )*};
}
float_sum!(f32, f64);

/// Sums a number taken from each row ([`crate::dsl::GroupedTable::sum`] and
/// [`crate::dsl::GroupedTable::sum_by`]).
///
/// ```
/// use weir_core::ops::table_agg::{SumOf, TableAggregate};
///
/// let amounts = SumOf::new(|(_, amount): &(String, i64)| *amount);
/// let mut total = amounts.create();
/// amounts.add(&mut total, ("eu".to_string(), 10));
/// amounts.add(&mut total, ("eu".to_string(), 5));
/// amounts.retract(&mut total, ("eu".to_string(), 10));
/// assert_eq!(amounts.result(&total), 5);
/// ```
pub struct SumOf<V, N> {
    field: Arc<dyn Fn(&V) -> N + Send + Sync>,
}

impl<V, N> SumOf<V, N> {
    /// Sums `field(row)` over the rows of a group.
    pub fn new(field: impl Fn(&V) -> N + Send + Sync + 'static) -> Self {
        SumOf {
            field: Arc::new(field),
        }
    }
}

impl<V: 'static, N: TableSum> TableAggregate<V, N, N> for SumOf<V, N> {
    fn create(&self) -> N {
        N::zero()
    }
    fn add(&self, acc: &mut N, value: V) {
        *acc = acc.plus((self.field)(&value));
    }
    fn retract(&self, acc: &mut N, value: V) {
        *acc = acc.minus((self.field)(&value));
    }
    fn result(&self, acc: &N) -> N {
        *acc
    }
}

/// What one change of a row does to one group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) enum GroupDelta<V> {
    /// A row joins the group.
    Add(V),
    /// A row leaves the group.
    Retract(V),
    /// A row of the group changes its value and stays.
    Replace {
        /// Its value before.
        old: V,
        /// Its value now.
        new: V,
    },
}

/// The group deltas of one change, with the group of a row given by `group_of`: one for
/// an insert, a delete or an update within a group; two for an update that moves the row
/// (the retraction first).
pub(crate) fn deltas<K, V, G: PartialEq>(
    change: Change<K, V>,
    group_of: &dyn Fn(&K, &V) -> G,
) -> Vec<(G, GroupDelta<V>)> {
    match change {
        Change::Insert { key, value } => vec![(group_of(&key, &value), GroupDelta::Add(value))],
        Change::Delete { key, old } => vec![(group_of(&key, &old), GroupDelta::Retract(old))],
        Change::Update { key, old, new } => {
            let (from, to) = (group_of(&key, &old), group_of(&key, &new));
            if from == to {
                vec![(to, GroupDelta::Replace { old, new })]
            } else {
                vec![(from, GroupDelta::Retract(old)), (to, GroupDelta::Add(new))]
            }
        }
    }
}

/// One accumulator and number of rows per group; emits `Insert` when a group gets its
/// first row, `Update` when its value changes (an unchanged value emits nothing) and
/// `Delete` when its last row leaves.
pub(crate) struct GroupAggregateFn<V, Acc, O, A> {
    pub(crate) agg: Arc<A>,
    /// (accumulator, rows in the group).
    pub(crate) group: ValueState<(Acc, u64)>,
    pub(crate) _types: PhantomData<fn(V) -> O>,
}

impl<G, V, Acc, O, A> KeyedProcessFunction<G, (G, GroupDelta<V>), Change<G, O>>
    for GroupAggregateFn<V, Acc, O, A>
where
    G: Key,
    V: Data,
    Acc: Data,
    O: Data + PartialEq,
    A: TableAggregate<V, Acc, O>,
{
    fn process(
        &mut self,
        (_, delta): (G, GroupDelta<V>),
        ctx: &mut KeyedContext<'_, G, Change<G, O>>,
    ) -> Result<()> {
        let (mut acc, rows) = match self.group.get()? {
            Some(group) => group,
            None => (self.agg.create(), 0),
        };
        let before = (rows > 0).then(|| self.agg.result(&acc));
        let rows = match delta {
            GroupDelta::Add(v) => {
                self.agg.add(&mut acc, v);
                rows + 1
            }
            GroupDelta::Retract(v) => {
                if rows == 0 {
                    return Err(Error::user(format!(
                        "group {:?} holds no rows, yet a row leaves it: the table's \
                         changelog retracts a value it never added",
                        ctx.key()
                    )));
                }
                self.agg.retract(&mut acc, v);
                rows - 1
            }
            GroupDelta::Replace { old, new } => {
                self.agg.retract(&mut acc, old);
                self.agg.add(&mut acc, new);
                rows
            }
        };
        let key = ctx.key().clone();
        if rows == 0 {
            self.group.clear()?;
            if let Some(old) = before {
                ctx.emit(Change::Delete { key, old });
            }
            return Ok(());
        }
        let now = self.agg.result(&acc);
        self.group.set((acc, rows))?;
        match before {
            None => ctx.emit(Change::Insert { key, value: now }),
            Some(old) if old != now => ctx.emit(Change::Update { key, old, new: now }),
            Some(_) => {}
        }
        Ok(())
    }
}
