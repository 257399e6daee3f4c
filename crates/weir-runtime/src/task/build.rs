//! Building a task's chain: each node's operator or source, its outputs (the next chained
//! operator, or the writers of its channels), and its restored state.

use super::*;

/// Builds the nodes of one subtask's chain, head first.
pub(super) struct Builder<'a> {
    pub(super) job: &'a JobShared,
    pub(super) subtask: usize,
    pub(super) writers: &'a mut HashMap<WriterKey, Box<dyn Any + Send>>,
    pub(super) restore: &'a HashMap<usize, RestoreState>,
    pub(super) participants: &'a Participants,
    /// Set when operators count their records (the job serves its REST API).
    pub(super) metrics: Option<&'a crate::status::TaskMetrics>,
    /// The task's figures, counted or not (sources report their partitions there).
    pub(super) figures: &'a crate::status::TaskMetrics,
    /// An aligned source's task: the node that asked for alignment reports what it emits.
    pub(super) alignment: Option<&'a crate::alignment::SourceAligner>,
}

impl Builder<'_> {
    pub(super) fn build_node(&mut self, node: usize) -> Result<Built> {
        let job = self.job;
        let spec = &job.graph.nodes[node];
        let mut outputs = Vec::with_capacity(spec.outputs.len());
        for (port, port_type) in spec.outputs.iter().enumerate() {
            let mut list = Vec::new();
            for c in &job.plan.consumers[node][port] {
                if job.plan.chained[c.node] {
                    match self.build_node(c.node)? {
                        // A chained operator's records and watermark in are its
                        // upstream's out (TaskMetrics shares the cells): no counting here.
                        Built::Operator { mut inputs, .. } => list.push(inputs.swap_remove(0)),
                        Built::Source(_) => {
                            return Err(Error::Config(
                                "internal: a source cannot be chained".into(),
                            ));
                        }
                    }
                } else {
                    let w = self
                        .writers
                        .remove(&(node, port, c.node, c.gate))
                        .ok_or_else(|| Error::Config("internal: missing channel writer".into()))?;
                    let out = port_type.writer_output(w);
                    // With the API on, the encoded size of the records it sends.
                    list.push(
                        match self
                            .metrics
                            .filter(|_| job.cfg.measure_bytes)
                            .and_then(|m| m.node(node)?.bytes_out.clone())
                        {
                            Some(bytes) => {
                                let edge = &job.graph.nodes[c.node].inputs[c.gate];
                                let copies = match edge.kind() {
                                    weir_core::exchange::PartitionKind::Broadcast => {
                                        job.plan.parallelism[c.node] as u64
                                    }
                                    _ => 1,
                                };
                                port_type.metered(out, bytes, copies)
                            }
                            None => out,
                        },
                    );
                }
            }
            let mut out = port_type.fan_out(list);
            // The node that asked for alignment: what it emits is its source's watermark.
            if let Some(a) = self
                .alignment
                .filter(|_| spec.watermark_alignment.is_some())
            {
                out = port_type.alignment_observed(out, a.member());
            }
            // A source's records and watermark out are read from it after each poll.
            let counted = self
                .metrics
                .filter(|_| spec.kind != weir_core::graph::NodeKind::Source);
            outputs.push(match counted.and_then(|m| m.node(node)) {
                Some(m) => {
                    port_type.counted(out, m.records_out[port].clone(), m.watermark_out.clone())
                }
                None => out,
            });
        }
        let restore = self.restore.get(&node);
        let backend = &job.cfg.state_backend;
        let max = job.cfg.max_parallelism;
        let keyed = restore.map(|r| r.keyed.clone()).unwrap_or_default();
        let restore_from = restore.map(|r| r.backend.clone()).unwrap_or_default();
        let label = format!("op{node}-{}", self.subtask);
        let parallelism = job.plan.parallelism[node];
        let slots = job.plan.parallelism.iter().copied().max().unwrap_or(1);
        let subtask = self.subtask;
        // A failure to restore the state names the operator and subtask, as a task's do.
        let make_backend = || {
            backend
                .create(BackendParams {
                    label: &label,
                    max_parallelism: max,
                    subtask,
                    parallelism,
                    slots,
                    restore: keyed.clone(),
                    restore_from: &restore_from,
                })
                .map_err(|e| {
                    e.at(|| weir_core::error::Location {
                        operator: spec.name.clone(),
                        subtask,
                        parallelism,
                    })
                })
        };
        let operator_id = spec.operator_id();
        let source_figures = self
            .figures
            .node(node)
            .map(|c| c.partitions.clone())
            .unwrap_or_default();
        let ctx = BuildContext {
            name: &spec.name,
            subtask: self.subtask,
            parallelism: job.plan.parallelism[node],
            max_parallelism: max,
            state_backend: &make_backend,
            operator_id: &operator_id,
            participants: self.participants,
            restore,
            checkpointing: job.cfg.checkpoint.is_some(),
            checkpoint_timing: job.cfg.checkpoint.as_ref().map(|c| (c.interval, c.timeout)),
            source_figures: &source_figures,
            alignment: self.alignment.map(|a| a.handle()),
        };
        let built = spec.factory.build(&ctx, outputs)?;
        match built {
            Built::Operator { inputs, control }
                if spec.kind == weir_core::graph::NodeKind::Sink
                    && job.cfg.latency_tracking_interval.is_some() =>
            {
                // Latency markers end here: observed, never handed to the sink.
                let inputs = inputs
                    .into_iter()
                    .zip(&spec.inputs)
                    .map(|(input, e)| {
                        let port = &job.graph.nodes[e.from.0].outputs[e.port];
                        port.latency_observed(input, crate::latency::observer(job, node))
                    })
                    .collect();
                Ok(Built::Operator { inputs, control })
            }
            built => Ok(built),
        }
    }
}
