//! Two-input operators: a process function over two connected streams, keyed (state and
//! timers per key) or not (then every record shares the unit key `()`).

use super::OpInfo;
use super::side::SideOutputs;
use crate::data::{Data, Key};
use crate::error::Result;
use crate::graph::ControlSink;
use crate::output::{Control, Output};
use crate::state::StateContext;
use crate::time::Timestamp;
use crate::timer::TimeDomain;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

pub use super::keyed::KeyedContext as CoContext;

/// A function over two connected streams (Flink's `CoProcessFunction` and
/// `KeyedCoProcessFunction`). On keyed connected streams both inputs are partitioned by
/// key and state and timers are per key; on plain connected streams the key is `()`.
///
/// ```
/// use weir_core::prelude::*;
/// /// Passes through values of input 1 only while input 2 has enabled the key.
/// struct Gate { enabled: ValueState<bool> }
/// impl CoProcessFunction<u32, (u32, i64), (u32, bool), i64> for Gate {
///     fn process1(&mut self, v: (u32, i64), ctx: &mut CoContext<'_, u32, i64>) -> weir_core::Result<()> {
///         if self.enabled.get()?.unwrap_or(false) { ctx.emit(v.1) }
///         Ok(())
///     }
///     fn process2(&mut self, v: (u32, bool), _ctx: &mut CoContext<'_, u32, i64>) -> weir_core::Result<()> {
///         self.enabled.set(v.1)
///     }
/// }
///
/// let p = Pipeline::new();
/// let values = p.from_collection(vec![(1u32, 10i64)]).key_by(|v| v.0);
/// let switches = p.from_collection(vec![(1u32, true)]).key_by(|s| s.0);
/// let _gated = values
///     .connect(&switches)
///     .process_with_state(|state| Ok(Gate { enabled: state.value_state("enabled")? }))
///     .collect();
/// ```
pub trait CoProcessFunction<K, A, B, O>: 'static {
    /// Called once per subtask before any record. Functions built by a plain factory
    /// (`process`) create their state handles here; with `process_with_state` the factory
    /// does, and `open` need not be implemented.
    fn open(&mut self, state: &mut StateContext<K>) -> Result<()> {
        let _ = state;
        Ok(())
    }
    /// Called for each record of the first input.
    fn process1(&mut self, value: A, ctx: &mut CoContext<'_, K, O>) -> Result<()>;
    /// Called for each record of the second input.
    fn process2(&mut self, value: B, ctx: &mut CoContext<'_, K, O>) -> Result<()>;
    /// Called when a timer of the current key fires.
    fn on_timer(
        &mut self,
        time: Timestamp,
        domain: TimeDomain,
        ctx: &mut CoContext<'_, K, O>,
    ) -> Result<()> {
        let _ = (time, domain, ctx);
        Ok(())
    }
}

/// Adapts a two-input function to the one-input [`super::keyed::KeyedProcessFunction`]
/// machinery by tagging which input a record came from.
#[derive(Clone)]
pub(crate) enum Either<A, B> {
    Left(A),
    Right(B),
}

struct Adapter<P, A, B> {
    f: P,
    _p: std::marker::PhantomData<fn(A, B)>,
}

impl<K: Key, A: 'static, B: 'static, O: 'static, P: CoProcessFunction<K, A, B, O>>
    super::keyed::KeyedProcessFunction<K, Either<A, B>, O> for Adapter<P, A, B>
{
    fn open(&mut self, state: &mut StateContext<K>) -> Result<()> {
        self.f.open(state)
    }
    fn process(&mut self, value: Either<A, B>, ctx: &mut CoContext<'_, K, O>) -> Result<()> {
        match value {
            Either::Left(a) => self.f.process1(a, ctx),
            Either::Right(b) => self.f.process2(b, ctx),
        }
    }
    fn on_timer(
        &mut self,
        time: Timestamp,
        domain: TimeDomain,
        ctx: &mut CoContext<'_, K, O>,
    ) -> Result<()> {
        self.f.on_timer(time, domain, ctx)
    }
}

/// Builds the two inputs and the control sink of a two-input keyed process function.
pub(crate) fn build<K: Key, A: Data, B: Data, O: Data, P: CoProcessFunction<K, A, B, O>>(
    key_a: Arc<dyn Fn(&A) -> K + Send + Sync>,
    key_b: Arc<dyn Fn(&B) -> K + Send + Sync>,
    f: P,
    state: StateContext<K>,
    out: Box<dyn Output<O>>,
    side: SideOutputs,
    info: OpInfo,
) -> Result<TwoInputs<A, B>> {
    let key_fn = either_key(key_a, key_b);
    let op = super::keyed::KeyedProcess::new(
        key_fn,
        Adapter {
            f,
            _p: std::marker::PhantomData,
        },
        state,
        out,
        info,
    )?
    .with_side_outputs(side);
    Ok(split_inputs(Box::new(op)))
}

/// The key function over tagged records of two inputs.
pub(crate) fn either_key<K: 'static, A: 'static, B: 'static>(
    key_a: Arc<dyn Fn(&A) -> K + Send + Sync>,
    key_b: Arc<dyn Fn(&B) -> K + Send + Sync>,
) -> crate::data::KeyFn<Either<A, B>, K> {
    Arc::new(move |e: &Either<A, B>| match e {
        Either::Left(a) => key_a(a),
        Either::Right(b) => key_b(b),
    })
}

/// The inputs and control of a two-input operator.
pub(crate) type TwoInputs<A, B> = (Box<dyn Output<A>>, Box<dyn Output<B>>, Box<dyn ControlSink>);

type Shared<A, B> = Rc<RefCell<Box<dyn Output<Either<A, B>>>>>;

/// Splits an operator over tagged records into two typed inputs and a control sink.
pub(crate) fn split_inputs<A: 'static, B: 'static>(
    op: Box<dyn Output<Either<A, B>>>,
) -> TwoInputs<A, B> {
    let shared: Shared<A, B> = Rc::new(RefCell::new(op));
    (
        Box::new(Side {
            op: shared.clone(),
            wrap: Either::Left,
        }),
        Box::new(Side {
            op: shared.clone(),
            wrap: Either::Right,
        }),
        Box::new(Ctl { op: shared }),
    )
}

struct Side<T, A, B> {
    op: Shared<A, B>,
    wrap: fn(T) -> Either<A, B>,
}

impl<T, A, B> Output<T> for Side<T, A, B> {
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        self.op.borrow_mut().record((self.wrap)(value), ts)
    }
    fn control(&mut self, _event: Control) -> Result<()> {
        Ok(())
    }
}

struct Ctl<A, B> {
    op: Shared<A, B>,
}

impl<A, B> ControlSink for Ctl<A, B> {
    fn control(&mut self, event: Control) -> Result<()> {
        self.op.borrow_mut().control(event)
    }
}
