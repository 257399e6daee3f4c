//! Sources: the [`SourceFunction`] trait and the built-in sources (collections and
//! iterators, line-by-line text files, and the benchmark generator).

use super::{NodeDesc, Pipeline, Stream};
use crate::data::Data;
use crate::error::{Error, Result};
use crate::graph::{Built, NodeKind, Port, SourceStatus, SourceTask, take_output};
use crate::ops::{OpInfo, guard};
use crate::output::{Control, Output};
use crate::time::{NO_TIMESTAMP, Timestamp};
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Records a source emits per poll before the runtime checks for cancellation and ticks.
pub const SOURCE_BATCH: usize = 1024;

/// Which subtask a source instance is.
#[derive(Debug, Clone, Copy)]
pub struct SourceContext {
    /// This subtask's index.
    pub subtask: usize,
    /// The source's parallelism.
    pub parallelism: usize,
}

/// Where a source emits its records.
pub struct SourceOutput<'a, T> {
    out: &'a mut dyn Output<T>,
    emitted: usize,
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
    /// Called once before the first poll.
    fn open(&mut self, ctx: &SourceContext) -> Result<()> {
        let _ = ctx;
        Ok(())
    }
    /// Emits the next records.
    fn poll(&mut self, out: &mut SourceOutput<'_, T>) -> Result<SourceStatus>;
}

struct SourceRunner<T, S> {
    src: S,
    out: Box<dyn Output<T>>,
    info: OpInfo,
    emitted: u64,
}

impl<T: 'static, S: SourceFunction<T>> SourceTask for SourceRunner<T, S> {
    fn poll(&mut self) -> Result<SourceStatus> {
        let SourceRunner {
            src,
            out,
            info,
            emitted,
        } = self;
        let mut so = SourceOutput {
            out: &mut **out,
            emitted: 0,
        };
        let r = guard(info, || src.poll(&mut so));
        *emitted += so.emitted as u64;
        r
    }
    fn emitted(&self) -> u64 {
        self.emitted
    }
    fn control(&mut self, event: Control) -> Result<()> {
        self.out.control(event)
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
                outputs: vec![Port::<T>::new()],
                keyed: false,
                parallelism_one,
            },
            move |ctx, mut outputs| {
                let info = OpInfo::from_ctx(ctx);
                let sctx = SourceContext {
                    subtask: ctx.subtask,
                    parallelism: ctx.parallelism,
                };
                let mut src = make(sctx);
                guard(&info, || src.open(&sctx))?;
                let out = take_output::<T>(&mut outputs, 0);
                Ok(Built::Source(Box::new(SourceRunner {
                    src,
                    out,
                    info,
                    emitted: 0,
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
        })
    }

    /// A parallel source reading a UTF-8 text file line by line; subtask `r` of `P` emits
    /// lines `r, r+P, r+2P, ...` (line numbers from 0), without timestamps.
    pub fn read_text_file(&self, path: impl Into<PathBuf>) -> Stream<String> {
        let path = path.into();
        self.source_node("text-file", false, move |ctx| TextFileSource {
            path: path.clone(),
            reader: None,
            line_no: 0,
            ctx,
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

struct VecSource<T> {
    items: Arc<Vec<T>>,
    next: usize,
}

impl<T: Data> SourceFunction<T> for VecSource<T> {
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
}

struct TimestampedSource<T> {
    items: Arc<Vec<(T, Timestamp)>>,
    next: usize,
}

impl<T: Data> SourceFunction<T> for TimestampedSource<T> {
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
}

type SharedIter<T> = Arc<Mutex<Option<Box<dyn Iterator<Item = T> + Send>>>>;

struct IterSource<T> {
    cell: SharedIter<T>,
    iter: Option<Box<dyn Iterator<Item = T> + Send>>,
}

impl<T: Data> SourceFunction<T> for IterSource<T> {
    fn open(&mut self, _ctx: &SourceContext) -> Result<()> {
        self.iter = self.cell.lock().unwrap_or_else(|p| p.into_inner()).take();
        if self.iter.is_none() {
            return Err(Error::Config(
                "an iterator source can run only once; use from_collection or a file to rerun"
                    .into(),
            ));
        }
        Ok(())
    }
    fn poll(&mut self, out: &mut SourceOutput<'_, T>) -> Result<SourceStatus> {
        let it = self.iter.as_mut().expect("opened");
        for _ in 0..SOURCE_BATCH {
            match it.next() {
                Some(v) => out.emit(v)?,
                None => return Ok(SourceStatus::Finished),
            }
        }
        Ok(SourceStatus::More)
    }
}

struct TextFileSource {
    path: PathBuf,
    reader: Option<std::io::BufReader<std::fs::File>>,
    line_no: u64,
    ctx: SourceContext,
}

impl SourceFunction<String> for TextFileSource {
    fn open(&mut self, _ctx: &SourceContext) -> Result<()> {
        let f = std::fs::File::open(&self.path).map_err(|e| Error::io(self.path.display(), e))?;
        self.reader = Some(std::io::BufReader::new(f));
        Ok(())
    }
    fn poll(&mut self, out: &mut SourceOutput<'_, String>) -> Result<SourceStatus> {
        let reader = self.reader.as_mut().expect("opened");
        let mut buf = Vec::new();
        while out.emitted() < SOURCE_BATCH {
            buf.clear();
            let n = reader
                .read_until(b'\n', &mut buf)
                .map_err(|e| Error::io(self.path.display(), e))?;
            if n == 0 {
                return Ok(SourceStatus::Finished);
            }
            let line_no = self.line_no;
            self.line_no += 1;
            if line_no % self.ctx.parallelism as u64 != self.ctx.subtask as u64 {
                continue;
            }
            while matches!(buf.last(), Some(b'\n' | b'\r')) {
                buf.pop();
            }
            let line = String::from_utf8(std::mem::take(&mut buf)).map_err(|_| {
                Error::Malformed(format!(
                    "{} line {}: not valid UTF-8",
                    self.path.display(),
                    line_no + 1
                ))
            })?;
            out.emit(line)?;
        }
        Ok(SourceStatus::More)
    }
}

/// The benchmark generator: event `i` for `i in 0..events` is `(i % keys, i)` with event
/// timestamp `i`. Subtask `r` of `P` emits `i = r, r+P, r+2P, ...`, so the subtasks
/// advance through event time together.
///
/// ```
/// use weir_core::dsl::{GeneratorSource, SourceContext};
/// let g = GeneratorSource::new(10, 3, SourceContext { subtask: 1, parallelism: 2 });
/// assert_eq!(g.indices().collect::<Vec<_>>(), vec![1, 3, 5, 7, 9]);
/// ```
pub struct GeneratorSource {
    next: u64,
    events: u64,
    keys: u64,
    step: u64,
}

impl GeneratorSource {
    /// The generator of subtask `ctx.subtask`.
    pub fn new(events: u64, keys: u64, ctx: SourceContext) -> Self {
        GeneratorSource {
            next: ctx.subtask as u64,
            events,
            keys: keys.max(1),
            step: ctx.parallelism as u64,
        }
    }
    /// The event indices this subtask emits.
    pub fn indices(&self) -> impl Iterator<Item = u64> + use<> {
        (self.next..self.events).step_by(self.step as usize)
    }
}

impl SourceFunction<(u64, i64)> for GeneratorSource {
    fn poll(&mut self, out: &mut SourceOutput<'_, (u64, i64)>) -> Result<SourceStatus> {
        let mut i = self.next;
        let end = self
            .events
            .min(i.saturating_add(self.step * SOURCE_BATCH as u64));
        while i < end {
            out.emit_at((i % self.keys, i as i64), i as i64)?;
            i += self.step;
        }
        self.next = i;
        Ok(if i >= self.events {
            SourceStatus::Finished
        } else {
            SourceStatus::More
        })
    }
}
