//! [`KeyedStream`]: a stream partitioned by key, with keyed process functions, rolling
//! reduce and aggregate, windows, keyed connect and window joins.

use super::{JoinedStreams, KeyedConnectedStreams, Stream, WindowedStream};
use crate::data::{Data, Key};
use crate::exchange::{Partitioning, hash_partitioner};
use crate::ops::OpInfo;
use crate::ops::keyed::{
    AggregateFunction, KeyedProcess, KeyedProcessFunction, RollingAggregate, RollingReduce,
};
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
    /// subtask's instance on the subtask's thread.
    pub fn process<O: Data, P: KeyedProcessFunction<K, T, O>>(
        &self,
        make: impl Fn() -> P + Send + Sync + 'static,
    ) -> Stream<O> {
        let key_fn = self.key_fn.clone();
        self.stream.unary(
            "process",
            true,
            self.partitioning(),
            move |ctx, out, _| {
                let op = KeyedProcess::new(
                    key_fn.clone(),
                    make(),
                    state_context(ctx)?,
                    out,
                    OpInfo::from_ctx(ctx),
                )?;
                Ok(Box::new(op))
            },
            vec![],
        )
    }

    /// Rolling reduce: after each record, emits the reduction of all records of its key so far.
    pub fn reduce(&self, f: impl Fn(T, T) -> T + Send + Sync + 'static) -> Stream<T> {
        let f: Arc<dyn Fn(T, T) -> T + Send + Sync> = Arc::new(f);
        self.process(move || RollingReduce {
            f: f.clone(),
            acc: None,
        })
        .name("reduce")
    }

    /// Rolling aggregate: after each record, emits the aggregate of its key so far.
    pub fn aggregate<Acc: Data, O: Data>(
        &self,
        agg: impl AggregateFunction<T, Acc, O>,
    ) -> Stream<O> {
        let agg: Arc<dyn AggregateFunction<T, Acc, O>> = Arc::new(agg);
        self.process(move || RollingAggregate {
            agg: agg.clone(),
            acc: None,
        })
        .name("aggregate")
    }

    /// Groups each key's records into event-time windows.
    pub fn window(&self, assigner: WindowAssigner) -> WindowedStream<K, T> {
        WindowedStream::new(self.clone(), assigner)
    }

    /// Connects with another stream keyed by the same key type, for a keyed two-input
    /// function with shared state per key.
    pub fn connect<B: Data>(&self, other: &KeyedStream<K, B>) -> KeyedConnectedStreams<K, T, B> {
        KeyedConnectedStreams {
            a: self.clone(),
            b: other.clone(),
        }
    }

    /// Joins with another keyed stream: pairs of records with equal keys in the same window.
    pub fn join<B: Data>(&self, other: &KeyedStream<K, B>) -> JoinedStreams<K, T, B> {
        JoinedStreams {
            a: self.clone(),
            b: other.clone(),
        }
    }
}
