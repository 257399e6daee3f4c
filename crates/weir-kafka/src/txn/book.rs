//! [`TxnBook`]: which transactional producer (slot) an epoch writes with, which epochs are
//! pre-committed and waiting for their checkpoint, and in which order they commit.

use super::snapshot::{
    KnownMarker, PartitionOffset, PendingEpoch, SNAPSHOT_VERSION, SinkIdentity, SinkSnapshot,
};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;

/// A bookkeeping rule was broken; the message says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BookError {
    /// Every slot, up to the largest pool, holds an epoch that is waiting for its
    /// checkpoint.
    PoolExhausted {
        /// The largest pool size.
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
                "all {pool} transactional producers hold epochs waiting for a checkpoint to \
                 complete ({pending:?}): checkpoints are failing, or savepoints were taken one \
                 after another without a checkpoint completing in between (an intermediate \
                 savepoint commits nothing; the next checkpoint commits it); fix the checkpoint \
                 failures, space the savepoints out, or raise the sink's producer pool size"
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

/// The state of one producer slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
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
    subtask: u32,
    pub(crate) slots: Vec<Slot>,
    max_pool: u32,
    open: Option<Open>,
    pending: VecDeque<PendingEpoch>,
    newest_precommitted: Option<u64>,
    /// Per marker partition, the marker of the newest committed epoch and its token.
    last_committed: BTreeMap<i32, (i64, u64)>,
    next_token: u64,
    identity: SinkIdentity,
    lineage_token: u64,
    lineage_tokens: Vec<u64>,
    carried: Vec<KnownMarker>,
}

impl TxnBook {
    /// Bookkeeping for subtask `subtask` with `pool` transactional producers (at least 1).
    pub fn new(subtask: u32, pool: u32) -> Self {
        let pool = pool.max(1);
        TxnBook {
            subtask,
            slots: vec![Slot::Free; pool as usize],
            max_pool: pool,
            open: None,
            pending: VecDeque::new(),
            newest_precommitted: None,
            last_committed: BTreeMap::new(),
            next_token: 0,
            identity: SinkIdentity::default(),
            lineage_token: 0,
            lineage_tokens: Vec::new(),
            carried: Vec::new(),
        }
    }

    /// Tokens of this run's transactions start at `run_id` (pick it at random per run so
    /// tokens of different runs do not collide).
    pub fn with_run_id(mut self, run_id: u64) -> Self {
        self.next_token = run_id;
        self
    }

    /// Lets the pool grow, one slot at a time, up to `max_pool` slots when every slot holds
    /// an epoch waiting for its checkpoint (savepoints in a row). Never below the pool.
    pub fn with_max_pool(mut self, max_pool: u32) -> Self {
        self.max_pool = max_pool.max(self.slots.len() as u32);
        self
    }

    /// The sink this book writes for, the lineage token its markers carry, and every
    /// lineage token of its history (the token is added if missing).
    pub fn with_identity(
        mut self,
        identity: SinkIdentity,
        lineage_token: u64,
        lineage_tokens: &[u64],
    ) -> Self {
        self.identity = identity;
        self.lineage_token = lineage_token;
        let mut all = lineage_tokens.to_vec();
        all.push(lineage_token);
        all.sort_unstable();
        all.dedup();
        self.lineage_tokens = all;
        self
    }

    /// The newest markers a restore knows of (its own and of the subtasks it took over),
    /// kept in every snapshot until this subtask writes newer ones.
    pub fn carry(mut self, known: Vec<KnownMarker>) -> Self {
        self.carried = known;
        self
    }

    /// The lineage token this book's markers carry.
    pub fn lineage_token(&self) -> u64 {
        self.lineage_token
    }

    /// The token of the open transaction, if one is open.
    pub fn open_token(&self) -> Option<u64> {
        self.open.as_ref().map(|o| o.token)
    }

    /// The number of slots now.
    pub fn pool(&self) -> u32 {
        self.slots.len() as u32
    }

    /// The number of slots the pool may grow to.
    pub fn max_pool(&self) -> u32 {
        self.max_pool
    }

    /// The slot of the open transaction, if one is open.
    pub fn open_slot(&self) -> Option<u32> {
        self.open.as_ref().map(|o| o.slot)
    }

    /// Records written in the open transaction.
    pub fn open_records(&self) -> u64 {
        self.open.as_ref().map_or(0, |o| o.records)
    }

    /// Opens a transaction for a new epoch and returns its slot: the lowest free one, or a
    /// new slot at the end when none is free and the pool may still grow (the caller then
    /// creates its producer). Returns the open slot if a transaction is already open.
    pub fn begin(&mut self) -> Result<u32, BookError> {
        if let Some(o) = &self.open {
            return Ok(o.slot);
        }
        let i = match self.slots.iter().position(|s| *s == Slot::Free) {
            Some(i) => i,
            None if self.pool() < self.max_pool => {
                self.slots.push(Slot::Free);
                self.slots.len() - 1
            }
            None => {
                return Err(BookError::PoolExhausted {
                    pool: self.max_pool,
                    pending: self.pending.iter().map(|p| p.epoch).collect(),
                });
            }
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
    /// [`TxnBook::committed`]; stop at the first failure. Epochs of savepoints and of
    /// failed checkpoints before it are covered too.
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
                self.last_committed
                    .insert(p.marker.0, (p.marker.1, p.token));
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

    /// What the checkpoint keeps (call after [`TxnBook::precommit`]). Its pool is the
    /// largest the pool may grow to: every transactional id a restore must fence.
    pub fn snapshot(&self, parallelism: u32) -> SinkSnapshot {
        SinkSnapshot {
            version: SNAPSHOT_VERSION,
            identity: self.identity.clone(),
            subtask: self.subtask,
            parallelism,
            pool: self.max_pool,
            lineage_token: self.lineage_token,
            lineage_tokens: self.lineage_tokens.clone(),
            pending: self.pending.iter().cloned().collect(),
            known: self.known(),
        }
    }

    /// The carried markers, with this subtask's own newest marker (committed or pending)
    /// in place of an older one of the same key and partition.
    fn known(&self) -> Vec<KnownMarker> {
        let mut known: BTreeMap<(String, i32, String), KnownMarker> = self
            .carried
            .iter()
            .map(|k| ((k.topic.clone(), k.partition, k.key.clone()), k.clone()))
            .collect();
        let own = self
            .last_committed
            .iter()
            .map(|(&p, &(o, t))| ((p, o), t))
            .chain(self.pending.iter().map(|p| (p.marker, p.token)));
        let key = self.identity.marker_key(self.subtask);
        for ((partition, offset), token) in own {
            let k = KnownMarker {
                topic: self.identity.marker_topic.clone(),
                partition,
                key: key.clone(),
                subtask: self.subtask,
                offset,
                token: Some(token),
                copy: 0,
            };
            let e = known
                .entry((k.topic.clone(), partition, key.clone()))
                .or_insert_with(|| k.clone());
            if k.offset >= e.offset {
                *e = k;
            }
        }
        known.into_values().collect()
    }
}
