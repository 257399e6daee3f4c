//! The exactly-once sink's transaction bookkeeping, as sans-IO state machines.
//!
//! Nothing here talks to Kafka: [`TxnBook`] says which transactional producer (slot) an
//! epoch writes with, which epochs are pre-committed and waiting for their checkpoint, and
//! in which order they commit; [`Restore`] says, on restore, which ids to fence, which
//! pending epochs committed and which must be re-produced, and whether the log holds output
//! the restored checkpoint does not cover. The Kafka side lives in `sink.rs`.
//!
//! Vocabulary:
//! - *epoch*: the records a sink subtask writes between two checkpoint barriers; it is named
//!   by the checkpoint whose barrier closes it, and written in one Kafka transaction with a
//!   random *token*. Checkpoint ids are no identity (a savepoint restored into a new
//!   checkpoint directory, or an older savepoint, numbers its checkpoints anew); tokens are.
//! - *writer*: the subtask index that wrote an epoch; commit markers are keyed by it
//!   (`{prefix}/{subtask}`) and its records' headers name it.
//! - *lineage*: the history of one sink's output across restores, rescales and renames,
//!   named by *lineage tokens* made when a sink starts without restored state. Every marker
//!   names its lineage, writer, epoch and token ([`MarkerValue`]).
//! - *slot*: one of a small pool of transactional producers per subtask
//!   (`{prefix}-{subtask}-{slot}`), so the next epoch can write while earlier ones wait for
//!   a checkpoint to complete.

mod book;
mod marker;
mod records;
mod recovery;
mod snapshot;

pub use book::{BookError, TxnBook};
pub use marker::MarkerValue;
pub use records::{EpochCollector, TXN_HEADER, decode_header, encode_header};
pub use recovery::{
    Decision, Incarnation, MarkerPartition, NewerCommit, Recorded, Restore, Scanned, ScannedMarker,
    WriterDecision, WriterRecovery,
};
pub use snapshot::{
    KnownMarker, PartitionOffset, PendingEpoch, Registered, SNAPSHOT_VERSION, SinkIdentity,
    SinkSnapshot, decode_snapshot, encode_snapshot,
};

/// The transactional id of `slot` of subtask `subtask`.
///
/// ```
/// assert_eq!(weir_kafka::txn::transactional_id("sums", 1, 0), "sums-1-0");
/// ```
pub fn transactional_id(prefix: &str, subtask: u32, slot: u32) -> String {
    format!("{prefix}-{subtask}-{slot}")
}

/// The commit-marker key of a subtask.
///
/// ```
/// assert_eq!(weir_kafka::txn::marker_key("sums", 1), "sums/1");
/// ```
pub fn marker_key(prefix: &str, subtask: u32) -> String {
    format!("{prefix}/{subtask}")
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod recovery_tests;
