//! Keyed one-input operators: the keyed process function (state and timers) and the
//! rolling reduce / aggregate built on it.

use super::{OpInfo, guard};
use crate::checkpoint::KeyGroupBlobs;
use crate::data::{Data, Key};
use crate::error::Result;
use crate::output::{Collector, Control, Output};
use crate::state::{
    KeyContext, StateContext, StateTableInfo, ValueState, decode_key_groups, encode_by_key_group,
};
use crate::time::{MIN_WATERMARK, NO_TIMESTAMP, Timestamp};
use crate::timer::{TimeDomain, TimerQueue};
use std::rc::Rc;
use std::sync::Arc;

/// A function over a keyed stream with keyed state and timers (Flink's
/// `KeyedProcessFunction`). One instance runs per subtask, created on the subtask's thread
/// by the factory given to `KeyedStream::process`, so it may hold state handles.
///
/// ```
/// use weir_core::prelude::*;
///
/// /// Emits (key, running count) and, one time unit after a key's last record, (key, -1).
/// #[derive(Default)]
/// struct CountThenTimeout { count: Option<ValueState<u64>> }
///
/// impl KeyedProcessFunction<String, String, (String, i64)> for CountThenTimeout {
///     fn open(&mut self, state: &mut StateContext<String>) -> weir_core::Result<()> {
///         self.count = Some(state.value_state("count")?);
///         Ok(())
///     }
///     fn process(&mut self, _v: String, ctx: &mut KeyedContext<'_, String, (String, i64)>) -> weir_core::Result<()> {
///         let c = self.count.as_mut().unwrap();
///         let n = c.get()?.unwrap_or(0) + 1;
///         c.set(n)?;
///         ctx.emit((ctx.key().clone(), n as i64));
///         if let Some(ts) = ctx.timestamp() { ctx.register_event_time_timer(ts + 1); }
///         Ok(())
///     }
///     fn on_timer(&mut self, _t: Timestamp, _d: TimeDomain, ctx: &mut KeyedContext<'_, String, (String, i64)>) -> weir_core::Result<()> {
///         ctx.emit((ctx.key().clone(), -1));
///         Ok(())
///     }
/// }
/// # let _ = CountThenTimeout::default();
/// ```
pub trait KeyedProcessFunction<K, I, O>: 'static {
    /// Called once per subtask before any record; create state handles here.
    fn open(&mut self, state: &mut StateContext<K>) -> Result<()> {
        let _ = state;
        Ok(())
    }
    /// Called for each record, with its key current.
    fn process(&mut self, value: I, ctx: &mut KeyedContext<'_, K, O>) -> Result<()>;
    /// Called when a timer registered for the current key fires.
    fn on_timer(
        &mut self,
        time: Timestamp,
        domain: TimeDomain,
        ctx: &mut KeyedContext<'_, K, O>,
    ) -> Result<()> {
        let _ = (time, domain, ctx);
        Ok(())
    }
}

/// The event-time and processing-time timers of a keyed operator.
pub struct Timers<K> {
    event: TimerQueue<K, ()>,
    processing: TimerQueue<K, ()>,
}

impl<K: Key> Default for Timers<K> {
    fn default() -> Self {
        Timers {
            event: TimerQueue::default(),
            processing: TimerQueue::default(),
        }
    }
}

/// The timers of a keyed operator as a state table: (time, key, domain) per key group.
struct TimersTable<K>(Rc<std::cell::RefCell<Timers<K>>>);

impl<K: Key> StateTableInfo for TimersTable<K> {
    fn entries(&self) -> usize {
        let t = self.0.borrow();
        t.event.len() + t.processing.len()
    }
    fn snapshot(&self, max_parallelism: usize) -> Result<KeyGroupBlobs> {
        let t = self.0.borrow();
        let ev = t.event.entries();
        let pt = t.processing.entries();
        let items = ev
            .iter()
            .map(|(ts, k, ())| (k, (*ts, false)))
            .chain(pt.iter().map(|(ts, k, ())| (k, (*ts, true))));
        encode_by_key_group(max_parallelism, items)
    }
    fn restore(&self, blobs: &KeyGroupBlobs) -> Result<()> {
        let mut t = self.0.borrow_mut();
        for (k, (ts, processing)) in decode_key_groups::<K, (Timestamp, bool)>(blobs)? {
            if processing {
                t.processing.register(ts, k, ());
            } else {
                t.event.register(ts, k, ());
            }
        }
        Ok(())
    }
}

/// What a keyed function sees while it handles a record or a timer.
pub struct KeyedContext<'a, K, O> {
    key: &'a K,
    timestamp: Option<Timestamp>,
    watermark: Timestamp,
    processing_time: i64,
    timers: &'a mut Timers<K>,
    out: &'a mut Collector<O>,
}

impl<K: Key, O> KeyedContext<'_, K, O> {
    /// The current key.
    pub fn key(&self) -> &K {
        self.key
    }
    /// The timestamp of the current record (or the firing timer's time), if any.
    pub fn timestamp(&self) -> Option<Timestamp> {
        self.timestamp
    }
    /// The operator's current watermark.
    pub fn current_watermark(&self) -> Timestamp {
        self.watermark
    }
    /// Wall-clock time in milliseconds since the Unix epoch, as of the last tick.
    pub fn current_processing_time(&self) -> i64 {
        self.processing_time
    }
    /// Emits a record with the current timestamp.
    pub fn emit(&mut self, value: O) {
        self.out.emit(value)
    }
    /// Emits a record with the given timestamp.
    pub fn emit_at(&mut self, value: O, ts: Timestamp) {
        self.out.emit_at(value, ts)
    }
    /// Registers an event-time timer for the current key (duplicates are merged).
    pub fn register_event_time_timer(&mut self, time: Timestamp) {
        self.timers.event.register(time, self.key.clone(), ());
    }
    /// Deletes an event-time timer of the current key.
    pub fn delete_event_time_timer(&mut self, time: Timestamp) {
        self.timers.event.delete(time, self.key.clone(), ());
    }
    /// Registers a processing-time timer for the current key (ms since the Unix epoch).
    pub fn register_processing_time_timer(&mut self, time: i64) {
        self.timers.processing.register(time, self.key.clone(), ());
    }
    /// Deletes a processing-time timer of the current key.
    pub fn delete_processing_time_timer(&mut self, time: i64) {
        self.timers.processing.delete(time, self.key.clone(), ());
    }
    /// How many processing-time timers this subtask has pending (all keys), and the
    /// earliest.
    pub(crate) fn processing_timers(&self) -> (usize, Option<i64>) {
        (
            self.timers.processing.len(),
            self.timers.processing.next_time(),
        )
    }
}

/// Runs a [`KeyedProcessFunction`].
pub struct KeyedProcess<K, I, O, P> {
    pub(crate) key_fn: Arc<dyn Fn(&I) -> K + Send + Sync>,
    pub(crate) f: P,
    pub(crate) key: Rc<KeyContext<K>>,
    pub(crate) state: StateContext<K>,
    pub(crate) timers: Rc<std::cell::RefCell<Timers<K>>>,
    pub(crate) buf: Collector<O>,
    pub(crate) out: Box<dyn Output<O>>,
    pub(crate) info: OpInfo,
    pub(crate) watermark: Timestamp,
    pub(crate) now: i64,
}

impl<K: Key, I, O: Data, P: KeyedProcessFunction<K, I, O>> KeyedProcess<K, I, O, P> {
    /// Builds the operator and opens the function.
    pub fn new(
        key_fn: Arc<dyn Fn(&I) -> K + Send + Sync>,
        mut f: P,
        mut state: StateContext<K>,
        out: Box<dyn Output<O>>,
        info: OpInfo,
    ) -> Result<Self> {
        guard(&info, || f.open(&mut state))?;
        let timers = Rc::new(std::cell::RefCell::new(Timers::default()));
        state.register_table("timers", Rc::new(TimersTable(timers.clone())))?;
        Ok(KeyedProcess {
            key_fn,
            f,
            key: state.key_context().clone(),
            state,
            timers,
            buf: Collector::new(),
            out,
            info,
            watermark: MIN_WATERMARK,
            now: 0,
        })
    }

    /// The operator's state (for metrics).
    pub fn state(&self) -> &StateContext<K> {
        &self.state
    }

    fn fire(&mut self, domain: TimeDomain, upto: Timestamp) -> Result<()> {
        loop {
            let due = match domain {
                TimeDomain::EventTime => self.timers.borrow_mut().event.pop_due(upto),
                TimeDomain::ProcessingTime => self.timers.borrow_mut().processing.pop_due(upto),
            };
            let Some((ts, keys)) = due else { return Ok(()) };
            for (k, ()) in keys {
                self.key.set(k);
                let KeyedProcess {
                    f,
                    key,
                    timers,
                    buf,
                    info,
                    watermark,
                    now,
                    ..
                } = self;
                let (wm, now) = (*watermark, *now);
                let mut timers = timers.borrow_mut();
                guard(info, || {
                    key.with(|k| {
                        let mut ctx = KeyedContext {
                            key: k,
                            timestamp: Some(ts),
                            watermark: wm,
                            processing_time: now,
                            timers: &mut timers,
                            out: buf,
                        };
                        f.on_timer(ts, domain, &mut ctx)
                    })
                })?;
                let out_ts = if domain == TimeDomain::EventTime {
                    ts
                } else {
                    NO_TIMESTAMP
                };
                self.buf.drain_into(&mut *self.out, out_ts)?;
            }
        }
    }
}

impl<K: Key, I, O: Data, P: KeyedProcessFunction<K, I, O>> Output<I> for KeyedProcess<K, I, O, P> {
    #[inline]
    fn record(&mut self, value: I, ts: Timestamp) -> Result<()> {
        let KeyedProcess {
            key_fn,
            f,
            key,
            timers,
            buf,
            info,
            watermark,
            now,
            ..
        } = self;
        let (wm, now) = (*watermark, *now);
        let mut timers = timers.borrow_mut();
        guard(info, || {
            key.set(key_fn(&value));
            key.with(|k| {
                let mut ctx = KeyedContext {
                    key: k,
                    timestamp: (ts != NO_TIMESTAMP).then_some(ts),
                    watermark: wm,
                    processing_time: now,
                    timers: &mut timers,
                    out: buf,
                };
                f.process(value, &mut ctx)
            })
        })?;
        if !self.buf.is_empty() {
            self.buf.drain_into(&mut *self.out, ts)?;
        }
        Ok(())
    }

    fn control(&mut self, event: Control) -> Result<()> {
        match event {
            Control::Watermark(w) => {
                self.watermark = w;
                self.fire(TimeDomain::EventTime, w)?;
            }
            Control::Tick(now) => {
                self.now = now;
                self.fire(TimeDomain::ProcessingTime, now)?;
            }
            Control::Idle(_) | Control::Barrier(_) | Control::End => {}
        }
        self.out.control(event)
    }
}

/// Combines values of the same type (window and rolling reduce).
pub type ReduceFn<T> = Arc<dyn Fn(T, T) -> T + Send + Sync>;

/// An incremental aggregation: an accumulator per key (or window) that values are added
/// to, read out with [`AggregateFunction::result`]; `merge` joins two accumulators
/// (session windows).
///
/// ```
/// use weir_core::ops::keyed::AggregateFunction;
/// /// Average of i64 values.
/// struct Avg;
/// impl AggregateFunction<i64, (i64, u64), f64> for Avg {
///     fn create(&self) -> (i64, u64) { (0, 0) }
///     fn add(&self, acc: &mut (i64, u64), v: i64) { acc.0 += v; acc.1 += 1; }
///     fn result(&self, acc: &(i64, u64)) -> f64 { acc.0 as f64 / acc.1 as f64 }
///     fn merge(&self, acc: &mut (i64, u64), other: (i64, u64)) { acc.0 += other.0; acc.1 += other.1; }
/// }
/// let mut acc = Avg.create();
/// Avg.add(&mut acc, 1);
/// Avg.add(&mut acc, 2);
/// assert_eq!(Avg.result(&acc), 1.5);
/// ```
pub trait AggregateFunction<I, Acc, O>: Send + Sync + 'static {
    /// A new, empty accumulator.
    fn create(&self) -> Acc;
    /// Adds a value to an accumulator.
    fn add(&self, acc: &mut Acc, value: I);
    /// The result for an accumulator.
    fn result(&self, acc: &Acc) -> O;
    /// Merges `other` into `acc`.
    fn merge(&self, acc: &mut Acc, other: Acc);
}

/// Counts values: the result is the number of values added.
#[derive(Clone, Copy, Default)]
pub struct Count;

impl<I> AggregateFunction<I, u64, u64> for Count {
    fn create(&self) -> u64 {
        0
    }
    fn add(&self, acc: &mut u64, _value: I) {
        *acc += 1;
    }
    fn result(&self, acc: &u64) -> u64 {
        *acc
    }
    fn merge(&self, acc: &mut u64, other: u64) {
        *acc += other;
    }
}

/// Rolling reduce: emits the reduced value of the key after every record.
pub(crate) struct RollingReduce<T> {
    pub(crate) f: ReduceFn<T>,
    pub(crate) acc: Option<ValueState<T>>,
}

impl<K: Key, T: Data> KeyedProcessFunction<K, T, T> for RollingReduce<T> {
    fn open(&mut self, state: &mut StateContext<K>) -> Result<()> {
        self.acc = Some(state.value_state("reduce")?);
        Ok(())
    }
    fn process(&mut self, value: T, ctx: &mut KeyedContext<'_, K, T>) -> Result<()> {
        let acc = self.acc.as_mut().expect("opened");
        let next = match acc.get()? {
            Some(prev) => (self.f)(prev, value),
            None => value,
        };
        acc.set(next.clone())?;
        ctx.emit(next);
        Ok(())
    }
}

/// Rolling aggregate: emits the aggregate's result for the key after every record.
pub(crate) struct RollingAggregate<I, Acc, O> {
    pub(crate) agg: Arc<dyn AggregateFunction<I, Acc, O>>,
    pub(crate) acc: Option<ValueState<Acc>>,
}

impl<K: Key, I: 'static, Acc: Data, O: 'static> KeyedProcessFunction<K, I, O>
    for RollingAggregate<I, Acc, O>
{
    fn open(&mut self, state: &mut StateContext<K>) -> Result<()> {
        self.acc = Some(state.value_state("aggregate")?);
        Ok(())
    }
    fn process(&mut self, value: I, ctx: &mut KeyedContext<'_, K, O>) -> Result<()> {
        let st = self.acc.as_mut().expect("opened");
        let mut acc = st.get()?.unwrap_or_else(|| self.agg.create());
        self.agg.add(&mut acc, value);
        ctx.emit(self.agg.result(&acc));
        st.set(acc)
    }
}
