//! The typed DSL: [`Pipeline`] (the graph under construction), [`Stream`],
//! [`KeyedStream`], [`WindowedStream`], connected streams and joins.
//!
//! Every method adds a node to the logical graph with a factory that builds the operator
//! for one subtask; element types are checked by the compiler end to end and erased only
//! inside the factories. Nothing here runs anything: `weir::Env::execute` does.

mod alignment;
mod async_io;
mod broadcast;
mod changes;
mod connected;
mod dedup;
mod figures;
mod interval_join;
mod keyed;
mod process;
mod sources;
mod splits;
mod stream;
mod table;
mod table_group;
mod temporal_join;
mod windowed;

pub use broadcast::{
    BroadcastConnectedStreams, BroadcastStream, ConnectWith, KeyedBroadcastConnectedStreams,
    KeyedConnectWith,
};
pub use connected::{ConnectedStreams, JoinedStreams, KeyedConnectedStreams, WindowedJoin};
pub use figures::{PartitionFigures, PartitionGauges, SourceFigures};
pub use interval_join::{IntervalJoin, IntervalJoined};
pub use keyed::KeyedStream;
pub use sources::{GeneratorSource, SOURCE_BATCH, SourceContext, SourceFunction, SourceOutput};
pub use splits::SplitPositions;
pub use stream::{OutputTag, SinkHandle, Stream};
pub use table::{Table, TableJoin};
pub use table_group::GroupedTable;
pub use temporal_join::TemporalJoin;
pub use windowed::WindowedStream;

use crate::data::Data;
use crate::error::Result;
use crate::exchange::{Partitioning, TypedExchange};
use crate::graph::{
    BuildContext, Built, Graph, InputEdge, NodeFactory, NodeKind, NodeSpec, PortType,
};
use crate::ids::NodeId;
use crate::ops::side::SideDecls;
use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

/// A pipeline under construction: the logical graph plus DSL bookkeeping.
///
/// Cloning is cheap (a shared handle); every stream refers back to its pipeline.
///
/// ```
/// use weir_core::prelude::*;
/// let p = Pipeline::new();
/// let out = p.from_collection(vec![1, 2, 3]).map(|x| x * 10).collect();
/// assert_eq!(p.graph_len(), 3);
/// # let _ = out;
/// ```
#[derive(Clone, Default)]
pub struct Pipeline {
    inner: Rc<RefCell<Inner>>,
}

#[derive(Default)]
struct Inner {
    graph: Graph,
    /// (node, tag id) -> output port of side outputs.
    side_ports: HashMap<(NodeId, u64), usize>,
    /// The side outputs declared on process-function nodes (nodes that accept
    /// `with_side_output`).
    side_decls: HashMap<NodeId, SideDecls>,
}

struct FnFactory<F>(F);

impl<F> NodeFactory for FnFactory<F>
where
    F: Fn(&BuildContext<'_>, Vec<Box<dyn Any>>) -> Result<Built> + Send + Sync,
{
    fn build(&self, ctx: &BuildContext<'_>, outputs: Vec<Box<dyn Any>>) -> Result<Built> {
        (self.0)(ctx, outputs)
    }
}

/// An input of a node under construction.
pub(crate) struct PendingInput<T> {
    pub(crate) from: NodeId,
    pub(crate) port: usize,
    pub(crate) partitioning: Partitioning<T>,
}

impl<T: Data> PendingInput<T> {
    fn edge(self) -> InputEdge {
        InputEdge {
            from: self.from,
            port: self.port,
            exchange: Arc::new(TypedExchange {
                partitioning: self.partitioning,
            }),
        }
    }
}

/// Description of a node to add.
pub(crate) struct NodeDesc {
    pub(crate) name: String,
    pub(crate) kind: NodeKind,
    pub(crate) inputs: Vec<InputEdge>,
    pub(crate) outputs: Vec<Arc<dyn PortType>>,
    pub(crate) keyed: bool,
    pub(crate) parallelism_one: bool,
}

impl Pipeline {
    /// An empty pipeline.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of nodes in the graph.
    pub fn graph_len(&self) -> usize {
        self.inner.borrow().graph.nodes.len()
    }

    /// Takes the built graph out (the runtime calls this once at execution).
    pub fn take_graph(&self) -> Graph {
        std::mem::take(&mut self.inner.borrow_mut().graph)
    }

    /// Runs `f` on the graph.
    pub fn with_graph<R>(&self, f: impl FnOnce(&Graph) -> R) -> R {
        f(&self.inner.borrow().graph)
    }

    pub(crate) fn add_node(
        &self,
        desc: NodeDesc,
        factory: impl Fn(&BuildContext<'_>, Vec<Box<dyn Any>>) -> Result<Built> + Send + Sync + 'static,
    ) -> NodeId {
        let mut inner = self.inner.borrow_mut();
        let id = NodeId(inner.graph.nodes.len());
        let chainable = desc.inputs.len() == 1;
        inner.graph.nodes.push(NodeSpec {
            id,
            name: desc.name,
            uid: None,
            parallelism: if desc.parallelism_one { Some(1) } else { None },
            max_parallelism_one: desc.parallelism_one,
            kind: desc.kind,
            inputs: desc.inputs,
            outputs: desc.outputs,
            factory: Arc::new(FnFactory(factory)),
            chainable,
            keyed: desc.keyed,
            exclusive_dirs: Vec::new(),
            watermark_alignment: None,
        });
        id
    }

    pub(crate) fn edit_node(&self, id: NodeId, f: impl FnOnce(&mut NodeSpec)) {
        f(&mut self.inner.borrow_mut().graph.nodes[id.0])
    }

    pub(crate) fn register_side_port(&self, node: NodeId, tag: u64, port: usize) {
        self.inner.borrow_mut().side_ports.insert((node, tag), port);
    }

    pub(crate) fn side_port(&self, node: NodeId, tag: u64) -> Option<usize> {
        self.inner.borrow().side_ports.get(&(node, tag)).copied()
    }

    /// Lets `node` (a process function) declare side outputs into `decls`.
    pub(crate) fn accept_side_outputs(&self, node: NodeId, decls: SideDecls) {
        self.inner.borrow_mut().side_decls.insert(node, decls);
    }

    /// `node` runs on a process function but is not one to the user (a rolling reduce or
    /// aggregate): it takes no side outputs.
    pub(crate) fn refuse_side_outputs(&self, node: NodeId) {
        self.inner.borrow_mut().side_decls.remove(&node);
    }

    pub(crate) fn side_decls(&self, node: NodeId) -> Option<SideDecls> {
        self.inner.borrow().side_decls.get(&node).cloned()
    }
}
