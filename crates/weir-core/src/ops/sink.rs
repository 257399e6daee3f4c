//! Sinks: the operator that runs a [`SinkFunction`], and the built-in sinks (collect,
//! print, plain text files, discard).

use super::{OpInfo, guard};
use crate::checkpoint::{Checkpointed, OperatorSnapshot};
use crate::error::{Error, Result};
use crate::graph::BuildContext;
use crate::ids::CheckpointId;
use crate::output::{Control, Output};
use crate::time::Timestamp;
use std::cell::RefCell;
use std::fmt::Debug;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex};

/// Which subtask a sink instance is, and how the job runs.
#[derive(Debug, Clone)]
pub struct SinkContext {
    /// This subtask's index.
    pub subtask: usize,
    /// The sink's parallelism.
    pub parallelism: usize,
    /// True when the job takes checkpoints (a transactional sink commits on checkpoint
    /// completion; otherwise it commits at end of input).
    pub checkpointing: bool,
    /// The checkpoint interval and timeout, when the job takes checkpoints.
    pub checkpoint_timing: Option<(std::time::Duration, std::time::Duration)>,
    /// The sink's display name.
    pub name: String,
    /// The sink's stable operator id: its uid, or derived from its position in the graph.
    /// Unique among the operators of a job (two sinks of one job never share it), and the
    /// key its checkpointed state is restored under.
    pub operator_id: String,
}

#[cfg(test)]
impl SinkContext {
    /// The context of the only subtask of a checkpointing sink, for unit tests.
    pub(crate) fn single(name: &str) -> Self {
        SinkContext {
            subtask: 0,
            parallelism: 1,
            checkpointing: true,
            checkpoint_timing: None,
            name: name.into(),
            operator_id: format!("0-{name}"),
        }
    }
}

/// Writes records somewhere. One instance per subtask, created on its thread.
///
/// ```
/// use weir_core::ops::sink::{SinkContext, SinkFunction};
/// struct Sum(i64);
/// impl SinkFunction<i64> for Sum {
///     fn invoke(&mut self, v: i64, _ts: i64) -> weir_core::Result<()> { self.0 += v; Ok(()) }
/// }
/// let mut s = Sum(0);
/// s.invoke(2, 0).unwrap();
/// assert_eq!(s.0, 2);
/// ```
pub trait SinkFunction<T>: 'static {
    /// Called before `open` when the job resumes from checkpoint `checkpoint`, with the
    /// snapshots of every subtask of the previous run (the parallelism may have changed).
    fn restore(
        &mut self,
        checkpoint: CheckpointId,
        states: &[Vec<u8>],
        ctx: &SinkContext,
    ) -> Result<()> {
        let _ = (checkpoint, states, ctx);
        Ok(())
    }
    /// Pre-commit at a checkpoint barrier: make everything written so far durable but not
    /// yet visible, and return what a restore needs to commit it (`None`: stateless sink).
    fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<Option<(Vec<u8>, String)>> {
        let _ = checkpoint;
        Ok(None)
    }
    /// Checkpoint `checkpoint` completed: commit what was pre-committed up to it.
    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<()> {
        let _ = checkpoint;
        Ok(())
    }
    /// Called once before the first record.
    fn open(&mut self, ctx: &SinkContext) -> Result<()> {
        let _ = ctx;
        Ok(())
    }
    /// Called for each record with its timestamp.
    fn invoke(&mut self, value: T, ts: Timestamp) -> Result<()>;
    /// Called once at the end of input (flush here).
    fn finish(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Runs a [`SinkFunction`] as the last operator of a chain.
pub struct SinkOp<T, S> {
    pub(crate) sink: Rc<RefCell<S>>,
    pub(crate) info: OpInfo,
    pub(crate) _p: std::marker::PhantomData<fn(T)>,
}

impl<T: 'static, S: SinkFunction<T>> SinkOp<T, S> {
    /// Restores (when resuming), opens the sink and registers its checkpoint hooks.
    pub fn new(mut sink: S, ctx: &BuildContext<'_>) -> Result<Self> {
        let info = OpInfo::from_ctx(ctx);
        let sctx = SinkContext {
            subtask: info.subtask,
            parallelism: info.parallelism,
            checkpointing: ctx.checkpointing,
            checkpoint_timing: ctx.checkpoint_timing,
            name: ctx.name.to_string(),
            operator_id: ctx.operator_id.to_string(),
        };
        if let Some(r) = ctx.restore
            && let Some(id) = r.checkpoint
        {
            if r.operator.iter().any(|s| !s.is_empty()) {
                // Restoring commits what the checkpoint pre-committed: only once it is
                // known sound.
                r.verified.wait()?;
            }
            guard(&info, || sink.restore(id, &r.operator, &sctx))?;
        }
        guard(&info, || sink.open(&sctx))?;
        let sink = Rc::new(RefCell::new(sink));
        let hooks = SinkHooks {
            sink: sink.clone(),
            info: info.clone(),
            _p: std::marker::PhantomData,
        };
        ctx.participants
            .register(ctx.operator_id, Rc::new(RefCell::new(hooks)));
        Ok(SinkOp {
            sink,
            info,
            _p: std::marker::PhantomData,
        })
    }
}

impl<T, S: SinkFunction<T>> Output<T> for SinkOp<T, S> {
    #[inline]
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        let s = &self.sink;
        guard(&self.info, || s.borrow_mut().invoke(value, ts))
    }
    fn control(&mut self, event: Control) -> Result<()> {
        if event == Control::End {
            let s = &self.sink;
            guard(&self.info, || s.borrow_mut().finish())?;
        }
        Ok(())
    }
}

struct SinkHooks<T, S> {
    sink: Rc<RefCell<S>>,
    info: OpInfo,
    _p: std::marker::PhantomData<fn(T)>,
}

impl<T, S: SinkFunction<T>> Checkpointed for SinkHooks<T, S> {
    fn snapshot(&mut self, id: CheckpointId) -> Result<OperatorSnapshot> {
        let s = &self.sink;
        Ok(match guard(&self.info, || s.borrow_mut().snapshot(id))? {
            Some((bytes, desc)) => OperatorSnapshot {
                operator: Some(bytes),
                description: Some(desc),
                ..OperatorSnapshot::default()
            },
            None => OperatorSnapshot::default(),
        })
    }
    fn notify_complete(&mut self, id: CheckpointId) -> Result<()> {
        let s = &self.sink;
        guard(&self.info, || s.borrow_mut().notify_complete(id))
    }
}

/// The records a collect sink gathered, readable after the job ends.
///
/// Subtasks hand over their records when their input ends; the order across subtasks is
/// not defined, so tests sort before comparing.
pub struct Collected<T> {
    inner: Arc<Mutex<Vec<T>>>,
    /// Batches pre-committed at a checkpoint barrier, by checkpoint, not yet visible. They
    /// live here rather than in a sink instance so that a restart, whose new instances
    /// restore from a checkpoint that completed before its notification arrived, can still
    /// commit them.
    pending: Arc<Mutex<PendingBatches<T>>>,
}

/// Batches of records by the checkpoint whose barrier closed them.
type PendingBatches<T> = Vec<(CheckpointId, Vec<T>)>;

impl<T> Clone for Collected<T> {
    fn clone(&self) -> Self {
        Collected {
            inner: self.inner.clone(),
            pending: self.pending.clone(),
        }
    }
}

impl<T> Default for Collected<T> {
    fn default() -> Self {
        Collected {
            inner: Arc::new(Mutex::new(Vec::new())),
            pending: Arc::new(Mutex::new(Vec::new())),
        }
    }
}

impl<T> Collected<T> {
    /// Makes the pending batches of checkpoints up to `checkpoint` visible; drops the later
    /// ones when `drop_later` (a restore from `checkpoint` replays them).
    fn commit_up_to(&self, checkpoint: CheckpointId, drop_later: bool) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let mut target = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut *pending)
            .into_iter()
            .partition(|(c, _)| *c <= checkpoint);
        for (_, mut batch) in done {
            target.append(&mut batch);
        }
        if !drop_later {
            *pending = keep;
        }
    }
}

impl<T: Clone> Collected<T> {
    /// A copy of everything collected so far.
    pub fn values(&self) -> Vec<T> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    /// Everything collected so far, sorted.
    pub fn sorted(&self) -> Vec<T>
    where
        T: Ord,
    {
        let mut v = self.values();
        v.sort();
        v
    }
    /// Takes everything collected so far out.
    pub fn take(&self) -> Vec<T> {
        std::mem::take(&mut *self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }
    /// Number of records collected.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
    /// True when nothing was collected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Gathers records into a [`Collected`] handle (for tests and small results).
pub struct CollectSink<T> {
    pub(crate) target: Collected<T>,
    pub(crate) buf: Vec<T>,
}

/// With checkpoints the collect sink is transactional: records are held back until the
/// checkpoint that covers them completes, so a restart neither loses nor repeats them.
impl<T: Send + 'static> SinkFunction<T> for CollectSink<T> {
    fn restore(
        &mut self,
        checkpoint: CheckpointId,
        _states: &[Vec<u8>],
        _ctx: &SinkContext,
    ) -> Result<()> {
        // The checkpoint restored from completed: what was pre-committed up to it is
        // committed (its notification may never have arrived), the rest is replayed.
        self.target.commit_up_to(checkpoint, true);
        Ok(())
    }
    fn open(&mut self, _ctx: &SinkContext) -> Result<()> {
        // Whatever an earlier attempt pre-committed and a restore did not commit is replayed
        // (a start from scratch replays everything). Every subtask opens before the first
        // barrier, so this never drops a batch of this attempt.
        self.target
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        Ok(())
    }
    fn invoke(&mut self, value: T, _ts: Timestamp) -> Result<()> {
        self.buf.push(value);
        Ok(())
    }
    fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<Option<(Vec<u8>, String)>> {
        let batch = std::mem::take(&mut self.buf);
        self.target
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((checkpoint, batch));
        Ok(None)
    }
    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<()> {
        self.target.commit_up_to(checkpoint, false);
        Ok(())
    }
    fn finish(&mut self) -> Result<()> {
        let mut target = self.target.inner.lock().unwrap_or_else(|p| p.into_inner());
        target.append(&mut self.buf);
        Ok(())
    }
}

/// Prints records to standard output, prefixed with the subtask when parallel.
pub struct PrintSink {
    pub(crate) prefix: String,
}

impl<T: Debug> SinkFunction<T> for PrintSink {
    fn open(&mut self, ctx: &SinkContext) -> Result<()> {
        if ctx.parallelism > 1 {
            self.prefix = format!("{}{}> ", self.prefix, ctx.subtask + 1);
        }
        Ok(())
    }
    fn invoke(&mut self, value: T, _ts: Timestamp) -> Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}{:?}", self.prefix, value).map_err(|e| Error::io("standard output", e))
    }
}

/// Writes one line per record to `dir/part-<subtask>` (a plain, non-transactional file).
pub struct TextFileSink<T> {
    pub(crate) dir: PathBuf,
    pub(crate) format: Arc<dyn Fn(&T) -> String + Send + Sync>,
    pub(crate) file: Option<(PathBuf, std::io::BufWriter<std::fs::File>)>,
}

impl<T> TextFileSink<T> {
    /// The file a subtask writes.
    pub fn part_path(dir: &Path, subtask: usize) -> PathBuf {
        dir.join(format!("part-{subtask}"))
    }
}

impl<T: 'static> SinkFunction<T> for TextFileSink<T> {
    fn open(&mut self, ctx: &SinkContext) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io(self.dir.display(), e))?;
        let path = Self::part_path(&self.dir, ctx.subtask);
        // Append: after a restart the records since the last checkpoint are written again
        // (at-least-once), and nothing written before the failure is lost.
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(path.display(), e))?;
        self.file = Some((path, std::io::BufWriter::new(f)));
        Ok(())
    }
    fn invoke(&mut self, value: T, _ts: Timestamp) -> Result<()> {
        let line = (self.format)(&value);
        let (path, f) = self.file.as_mut().expect("opened");
        writeln!(f, "{line}").map_err(|e| Error::io(path.display(), e))
    }
    fn finish(&mut self) -> Result<()> {
        if let Some((path, f)) = self.file.as_mut() {
            f.flush().map_err(|e| Error::io(path.display(), e))?;
            f.get_ref()
                .sync_all()
                .map_err(|e| Error::io(path.display(), e))?;
        }
        Ok(())
    }
}

/// Drops every record.
pub struct DiscardSink;

impl<T> SinkFunction<T> for DiscardSink {
    #[inline]
    fn invoke(&mut self, _value: T, _ts: Timestamp) -> Result<()> {
        Ok(())
    }
}

/// Runs a closure on every record (e.g. to count or check results).
pub struct FnSink<T> {
    pub(crate) f: Box<dyn FnMut(T, Timestamp) -> Result<()>>,
}

impl<T: 'static> SinkFunction<T> for FnSink<T> {
    fn invoke(&mut self, value: T, ts: Timestamp) -> Result<()> {
        (self.f)(value, ts)
    }
}

#[cfg(test)]
mod collect_tests {
    use super::*;

    fn ctx() -> SinkContext {
        SinkContext::single("collect")
    }

    fn sink(c: &Collected<i32>) -> CollectSink<i32> {
        CollectSink {
            target: c.clone(),
            buf: Vec::new(),
        }
    }

    /// A job fails after checkpoint 1 completed but before its sink heard so: the restart
    /// restores from 1 and must show checkpoint 1's records once, and not those after it.
    #[test]
    fn a_restart_commits_what_the_restored_checkpoint_covers() {
        let c = Collected::default();
        let mut old = sink(&c);
        old.invoke(1, 0).unwrap();
        old.snapshot(CheckpointId(1)).unwrap();
        old.invoke(2, 0).unwrap();
        old.snapshot(CheckpointId(2)).unwrap();
        old.invoke(3, 0).unwrap();
        assert!(
            c.is_empty(),
            "nothing is visible before a checkpoint completes"
        );

        let mut new = sink(&c);
        new.restore(CheckpointId(1), &[], &ctx()).unwrap();
        new.open(&ctx()).unwrap();
        assert_eq!(c.values(), vec![1]);
        new.invoke(2, 0).unwrap();
        new.snapshot(CheckpointId(3)).unwrap();
        new.notify_complete(CheckpointId(3)).unwrap();
        assert_eq!(c.values(), vec![1, 2]);
    }

    /// A job fails before any checkpoint completed and starts again from scratch: what the
    /// failed attempt pre-committed must not show up when the new attempt's checkpoints
    /// complete (their numbers may be the same).
    #[test]
    fn a_start_from_scratch_drops_what_a_failed_attempt_pre_committed() {
        let c = Collected::default();
        let mut old = sink(&c);
        old.invoke(1, 0).unwrap();
        old.snapshot(CheckpointId(1)).unwrap();
        let mut new = sink(&c);
        new.open(&ctx()).unwrap();
        new.invoke(1, 0).unwrap();
        new.snapshot(CheckpointId(1)).unwrap();
        new.notify_complete(CheckpointId(1)).unwrap();
        assert_eq!(c.values(), vec![1]);
    }
}
