//! Sources: the [`SourceFunction`] trait and the built-in sources (collections and
//! iterators, line-by-line text files, and the benchmark generator).

use super::figures::SourceFigures;
use super::{NodeDesc, Pipeline, Stream};
use crate::checkpoint::{Checkpointed, OperatorSnapshot};
use crate::codec;
use crate::data::Data;
use crate::error::{Error, Result};
use crate::graph::{Built, NodeKind, Port, SourceStatus, SourceTask, take_output};
use crate::ids::CheckpointId;
use crate::ops::{OpInfo, guard};
use crate::output::{Control, Output};
use crate::time::{MAX_WATERMARK, MIN_WATERMARK, NO_TIMESTAMP, Timestamp};
use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;

pub use super::splits::GeneratorSource;
use super::splits::TextFileSource;
use std::sync::{Arc, Mutex};

/// Records a source emits per poll before the runtime checks for cancellation and ticks.
pub const SOURCE_BATCH: usize = 1024;

/// Which subtask a source instance is, and where it reports its figures.
///
/// ```
/// use weir_core::dsl::SourceContext;
/// let ctx = SourceContext::new(1, 2).operator("clicks");
/// assert_eq!((ctx.subtask, ctx.parallelism, ctx.operator.as_str()), (1, 2, "clicks"));
/// assert!(ctx.figures.partitions().is_empty());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SourceContext {
    /// This subtask's index.
    pub subtask: usize,
    /// The source's parallelism.
    pub parallelism: usize,
    /// The source's operator name (as given to `Pipeline::source`): the `operator` label
    /// of the metrics it registers.
    pub operator: String,
    /// Where the source reports the partitions it reads and its position in each (read
    /// by the runtime's REST API).
    pub figures: SourceFigures,
    /// In a watermark alignment group: the highest watermark the group lets this subtask
    /// read up to. A source that reads several splits and tracks a watermark per split
    /// pauses the splits beyond it and reads the others (split-level alignment); other
    /// sources can ignore it (the runtime pauses the whole subtask when its watermark is
    /// too far ahead).
    pub alignment: Option<crate::watermark::AlignmentHandle>,
}

impl SourceContext {
    /// Subtask `subtask` of `parallelism`, with an empty operator name and figures nobody
    /// reads (for tests and for sources built outside a job).
    pub fn new(subtask: usize, parallelism: usize) -> Self {
        SourceContext {
            subtask,
            parallelism,
            operator: String::new(),
            figures: SourceFigures::default(),
            alignment: None,
        }
    }

    /// The same context with the operator name `name`.
    pub fn operator(mut self, name: &str) -> Self {
        self.operator = name.to_string();
        self
    }
}

/// Where a source emits its records.
pub struct SourceOutput<'a, T> {
    out: &'a mut dyn Output<T>,
    emitted: usize,
    watermark: Timestamp,
}

impl<T> SourceOutput<'_, T> {
    /// Emits a record without a timestamp.
    pub fn emit(&mut self, value: T) -> Result<()> {
        self.emitted += 1;
        self.out.record(value, NO_TIMESTAMP)
    }
    /// Emits a record with an event timestamp.
    pub fn emit_at(&mut self, value: T, ts: Timestamp) -> Result<()> {
        self.emitted += 1;
        self.out.record(value, ts)
    }
    /// Advances event time: no record with a timestamp at or below `watermark` follows.
    /// For sources that track event time themselves (for example per input partition, or
    /// from marker records): the watermark goes downstream at once, in order with the
    /// records, not on a processing-time tick. A watermark that does not advance event
    /// time is dropped.
    ///
    /// The highest watermark a source subtask emitted is part of each checkpoint; a job
    /// resuming from one emits it again before the first poll (after a rescale, the
    /// minimum over the old subtasks).
    ///
    /// ```
    /// use weir_core::prelude::*;
    /// /// Emits (key, ts) pairs in timestamp order, each followed by its watermark.
    /// struct Ordered { next: i64 }
    /// impl SourceFunction<(u32, i64)> for Ordered {
    ///     fn poll(&mut self, out: &mut SourceOutput<'_, (u32, i64)>) -> weir_core::Result<SourceStatus> {
    ///         while self.next < 100 && out.emitted() < 10 {
    ///             out.emit_at((self.next as u32 % 3, self.next), self.next)?;
    ///             out.emit_watermark(self.next)?;
    ///             self.next += 1;
    ///         }
    ///         Ok(if self.next == 100 { SourceStatus::Finished } else { SourceStatus::More })
    ///     }
    /// }
    /// let p = Pipeline::new();
    /// let _s: Stream<(u32, i64)> = p.source("ordered", |_| Ordered { next: 0 }).parallelism(1);
    /// ```
    pub fn emit_watermark(&mut self, watermark: Timestamp) -> Result<()> {
        if watermark <= self.watermark {
            return Ok(());
        }
        self.watermark = watermark;
        self.out.control(Control::Watermark(watermark))
    }
    /// Marks this source subtask idle (downstream watermarks stop waiting for it) or
    /// active again.
    pub fn mark_idle(&mut self, idle: bool) -> Result<()> {
        self.out.control(Control::Idle(idle))
    }
    /// Records emitted in this poll.
    pub fn emitted(&self) -> usize {
        self.emitted
    }
}

/// Produces a stream's records. One instance per subtask, created on its thread.
///
/// `poll` emits a batch (about [`SOURCE_BATCH`] records) and says whether more will come.
///
/// ```
/// use weir_core::prelude::*;
/// /// Counts from 0 to n-1, split across subtasks.
/// struct Counter { next: u64, n: u64, step: u64 }
/// impl SourceFunction<u64> for Counter {
///     fn poll(&mut self, out: &mut SourceOutput<'_, u64>) -> weir_core::Result<SourceStatus> {
///         while self.next < self.n && out.emitted() < 1024 {
///             out.emit(self.next)?;
///             self.next += self.step;
///         }
///         Ok(if self.next >= self.n { SourceStatus::Finished } else { SourceStatus::More })
///     }
/// }
/// let p = Pipeline::new();
/// let s: Stream<u64> = p.source("counter", |ctx| Counter {
///     next: ctx.subtask as u64, n: 100, step: ctx.parallelism as u64,
/// });
/// # let _ = s;
/// ```
pub trait SourceFunction<T>: 'static {
    /// Called once before `open` when the job resumes from a checkpoint, with the
    /// snapshots of every subtask of the previous run (the parallelism may have changed:
    /// pick this subtask's share, e.g. the splits with `split % parallelism == subtask`).
    fn restore(&mut self, states: &[Vec<u8>], ctx: &SourceContext) -> Result<()> {
        let _ = (states, ctx);
        Ok(())
    }
    /// Called once before the first poll.
    fn open(&mut self, ctx: &SourceContext) -> Result<()> {
        let _ = ctx;
        Ok(())
    }
    /// Emits the next records.
    fn poll(&mut self, out: &mut SourceOutput<'_, T>) -> Result<SourceStatus>;
    /// The source's position at a checkpoint barrier, with a human-readable summary
    /// (`None`: the source keeps no position and restarts from its beginning).
    fn snapshot(&mut self) -> Result<Option<(Vec<u8>, String)>> {
        Ok(None)
    }
    /// A checkpoint that includes this source's position completed.
    fn notify_complete(&mut self, id: CheckpointId) -> Result<()> {
        let _ = id;
        Ok(())
    }
}

struct SourceRunner<T, S> {
    src: Rc<RefCell<S>>,
    out: Box<dyn Output<T>>,
    info: OpInfo,
    emitted: u64,
    /// The highest watermark the source emitted (shared with its checkpoint hooks).
    watermark: Rc<Cell<Timestamp>>,
    /// A restored watermark still to emit before anything else.
    restored: Option<Timestamp>,
}

impl<T, S> SourceRunner<T, S> {
    fn resume(&mut self) -> Result<()> {
        if let Some(w) = self.restored.take()
            && w > self.watermark.get()
        {
            self.watermark.set(w);
            self.out.control(Control::Watermark(w))?;
        }
        Ok(())
    }
}

impl<T: 'static, S: SourceFunction<T>> SourceTask for SourceRunner<T, S> {
    fn poll(&mut self) -> Result<SourceStatus> {
        self.resume()?;
        let mut src = self.src.borrow_mut();
        let mut so = SourceOutput {
            out: &mut *self.out,
            emitted: 0,
            watermark: self.watermark.get(),
        };
        let r = guard(&self.info, || src.poll(&mut so));
        self.emitted += so.emitted as u64;
        self.watermark.set(so.watermark);
        r
    }
    fn emitted(&self) -> u64 {
        self.emitted
    }
    fn control(&mut self, event: Control) -> Result<()> {
        self.resume()?;
        if let Control::Watermark(w) = event
            && w > self.watermark.get()
        {
            self.watermark.set(w);
        }
        self.out.control(event)
    }
    fn watermark(&self) -> Option<Timestamp> {
        Some(self.watermark.get()).filter(|w| *w != MIN_WATERMARK)
    }
}

struct SourceHooks<T, S> {
    src: Rc<RefCell<S>>,
    info: OpInfo,
    watermark: Rc<Cell<Timestamp>>,
    _t: std::marker::PhantomData<fn() -> T>,
}

impl<T: 'static, S: SourceFunction<T>> Checkpointed for SourceHooks<T, S> {
    fn snapshot(&mut self, _id: CheckpointId) -> Result<OperatorSnapshot> {
        let src = &self.src;
        let state = guard(&self.info, || src.borrow_mut().snapshot())?;
        let mut snap = match state {
            Some((bytes, description)) => OperatorSnapshot {
                operator: Some(bytes),
                description: Some(description),
                ..OperatorSnapshot::default()
            },
            None => OperatorSnapshot::default(),
        };
        // Only a source that emits watermarks itself has one to restore.
        let wm = self.watermark.get();
        if wm != MIN_WATERMARK && wm != MAX_WATERMARK {
            snap.watermark = Some(wm);
        }
        Ok(snap)
    }
    fn notify_complete(&mut self, id: CheckpointId) -> Result<()> {
        let src = &self.src;
        guard(&self.info, || src.borrow_mut().notify_complete(id))
    }
}

impl Pipeline {
    /// Adds a source; `make` creates the instance of each subtask on its thread.
    pub fn source<T: Data, S: SourceFunction<T>>(
        &self,
        name: &str,
        make: impl Fn(SourceContext) -> S + Send + Sync + 'static,
    ) -> Stream<T> {
        self.source_node(name, false, make)
    }

    pub(crate) fn source_node<T: Data, S: SourceFunction<T>>(
        &self,
        name: &str,
        parallelism_one: bool,
        make: impl Fn(SourceContext) -> S + Send + Sync + 'static,
    ) -> Stream<T> {
        let id = self.add_node(
            NodeDesc {
                name: name.to_string(),
                kind: NodeKind::Source,
                inputs: vec![],
                outputs: vec![Port::<T>::port_type()],
                keyed: false,
                parallelism_one,
            },
            move |ctx, mut outputs| {
                let info = OpInfo::from_ctx(ctx);
                let sctx = SourceContext {
                    subtask: ctx.subtask,
                    parallelism: ctx.parallelism,
                    operator: ctx.name.to_string(),
                    figures: ctx.source_figures.clone(),
                    alignment: ctx.alignment.cloned(),
                };
                let mut src = make(sctx.clone());
                if let Some(r) = ctx.restore {
                    guard(&info, || src.restore(&r.operator, &sctx))?;
                }
                guard(&info, || src.open(&sctx))?;
                let src = Rc::new(RefCell::new(src));
                let watermark = Rc::new(Cell::new(MIN_WATERMARK));
                let hooks = SourceHooks::<T, S> {
                    src: src.clone(),
                    info: info.clone(),
                    watermark: watermark.clone(),
                    _t: std::marker::PhantomData,
                };
                ctx.participants
                    .register(ctx.operator_id, Rc::new(RefCell::new(hooks)));
                let out = take_output::<T>(&mut outputs, 0);
                Ok(Built::Source(Box::new(SourceRunner {
                    src,
                    out,
                    info,
                    emitted: 0,
                    watermark,
                    restored: ctx.restore.and_then(|r| r.watermark),
                })))
            },
        );
        Stream::new(self.clone(), id, 0)
    }

    /// A non-parallel source emitting the elements of a collection, in order, without
    /// timestamps.
    pub fn from_collection<T: Data + Sync>(&self, items: Vec<T>) -> Stream<T> {
        let items = Arc::new(items);
        self.source_node("collection", true, move |_| VecSource {
            items: items.clone(),
            next: 0,
        })
    }

    /// A non-parallel source emitting the elements of a collection with the timestamps
    /// given alongside.
    pub fn from_timestamped<T: Data + Sync>(&self, items: Vec<(T, Timestamp)>) -> Stream<T> {
        let items = Arc::new(items);
        self.source_node("collection", true, move |_| TimestampedSource {
            items: items.clone(),
            next: 0,
        })
    }

    /// A non-parallel source draining an iterator (which can run only once: a job that
    /// needs to restart from the beginning should use a collection or a file).
    pub fn from_iter<T: Data, I>(&self, iter: I) -> Stream<T>
    where
        I: IntoIterator<Item = T>,
        I::IntoIter: Send + 'static,
    {
        let cell: Arc<Mutex<Option<Box<dyn Iterator<Item = T> + Send>>>> =
            Arc::new(Mutex::new(Some(Box::new(iter.into_iter()))));
        self.source_node("iterator", true, move |_| IterSource {
            cell: cell.clone(),
            iter: None,
            skip: 0,
            emitted: 0,
        })
    }

    /// A parallel source reading a UTF-8 text file line by line, without timestamps.
    ///
    /// The file is cut into as many splits as the source's parallelism at the job's first
    /// start (split `s` holds lines `s, s+S, s+2S, ...`); subtask `r` reads the splits with
    /// `s % P == r`. Positions are checkpointed per split, so a job resumes where it left
    /// off, at any parallelism. At parallelism 1 lines come in file order.
    pub fn read_text_file(&self, path: impl Into<PathBuf>) -> Stream<String> {
        let path = path.into();
        self.source_node("text-file", false, move |ctx| {
            TextFileSource::new(path.clone(), ctx, None)
        })
    }

    /// Like [`Pipeline::read_text_file`], emitting at most `records_per_sec` lines per
    /// second per subtask (to replay a file at a realistic pace).
    pub fn read_text_file_at_rate(
        &self,
        path: impl Into<PathBuf>,
        records_per_sec: u64,
    ) -> Stream<String> {
        let path = path.into();
        self.source_node("text-file", false, move |ctx| {
            TextFileSource::new(path.clone(), ctx, Some(records_per_sec))
        })
    }

    /// The benchmark generator (see [`GeneratorSource`]): `(key, value)` records with
    /// event timestamps, parallel and interleaved in event time.
    pub fn generator(&self, events: u64, keys: u64) -> Stream<(u64, i64)> {
        self.source_node("generator", false, move |ctx| {
            GeneratorSource::new(events, keys, ctx)
        })
    }
}

/// Decodes the single position of a non-parallel source from its restored states.
fn restore_position(states: &[Vec<u8>]) -> Result<usize> {
    match states {
        [] => Ok(0),
        [one] => Ok(codec::decode::<u64>(one)? as usize),
        many => Err(Error::Config(format!(
            "a non-parallel source found {} saved positions in the checkpoint; expected one",
            many.len()
        ))),
    }
}

struct VecSource<T> {
    items: Arc<Vec<T>>,
    next: usize,
}

impl<T: Data> SourceFunction<T> for VecSource<T> {
    fn restore(&mut self, states: &[Vec<u8>], _ctx: &SourceContext) -> Result<()> {
        self.next = restore_position(states)?.min(self.items.len());
        Ok(())
    }
    fn poll(&mut self, out: &mut SourceOutput<'_, T>) -> Result<SourceStatus> {
        let end = (self.next + SOURCE_BATCH).min(self.items.len());
        for v in &self.items[self.next..end] {
            out.emit(v.clone())?;
        }
        self.next = end;
        Ok(if end == self.items.len() {
            SourceStatus::Finished
        } else {
            SourceStatus::More
        })
    }
    fn snapshot(&mut self) -> Result<Option<(Vec<u8>, String)>> {
        Ok(Some((
            codec::encode(&(self.next as u64))?,
            format!("position {} of {}", self.next, self.items.len()),
        )))
    }
}

struct TimestampedSource<T> {
    items: Arc<Vec<(T, Timestamp)>>,
    next: usize,
}

impl<T: Data> SourceFunction<T> for TimestampedSource<T> {
    fn restore(&mut self, states: &[Vec<u8>], _ctx: &SourceContext) -> Result<()> {
        self.next = restore_position(states)?.min(self.items.len());
        Ok(())
    }
    fn poll(&mut self, out: &mut SourceOutput<'_, T>) -> Result<SourceStatus> {
        let end = (self.next + SOURCE_BATCH).min(self.items.len());
        for (v, ts) in &self.items[self.next..end] {
            out.emit_at(v.clone(), *ts)?;
        }
        self.next = end;
        Ok(if end == self.items.len() {
            SourceStatus::Finished
        } else {
            SourceStatus::More
        })
    }
    fn snapshot(&mut self) -> Result<Option<(Vec<u8>, String)>> {
        Ok(Some((
            codec::encode(&(self.next as u64))?,
            format!("position {} of {}", self.next, self.items.len()),
        )))
    }
}

type SharedIter<T> = Arc<Mutex<Option<Box<dyn Iterator<Item = T> + Send>>>>;

struct IterSource<T> {
    cell: SharedIter<T>,
    iter: Option<Box<dyn Iterator<Item = T> + Send>>,
    skip: usize,
    emitted: usize,
}

impl<T: Data> SourceFunction<T> for IterSource<T> {
    fn restore(&mut self, states: &[Vec<u8>], _ctx: &SourceContext) -> Result<()> {
        self.skip = restore_position(states)?;
        Ok(())
    }
    fn open(&mut self, _ctx: &SourceContext) -> Result<()> {
        self.iter = self.cell.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(it) = self.iter.as_mut() else {
            return Err(Error::Config(
                "an iterator source can run only once per process; use from_collection or a file \
                 source for jobs that restart in-process"
                    .into(),
            ));
        };
        // Resuming: the program rebuilt the same iterator; skip what was already emitted.
        for _ in 0..self.skip {
            if it.next().is_none() {
                break;
            }
        }
        self.emitted = self.skip;
        Ok(())
    }
    fn poll(&mut self, out: &mut SourceOutput<'_, T>) -> Result<SourceStatus> {
        let it = self.iter.as_mut().expect("opened");
        for _ in 0..SOURCE_BATCH {
            match it.next() {
                Some(v) => {
                    self.emitted += 1;
                    out.emit(v)?
                }
                None => return Ok(SourceStatus::Finished),
            }
        }
        Ok(SourceStatus::More)
    }
    fn snapshot(&mut self) -> Result<Option<(Vec<u8>, String)>> {
        Ok(Some((
            codec::encode(&(self.emitted as u64))?,
            format!("{} items emitted", self.emitted),
        )))
    }
}
