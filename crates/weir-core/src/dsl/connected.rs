//! Two-input streams: [`ConnectedStreams`] (plain), [`KeyedConnectedStreams`] (keyed) and
//! the window join ([`JoinedStreams`] → [`WindowedJoin`]).

use super::keyed::state_context;
use super::{KeyedStream, NodeDesc, PendingInput, Stream};
use crate::data::{Data, Key};
use crate::error::Result;
use crate::exchange::Partitioning;
use crate::graph::{BuildContext, Built, NodeKind, Port, input, take_output};
use crate::ops::OpInfo;
use crate::ops::co::{CoProcessFunction, Either, TwoInputs, either_key, split_inputs};
use crate::ops::guard;
use crate::ops::side::{SideDecls, SideOutputs};
use crate::output::{Collector, Output};
use crate::state::StateContext;
use crate::window::{TimeWindow, WindowAssigner, WindowFn, WindowOperator};
use std::sync::Arc;

#[allow(clippy::too_many_arguments)]
pub(crate) fn two_input_node<A: Data, B: Data, O: Data>(
    a: &Stream<A>,
    pa: Partitioning<A>,
    b: &Stream<B>,
    pb: Partitioning<B>,
    name: &str,
    keyed: bool,
    side_outputs: Option<SideDecls>,
    build: impl Fn(&BuildContext<'_>, Box<dyn Output<O>>, SideOutputs) -> Result<TwoInputs<A, B>>
    + Send
    + Sync
    + 'static,
) -> Stream<O> {
    let declared = side_outputs.clone();
    let ea = PendingInput {
        from: a.node,
        port: a.port,
        partitioning: pa,
    }
    .edge();
    let eb = PendingInput {
        from: b.node,
        port: b.port,
        partitioning: pb,
    }
    .edge();
    let id = a.p.add_node(
        NodeDesc {
            name: name.to_string(),
            kind: NodeKind::Operator,
            inputs: vec![ea, eb],
            outputs: vec![Port::<O>::port_type()],
            keyed,
            parallelism_one: false,
        },
        move |ctx, mut outputs| {
            let out = take_output::<O>(&mut outputs, 0);
            let side = match &declared {
                Some(d) => SideOutputs::take(d, &mut outputs),
                None => SideOutputs::default(),
            };
            let (ia, ib, control) = build(ctx, out, side)?;
            Ok(Built::Operator {
                inputs: vec![input(ia), input(ib)],
                control: Some(control),
            })
        },
    );
    if let Some(decls) = side_outputs {
        a.p.accept_side_outputs(id, decls);
    }
    Stream::new(a.p.clone(), id, 0)
}

/// Two streams connected for one two-input function; state is per subtask (key `()`).
/// Combine with [`Stream::broadcast`] to send one input to every subtask.
pub struct ConnectedStreams<A, B> {
    pub(crate) a: Stream<A>,
    pub(crate) b: Stream<B>,
}

impl<A: Data, B: Data> ConnectedStreams<A, B> {
    /// Runs a two-input function; `make` creates each subtask's instance on its thread.
    /// Declare side outputs on the result with [`Stream::with_side_output`].
    pub fn process<O: Data, P: CoProcessFunction<(), A, B, O>>(
        &self,
        make: impl Fn() -> P + Send + Sync + 'static,
    ) -> Stream<O> {
        self.process_with_state(move |_| Ok(make()))
    }

    /// Runs a two-input function built by `make` from the operator's [`StateContext`]
    /// (per subtask: the key is `()`), so state handles are plain fields of the function.
    /// See [`super::KeyedStream::process_with_state`].
    pub fn process_with_state<O: Data, P: CoProcessFunction<(), A, B, O>>(
        &self,
        make: impl Fn(&mut StateContext<()>) -> Result<P> + Send + Sync + 'static,
    ) -> Stream<O> {
        two_input_node(
            &self.a,
            self.a.partitioning.clone(),
            &self.b,
            self.b.partitioning.clone(),
            "co-process",
            false,
            Some(SideDecls::default()),
            move |ctx, out, side| {
                let info = OpInfo::from_ctx(ctx);
                let mut state = state_context::<()>(ctx)?;
                let f = guard(&info, || make(&mut state))?;
                crate::ops::co::build(
                    Arc::new(|_: &A| ()),
                    Arc::new(|_: &B| ()),
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

/// Two streams keyed by the same key type, connected for a keyed two-input function.
pub struct KeyedConnectedStreams<K, A, B> {
    pub(crate) a: KeyedStream<K, A>,
    pub(crate) b: KeyedStream<K, B>,
}

impl<K: Key, A: Data, B: Data> KeyedConnectedStreams<K, A, B> {
    /// Runs a keyed two-input function with state and timers per key; the function
    /// creates its state handles in `open`. Declare side outputs on the result with
    /// [`Stream::with_side_output`].
    pub fn process<O: Data, P: CoProcessFunction<K, A, B, O>>(
        &self,
        make: impl Fn() -> P + Send + Sync + 'static,
    ) -> Stream<O> {
        self.process_with_state(move |_| Ok(make()))
    }

    /// Runs a keyed two-input function built by `make` from the operator's
    /// [`StateContext`], so state handles are plain fields of the function. See
    /// [`super::KeyedStream::process_with_state`] and [`CoProcessFunction`].
    pub fn process_with_state<O: Data, P: CoProcessFunction<K, A, B, O>>(
        &self,
        make: impl Fn(&mut StateContext<K>) -> Result<P> + Send + Sync + 'static,
    ) -> Stream<O> {
        let (ka, kb) = (self.a.key_fn.clone(), self.b.key_fn.clone());
        two_input_node(
            &self.a.stream,
            self.a.partitioning(),
            &self.b.stream,
            self.b.partitioning(),
            "keyed-co-process",
            true,
            Some(SideDecls::default()),
            move |ctx, out, side| {
                let info = OpInfo::from_ctx(ctx);
                let mut state = state_context::<K>(ctx)?;
                let f = guard(&info, || make(&mut state))?;
                crate::ops::co::build(ka.clone(), kb.clone(), f, state, out, side, info)
            },
        )
    }
}

/// Two keyed streams to be joined; choose the window with [`JoinedStreams::window`].
pub struct JoinedStreams<K, A, B> {
    pub(crate) a: KeyedStream<K, A>,
    pub(crate) b: KeyedStream<K, B>,
}

impl<K: Key, A: Data, B: Data> JoinedStreams<K, A, B> {
    /// Joins records with equal keys that fall into the same window (tumbling or sliding).
    ///
    /// # Panics
    /// For session windows, which a window join does not support.
    pub fn window(self, assigner: WindowAssigner) -> WindowedJoin<K, A, B> {
        assert!(
            !assigner.is_merging(),
            "a window join needs tumbling or sliding windows, not sessions"
        );
        WindowedJoin {
            joined: self,
            assigner,
        }
    }
}

/// A window join waiting for its join function.
///
/// ```
/// use weir_core::prelude::*;
/// let p = Pipeline::new();
/// let orders = p.from_timestamped(vec![((1u32, 10i64), 1)]).with_watermarks(WatermarkStrategy::monotonous());
/// let payments = p.from_timestamped(vec![((1u32, "paid".to_string()), 3)]).with_watermarks(WatermarkStrategy::monotonous());
/// let joined = orders
///     .key_by(|o| o.0)
///     .join(&payments.key_by(|p| p.0))
///     .window(WindowAssigner::tumbling(10))
///     .apply(|o, p| (o.0, o.1, p.1))
///     .collect();
/// # let _ = joined;
/// ```
pub struct WindowedJoin<K, A, B> {
    joined: JoinedStreams<K, A, B>,
    assigner: WindowAssigner,
}

impl<K: Key, A: Data, B: Data> WindowedJoin<K, A, B> {
    /// Emits `f(a, b)` for every pair of records with equal keys in the same window, when
    /// the window fires (pairs in arrival order of `a`, then of `b`).
    pub fn apply<O: Data>(self, f: impl Fn(A, B) -> O + Send + Sync + 'static) -> Stream<O> {
        let f: Arc<dyn Fn(A, B) -> O + Send + Sync> = Arc::new(f);
        let (ka, kb) = (self.joined.a.key_fn.clone(), self.joined.b.key_fn.clone());
        let assigner = self.assigner;
        two_input_node(
            &self.joined.a.stream,
            self.joined.a.partitioning(),
            &self.joined.b.stream,
            self.joined.b.partitioning(),
            "window-join",
            true,
            None,
            move |ctx, out, _side| {
                let mut state = state_context::<K>(ctx)?;
                let op = WindowOperator::new(
                    either_key(ka.clone(), kb.clone()),
                    assigner,
                    0,
                    JoinWindow { f: f.clone() },
                    &mut state,
                    out,
                    None,
                    OpInfo::from_ctx(ctx),
                )?;
                Ok(split_inputs(Box::new(op)))
            },
        )
    }
}

struct JoinWindow<A, B, O> {
    f: Arc<dyn Fn(A, B) -> O + Send + Sync>,
}

impl<K, A: Data, B: Data, O: 'static> WindowFn<K, Either<A, B>, O> for JoinWindow<A, B, O> {
    type Acc = (Vec<A>, Vec<B>);
    fn create(&self) -> Self::Acc {
        (Vec::new(), Vec::new())
    }
    fn add(&self, acc: &mut Self::Acc, value: Either<A, B>) {
        match value {
            Either::Left(a) => acc.0.push(a),
            Either::Right(b) => acc.1.push(b),
        }
    }
    fn merge(&self, acc: &mut Self::Acc, other: Self::Acc) {
        acc.0.extend(other.0);
        acc.1.extend(other.1);
    }
    fn emit(
        &self,
        _key: &K,
        _w: &TimeWindow,
        acc: &Self::Acc,
        out: &mut Collector<O>,
    ) -> Result<()> {
        for a in &acc.0 {
            for b in &acc.1 {
                out.emit((self.f)(a.clone(), b.clone()));
            }
        }
        Ok(())
    }
}
