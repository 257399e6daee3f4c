//! The REST API's JSON views of a job's status: `/v1/job`, `/v1/operators`,
//! `/v1/checkpoints` and `/v1/exceptions`, built from a snapshot on each request.

use super::*;

impl JobStatus {
    /// `GET /v1/job`.
    pub(crate) fn job_view(&self) -> serde_json::Value {
        let cluster = self
            .cluster
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|f| f());
        let i = self.inner();
        let now = crate::task::now_ms();
        let end = i.ended_ms.unwrap_or(now);
        serde_json::json!({
            "name": self.name,
            "state": i.state,
            "start_time_ms": self.start_ms,
            "end_time_ms": i.ended_ms,
            "uptime_ms": (end - self.start_ms).max(0),
            "attempt": i.attempt,
            "restarts": i.restarts,
            "parallelism": self.parallelism,
            "tasks": i.tasks.len(),
            "checkpointing": self.checkpoint_config.is_some(),
            "stopped_with_savepoint": i.stopped_with_savepoint,
            "failure": i.failure,
            "cluster": cluster,
        })
    }

    /// `GET /v1/operators`.
    pub(crate) fn operators_view(&self) -> serde_json::Value {
        let (attempt, tasks) = {
            let i = self.inner();
            (i.attempt, i.tasks.clone())
        };
        let now = Instant::now();
        let now_ms = crate::task::now_ms();
        let current: Vec<Totals> = tasks.iter().map(|t| t.totals()).collect();
        // The base of the rates: the oldest sample of this attempt within the window, or
        // the tasks' start.
        let base: Option<(f64, Vec<Totals>)> = {
            let s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
            s.iter()
                .find(|x| {
                    x.attempt == attempt
                        && x.tasks.len() == current.len()
                        && now.duration_since(x.at) <= WINDOW + Duration::from_secs(1)
                        && now.duration_since(x.at) >= Duration::from_millis(200)
                })
                .map(|x| (now.duration_since(x.at).as_secs_f64(), x.tasks.clone()))
        };
        let mut operators = Vec::new();
        for op in &self.operators {
            let mut subtasks = Vec::new();
            for (k, t) in tasks.iter().enumerate() {
                let Some(pos) = t.nodes.iter().position(|c| c.node == op.id) else {
                    continue;
                };
                let cells = &t.nodes[pos];
                let cur = &current[k];
                let (rin, rout) = cur.nodes[pos];
                let (secs, prev) = match &base {
                    Some((secs, b)) => (*secs, b[k].clone()),
                    None => (
                        cur.elapsed as f64 / 1e9,
                        Totals {
                            elapsed: 0,
                            idle: 0,
                            backpressured: 0,
                            nodes: vec![(0, 0); cur.nodes.len()],
                        },
                    ),
                };
                let rate = |now: u64, before: u64| {
                    if secs > 0.0 {
                        now.saturating_sub(before) as f64 / secs
                    } else {
                        0.0
                    }
                };
                let span = cur.elapsed.saturating_sub(prev.elapsed);
                let frac = |now: u64, before: u64| {
                    if span > 0 {
                        (now.saturating_sub(before) as f64 / span as f64).clamp(0.0, 1.0)
                    } else {
                        0.0
                    }
                };
                let idle = frac(cur.idle, prev.idle);
                let bp = frac(cur.backpressured, prev.backpressured);
                let ended = t.ended_ns.load(Ordering::Relaxed) > 0;
                let busy = if ended || span == 0 {
                    0.0
                } else {
                    (1.0 - idle - bp).max(0.0)
                };
                let has_inputs = !cells.records_in.is_empty();
                let wm = if has_inputs {
                    cells.watermark_in.load(Ordering::Relaxed)
                } else {
                    cells.watermark_out.load(Ordering::Relaxed)
                };
                let watermark = (self.detailed() && wm != MIN_WATERMARK).then_some(wm);
                let lag = watermark
                    .filter(|&w| w != MAX_WATERMARK)
                    .map(|w| now_ms.saturating_sub(w));
                let state = t.checkpointed_bytes.load(Ordering::Relaxed);
                // What the operator registered itself (weir::metrics), for this subtask.
                let subtask = t.subtask.to_string();
                let metrics: Vec<serde_json::Value> = weir_core::metrics::series_with(&[
                    ("operator", op.name.as_str()),
                    ("subtask", subtask.as_str()),
                ])
                .into_iter()
                .map(|m| {
                    let labels: serde_json::Map<String, serde_json::Value> = m
                        .labels
                        .into_iter()
                        .map(|(k, v)| (k, serde_json::Value::String(v)))
                        .collect();
                    serde_json::json!({ "name": m.name, "labels": labels, "value": m.value })
                })
                .collect();
                let in_flight = cells.queued_in.as_ref().and_then(|q| q.figures());
                subtasks.push(serde_json::json!({
                    "subtask": t.subtask,
                    "running": !ended,
                    "records_in": self.detailed().then_some(rin),
                    "records_out": self.detailed().then_some(rout),
                    "bytes_in": task::load(&cells.bytes_in).filter(|_| self.bytes()),
                    "bytes_out": task::load(&cells.bytes_out).filter(|_| self.bytes()),
                    "records_queued_in": in_flight.map(|f| f.queued),
                    "in_flight_limit_records": in_flight.map(|f| f.limit),
                    "records_in_per_second": self.detailed().then(|| rate(rin, prev.nodes[pos].0)),
                    "records_out_per_second": self.detailed().then(|| rate(rout, prev.nodes[pos].1)),
                    "busy_ratio": busy,
                    "idle_ratio": if ended { 1.0 } else { idle },
                    "backpressured_ratio": if ended { 0.0 } else { bp },
                    "busy_ms": (cur.elapsed - cur.idle - cur.backpressured) / 1_000_000,
                    "idle_ms": cur.idle / 1_000_000,
                    "backpressured_ms": cur.backpressured / 1_000_000,
                    // Watermark alignment: the time the source stopped reading (its task's
                    // head only; null when the source is not aligned).
                    "alignment_paused_ms": t
                        .alignment_paused_ns
                        .as_ref()
                        .filter(|_| t.head == op.id)
                        .map(|c| c.load(Ordering::Relaxed) / 1_000_000),
                    "watermark": watermark,
                    "watermark_lag_ms": lag,
                    "state_bytes": task::state(&cells.state_bytes).filter(|_| self.detailed()),
                    "checkpointed_state_bytes": (self.checkpoint_config.is_some()).then_some(state),
                    "metrics": metrics,
                }));
            }
            let total = |key: &str| -> serde_json::Value {
                if !self.detailed() {
                    return serde_json::Value::Null;
                }
                let s: f64 = subtasks.iter().filter_map(|s| s[key].as_f64()).sum();
                if key.ends_with("per_second") {
                    serde_json::json!(s)
                } else {
                    serde_json::json!(s as u64)
                }
            };
            let max = |key: &str| -> f64 {
                subtasks
                    .iter()
                    .filter_map(|s| s[key].as_f64())
                    .fold(0.0, f64::max)
            };
            // The operator's watermark is its slowest subtask's.
            let watermark = subtasks
                .iter()
                .map(|s| s["watermark"].as_i64())
                .collect::<Option<Vec<i64>>>()
                .and_then(|w| w.into_iter().min());
            let lag = watermark
                .filter(|&w| w != MAX_WATERMARK)
                .map(|w| now_ms.saturating_sub(w));
            let mut v = serde_json::to_value(op).expect("serializable");
            let o = v.as_object_mut().expect("an object");
            o.insert("records_in".into(), total("records_in"));
            o.insert("records_out".into(), total("records_out"));
            o.insert(
                "records_in_per_second".into(),
                total("records_in_per_second"),
            );
            o.insert(
                "records_out_per_second".into(),
                total("records_out_per_second"),
            );
            o.insert("busy_ratio".into(), serde_json::json!(max("busy_ratio")));
            o.insert(
                "backpressured_ratio".into(),
                serde_json::json!(max("backpressured_ratio")),
            );
            o.insert("watermark".into(), serde_json::json!(watermark));
            o.insert("watermark_lag_ms".into(), serde_json::json!(lag));
            o.insert("bytes_in".into(), partitions::sum(&subtasks, "bytes_in"));
            o.insert("bytes_out".into(), partitions::sum(&subtasks, "bytes_out"));
            for key in ["records_queued_in", "in_flight_limit_records"] {
                o.insert(key.into(), partitions::sum(&subtasks, key));
            }
            o.insert(
                "state_bytes".into(),
                partitions::sum(&subtasks, "state_bytes"),
            );
            o.insert(
                "alignment_paused_ms".into(),
                partitions::sum(&subtasks, "alignment_paused_ms"),
            );
            o.insert("partitions".into(), partitions::view(op.id, &tasks));
            o.insert("subtasks".into(), serde_json::Value::Array(subtasks));
            operators.push(v);
        }
        serde_json::json!({
            "attempt": attempt,
            "operators": operators,
            "edges": self.edges,
        })
    }

    /// `GET /v1/checkpoints`.
    pub(crate) fn checkpoints_view(&self) -> serde_json::Value {
        let i = self.inner();
        let in_progress = i
            .checkpoints
            .iter()
            .filter(|c| c.status == "IN_PROGRESS")
            .count();
        let latest = i.checkpoints.iter().find(|c| c.status == "COMPLETED");
        serde_json::json!({
            "enabled": self.checkpoint_config.is_some(),
            "config": self.checkpoint_config,
            "counts": {
                "completed": i.completed,
                "failed": i.failed,
                "in_progress": in_progress,
            },
            "latest_completed": latest,
            "history": i.checkpoints,
        })
    }

    /// `GET /v1/exceptions`.
    pub(crate) fn exceptions_view(&self) -> serde_json::Value {
        let i = self.inner();
        serde_json::json!({ "exceptions": i.exceptions })
    }
}
