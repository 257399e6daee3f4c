//! Writing a changelog out: [`Stream::sink_changes`] sends every change of one key to one
//! sink subtask, in order, so an upsert sink never sees the changes of a key out of order.
//! It owns nothing else; the sinks themselves live in the connector crates.

use super::{SinkHandle, Stream};
use crate::changelog::Change;
use crate::data::{Data, Key, KeyFn};
use crate::exchange::{Partitioning, hash_partitioner};
use crate::ops::sink::SinkFunction;
use std::sync::Arc;

impl<K: Key, V: Data> Stream<Change<K, V>> {
    /// Writes a changelog into a sink (an upsert sink: a database table, a compacted Kafka
    /// topic), partitioned by the change's key: every change of one key goes to the same
    /// sink subtask, in the order the upstream subtask emitted it, whatever the sink's
    /// parallelism. A plain [`Stream::sink`] would keep the upstream partitioning, and a
    /// rebalance or a different parallelism could let a later change of a key overtake an
    /// earlier one in another subtask.
    ///
    /// ```
    /// use weir_core::prelude::*;
    /// use weir_core::ops::sink::SinkFunction;
    ///
    /// /// Keeps the latest value per key, as a table would.
    /// struct Latest(std::collections::BTreeMap<String, i64>);
    /// impl SinkFunction<Change<String, i64>> for Latest {
    ///     fn invoke(&mut self, c: Change<String, i64>, _ts: Timestamp) -> weir_core::Result<()> {
    ///         match c.new_value() {
    ///             Some(v) => { self.0.insert(c.key().clone(), *v); }
    ///             None => { self.0.remove(c.key()); }
    ///         }
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let p = Pipeline::new();
    /// p.from_collection(vec![
    ///     Change::Insert { key: "a".to_string(), value: 1 },
    ///     Change::Update { key: "a".to_string(), old: 1, new: 2 },
    /// ])
    /// .sink_changes("latest", || Latest(Default::default()))
    /// .parallelism(2);
    /// ```
    pub fn sink_changes<S: SinkFunction<Change<K, V>>>(
        &self,
        name: &str,
        make: impl Fn() -> S + Send + Sync + 'static,
    ) -> SinkHandle {
        let by_key: KeyFn<Change<K, V>, K> = Arc::new(|c: &Change<K, V>| c.key().clone());
        Stream {
            partitioning: Partitioning::Hash(hash_partitioner(by_key)),
            ..self.clone()
        }
        .sink(name, make)
    }
}
