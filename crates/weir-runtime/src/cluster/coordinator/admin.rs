//! The coordinator's answers to `weir cluster` requests (status, cancel, savepoint).

use super::Shared;
use crate::cluster::wire::AdminRequest;
use std::sync::atomic::Ordering;
use weir_checkpoint::CheckpointStorage;

/// Answers a `weir cluster` request.
pub(super) fn answer(shared: &Shared, req: AdminRequest) -> serde_json::Value {
    match req {
        AdminRequest::Status => {
            let st = shared.state();
            let tasks_of = |id: u32| {
                st.route
                    .as_ref()
                    .map_or(0, |r| r.worker_of.iter().filter(|w| **w == id).count())
            };
            let workers: Vec<serde_json::Value> = st
                .workers
                .iter()
                .map(|(id, w)| {
                    serde_json::json!({
                        "id": id,
                        "address": w.peer.to_string(),
                        "data_address": w.data,
                        "slots": w.slots,
                        "tasks": tasks_of(*id),
                    })
                })
                .collect();
            let last = shared.job.cfg.checkpoint.as_ref().and_then(|c| {
                let storage = CheckpointStorage::open(&c.dir).ok()?;
                let latest = storage.latest_complete().ok()?.checkpoint?;
                Some(serde_json::json!({
                    "id": latest.manifest.checkpoint_id.0,
                    "kind": latest.manifest.kind.to_string(),
                    "path": latest.path.display().to_string(),
                }))
            });
            serde_json::json!({
                "job": shared.name,
                "state": st.phase,
                "attempt": st.route.as_ref().map(|r| r.attempt),
                "workers": workers,
                "slots": st.workers.values().map(|w| w.slots).sum::<u32>(),
                "last_checkpoint": last,
            })
        }
        AdminRequest::Cancel => {
            shared.job.cancel.store(true, Ordering::SeqCst);
            serde_json::json!({"ok": true, "message": format!("cancelling job '{}'", shared.name)})
        }
        AdminRequest::Savepoint { stop } => {
            if shared.job.cfg.checkpoint.is_none() {
                return serde_json::json!({"ok": false, "message": "the job runs without checkpoints; savepoints need a checkpoint directory"});
            }
            shared
                .job
                .savepoint_request
                .fetch_max(if stop { 2 } else { 1 }, Ordering::SeqCst);
            serde_json::json!({"ok": true, "message": if stop { "taking a savepoint, then stopping" } else { "taking a savepoint" }})
        }
    }
}
