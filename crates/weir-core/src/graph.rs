//! The logical graph the DSL builds and the runtime executes.
//!
//! Owns [`Graph`], [`NodeSpec`] and the type-erased construction interface
//! ([`NodeFactory`], [`PortType`], [`Built`], [`SourceTask`]). Each node knows how to build
//! one subtask's operator on the subtask's own thread; the runtime decides chaining,
//! parallelism and channels.

use crate::checkpoint::{Participants, RestoreState};
use crate::error::Result;
use crate::exchange::{Exchange, PartitionKind};
use crate::ids::NodeId;
use crate::output::{Control, Discard, FanOut, Output};
use crate::state::KeyedStateBackend;
use std::any::Any;
use std::marker::PhantomData;
use std::sync::Arc;

/// What a node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// Produces records; has no inputs.
    Source,
    /// Transforms records.
    Operator,
    /// Consumes records; has no outputs.
    Sink,
}

/// One input of a node: which node and output port feeds it, and how.
pub struct InputEdge {
    /// The upstream node.
    pub from: NodeId,
    /// The upstream output port (0 = main output, higher = side outputs).
    pub port: usize,
    /// The typed exchange of this edge.
    pub exchange: Arc<dyn Exchange>,
}

impl InputEdge {
    /// The partitioning kind of the edge.
    pub fn kind(&self) -> PartitionKind {
        self.exchange.kind()
    }
}

/// A node of the logical graph.
pub struct NodeSpec {
    /// The node's id (its index in [`Graph::nodes`]).
    pub id: NodeId,
    /// Display name (used in errors, logs and metrics).
    pub name: String,
    /// Stable user-given id (used to match state on restore).
    pub uid: Option<String>,
    /// Parallelism; `None` takes the job default.
    pub parallelism: Option<usize>,
    /// The node can run only at parallelism 1 (a non-parallel source).
    pub max_parallelism_one: bool,
    /// What the node is.
    pub kind: NodeKind,
    /// Inputs in order (gate 0, gate 1, ...).
    pub inputs: Vec<InputEdge>,
    /// The element type of each output port.
    pub outputs: Vec<Arc<dyn PortType>>,
    /// Builds one subtask's operator.
    pub factory: Arc<dyn NodeFactory>,
    /// May be chained to its upstream (single forward input of equal parallelism).
    pub chainable: bool,
    /// Needs keyed state (the runtime creates a state backend for it).
    pub keyed: bool,
    /// Directories the node writes into that one job run at a time may own (an exactly-once
    /// file sink's output directory): the runtime takes a lease on each before the job
    /// starts, and refuses to run while another live run holds one.
    pub exclusive_dirs: Vec<std::path::PathBuf>,
    /// The watermark alignment group of the source whose task this node runs in (set on
    /// the source itself, or on a `with_watermarks` chained to it).
    pub watermark_alignment: Option<crate::watermark::WatermarkAlignment>,
}

impl NodeSpec {
    /// The stable id under which the node's state is checkpointed: its uid if set,
    /// otherwise its position and name in the graph (stable for the same program).
    pub fn operator_id(&self) -> String {
        match &self.uid {
            Some(u) => u.clone(),
            None => format!("{}-{}", self.id.0, self.name),
        }
    }
}

/// The logical graph of a pipeline.
#[derive(Default)]
pub struct Graph {
    /// All nodes, in creation order (inputs always come before their consumers).
    pub nodes: Vec<NodeSpec>,
}

/// Everything a node's factory gets to build one subtask.
pub struct BuildContext<'a> {
    /// The node's display name.
    pub name: &'a str,
    /// This subtask's index.
    pub subtask: usize,
    /// The node's parallelism.
    pub parallelism: usize,
    /// Number of key groups.
    pub max_parallelism: usize,
    /// Creates a keyed state backend for this subtask, loaded with its restored state.
    pub state_backend: &'a dyn Fn() -> Result<Box<dyn KeyedStateBackend>>,
    /// The operator's stable id (its uid, or derived from its position in the graph).
    pub operator_id: &'a str,
    /// Where operators register their checkpoint hooks.
    pub participants: &'a Participants,
    /// The state this subtask restores from, if the job resumed from a checkpoint.
    pub restore: Option<&'a RestoreState>,
    /// True when the job takes checkpoints.
    pub checkpointing: bool,
    /// The checkpoint interval and timeout, when the job takes checkpoints (a transactional
    /// sink checks its transaction timeout against them).
    pub checkpoint_timing: Option<(std::time::Duration, std::time::Duration)>,
    /// Where a source subtask reports the partitions it reads (see
    /// [`SourceFigures`](crate::dsl::SourceFigures)); other operators ignore it.
    pub source_figures: &'a crate::dsl::SourceFigures,
    /// A source subtask of a watermark alignment group: the limit its group publishes
    /// (see [`SourceContext::alignment`](crate::dsl::SourceContext::alignment)).
    pub alignment: Option<&'a crate::watermark::AlignmentHandle>,
}

/// A subtask's built operator.
pub enum Built {
    /// A source subtask, which drives itself.
    Source(Box<dyn SourceTask>),
    /// An operator or sink: one input per gate (`Box<dyn Output<T_i>>` in a `Box<dyn Any>`).
    /// With several inputs, control events go to `control`, not to the inputs.
    Operator {
        /// The typed inputs.
        inputs: Vec<Box<dyn Any>>,
        /// Control for multi-input operators.
        control: Option<Box<dyn ControlSink>>,
    },
}

/// Receives control events for a multi-input operator.
pub trait ControlSink {
    /// Handles one control event.
    fn control(&mut self, event: Control) -> Result<()>;
}

/// What one poll of a source produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceStatus {
    /// Emitted records; poll again.
    More,
    /// Nothing available now; poll again after about this many milliseconds.
    Idle(u64),
    /// The source is exhausted.
    Finished,
}

/// A running source subtask: the runtime polls it and sends control events through it.
pub trait SourceTask {
    /// Emits the next records (a batch's worth) into the source's output.
    fn poll(&mut self) -> Result<SourceStatus>;
    /// Sends a control event downstream through the chain.
    fn control(&mut self, event: Control) -> Result<()>;
    /// Records emitted so far.
    fn emitted(&self) -> u64;
    /// The last watermark the source emitted itself (`None`: none yet, or it does not
    /// track event time). The runtime reads it after each poll for the REST API.
    fn watermark(&self) -> Option<crate::time::Timestamp> {
        None
    }
}

/// Builds one subtask of a node.
pub trait NodeFactory: Send + Sync {
    /// Builds the subtask; `outputs` holds, per output port, a `Box<dyn Output<T>>` in a
    /// `Box<dyn Any>` (see [`PortType`]).
    fn build(&self, ctx: &BuildContext<'_>, outputs: Vec<Box<dyn Any>>) -> Result<Built>;
}

/// Type-erased operations on an output port's element type.
pub trait PortType: Send + Sync {
    /// Combines several outputs into one (`Box<dyn Output<T>>` each).
    fn fan_out(&self, outputs: Vec<Box<dyn Any>>) -> Box<dyn Any>;
    /// Converts a channel writer (`Box<dyn Output<T> + Send>`) into an output.
    fn writer_output(&self, writer: Box<dyn Any + Send>) -> Box<dyn Any>;
    /// The type name, for diagnostics.
    fn type_name(&self) -> &'static str;
    /// Wraps an output (`Box<dyn Output<T>>`) in a [`crate::output::Counted`] that counts
    /// its records into `records` and keeps its last watermark in `watermark`. The default
    /// returns the output unwrapped (nothing is counted).
    fn counted(
        &self,
        output: Box<dyn Any>,
        records: Arc<std::sync::atomic::AtomicU64>,
        watermark: Arc<std::sync::atomic::AtomicI64>,
    ) -> Box<dyn Any> {
        let _ = (records, watermark);
        output
    }
    /// Wraps a channel writer's output (`Box<dyn Output<T>>`) in a
    /// [`crate::exchange::Metered`] that adds the encoded size of each record it takes,
    /// times `copies` (the channels a broadcast writes it to), to `bytes`. The default
    /// returns the output unwrapped (nothing is measured).
    fn metered(
        &self,
        output: Box<dyn Any>,
        bytes: Arc<std::sync::atomic::AtomicU64>,
        copies: u64,
    ) -> Box<dyn Any> {
        let _ = (bytes, copies);
        output
    }

    /// Wraps an output (`Box<dyn Output<T>>`) in a [`crate::watermark::AlignmentObserved`]
    /// that reports the watermarks and idleness passing through to `member`. The default
    /// returns the output unwrapped (nothing is reported).
    fn alignment_observed(
        &self,
        output: Box<dyn Any>,
        member: crate::watermark::AlignmentMember,
    ) -> Box<dyn Any> {
        let _ = member;
        output
    }

    /// Wraps a sink's input (`Box<dyn Output<T>>`) in a [`crate::output::LatencyObserved`]
    /// that hands the latency markers reaching it to `observe`. The default returns the
    /// input unwrapped (the sink ignores the markers).
    fn latency_observed(
        &self,
        input: Box<dyn Any>,
        observe: Box<dyn FnMut(crate::output::LatencyMarker)>,
    ) -> Box<dyn Any> {
        let _ = observe;
        input
    }
}

/// The [`PortType`] of `T`.
pub struct Port<T>(PhantomData<fn() -> T>);

impl<T> Port<T> {
    /// The port type of `T`.
    pub fn port_type() -> Arc<dyn PortType>
    where
        T: crate::data::Data,
    {
        Arc::new(Port::<T>(PhantomData))
    }
}

impl<T: crate::data::Data> PortType for Port<T> {
    fn fan_out(&self, outputs: Vec<Box<dyn Any>>) -> Box<dyn Any> {
        let mut outs: Vec<Box<dyn Output<T>>> = outputs
            .into_iter()
            .map(|o| {
                *o.downcast::<Box<dyn Output<T>>>()
                    .expect("internal: output type mismatch")
            })
            .collect();
        let out: Box<dyn Output<T>> = match outs.len() {
            0 => Box::new(Discard),
            1 => outs.pop().expect("one output"),
            _ => Box::new(FanOut::new(outs)),
        };
        Box::new(out)
    }

    fn writer_output(&self, writer: Box<dyn Any + Send>) -> Box<dyn Any> {
        let w = *writer
            .downcast::<Box<dyn Output<T> + Send>>()
            .expect("internal: writer type mismatch");
        let out: Box<dyn Output<T>> = w;
        Box::new(out)
    }

    fn type_name(&self) -> &'static str {
        std::any::type_name::<T>()
    }

    fn counted(
        &self,
        output: Box<dyn Any>,
        records: Arc<std::sync::atomic::AtomicU64>,
        watermark: Arc<std::sync::atomic::AtomicI64>,
    ) -> Box<dyn Any> {
        let inner = *output
            .downcast::<Box<dyn Output<T>>>()
            .expect("internal: output type mismatch");
        let out: Box<dyn Output<T>> =
            Box::new(crate::output::Counted::new(inner, records, watermark));
        Box::new(out)
    }

    fn metered(
        &self,
        output: Box<dyn Any>,
        bytes: Arc<std::sync::atomic::AtomicU64>,
        copies: u64,
    ) -> Box<dyn Any> {
        let inner = *output
            .downcast::<Box<dyn Output<T>>>()
            .expect("internal: output type mismatch");
        let out: Box<dyn Output<T>> = Box::new(crate::exchange::Metered::new(inner, bytes, copies));
        Box::new(out)
    }

    fn alignment_observed(
        &self,
        output: Box<dyn Any>,
        member: crate::watermark::AlignmentMember,
    ) -> Box<dyn Any> {
        let inner = *output
            .downcast::<Box<dyn Output<T>>>()
            .expect("internal: output type mismatch");
        let out: Box<dyn Output<T>> =
            Box::new(crate::watermark::AlignmentObserved::new(inner, member));
        Box::new(out)
    }

    fn latency_observed(
        &self,
        input: Box<dyn Any>,
        observe: Box<dyn FnMut(crate::output::LatencyMarker)>,
    ) -> Box<dyn Any> {
        let inner = *input
            .downcast::<Box<dyn Output<T>>>()
            .expect("internal: input type mismatch");
        let out: Box<dyn Output<T>> = Box::new(crate::output::LatencyObserved::new(inner, observe));
        Box::new(out)
    }
}

/// Takes the typed output of port `i` out of a factory's outputs.
///
/// # Panics
/// When the port is missing or has another type: the DSL built an inconsistent graph.
pub fn take_output<T: 'static>(outputs: &mut [Box<dyn Any>], i: usize) -> Box<dyn Output<T>> {
    let o = std::mem::replace(&mut outputs[i], Box::new(()));
    *o.downcast::<Box<dyn Output<T>>>()
        .expect("internal: output port type mismatch")
}

/// Wraps a typed input for [`Built::Operator`].
pub fn input<T: 'static>(o: Box<dyn Output<T>>) -> Box<dyn Any> {
    Box::new(o)
}
