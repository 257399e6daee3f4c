//! Latency tracking, as Flink's latency markers: source tasks make a marker every
//! latency-tracking interval ([`Emitter`]) and sinks observe the markers that reach them
//! ([`observer`]) into `weir_end_to_end_latency_seconds{job,source,sink}`.
//!
//! The markers travel as [`Control::LatencyMarker`](weir_core::output::Control) events and
//! channel messages (`weir_core::exchange`); this module only makes and measures them. It
//! must not touch records, watermarks or checkpoints.

use crate::task::JobShared;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use weir_core::metrics::{self, Counter, Histogram, LATENCY_BUCKETS};
use weir_core::output::{LatencyMarker, now_us};

/// The histogram every sink subtask observes its markers' ages into.
pub(crate) const LATENCY_HISTOGRAM: &str = "weir_end_to_end_latency_seconds";
/// The counter of markers the source subtasks made.
pub(crate) const MARKERS_EMITTED: &str = "weir_latency_markers_emitted_total";

/// Makes one source subtask's markers.
pub(crate) struct Emitter {
    interval: Duration,
    next: Instant,
    source: u32,
    subtask: u32,
    emitted: Counter,
}

impl Emitter {
    /// For subtask `subtask` of source node `source`; the first marker is due after one
    /// interval.
    pub(crate) fn new(job: &JobShared, source: usize, subtask: usize, interval: Duration) -> Self {
        let name = &job.graph.nodes[source].name;
        let subtask_label = subtask.to_string();
        Emitter {
            interval,
            next: Instant::now() + interval,
            source: source as u32,
            subtask: subtask as u32,
            emitted: metrics::counter(
                MARKERS_EMITTED,
                "Latency markers a source subtask sent (latency tracking on).",
                &[
                    ("job", job.status.name.as_str()),
                    ("source", name.as_str()),
                    ("subtask", subtask_label.as_str()),
                ],
            ),
        }
    }

    /// A marker to send now, if one is due.
    pub(crate) fn due(&mut self) -> Option<LatencyMarker> {
        let now = Instant::now();
        if now < self.next {
            return None;
        }
        self.next = now + self.interval;
        self.emitted.inc();
        Some(LatencyMarker::now(self.source, self.subtask))
    }
}

/// What sink node `sink` does with a marker that reaches it: observes its age into the
/// histogram of its source and this sink.
pub(crate) fn observer(job: &JobShared, sink: usize) -> Box<dyn FnMut(LatencyMarker)> {
    let job_name = job.status.name.clone();
    let sink_name = job.graph.nodes[sink].name.clone();
    let names: Vec<String> = job.graph.nodes.iter().map(|n| n.name.clone()).collect();
    let mut histograms: HashMap<u32, Histogram> = HashMap::new();
    Box::new(move |m: LatencyMarker| {
        let h = histograms.entry(m.source).or_insert_with(|| {
            // A marker from a remote worker names its source by node index: the same
            // graph in every process.
            let source = names
                .get(m.source as usize)
                .cloned()
                .unwrap_or_else(|| format!("node {}", m.source));
            metrics::histogram(
                LATENCY_HISTOGRAM,
                "Seconds from a source making a latency marker to a sink receiving it (latency tracking on).",
                &[
                    ("job", job_name.as_str()),
                    ("source", source.as_str()),
                    ("sink", sink_name.as_str()),
                ],
                LATENCY_BUCKETS,
            )
        });
        h.observe(m.age_seconds(now_us()));
    })
}
