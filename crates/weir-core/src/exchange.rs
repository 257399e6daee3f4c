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
use crossbeam_channel::Sender;
use std::any::Any;
use std::cell::RefCell;
use std::sync::Arc;

mod budget;
mod bytes;
pub use budget::{
    BudgetClosed, BudgetConsumer, BudgetPolicy, ChannelBudget, MIN_IN_FLIGHT_RECORDS,
    RECOMPUTE_INTERVAL, RateMeter,
};
mod available;
mod gate;
mod link;
mod unaligned;
mod waiting;
use available::WriterLanes;
pub use available::{clear_outputs, output_available};
pub use bytes::{Metered, record_size};
use gate::TypedGate;
pub use gate::{GateEvent, InputGate};
pub use link::{Link, LinkRead, LinkReader, LinkWriter};
use link::{TypedLinkReader, TypedLinkWriter};
pub use unaligned::{
    CHANNEL_STATE_TABLE, ChannelEnd, PriorityInlet, PriorityMsg, is_priority, set_barrier_timeout,
    with_unaligned_barriers,
};
pub use waiting::pause_delivery_when;

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

/// Records in a message (0 for anything but a batch).
fn batch_len<T>(msg: &Msg<T>) -> usize {
    match msg {
        Msg::Batch(b) => b.len(),
        _ => 0,
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
        let ends = *readers
            .downcast::<Vec<ChannelEnd<T>>>()
            .map_err(|_| Error::Config("internal: receiver type mismatch".into()))?;
        let input = *input
            .downcast::<Box<dyn Output<T>>>()
            .map_err(|_| Error::Config("internal: operator input type mismatch".into()))?;
        let n = ends.len();
        Ok(Box::new(TypedGate {
            ends,
            input: RefCell::new(input),
            bytes,
            partitioning: self.partitioning.clone(),
            taken: (0..n).map(|_| std::cell::Cell::new(0)).collect(),
            pending: (0..n).map(|_| RefCell::default()).collect(),
            captures: (0..n).map(|_| RefCell::new(None)).collect(),
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
        let mut senders: Vec<Vec<Lanes<T>>> = (0..producers).map(|_| Vec::new()).collect();
        let mut receivers: Vec<Vec<ChannelEnd<T>>> = (0..consumers).map(|_| Vec::new()).collect();
        let policy = BudgetPolicy::new(&cfg);
        for (p, row) in senders.iter_mut().enumerate() {
            for (c, rx) in receivers.iter_mut().enumerate() {
                if forward && p != c {
                    continue;
                }
                let (s, r) = crossbeam_channel::bounded(cfg.channel_capacity);
                // Unaligned barriers: never more than one per checkpoint in flight.
                let (ps, pr) = crossbeam_channel::unbounded();
                let budget = ChannelBudget::new(policy);
                if links {
                    link_list.push(Link {
                        producer: p,
                        consumer: c,
                        reader: Box::new(TypedLinkReader {
                            data: r.clone(),
                            priority: pr.clone(),
                            held: None,
                            priority_open: true,
                            budget: BudgetConsumer::new(budget.clone()),
                            last: 0,
                        }),
                        writer: Box::new(TypedLinkWriter {
                            data: s.clone(),
                            priority: PriorityInlet(ps.clone()),
                            budget: budget.clone(),
                            last: 0,
                        }),
                        priority: PriorityInlet(ps.clone()),
                    });
                }
                rx.push(ChannelEnd {
                    data: r,
                    priority: pr,
                    budget: BudgetConsumer::new(budget.clone()),
                });
                row.push((s, ps, budget));
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

/// The producer end of one channel: its data lane and its priority lane.
type Lanes<T> = (Sender<Msg<T>>, Sender<PriorityMsg>, Arc<ChannelBudget>);

/// Writes records into the channels of one producer subtask, batching per target.
pub struct ChannelWriter<T> {
    /// Per target: the data lane and the channel's in-flight budget (shared, weakly, with
    /// the thread's output availability check).
    lanes: Arc<WriterLanes<T>>,
    /// The lanes are registered with the thread that sends (at the first send).
    registered: bool,
    /// Per target: its priority lane (unaligned barriers).
    priority: Vec<Sender<PriorityMsg>>,
    /// Per target: data messages sent so far.
    sent: Vec<u64>,
    /// Per target: the records buffered when an unaligned barrier passed, sent as one
    /// batch before anything else (they count as before the barrier).
    held: Vec<Option<Vec<(T, Timestamp)>>>,
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
        lanes: Vec<Lanes<T>>,
        partitioning: Partitioning<T>,
        cfg: ExchangeConfig,
        producer: usize,
    ) -> Self {
        let n = lanes.len();
        let mut senders = Vec::with_capacity(n);
        let mut priority = Vec::with_capacity(n);
        let mut budgets = Vec::with_capacity(n);
        for (s, p, b) in lanes {
            senders.push(s);
            priority.push(p);
            budgets.push(b);
        }
        ChannelWriter {
            lanes: Arc::new(WriterLanes { senders, budgets }),
            registered: false,
            buffers: (0..n).map(|_| Vec::with_capacity(cfg.batch_size)).collect(),
            priority,
            sent: vec![0; n],
            held: (0..n).map(|_| None).collect(),
            partitioning,
            cfg,
            next: producer % n.max(1),
            next_marker: producer % n.max(1),
            last_flush_ms: 0,
        }
    }

    fn send(&mut self, target: usize, msg: Msg<T>) -> Result<()> {
        if let Some(held) = self.held[target].take() {
            self.send_now(target, Msg::Batch(held))?;
        }
        self.send_now(target, msg)
    }

    fn send_now(&mut self, target: usize, msg: Msg<T>) -> Result<()> {
        self.register();
        self.sent[target] += 1;
        let closed = || Error::ChannelClosed("downstream subtask stopped".into());
        if let Msg::Batch(b) = &msg {
            // The in-flight budget: waiting for it is backpressure as a full channel is.
            if let Some(waited) = self.lanes.budgets[target]
                .acquire(b.len())
                .map_err(|_| closed())?
            {
                add_backpressured(waited);
            }
        }
        match self.lanes.senders[target].try_send(msg) {
            Ok(()) => Ok(()),
            Err(crossbeam_channel::TrySendError::Full(msg)) => {
                // Backpressure: the channel is full and this subtask waits for its consumer.
                let started = std::time::Instant::now();
                let r = match (&msg, unaligned::barrier_timeout()) {
                    // Aligned with a timeout: an in-band barrier stuck behind a full channel
                    // that long also goes on the priority lane, counting itself as before it.
                    (Msg::Barrier(id), Some(limit)) => {
                        let id = *id;
                        match self.lanes.senders[target].send_timeout(msg, limit) {
                            Ok(()) => Ok(()),
                            Err(crossbeam_channel::SendTimeoutError::Timeout(msg)) => {
                                let _ = self.priority[target].send((id, self.sent[target]));
                                self.lanes.senders[target].send(msg).map_err(|_| closed())
                            }
                            Err(crossbeam_channel::SendTimeoutError::Disconnected(_)) => {
                                Err(closed())
                            }
                        }
                    }
                    _ => self.lanes.senders[target].send(msg).map_err(|_| closed()),
                };
                add_backpressured(started.elapsed());
                r
            }
            Err(crossbeam_channel::TrySendError::Disconnected(_)) => Err(closed()),
        }
    }

    fn flush(&mut self, target: usize) -> Result<()> {
        if self.buffers[target].is_empty() {
            if let Some(held) = self.held[target].take() {
                self.send_now(target, Msg::Batch(held))?;
            }
            return Ok(());
        }
        let batch = std::mem::replace(
            &mut self.buffers[target],
            Vec::with_capacity(self.cfg.batch_size),
        );
        self.send(target, Msg::Batch(batch))
    }

    fn flush_all(&mut self) -> Result<()> {
        for t in 0..self.lanes.senders.len() {
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

    /// Puts barrier `id` on every priority lane without waiting: the buffered records
    /// stay before it (sent next, as one batch), everything written later after it.
    fn unaligned_barrier(&mut self, id: CheckpointId) -> Result<()> {
        for t in 0..self.lanes.senders.len() {
            if self.held[t].is_some() && !self.buffers[t].is_empty() {
                // An earlier barrier's records are still held: they go first.
                let held = self.held[t].take().expect("held");
                self.send_now(t, Msg::Batch(held))?;
            }
            if !self.buffers[t].is_empty() {
                let b = std::mem::replace(
                    &mut self.buffers[t],
                    Vec::with_capacity(self.cfg.batch_size),
                );
                self.held[t] = Some(b);
            }
            let upto = self.sent[t] + u64::from(self.held[t].is_some());
            self.priority[t]
                .send((id, upto))
                .map_err(|_| Error::ChannelClosed("downstream subtask stopped".into()))?;
            self.send_held_now(t)?;
        }
        Ok(())
    }

    fn broadcast_msg(&mut self, make: impl Fn() -> Msg<T>) -> Result<()> {
        self.flush_all()?;
        for t in 0..self.lanes.senders.len() {
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
                self.next = (t + 1) % self.lanes.senders.len();
                self.push(t, value, ts)
            }
            Partitioning::Broadcast => {
                let n = self.lanes.senders.len();
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
                    self.lanes.senders.len(),
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
            Control::Barrier(id) if unaligned::unaligned_barriers() => self.unaligned_barrier(id),
            Control::Barrier(id) => self.broadcast_msg(|| Msg::Barrier(id)),
            Control::LatencyMarker(m) => {
                // As Flink: to one channel, in turn, behind the records buffered for it.
                let t = self.next_marker;
                self.next_marker = (t + 1) % self.lanes.senders.len();
                self.flush(t)?;
                self.send(t, Msg::LatencyMarker(m))
            }
            Control::Flush => self.flush_ready(),
            Control::Tick(now) => {
                if now - self.last_flush_ms >= self.cfg.flush_interval_ms {
                    self.last_flush_ms = now;
                    self.flush_ready()?;
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

#[cfg(test)]
mod paused_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod unaligned_tests;
