//! Key ranges of one state key's collection (a list's elements, a map's entries) in a
//! [`KvStore`], and removing such a range.
//!
//! A collection of state key `k` in table `t` lives under the prefix
//! `[key group][t][0][encoded k]`. weir's codec is self-delimiting (a decoder knows where a
//! value ends), so no key's encoding is a prefix of another's: the prefixes of two keys
//! never overlap, and each collection is one contiguous range of the store.

use super::{Changes, KvStore};
use crate::error::Result;

/// Store entries removed per write when a collection is cleared.
const DELETE_BATCH: usize = 4096;

/// The first key after every key that starts with `prefix` (the exclusive end of its
/// range).
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.last_mut() {
        if *last < 0xff {
            *last += 1;
            return end;
        }
        end.pop();
    }
    // Only a prefix of 0xff bytes has no successor; keys start with their key group,
    // which is below 0xff00, so this is never reached.
    vec![0xff; prefix.len() + 8]
}

/// The key right after `key` in byte order: where a scan continues after it.
pub(super) fn successor(key: &[u8]) -> Vec<u8> {
    let mut next = Vec::with_capacity(key.len() + 1);
    next.extend_from_slice(key);
    next.push(0);
    next
}

/// Deletes every store entry in `[start, end)`, reading and deleting them in batches (the
/// range is never read at once). Waits for a snapshot still writing in the background
/// first: it may be adding entries to the range. `key_start` is where the encoded state
/// key begins in the store keys (see [`Changes`]). Returns how many entries it deleted.
pub(super) fn delete_range(
    store: &dyn KvStore,
    key_start: usize,
    start: &[u8],
    end: &[u8],
) -> Result<usize> {
    store.settle()?;
    let mut from = start.to_vec();
    let mut deleted = 0;
    loop {
        let batch = store.scan(&from, end, DELETE_BATCH)?;
        let Some((last, _)) = batch.last() else {
            return Ok(deleted);
        };
        let mut changes = Changes::new(key_start);
        for (k, _) in &batch {
            changes.push_with(|buf| {
                buf.extend_from_slice(k);
                Ok(None)
            })?;
        }
        store.write(&changes)?;
        deleted += batch.len();
        if batch.len() < DELETE_BATCH {
            return Ok(deleted);
        }
        from = successor(last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_a_prefix_is_past_all_its_keys() {
        assert_eq!(prefix_end(&[0, 1, 7]), vec![0, 1, 8]);
        assert_eq!(prefix_end(&[0, 1, 0xff, 0xff]), vec![0, 2]);
        let end = prefix_end(&[3, 0xff]);
        assert!([3u8, 0xff, 0xff, 0xff].as_slice() < end.as_slice());
        assert!(end.as_slice() <= [4u8].as_slice());
    }
}
