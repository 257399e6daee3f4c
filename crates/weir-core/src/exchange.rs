//! Data exchange between subtasks in one process: typed bounded channels of record
//! batches, the partitioners that pick a channel, and the input gates that read them.
//!
//! Owns [`Msg`], [`Partitioning`], [`ChannelWriter`] and [`InputGate`]. The runtime sees
//! these only through the type-erased [`Exchange`] trait, created by the DSL where the
//! element type is known. Bounded channels are the backpressure: a full channel blocks
//! the writer.

use crate::data::{Data, key_hash, subtask_for_key_group};
use crate::error::{Error, Result};
use crate::ids::CheckpointId;
use crate::output::{Control, LatencyMarker, Output};
use crate::time::Timestamp;
use crossbeam_channel::{Receiver, SelectedOperation, Sender};
use std::any::Any;
use std::cell::RefCell;
use std::sync::Arc;

mod budget;
mod bytes;
pub use budget::{
    BudgetClosed, BudgetConsumer, BudgetPolicy, ChannelBudget, MIN_IN_FLIGHT_RECORDS,
    RECOMPUTE_INTERVAL, RateMeter,
};
pub use bytes::{Metered, record_size};

/// What a consumer's receivers are, type-erased in [`ChannelSet::readers`]: each channel's
/// receiver with the consumer end of its budget.
pub type Readers<T> = Vec<(Receiver<Msg<T>>, BudgetConsumer)>;

/// One producer's senders, each with its channel's budget.
type Writers<T> = Vec<(Sender<Msg<T>>, Arc<ChannelBudget>)>;

/// What travels on a channel between two subtasks.
#[derive(Debug)]
pub enum Msg<T> {
    /// A batch of records with their timestamps.
    Batch(Vec<(T, Timestamp)>),
    /// The sender's watermark advanced.
    Watermark(Timestamp),
    /// The sender became idle (true) or active (false).
    Idle(bool),
    /// A checkpoint barrier.
    Barrier(CheckpointId),
    /// The sender has no more data.
    End,
    /// A latency marker, sent to one channel (in turn) after the records before it.
    LatencyMarker(LatencyMarker),
}

/// How records are distributed from the subtasks of one operator to the next.
pub enum Partitioning<T> {
    /// Subtask i sends to subtask i (equal parallelism); chained when possible.
    Forward,
    /// Round-robin over all downstream subtasks.
    Rebalance,
    /// Every record to every downstream subtask.
    Broadcast,
    /// By key group of the key whose stable hash the function returns.
    Hash(Arc<dyn Fn(&T) -> u64 + Send + Sync>),
}

impl<T> Clone for Partitioning<T> {
    fn clone(&self) -> Self {
        match self {
            Partitioning::Forward => Partitioning::Forward,
            Partitioning::Rebalance => Partitioning::Rebalance,
            Partitioning::Broadcast => Partitioning::Broadcast,
            Partitioning::Hash(f) => Partitioning::Hash(f.clone()),
        }
    }
}

/// The kind of a partitioning, without its types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionKind {
    /// See [`Partitioning::Forward`].
    Forward,
    /// See [`Partitioning::Rebalance`].
    Rebalance,
    /// See [`Partitioning::Broadcast`].
    Broadcast,
    /// See [`Partitioning::Hash`].
    Hash,
}

/// Sizes of the exchange, set per job.
#[derive(Debug, Clone, Copy)]
pub struct ExchangeConfig {
    /// Records per batch before a batch is sent.
    pub batch_size: usize,
    /// Batches a channel holds before the writer blocks.
    pub channel_capacity: usize,
    /// A partly filled batch is sent after this many milliseconds.
    pub flush_interval_ms: i64,
    /// Number of key groups.
    pub max_parallelism: usize,
    /// The time of data a channel holds: its writer waits once the channel holds the
    /// records its consumer takes in this long (`None`: only `channel_capacity` bounds it).
    pub in_flight_target: Option<std::time::Duration>,
}

/// One producer's writers and one consumer's readers, type-erased for the runtime.
pub struct ChannelSet {
    /// Per producer subtask: its writer, a `Box<dyn Output<T> + Send>` in a `Box<dyn Any + Send>`.
    pub writers: Vec<Box<dyn Any + Send>>,
    /// Per consumer subtask: its receivers (one per connected producer), type-erased.
    pub readers: Vec<Box<dyn Any + Send>>,
    /// Both ends of every channel as bytes, for carrying channels across processes; filled
    /// only by [`Exchange::linked_channels`]. A link holds its channel open while it lives,
    /// so drop the links a process does not bridge.
    pub links: Vec<Link>,
}

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
}

/// What [`LinkReader::next`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkRead {
    /// A message was encoded into the buffer; `end` when it was the end of the channel.
    Msg {
        /// The message was [`Msg::End`].
        end: bool,
    },
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
fn encode_msg<T: Data>(msg: &Msg<T>, buf: &mut Vec<u8>) -> Result<()> {
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

fn decode_msg<T: Data>(bytes: &[u8]) -> Result<Msg<T>> {
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

struct TypedLinkReader<T>(Receiver<Msg<T>>, BudgetConsumer, usize);

impl<T: Data> LinkReader for TypedLinkReader<T> {
    fn next(&mut self, timeout: std::time::Duration, buf: &mut Vec<u8>) -> Result<LinkRead> {
        match self.0.recv_timeout(timeout) {
            Ok(msg) => {
                self.2 = batch_len(&msg);
                self.1.consumed(self.2);
                encode_msg(&msg, buf)?;
                Ok(LinkRead::Msg {
                    end: matches!(msg, Msg::End),
                })
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Ok(LinkRead::Timeout),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Ok(LinkRead::Disconnected),
        }
    }

    fn last_records(&self) -> usize {
        self.2
    }
}

/// Records in a message (0 for control messages).
fn batch_len<T>(msg: &Msg<T>) -> usize {
    match msg {
        Msg::Batch(b) => b.len(),
        _ => 0,
    }
}

struct TypedLinkWriter<T>(Sender<Msg<T>>, Arc<ChannelBudget>, usize);

impl<T: Data> LinkWriter for TypedLinkWriter<T> {
    fn write(&mut self, bytes: &[u8]) -> Result<bool> {
        let msg = decode_msg::<T>(bytes)?;
        let end = matches!(msg, Msg::End);
        self.2 = batch_len(&msg);
        let closed = || Error::ChannelClosed("downstream subtask stopped".into());
        if self.2 > 0 {
            self.1.acquire(self.2).map_err(|_| closed())?;
        }
        self.0.send(msg).map_err(|_| closed())?;
        Ok(end)
    }

    fn last_records(&self) -> usize {
        self.2
    }

    fn budget(&self) -> Option<Arc<ChannelBudget>> {
        Some(self.1.clone())
    }
}

/// The type-erased face of one edge of the graph, created where its element type is known.
pub trait Exchange: Send + Sync {
    /// The partitioning kind.
    fn kind(&self) -> PartitionKind;
    /// Creates the channels between `producers` and `consumers` subtasks.
    fn channels(&self, producers: usize, consumers: usize, cfg: ExchangeConfig) -> ChannelSet;
    /// Like [`Exchange::channels`], and also returns both ends of every channel as a
    /// [`Link`], for a cluster worker to carry some of them over the network.
    fn linked_channels(
        &self,
        producers: usize,
        consumers: usize,
        cfg: ExchangeConfig,
    ) -> ChannelSet;
    /// Binds a consumer's receivers to the operator input (`Box<dyn Output<T>>` in a
    /// `Box<dyn Any>`) it feeds.
    fn bind(&self, readers: Box<dyn Any + Send>, input: Box<dyn Any>)
    -> Result<Box<dyn InputGate>>;
    /// Like [`Exchange::bind`], and the gate adds the encoded size of the records it
    /// delivers (see [`record_size`]) to `bytes`.
    fn bind_metered(
        &self,
        readers: Box<dyn Any + Send>,
        input: Box<dyn Any>,
        bytes: Arc<std::sync::atomic::AtomicU64>,
    ) -> Result<Box<dyn InputGate>> {
        let _ = bytes;
        self.bind(readers, input)
    }
}

/// A typed edge.
pub struct TypedExchange<T> {
    /// The partitioning of the edge.
    pub partitioning: Partitioning<T>,
}

impl<T: Data> Exchange for TypedExchange<T> {
    fn kind(&self) -> PartitionKind {
        match self.partitioning {
            Partitioning::Forward => PartitionKind::Forward,
            Partitioning::Rebalance => PartitionKind::Rebalance,
            Partitioning::Broadcast => PartitionKind::Broadcast,
            Partitioning::Hash(_) => PartitionKind::Hash,
        }
    }

    fn channels(&self, producers: usize, consumers: usize, cfg: ExchangeConfig) -> ChannelSet {
        self.make(producers, consumers, cfg, false)
    }

    fn linked_channels(
        &self,
        producers: usize,
        consumers: usize,
        cfg: ExchangeConfig,
    ) -> ChannelSet {
        self.make(producers, consumers, cfg, true)
    }

    fn bind(
        &self,
        readers: Box<dyn Any + Send>,
        input: Box<dyn Any>,
    ) -> Result<Box<dyn InputGate>> {
        self.gate(readers, input, None)
    }

    fn bind_metered(
        &self,
        readers: Box<dyn Any + Send>,
        input: Box<dyn Any>,
        bytes: Arc<std::sync::atomic::AtomicU64>,
    ) -> Result<Box<dyn InputGate>> {
        self.gate(readers, input, Some(bytes))
    }
}

impl<T: Data> TypedExchange<T> {
    fn gate(
        &self,
        readers: Box<dyn Any + Send>,
        input: Box<dyn Any>,
        bytes: Option<Arc<std::sync::atomic::AtomicU64>>,
    ) -> Result<Box<dyn InputGate>> {
        let (receivers, consumers) = readers
            .downcast::<Readers<T>>()
            .map_err(|_| Error::Config("internal: receiver type mismatch".into()))?
            .into_iter()
            .unzip();
        let input = *input
            .downcast::<Box<dyn Output<T>>>()
            .map_err(|_| Error::Config("internal: operator input type mismatch".into()))?;
        Ok(Box::new(TypedGate {
            receivers,
            consumers,
            input: RefCell::new(input),
            bytes,
        }))
    }
}

impl<T: Data> TypedExchange<T> {
    fn make(
        &self,
        producers: usize,
        consumers: usize,
        cfg: ExchangeConfig,
        links: bool,
    ) -> ChannelSet {
        let mut link_list = Vec::new();
        let forward = matches!(self.partitioning, Partitioning::Forward) && producers == consumers;
        let mut senders: Vec<Writers<T>> = (0..producers).map(|_| Vec::new()).collect();
        let mut receivers: Vec<Readers<T>> = (0..consumers).map(|_| Vec::new()).collect();
        let policy = BudgetPolicy::new(&cfg);
        for (p, row) in senders.iter_mut().enumerate() {
            for (c, rx) in receivers.iter_mut().enumerate() {
                if forward && p != c {
                    continue;
                }
                let (s, r) = crossbeam_channel::bounded(cfg.channel_capacity);
                let budget = ChannelBudget::new(policy);
                if links {
                    let consumer = BudgetConsumer::new(budget.clone());
                    link_list.push(Link {
                        producer: p,
                        consumer: c,
                        reader: Box::new(TypedLinkReader(r.clone(), consumer, 0)),
                        writer: Box::new(TypedLinkWriter(s.clone(), budget.clone(), 0)),
                    });
                }
                rx.push((r, BudgetConsumer::new(budget.clone())));
                row.push((s, budget));
            }
        }
        let partitioning = if forward {
            Partitioning::Forward
        } else if matches!(self.partitioning, Partitioning::Forward) {
            Partitioning::Rebalance
        } else {
            self.partitioning.clone()
        };
        let writers = senders
            .into_iter()
            .enumerate()
            .map(|(p, s)| {
                let w: Box<dyn Output<T> + Send> =
                    Box::new(ChannelWriter::new(s, partitioning.clone(), cfg, p));
                Box::new(w) as Box<dyn Any + Send>
            })
            .collect();
        let readers = receivers
            .into_iter()
            .map(|r| Box::new(r) as Box<dyn Any + Send>)
            .collect();
        ChannelSet {
            writers,
            readers,
            links: link_list,
        }
    }
}

thread_local! {
    /// Where the current thread's time blocked on full output channels is added up.
    static BACKPRESSURED_NS: std::cell::RefCell<Option<Arc<std::sync::atomic::AtomicU64>>> =
        const { std::cell::RefCell::new(None) };
}

/// Makes every [`ChannelWriter`] used on this thread add the time it waits on a full
/// channel (in nanoseconds) to `cell`; `None` stops the accounting. The runtime sets it on
/// each task thread: a subtask's backpressured time.
pub fn account_backpressure(cell: Option<Arc<std::sync::atomic::AtomicU64>>) {
    BACKPRESSURED_NS.with(|c| *c.borrow_mut() = cell);
}

fn add_backpressured(waited: std::time::Duration) {
    BACKPRESSURED_NS.with(|c| {
        if let Some(cell) = &*c.borrow() {
            cell.fetch_add(
                waited.as_nanos() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
    });
}

/// Writes records into the channels of one producer subtask, batching per target.
pub struct ChannelWriter<T> {
    senders: Vec<Sender<Msg<T>>>,
    budgets: Vec<Arc<ChannelBudget>>,
    buffers: Vec<Vec<(T, Timestamp)>>,
    partitioning: Partitioning<T>,
    cfg: ExchangeConfig,
    next: usize,
    /// The channel the next latency marker goes to.
    next_marker: usize,
    last_flush_ms: i64,
}

impl<T: Data> ChannelWriter<T> {
    fn new(
        channels: Writers<T>,
        partitioning: Partitioning<T>,
        cfg: ExchangeConfig,
        producer: usize,
    ) -> Self {
        let n = channels.len();
        let (senders, budgets) = channels.into_iter().unzip();
        ChannelWriter {
            budgets,
            buffers: (0..n).map(|_| Vec::with_capacity(cfg.batch_size)).collect(),
            senders,
            partitioning,
            cfg,
            next: producer % n.max(1),
            next_marker: producer % n.max(1),
            last_flush_ms: 0,
        }
    }

    fn send(&self, target: usize, msg: Msg<T>) -> Result<()> {
        let closed = || Error::ChannelClosed("downstream subtask stopped".into());
        if let Msg::Batch(b) = &msg {
            // The in-flight budget: waiting for it is backpressure as a full channel is.
            let waited = self.budgets[target]
                .acquire(b.len())
                .map_err(|_| closed())?;
            if let Some(waited) = waited {
                add_backpressured(waited);
            }
        }
        match self.senders[target].try_send(msg) {
            Ok(()) => Ok(()),
            Err(crossbeam_channel::TrySendError::Full(msg)) => {
                // Backpressure: the channel is full and this subtask waits for its consumer.
                let started = std::time::Instant::now();
                let r = self.senders[target].send(msg).map_err(|_| closed());
                add_backpressured(started.elapsed());
                r
            }
            Err(crossbeam_channel::TrySendError::Disconnected(_)) => Err(closed()),
        }
    }

    fn flush(&mut self, target: usize) -> Result<()> {
        if self.buffers[target].is_empty() {
            return Ok(());
        }
        let batch = std::mem::replace(
            &mut self.buffers[target],
            Vec::with_capacity(self.cfg.batch_size),
        );
        self.send(target, Msg::Batch(batch))
    }

    fn flush_all(&mut self) -> Result<()> {
        for t in 0..self.senders.len() {
            self.flush(t)?;
        }
        Ok(())
    }

    fn push(&mut self, target: usize, value: T, ts: Timestamp) -> Result<()> {
        let b = &mut self.buffers[target];
        b.push((value, ts));
        if b.len() >= self.cfg.batch_size {
            self.flush(target)?;
        }
        Ok(())
    }

    fn broadcast_msg(&mut self, make: impl Fn() -> Msg<T>) -> Result<()> {
        self.flush_all()?;
        for t in 0..self.senders.len() {
            self.send(t, make())?;
        }
        Ok(())
    }
}

impl<T: Data> Output<T> for ChannelWriter<T> {
    #[inline]
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        match &self.partitioning {
            Partitioning::Forward => self.push(0, value, ts),
            Partitioning::Rebalance => {
                let t = self.next;
                self.next = (t + 1) % self.senders.len();
                self.push(t, value, ts)
            }
            Partitioning::Broadcast => {
                let n = self.senders.len();
                for t in 0..n - 1 {
                    self.push(t, value.clone(), ts)?;
                }
                self.push(n - 1, value, ts)
            }
            Partitioning::Hash(f) => {
                let kg = (f(&value) % self.cfg.max_parallelism as u64) as u32;
                let t = subtask_for_key_group(
                    crate::ids::KeyGroup(kg),
                    self.cfg.max_parallelism,
                    self.senders.len(),
                );
                self.push(t, value, ts)
            }
        }
    }

    fn control(&mut self, event: Control) -> Result<()> {
        match event {
            Control::Watermark(w) => self.broadcast_msg(|| Msg::Watermark(w)),
            Control::Idle(i) => self.broadcast_msg(|| Msg::Idle(i)),
            Control::End => self.broadcast_msg(|| Msg::End),
            Control::Barrier(id) => self.broadcast_msg(|| Msg::Barrier(id)),
            Control::LatencyMarker(m) => {
                // As Flink: to one channel, in turn, behind the records buffered for it.
                let t = self.next_marker;
                self.next_marker = (t + 1) % self.senders.len();
                self.flush(t)?;
                self.send(t, Msg::LatencyMarker(m))
            }
            Control::Tick(now) => {
                if now - self.last_flush_ms >= self.cfg.flush_interval_ms {
                    self.last_flush_ms = now;
                    self.flush_all()?;
                }
                Ok(())
            }
        }
    }
}

/// Helper for DSL code: the hash partitioner of a key extractor.
pub fn hash_partitioner<T: 'static, K: std::hash::Hash + 'static>(
    key_fn: Arc<dyn Fn(&T) -> K + Send + Sync>,
) -> Arc<dyn Fn(&T) -> u64 + Send + Sync> {
    Arc::new(move |v: &T| key_hash(&key_fn(v)))
}

/// What reading one message from a channel produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateEvent {
    /// A batch of this many records was delivered to the operator.
    Records(usize),
    /// A watermark arrived.
    Watermark(Timestamp),
    /// The channel became idle or active.
    Idle(bool),
    /// A checkpoint barrier arrived.
    Barrier(CheckpointId),
    /// The channel ended.
    End,
    /// A latency marker arrived.
    LatencyMarker(LatencyMarker),
    /// The sender disappeared without ending (it failed).
    Disconnected,
}

/// The consumer side of one logical input of a subtask: its channels and the operator
/// input they feed. Methods take `&self` so a select can borrow the receivers.
pub trait InputGate {
    /// Number of channels.
    fn len(&self) -> usize;
    /// True when the gate has no channel.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Adds channel `ch`'s receiver to a select; returns the select index.
    fn select<'a>(&'a self, sel: &mut crossbeam_channel::Select<'a>, ch: usize) -> usize;
    /// Completes a selected receive on channel `ch` and delivers its records.
    fn complete(&self, ch: usize, op: SelectedOperation<'_>) -> Result<GateEvent>;
    /// Sends a control event into the operator input (single-input operators only).
    fn control(&self, event: Control) -> Result<()>;
    /// The in-flight budgets of the gate's channels (records queued, for the metrics).
    fn budgets(&self) -> Vec<Arc<ChannelBudget>> {
        Vec::new()
    }
}

struct TypedGate<T> {
    receivers: Vec<Receiver<Msg<T>>>,
    /// The consumer end of each channel's in-flight budget.
    consumers: Vec<BudgetConsumer>,
    input: RefCell<Box<dyn Output<T>>>,
    /// Where the encoded size of delivered records is added (the REST API is on).
    bytes: Option<Arc<std::sync::atomic::AtomicU64>>,
}

impl<T: Data> InputGate for TypedGate<T> {
    fn len(&self) -> usize {
        self.receivers.len()
    }

    fn select<'a>(&'a self, sel: &mut crossbeam_channel::Select<'a>, ch: usize) -> usize {
        sel.recv(&self.receivers[ch])
    }

    fn complete(&self, ch: usize, op: SelectedOperation<'_>) -> Result<GateEvent> {
        match op.recv(&self.receivers[ch]) {
            Ok(Msg::Batch(batch)) => {
                let n = batch.len();
                self.consumers[ch].consumed(n);
                if let Some(bytes) = &self.bytes {
                    let size: usize = batch.iter().map(|(v, ts)| record_size(v, *ts)).sum();
                    bytes.fetch_add(size as u64, std::sync::atomic::Ordering::Relaxed);
                }
                let mut input = self.input.borrow_mut();
                for (v, ts) in batch {
                    input.record(v, ts)?;
                }
                Ok(GateEvent::Records(n))
            }
            Ok(Msg::Watermark(w)) => Ok(GateEvent::Watermark(w)),
            Ok(Msg::Idle(i)) => Ok(GateEvent::Idle(i)),
            Ok(Msg::End) => Ok(GateEvent::End),
            Ok(Msg::Barrier(id)) => Ok(GateEvent::Barrier(id)),
            Ok(Msg::LatencyMarker(m)) => Ok(GateEvent::LatencyMarker(m)),
            Err(_) => Ok(GateEvent::Disconnected),
        }
    }

    fn control(&self, event: Control) -> Result<()> {
        self.input.borrow_mut().control(event)
    }

    fn budgets(&self) -> Vec<Arc<ChannelBudget>> {
        self.consumers.iter().map(|c| c.budget().clone()).collect()
    }
}

#[cfg(test)]
mod tests;
