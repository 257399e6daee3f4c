//! The two ends of a channel that speak bytes, for a cluster worker to carry the channel
//! over the network: [`Link`], the producer end ([`LinkReader`]) that encodes what the
//! producer writes, the consumer end ([`LinkWriter`]) that decodes it into the consumer's
//! channel, and the encoding of a channel message.

use super::unaligned::{TAG_PRIORITY, encode_priority};
use super::{BudgetConsumer, ChannelBudget, Msg, PriorityInlet, PriorityMsg, batch_len};
use crate::data::Data;
use crate::error::{Error, Result};
use crate::ids::CheckpointId;
use crate::output::LatencyMarker;
use crossbeam_channel::{Receiver, Sender};
use std::sync::Arc;

/// One producer→consumer channel of an edge with both ends speaking bytes: a cluster
/// worker bridges the producer end ([`LinkReader`]) to a TCP connection when the consumer
/// runs elsewhere, and feeds frames from the network into the consumer end
/// ([`LinkWriter`]) when the producer runs elsewhere.
pub struct Link {
    /// Producer subtask.
    pub producer: usize,
    /// Consumer subtask.
    pub consumer: usize,
    /// Reads and encodes what the producer writes.
    pub reader: Box<dyn LinkReader>,
    /// Decodes messages and hands them to the consumer.
    pub writer: Box<dyn LinkWriter>,
    /// Hands unaligned barriers to the consumer's priority lane, ahead of its data.
    pub priority: PriorityInlet,
}

/// What [`LinkReader::next`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkRead {
    /// A message was encoded into the buffer; `end` when it was the end of the channel.
    Msg {
        /// The message was [`Msg::End`].
        end: bool,
    },
    /// An unaligned barrier was encoded into the buffer: it overtakes the data, so it is
    /// sent without waiting for (or taking) a credit.
    Priority,
    /// Nothing arrived within the timeout.
    Timeout,
    /// The producer is gone without ending the channel (it failed).
    Disconnected,
}

/// The producer end of a channel, encoding messages to bytes.
pub trait LinkReader: Send {
    /// Waits up to `timeout` for the next message and appends its encoding to `buf` (so a
    /// caller can put a header in front without copying the message).
    fn next(&mut self, timeout: std::time::Duration, buf: &mut Vec<u8>) -> Result<LinkRead>;
    /// Appends the encoding of an unaligned barrier waiting on the priority lane, if one
    /// is (called while a data message waits for a credit); true when it did.
    fn next_priority(&mut self, buf: &mut Vec<u8>) -> bool {
        let _ = buf;
        false
    }
    /// Records in the last message [`LinkReader::next`] encoded (0: not a batch).
    fn last_records(&self) -> usize {
        0
    }
}

/// The consumer end of a channel, decoding bytes into messages.
pub trait LinkWriter: Send {
    /// Decodes one message from `bytes` and sends it into the channel, blocking while the
    /// channel is full. Returns true when the message ended the channel.
    fn write(&mut self, bytes: &[u8]) -> Result<bool>;
    /// Records in the last message [`LinkWriter::write`] delivered (0: not a batch).
    fn last_records(&self) -> usize {
        0
    }
    /// The budget of the channel this end writes into, for a link's flow control.
    fn budget(&self) -> Option<Arc<ChannelBudget>> {
        None
    }
}

const TAG_BATCH: u8 = 0;
const TAG_WATERMARK: u8 = 1;
const TAG_IDLE: u8 = 2;
const TAG_BARRIER: u8 = 3;
const TAG_END: u8 = 4;
const TAG_LATENCY: u8 = 5;

/// Appends a channel message: a tag byte, then the batch (codec) or the control value.
pub(super) fn encode_msg<T: Data>(msg: &Msg<T>, buf: &mut Vec<u8>) -> Result<()> {
    match msg {
        Msg::Batch(b) => {
            buf.push(TAG_BATCH);
            crate::codec::encode_into(b, buf)?;
        }
        Msg::Watermark(w) => {
            buf.push(TAG_WATERMARK);
            buf.extend_from_slice(&w.to_le_bytes());
        }
        Msg::Idle(i) => buf.extend_from_slice(&[TAG_IDLE, u8::from(*i)]),
        Msg::Barrier(id) => {
            buf.push(TAG_BARRIER);
            buf.extend_from_slice(&id.0.to_le_bytes());
        }
        Msg::End => buf.push(TAG_END),
        Msg::LatencyMarker(m) => {
            buf.push(TAG_LATENCY);
            buf.extend_from_slice(&m.created_us.to_le_bytes());
            buf.extend_from_slice(&m.source.to_le_bytes());
            buf.extend_from_slice(&m.subtask.to_le_bytes());
        }
    }
    Ok(())
}

pub(super) fn decode_msg<T: Data>(bytes: &[u8]) -> Result<Msg<T>> {
    let bad = || {
        Error::Codec(format!(
            "malformed channel message of {} bytes",
            bytes.len()
        ))
    };
    let (&tag, rest) = bytes.split_first().ok_or_else(bad)?;
    let word = || -> Result<[u8; 8]> { rest.try_into().map_err(|_| bad()) };
    Ok(match tag {
        TAG_BATCH => Msg::Batch(crate::codec::decode(rest)?),
        TAG_WATERMARK => Msg::Watermark(i64::from_le_bytes(word()?)),
        TAG_IDLE if rest.len() == 1 => Msg::Idle(rest[0] != 0),
        TAG_BARRIER => Msg::Barrier(CheckpointId(u64::from_le_bytes(word()?))),
        TAG_END if rest.is_empty() => Msg::End,
        TAG_PRIORITY => return Err(bad()),
        TAG_LATENCY if rest.len() == 16 => {
            let (created, ids) = rest.split_at(8);
            let u32_at =
                |i: usize| u32::from_le_bytes([ids[i], ids[i + 1], ids[i + 2], ids[i + 3]]);
            Msg::LatencyMarker(LatencyMarker {
                created_us: i64::from_le_bytes(created.try_into().map_err(|_| bad())?),
                source: u32_at(0),
                subtask: u32_at(4),
            })
        }
        _ => return Err(bad()),
    })
}

/// Reads a channel's two lanes for the network. A data message is sent only after the
/// priority lane was seen empty once it was taken: an unaligned barrier put on the lane
/// before that message was written always reaches the other side first.
pub(super) struct TypedLinkReader<T> {
    pub(super) data: Receiver<Msg<T>>,
    pub(super) priority: Receiver<PriorityMsg>,
    pub(super) held: Option<Msg<T>>,
    /// The producer still holds the priority lane (it is gone once it ended).
    pub(super) priority_open: bool,
    /// The consumer end of the channel's in-flight budget: what this end takes off the
    /// channel leaves it.
    pub(super) budget: BudgetConsumer,
    /// Records in the last message encoded (0 for anything but a batch).
    pub(super) last: usize,
}

impl<T: Data> LinkReader for TypedLinkReader<T> {
    fn next(&mut self, timeout: std::time::Duration, buf: &mut Vec<u8>) -> Result<LinkRead> {
        self.last = 0;
        if self.next_priority(buf) {
            return Ok(LinkRead::Priority);
        }
        let msg = match self.held.take() {
            Some(m) => m,
            None if !self.priority_open => match self.data.recv_timeout(timeout) {
                Ok(m) => {
                    self.budget.consumed(batch_len(&m));
                    m
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => return Ok(LinkRead::Timeout),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Ok(LinkRead::Disconnected);
                }
            },
            None => {
                let mut sel = crossbeam_channel::Select::new();
                let d = sel.recv(&self.data);
                let p = sel.recv(&self.priority);
                match sel.select_timeout(timeout) {
                    Ok(op) if op.index() == d => match op.recv(&self.data) {
                        Ok(m) => {
                            self.budget.consumed(batch_len(&m));
                            m
                        }
                        Err(_) => return Ok(LinkRead::Disconnected),
                    },
                    Ok(op) => {
                        debug_assert_eq!(op.index(), p);
                        match op.recv(&self.priority) {
                            Ok(pm) => {
                                encode_priority(pm, buf);
                                return Ok(LinkRead::Priority);
                            }
                            Err(_) => {
                                // The producer ended: its data lane tells the rest.
                                self.priority_open = false;
                                return Ok(LinkRead::Timeout);
                            }
                        }
                    }
                    Err(_) => return Ok(LinkRead::Timeout),
                }
            }
        };
        if let Ok(pm) = self.priority.try_recv() {
            self.held = Some(msg);
            encode_priority(pm, buf);
            return Ok(LinkRead::Priority);
        }
        self.last = batch_len(&msg);
        encode_msg(&msg, buf)?;
        Ok(LinkRead::Msg {
            end: matches!(msg, Msg::End),
        })
    }

    fn last_records(&self) -> usize {
        self.last
    }

    fn next_priority(&mut self, buf: &mut Vec<u8>) -> bool {
        match self.priority.try_recv() {
            Ok(pm) => {
                encode_priority(pm, buf);
                true
            }
            Err(_) => false,
        }
    }
}

pub(super) struct TypedLinkWriter<T> {
    pub(super) data: Sender<Msg<T>>,
    pub(super) priority: PriorityInlet,
    /// The in-flight budget of the channel written into.
    pub(super) budget: Arc<ChannelBudget>,
    /// Records in the last message delivered (0 for anything but a batch).
    pub(super) last: usize,
}

impl<T: Data> LinkWriter for TypedLinkWriter<T> {
    fn write(&mut self, bytes: &[u8]) -> Result<bool> {
        self.last = 0;
        if self.priority.deliver(bytes)? {
            return Ok(false);
        }
        let msg = decode_msg::<T>(bytes)?;
        let end = matches!(msg, Msg::End);
        let closed = || Error::ChannelClosed("downstream subtask stopped".into());
        self.last = batch_len(&msg);
        if self.last > 0 {
            self.budget.acquire(self.last).map_err(|_| closed())?;
        }
        self.data.send(msg).map_err(|_| closed())?;
        Ok(end)
    }

    fn last_records(&self) -> usize {
        self.last
    }

    fn budget(&self) -> Option<Arc<ChannelBudget>> {
        Some(self.budget.clone())
    }
}
