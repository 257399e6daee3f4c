//! What every record of an exactly-once epoch carries, and collecting an epoch's records
//! when a restore reads them back from the log.

/// The header every record of an exactly-once epoch carries: which subtask and transaction
/// (its token) wrote it and its sequence number, so a restore can find the records of an
/// epoch that did not commit. 20 bytes: subtask (u32), token (u64), sequence (u64),
/// big-endian.
pub const TXN_HEADER: &str = "weir.txn";

/// Encodes a [`TXN_HEADER`] value.
pub fn encode_header(subtask: u32, token: u64, seq: u64) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[..4].copy_from_slice(&subtask.to_be_bytes());
    b[4..12].copy_from_slice(&token.to_be_bytes());
    b[12..].copy_from_slice(&seq.to_be_bytes());
    b
}

/// Decodes a [`TXN_HEADER`] value.
///
/// ```
/// use weir_kafka::txn::{decode_header, encode_header};
/// assert_eq!(decode_header(&encode_header(2, 9, 41)), Some((2, 9, 41)));
/// assert_eq!(decode_header(b"short"), None);
/// ```
pub fn decode_header(b: &[u8]) -> Option<(u32, u64, u64)> {
    if b.len() != 20 {
        return None;
    }
    let l = u32::from_be_bytes(b[..4].try_into().ok()?);
    let e = u64::from_be_bytes(b[4..12].try_into().ok()?);
    let s = u64::from_be_bytes(b[12..].try_into().ok()?);
    Some((l, e, s))
}

/// Collects the records of one epoch read back from the log: each sequence number once
/// (a crashed earlier re-produce leaves a second aborted copy), and says which are missing.
#[derive(Debug)]
pub struct EpochCollector<R> {
    subtask: u32,
    token: u64,
    records: Vec<Option<R>>,
    found: u64,
}

impl<R> EpochCollector<R> {
    /// Collects `records` records of `subtask`'s transaction `token`.
    pub fn new(subtask: u32, token: u64, records: u64) -> Self {
        EpochCollector {
            subtask,
            token,
            records: (0..records).map(|_| None).collect(),
            found: 0,
        }
    }

    /// Offers a record read back with its header value; keeps it if it belongs to this
    /// epoch and its sequence number is not yet taken. Returns whether it was kept.
    pub fn offer(&mut self, header: &[u8], record: impl FnOnce() -> R) -> bool {
        let Some((l, e, s)) = decode_header(header) else {
            return false;
        };
        if l != self.subtask || e != self.token || s >= self.records.len() as u64 {
            return false;
        }
        let slot = &mut self.records[s as usize];
        if slot.is_some() {
            return false;
        }
        *slot = Some(record());
        self.found += 1;
        true
    }

    /// True when every sequence number was found.
    pub fn is_complete(&self) -> bool {
        self.found == self.records.len() as u64
    }

    /// The sequence numbers not found (at most `limit` of them).
    pub fn missing(&self, limit: usize) -> Vec<u64> {
        self.records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_none())
            .map(|(i, _)| i as u64)
            .take(limit)
            .collect()
    }

    /// The records in sequence order, or the missing sequence numbers.
    pub fn finish(self) -> Result<Vec<R>, Vec<u64>> {
        if self.is_complete() {
            Ok(self
                .records
                .into_iter()
                .map(|r| r.expect("complete"))
                .collect())
        } else {
            Err(self.missing(10))
        }
    }
}
