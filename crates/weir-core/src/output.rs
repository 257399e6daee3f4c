//! How elements move from one operator to the next inside a task.
//!
//! Owns [`Output`] (the downstream side of an operator: records and control events),
//! [`Control`] (watermarks, end of input, processing-time ticks), [`FanOut`] and
//! [`Collector`] (the buffer user functions emit into). It must not know about threads,
//! channels or state backends.

use crate::error::Result;
use crate::ids::CheckpointId;
use crate::time::Timestamp;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// A control event that flows through a chain of operators in order with the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Event time has advanced to this watermark on every input.
    Watermark(Timestamp),
    /// Every input is idle (no records, no watermark progress) or active again.
    Idle(bool),
    /// Wall-clock processing time, in milliseconds since the Unix epoch. Sent often;
    /// operators fire processing-time timers and flush timed buffers on it.
    Tick(i64),
    /// Checkpoint barrier: every record before it belongs to checkpoint `n`. The task
    /// has already snapshotted its operators when this passes through the chain; channel
    /// writers forward it downstream.
    Barrier(CheckpointId),
    /// No more input will arrive. Sent once, after the final watermark.
    End,
    /// A latency marker on its way from a source to the sinks (see [`LatencyMarker`]).
    /// Operators forward it unchanged; it reaches no user function, and it moves no
    /// watermark and no checkpoint.
    LatencyMarker(LatencyMarker),
    /// The task has nothing else to do right now (its source is idle, or none of its
    /// inputs has a message waiting): channel writers send their partly filled batches
    /// at once instead of at the next flush interval, since no record would join them
    /// while the task waits. Operators forward it unchanged.
    Flush,
}

/// Flink's latency marker: made by a source subtask every latency-tracking interval, it
/// travels with the records (through chains and channels, to one downstream channel in
/// turn) and each sink subtask it reaches measures how long it took.
///
/// Its age is wall-clock time, so across machines it includes their clock difference.
/// It waits behind the records queued before it but not in operators' state (a window
/// does not hold it back): it measures how long records take to flow, not how long
/// results wait for their window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencyMarker {
    /// Microseconds since the Unix epoch when the source made it.
    pub created_us: i64,
    /// The graph node (operator index) of the source that made it.
    pub source: u32,
    /// The source subtask that made it.
    pub subtask: u32,
}

impl LatencyMarker {
    /// A marker made now by subtask `subtask` of source node `source`.
    pub fn now(source: u32, subtask: u32) -> Self {
        LatencyMarker {
            created_us: now_us(),
            source,
            subtask,
        }
    }

    /// Seconds from its making until `now_us` (never negative: a clock that stepped back
    /// reads as 0).
    ///
    /// ```
    /// use weir_core::output::LatencyMarker;
    /// let m = LatencyMarker { created_us: 1_000_000, source: 0, subtask: 0 };
    /// assert_eq!(m.age_seconds(1_250_000), 0.25);
    /// assert_eq!(m.age_seconds(900_000), 0.0);
    /// ```
    pub fn age_seconds(&self, now_us: i64) -> f64 {
        now_us.saturating_sub(self.created_us).max(0) as f64 / 1e6
    }
}

/// Wall-clock time in microseconds since the Unix epoch.
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// The downstream side of an operator: it receives records and control events.
///
/// A chained operator, a channel writer and a sink all implement this.
pub trait Output<T> {
    /// Takes one record with its event timestamp ([`crate::time::NO_TIMESTAMP`] if none).
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()>;
    /// Takes a control event; implementations forward it downstream after handling it.
    fn control(&mut self, event: Control) -> Result<()>;
    /// Sees a batch of records that [`Output::record`] is about to get one by one, in
    /// that order: a keyed operator on RocksDB loads their keys' state with one batched
    /// read. Nothing else may change: the records still come through `record`. Wrappers
    /// pass it on; by default nothing happens.
    fn prefetch(&mut self, batch: &[(T, Timestamp)]) -> Result<()> {
        let _ = batch;
        Ok(())
    }
}

impl<T, O: Output<T> + ?Sized> Output<T> for Box<O> {
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        (**self).record(value, ts)
    }
    fn prefetch(&mut self, batch: &[(T, Timestamp)]) -> Result<()> {
        (**self).prefetch(batch)
    }
    fn control(&mut self, event: Control) -> Result<()> {
        (**self).control(event)
    }
}

/// Sends every element to several outputs (a stream consumed by more than one operator).
pub struct FanOut<T> {
    outputs: Vec<Box<dyn Output<T>>>,
}

impl<T> FanOut<T> {
    /// Builds a fan-out over the given outputs.
    pub fn new(outputs: Vec<Box<dyn Output<T>>>) -> Self {
        FanOut { outputs }
    }
}

impl<T: Clone> Output<T> for FanOut<T> {
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        if let Some((last, rest)) = self.outputs.split_last_mut() {
            for o in rest {
                o.record(value.clone(), ts)?;
            }
            last.record(value, ts)?;
        }
        Ok(())
    }
    fn control(&mut self, event: Control) -> Result<()> {
        for o in &mut self.outputs {
            o.control(event)?;
        }
        Ok(())
    }
}

/// Drops every record; forwards nothing. Used for outputs nobody consumes.
pub struct Discard;

impl<T> Output<T> for Discard {
    fn record(&mut self, _value: T, _ts: Timestamp) -> Result<()> {
        Ok(())
    }
    fn control(&mut self, _event: Control) -> Result<()> {
        Ok(())
    }
}

/// Where a user function emits its results. Records are buffered and handed downstream
/// after the function returns, so emitting never fails inside user code.
///
/// ```
/// use weir_core::output::Collector;
/// let mut out = Collector::new();
/// out.emit(1);
/// out.emit_at(2, 100);
/// assert_eq!(out.len(), 2);
/// ```
pub struct Collector<T> {
    buf: Vec<(T, Option<Timestamp>)>,
}

impl<T> Default for Collector<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Collector<T> {
    /// An empty collector.
    pub fn new() -> Self {
        Collector { buf: Vec::new() }
    }
    /// Emits a record with the timestamp of the input that caused it.
    pub fn emit(&mut self, value: T) {
        self.buf.push((value, None));
    }
    /// Emits a record with an explicit event timestamp.
    pub fn emit_at(&mut self, value: T, ts: Timestamp) {
        self.buf.push((value, Some(ts)));
    }
    /// Number of records emitted and not yet handed downstream.
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    /// True when nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    /// Hands the buffered records to `out`; records without a timestamp get `default_ts`.
    pub fn drain_into(&mut self, out: &mut dyn Output<T>, default_ts: Timestamp) -> Result<()> {
        for (v, ts) in self.buf.drain(..) {
            out.record(v, ts.unwrap_or(default_ts))?;
        }
        Ok(())
    }
    /// Takes the buffered records out (for tests and adapters).
    pub fn take(&mut self) -> Vec<(T, Option<Timestamp>)> {
        std::mem::take(&mut self.buf)
    }
}

/// Counts the records that pass into an output and remembers the last watermark that
/// passed: the runtime wraps operators' outputs in it to report records out and the
/// current watermark per operator subtask.
///
/// The cells are written with relaxed stores (one writer, the subtask's thread) and read
/// by whoever reports them.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
/// use weir_core::output::{Control, Counted, Discard, Output};
/// let (records, watermark) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicI64::new(0)));
/// let mut out = Counted::new(Box::new(Discard), records.clone(), watermark.clone());
/// Output::<i64>::record(&mut out, 1, 0).unwrap();
/// Output::<i64>::record(&mut out, 2, 0).unwrap();
/// Output::<i64>::control(&mut out, Control::Watermark(7)).unwrap();
/// assert_eq!(records.load(Ordering::Relaxed), 2);
/// assert_eq!(watermark.load(Ordering::Relaxed), 7);
/// ```
pub struct Counted<T> {
    inner: Box<dyn Output<T>>,
    count: u64,
    records: Arc<AtomicU64>,
    watermark: Arc<AtomicI64>,
}

impl<T> Counted<T> {
    /// Wraps `inner`; `records` receives the running count (from its current value on),
    /// `watermark` every watermark that passes.
    pub fn new(
        inner: Box<dyn Output<T>>,
        records: Arc<AtomicU64>,
        watermark: Arc<AtomicI64>,
    ) -> Self {
        Counted {
            inner,
            count: records.load(Ordering::Relaxed),
            records,
            watermark,
        }
    }
}

/// Takes the latency markers out of the events into a sink: hands each to `observe` and
/// forwards everything else to the sink. The runtime puts it in front of every sink when
/// latency tracking is on.
///
/// ```
/// use std::cell::Cell;
/// use std::rc::Rc;
/// use weir_core::output::{Control, Discard, LatencyMarker, LatencyObserved, Output};
/// let seen = Rc::new(Cell::new(0));
/// let s = seen.clone();
/// let mut sink = LatencyObserved::new(Box::new(Discard), Box::new(move |_| s.set(s.get() + 1)));
/// let m = LatencyMarker { created_us: 0, source: 0, subtask: 0 };
/// Output::<i64>::control(&mut sink, Control::LatencyMarker(m)).unwrap();
/// Output::<i64>::record(&mut sink, 1, 0).unwrap();
/// assert_eq!(seen.get(), 1);
/// ```
pub struct LatencyObserved<T> {
    inner: Box<dyn Output<T>>,
    observe: Box<dyn FnMut(LatencyMarker)>,
}

impl<T> LatencyObserved<T> {
    /// Wraps the sink input `inner`.
    pub fn new(inner: Box<dyn Output<T>>, observe: Box<dyn FnMut(LatencyMarker)>) -> Self {
        LatencyObserved { inner, observe }
    }
}

impl<T> Output<T> for LatencyObserved<T> {
    #[inline]
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        self.inner.record(value, ts)
    }
    fn prefetch(&mut self, batch: &[(T, Timestamp)]) -> Result<()> {
        self.inner.prefetch(batch)
    }
    fn control(&mut self, event: Control) -> Result<()> {
        match event {
            Control::LatencyMarker(m) => {
                (self.observe)(m);
                Ok(())
            }
            e => self.inner.control(e),
        }
    }
}

impl<T> Output<T> for Counted<T> {
    #[inline]
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        self.count += 1;
        self.records.store(self.count, Ordering::Relaxed);
        self.inner.record(value, ts)
    }
    fn prefetch(&mut self, batch: &[(T, Timestamp)]) -> Result<()> {
        self.inner.prefetch(batch)
    }
    fn control(&mut self, event: Control) -> Result<()> {
        if let Control::Watermark(w) = event {
            self.watermark.store(w, Ordering::Relaxed);
        }
        self.inner.control(event)
    }
}
