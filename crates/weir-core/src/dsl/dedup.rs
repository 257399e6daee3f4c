//! `Stream::dedup_by`: drop repeats of an idempotency key within a retention window.

use super::keyed::state_context;
use super::{OutputTag, Stream};
use crate::data::{Data, Key};
use crate::graph::{Port, take_output};
use crate::ops::OpInfo;
use crate::ops::dedup::{DedupFn, IdempotencyError, Route};
use crate::ops::keyed::KeyedProcess;

impl<T: Data> Stream<T> {
    /// Lets through the first record of each idempotency key (`key_fn`) and drops repeats
    /// seen within `retention` (processing time since the first one), so that a record
    /// delivered twice — a producer's retry, a replayed batch — is applied once.
    ///
    /// A repeat must carry the same payload (compared by a hash of its encoded bytes): a
    /// repeat with a different payload is not a duplicate but a caller error, and goes to
    /// the side output `errors` as an [`IdempotencyError`] (read it with
    /// [`Stream::side_output`]). Suppressed duplicates are logged at info level and
    /// counted.
    ///
    /// The keys are keyed state (value state with `retention` as TTL, plus a cleanup
    /// timer per key), checkpointed like any state and split by key group on rescale; they
    /// are forgotten once `retention` has passed, so a repeat that comes later passes
    /// again. Metrics, labelled with the operator's name and subtask:
    /// `duplicates_suppressed_total`, `idempotency_errors_total`, `dedup_state_entries`
    /// and `dedup_oldest_entry_age_seconds` (see [`crate::metrics`]).
    ///
    /// ```
    /// use weir_core::prelude::*;
    /// use std::time::Duration;
    ///
    /// let p = Pipeline::new();
    /// let errors = OutputTag::<IdempotencyError<(String, i64)>>::new("idempotency-errors");
    /// let payments = p.from_collection(vec![
    ///     ("pay-1".to_string(), 100),
    ///     ("pay-1".to_string(), 100), // a retry: dropped
    ///     ("pay-1".to_string(), 999), // same key, other payload: an error
    ///     ("pay-2".to_string(), 50),
    /// ]);
    /// let unique = payments.dedup_by(|(id, _)| id.clone(), Duration::from_secs(3600), &errors);
    /// let _applied = unique.collect();
    /// let _rejected = unique.side_output(&errors).collect();
    /// ```
    pub fn dedup_by<K: Key>(
        &self,
        key_fn: impl Fn(&T) -> K + Send + Sync + 'static,
        retention: std::time::Duration,
        errors: &OutputTag<IdempotencyError<T>>,
    ) -> Stream<T> {
        let keyed = self.key_by(key_fn);
        let key_fn = keyed.key_fn.clone();
        let out = keyed.stream.unary(
            "dedup",
            true,
            keyed.partitioning(),
            move |ctx, out, outputs| {
                let errors = take_output::<IdempotencyError<T>>(outputs, 1);
                let info = OpInfo::from_ctx(ctx);
                let op = KeyedProcess::new(
                    key_fn.clone(),
                    DedupFn::<K, T>::new(retention, &info),
                    state_context(ctx)?,
                    Box::new(Route { main: out, errors }),
                    info,
                )?;
                Ok(Box::new(op))
            },
            vec![Port::<IdempotencyError<T>>::port_type()],
        );
        out.p.register_side_port(out.node, errors.id(), 1);
        out
    }
}
