//! [`WindowedStream`]: a keyed stream grouped into event-time windows, with reduce,
//! aggregate and process window functions, allowed lateness and a late-data side output.

use super::keyed::state_context;
use super::{KeyedStream, OutputTag, Stream};
use crate::data::{Data, Key};
use crate::error::Result;
use crate::graph::{Port, PortType, take_output};
use crate::ops::OpInfo;
use crate::ops::keyed::AggregateFunction;
use crate::output::{Collector, Output};
use crate::time::Timestamp;
use crate::window::{TimeWindow, WindowAssigner, WindowFn, WindowOperator};
use std::marker::PhantomData;
use std::sync::Arc;

/// A keyed stream grouped into windows; finish it with `reduce`, `aggregate` or `process`.
///
/// ```
/// use weir_core::prelude::*;
/// let p = Pipeline::new();
/// let late = OutputTag::<(String, i64)>::new("late");
/// let per_window = p
///     .from_timestamped(vec![(("a".to_string(), 1i64), 1), (("a".to_string(), 2), 12)])
///     .with_watermarks(WatermarkStrategy::bounded_out_of_orderness(5))
///     .key_by(|(k, _)| k.clone())
///     .window(WindowAssigner::tumbling(10))
///     .allowed_lateness(5)
///     .side_output_late_data(&late)
///     .reduce(|a, b| (a.0, a.1 + b.1));
/// let _late_records = per_window.side_output(&late).collect();
/// let _sums = per_window.collect();
/// ```
pub struct WindowedStream<K, T> {
    keyed: KeyedStream<K, T>,
    assigner: WindowAssigner,
    lateness: Timestamp,
    late_tag: Option<u64>,
}

impl<K: Key, T: Data> WindowedStream<K, T> {
    pub(crate) fn new(keyed: KeyedStream<K, T>, assigner: WindowAssigner) -> Self {
        WindowedStream {
            keyed,
            assigner,
            lateness: 0,
            late_tag: None,
        }
    }

    /// Keeps each window's state this long after it fired; records arriving meanwhile
    /// update the window and fire it again.
    pub fn allowed_lateness(mut self, lateness: Timestamp) -> Self {
        self.lateness = lateness.max(0);
        self
    }

    /// Sends records that arrive after their windows were dropped to the side output `tag`
    /// (read it with [`Stream::side_output`] on the result); otherwise they are dropped.
    pub fn side_output_late_data(mut self, tag: &OutputTag<T>) -> Self {
        self.late_tag = Some(tag.id());
        self
    }

    fn build<O: Data, F>(self, name: &str, f: impl Fn() -> F + Send + Sync + 'static) -> Stream<O>
    where
        F: WindowFn<K, T, O>,
    {
        let key_fn = self.keyed.key_fn.clone();
        let (assigner, lateness, has_late) =
            (self.assigner, self.lateness, self.late_tag.is_some());
        let extra: Vec<Arc<dyn PortType>> = if has_late {
            vec![Port::<T>::port_type()]
        } else {
            vec![]
        };
        let out = self.keyed.stream.unary(
            name,
            true,
            self.keyed.partitioning(),
            move |ctx, out, outputs| {
                let late: Option<Box<dyn Output<T>>> =
                    has_late.then(|| take_output::<T>(outputs, 1));
                let mut state = state_context::<K>(ctx)?;
                let op = WindowOperator::new(
                    key_fn.clone(),
                    assigner,
                    lateness,
                    f(),
                    &mut state,
                    out,
                    late,
                    OpInfo::from_ctx(ctx),
                )?;
                Ok(Box::new(op))
            },
            extra,
        );
        if let Some(tag) = self.late_tag {
            out.p.register_side_port(out.node, tag, 1);
        }
        out
    }

    /// Reduces each window's records to one record (emitted when the window fires).
    pub fn reduce(self, f: impl Fn(T, T) -> T + Send + Sync + 'static) -> Stream<T> {
        let f: Arc<dyn Fn(T, T) -> T + Send + Sync> = Arc::new(f);
        self.build("window-reduce", move || ReduceWindow { f: f.clone() })
    }

    /// Aggregates each window's records incrementally; emits the aggregate's result.
    pub fn aggregate<Acc: Data, O: Data>(
        self,
        agg: impl AggregateFunction<T, Acc, O>,
    ) -> Stream<O> {
        let agg: Arc<dyn AggregateFunction<T, Acc, O>> = Arc::new(agg);
        self.build("window-aggregate", move || AggregateWindow {
            agg: agg.clone(),
            _p: PhantomData,
        })
    }

    /// Aggregates incrementally and then maps the result with the key and window.
    pub fn aggregate_with_window<Acc: Data, R: Data, O: Data>(
        self,
        agg: impl AggregateFunction<T, Acc, R>,
        f: impl Fn(&K, &TimeWindow, R) -> O + Send + Sync + 'static,
    ) -> Stream<O> {
        let agg: Arc<dyn AggregateFunction<T, Acc, R>> = Arc::new(agg);
        let f: WindowMapFn<K, R, O> = Arc::new(f);
        self.build("window-aggregate", move || AggregateWithWindow {
            agg: agg.clone(),
            f: f.clone(),
        })
    }

    /// Hands all of a window's records (in arrival order) to `f` when the window fires.
    pub fn process<O: Data>(
        self,
        f: impl Fn(&K, &TimeWindow, &[T], &mut Collector<O>) -> Result<()> + Send + Sync + 'static,
    ) -> Stream<O> {
        let f: ProcessFn<K, T, O> = Arc::new(f);
        self.build("window-process", move || ProcessWindow { f: f.clone() })
    }
}

/// Maps an aggregate's result with the key and window.
type WindowMapFn<K, R, O> = Arc<dyn Fn(&K, &TimeWindow, R) -> O + Send + Sync>;

struct ReduceWindow<T> {
    f: Arc<dyn Fn(T, T) -> T + Send + Sync>,
}

impl<K, T: Data> WindowFn<K, T, T> for ReduceWindow<T> {
    type Acc = Option<T>;
    fn create(&self) -> Option<T> {
        None
    }
    fn add(&self, acc: &mut Option<T>, value: T) {
        *acc = Some(match acc.take() {
            Some(prev) => (self.f)(prev, value),
            None => value,
        });
    }
    fn merge(&self, acc: &mut Option<T>, other: Option<T>) {
        if let Some(o) = other {
            <Self as WindowFn<K, T, T>>::add(self, acc, o);
        }
    }
    fn emit(
        &self,
        _key: &K,
        _w: &TimeWindow,
        acc: &Option<T>,
        out: &mut Collector<T>,
    ) -> Result<()> {
        if let Some(v) = acc {
            out.emit(v.clone());
        }
        Ok(())
    }
}

struct AggregateWindow<T, Acc, O> {
    agg: Arc<dyn AggregateFunction<T, Acc, O>>,
    _p: PhantomData<fn(T)>,
}

impl<K, T: 'static, Acc: Data, O: 'static> WindowFn<K, T, O> for AggregateWindow<T, Acc, O> {
    type Acc = Acc;
    fn create(&self) -> Acc {
        self.agg.create()
    }
    fn add(&self, acc: &mut Acc, value: T) {
        self.agg.add(acc, value)
    }
    fn merge(&self, acc: &mut Acc, other: Acc) {
        self.agg.merge(acc, other)
    }
    fn emit(&self, _key: &K, _w: &TimeWindow, acc: &Acc, out: &mut Collector<O>) -> Result<()> {
        out.emit(self.agg.result(acc));
        Ok(())
    }
}

struct AggregateWithWindow<K, T, Acc, R, O> {
    agg: Arc<dyn AggregateFunction<T, Acc, R>>,
    f: WindowMapFn<K, R, O>,
}

impl<K: 'static, T: 'static, Acc: Data, R: 'static, O: 'static> WindowFn<K, T, O>
    for AggregateWithWindow<K, T, Acc, R, O>
{
    type Acc = Acc;
    fn create(&self) -> Acc {
        self.agg.create()
    }
    fn add(&self, acc: &mut Acc, value: T) {
        self.agg.add(acc, value)
    }
    fn merge(&self, acc: &mut Acc, other: Acc) {
        self.agg.merge(acc, other)
    }
    fn emit(&self, key: &K, w: &TimeWindow, acc: &Acc, out: &mut Collector<O>) -> Result<()> {
        out.emit((self.f)(key, w, self.agg.result(acc)));
        Ok(())
    }
}

type ProcessFn<K, T, O> =
    Arc<dyn Fn(&K, &TimeWindow, &[T], &mut Collector<O>) -> Result<()> + Send + Sync>;

struct ProcessWindow<K, T, O> {
    f: ProcessFn<K, T, O>,
}

impl<K: 'static, T: Data, O: 'static> WindowFn<K, T, O> for ProcessWindow<K, T, O> {
    type Acc = Vec<T>;
    fn create(&self) -> Vec<T> {
        Vec::new()
    }
    fn add(&self, acc: &mut Vec<T>, value: T) {
        acc.push(value)
    }
    fn merge(&self, acc: &mut Vec<T>, other: Vec<T>) {
        acc.extend(other)
    }
    fn emit(&self, key: &K, w: &TimeWindow, acc: &Vec<T>, out: &mut Collector<O>) -> Result<()> {
        (self.f)(key, w, acc, out)
    }
}
