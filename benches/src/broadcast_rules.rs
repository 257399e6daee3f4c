//! The `broadcast-rules` job: keyed-sum's shape with a broadcast stream of rules beside it,
//! to measure what reading broadcast state on every record costs.

use crate::jobs::{Run, Setup, env};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use weir::prelude::*;
use weir_bench::Counting;

/// Rules: one threshold per key bucket (`key % RULES`).
const RULES: u64 = 1000;

/// Running sum per key; a record whose sum passes its bucket's threshold (broadcast state)
/// counts as an alert, and every 1000th record this subtask processes emits the alerts so
/// far.
struct SumOverThreshold {
    thresholds: BroadcastStateDescriptor<u64, i64>,
    sum: ValueState<i64>,
    seen: u64,
    alerts: u64,
}

impl BroadcastProcessFunction<u64, (u64, i64), (u64, i64), u64> for SumOverThreshold {
    #[inline]
    fn process_element(
        &mut self,
        (key, value): (u64, i64),
        ctx: &mut ReadOnlyContext<'_, u64, u64>,
    ) -> weir::Result<()> {
        let next = self.sum.get()?.unwrap_or(0) + value;
        self.sum.set(next)?;
        let thresholds = ctx.broadcast_state(&self.thresholds)?;
        if thresholds.get(&(key % RULES)).is_some_and(|t| next > *t) {
            self.alerts += 1;
        }
        self.seen += 1;
        if self.seen.is_multiple_of(1000) {
            ctx.emit(self.alerts);
        }
        Ok(())
    }

    fn process_broadcast_element(
        &mut self,
        (bucket, threshold): (u64, i64),
        ctx: &mut BroadcastContext<'_, u64, u64>,
    ) -> weir::Result<()> {
        ctx.broadcast_state(&self.thresholds)?
            .put(bucket, threshold);
        Ok(())
    }
}

/// generator → key_by → connect(rules broadcast) → running sum checked against the
/// bucket's threshold → counting sink. The rules (`RULES` thresholds) come from a
/// collection source, broadcast to every subtask.
pub fn broadcast_rules(events: u64, keys: u64, setup: &Setup) -> weir::Result<Run> {
    let env = env(setup);
    let emitted = Arc::new(AtomicU64::new(0));
    let counter = emitted.clone();
    let thresholds = BroadcastStateDescriptor::<u64, i64>::new("thresholds");
    let rules = env
        .from_collection((0..RULES).map(|b| (b, 1_000 + b as i64)).collect())
        .broadcast_state(&thresholds);
    env.generator(events, keys)
        .key_by(|(k, _)| *k)
        .connect(&rules)
        .process_with_state(move |state| {
            Ok(SumOverThreshold {
                thresholds: thresholds.clone(),
                sum: state.value_state("sum")?,
                seen: 0,
                alerts: 0,
            })
        })
        .name("sum-over-threshold")
        .sink("count", move || Counting::new(counter.clone(), |_: &u64| 1));
    let r = env.execute("broadcast-rules")?;
    Ok(Run {
        elapsed_s: r.elapsed.as_secs_f64(),
        results: emitted.load(Ordering::SeqCst),
        checkpoints: r.checkpoints_completed,
    })
}
