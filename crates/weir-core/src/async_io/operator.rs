//! The async I/O operator: issues each record's request on the process's runtime, takes
//! the answers back on the subtask's thread, retries, applies timeouts, and keeps its
//! in-flight records in checkpoints (what is stored and how a restore shares it: `saved`).
//!
//! Everything but the request itself happens on the subtask's thread: the retrier, the
//! [`Queue`] and the output. The runtime's tasks only run the user's future (under its
//! deadline) and send the answer back on a channel.

use super::queue::{Emit, Queue, Stored};
use super::saved::{Core, Hooks, SavedState, share};
use super::{AsyncFunction, AsyncOptions};
use crate::data::{Data, key_group_range};
use crate::error::{Error, Result};
use crate::graph::BuildContext;
use crate::metrics::{self, Counter, Gauge};
use crate::ops::{OpInfo, guard};
use crate::output::{Control, Output};
use crate::retry::{Decision, Outcome, Retrier};
use crate::time::{MAX_WATERMARK, Timestamp};
use crossbeam_channel::{Receiver, Sender};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A failed attempt, as the subtask's thread sees it.
pub(crate) struct Failure {
    message: String,
    outcome: Outcome,
}

type Call<O> = Pin<Box<dyn Future<Output = std::result::Result<O, Failure>> + Send>>;

/// A timeout handler with its types erased.
type OnTimeout<T, O> = Box<dyn Fn(&T, Duration) -> Result<Option<O>> + Send + Sync>;

/// A key's hash, from a record of a keyed stream.
pub(crate) type KeyHash<T> = Arc<dyn Fn(&T) -> u64 + Send + Sync>;

/// An [`AsyncFunction`] with its types erased.
pub(crate) struct Erased<T, O> {
    call: Box<dyn Fn(T) -> Call<O> + Send + Sync>,
    on_timeout: OnTimeout<T, O>,
}

impl<T: Data, O: Data> Erased<T, O> {
    pub(crate) fn new<A: AsyncFunction<T, O>>(function: A) -> Arc<Self> {
        let f = Arc::new(function);
        let g = f.clone();
        Arc::new(Erased {
            call: Box::new(move |input| {
                let fut = f.call(input);
                let f = f.clone();
                Box::pin(async move {
                    fut.await.map_err(|e| Failure {
                        message: e.to_string(),
                        outcome: f.classify(&e),
                    })
                })
            }),
            on_timeout: Box::new(move |input, timeout| g.on_timeout(input, timeout)),
        })
    }
}

/// Where a stored record goes when a job resumes at another parallelism.
pub(crate) enum Route<T> {
    /// Any subtask (a plain stream): spread round-robin.
    Spread,
    /// The subtask owning the record's key group (a keyed stream): the key's hash.
    KeyGroup(KeyHash<T>),
}

/// What a request's task sends back.
enum Answer<O> {
    Value(O),
    Failed(Failure),
    TimedOut,
    /// The future panicked, or the runtime dropped it.
    Lost,
}

struct Reply<O> {
    tx: Option<Sender<(u64, Answer<O>)>>,
    seq: u64,
}

impl<O> Reply<O> {
    fn send(mut self, answer: Answer<O>) {
        if let Some(tx) = self.tx.take() {
            // The operator is gone (the job failed or was cancelled): nobody waits for it.
            let _ = tx.send((self.seq, answer));
        }
    }
}

impl<O> Drop for Reply<O> {
    fn drop(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send((self.seq, Answer::Lost));
        }
    }
}

/// A request being made: attempts so far, when it times out, and its current attempt's
/// task (aborted when the operator goes away, a failed attempt of the job for instance).
struct Request {
    attempts: u32,
    deadline: Instant,
    task: Option<tokio::task::AbortHandle>,
}

struct AsyncMetrics {
    in_flight: Gauge,
    timeouts: Counter,
}

/// The async I/O operator of one subtask.
pub(crate) struct AsyncOp<T, O> {
    core: Rc<RefCell<Core<T, O>>>,
    out: Box<dyn Output<O>>,
    function: Arc<Erased<T, O>>,
    route: Route<T>,
    max_parallelism: usize,
    capacity: usize,
    timeout: Duration,
    retrier: Option<Retrier>,
    requests: FxHashMap<u64, Request>,
    tx: Sender<(u64, Answer<O>)>,
    rx: Receiver<(u64, Answer<O>)>,
    runtime: tokio::runtime::Handle,
    emits: Vec<Emit<O>>,
    info: OpInfo,
    metrics: AsyncMetrics,
}

impl<T: Data, O: Data> AsyncOp<T, O> {
    /// Builds the subtask's operator, registers its checkpoint hooks and, when the job
    /// resumes, issues again the requests that were in flight at the checkpoint.
    pub(crate) fn new(
        ctx: &BuildContext<'_>,
        opts: &AsyncOptions,
        function: Arc<Erased<T, O>>,
        route: Route<T>,
        out: Box<dyn Output<O>>,
    ) -> Result<Self> {
        let info = OpInfo::from_ctx(ctx);
        opts.validate()
            .map_err(|e| Error::Config(e).at(|| info.location()))?;
        let retrier = match &opts.retry {
            Some(p) => {
                let subtask = info.subtask.to_string();
                let labels = [("operator", &*info.name), ("subtask", subtask.as_str())];
                let r = Retrier::try_new(p.clone(), ctx.subtask as u64 + 1)
                    .map_err(Error::Config)?
                    .with_metric(crate::retry::retry_ratio_gauge(&labels));
                Some(r)
            }
            None => None,
        };
        let subtask = info.subtask.to_string();
        let labels = [("operator", &*info.name), ("subtask", subtask.as_str())];
        let metrics = AsyncMetrics {
            in_flight: metrics::gauge(
                "async_requests_in_flight",
                "Requests an async I/O operator subtask has in flight.",
                &labels,
            ),
            timeouts: metrics::counter(
                "async_timeouts_total",
                "Requests of an async I/O operator that timed out (handled by its timeout handler).",
                &labels,
            ),
        };
        let core = Rc::new(RefCell::new(Core {
            queue: Queue::new(opts.order),
            backlog: VecDeque::new(),
            subtask: ctx.subtask as u32,
            parallelism: ctx.parallelism as u32,
        }));
        ctx.participants
            .register(ctx.operator_id, Rc::new(RefCell::new(Hooks(core.clone()))));
        let (tx, rx) = crossbeam_channel::unbounded();
        let mut op = AsyncOp {
            core,
            out,
            function,
            route,
            max_parallelism: ctx.max_parallelism,
            capacity: opts.capacity,
            timeout: opts.timeout,
            retrier,
            requests: FxHashMap::default(),
            tx,
            rx,
            runtime: super::handle(),
            emits: Vec::new(),
            info,
            metrics,
        };
        if let Some(r) = ctx.restore {
            let restored = op.restored(&r.operator)?;
            let in_flight = restored
                .iter()
                .filter(|(_, s)| matches!(s, Stored::Pending(..)))
                .count();
            if !restored.is_empty() {
                tracing::info!(
                    operator = %op.info.name,
                    subtask = op.info.subtask,
                    checkpoint = r.checkpoint.map(|c| c.0),
                    reissued = in_flight,
                    waiting = restored.len() - in_flight,
                    "async I/O issues again the {in_flight} requests in flight at checkpoint {}",
                    r.checkpoint.map_or(0, |c| c.0)
                );
            }
            op.core.borrow_mut().backlog = restored.into();
            op.admit_backlog()?;
        }
        Ok(op)
    }

    /// This subtask's share of the restored records, in their old order.
    fn restored(&self, blobs: &[Vec<u8>]) -> Result<Vec<(u32, Stored<T, O>)>> {
        let old: Vec<SavedState<T, O>> = blobs
            .iter()
            .map(|b| crate::codec::decode(b))
            .collect::<Result<_>>()
            .map_err(|e| {
                Error::Config(format!(
                    "cannot read the async I/O operator's in-flight records from the checkpoint \
                     ({e}); was the operator's input or output type changed? Give the new \
                     operator another uid, or restart without the checkpoint"
                ))
                .at(|| self.info.location())
            })?;
        let (me, p) = (self.info.subtask, self.info.parallelism);
        let groups = match self.route {
            Route::KeyGroup(_) => Some(key_group_range(me, self.max_parallelism, p)),
            Route::Spread => None,
        };
        Ok(share(old, groups, me, p))
    }

    fn route_of(&self, value: &T) -> u32 {
        match &self.route {
            Route::Spread => 0,
            Route::KeyGroup(hash) => (hash(value) % self.max_parallelism as u64) as u32,
        }
    }

    /// Admits restored records while there is room.
    fn admit_backlog(&mut self) -> Result<()> {
        loop {
            let next = {
                let mut core = self.core.borrow_mut();
                if core.queue.len() >= self.capacity {
                    return Ok(());
                }
                match core.backlog.pop_front() {
                    Some(r) => r,
                    None => return Ok(()),
                }
            };
            match next {
                (route, Stored::Pending(input, ts)) => self.start(input, ts, route)?,
                (route, Stored::Done(output, ts)) => {
                    self.core
                        .borrow_mut()
                        .queue
                        .push_done(output, ts, route, &mut self.emits)
                }
            }
        }
    }

    /// Queues a record and issues its first attempt.
    fn start(&mut self, input: T, ts: Timestamp, route: u32) -> Result<()> {
        let seq = self.core.borrow_mut().queue.push(input, ts, route);
        if let Some(r) = self.retrier.as_mut() {
            r.begin();
        }
        self.requests.insert(
            seq,
            Request {
                attempts: 1,
                deadline: Instant::now() + self.timeout,
                task: None,
            },
        );
        self.issue(seq, Duration::ZERO)
    }

    /// Starts an attempt of request `seq` after `delay`, under the request's deadline.
    fn issue(&mut self, seq: u64, delay: Duration) -> Result<()> {
        let input = self
            .core
            .borrow()
            .queue
            .input(seq)
            .cloned()
            .ok_or_else(|| Error::User(format!("internal: async request {seq} has no input")))?;
        let deadline = self.requests[&seq].deadline;
        let function = &self.function;
        let fut = guard(&self.info, || Ok((function.call)(input)))?;
        let reply = Reply {
            tx: Some(self.tx.clone()),
            seq,
        };
        let deadline = tokio::time::Instant::from_std(deadline);
        let task = self.runtime.spawn(async move {
            let attempt = async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                fut.await
            };
            reply.send(match tokio::time::timeout_at(deadline, attempt).await {
                Ok(Ok(v)) => Answer::Value(v),
                Ok(Err(f)) => Answer::Failed(f),
                Err(_) => Answer::TimedOut,
            });
        });
        if let Some(r) = self.requests.get_mut(&seq) {
            r.task = Some(task.abort_handle());
        }
        Ok(())
    }

    /// Handles one answer.
    fn answer(&mut self, seq: u64, answer: Answer<O>) -> Result<()> {
        let output = match answer {
            Answer::Value(v) => Some(v),
            Answer::TimedOut => {
                self.metrics.timeouts.inc();
                let input = self.core.borrow().queue.input(seq).cloned();
                let Some(input) = input else { return Ok(()) };
                let (function, timeout) = (&self.function, self.timeout);
                guard(&self.info, || (function.on_timeout)(&input, timeout))?
            }
            Answer::Failed(f) => {
                let attempts = self.requests.get(&seq).map_or(1, |r| r.attempts);
                let why = match self.retrier.as_mut() {
                    None => "retries are off (AsyncOptions::retry turns them on)".to_string(),
                    Some(r) => match r.decide(attempts, &f.outcome) {
                        Decision::Retry { after } => {
                            if let Some(r) = self.requests.get_mut(&seq) {
                                r.attempts += 1;
                            }
                            return self.issue(seq, after);
                        }
                        Decision::GiveUp(why) => why.to_string(),
                    },
                };
                let s = if attempts == 1 { "" } else { "s" };
                return Err(Error::User(format!(
                    "an async request failed after {attempts} attempt{s} ({why}): {}",
                    f.message
                ))
                .at(|| self.info.location()));
            }
            Answer::Lost => {
                return Err(Error::Panic(
                    "an async request's future panicked (its message is in the log above)"
                        .to_string(),
                )
                .at(|| self.info.location()));
            }
        };
        self.requests.remove(&seq);
        self.core
            .borrow_mut()
            .queue
            .complete(seq, output, &mut self.emits);
        Ok(())
    }

    /// Handles the answers that arrived, admits restored records, emits what may leave.
    fn poll(&mut self) -> Result<()> {
        while let Ok((seq, a)) = self.rx.try_recv() {
            self.answer(seq, a)?;
        }
        self.admit_backlog()?;
        self.flush()
    }

    /// Waits for at least one answer, then polls.
    fn wait_one(&mut self) -> Result<()> {
        // Every request answers by its deadline (a timeout is an answer); the margin only
        // guards against a runtime that stopped running tasks.
        let limit = self.timeout + Duration::from_secs(60);
        match self.rx.recv_timeout(limit) {
            Ok((seq, a)) => self.answer(seq, a)?,
            Err(_) => {
                return Err(Error::User(format!(
                    "no async request answered within {limit:?} although each times out after {:?}: \
                     the async runtime stopped running them",
                    self.timeout
                ))
                .at(|| self.info.location()));
            }
        }
        self.poll()
    }

    /// Waits until every record has left (end of input).
    fn wait_all(&mut self) -> Result<()> {
        self.poll()?;
        loop {
            {
                let core = self.core.borrow();
                if core.queue.is_empty() && core.backlog.is_empty() {
                    return Ok(());
                }
            }
            self.wait_one()?;
        }
    }

    fn flush(&mut self) -> Result<()> {
        self.metrics
            .in_flight
            .set(self.core.borrow().queue.in_flight() as i64);
        if self.emits.is_empty() {
            return Ok(());
        }
        let mut emits = std::mem::take(&mut self.emits);
        for e in emits.drain(..) {
            match e {
                Emit::Record(Some(v), ts) => self.out.record(v, ts)?,
                Emit::Record(None, _) => {}
                Emit::Watermark(w) => self.out.control(Control::Watermark(w))?,
            }
        }
        self.emits = emits;
        Ok(())
    }
}

impl<T, O> Drop for AsyncOp<T, O> {
    /// Stops the calls still running: nobody will take their answers (the job ended, failed
    /// or is restarting, and a restart issues again what its checkpoint holds).
    fn drop(&mut self) {
        for r in self.requests.values() {
            if let Some(t) = &r.task {
                t.abort();
            }
        }
    }
}

impl<T: Data, O: Data> Output<T> for AsyncOp<T, O> {
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        self.poll()?;
        // Full (or restored records still waiting for room): take no input until a
        // request completes. The wait is the backpressure.
        loop {
            let core = self.core.borrow();
            if core.queue.len() < self.capacity && core.backlog.is_empty() {
                break;
            }
            drop(core);
            self.wait_one()?;
        }
        let route = self.route_of(&value);
        self.start(value, ts, route)?;
        self.flush()
    }

    fn control(&mut self, event: Control) -> Result<()> {
        match event {
            Control::Watermark(w) => {
                self.poll()?;
                self.core
                    .borrow_mut()
                    .queue
                    .push_watermark(w, &mut self.emits);
                if w == MAX_WATERMARK {
                    // The input has ended: every result leaves before the final watermark
                    // (and so before the final checkpoint's barrier).
                    self.wait_all()?;
                }
                self.flush()
            }
            Control::Tick(_) => {
                self.poll()?;
                self.out.control(event)
            }
            // The checkpoint holds the in-flight records as they were when the task took
            // its snapshot, just before this barrier: nothing may be emitted in between,
            // or a result would be both committed and requested again on restore.
            Control::Barrier(_) => self.out.control(event),
            Control::End => {
                self.wait_all()?;
                self.flush()?;
                self.out.control(event)
            }
            Control::Idle(_) | Control::LatencyMarker(_) | Control::Flush => {
                self.out.control(event)
            }
        }
    }
}
