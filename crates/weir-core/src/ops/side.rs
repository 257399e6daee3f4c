//! Side outputs of process functions: the extra output ports an operator declared with
//! [`crate::dsl::Stream::with_side_output`], and the buffers that
//! `ctx.output(&tag, value)` writes into.
//!
//! A side output is a port of the same operator as the main output: its records are handed
//! downstream after the function returns, in the same call as the main output's, and every
//! control event (watermark, barrier, end of input) goes to every side port before the main
//! one. A checkpoint barrier therefore separates a side output's records exactly as it
//! separates the main output's.

use crate::data::Data;
use crate::dsl::OutputTag;
use crate::error::{Error, Result};
use crate::graph::take_output;
use crate::output::{Collector, Control, Output};
use crate::time::Timestamp;
use std::any::Any;
use std::sync::{Arc, Mutex};

/// One side output port: a typed buffer and the output it drains into.
trait SidePort {
    fn as_any(&mut self) -> &mut dyn Any;
    fn drain(&mut self, default_ts: Timestamp) -> Result<()>;
    fn control(&mut self, event: Control) -> Result<()>;
}

struct TypedSide<S> {
    buf: Collector<S>,
    out: Box<dyn Output<S>>,
}

impl<S: 'static> SidePort for TypedSide<S> {
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
    fn drain(&mut self, default_ts: Timestamp) -> Result<()> {
        self.buf.drain_into(&mut *self.out, default_ts)
    }
    fn control(&mut self, event: Control) -> Result<()> {
        self.out.control(event)
    }
}

/// Takes a typed side port out of a factory's outputs.
type TakeSide = fn(&mut [Box<dyn Any>], usize) -> Box<dyn SidePort>;

/// A side output declared on an operator at build time: its tag and output port.
pub(crate) struct SideDecl {
    tag: u64,
    name: String,
    port: usize,
    take: TakeSide,
}

fn take_side<S: Data>(outputs: &mut [Box<dyn Any>], port: usize) -> Box<dyn SidePort> {
    Box::new(TypedSide {
        buf: Collector::<S>::new(),
        out: take_output::<S>(outputs, port),
    })
}

impl SideDecl {
    pub(crate) fn new<S: Data>(tag: &OutputTag<S>, port: usize) -> Self {
        SideDecl {
            tag: tag.id(),
            name: tag.name().to_string(),
            port,
            take: take_side::<S>,
        }
    }
    pub(crate) fn tag(&self) -> u64 {
        self.tag
    }
}

/// The side outputs declared on one operator node. The DSL appends to it while the
/// pipeline is built; each subtask's factory reads it when the job runs.
pub(crate) type SideDecls = Arc<Mutex<Vec<SideDecl>>>;

/// The side outputs of one operator subtask.
#[derive(Default)]
pub(crate) struct SideOutputs {
    ports: Vec<(u64, String, Box<dyn SidePort>)>,
    /// Something was emitted since the last drain.
    dirty: bool,
}

impl SideOutputs {
    /// Takes the declared side ports out of a factory's outputs.
    pub(crate) fn take(decls: &SideDecls, outputs: &mut [Box<dyn Any>]) -> Self {
        let decls = decls.lock().unwrap_or_else(|e| e.into_inner());
        SideOutputs {
            ports: decls
                .iter()
                .map(|d| (d.tag, d.name.clone(), (d.take)(outputs, d.port)))
                .collect(),
            dirty: false,
        }
    }

    /// Buffers `value` for the side output `tag`.
    pub(crate) fn emit<S: 'static>(&mut self, tag: &OutputTag<S>, value: S) -> Result<()> {
        let id = tag.id();
        let Some((_, _, port)) = self.ports.iter_mut().find(|(t, _, _)| *t == id) else {
            let declared: Vec<&str> = self.ports.iter().map(|(_, n, _)| n.as_str()).collect();
            return Err(Error::Config(format!(
                "the function emitted to side output '{}', which this operator does not \
                 declare (declared: {declared:?}); declare it with \
                 .with_side_output(&tag) on the operator's result stream",
                tag.name()
            )));
        };
        let side = port
            .as_any()
            .downcast_mut::<TypedSide<S>>()
            .expect("internal: side output type mismatch");
        side.buf.emit(value);
        self.dirty = true;
        Ok(())
    }

    /// Hands the buffered records downstream; records get `default_ts`.
    #[inline]
    pub(crate) fn drain(&mut self, default_ts: Timestamp) -> Result<()> {
        if self.dirty {
            self.dirty = false;
            for (_, _, p) in &mut self.ports {
                p.drain(default_ts)?;
            }
        }
        Ok(())
    }

    /// Forwards a control event to every side port.
    pub(crate) fn control(&mut self, event: Control) -> Result<()> {
        for (_, _, p) in &mut self.ports {
            p.control(event)?;
        }
        Ok(())
    }
}
