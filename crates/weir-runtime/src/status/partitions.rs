//! Figures of an operator in `/v1/operators` gathered over its subtasks: the `partitions`
//! (for a source that reports the partitions it reads, as the Kafka source does, each
//! subtask's partitions with their position, high watermark and lag; an empty array for
//! every other operator) and sums of optional figures (bytes).

use super::TaskMetrics;
use std::sync::Arc;

/// The partitions read by the subtasks of operator `node`, by subtask, topic, partition.
pub(super) fn view(node: usize, tasks: &[Arc<TaskMetrics>]) -> serde_json::Value {
    let mut rows = Vec::new();
    for t in tasks {
        let Some(cells) = t.node(node) else { continue };
        for p in cells.partition_figures() {
            rows.push((t.subtask, p));
        }
    }
    rows.sort_by(|(a, p), (b, q)| (a, &p.topic, p.partition).cmp(&(b, &q.topic, q.partition)));
    rows.into_iter()
        .map(|(subtask, p)| {
            serde_json::json!({
                "subtask": subtask,
                "topic": p.topic,
                "partition": p.partition,
                "position": p.position,
                "high_watermark": p.high_watermark,
                "lag": p.lag(),
            })
        })
        .collect()
}

/// The sum of the subtasks' `key` (an integer or null): null when every subtask's is.
pub(super) fn sum(subtasks: &[serde_json::Value], key: &str) -> serde_json::Value {
    let values: Vec<u64> = subtasks.iter().filter_map(|s| s[key].as_u64()).collect();
    if values.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::json!(values.iter().sum::<u64>())
    }
}
