//! Broadcast state in the DSL: [`Stream::broadcast_state`] turns a stream into a
//! [`BroadcastStream`] (every record to every parallel instance, with the broadcast states
//! it declares); `connect` joins it to a keyed or plain data stream
//! ([`KeyedBroadcastConnectedStreams`], [`BroadcastConnectedStreams`]) for a
//! [`BroadcastProcessFunction`]. Also the traits that let `connect` take either kind of
//! second stream, with readable errors for the ones it cannot.

use super::connected::two_input_node;
use super::keyed::state_context;
use super::{ConnectedStreams, KeyedConnectedStreams, KeyedStream, Stream};
use crate::data::{Data, Key};
use crate::error::Result;
use crate::exchange::Partitioning;
use crate::ops::broadcast::{BroadcastProcessFunction, BroadcastStateDescriptor, Declaration};
use crate::ops::side::SideDecls;
use crate::ops::{OpInfo, guard};
use crate::state::StateContext;
use serde::{Serialize, de::DeserializeOwned};
use std::sync::Arc;

/// A stream whose every record goes to every parallel instance of the operator it is
/// connected to, with the broadcast states that operator keeps (Flink's
/// `BroadcastStream`). Made by [`Stream::broadcast_state`]; connect a data stream to it
/// with [`KeyedStream::connect`] or [`Stream::connect`].
pub struct BroadcastStream<T> {
    stream: Stream<T>,
    decls: Vec<Declaration>,
}

impl<T> Clone for BroadcastStream<T> {
    fn clone(&self) -> Self {
        BroadcastStream {
            stream: self.stream.clone(),
            decls: self.decls.clone(),
        }
    }
}

impl<T: Data> BroadcastStream<T> {
    /// Declares one more broadcast state (Flink's `broadcast(d1, d2, ..)`).
    ///
    /// ```
    /// use weir_core::prelude::*;
    /// let p = Pipeline::new();
    /// let limits = BroadcastStateDescriptor::<String, i64>::new("limits");
    /// let muted = BroadcastStateDescriptor::<String, bool>::new("muted");
    /// let _rules = p
    ///     .from_collection(vec![("temp".to_string(), 30i64)])
    ///     .broadcast_state(&limits)
    ///     .with_state(&muted);
    /// ```
    pub fn with_state<K: Key, V: Clone + Serialize + DeserializeOwned + 'static>(
        mut self,
        desc: &BroadcastStateDescriptor<K, V>,
    ) -> Self {
        self.decls.push(desc.declaration());
        self
    }
}

impl<T: Data> Stream<T> {
    /// Broadcasts this stream for the broadcast state pattern (Flink's
    /// `stream.broadcast(descriptor)`): connected to a data stream, every record reaches
    /// every parallel instance, which keeps the broadcast state `desc` (a map from `K` to
    /// `V`) in identical copies. The data side reads the state; only this side writes it.
    /// Declare further states with [`BroadcastStream::with_state`].
    ///
    /// A checkpoint stores one copy per operator, and a restore hands it to every instance
    /// at whatever parallelism the job resumes.
    ///
    /// ```
    /// use weir_core::prelude::*;
    /// let p = Pipeline::new();
    /// let thresholds = BroadcastStateDescriptor::<String, i64>::new("thresholds");
    /// let _rules = p
    ///     .from_collection(vec![("temp".to_string(), 30i64)])
    ///     .broadcast_state(&thresholds);
    /// ```
    pub fn broadcast_state<K: Key, V: Clone + Serialize + DeserializeOwned + 'static>(
        &self,
        desc: &BroadcastStateDescriptor<K, V>,
    ) -> BroadcastStream<T> {
        BroadcastStream {
            stream: self.clone(),
            decls: vec![desc.declaration()],
        }
    }
}

/// What a plain [`Stream<T>`] can be connected with: another stream (a
/// [`ConnectedStreams`]) or a broadcast stream (a [`BroadcastConnectedStreams`]).
#[diagnostic::on_unimplemented(
    message = "a `Stream<{T}>` cannot be connected with `{Self}`",
    label = "expected a `Stream<_>` or a `BroadcastStream<_>`",
    note = "`Stream::connect` takes another `Stream` or a broadcast stream (`stream.broadcast_state(&descriptor)`); to connect keyed streams, key both (`.key_by(..)`) by the same key type"
)]
pub trait ConnectWith<T> {
    /// The connected streams.
    type Connected;
    /// Connects `data` (the first input) with `self` (the second).
    fn connected_with(&self, data: &Stream<T>) -> Self::Connected;
}

impl<T: Data, B: Data> ConnectWith<T> for Stream<B> {
    type Connected = ConnectedStreams<T, B>;
    fn connected_with(&self, data: &Stream<T>) -> Self::Connected {
        ConnectedStreams {
            a: data.clone(),
            b: self.clone(),
        }
    }
}

impl<T: Data, B: Data> ConnectWith<T> for BroadcastStream<B> {
    type Connected = BroadcastConnectedStreams<T, B>;
    fn connected_with(&self, data: &Stream<T>) -> Self::Connected {
        BroadcastConnectedStreams {
            data: data.clone(),
            rules: self.clone(),
        }
    }
}

/// What a [`KeyedStream<K, T>`] can be connected with: another stream keyed by the same
/// key type `K` (a [`KeyedConnectedStreams`]) or a broadcast stream (a
/// [`KeyedBroadcastConnectedStreams`]).
#[diagnostic::on_unimplemented(
    message = "a stream keyed by `{K}` cannot be connected with `{Self}`",
    label = "expected a `KeyedStream<{K}, _>` or a `BroadcastStream<_>`",
    note = "keyed connect needs both streams keyed by the same type: key the other stream by `{K}` too (`.key_by(|r| ..)` returning `{K}`), or broadcast it (`.broadcast_state(&descriptor)`)"
)]
pub trait KeyedConnectWith<K, T> {
    /// The connected streams.
    type Connected;
    /// Connects `data` (the first input) with `self` (the second).
    fn connected_with(&self, data: &KeyedStream<K, T>) -> Self::Connected;
}

impl<K: Key, T: Data, B: Data> KeyedConnectWith<K, T> for KeyedStream<K, B> {
    type Connected = KeyedConnectedStreams<K, T, B>;
    fn connected_with(&self, data: &KeyedStream<K, T>) -> Self::Connected {
        KeyedConnectedStreams {
            a: data.clone(),
            b: self.clone(),
        }
    }
}

impl<K: Key, T: Data, B: Data> KeyedConnectWith<K, T> for BroadcastStream<B> {
    type Connected = KeyedBroadcastConnectedStreams<K, T, B>;
    fn connected_with(&self, data: &KeyedStream<K, T>) -> Self::Connected {
        KeyedBroadcastConnectedStreams {
            data: data.clone(),
            rules: self.clone(),
        }
    }
}

/// A keyed data stream connected with a broadcast stream (Flink's
/// `BroadcastConnectedStream` on a `KeyedStream`), waiting for its
/// [`BroadcastProcessFunction`].
pub struct KeyedBroadcastConnectedStreams<K, A, B> {
    data: KeyedStream<K, A>,
    rules: BroadcastStream<B>,
}

impl<K: Key, A: Data, B: Data> KeyedBroadcastConnectedStreams<K, A, B> {
    /// Runs a broadcast function with keyed state and timers on the data side; `make`
    /// creates each subtask's instance on its thread (keyed state handles are created in
    /// [`BroadcastProcessFunction::open`]). See [`BroadcastProcessFunction`] for an
    /// example. Declare side outputs on the result with [`Stream::with_side_output`].
    pub fn process<O: Data, P: BroadcastProcessFunction<K, A, B, O>>(
        &self,
        make: impl Fn() -> P + Send + Sync + 'static,
    ) -> Stream<O> {
        self.process_with_state(move |_| Ok(make()))
    }

    /// Runs a broadcast function built by `make` from the operator's [`StateContext`],
    /// so keyed state handles are plain fields of the function (see
    /// [`KeyedStream::process_with_state`]).
    ///
    /// ```
    /// use weir_core::prelude::*;
    ///
    /// /// Counts each key's records and emits the count once it reaches the key's target.
    /// struct Targets { targets: BroadcastStateDescriptor<String, u64>, seen: ValueState<u64> }
    ///
    /// impl BroadcastProcessFunction<String, String, (String, u64), (String, u64)> for Targets {
    ///     fn process_element(&mut self, key: String, ctx: &mut ReadOnlyContext<'_, String, (String, u64)>) -> weir_core::Result<()> {
    ///         let n = self.seen.update(|n| n.unwrap_or(0) + 1)?;
    ///         if ctx.broadcast_state(&self.targets)?.get(&key) == Some(&n) {
    ///             ctx.emit((key, n));
    ///         }
    ///         Ok(())
    ///     }
    ///     fn process_broadcast_element(&mut self, (key, target): (String, u64), ctx: &mut BroadcastContext<'_, String, (String, u64)>) -> weir_core::Result<()> {
    ///         ctx.broadcast_state(&self.targets)?.put(key, target);
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let p = Pipeline::new();
    /// let targets = BroadcastStateDescriptor::<String, u64>::new("targets");
    /// let rules = p.from_collection(vec![("a".to_string(), 2u64)]).broadcast_state(&targets);
    /// let desc = targets.clone();
    /// let _reached = p
    ///     .from_collection(vec!["a".to_string(), "a".to_string()])
    ///     .key_by(|k| k.clone())
    ///     .connect(&rules)
    ///     .process_with_state(move |state| Ok(Targets { targets: desc.clone(), seen: state.value_state("seen")? }))
    ///     .collect();
    /// ```
    pub fn process_with_state<O: Data, P: BroadcastProcessFunction<K, A, B, O>>(
        &self,
        make: impl Fn(&mut StateContext<K>) -> Result<P> + Send + Sync + 'static,
    ) -> Stream<O> {
        let key_fn = self.data.key_fn.clone();
        let decls = Arc::new(self.rules.decls.clone());
        two_input_node(
            &self.data.stream,
            self.data.partitioning(),
            &self.rules.stream,
            Partitioning::Broadcast,
            "keyed-broadcast-process",
            true,
            Some(SideDecls::default()),
            move |ctx, out, side| {
                let info = OpInfo::from_ctx(ctx);
                let mut state = state_context::<K>(ctx)?;
                let f = guard(&info, || make(&mut state))?;
                crate::ops::broadcast::build(ctx, key_fn.clone(), &decls, f, state, out, side, info)
            },
        )
    }
}

/// A plain (not keyed) data stream connected with a broadcast stream, waiting for its
/// [`BroadcastProcessFunction`] with the key `()`: state and timers are per subtask.
pub struct BroadcastConnectedStreams<A, B> {
    data: Stream<A>,
    rules: BroadcastStream<B>,
}

impl<A: Data, B: Data> BroadcastConnectedStreams<A, B> {
    /// Runs a broadcast function; `make` creates each subtask's instance on its thread.
    ///
    /// ```
    /// use weir_core::prelude::*;
    ///
    /// /// Drops words on the block list.
    /// struct Block { blocked: BroadcastStateDescriptor<String, ()> }
    ///
    /// impl BroadcastProcessFunction<(), String, String, String> for Block {
    ///     fn process_element(&mut self, word: String, ctx: &mut ReadOnlyContext<'_, (), String>) -> weir_core::Result<()> {
    ///         if !ctx.broadcast_state(&self.blocked)?.contains_key(&word) { ctx.emit(word) }
    ///         Ok(())
    ///     }
    ///     fn process_broadcast_element(&mut self, word: String, ctx: &mut BroadcastContext<'_, (), String>) -> weir_core::Result<()> {
    ///         ctx.broadcast_state(&self.blocked)?.put(word, ());
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let p = Pipeline::new();
    /// let blocked = BroadcastStateDescriptor::<String, ()>::new("blocked");
    /// let block_list = p.from_collection(vec!["spam".to_string()]).broadcast_state(&blocked);
    /// let _kept = p
    ///     .from_collection(vec!["hello".to_string(), "spam".to_string()])
    ///     .connect(&block_list)
    ///     .process(move || Block { blocked: blocked.clone() })
    ///     .collect();
    /// ```
    pub fn process<O: Data, P: BroadcastProcessFunction<(), A, B, O>>(
        &self,
        make: impl Fn() -> P + Send + Sync + 'static,
    ) -> Stream<O> {
        self.process_with_state(move |_| Ok(make()))
    }

    /// Runs a broadcast function built by `make` from the operator's [`StateContext`]
    /// (per subtask: the key is `()`).
    pub fn process_with_state<O: Data, P: BroadcastProcessFunction<(), A, B, O>>(
        &self,
        make: impl Fn(&mut StateContext<()>) -> Result<P> + Send + Sync + 'static,
    ) -> Stream<O> {
        let decls = Arc::new(self.rules.decls.clone());
        two_input_node(
            &self.data,
            self.data.partitioning.clone(),
            &self.rules.stream,
            Partitioning::Broadcast,
            "broadcast-process",
            false,
            Some(SideDecls::default()),
            move |ctx, out, side| {
                let info = OpInfo::from_ctx(ctx);
                let mut state = state_context::<()>(ctx)?;
                let f = guard(&info, || make(&mut state))?;
                crate::ops::broadcast::build(
                    ctx,
                    Arc::new(|_: &A| ()),
                    &decls,
                    f,
                    state,
                    out,
                    side,
                    info,
                )
            },
        )
    }
}
