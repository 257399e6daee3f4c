//! One task: a chain of operators for one subtask, built and run on its own thread.
//!
//! A source task polls its source and ticks; an operator task selects over its input
//! channels, tracks watermarks per channel, and forwards control events through the
//! chain. Both check the job's cancellation flag between batches, and both end by sending
//! the maximum watermark and end-of-input downstream.

use crate::JobConfig;
use crate::plan::Plan;
use crossbeam_channel::Select;
use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use weir_core::exchange::{GateEvent, InputGate};
use weir_core::graph::{BuildContext, Built, ControlSink, Graph, SourceStatus, SourceTask};
use weir_core::output::Control;
use weir_core::time::MAX_WATERMARK;
use weir_core::watermark::WatermarkTracker;
use weir_core::{Error, Result};

/// Key of a writer: (producer node, port, consumer node, consumer gate).
pub(crate) type WriterKey = (usize, usize, usize, usize);

/// Everything a task thread needs.
pub(crate) struct TaskSpec {
    pub head: usize,
    pub subtask: usize,
    pub writers: HashMap<WriterKey, Box<dyn Any + Send>>,
    pub readers: Vec<Option<Box<dyn Any + Send>>>,
    pub progress: Arc<AtomicU64>,
}

/// Shared, read-only job context.
pub(crate) struct JobShared {
    pub graph: Graph,
    pub plan: Plan,
    pub cfg: JobConfig,
    pub cancel: AtomicBool,
}

/// Wall-clock time in ms since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn build_node(
    job: &JobShared,
    node: usize,
    subtask: usize,
    writers: &mut HashMap<WriterKey, Box<dyn Any + Send>>,
) -> Result<Built> {
    let spec = &job.graph.nodes[node];
    let mut outputs = Vec::with_capacity(spec.outputs.len());
    for (port, port_type) in spec.outputs.iter().enumerate() {
        let mut list = Vec::new();
        for c in &job.plan.consumers[node][port] {
            if job.plan.chained[c.node] {
                match build_node(job, c.node, subtask, writers)? {
                    Built::Operator { mut inputs, .. } => list.push(inputs.swap_remove(0)),
                    Built::Source(_) => {
                        return Err(Error::Config("internal: a source cannot be chained".into()));
                    }
                }
            } else {
                let w = writers
                    .remove(&(node, port, c.node, c.gate))
                    .ok_or_else(|| Error::Config("internal: missing channel writer".into()))?;
                list.push(port_type.from_writer(w));
            }
        }
        outputs.push(port_type.fan_out(list));
    }
    let backend = job.cfg.state_backend;
    let make_backend = move || backend.create();
    let ctx = BuildContext {
        name: &spec.name,
        subtask,
        parallelism: job.plan.parallelism[node],
        max_parallelism: job.cfg.max_parallelism,
        state_backend: &make_backend,
    };
    spec.factory.build(&ctx, outputs)
}

/// Builds and runs one task to completion.
pub(crate) fn run(job: &JobShared, mut spec: TaskSpec) -> Result<u64> {
    let built = build_node(job, spec.head, spec.subtask, &mut spec.writers)?;
    match built {
        Built::Source(src) => run_source(job, src, &spec.progress),
        Built::Operator { inputs, control } => {
            let node = &job.graph.nodes[spec.head];
            let mut gates: Vec<Box<dyn InputGate>> = Vec::with_capacity(inputs.len());
            for ((edge, input), readers) in
                node.inputs.iter().zip(inputs).zip(spec.readers.iter_mut())
            {
                let readers = readers
                    .take()
                    .ok_or_else(|| Error::Config("internal: missing readers".into()))?;
                gates.push(edge.exchange.bind(readers, input)?);
            }
            run_operator(job, gates, control, &spec.progress)
        }
    }
}

fn run_source(job: &JobShared, mut src: Box<dyn SourceTask>, progress: &AtomicU64) -> Result<u64> {
    let mut last_tick = 0;
    loop {
        if job.cancel.load(Ordering::Relaxed) {
            return Err(Error::Cancelled);
        }
        let status = src.poll()?;
        progress.store(src.emitted(), Ordering::Relaxed);
        let now = now_ms();
        if now != last_tick {
            last_tick = now;
            src.control(Control::Tick(now))?;
        }
        match status {
            SourceStatus::More => {}
            SourceStatus::Idle(ms) => std::thread::sleep(Duration::from_millis(ms.clamp(1, 50))),
            SourceStatus::Finished => break,
        }
    }
    src.control(Control::Watermark(MAX_WATERMARK))?;
    src.control(Control::End)?;
    Ok(src.emitted())
}

enum ControlTarget<'a> {
    Gate(&'a dyn InputGate),
    Sink(Box<dyn ControlSink>),
}

impl ControlTarget<'_> {
    fn send(&mut self, event: Control) -> Result<()> {
        match self {
            ControlTarget::Gate(g) => g.control(event),
            ControlTarget::Sink(s) => s.control(event),
        }
    }
}

fn run_operator(
    job: &JobShared,
    gates: Vec<Box<dyn InputGate>>,
    control: Option<Box<dyn ControlSink>>,
    progress: &AtomicU64,
) -> Result<u64> {
    let mut target = match control {
        Some(c) => ControlTarget::Sink(c),
        None => ControlTarget::Gate(&*gates[0]),
    };
    // Flat channel index -> (gate, channel within the gate).
    let channels: Vec<(usize, usize)> = gates
        .iter()
        .enumerate()
        .flat_map(|(g, gate)| (0..gate.len()).map(move |c| (g, c)))
        .collect();
    let mut tracker = WatermarkTracker::new(channels.len());
    let mut ended = vec![false; channels.len()];
    let mut open = channels.len();
    let mut idle = false;
    let mut records = 0u64;
    let mut last_tick = 0;
    let mut active: Vec<usize> = (0..channels.len()).collect();
    while open > 0 {
        if job.cancel.load(Ordering::Relaxed) {
            return Err(Error::Cancelled);
        }
        let selected = {
            let mut sel = Select::new();
            for &flat in &active {
                let (g, c) = channels[flat];
                gates[g].select(&mut sel, c);
            }
            match sel.select_timeout(Duration::from_millis(10)) {
                Ok(op) => {
                    let flat = active[op.index()];
                    let (g, c) = channels[flat];
                    Some((flat, gates[g].complete(c, op)?))
                }
                Err(_) => None,
            }
        };
        if let Some((flat, event)) = selected {
            match event {
                GateEvent::Records(n) => {
                    records += n as u64;
                    progress.store(records, Ordering::Relaxed);
                    tracker.on_record(flat);
                }
                GateEvent::Watermark(w) => {
                    if let Some(wm) = tracker.on_watermark(flat, w) {
                        target.send(Control::Watermark(wm))?;
                    }
                }
                GateEvent::Idle(i) => {
                    if let Some(wm) = tracker.on_idle(flat, i) {
                        target.send(Control::Watermark(wm))?;
                    }
                }
                GateEvent::End => {
                    ended[flat] = true;
                    open -= 1;
                    active.retain(|&f| f != flat);
                    if let Some(wm) = tracker.on_end(flat) {
                        target.send(Control::Watermark(wm))?;
                    }
                }
                GateEvent::Disconnected => {
                    return Err(Error::ChannelClosed(
                        "an upstream subtask stopped without finishing".into(),
                    ));
                }
            }
            let now_idle = tracker.all_idle();
            if now_idle != idle {
                idle = now_idle;
                target.send(Control::Idle(idle))?;
            }
        }
        let now = now_ms();
        if now != last_tick {
            last_tick = now;
            target.send(Control::Tick(now))?;
        }
    }
    if tracker.current() < MAX_WATERMARK {
        target.send(Control::Watermark(MAX_WATERMARK))?;
    }
    target.send(Control::End)?;
    Ok(records)
}
