//! The exactly-once sink's transaction bookkeeping, as a sans-IO state machine.
//!
//! Nothing here talks to Kafka: [`TxnBook`] says which transactional producer (slot) an epoch
//! writes with, which epochs are pre-committed and waiting for their checkpoint, and in
//! which order they commit; [`plan_recovery`] and [`decide`] say, on restore, which ids to
//! fence and which pending epochs must be re-produced. The Kafka side lives in `sink.rs`.
//!
//! Vocabulary:
//! - *epoch*: the records a sink subtask writes between two checkpoint barriers; it is named
//!   by the checkpoint whose barrier closes it, and written in one Kafka transaction.
//! - *lineage*: the subtask index that wrote an epoch. Commit markers are keyed by lineage,
//!   and a lineage commits its epochs strictly in order, so the newest committed marker of a
//!   lineage says exactly which of its epochs are committed.
//! - *slot*: one of a small pool of transactional producers per subtask
//!   (`{prefix}-{lineage}-{slot}`), so the next epoch can write while the previous one waits
//!   for its checkpoint to complete.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;

/// A partition of a topic and an offset in it.
pub type PartitionOffset = (i32, i64);

/// An epoch that was pre-committed at its barrier and is waiting for its checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingEpoch {
    /// The checkpoint whose barrier closed the epoch.
    pub epoch: u64,
    /// The producer slot whose transaction holds it.
    pub slot: u32,
    /// The transaction's token: the records carry it in their [`TXN_HEADER`], so a restore
    /// can find them (unique per transaction, unlike checkpoint ids, which a run that
    /// crashed before its first checkpoint may reuse).
    pub token: u64,
    /// Data records written (their sequence numbers are `0..records`).
    pub records: u64,
    /// Per output partition, the offset of the epoch's first record there.
    pub first_offsets: Vec<PartitionOffset>,
    /// Where the epoch's commit marker went in the marker topic.
    pub marker: PartitionOffset,
}

/// What a sink subtask keeps in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkSnapshot {
    /// Format version of this structure.
    pub version: u32,
    /// The subtask (lineage) that wrote it.
    pub lineage: u32,
    /// The parallelism of the run that wrote it.
    pub parallelism: u32,
    /// The producer pool size of that run.
    pub pool: u32,
    /// Pre-committed epochs not known to be committed, oldest first.
    pub pending: Vec<PendingEpoch>,
    /// The marker of the newest committed epoch, if any: where a restore starts reading the
    /// marker topic when nothing is pending.
    pub last_committed_marker: Option<PartitionOffset>,
}

/// Current [`SinkSnapshot::version`].
pub const SNAPSHOT_VERSION: u32 = 1;

/// A bookkeeping rule was broken; the message says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BookError {
    /// Every slot holds an epoch that is waiting for its checkpoint.
    PoolExhausted {
        /// The pool size.
        pool: u32,
        /// The epochs waiting.
        pending: Vec<u64>,
    },
    /// A barrier arrived for an epoch not newer than one already pre-committed.
    EpochOrder {
        /// The epoch of the barrier.
        epoch: u64,
        /// The newest pre-committed epoch.
        newest: u64,
    },
    /// `committed` named an epoch that is not the oldest pending one.
    CommitOrder {
        /// The epoch reported committed.
        epoch: u64,
        /// The oldest pending epoch, if any.
        oldest: Option<u64>,
    },
    /// A record was written with no open transaction.
    NoOpenTransaction,
}

impl fmt::Display for BookError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BookError::PoolExhausted { pool, pending } => write!(
                f,
                "all {pool} transactional producers hold epochs waiting for their checkpoints \
                 ({pending:?}): checkpoints are failing or completing slower than they start; \
                 fix the checkpoint failures or raise the sink's producer pool size"
            ),
            BookError::EpochOrder { epoch, newest } => write!(
                f,
                "barrier for checkpoint {epoch} arrived after checkpoint {newest} was \
                 pre-committed; checkpoint ids must increase"
            ),
            BookError::CommitOrder { epoch, oldest } => write!(
                f,
                "epoch {epoch} reported committed, but the oldest pending epoch is {oldest:?}"
            ),
            BookError::NoOpenTransaction => write!(f, "a record was written outside a transaction"),
        }
    }
}

impl std::error::Error for BookError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    Open,
    Pending(u64),
}

#[derive(Debug)]
struct Open {
    slot: u32,
    token: u64,
    records: u64,
    first_offsets: BTreeMap<i32, i64>,
}

/// The transaction bookkeeping of one sink subtask.
///
/// ```
/// use weir_kafka::txn::TxnBook;
/// let mut book = TxnBook::new(0, 2);
/// let slot = book.begin().unwrap();          // first record of an epoch: begin a transaction
/// assert_eq!(book.next_seq().unwrap(), 0);
/// book.delivered(1, 40);                      // its delivery report
/// let p = book.precommit(7, (0, 3)).unwrap().unwrap(); // barrier 7: marker written at 0/3
/// assert_eq!((p.slot, p.records, p.first_offsets.clone()), (slot, 1, vec![(1, 40)]));
/// assert_eq!(book.complete(7), vec![(slot, 7)]); // checkpoint 7 completed: commit these
/// book.committed(7).unwrap();
/// assert!(book.snapshot(1).pending.is_empty());
/// ```
#[derive(Debug)]
pub struct TxnBook {
    lineage: u32,
    slots: Vec<Slot>,
    open: Option<Open>,
    pending: VecDeque<PendingEpoch>,
    newest_precommitted: Option<u64>,
    last_committed_marker: Option<PartitionOffset>,
    next_token: u64,
}

impl TxnBook {
    /// Bookkeeping for subtask `lineage` with `pool` transactional producers (at least 1).
    pub fn new(lineage: u32, pool: u32) -> Self {
        TxnBook {
            lineage,
            slots: vec![Slot::Free; pool.max(1) as usize],
            open: None,
            pending: VecDeque::new(),
            newest_precommitted: None,
            last_committed_marker: None,
            next_token: 0,
        }
    }

    /// Tokens of this run's transactions start at `run_id` (pick it at random per run so
    /// tokens of different runs do not collide).
    pub fn with_run_id(mut self, run_id: u64) -> Self {
        self.next_token = run_id;
        self
    }

    /// The token of the open transaction, if one is open.
    pub fn open_token(&self) -> Option<u64> {
        self.open.as_ref().map(|o| o.token)
    }

    /// The pool size.
    pub fn pool(&self) -> u32 {
        self.slots.len() as u32
    }

    /// The slot of the open transaction, if one is open.
    pub fn open_slot(&self) -> Option<u32> {
        self.open.as_ref().map(|o| o.slot)
    }

    /// Records written in the open transaction.
    pub fn open_records(&self) -> u64 {
        self.open.as_ref().map_or(0, |o| o.records)
    }

    /// Opens a transaction for a new epoch and returns its slot (the lowest free one).
    /// Returns the open slot if a transaction is already open.
    pub fn begin(&mut self) -> Result<u32, BookError> {
        if let Some(o) = &self.open {
            return Ok(o.slot);
        }
        let Some(i) = self.slots.iter().position(|s| *s == Slot::Free) else {
            return Err(BookError::PoolExhausted {
                pool: self.pool(),
                pending: self.pending.iter().map(|p| p.epoch).collect(),
            });
        };
        self.slots[i] = Slot::Open;
        let token = self.next_token;
        self.next_token = self.next_token.wrapping_add(1);
        self.open = Some(Open {
            slot: i as u32,
            token,
            records: 0,
            first_offsets: BTreeMap::new(),
        });
        Ok(i as u32)
    }

    /// The sequence number of the next record of the open epoch.
    pub fn next_seq(&mut self) -> Result<u64, BookError> {
        let o = self.open.as_mut().ok_or(BookError::NoOpenTransaction)?;
        let s = o.records;
        o.records += 1;
        Ok(s)
    }

    /// A record of the open epoch was acknowledged at `partition`/`offset`.
    pub fn delivered(&mut self, partition: i32, offset: i64) {
        if let Some(o) = &mut self.open {
            let e = o.first_offsets.entry(partition).or_insert(offset);
            *e = (*e).min(offset);
        }
    }

    /// Barrier `epoch`: every record of the open epoch is acknowledged and its commit marker
    /// was written at `marker`. Moves the epoch to pending and returns it. An open epoch
    /// with no records is not pre-committed (its transaction stays open for the next
    /// epoch, and no marker is needed): returns `None`, as when nothing is open.
    pub fn precommit(
        &mut self,
        epoch: u64,
        marker: PartitionOffset,
    ) -> Result<Option<&PendingEpoch>, BookError> {
        if let Some(newest) = self.newest_precommitted
            && epoch <= newest
        {
            return Err(BookError::EpochOrder { epoch, newest });
        }
        match &self.open {
            Some(o) if o.records > 0 => {}
            _ => return Ok(None),
        }
        let o = self.open.take().expect("checked above");
        self.slots[o.slot as usize] = Slot::Pending(epoch);
        self.newest_precommitted = Some(epoch);
        self.pending.push_back(PendingEpoch {
            epoch,
            slot: o.slot,
            token: o.token,
            records: o.records,
            first_offsets: o.first_offsets.into_iter().collect(),
            marker,
        });
        Ok(self.pending.back())
    }

    /// Checkpoint `checkpoint` completed: the pending epochs it covers, oldest first, as
    /// `(slot, epoch)`. Commit them in this order and report each with
    /// [`TxnBook::committed`]; stop at the first failure.
    pub fn complete(&self, checkpoint: u64) -> Vec<(u32, u64)> {
        self.pending
            .iter()
            .take_while(|p| p.epoch <= checkpoint)
            .map(|p| (p.slot, p.epoch))
            .collect()
    }

    /// The oldest pending epoch was committed: its slot is free again.
    pub fn committed(&mut self, epoch: u64) -> Result<(), BookError> {
        match self.pending.front() {
            Some(p) if p.epoch == epoch => {
                let p = self.pending.pop_front().expect("front exists");
                self.slots[p.slot as usize] = Slot::Free;
                self.last_committed_marker = Some(p.marker);
                Ok(())
            }
            other => Err(BookError::CommitOrder {
                epoch,
                oldest: other.map(|p| p.epoch),
            }),
        }
    }

    /// The pending epochs, oldest first.
    pub fn pending(&self) -> impl Iterator<Item = &PendingEpoch> {
        self.pending.iter()
    }

    /// What the checkpoint keeps (call after [`TxnBook::precommit`]).
    pub fn snapshot(&self, parallelism: u32) -> SinkSnapshot {
        SinkSnapshot {
            version: SNAPSHOT_VERSION,
            lineage: self.lineage,
            parallelism,
            pool: self.pool(),
            pending: self.pending.iter().cloned().collect(),
            last_committed_marker: self.last_committed_marker,
        }
    }

    /// Carries the marker position of a lineage recovered on restore, so the next snapshot
    /// can tell where to look even before this run commits anything.
    pub fn set_last_committed_marker(&mut self, marker: Option<PartitionOffset>) {
        if self.last_committed_marker.is_none() {
            self.last_committed_marker = marker;
        }
    }
}

/// The transactional id of `slot` of subtask `lineage`.
///
/// ```
/// assert_eq!(weir_kafka::txn::transactional_id("sums", 1, 0), "sums-1-0");
/// ```
pub fn transactional_id(prefix: &str, lineage: u32, slot: u32) -> String {
    format!("{prefix}-{lineage}-{slot}")
}

/// The commit-marker key of a lineage.
pub fn marker_key(prefix: &str, lineage: u32) -> String {
    format!("{prefix}/{lineage}")
}

/// What one restored lineage needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineageRecovery {
    /// The lineage (subtask index of the run that wrote the checkpoint).
    pub lineage: u32,
    /// Its pending epochs, oldest first.
    pub pending: Vec<PendingEpoch>,
    /// Where to start reading its markers: per marker partition, the lowest offset of
    /// interest (the oldest pending marker, else the newest committed one).
    pub scan_from: Vec<PartitionOffset>,
}

/// What a sink subtask does on restore before it writes anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryPlan {
    /// Transactional ids to fence (initialise and drop), in order.
    pub fence: Vec<String>,
    /// The lineages this subtask recovers.
    pub lineages: Vec<LineageRecovery>,
}

/// Plans the restore of subtask `subtask` of `parallelism` from the sink's snapshots.
///
/// The subtask takes the lineages `l` with `l % parallelism == subtask`, and fences every
/// slot of those lineages and of its own lineage, up to the larger of the old and new pool
/// sizes — so transactions a previous, larger parallelism left open are fenced too.
pub fn plan_recovery(
    prefix: &str,
    snapshots: &[SinkSnapshot],
    subtask: u32,
    parallelism: u32,
    pool: u32,
) -> RecoveryPlan {
    plan_recovery_with(
        prefix,
        snapshots,
        subtask,
        parallelism,
        pool,
        Registered::default(),
    )
}

/// The largest parallelism and pool size any run of the sink announced before it wrote
/// (kept outside checkpoints, so it also covers runs that crashed before their first
/// checkpoint).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Registered {
    /// The largest parallelism.
    pub parallelism: u32,
    /// The largest pool size.
    pub pool: u32,
}

impl Registered {
    /// The text kept in the registry (`parallelism=P,pool=N`).
    ///
    /// ```
    /// use weir_kafka::txn::Registered;
    /// let r = Registered { parallelism: 3, pool: 2 };
    /// assert_eq!(Registered::parse(&r.to_text()), r);
    /// assert_eq!(Registered::parse(""), Registered::default());
    /// ```
    pub fn to_text(&self) -> String {
        format!("parallelism={},pool={}", self.parallelism, self.pool)
    }

    /// Reads [`Registered::to_text`]; anything else counts as nothing registered.
    pub fn parse(text: &str) -> Self {
        let mut r = Registered::default();
        for part in text.split(',') {
            match part.split_once('=') {
                Some(("parallelism", v)) => r.parallelism = v.parse().unwrap_or(0),
                Some(("pool", v)) => r.pool = v.parse().unwrap_or(0),
                _ => {}
            }
        }
        r
    }

    /// The larger of both, field by field.
    pub fn max(self, other: Registered) -> Registered {
        Registered {
            parallelism: self.parallelism.max(other.parallelism),
            pool: self.pool.max(other.pool),
        }
    }
}

/// [`plan_recovery`], also fencing the lineages and slots of every registered run: a run
/// at a larger parallelism that crashed before its first checkpoint left transactions open
/// that no snapshot knows about.
///
/// ```
/// use weir_kafka::txn::{plan_recovery_with, Registered};
/// let plan = plan_recovery_with("p", &[], 0, 1, 1, Registered { parallelism: 2, pool: 1 });
/// assert_eq!(plan.fence, vec!["p-0-0".to_string(), "p-1-0".to_string()]);
/// ```
pub fn plan_recovery_with(
    prefix: &str,
    snapshots: &[SinkSnapshot],
    subtask: u32,
    parallelism: u32,
    pool: u32,
    registered: Registered,
) -> RecoveryPlan {
    let parallelism = parallelism.max(1);
    let mut lineages: BTreeMap<u32, LineageRecovery> = BTreeMap::new();
    let mut old_pool = registered.pool;
    let mut old_parallelism = registered.parallelism;
    for s in snapshots {
        old_pool = old_pool.max(s.pool);
        old_parallelism = old_parallelism.max(s.parallelism);
        if s.lineage % parallelism != subtask {
            continue;
        }
        let mut from: BTreeMap<i32, i64> = BTreeMap::new();
        let marks = s
            .pending
            .iter()
            .map(|p| p.marker)
            .chain(s.last_committed_marker);
        for (p, o) in marks {
            let e = from.entry(p).or_insert(o);
            *e = (*e).min(o);
        }
        let l = lineages.entry(s.lineage).or_insert(LineageRecovery {
            lineage: s.lineage,
            pending: Vec::new(),
            scan_from: Vec::new(),
        });
        l.pending.extend(s.pending.iter().cloned());
        l.pending.sort_by_key(|p| p.epoch);
        l.pending.dedup_by_key(|p| p.epoch);
        let mut merged: BTreeMap<i32, i64> = l.scan_from.iter().copied().collect();
        for (p, o) in from {
            let e = merged.entry(p).or_insert(o);
            *e = (*e).min(o);
        }
        l.scan_from = merged.into_iter().collect();
    }
    // Lineages of a previous, larger parallelism that left no snapshot here are still
    // fenced by the subtask they map to.
    let mut fenced_lineages: Vec<u32> = (0..old_parallelism.max(parallelism))
        .filter(|l| l % parallelism == subtask)
        .collect();
    fenced_lineages.extend(lineages.keys().copied());
    fenced_lineages.sort_unstable();
    fenced_lineages.dedup();
    let slots = old_pool.max(pool).max(1);
    let fence = fenced_lineages
        .iter()
        .flat_map(|&l| (0..slots).map(move |s| transactional_id(prefix, l, s)))
        .collect();
    RecoveryPlan {
        fence,
        lineages: lineages.into_values().collect(),
    }
}

/// What a restore does with one lineage's pending epochs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Pending epochs that the markers show committed: nothing to do.
    pub committed: Vec<u64>,
    /// Pending epochs that did not commit: re-produce these, in this order.
    pub replay: Vec<PendingEpoch>,
}

/// The markers show an epoch committed that is newer than the checkpoint being restored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewerEpochCommitted {
    /// The lineage.
    pub lineage: u32,
    /// The newest committed epoch the markers show.
    pub committed: u64,
    /// The checkpoint being restored.
    pub checkpoint: u64,
}

impl fmt::Display for NewerEpochCommitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the Kafka sink's commit markers show that subtask {} already committed the output \
             of checkpoint {}, newer than checkpoint {} being restored (was a newer checkpoint \
             lost or corrupt, or is an older savepoint being restored?). Resuming would write \
             that output twice. Restore the newest checkpoint, or accept duplicates explicitly \
             with the sink's at-least-once restore option",
            self.lineage, self.committed, self.checkpoint
        )
    }
}

impl std::error::Error for NewerEpochCommitted {}

/// Decides, from the newest committed marker value of a lineage (`None`: no committed
/// marker since the scan start), which pending epochs committed and which to re-produce.
/// Commits happen strictly in epoch order, so every pending epoch up to that value
/// committed and every later one did not.
///
/// ```
/// use weir_kafka::txn::{decide, PendingEpoch};
/// let p = |epoch| PendingEpoch { epoch, slot: 0, token: epoch, records: 1, first_offsets: vec![], marker: (0, 0) };
/// let d = decide(0, &[p(4), p(5)], Some(4), 5, false).unwrap();
/// assert_eq!(d.committed, vec![4]);
/// assert_eq!(d.replay, vec![p(5)]);
/// ```
pub fn decide(
    lineage: u32,
    pending: &[PendingEpoch],
    newest_committed: Option<u64>,
    checkpoint: u64,
    accept_newer: bool,
) -> Result<Decision, NewerEpochCommitted> {
    if let Some(c) = newest_committed
        && c > checkpoint
        && !accept_newer
    {
        return Err(NewerEpochCommitted {
            lineage,
            committed: c,
            checkpoint,
        });
    }
    let (committed, replay): (Vec<_>, Vec<_>) = pending
        .iter()
        .cloned()
        .partition(|p| newest_committed.is_some_and(|c| p.epoch <= c));
    Ok(Decision {
        committed: committed.into_iter().map(|p| p.epoch).collect(),
        replay,
    })
}

/// The header every record of an exactly-once epoch carries: which lineage and transaction
/// (its token) wrote it and its sequence number, so a restore can find the records of an
/// epoch that did not commit. 20 bytes: lineage (u32), token (u64), sequence (u64),
/// big-endian.
pub const TXN_HEADER: &str = "weir.txn";

/// Encodes a [`TXN_HEADER`] value.
pub fn encode_header(lineage: u32, token: u64, seq: u64) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[..4].copy_from_slice(&lineage.to_be_bytes());
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
    lineage: u32,
    token: u64,
    records: Vec<Option<R>>,
    found: u64,
}

impl<R> EpochCollector<R> {
    /// Collects `records` records of `lineage`'s transaction `token`.
    pub fn new(lineage: u32, token: u64, records: u64) -> Self {
        EpochCollector {
            lineage,
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
        if l != self.lineage || e != self.token || s >= self.records.len() as u64 {
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

#[cfg(test)]
mod tests;
