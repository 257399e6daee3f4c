//! The coordinator's view of its workers and slots, which the REST API serves (`/v1/job`'s
//! `cluster`), and its answer to administration requests on the cluster port, which
//! earlier `weir cluster` tools sent there.

use super::Shared;

/// The job's phase and attempt, the workers with their slots and tasks.
pub(super) fn status(shared: &Shared) -> serde_json::Value {
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
    serde_json::json!({
        "job": shared.name,
        "state": st.phase,
        "attempt": st.route.as_ref().map(|r| r.attempt),
        "workers": workers,
        "slots": st.workers.values().map(|w| w.slots).sum::<u32>(),
    })
}

/// The answer to a JSON request on the cluster port: administration moved to the REST API
/// (actions there can require the job's secret; this port cannot check one).
pub(super) fn moved() -> serde_json::Value {
    serde_json::json!({
        "ok": false,
        "message": "this coordinator answers administration requests on its REST API, not on \
                    its cluster port: start it with --web HOST:PORT and run \
                    `weir cluster status --web HOST:PORT` (a weir tool of the same version)",
    })
}
