//! `Stream::process` (a process function over a non-keyed stream) and
//! `Stream::with_side_output` (the side outputs of process functions).

use super::{OutputTag, Stream};
use crate::data::Data;
use crate::graph::Port;
use crate::ops::OpInfo;
use crate::ops::process::{ProcessFunction, ProcessOp};
use crate::ops::side::{SideDecl, SideDecls, SideOutputs};

impl<T: Data> Stream<T> {
    /// Runs a process function over this (non-keyed) stream: each record goes to
    /// [`ProcessFunction::process`], which may emit to the main output and to side outputs.
    /// `make` creates each subtask's instance on the subtask's thread. There is no keyed
    /// state and there are no timers here (as in Flink): use [`Stream::key_by`] and
    /// [`super::KeyedStream::process_with_state`] for those.
    ///
    /// See [`ProcessFunction`] for an example.
    pub fn process<O: Data, P: ProcessFunction<T, O>>(
        &self,
        make: impl Fn() -> P + Send + Sync + 'static,
    ) -> Stream<O> {
        let decls = SideDecls::default();
        let declared = decls.clone();
        let out = self.unary(
            "process",
            false,
            self.partitioning.clone(),
            move |ctx, out, outputs| {
                let side = SideOutputs::take(&declared, outputs);
                Ok(Box::new(ProcessOp::new(
                    make(),
                    side,
                    out,
                    OpInfo::from_ctx(ctx),
                )))
            },
            vec![],
        );
        out.p.accept_side_outputs(out.node, decls);
        out
    }

    /// Declares the side output `tag` on the process function that produced this stream,
    /// so that it may emit to it (`ctx.output(&tag, value)`) and [`Stream::side_output`]
    /// reads it. Side outputs are ports of the same operator as the main output: its
    /// records pass checkpoints and watermarks in step with the main output's. Declaring a
    /// tag twice declares it once.
    ///
    /// Works after [`Stream::process`], [`super::KeyedStream::process`],
    /// [`super::KeyedStream::process_with_state`] and the `process` functions of connected
    /// streams. Windows declare their late-data side output with
    /// [`super::WindowedStream::side_output_late_data`].
    ///
    /// # Panics
    /// When the operator that produced this stream is not a process function.
    ///
    /// ```
    /// use weir_core::prelude::*;
    ///
    /// struct Evens { odd: OutputTag<u32> }
    /// impl ProcessFunction<u32, u32> for Evens {
    ///     fn process(&mut self, v: u32, ctx: &mut ProcessContext<'_, u32>) -> weir_core::Result<()> {
    ///         if v % 2 == 0 { ctx.emit(v) } else { ctx.output(&self.odd, v)? }
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let p = Pipeline::new();
    /// let odd = OutputTag::<u32>::new("odd");
    /// let tag = odd.clone();
    /// let evens = p
    ///     .from_collection(vec![1, 2, 3])
    ///     .process(move || Evens { odd: tag.clone() })
    ///     .with_side_output(&odd)
    ///     .name("evens");
    /// let _odd = evens.side_output(&odd).collect();
    /// ```
    pub fn with_side_output<S: Data>(self, tag: &OutputTag<S>) -> Self {
        let Some(decls) = self.p.side_decls(self.node) else {
            let name = self.p.with_graph(|g| g.nodes[self.node.0].name.clone());
            panic!(
                "operator '{name}' cannot declare side output '{}': only process functions \
                 emit to side outputs (windows use side_output_late_data)",
                tag.name()
            );
        };
        let mut decls = decls.lock().unwrap_or_else(|e| e.into_inner());
        if decls.iter().any(|d| d.tag() == tag.id()) {
            return self;
        }
        let mut port = 0;
        self.p.edit_node(self.node, |n| {
            n.outputs.push(Port::<S>::port_type());
            port = n.outputs.len() - 1;
        });
        self.p.register_side_port(self.node, tag.id(), port);
        decls.push(SideDecl::new(tag, port));
        drop(decls);
        self
    }
}
