//! The figures of one running subtask, updated by its own thread with relaxed atomic
//! stores, and the form in which a cluster worker reports them to its coordinator.

use crate::plan::Plan;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weir_core::dsl::{PartitionFigures, SourceFigures};
use weir_core::graph::Graph;
use weir_core::time::MIN_WATERMARK;

/// The cells one node of a task's chain updates.
pub(crate) struct NodeCells {
    pub node: usize,
    /// Records into the node, per input gate.
    pub records_in: Vec<Arc<AtomicU64>>,
    /// Records out of the node, per output port.
    pub records_out: Vec<Arc<AtomicU64>>,
    /// The last watermark into the node (operators and sinks).
    pub watermark_in: Arc<AtomicI64>,
    /// The last watermark out of the node (sources and operators).
    pub watermark_out: Arc<AtomicI64>,
    /// The encoded size of the records the node took off channels from other tasks
    /// (`None`: it has no such input: a source, or chained to its upstream).
    pub bytes_in: Option<Arc<AtomicU64>>,
    /// The encoded size of the records the node put on channels to other tasks (`None`:
    /// it has no such output: a sink, or only chained consumers).
    pub bytes_out: Option<Arc<AtomicU64>>,
    /// The node's input channels from other tasks, for the records in flight (`None`: it
    /// has no such input).
    pub queued_in: Option<super::in_flight::QueuedIn>,
    /// The live state size its state backend estimates (`u64::MAX`: unknown, or no keyed
    /// state), measured by the task at most once a second with the API on.
    pub state_bytes: Arc<AtomicU64>,
    /// The partitions a source reads, as it reports them (empty for other nodes).
    pub partitions: SourceFigures,
    /// A cluster coordinator: the partitions as the worker last reported them.
    pub(super) remote_partitions: Mutex<Vec<PartitionFigures>>,
}

impl NodeCells {
    /// The partitions this node reads (a source), with their current figures.
    pub(super) fn partition_figures(&self) -> Vec<PartitionFigures> {
        let local = self.partitions.partitions();
        if !local.is_empty() {
            return local;
        }
        self.remote_partitions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The figures of one running subtask (task = chain of operators), updated by its thread.
pub(crate) struct TaskMetrics {
    pub head: usize,
    pub subtask: usize,
    pub(super) started: Instant,
    /// A task of a cluster worker: its running time as the worker last reported it.
    pub(super) remote_elapsed_ns: Option<AtomicU64>,
    /// Nanoseconds from `started` to the end, 0 while it runs.
    pub(super) ended_ns: AtomicU64,
    /// Time waiting for input (or for nothing to do).
    pub idle_ns: AtomicU64,
    /// Time blocked on full output channels.
    pub backpressured_ns: Arc<AtomicU64>,
    /// Bytes of state this subtask wrote for the last completed checkpoint.
    pub(super) checkpointed_bytes: AtomicU64,
    /// An aligned source's task: the time it stopped polling because its watermark was
    /// too far ahead of its alignment group's (`None`: not aligned).
    pub alignment_paused_ns: Option<Arc<AtomicU64>>,
    pub nodes: Vec<NodeCells>,
}

impl TaskMetrics {
    pub(super) fn new(graph: &Graph, plan: &Plan, head: usize, subtask: usize) -> Self {
        let mut nodes: Vec<NodeCells> = Vec::new();
        for n in (0..graph.nodes.len()).filter(|&n| plan.head_of[n] == head) {
            // A chained node's input is its upstream's output, a function call away: they
            // share the cells (graph order puts the upstream first).
            let upstream = graph.nodes[n].inputs.first().filter(|_| plan.chained[n]);
            let shared = upstream.and_then(|e| {
                let up = nodes.iter().find(|c| c.node == e.from.0)?;
                Some((up.records_out[e.port].clone(), up.watermark_out.clone()))
            });
            let (records_in, watermark_in) = match shared {
                Some((records, watermark)) => (vec![records], watermark),
                None => (
                    graph.nodes[n].inputs.iter().map(|_| cell()).collect(),
                    Arc::new(AtomicI64::new(MIN_WATERMARK)),
                ),
            };
            nodes.push(NodeCells {
                node: n,
                records_in,
                records_out: graph.nodes[n].outputs.iter().map(|_| cell()).collect(),
                watermark_in,
                watermark_out: Arc::new(AtomicI64::new(MIN_WATERMARK)),
                bytes_in: (!graph.nodes[n].inputs.is_empty() && !plan.chained[n]).then(cell),
                queued_in: (!graph.nodes[n].inputs.is_empty() && !plan.chained[n])
                    .then(super::in_flight::QueuedIn::default),
                bytes_out: graph
                    .nodes
                    .iter()
                    .any(|c| c.inputs.iter().any(|e| e.from.0 == n) && !plan.chained[c.id.0])
                    .then(cell),
                state_bytes: Arc::new(AtomicU64::new(NO_STATE)),
                partitions: SourceFigures::default(),
                remote_partitions: Mutex::new(Vec::new()),
            });
        }
        TaskMetrics {
            head,
            subtask,
            started: Instant::now(),
            remote_elapsed_ns: None,
            ended_ns: AtomicU64::new(0),
            idle_ns: AtomicU64::new(0),
            backpressured_ns: cell(),
            checkpointed_bytes: AtomicU64::new(0),
            alignment_paused_ns: graph
                .nodes
                .iter()
                .any(|n| plan.head_of[n.id.0] == head && n.watermark_alignment.is_some())
                .then(cell),
            nodes,
        }
    }

    /// The cells of node `n` of this task's chain.
    pub(crate) fn node(&self, n: usize) -> Option<&NodeCells> {
        self.nodes.iter().find(|c| c.node == n)
    }

    /// Adds idle time.
    pub(crate) fn idle(&self, d: Duration) {
        self.idle_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// The task's thread has ended.
    pub(crate) fn ended(&self) {
        let ns = (self.started.elapsed().as_nanos() as u64).max(1);
        let _ = self
            .ended_ns
            .compare_exchange(0, ns, Ordering::Relaxed, Ordering::Relaxed);
    }

    pub(super) fn totals(&self) -> Totals {
        let ended = self.ended_ns.load(Ordering::Relaxed);
        let elapsed = if ended > 0 {
            ended
        } else if let Some(e) = &self.remote_elapsed_ns {
            e.load(Ordering::Relaxed)
        } else {
            self.started.elapsed().as_nanos() as u64
        };
        let idle = self.idle_ns.load(Ordering::Relaxed);
        let bp = self.backpressured_ns.load(Ordering::Relaxed);
        Totals {
            elapsed,
            idle: idle.min(elapsed),
            backpressured: bp.min(elapsed.saturating_sub(idle)),
            nodes: self
                .nodes
                .iter()
                .map(|c| (sum(&c.records_in), sum(&c.records_out)))
                .collect(),
        }
    }
}

/// One task's figures as a cluster worker reports them to its coordinator.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TaskFigures {
    pub head: u32,
    pub subtask: u32,
    pub elapsed_ns: u64,
    pub ended: bool,
    pub idle_ns: u64,
    pub backpressured_ns: u64,
    /// An aligned source's paused time (`None`: not an aligned source).
    pub alignment_paused_ns: Option<u64>,
    pub nodes: Vec<NodeFigures>,
}

/// One node of a reported task's chain.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct NodeFigures {
    pub node: u32,
    /// Per input gate.
    pub records_in: Vec<u64>,
    /// Per output port.
    pub records_out: Vec<u64>,
    pub watermark_in: i64,
    pub watermark_out: i64,
    /// Encoded bytes in from and out to channels (`None`: the node has none).
    pub bytes_in: Option<u64>,
    pub bytes_out: Option<u64>,
    /// The live state size, if known.
    pub state_bytes: Option<u64>,
    /// The partitions a source reads.
    pub partitions: Vec<PartitionFigures>,
    /// Records queued in the node's input channels and their limit.
    #[serde(default)]
    pub in_flight: Option<(u64, u64)>,
}

pub(super) fn cell() -> Arc<AtomicU64> {
    Arc::new(AtomicU64::new(0))
}

pub(super) fn sum(cells: &[Arc<AtomicU64>]) -> u64 {
    cells.iter().map(|c| c.load(Ordering::Relaxed)).sum()
}

/// Cumulative figures of one task at one moment.
#[derive(Clone)]
pub(super) struct Totals {
    pub(super) elapsed: u64,
    pub(super) idle: u64,
    pub(super) backpressured: u64,
    /// (records in, records out) per node of the chain, in `TaskMetrics::nodes` order.
    pub(super) nodes: Vec<(u64, u64)>,
}

/// The value of an optional cell.
pub(super) fn load(cell: &Option<Arc<AtomicU64>>) -> Option<u64> {
    cell.as_ref().map(|c| c.load(Ordering::Relaxed))
}

/// The value of a `state_bytes` cell before anything was measured.
pub(super) const NO_STATE: u64 = u64::MAX;

/// The live state size in a `state_bytes` cell, if known.
pub(super) fn state(cell: &AtomicU64) -> Option<u64> {
    Some(cell.load(Ordering::Relaxed)).filter(|&b| b != NO_STATE)
}
