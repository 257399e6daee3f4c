//! What a source subtask reports about the partitions it reads (for a Kafka source: each
//! assigned partition's position and high watermark), for the runtime's views (the REST
//! API's `partitions` of an operator). The source owns the figures and updates them with
//! relaxed atomic stores; it must not block on them. The runtime only reads them.

use crate::metrics::Gauge;
use std::sync::{Arc, Mutex};

/// The high watermark of a partition whose end has not been read yet.
const UNKNOWN: i64 = -1;

/// One partition a source subtask reads: where it is and where the partition ends.
///
/// The two cells are [`Gauge`]s, so a source can register them in the process registry
/// (`weir_core::metrics::gauge`) and the same values show on `/metrics`.
#[derive(Debug, Clone)]
pub struct PartitionGauges {
    /// The topic (or, for other sources, the name of what is partitioned).
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The next offset the source will read.
    pub position: Gauge,
    /// The offset after the last record the source can read now (`-1` until known).
    pub high_watermark: Gauge,
}

/// One partition's figures at one moment (see [`SourceFigures::partitions`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartitionFigures {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The next offset the source will read.
    pub position: i64,
    /// The offset after the last record the source can read now, if known.
    pub high_watermark: Option<i64>,
}

impl PartitionFigures {
    /// How many records the source has still to read: the high watermark minus the
    /// position (never below 0), if the high watermark is known.
    ///
    /// ```
    /// use weir_core::dsl::PartitionFigures;
    /// let p = PartitionFigures {
    ///     topic: "clicks".into(), partition: 0, position: 123, high_watermark: Some(150),
    /// };
    /// assert_eq!(p.lag(), Some(27));
    /// ```
    pub fn lag(&self) -> Option<i64> {
        self.high_watermark.map(|h| (h - self.position).max(0))
    }
}

/// The partitions a source subtask reads, with their figures: handed to the source in its
/// [`SourceContext`](super::SourceContext), read by the runtime.
///
/// ```
/// use weir_core::dsl::{PartitionGauges, SourceFigures};
/// use weir_core::metrics;
/// let figures = SourceFigures::default();
/// let labels = [("operator", "doc-source"), ("topic", "t"), ("partition", "0")];
/// let p = PartitionGauges {
///     topic: "t".into(),
///     partition: 0,
///     position: metrics::gauge("doc_partition_position", "Next offset.", &labels),
///     high_watermark: metrics::gauge("doc_partition_high_watermark", "End.", &labels),
/// };
/// p.high_watermark.set(-1);
/// figures.add_partition(p.clone());
/// p.position.set(40);
/// assert_eq!(figures.partitions()[0].lag(), None);
/// p.high_watermark.set(42);
/// assert_eq!(figures.partitions()[0].lag(), Some(2));
/// ```
#[derive(Debug, Clone, Default)]
pub struct SourceFigures {
    partitions: Arc<Mutex<Vec<PartitionGauges>>>,
}

impl SourceFigures {
    /// Reports a partition this subtask reads (once, when it is assigned). Its gauges are
    /// read whenever the figures are; a high watermark of `-1` reads as unknown.
    pub fn add_partition(&self, p: PartitionGauges) {
        let mut v = self.partitions.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|q| q.topic != p.topic || q.partition != p.partition);
        v.push(p);
        v.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    }

    /// The partitions reported, sorted by topic and partition, with their current figures.
    pub fn partitions(&self) -> Vec<PartitionFigures> {
        let v = self.partitions.lock().unwrap_or_else(|e| e.into_inner());
        v.iter()
            .map(|p| PartitionFigures {
                topic: p.topic.clone(),
                partition: p.partition,
                position: p.position.get(),
                high_watermark: Some(p.high_watermark.get()).filter(|&h| h != UNKNOWN),
            })
            .collect()
    }
}
