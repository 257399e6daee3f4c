//! Unaligned checkpoints on the exchange: the priority lane of every channel, the
//! channel state a consumer captures between its snapshot and the barrier of each channel,
//! and the replay of that state on restore (see docs/decisions/0038-unaligned-checkpoints.md).
//!
//! Every channel has a second, unbounded lane next to its bounded data lane. A writer
//! counts the messages it puts on each data lane; an unaligned barrier never waits on a
//! full channel: it goes on the priority lane as `(checkpoint, upto)`, where `upto` is the
//! number of data messages the writer had sent (plus its last, partly filled batch, which
//! it sends next). The consumer counts the data messages it takes; the records of messages
//! up to `upto` that it takes after its own snapshot are the channel's state.

use crate::data::{Data, key_group_range};
use crate::error::{Error, Result};
use crate::exchange::{Msg, Partitioning};
use crate::ids::CheckpointId;
use crate::time::Timestamp;
use crossbeam_channel::{Receiver, Sender};
use serde::{Deserialize, Serialize};
use std::cell::Cell;

/// An unaligned barrier on a channel's priority lane: the checkpoint, and how many data
/// messages of the channel come before it.
pub type PriorityMsg = (CheckpointId, u64);

/// The keyed-state table of a task's first operator under which its channel state is
/// stored in a checkpoint. The runtime takes it out before the operator restores.
pub const CHANNEL_STATE_TABLE: &str = "__weir.channel_state";

thread_local! {
    static UNALIGNED: Cell<bool> = const { Cell::new(false) };
    static BARRIER_TIMEOUT: Cell<Option<std::time::Duration>> = const { Cell::new(None) };
}

/// Makes every [`super::ChannelWriter`] on this thread also send an in-band barrier that
/// has waited `timeout` on a full channel on the channel's priority lane (checkpoints
/// aligned with a timeout, as Flink does); `None` turns it off. The runtime sets it on
/// each task thread. The consumer then takes the barrier from whichever lane it sees
/// first, and ignores the other copy.
///
/// ```
/// use std::time::Duration;
/// weir_core::exchange::set_barrier_timeout(Some(Duration::from_millis(200)));
/// weir_core::exchange::set_barrier_timeout(None); // aligned or unaligned: off
/// ```
pub fn set_barrier_timeout(timeout: Option<std::time::Duration>) {
    BARRIER_TIMEOUT.with(|t| t.set(timeout));
}

pub(super) fn barrier_timeout() -> Option<std::time::Duration> {
    BARRIER_TIMEOUT.with(|t| t.get())
}

/// Runs `f` with every [`super::ChannelWriter`] on this thread sending checkpoint
/// barriers unaligned (on the priority lanes, ahead of buffered records) instead of in
/// band. The runtime wraps the forwarding of an unaligned barrier in it; the flag is
/// restored when `f` returns (or panics).
///
/// ```
/// use weir_core::exchange::with_unaligned_barriers;
/// // Whatever `f` returns comes back; barriers written inside it go on priority lanes.
/// assert_eq!(with_unaligned_barriers(|| 40 + 2), 42);
/// ```
pub fn with_unaligned_barriers<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            UNALIGNED.with(|u| u.set(self.0));
        }
    }
    let _reset = Reset(UNALIGNED.with(|u| u.replace(true)));
    f()
}

pub(super) fn unaligned_barriers() -> bool {
    UNALIGNED.with(|u| u.get())
}

/// The consumer end of one channel: its data lane and its priority lane.
pub struct ChannelEnd<T> {
    pub(super) data: Receiver<Msg<T>>,
    pub(super) priority: Receiver<PriorityMsg>,
    /// The consumer end of the channel's in-flight budget: every batch taken off the data
    /// lane is reported to it, whoever takes it (delivery, or a drain for channel state).
    pub(super) budget: super::BudgetConsumer,
}

impl<T> ChannelEnd<T> {
    /// The data lane.
    pub fn data(&self) -> &Receiver<Msg<T>> {
        &self.data
    }

    /// The consumer end of the channel's in-flight budget: whoever takes a batch off
    /// [`ChannelEnd::data`] reports it here.
    pub fn budget(&self) -> &super::BudgetConsumer {
        &self.budget
    }
}

/// Hands unaligned barriers that arrive from another process to a channel's priority lane
/// (a cluster worker calls it as soon as the frame arrives, ahead of the data frames
/// still waiting to be delivered).
#[derive(Clone)]
pub struct PriorityInlet(pub(super) Sender<PriorityMsg>);

impl PriorityInlet {
    /// Decodes a priority message (as [`super::LinkReader::next`] encoded it) and puts it
    /// on the lane; false when the bytes are not a priority message.
    pub fn deliver(&self, bytes: &[u8]) -> Result<bool> {
        match decode_priority(bytes) {
            Some(p) => {
                let _ = self.0.send(p);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

pub(super) const TAG_PRIORITY: u8 = 6;

pub(super) fn encode_priority(p: PriorityMsg, buf: &mut Vec<u8>) {
    buf.push(TAG_PRIORITY);
    buf.extend_from_slice(&p.0.0.to_le_bytes());
    buf.extend_from_slice(&p.1.to_le_bytes());
}

/// True when an encoded channel message is an unaligned barrier.
///
/// ```
/// assert!(!weir_core::exchange::is_priority(&[0]));
/// assert!(!weir_core::exchange::is_priority(&[]));
/// ```
pub fn is_priority(bytes: &[u8]) -> bool {
    bytes.first() == Some(&TAG_PRIORITY)
}

pub(super) fn decode_priority(bytes: &[u8]) -> Option<PriorityMsg> {
    let (&tag, rest) = bytes.split_first()?;
    if tag != TAG_PRIORITY || rest.len() != 16 {
        return None;
    }
    let id = u64::from_le_bytes(rest[..8].try_into().ok()?);
    let upto = u64::from_le_bytes(rest[8..].try_into().ok()?);
    Some((CheckpointId(id), upto))
}

/// What a consumer collects of one channel for one checkpoint.
#[derive(Default)]
pub(super) struct Capture {
    /// Data messages before the barrier, when known.
    pub upto: Option<u64>,
    /// The barrier comes in band on this channel (an aligned checkpoint that went on
    /// unaligned): drain up to it.
    pub in_band: Option<CheckpointId>,
    /// The encoded batches taken after the snapshot and before the barrier, in order,
    /// with the number of the message each came in.
    pub batches: Vec<(u64, Vec<u8>)>,
}

/// One channel's state as stored in a checkpoint.
#[derive(Serialize, Deserialize)]
struct Blob {
    gate: u32,
    /// The channel's position in the gate (its producer's index among the gate's channels).
    channel: u32,
    /// The consumer subtask, and its operator's parallelism, when it was captured.
    consumer: u32,
    parallelism: u32,
    /// Encoded `Vec<(T, Timestamp)>` batches.
    batches: Vec<Vec<u8>>,
}

/// Encodes the captured batches of one channel as an entry of [`CHANNEL_STATE_TABLE`].
pub(super) fn encode_blob(
    gate: usize,
    channel: usize,
    consumer: usize,
    parallelism: usize,
    batches: Vec<(u64, Vec<u8>)>,
) -> Result<(u32, Vec<u8>)> {
    let blob = Blob {
        gate: gate as u32,
        channel: channel as u32,
        consumer: consumer as u32,
        parallelism: parallelism as u32,
        batches: batches.into_iter().map(|(_, b)| b).collect(),
    };
    Ok((consumer as u32, crate::codec::encode(&blob)?))
}

/// Where a restored subtask's input comes from: the records of the channel state of
/// `gate`, as the edge's partitioning assigns them to subtask `subtask` of `parallelism`,
/// in their original order per channel.
pub(super) fn records_to_replay<T: Data>(
    partitioning: &Partitioning<T>,
    max_parallelism: usize,
    blobs: &[(u32, Vec<u8>)],
    gate: usize,
    subtask: usize,
    parallelism: usize,
) -> Result<Vec<(T, Timestamp)>> {
    let mut decoded: Vec<Blob> = Vec::new();
    for (_, bytes) in blobs {
        let b: Blob = crate::codec::decode(bytes)?;
        if b.gate as usize == gate {
            decoded.push(b);
        }
    }
    decoded.sort_by_key(|b| (b.consumer, b.channel));
    let rescaled = decoded
        .iter()
        .any(|b| b.parallelism as usize != parallelism);
    let mut out = Vec::new();
    for b in decoded {
        let consumer = b.consumer as usize;
        let mine = match partitioning {
            // Each record goes to the subtask that owns its key group now.
            Partitioning::Hash(_) => true,
            // Every subtask had its own copy; after a rescale each takes old subtask 0's,
            // as it takes old subtask 0's broadcast state.
            Partitioning::Broadcast => consumer == if rescaled { 0 } else { subtask },
            // Any subtask may process them: old subtask i's go to new subtask i mod p.
            Partitioning::Forward | Partitioning::Rebalance => consumer % parallelism == subtask,
        };
        if !mine {
            continue;
        }
        for batch in &b.batches {
            let records: Vec<(T, Timestamp)> = crate::codec::decode(batch)?;
            match partitioning {
                Partitioning::Hash(f) => {
                    let range = key_group_range(subtask, max_parallelism, parallelism);
                    out.extend(records.into_iter().filter(|(v, _)| {
                        range.contains(&((f(v) % max_parallelism as u64) as u32))
                    }));
                }
                _ => out.extend(records),
            }
        }
    }
    Ok(out)
}

/// The error for channel state that does not decode (a checkpoint of another job version).
pub(super) fn bad_state(e: Error) -> Error {
    Error::Config(format!(
        "the checkpoint's in-flight records (channel state of an unaligned checkpoint) do not decode as this job's record type: {e}; restore it with the job version that took it, or start without it"
    ))
}
