//! Watermark alignment in the DSL: `Stream::watermark_alignment` for sources that emit
//! their own watermarks, and the bookkeeping behind
//! [`WatermarkStrategy::watermark_alignment`](crate::watermark::WatermarkStrategy::watermark_alignment).
//! Only marks nodes of the graph; the runtime resolves the groups and pauses the sources.

use super::Stream;
use crate::data::Data;
use crate::watermark::WatermarkAlignment;
use std::time::Duration;

impl<T: Data> Stream<T> {
    /// Puts this source into the watermark alignment group `group`, for a source that emits
    /// its own watermarks (the Kafka source with `.watermarks(..)`, a custom source calling
    /// `emit_watermark`). See
    /// [`WatermarkStrategy::watermark_alignment`](crate::watermark::WatermarkStrategy::watermark_alignment)
    /// for what alignment does; a strategy applied with `with_watermarks` takes its group
    /// from the strategy instead.
    ///
    /// Call it on the stream a source returns (the job refuses to start when the stream
    /// is not a source's, or the configuration is invalid).
    ///
    /// ```
    /// use std::time::Duration;
    /// use weir_core::prelude::*;
    /// /// Emits (key, ts) in timestamp order, each followed by its watermark.
    /// struct Ordered { next: i64, end: i64 }
    /// impl SourceFunction<(u32, i64)> for Ordered {
    ///     fn poll(&mut self, out: &mut SourceOutput<'_, (u32, i64)>) -> weir_core::Result<SourceStatus> {
    ///         while self.next < self.end && out.emitted() < 10 {
    ///             out.emit_at((1, self.next), self.next)?;
    ///             out.emit_watermark(self.next)?;
    ///             self.next += 1;
    ///         }
    ///         Ok(if self.next == self.end { SourceStatus::Finished } else { SourceStatus::More })
    ///     }
    /// }
    /// let p = Pipeline::new();
    /// let a = p
    ///     .source("a", |_| Ordered { next: 0, end: 100 })
    ///     .watermark_alignment("ab", Duration::from_millis(20), Duration::from_millis(10));
    /// let b = p
    ///     .source("b", |_| Ordered { next: 0, end: 1_000 })
    ///     .watermark_alignment("ab", Duration::from_millis(20), Duration::from_millis(10));
    /// # let _ = (a, b);
    /// ```
    pub fn watermark_alignment(
        self,
        group: &str,
        max_drift: Duration,
        update_interval: Duration,
    ) -> Self {
        let cfg = WatermarkAlignment::new(group, max_drift, update_interval);
        self.p
            .edit_node(self.node, |n| n.watermark_alignment = Some(cfg));
        self
    }
}

/// `out` applies an aligned watermark strategy to `input`: mark the node, and run it at
/// its input's parallelism so that it chains to the source (the runtime checks it did).
pub(super) fn align_chained<T: Data>(
    input: &Stream<T>,
    out: &Stream<T>,
    alignment: WatermarkAlignment,
) {
    let parallelism = input.p.with_graph(|g| g.nodes[input.node.0].parallelism);
    input.p.edit_node(out.node, |n| {
        n.watermark_alignment = Some(alignment);
        n.parallelism = parallelism;
    });
}
