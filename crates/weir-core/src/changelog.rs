//! Changelog records: how a table that changes travels as a stream.
//!
//! A [`Change`] says what happened to one row of a table keyed by `K`: a row appeared, a
//! row's value was replaced, or a row went away. Replacements and removals carry the old
//! value, so an aggregation downstream can retract what it counted before (Flink's
//! `-U`/`+U`/`-D` rows, Kafka Streams' old and new values). A stream of changes is what
//! tables produce, what temporal joins read as the versions of a table, and what the
//! changelog-aware sinks (upserts) write.
//!
//! ```
//! use weir_core::changelog::Change;
//!
//! let changes = vec![
//!     Change::Insert { key: "eur", value: 1.10 },
//!     Change::Update { key: "eur", old: 1.10, new: 1.12 },
//!     Change::Delete { key: "eur", old: 1.12 },
//! ];
//! let latest: Vec<Option<f64>> = changes.iter().map(|c| c.new_value().copied()).collect();
//! assert_eq!(latest, vec![Some(1.10), Some(1.12), None]);
//! assert!(changes.iter().all(|c| *c.key() == "eur"));
//! ```

use serde::{Deserialize, Serialize};

/// One change to one row of a table keyed by `K` with values `V`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change<K, V> {
    /// Row `key` appeared with `value`.
    Insert {
        /// The row's key.
        key: K,
        /// The row's value.
        value: V,
    },
    /// Row `key` held `old` and now holds `new`.
    Update {
        /// The row's key.
        key: K,
        /// The value the row held before.
        old: V,
        /// The value the row holds now.
        new: V,
    },
    /// Row `key`, which held `old`, went away.
    Delete {
        /// The row's key.
        key: K,
        /// The value the row held before it went away.
        old: V,
    },
}

impl<K, V> Change<K, V> {
    /// The key of the row that changed.
    pub fn key(&self) -> &K {
        match self {
            Change::Insert { key, .. }
            | Change::Update { key, .. }
            | Change::Delete { key, .. } => key,
        }
    }

    /// The row's value after the change; `None` when the row went away.
    pub fn new_value(&self) -> Option<&V> {
        match self {
            Change::Insert { value, .. } => Some(value),
            Change::Update { new, .. } => Some(new),
            Change::Delete { .. } => None,
        }
    }

    /// The row's value before the change; `None` when the row is new.
    pub fn old_value(&self) -> Option<&V> {
        match self {
            Change::Insert { .. } => None,
            Change::Update { old, .. } | Change::Delete { old, .. } => Some(old),
        }
    }
}
