//! weir's benchmark suite as a library: the Nexmark queries ([`nexmark`]), written in the
//! public DSL, which the `weir-bench` binary runs and the correctness tests check.

pub mod nexmark;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use weir::prelude::*;

/// A black-hole sink that proves the work was done: it sums a weight per record locally
/// and adds the sum to a shared total at end of input.
pub struct Counting<T> {
    n: u64,
    total: Arc<AtomicU64>,
    weight: fn(&T) -> u64,
}

impl<T> Counting<T> {
    /// Adds `weight(record)` per record to `total` (at end of input).
    pub fn new(total: Arc<AtomicU64>, weight: fn(&T) -> u64) -> Self {
        Counting {
            n: 0,
            total,
            weight,
        }
    }
}

impl<T: 'static> SinkFunction<T> for Counting<T> {
    #[inline]
    fn invoke(&mut self, value: T, _ts: Timestamp) -> weir::Result<()> {
        self.n += (self.weight)(&value);
        Ok(())
    }
    fn finish(&mut self) -> weir::Result<()> {
        self.total.fetch_add(self.n, Ordering::SeqCst);
        Ok(())
    }
}
