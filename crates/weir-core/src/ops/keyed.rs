//! Keyed one-input operators: the keyed process function (state and timers) and the
//! rolling reduce / aggregate built on it.

use super::side::SideOutputs;
use super::{OpInfo, guard};
use crate::checkpoint::KeyGroupBlobs;
use crate::data::{Data, Key};
use crate::dsl::OutputTag;
use crate::error::Result;
use crate::metrics;
use crate::output::{Collector, Control, Output};
use crate::state::{
    KeyContext, StateContext, StateTableInfo, ValueState, decode_key_groups, encode_by_key_group,
};
use crate::time::{MIN_WATERMARK, NO_TIMESTAMP, Timestamp};
use crate::timer::{TimeDomain, TimerService};
use std::rc::Rc;
use std::sync::Arc;

/// A function over a keyed stream with keyed state and timers (Flink's
/// `KeyedProcessFunction`). One instance runs per subtask, created on the subtask's thread
/// by the factory given to [`crate::dsl::KeyedStream::process_with_state`] (which hands
/// the factory the operator's [`StateContext`], so state handles are plain fields) or to
/// [`crate::dsl::KeyedStream::process`] (then create handles in [`Self::open`]).
///
/// ```
/// use weir_core::prelude::*;
///
/// /// Emits (key, running count) and, one time unit after a key's last record, (key, -1).
/// struct CountThenTimeout { count: ValueState<u64> }
///
/// impl CountThenTimeout {
///     fn new(state: &mut StateContext<String>) -> weir_core::Result<Self> {
///         Ok(CountThenTimeout { count: state.value_state("count")? })
///     }
/// }
///
/// impl KeyedProcessFunction<String, String, (String, i64)> for CountThenTimeout {
///     fn process(&mut self, _v: String, ctx: &mut KeyedContext<'_, String, (String, i64)>) -> weir_core::Result<()> {
///         let n = self.count.update(|c| c.unwrap_or(0) + 1)?;
///         ctx.emit((ctx.key().clone(), n as i64));
///         if let Some(ts) = ctx.timestamp() { ctx.register_event_time_timer(ts + 1); }
///         Ok(())
///     }
///     fn on_timer(&mut self, _t: Timestamp, _d: TimeDomain, ctx: &mut KeyedContext<'_, String, (String, i64)>) -> weir_core::Result<()> {
///         ctx.emit((ctx.key().clone(), -1));
///         Ok(())
///     }
/// }
///
/// let p = Pipeline::new();
/// let _counts = p
///     .from_timestamped(vec![("a".to_string(), 1), ("a".to_string(), 2)])
///     .with_watermarks(WatermarkStrategy::monotonous())
///     .key_by(|k| k.clone())
///     .process_with_state(CountThenTimeout::new)
///     .collect();
/// ```
pub trait KeyedProcessFunction<K, I, O>: 'static {
    /// Called once per subtask before any record. Functions built by a plain factory
    /// ([`crate::dsl::KeyedStream::process`]) create their state handles here; with
    /// [`crate::dsl::KeyedStream::process_with_state`] the factory does, and `open` need
    /// not be implemented.
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

/// The event-time and processing-time timers of a keyed operator: on the heap, or in
/// RocksDB in time order when the job uses the RocksDB backend.
pub struct Timers<K> {
    event: TimerService<K, ()>,
    processing: TimerService<K, ()>,
}

/// Time-domain bytes of the timers' keys in the store.
const EVENT: u8 = 0;
const PROCESSING: u8 = 1;

impl<K: Key> Timers<K> {
    /// The timers of table `name`, in the backend's store if it has one.
    fn new(state: &StateContext<K>, name: &str) -> Result<Self> {
        Ok(Timers {
            event: state.timer_service(name, EVENT, true)?,
            processing: state.timer_service(name, PROCESSING, true)?,
        })
    }
}

/// The timers of a keyed operator as a state table: on the heap (time, key, domain) per
/// key group; in the store, their pending changes.
struct TimersTable<K>(Rc<std::cell::RefCell<Timers<K>>>);

impl<K: Key> StateTableInfo for TimersTable<K> {
    fn entries(&self) -> usize {
        let t = self.0.borrow();
        t.event.in_memory() + t.processing.in_memory()
    }
    fn snapshot(&self, max_parallelism: usize) -> Result<KeyGroupBlobs> {
        let t = self.0.borrow();
        let (Some(event), Some(processing)) = (t.event.as_heap(), t.processing.as_heap()) else {
            return Ok(Vec::new());
        };
        let ev = event.entries();
        let pt = processing.entries();
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
    fn is_persistent(&self) -> bool {
        self.0.borrow_mut().event.as_store().is_some()
    }
    fn take_changes(&self) -> Result<Option<crate::state::Changes>> {
        let mut t = self.0.borrow_mut();
        let Timers { event, processing } = &mut *t;
        let (Some(event), Some(processing)) = (event.as_store(), processing.as_store()) else {
            return Ok(None);
        };
        let mut changes = event.changes();
        event.take_changes_into(&mut changes, None)?;
        processing.take_changes_into(&mut changes, None)?;
        Ok(Some(changes))
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
    side: &'a mut SideOutputs,
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
    /// Emits a record to the side output `tag`, with the current timestamp (Flink's
    /// `ctx.output(tag, value)`). Read it with [`crate::dsl::Stream::side_output`] on the
    /// operator's result.
    ///
    /// # Errors
    /// [`crate::Error::Config`], naming the tag, when the operator does not declare this
    /// side output ([`crate::dsl::Stream::with_side_output`]): it fails the job rather than
    /// dropping the record.
    ///
    /// ```
    /// use weir_core::prelude::*;
    ///
    /// /// Sends negative amounts to a side output, the rest on.
    /// struct Split { negative: OutputTag<(String, i64)> }
    ///
    /// impl KeyedProcessFunction<String, (String, i64), (String, i64)> for Split {
    ///     fn process(&mut self, v: (String, i64), ctx: &mut KeyedContext<'_, String, (String, i64)>) -> weir_core::Result<()> {
    ///         if v.1 < 0 {
    ///             ctx.output(&self.negative, v)?;
    ///         } else {
    ///             ctx.emit(v);
    ///         }
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let p = Pipeline::new();
    /// let negative = OutputTag::<(String, i64)>::new("negative");
    /// let tag = negative.clone();
    /// let positive = p
    ///     .from_collection(vec![("a".to_string(), 5), ("a".to_string(), -2)])
    ///     .key_by(|(k, _)| k.clone())
    ///     .process(move || Split { negative: tag.clone() })
    ///     .with_side_output(&negative);
    /// let _negative = positive.side_output(&negative).collect();
    /// let _positive = positive.collect();
    /// ```
    pub fn output<S: Data>(&mut self, tag: &OutputTag<S>, value: S) -> Result<()> {
        self.side.emit(tag, value)
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
    /// The output buffer and the side outputs, for contexts built on this one (the
    /// interval join's `JoinContext`).
    pub(crate) fn outputs(&mut self) -> (&mut Collector<O>, &mut SideOutputs) {
        (self.out, self.side)
    }
    /// The same context for a shorter borrow (the broadcast operator wraps it).
    pub(crate) fn reborrow(&mut self) -> KeyedContext<'_, K, O> {
        KeyedContext {
            key: self.key,
            timestamp: self.timestamp,
            watermark: self.watermark,
            processing_time: self.processing_time,
            timers: &mut *self.timers,
            out: &mut *self.out,
            side: &mut *self.side,
        }
    }
    /// How many processing-time timers this subtask has pending (all keys), and the
    /// earliest.
    pub(crate) fn processing_timers(&mut self) -> (usize, Option<i64>) {
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
    pub(crate) side: SideOutputs,
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
        let timers = Rc::new(std::cell::RefCell::new(Timers::new(&state, "timers")?));
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
            side: SideOutputs::default(),
        })
    }

    /// Gives the operator its declared side outputs.
    pub(crate) fn with_side_outputs(mut self, side: SideOutputs) -> Self {
        self.side = side;
        self
    }

    /// The operator's state (for metrics).
    pub fn state(&self) -> &StateContext<K> {
        &self.state
    }

    fn fire(&mut self, domain: TimeDomain, upto: Timestamp) -> Result<()> {
        loop {
            let due = match domain {
                TimeDomain::EventTime => self.timers.borrow_mut().event.pop_due(upto)?,
                TimeDomain::ProcessingTime => self.timers.borrow_mut().processing.pop_due(upto)?,
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
                    side,
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
                            side,
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
                self.side.drain(out_ts)?;
            }
        }
    }

    /// End of input: processing-time timers due by the wall clock fire, as they would at
    /// the next tick; the others are dropped (firing them early would emit results that
    /// depend on when the input happened to end), with a log line and a count in
    /// `processing_timers_dropped_total`.
    fn end_of_input(&mut self) -> Result<()> {
        self.now = self.now.max(crate::state::now_ms());
        self.fire(TimeDomain::ProcessingTime, self.now)?;
        let (dropped, earliest) = {
            let mut t = self.timers.borrow_mut();
            let earliest = t.processing.next_time();
            (t.processing.clear()?, earliest)
        };
        let subtask = self.info.subtask.to_string();
        let labels = [
            ("operator", &*self.info.name),
            ("subtask", subtask.as_str()),
        ];
        metrics::counter(
            "processing_timers_dropped_total",
            "Processing-time timers still pending at the end of input, dropped without firing.",
            &labels,
        )
        .add(dropped as u64);
        if let Some(earliest) = earliest {
            tracing::info!(
                operator = %self.info.name,
                subtask = self.info.subtask,
                dropped,
                earliest,
                "end of input: pending processing-time timers are dropped, not fired"
            );
        }
        Ok(())
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
            side,
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
                    side,
                };
                f.process(value, &mut ctx)
            })
        })?;
        if !self.buf.is_empty() {
            self.buf.drain_into(&mut *self.out, ts)?;
        }
        self.side.drain(ts)
    }

    fn prefetch(&mut self, batch: &[(I, Timestamp)]) -> Result<()> {
        if !self.state.prefetches() || batch.len() < 2 {
            return Ok(());
        }
        let (key_fn, state) = (&self.key_fn, &self.state);
        guard(&self.info, || {
            let keys: Vec<K> = batch.iter().map(|(v, _)| key_fn(v)).collect();
            state.prefetch(&keys)
        })
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
            Control::End => self.end_of_input()?,
            Control::Idle(_) | Control::Barrier(_) | Control::LatencyMarker(_) | Control::Flush => {
            }
        }
        self.side.control(event)?;
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
    pub(crate) acc: ValueState<T>,
}

impl<K: Key, T: Data> KeyedProcessFunction<K, T, T> for RollingReduce<T> {
    fn process(&mut self, value: T, ctx: &mut KeyedContext<'_, K, T>) -> Result<()> {
        let acc = &mut self.acc;
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
    pub(crate) acc: ValueState<Acc>,
}

impl<K: Key, I: 'static, Acc: Data, O: 'static> KeyedProcessFunction<K, I, O>
    for RollingAggregate<I, Acc, O>
{
    fn process(&mut self, value: I, ctx: &mut KeyedContext<'_, K, O>) -> Result<()> {
        let st = &mut self.acc;
        let mut acc = st.get()?.unwrap_or_else(|| self.agg.create());
        self.agg.add(&mut acc, value);
        ctx.emit(self.agg.result(&acc));
        st.set(acc)
    }
}

#[cfg(test)]
mod tests;
