//! How a persistent store encodes the state keys inside its store keys.

use crate::codec;
use crate::error::Result;
use serde::Serialize;

/// How a persistent store ([`KvStore`](super::KvStore)) encodes state keys: a store keeps
/// one encoding for its whole life, restores included, and names it in each checkpoint
/// (see docs/decisions/0054-state-keys-in-numeric-order.md).
///
/// ```
/// use weir_core::state::KeyEncoding;
/// let (mut a, mut b) = (Vec::new(), Vec::new());
/// KeyEncoding::Ordered.encode_into(&1_000u64, &mut a).unwrap();
/// KeyEncoding::Ordered.encode_into(&1_001u64, &mut b).unwrap();
/// assert!(a < b, "neighbouring keys are neighbours in the store");
/// assert_eq!(KeyEncoding::parse(KeyEncoding::Ordered.name()), Some(KeyEncoding::Ordered));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyEncoding {
    /// Integers big-endian ([`codec::encode_ordered_into`]): keys that are close as
    /// numbers (ids counted up, a key's windows by start) lie close in the store, so
    /// they share its blocks and caches. What every new store uses.
    #[default]
    Ordered,
    /// The value codec ([`codec::encode_into`], integers little-endian): what stores
    /// restored from checkpoints of weir releases before [`Ordered`](Self::Ordered) keep.
    LittleEndian,
}

impl KeyEncoding {
    /// Appends the encoding of `key` to `out`.
    pub fn encode_into<K: Serialize + ?Sized>(self, key: &K, out: &mut Vec<u8>) -> Result<()> {
        match self {
            KeyEncoding::Ordered => codec::encode_ordered_into(key, out),
            KeyEncoding::LittleEndian => codec::encode_into(key, out),
        }
    }

    /// The name a checkpoint records the encoding under.
    pub fn name(self) -> &'static str {
        match self {
            KeyEncoding::Ordered => "ordered",
            KeyEncoding::LittleEndian => "little-endian",
        }
    }

    /// The encoding a checkpoint records as `name` (surrounding whitespace ignored);
    /// `None` for a name this build does not know.
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim() {
            "ordered" => Some(KeyEncoding::Ordered),
            "little-endian" => Some(KeyEncoding::LittleEndian),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc<K: Serialize>(e: KeyEncoding, k: &K) -> Vec<u8> {
        let mut out = Vec::new();
        e.encode_into(k, &mut out).unwrap();
        out
    }

    #[test]
    fn ordered_keys_sort_as_numbers_across_every_integer_width() {
        let keys: [u64; 9] = [0, 1, 250, 251, 300, 65_535, 65_536, 1 << 32, u64::MAX];
        let encoded: Vec<Vec<u8>> = keys.iter().map(|k| enc(KeyEncoding::Ordered, k)).collect();
        let mut sorted = encoded.clone();
        sorted.sort();
        assert_eq!(sorted, encoded);
        // (key, window start) pairs: a key's windows in time order, next to each other.
        let pairs = [(5u64, 60_000u64), (5, 120_000), (6, 0)];
        let encoded: Vec<Vec<u8>> = pairs.iter().map(|p| enc(KeyEncoding::Ordered, p)).collect();
        assert!(encoded.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn the_encodings_differ_only_in_byte_order() {
        assert_eq!(enc(KeyEncoding::Ordered, &300u64), vec![251, 0x01, 0x2c]);
        assert_eq!(
            enc(KeyEncoding::LittleEndian, &300u64),
            vec![251, 0x2c, 0x01]
        );
        assert_eq!(
            enc(KeyEncoding::LittleEndian, &"k"),
            enc(KeyEncoding::Ordered, &"k")
        );
        assert_eq!(
            KeyEncoding::parse("little-endian\n"),
            Some(KeyEncoding::LittleEndian)
        );
        assert_eq!(KeyEncoding::parse("zigzag"), None);
    }
}
