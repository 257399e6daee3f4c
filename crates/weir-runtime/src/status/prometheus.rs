//! The job's per-operator and per-task figures on `/metrics`, with Flink-like names and
//! labels, read from the status model when the endpoint is scraped: the task threads keep
//! updating their relaxed atomic cells and nothing on their path changes.
//!
//! Renders from [`JobStatus::operators_view`] (the same figures `/v1/operators` shows) so
//! the two never disagree. Must not register series in the process registry: these belong
//! to one job and end with it.

use super::JobStatus;
use serde_json::Value;
use weir_core::metrics::{Sample, write_family};

/// A per-subtask figure of `/v1/operators` rendered as a family.
struct Figure {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    /// The field of a subtask in `/v1/operators`.
    field: &'static str,
    /// Multiplies the field (a ratio into ms per second).
    scale: f64,
    /// Per task (the chain's head only, labelled `task`) rather than per operator.
    per_task: bool,
}

const FIGURES: &[Figure] = &[
    Figure {
        name: "weir_operator_records_in_total",
        help: "Records into the operator subtask (Flink's numRecordsIn); counted while the job serves its REST API.",
        kind: "counter",
        field: "records_in",
        scale: 1.0,
        per_task: false,
    },
    Figure {
        name: "weir_operator_records_out_total",
        help: "Records out of the operator subtask (Flink's numRecordsOut); counted while the job serves its REST API.",
        kind: "counter",
        field: "records_out",
        scale: 1.0,
        per_task: false,
    },
    Figure {
        name: "weir_operator_current_input_watermark",
        help: "The last watermark into the operator subtask (sources: out of it), in milliseconds since the Unix epoch (Flink's currentInputWatermark).",
        kind: "gauge",
        field: "watermark",
        scale: 1.0,
        per_task: false,
    },
    Figure {
        name: "weir_task_busy_time_ms_per_second",
        help: "Milliseconds per second the task was neither idle nor backpressured, over the last seconds (Flink's busyTimeMsPerSecond).",
        kind: "gauge",
        field: "busy_ratio",
        scale: 1000.0,
        per_task: true,
    },
    Figure {
        name: "weir_task_idle_time_ms_per_second",
        help: "Milliseconds per second the task waited for input, over the last seconds (Flink's idleTimeMsPerSecond).",
        kind: "gauge",
        field: "idle_ratio",
        scale: 1000.0,
        per_task: true,
    },
    Figure {
        name: "weir_task_backpressured_time_ms_per_second",
        help: "Milliseconds per second the task waited on full output channels, over the last seconds (Flink's backPressuredTimeMsPerSecond).",
        kind: "gauge",
        field: "backpressured_ratio",
        scale: 1000.0,
        per_task: true,
    },
    Figure {
        name: "weir_task_input_queued_records",
        help: "Records queued in the task's input channels from other tasks: written upstream, not yet taken (in flight, what an aligned barrier waits behind).",
        kind: "gauge",
        field: "records_queued_in",
        scale: 1.0,
        per_task: true,
    },
    Figure {
        name: "weir_task_input_in_flight_limit_records",
        help: "The sum of the in-flight limits of the task's input channels, in records: about in_flight_target of throughput each (Flink's buffer debloating), or their capacity when it is off.",
        kind: "gauge",
        field: "in_flight_limit_records",
        scale: 1.0,
        per_task: true,
    },
    Figure {
        name: "weir_task_busy_time_ms_total",
        help: "Milliseconds the task was neither idle nor backpressured since it started (rate() of it is busy time per second).",
        kind: "counter",
        field: "busy_ms",
        scale: 1.0,
        per_task: true,
    },
    Figure {
        name: "weir_task_idle_time_ms_total",
        help: "Milliseconds the task waited for input since it started.",
        kind: "counter",
        field: "idle_ms",
        scale: 1.0,
        per_task: true,
    },
    Figure {
        name: "weir_task_backpressured_time_ms_total",
        help: "Milliseconds the task waited on full output channels since it started.",
        kind: "counter",
        field: "backpressured_ms",
        scale: 1.0,
        per_task: true,
    },
    Figure {
        name: "weir_source_alignment_paused_time_ms_total",
        help: "Milliseconds the source subtask stopped reading because its watermark was more than the maximum drift ahead of its watermark alignment group (aligned sources only).",
        kind: "counter",
        field: "alignment_paused_ms",
        scale: 1.0,
        per_task: true,
    },
];

impl JobStatus {
    /// The job's operator and task figures in the Prometheus text format: records in and
    /// out and the input watermark per operator subtask, busy, idle and backpressured time
    /// per task subtask, each labelled with the job. A figure the job does not measure
    /// (records without the REST API, a watermark not reached yet) has no series.
    pub(crate) fn prometheus(&self) -> String {
        let view = self.operators_view();
        let operators = view["operators"].as_array().cloned().unwrap_or_default();
        let name_of = |id: &Value| -> Option<String> {
            operators
                .iter()
                .find(|o| o["id"] == *id)
                .and_then(|o| o["name"].as_str())
                .map(str::to_string)
        };
        let mut out = String::new();
        for f in FIGURES {
            let mut samples: Vec<Sample<'_>> = Vec::new();
            for op in &operators {
                if f.per_task && op["task"] != op["id"] {
                    continue;
                }
                let name = op["name"].as_str().unwrap_or_default().to_string();
                let (key, label) = if f.per_task {
                    ("task", name_of(&op["task"]).unwrap_or(name))
                } else {
                    ("operator", name)
                };
                for s in op["subtasks"].as_array().into_iter().flatten() {
                    let Some(v) = s[f.field].as_f64() else {
                        continue;
                    };
                    let labels = vec![
                        ("job", self.name.clone()),
                        (key, label.clone()),
                        ("subtask", s["subtask"].to_string()),
                    ];
                    samples.push((labels, v * f.scale));
                }
            }
            write_family(&mut out, f.name, f.help, f.kind, &samples);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::model;
    use std::sync::atomic::Ordering;

    #[test]
    fn records_and_watermarks_are_labelled_with_job_operator_and_subtask() {
        let (graph, plan, s) = model();
        s.attempt_started(0);
        let source = s.task(&graph, &plan, 0, 0);
        source.nodes[0].records_out[0].store(3, Ordering::Relaxed);
        source.nodes[0]
            .watermark_out
            .store(1_000, Ordering::Relaxed);
        for (subtask, n) in [(0, 2), (1, 1)] {
            let t = s.task(&graph, &plan, 1, subtask);
            t.nodes[0].records_in[0].store(n, Ordering::Relaxed);
            t.nodes[0].records_out[0].store(n, Ordering::Relaxed);
        }
        let text = s.prometheus();
        for line in [
            "# TYPE weir_operator_records_in_total counter\n",
            "weir_operator_records_in_total{job=\"model\",operator=\"numbers\",subtask=\"0\"} 0\n",
            "weir_operator_records_in_total{job=\"model\",operator=\"double\",subtask=\"0\"} 2\n",
            "weir_operator_records_in_total{job=\"model\",operator=\"double\",subtask=\"1\"} 1\n",
            // The chained sink's records in are the map's records out.
            "weir_operator_records_in_total{job=\"model\",operator=\"discard\",subtask=\"1\"} 1\n",
            "weir_operator_records_out_total{job=\"model\",operator=\"numbers\",subtask=\"0\"} 3\n",
            "weir_operator_current_input_watermark{job=\"model\",operator=\"numbers\",subtask=\"0\"} 1000\n",
            "# TYPE weir_task_busy_time_ms_per_second gauge\n",
            "# TYPE weir_task_backpressured_time_ms_total counter\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        // Per task: the chain's head names it; the chained sink has no task series.
        assert_eq!(
            text.matches("weir_task_idle_time_ms_per_second{").count(),
            3,
            "{text}"
        );
        assert!(
            text.contains(
                "weir_task_idle_time_ms_total{job=\"model\",task=\"double\",subtask=\"1\"} "
            ),
            "{text}"
        );
        // No watermark reached yet: no series for it.
        assert!(!text.contains("current_input_watermark{job=\"model\",operator=\"double\""));
    }

    #[test]
    fn an_aligned_sources_paused_time_is_rendered_per_task() {
        let (mut graph, plan, s) = model();
        graph.nodes[0].watermark_alignment = Some(weir_core::watermark::WatermarkAlignment::new(
            "g",
            std::time::Duration::from_millis(100),
            std::time::Duration::from_millis(10),
        ));
        s.attempt_started(0);
        let source = s.task(&graph, &plan, 0, 0);
        source
            .alignment_paused_ns
            .as_ref()
            .expect("an aligned source has the cell")
            .store(2_500_000_000, Ordering::Relaxed);
        s.task(&graph, &plan, 1, 0);
        let text = s.prometheus();
        assert!(
            text.contains(
                "weir_source_alignment_paused_time_ms_total{job=\"model\",task=\"numbers\",subtask=\"0\"} 2500\n"
            ),
            "{text}"
        );
        // Tasks of operators that are not aligned sources have no series.
        assert_eq!(
            text.matches("weir_source_alignment_paused_time_ms_total{")
                .count(),
            1,
            "{text}"
        );
        let ops = s.operators_view();
        let numbers = &ops["operators"][0];
        assert_eq!(numbers["alignment_paused_ms"], 2500);
        assert_eq!(numbers["subtasks"][0]["alignment_paused_ms"], 2500);
        assert!(ops["operators"][1]["alignment_paused_ms"].is_null());
    }

    #[test]
    fn records_are_not_rendered_when_the_job_does_not_count_them() {
        let (graph, plan, s) = model();
        s.set_detailed(false);
        s.attempt_started(0);
        s.task(&graph, &plan, 0, 0);
        let text = s.prometheus();
        assert!(!text.contains("weir_operator_records_in_total"), "{text}");
        assert!(
            text.contains("weir_task_busy_time_ms_per_second{"),
            "{text}"
        );
    }
}
