//! [`KeyedStream`]: a stream partitioned by key, with keyed process functions, rolling
//! reduce and aggregate, windows, keyed connect and window joins.

use super::{JoinedStreams, Stream, WindowedStream};
use crate::data::{Data, Key};
use crate::exchange::{Partitioning, hash_partitioner};
use crate::ops::keyed::{
    AggregateFunction, KeyedProcess, KeyedProcessFunction, RollingAggregate, RollingReduce,
};
use crate::ops::side::{SideDecls, SideOutputs};
use crate::ops::{OpInfo, guard};
use crate::state::{KeyContext, StateContext};
use crate::window::WindowAssigner;
use std::sync::Arc;

/// A stream partitioned by a key of type `K`.
///
/// ```
/// use weir_core::prelude::*;
/// let p = Pipeline::new();
/// let sums = p
///     .from_collection(vec![("a".to_string(), 1i64), ("b".into(), 2), ("a".into(), 3)])
///     .key_by(|(k, _)| k.clone())
///     .reduce(|a, b| (a.0, a.1 + b.1))
///     .collect();
/// # let _ = sums;
/// ```
pub struct KeyedStream<K, T> {
    pub(crate) stream: Stream<T>,
    pub(crate) key_fn: Arc<dyn Fn(&T) -> K + Send + Sync>,
}

impl<K, T> Clone for KeyedStream<K, T> {
    fn clone(&self) -> Self {
        KeyedStream {
            stream: self.stream.clone(),
            key_fn: self.key_fn.clone(),
        }
    }
}

/// Creates the state context of a keyed operator subtask.
pub(crate) fn state_context<K: Key>(
    ctx: &crate::graph::BuildContext<'_>,
) -> crate::Result<StateContext<K>> {
    let state = StateContext::new(KeyContext::new(), (ctx.state_backend)()?);
    ctx.participants.register(ctx.operator_id, state.hooks());
    Ok(state)
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    pub(crate) fn new(stream: Stream<T>, key_fn: Arc<dyn Fn(&T) -> K + Send + Sync>) -> Self {
        KeyedStream { stream, key_fn }
    }

    pub(crate) fn partitioning(&self) -> Partitioning<T> {
        Partitioning::Hash(hash_partitioner(self.key_fn.clone()))
    }

    /// Runs a keyed process function (state and timers per key). `make` creates each
    /// subtask's instance on the subtask's thread; the function creates its state handles
    /// in [`KeyedProcessFunction::open`]. [`KeyedStream::process_with_state`] builds them
    /// in the factory instead, as plain fields.
    pub fn process<O: Data, P: KeyedProcessFunction<K, T, O>>(
        &self,
        make: impl Fn() -> P + Send + Sync + 'static,
    ) -> Stream<O> {
        self.process_with_state(move |_| Ok(make()))
    }

    /// Runs a keyed process function (state and timers per key) built by `make` from the
    /// operator's [`StateContext`]: the factory creates the state handles, so the function
    /// holds them as plain fields (no `Option`, nothing to create in `open`). `make` runs
    /// once per subtask, on the subtask's thread, before any record; an error it returns
    /// fails the job, naming the operator.
    ///
    /// Declare side outputs on the result with [`Stream::with_side_output`].
    ///
    /// ```
    /// use weir_core::prelude::*;
    ///
    /// /// Emits each key's running total.
    /// struct Total { sum: ValueState<i64> }
    ///
    /// impl KeyedProcessFunction<String, (String, i64), (String, i64)> for Total {
    ///     fn process(&mut self, (k, v): (String, i64), ctx: &mut KeyedContext<'_, String, (String, i64)>) -> weir_core::Result<()> {
    ///         let total = self.sum.update(|s| s.unwrap_or(0) + v)?;
    ///         ctx.emit((k, total));
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let p = Pipeline::new();
    /// let _totals = p
    ///     .from_collection(vec![("a".to_string(), 1), ("a".to_string(), 2)])
    ///     .key_by(|(k, _)| k.clone())
    ///     .process_with_state(|state| Ok(Total { sum: state.value_state("sum")? }))
    ///     .collect();
    /// ```
    pub fn process_with_state<O: Data, P: KeyedProcessFunction<K, T, O>>(
        &self,
        make: impl Fn(&mut StateContext<K>) -> crate::Result<P> + Send + Sync + 'static,
    ) -> Stream<O> {
        let key_fn = self.key_fn.clone();
        let decls = SideDecls::default();
        let declared = decls.clone();
        let out = self.stream.unary(
            "process",
            true,
            self.partitioning(),
            move |ctx, out, outputs| {
                let info = OpInfo::from_ctx(ctx);
                let mut state = state_context(ctx)?;
                let f = guard(&info, || make(&mut state))?;
                let side = SideOutputs::take(&declared, outputs);
                let op =
                    KeyedProcess::new(key_fn.clone(), f, state, out, info)?.with_side_outputs(side);
                Ok(Box::new(op))
            },
            vec![],
        );
        out.p.accept_side_outputs(out.node, decls);
        out
    }

    /// Rolling reduce: after each record, emits the reduction of all records of its key so far.
    pub fn reduce(&self, f: impl Fn(T, T) -> T + Send + Sync + 'static) -> Stream<T> {
        let f: Arc<dyn Fn(T, T) -> T + Send + Sync> = Arc::new(f);
        let out = self.process_with_state(move |state| {
            Ok(RollingReduce {
                f: f.clone(),
                acc: state.value_state("reduce")?,
            })
        });
        // Built on a process function, but a user cannot emit to side outputs from it.
        out.p.refuse_side_outputs(out.node);
        out.name("reduce")
    }

    /// Rolling aggregate: after each record, emits the aggregate of its key so far.
    pub fn aggregate<Acc: Data, O: Data>(
        &self,
        agg: impl AggregateFunction<T, Acc, O>,
    ) -> Stream<O> {
        let agg: Arc<dyn AggregateFunction<T, Acc, O>> = Arc::new(agg);
        let out = self.process_with_state(move |state| {
            Ok(RollingAggregate {
                agg: agg.clone(),
                acc: state.value_state("aggregate")?,
            })
        });
        // Built on a process function, but a user cannot emit to side outputs from it.
        out.p.refuse_side_outputs(out.node);
        out.name("aggregate")
    }

    /// Groups each key's records into event-time windows.
    pub fn window(&self, assigner: WindowAssigner) -> WindowedStream<K, T> {
        WindowedStream::new(self.clone(), assigner)
    }

    /// Connects with another stream keyed by the same key type, for a keyed two-input
    /// function with shared state per key ([`super::KeyedConnectedStreams`]), or with a broadcast
    /// stream ([`Stream::broadcast_state`]) for a broadcast function that reads the
    /// broadcast state with keyed state and timers per key
    /// ([`super::KeyedBroadcastConnectedStreams`]).
    pub fn connect<O: super::KeyedConnectWith<K, T>>(&self, other: &O) -> O::Connected {
        other.connected_with(self)
    }

    /// Joins with another keyed stream: pairs of records with equal keys in the same window.
    pub fn join<B: Data>(&self, other: &KeyedStream<K, B>) -> JoinedStreams<K, T, B> {
        JoinedStreams {
            a: self.clone(),
            b: other.clone(),
        }
    }
}
