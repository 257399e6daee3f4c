//! [`Stream`]: a typed stream and its stateless operators, partitioning, sinks and the
//! per-operator settings (`name`, `uid`, `parallelism`).

use super::{KeyedStream, NodeDesc, PendingInput, Pipeline};
use crate::data::{Data, Key};
use crate::error::Result;
use crate::exchange::Partitioning;
use crate::graph::{
    BuildContext, Built, ControlSink, NodeKind, Port, PortType, input, take_output,
};
use crate::ids::NodeId;
use crate::ops::OpInfo;
use crate::ops::basic::{Filter, FlatMap, Map};
use crate::ops::file_sink::ExactlyOnceFileSink;
use crate::ops::object_sink::ExactlyOnceObjectSink;
use crate::ops::sink::{
    CollectSink, Collected, DiscardSink, FnSink, PrintSink, SinkFunction, SinkOp, TextFileSink,
};
use crate::output::{Control, Output};
use crate::time::Timestamp;
use crate::watermark::WatermarkStrategy;
use std::any::Any;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A typed stream of `T`: the output of one operator, waiting to be consumed.
///
/// ```
/// use weir_core::prelude::*;
/// let p = Pipeline::new();
/// let words = p
///     .from_collection(vec!["a b".to_string(), "b".to_string()])
///     .flat_map(|line: String| line.split(' ').map(str::to_string).collect::<Vec<_>>())
///     .filter(|w| !w.is_empty())
///     .name("split");
/// let _counts = words.map(|w| (w, 1u64)).key_by(|(w, _)| w.clone()).reduce(|a, b| (a.0, a.1 + b.1)).collect();
/// ```
pub struct Stream<T> {
    pub(crate) p: Pipeline,
    pub(crate) node: NodeId,
    pub(crate) port: usize,
    pub(crate) partitioning: Partitioning<T>,
}

impl<T> Clone for Stream<T> {
    fn clone(&self) -> Self {
        Stream {
            p: self.p.clone(),
            node: self.node,
            port: self.port,
            partitioning: self.partitioning.clone(),
        }
    }
}

/// Names a side output of an operator (late records of a window, for instance).
///
/// ```
/// use weir_core::prelude::*;
/// let late: OutputTag<(String, i64)> = OutputTag::new("late");
/// assert_eq!(late.name(), "late");
/// ```
pub struct OutputTag<T> {
    id: u64,
    name: String,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for OutputTag<T> {
    fn clone(&self) -> Self {
        OutputTag {
            id: self.id,
            name: self.name.clone(),
            _t: PhantomData,
        }
    }
}

static NEXT_TAG: AtomicU64 = AtomicU64::new(1);

impl<T> OutputTag<T> {
    /// A new tag; tags are distinct even with equal names.
    pub fn new(name: &str) -> Self {
        OutputTag {
            id: NEXT_TAG.fetch_add(1, Ordering::Relaxed),
            name: name.to_string(),
            _t: PhantomData,
        }
    }
    /// The tag's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

struct Union<T> {
    out: Rc<RefCell<Box<dyn Output<T>>>>,
}

impl<T> Output<T> for Union<T> {
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        self.out.borrow_mut().record(value, ts)
    }
    fn control(&mut self, _event: Control) -> Result<()> {
        Ok(())
    }
}

impl<T> ControlSink for Union<T> {
    fn control(&mut self, event: Control) -> Result<()> {
        self.out.borrow_mut().control(event)
    }
}

impl<T: Data> Stream<T> {
    pub(crate) fn new(p: Pipeline, node: NodeId, port: usize) -> Self {
        Stream {
            p,
            node,
            port,
            partitioning: Partitioning::Forward,
        }
    }

    pub(crate) fn pending(&self) -> PendingInput<T> {
        PendingInput {
            from: self.node,
            port: self.port,
            partitioning: self.partitioning.clone(),
        }
    }

    /// The pipeline this stream belongs to.
    pub fn pipeline(&self) -> &Pipeline {
        &self.p
    }

    /// Adds a one-input operator after this stream.
    pub(crate) fn unary<O: Data>(
        &self,
        name: &str,
        keyed: bool,
        partitioning: Partitioning<T>,
        build: impl Fn(
            &BuildContext<'_>,
            Box<dyn Output<O>>,
            &mut Vec<Box<dyn Any>>,
        ) -> Result<Box<dyn Output<T>>>
        + Send
        + Sync
        + 'static,
        extra_outputs: Vec<Arc<dyn PortType>>,
    ) -> Stream<O> {
        let mut outputs = vec![Port::<O>::port_type()];
        outputs.extend(extra_outputs);
        let pending = PendingInput {
            from: self.node,
            port: self.port,
            partitioning,
        };
        let id = self.p.add_node(
            NodeDesc {
                name: name.to_string(),
                kind: NodeKind::Operator,
                inputs: vec![pending.edge()],
                outputs,
                keyed,
                parallelism_one: false,
            },
            move |ctx, mut outputs| {
                let out = take_output::<O>(&mut outputs, 0);
                let op = build(ctx, out, &mut outputs)?;
                Ok(Built::Operator {
                    inputs: vec![input(op)],
                    control: None,
                })
            },
        );
        Stream::new(self.p.clone(), id, 0)
    }

    /// Transforms each record.
    pub fn map<O: Data>(&self, f: impl Fn(T) -> O + Send + Sync + 'static) -> Stream<O> {
        self.try_map(move |v| Ok(f(v))).rename("map")
    }

    /// Transforms each record with a function that may fail; an error fails the job with
    /// the operator's name and the error.
    pub fn try_map<O: Data>(
        &self,
        f: impl Fn(T) -> Result<O> + Send + Sync + 'static,
    ) -> Stream<O> {
        let f: Arc<dyn Fn(T) -> Result<O> + Send + Sync> = Arc::new(f);
        self.unary(
            "try_map",
            false,
            self.partitioning.clone(),
            move |ctx, out, _| {
                Ok(Box::new(Map {
                    f: f.clone(),
                    out,
                    info: OpInfo::from_ctx(ctx),
                }))
            },
            vec![],
        )
    }

    /// Keeps the records for which `f` is true.
    pub fn filter(&self, f: impl Fn(&T) -> bool + Send + Sync + 'static) -> Stream<T> {
        let f: Arc<dyn Fn(&T) -> bool + Send + Sync> = Arc::new(f);
        self.unary(
            "filter",
            false,
            self.partitioning.clone(),
            move |ctx, out, _| {
                Ok(Box::new(Filter {
                    f: f.clone(),
                    out,
                    info: OpInfo::from_ctx(ctx),
                }))
            },
            vec![],
        )
    }

    /// Turns each record into zero or more records.
    pub fn flat_map<O: Data, I: IntoIterator<Item = O>>(
        &self,
        f: impl Fn(T) -> I + Send + Sync + 'static,
    ) -> Stream<O> {
        let f: Arc<dyn Fn(T) -> Result<Vec<O>> + Send + Sync> =
            Arc::new(move |v| Ok(f(v).into_iter().collect()));
        self.unary(
            "flat_map",
            false,
            self.partitioning.clone(),
            move |ctx, out, _| {
                Ok(Box::new(FlatMap {
                    f: f.clone(),
                    out,
                    info: OpInfo::from_ctx(ctx),
                }))
            },
            vec![],
        )
    }

    /// Assigns event timestamps and emits watermarks (see [`WatermarkStrategy`]).
    ///
    /// The watermark emitted is part of each checkpoint; a job resuming from one emits it
    /// again before any record (after a rescale, the minimum over the old subtasks).
    /// Chained to a source at parallelism 1 with watermarks per record, every downstream
    /// subtask sees records and watermarks in the same order in every run.
    pub fn with_watermarks(&self, strategy: WatermarkStrategy<T>) -> Stream<T> {
        let alignment = strategy.alignment().cloned();
        let out = self.unary(
            "watermarks",
            false,
            self.partitioning.clone(),
            move |ctx, out, _| {
                let mut op = strategy.operator(out);
                if let Some(r) = ctx.restore
                    && let Some(w) = crate::watermark::restored_watermark(&r.operator)?
                {
                    op.restore(w);
                }
                ctx.participants
                    .register(ctx.operator_id, Rc::new(RefCell::new(op.hooks())));
                Ok(Box::new(op))
            },
            vec![],
        );
        if let Some(a) = alignment {
            super::alignment::align_chained(self, &out, a);
        }
        out
    }

    /// Partitions by key: records with equal keys go to the same subtask, and keyed
    /// operators (state, timers, windows) become available.
    pub fn key_by<K: Key>(&self, f: impl Fn(&T) -> K + Send + Sync + 'static) -> KeyedStream<K, T> {
        KeyedStream::new(self.clone(), Arc::new(f))
    }

    /// Sends records round-robin to the next operator's subtasks.
    pub fn rebalance(&self) -> Stream<T> {
        Stream {
            partitioning: Partitioning::Rebalance,
            ..self.clone()
        }
    }

    /// Sends every record to every subtask of the next operator.
    pub fn broadcast(&self) -> Stream<T> {
        Stream {
            partitioning: Partitioning::Broadcast,
            ..self.clone()
        }
    }

    /// Merges streams of the same type into one.
    pub fn union(&self, others: &[Stream<T>]) -> Stream<T> {
        let mut inputs = vec![self.pending().edge()];
        inputs.extend(others.iter().map(|s| s.pending().edge()));
        let n = inputs.len();
        let id = self.p.add_node(
            NodeDesc {
                name: "union".into(),
                kind: NodeKind::Operator,
                inputs,
                outputs: vec![Port::<T>::port_type()],
                keyed: false,
                parallelism_one: false,
            },
            move |_ctx, mut outputs| {
                let out = Rc::new(RefCell::new(take_output::<T>(&mut outputs, 0)));
                let inputs = (0..n)
                    .map(|_| input::<T>(Box::new(Union { out: out.clone() })))
                    .collect();
                Ok(Built::Operator {
                    inputs,
                    control: Some(Box::new(Union { out })),
                })
            },
        );
        Stream::new(self.p.clone(), id, 0)
    }

    /// Connects with another stream for a two-input function
    /// ([`super::ConnectedStreams::process`]), or with a broadcast stream
    /// ([`Stream::broadcast_state`]) for a broadcast function
    /// ([`super::BroadcastConnectedStreams::process`]).
    pub fn connect<O: super::ConnectWith<T>>(&self, other: &O) -> O::Connected {
        other.connected_with(self)
    }

    /// The side output `tag` of the operator that produced this stream.
    ///
    /// # Panics
    /// When that operator has no side output with this tag.
    pub fn side_output<S: Data>(&self, tag: &OutputTag<S>) -> Stream<S> {
        let port = self.p.side_port(self.node, tag.id()).unwrap_or_else(|| {
            panic!(
                "the operator has no side output named '{}'; declare it on the operator first",
                tag.name()
            )
        });
        Stream::new(self.p.clone(), self.node, port)
    }

    fn rename(self, name: &str) -> Self {
        self.p.edit_node(self.node, |n| n.name = name.to_string());
        self
    }

    /// Sets the display name of the operator that produced this stream.
    pub fn name(self, name: &str) -> Self {
        self.rename(name)
    }

    /// Sets a stable id for the operator that produced this stream (state is matched by
    /// it on restore).
    pub fn uid(self, uid: &str) -> Self {
        self.p
            .edit_node(self.node, |n| n.uid = Some(uid.to_string()));
        self
    }

    /// Sets the parallelism of the operator that produced this stream.
    ///
    /// # Panics
    /// When `parallelism` is 0, or above 1 for a non-parallel source.
    pub fn parallelism(self, parallelism: usize) -> Self {
        assert!(parallelism > 0, "parallelism must be at least 1");
        self.p.edit_node(self.node, |n| {
            assert!(
                !(n.max_parallelism_one && parallelism > 1),
                "operator '{}' is not parallel; its parallelism must stay 1",
                n.name
            );
            n.parallelism = Some(parallelism)
        });
        self
    }

    /// Stops the operator that produced this stream from being chained to its input.
    pub fn disable_chaining(self) -> Self {
        self.p.edit_node(self.node, |n| n.chainable = false);
        self
    }

    /// Writes into a custom sink; `make` creates each subtask's instance on its thread.
    pub fn sink<S: SinkFunction<T>>(
        &self,
        name: &str,
        make: impl Fn() -> S + Send + Sync + 'static,
    ) -> SinkHandle {
        let pending = self.pending();
        let id = self.p.add_node(
            NodeDesc {
                name: name.to_string(),
                kind: NodeKind::Sink,
                inputs: vec![pending.edge()],
                outputs: vec![],
                keyed: false,
                parallelism_one: false,
            },
            move |ctx, _outputs| {
                let op = SinkOp::new(make(), ctx)?;
                Ok(Built::Operator {
                    inputs: vec![input::<T>(Box::new(op))],
                    control: None,
                })
            },
        );
        SinkHandle {
            p: self.p.clone(),
            node: id,
        }
    }

    /// Collects every record for reading after the job (tests and small results).
    pub fn collect(&self) -> Collected<T> {
        let c = Collected::default();
        let target = c.clone();
        self.sink("collect", move || CollectSink {
            target: target.clone(),
            buf: Vec::new(),
        });
        c
    }

    /// Prints every record (`Debug`) to standard output.
    pub fn print(&self) -> SinkHandle
    where
        T: std::fmt::Debug,
    {
        self.sink("print", || PrintSink {
            prefix: String::new(),
        })
    }

    /// Writes one line per record to `dir/part-<subtask>`.
    pub fn write_text(
        &self,
        dir: impl Into<PathBuf>,
        format: impl Fn(&T) -> String + Send + Sync + 'static,
    ) -> SinkHandle {
        let dir = dir.into();
        let format: Arc<dyn Fn(&T) -> String + Send + Sync> = Arc::new(format);
        self.sink("text-file", move || TextFileSink {
            dir: dir.clone(),
            format: format.clone(),
            file: None,
        })
    }

    /// Writes one line per record to `dir` with exactly-once semantics: files are
    /// committed when the checkpoint covering them completes (or at end of input without
    /// checkpoints); uncommitted files start with a dot. See
    /// [`crate::ops::file_sink`] for the protocol and file names.
    ///
    /// `dir` may also be an object-storage URL (`s3://bucket/prefix`, `gs://…`, `az://…`,
    /// `memory://…`): each subtask then writes objects `part-<subtask>-<counter>` by
    /// multipart upload, each appearing whole when the checkpoint covering it completes
    /// (see [`crate::ops::object_sink`]).
    ///
    /// ```
    /// use weir_core::dsl::Pipeline;
    /// let p = Pipeline::new();
    /// p.from_iter(vec![1i64, 2, 3])
    ///     .write_text_exactly_once("memory://doc-dsl/out", |n| n.to_string());
    /// ```
    pub fn write_text_exactly_once(
        &self,
        dir: impl Into<PathBuf>,
        format: impl Fn(&T) -> String + Send + Sync + 'static,
    ) -> SinkHandle {
        let dir = dir.into();
        let format: Arc<dyn Fn(&T) -> String + Send + Sync> = Arc::new(format);
        if let Some(url) = dir.to_str().filter(|d| weir_objstore::is_url(d)) {
            let url = url.to_string();
            let handle = self.sink("exactly-once-object", move || {
                ExactlyOnceObjectSink::new(url.clone(), format.clone())
            });
            // As for a directory: one job run at a time writes below the prefix (leases work
            // on object storage too).
            handle
                .p
                .edit_node(handle.node, |n| n.exclusive_dirs.push(dir));
            return handle;
        }
        let owned = dir.clone();
        let handle = self.sink("exactly-once-file", move || {
            ExactlyOnceFileSink::new(dir.clone(), format.clone())
        });
        // Its restore deletes uncommitted files and commits pending ones: one job run at a
        // time may write into the directory (the workers of one cluster job share it).
        handle
            .p
            .edit_node(handle.node, |n| n.exclusive_dirs.push(owned));
        handle
    }

    /// Drops every record (benchmarks).
    pub fn discard(&self) -> SinkHandle {
        self.sink("discard", || DiscardSink)
    }

    /// Runs `f` on every record in the sink's subtask; `make` creates one closure per subtask.
    pub fn for_each<F: FnMut(T, Timestamp) -> Result<()> + 'static>(
        &self,
        make: impl Fn() -> F + Send + Sync + 'static,
    ) -> SinkHandle {
        self.sink("for_each", move || FnSink {
            f: Box::new(make()),
        })
    }
}

/// The handle of a sink, to set its name and parallelism.
pub struct SinkHandle {
    p: Pipeline,
    node: NodeId,
}

impl SinkHandle {
    /// Sets the sink's display name.
    pub fn name(self, name: &str) -> Self {
        self.p.edit_node(self.node, |n| n.name = name.to_string());
        self
    }
    /// Sets the sink's stable id.
    pub fn uid(self, uid: &str) -> Self {
        self.p
            .edit_node(self.node, |n| n.uid = Some(uid.to_string()));
        self
    }
    /// Sets the sink's parallelism.
    ///
    /// # Panics
    /// When `parallelism` is 0.
    pub fn parallelism(self, parallelism: usize) -> Self {
        assert!(parallelism > 0, "parallelism must be at least 1");
        self.p
            .edit_node(self.node, |n| n.parallelism = Some(parallelism));
        self
    }
    /// Declares a directory that one job run at a time may write into (an exactly-once
    /// sink's output directory, whose restore deletes uncommitted files): the runtime
    /// leases it before the job starts, as for [`Stream::write_text_exactly_once`]. For
    /// sinks defined outside weir-core.
    pub fn exclusive_dir(self, dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        self.p.edit_node(self.node, |n| n.exclusive_dirs.push(dir));
        self
    }
}
