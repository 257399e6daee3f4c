//! The physical plan: resolved parallelism, chains, and the consumers of every output.
//!
//! Owns the chaining rule: a node joins its upstream's task when it has exactly one input,
//! that input is a forward edge, both have the same parallelism, and chaining was not
//! disabled. Everything else gets channels.

use crate::JobConfig;
use weir_core::exchange::PartitionKind;
use weir_core::graph::{Graph, NodeKind};
use weir_core::{Error, Result};

/// A consumer of an output port.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Consumer {
    pub node: usize,
    pub gate: usize,
}

/// The resolved plan of a graph.
pub(crate) struct Plan {
    pub parallelism: Vec<usize>,
    pub chained: Vec<bool>,
    /// consumers[node][port]
    pub consumers: Vec<Vec<Vec<Consumer>>>,
    /// Heads of tasks, in graph order.
    pub heads: Vec<usize>,
    /// head of the task each node runs in
    pub head_of: Vec<usize>,
}

impl Plan {
    pub(crate) fn new(graph: &Graph, cfg: &JobConfig) -> Result<Plan> {
        if graph.nodes.is_empty() {
            return Err(Error::Config(
                "the pipeline is empty: add a source and a sink".into(),
            ));
        }
        let n = graph.nodes.len();
        let mut parallelism = Vec::with_capacity(n);
        for node in &graph.nodes {
            let p = if node.max_parallelism_one {
                1
            } else {
                node.parallelism.unwrap_or(cfg.parallelism)
            };
            if node.keyed && p > cfg.max_parallelism {
                return Err(Error::Config(format!(
                    "operator '{}' has parallelism {p} above the max parallelism {} (the number of key \
                     groups); raise max_parallelism or lower the parallelism",
                    node.name, cfg.max_parallelism
                )));
            }
            parallelism.push(p);
        }
        let mut consumers: Vec<Vec<Vec<Consumer>>> = graph
            .nodes
            .iter()
            .map(|nd| vec![Vec::new(); nd.outputs.len()])
            .collect();
        for node in &graph.nodes {
            for (gate, e) in node.inputs.iter().enumerate() {
                let from = &graph.nodes[e.from.0];
                if from.kind == NodeKind::Sink || e.port >= from.outputs.len() {
                    return Err(Error::Config(format!(
                        "operator '{}' reads port {} of '{}', which has no such output",
                        node.name, e.port, from.name
                    )));
                }
                consumers[e.from.0][e.port].push(Consumer {
                    node: node.id.0,
                    gate,
                });
            }
        }
        let mut chained = vec![false; n];
        let mut head_of = vec![0; n];
        let mut heads = Vec::new();
        for node in &graph.nodes {
            let i = node.id.0;
            chained[i] = node.chainable
                && node.inputs.len() == 1
                && node.inputs[0].kind() == PartitionKind::Forward
                && parallelism[node.inputs[0].from.0] == parallelism[i];
            if chained[i] {
                head_of[i] = head_of[node.inputs[0].from.0];
            } else {
                head_of[i] = i;
                heads.push(i);
            }
        }
        Ok(Plan {
            parallelism,
            chained,
            consumers,
            heads,
            head_of,
        })
    }
}
