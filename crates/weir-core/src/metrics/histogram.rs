//! Histograms: observations counted into fixed buckets, with their sum and count, as
//! Prometheus histograms. Owns [`Histogram`] and the standard bucket sets; registration
//! and rendering live in the parent module.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bucket upper bounds, in seconds, for durations from milliseconds to minutes
/// (checkpoint durations).
pub const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Bucket upper bounds, in seconds, for short latencies from 100 µs to a minute
/// (end-to-end latency).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// Bucket upper bounds, in bytes, for sizes from 1 KiB to 64 GiB, four times apart
/// (checkpoint sizes).
pub const SIZE_BUCKETS: &[f64] = &[
    1024.0,
    4096.0,
    16384.0,
    65536.0,
    262144.0,
    1048576.0,
    4194304.0,
    16777216.0,
    67108864.0,
    268435456.0,
    1073741824.0,
    4294967296.0,
    17179869184.0,
    68719476736.0,
];

#[derive(Debug)]
pub(super) struct Cells {
    /// Upper bounds, ascending, without `+Inf`.
    pub(super) bounds: Vec<f64>,
    /// One count per bound and one for `+Inf` (not cumulative).
    pub(super) buckets: Vec<AtomicU64>,
    /// The sum of the observations, an `f64` stored as its bits.
    pub(super) sum: AtomicU64,
    pub(super) count: AtomicU64,
}

impl Cells {
    pub(super) fn new(bounds: &[f64]) -> Self {
        let mut b: Vec<f64> = bounds.iter().copied().filter(|v| v.is_finite()).collect();
        b.sort_by(f64::total_cmp);
        b.dedup();
        Cells {
            buckets: (0..=b.len()).map(|_| AtomicU64::new(0)).collect(),
            bounds: b,
            sum: AtomicU64::new(0f64.to_bits()),
            count: AtomicU64::new(0),
        }
    }

    /// The cumulative count per bound (`le`), then the `+Inf` bucket (= the count).
    pub(super) fn cumulative(&self) -> Vec<u64> {
        let mut total = 0;
        self.buckets
            .iter()
            .map(|b| {
                total += b.load(Ordering::Relaxed);
                total
            })
            .collect()
    }

    pub(super) fn sum(&self) -> f64 {
        f64::from_bits(self.sum.load(Ordering::Relaxed))
    }
}

/// Observations (durations, sizes, latencies) counted into fixed buckets: the Prometheus
/// histogram. Observing is lock-free (three relaxed atomic updates); the registry renders
/// it as `NAME_bucket{…,le="…"}` lines with cumulative counts up to `le="+Inf"`, then
/// `NAME_sum` and `NAME_count`. [`super::value`] reads a histogram as its count.
///
/// ```
/// use weir_core::metrics;
/// let h = metrics::histogram(
///     "doc_wait_seconds",
///     "How long the doc example waited.",
///     &[("job", "doc")],
///     &[0.1, 1.0],
/// );
/// h.observe(0.05);
/// h.observe(0.5);
/// h.observe(3.0);
/// assert_eq!(h.count(), 3);
/// assert_eq!(h.sum(), 3.55);
/// let text = metrics::render();
/// assert!(text.contains(
///     "# TYPE doc_wait_seconds histogram\n\
///      doc_wait_seconds_bucket{job=\"doc\",le=\"0.1\"} 1\n\
///      doc_wait_seconds_bucket{job=\"doc\",le=\"1\"} 2\n\
///      doc_wait_seconds_bucket{job=\"doc\",le=\"+Inf\"} 3\n\
///      doc_wait_seconds_sum{job=\"doc\"} 3.55\n\
///      doc_wait_seconds_count{job=\"doc\"} 3\n"
/// ));
/// assert_eq!(metrics::value("doc_wait_seconds", &[("job", "doc")]), Some(3.0));
/// ```
#[derive(Clone, Debug)]
pub struct Histogram(pub(super) Arc<Cells>);

impl Histogram {
    /// Counts `v` into the first bucket whose bound is at least `v` (the `+Inf` bucket if
    /// none is) and adds it to the sum. A `NaN` is counted in `+Inf` and makes the sum `NaN`.
    pub fn observe(&self, v: f64) {
        let c = &self.0;
        let i = if v.is_nan() {
            c.bounds.len()
        } else {
            c.bounds.partition_point(|b| *b < v)
        };
        c.buckets[i].fetch_add(1, Ordering::Relaxed);
        let _ = c
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + v).to_bits())
            });
        c.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.0.count.load(Ordering::Relaxed)
    }

    /// The sum of the observations so far.
    pub fn sum(&self) -> f64 {
        self.0.sum()
    }

    /// The bucket bounds (ascending, without `+Inf`).
    pub fn bounds(&self) -> &[f64] {
        &self.0.bounds
    }
}
