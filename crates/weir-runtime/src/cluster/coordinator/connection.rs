//! A worker's connection to the coordinator: admitting it (TLS, the job's secret, the
//! protocol version, the graph's fingerprint), answering its heartbeats, routing its tasks'
//! events to the current attempt (staging the checkpoint files that come with their
//! acknowledgements, dropping a zombie's messages), and declaring it lost when the
//! connection ends or falls silent.

use super::{Shared, State, WorkerEntry, admin};
use crate::cluster::wire::{self, Body, Wire, WireEvent};
use crate::cluster::{auth, transport};
use crate::task::TaskEvent;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::UnboundedSender;
use weir_core::Error;
use weir_core::ids::CheckpointId;

pub(super) async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                tokio::spawn(serve(shared.clone(), stream, peer));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn refuse(w: &mut transport::Writer, reason: String) {
    let _ = wire::write_frame(w, &wire::encode(&Wire::Refused { reason })).await;
}

/// One connection: a worker for as long as it lives (or an administration tool of an
/// earlier version, told where the REST API is).
async fn serve(shared: Arc<Shared>, stream: TcpStream, peer: SocketAddr) {
    let (mut r, mut w) =
        match transport::server(stream, shared.job.cfg.tls.as_ref(), "coordinator").await {
            Ok(halves) => halves,
            Err(Some(reason)) => {
                tracing::warn!(%peer, %reason, "refused a connection from {peer}: {reason}");
                return;
            }
            Err(None) => return,
        };
    let first = match tokio::time::timeout(shared.timeout, wire::read_frame(&mut r)).await {
        Ok(Ok(Some(b))) => b,
        _ => return,
    };
    let secret = shared.job.cfg.secret.as_ref();
    let first = match auth::server(&mut r, &mut w, secret, first, "coordinator").await {
        Ok(auth::Admitted::Open(first)) => first,
        Ok(auth::Admitted::Authenticated) => {
            match tokio::time::timeout(shared.timeout, wire::read_frame(&mut r)).await {
                Ok(Ok(Some(b))) => b,
                _ => return,
            }
        }
        Err(reason) => {
            tracing::warn!(%peer, %reason, "refused a connection from {peer}: {reason}");
            return;
        }
    };
    match wire::decode(&first) {
        Ok(Body::Json) | Err(_) if first.first() == Some(&b'J') => {
            let _ = wire::write_frame(&mut w, &wire::encode_json(&admin::moved())).await;
            return;
        }
        Ok(Body::Wire(Wire::Hello { protocol })) if protocol == wire::PROTOCOL => {}
        Ok(Body::Wire(Wire::Hello { protocol })) => {
            let reason = format!(
                "the worker speaks cluster protocol {protocol} and the coordinator {}: run the same weir version everywhere",
                wire::PROTOCOL
            );
            refuse(&mut w, reason).await;
            return;
        }
        _ => return,
    }
    let welcome = Wire::Welcome {
        job: shared.name.clone(),
        args: shared.args.clone(),
        heartbeat_ms: shared.heartbeat.as_millis() as u64,
        timeout_ms: shared.timeout.as_millis() as u64,
    };
    if wire::write_frame(&mut w, &wire::encode(&welcome))
        .await
        .is_err()
    {
        return;
    }
    // The worker builds the graph from the arguments before it registers.
    let register =
        match tokio::time::timeout(Duration::from_secs(600), wire::read_frame(&mut r)).await {
            Ok(Ok(Some(b))) => wire::decode(&b),
            _ => return,
        };
    let (fingerprint, slots, data_port) = match register {
        Ok(Body::Wire(Wire::Register {
            fingerprint,
            slots,
            data_port,
        })) => (fingerprint, slots, data_port),
        _ => return,
    };
    if fingerprint != shared.fingerprint {
        let reason = format!(
            "the worker built a different job graph than the coordinator (fingerprint {fingerprint:016x}, expected {:016x}): start workers from the same program and version as the coordinator",
            shared.fingerprint
        );
        tracing::warn!(job = %shared.name, %peer, %reason, "refused a worker from {peer}: {reason}");
        refuse(&mut w, reason).await;
        return;
    }
    if slots == 0 {
        refuse(&mut w, "a worker needs at least 1 slot".into()).await;
        return;
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let id = {
        let mut st = shared.state();
        st.next_worker += 1;
        let id = st.next_worker;
        st.workers.insert(
            id,
            WorkerEntry {
                slots,
                data: SocketAddr::new(peer.ip(), data_port).to_string(),
                peer,
                out: tx.clone(),
            },
        );
        // Queued before the lock is released: a deployment that sees the new worker
        // queues its `Deploy` behind this, which the worker must read first.
        let _ = tx.send(wire::encode(&Wire::Accepted { worker: id }));
        id
    };
    tracing::info!(
        job = %shared.name,
        worker = id,
        %peer,
        slots,
        "worker {id} joined from {peer} with {slots} slot(s)"
    );
    let _ = shared.changed.send(());
    let writer = tokio::spawn(async move {
        let _ = wire::pump(w, &mut rx).await;
    });
    let reason = loop {
        match tokio::time::timeout(shared.timeout, wire::read_frame(&mut r)).await {
            Err(_) => {
                break format!("no heartbeat for {} ms", shared.timeout.as_millis());
            }
            Ok(Err(e)) => break format!("connection failed: {e}"),
            Ok(Ok(None)) => break "connection closed".to_string(),
            Ok(Ok(Some(body))) => match wire::decode(&body) {
                Ok(Body::Wire(msg)) => on_message(&shared, id, &tx, msg),
                _ => break "it sent an invalid message".to_string(),
            },
        }
    };
    lost(&shared, id, &reason);
    writer.abort();
}

/// Handles one message of worker `id`.
fn on_message(shared: &Shared, id: u32, tx: &UnboundedSender<Vec<u8>>, msg: Wire) {
    match msg {
        Wire::Ping { nonce } => {
            let _ = tx.send(wire::encode(&Wire::Pong { nonce }));
        }
        Wire::Alignment { members } => {
            // Watermark alignment across workers: take this worker's reports, answer with
            // every member's.
            let alignment = &shared.job.alignment;
            alignment.import(&members);
            let members = alignment.all_reports();
            let _ = tx.send(wire::encode(&Wire::Alignment { members }));
        }
        Wire::Figures { attempt, tasks } => {
            // Without the state lock: a heartbeat's figures must never wait for it.
            if shared.figures_attempt.load(Ordering::SeqCst) == attempt {
                let job = &shared.job;
                job.status.remote_figures(&job.graph, &job.plan, tasks);
            }
        }
        Wire::Built { attempt } => {
            let mut st = shared.state();
            let State { route, workers, .. } = &mut *st;
            let Some(route) = route.as_mut().filter(|r| r.attempt == attempt) else {
                shared.stale_messages.inc();
                return;
            };
            route.built.insert(id);
            if !route.started && route.workers.is_subset(&route.built) {
                route.started = true;
                for w in &route.workers {
                    if let Some(w) = workers.get(w) {
                        let _ = w.out.send(wire::encode(&Wire::Start { attempt }));
                    }
                }
            }
        }
        Wire::Event {
            attempt,
            head,
            subtask,
            event,
        } => {
            let event = match event {
                WireEvent::Ack {
                    id: ck,
                    mut snapshot,
                    files,
                    failed,
                    stored,
                    alignment_us,
                    sync_us,
                } => {
                    if !is_current(shared, id, attempt, head, subtask) {
                        // A zombie's acknowledgement: nothing of it is staged.
                        shared.stale_messages.inc();
                        return;
                    }
                    let snapshot = if stored.is_empty() || failed.is_some() {
                        stage(
                            shared,
                            tx,
                            id,
                            attempt,
                            (head, subtask),
                            ck,
                            snapshot,
                            files,
                            failed,
                        )
                    } else {
                        // The worker stored the files itself (checkpoints on object
                        // storage): nothing to stage, the manifest refers to them.
                        for (op, s) in stored {
                            if let Some(snap) = snapshot.get_mut(&op) {
                                snap.stored = Some(s);
                            }
                        }
                        snapshot
                    };
                    WireEvent::Ack {
                        id: ck,
                        snapshot,
                        files: Vec::new(),
                        failed: None,
                        stored: Vec::new(),
                        alignment_us,
                        sync_us,
                    }
                }
                other => other,
            };
            route_event(shared, id, attempt, head, subtask, event);
        }
        other => {
            tracing::warn!(worker = id, message = ?other, "unexpected message from a worker");
        }
    }
}

fn route_event(shared: &Shared, worker: u32, attempt: u64, head: u32, subtask: u32, ev: WireEvent) {
    let mut st = shared.state();
    let Some(route) = st.route.as_mut().filter(|r| r.attempt == attempt) else {
        shared.stale_messages.inc();
        return;
    };
    let Some(&task) = route.index.get(&(head as usize, subtask as usize)) else {
        return;
    };
    if route.worker_of[task] != worker {
        shared.stale_messages.inc();
        return;
    }
    match ev {
        WireEvent::SourceFinished => {
            let _ = route.events.send(TaskEvent::SourceFinished { task });
        }
        WireEvent::Done { records, error } => {
            if std::mem::replace(&mut route.done[task], true) {
                return;
            }
            let result = match error {
                None => Ok(records),
                Some(e) => Err(e.into_error()),
            };
            let _ = route.events.send(TaskEvent::Done {
                task,
                result: Ok(result),
            });
        }
        WireEvent::Ack {
            id,
            snapshot,
            alignment_us,
            sync_us,
            ..
        } => {
            let _ = route.events.send(TaskEvent::Ack {
                task,
                id: CheckpointId(id),
                snapshot,
                alignment: Duration::from_micros(alignment_us),
                sync: Duration::from_micros(sync_us),
            });
        }
    }
}

/// True when `worker` runs subtask `subtask` of `head` in the current attempt `attempt`.
fn is_current(shared: &Shared, worker: u32, attempt: u64, head: u32, subtask: u32) -> bool {
    let st = shared.state();
    st.route.as_ref().is_some_and(|r| {
        r.attempt == attempt
            && r.index
                .get(&(head as usize, subtask as usize))
                .is_some_and(|&t| r.worker_of[t] == worker)
    })
}

/// Stages an acknowledgement's files (outside the state lock). When that fails, or the
/// worker could not produce them (`failed`), the acknowledgement is still passed on, with
/// the failure as the outcome of its asynchronous part: writing the checkpoint then fails
/// at once, so that checkpoint is aborted and the next one starts on time. The worker is
/// told to send the task's files again with its next acknowledgement.
#[allow(clippy::too_many_arguments)]
fn stage(
    shared: &Shared,
    tx: &UnboundedSender<Vec<u8>>,
    worker: u32,
    attempt: u64,
    task: (u32, u32),
    checkpoint: u64,
    mut snapshot: BTreeMap<String, weir_core::checkpoint::OperatorSnapshot>,
    files: Vec<(String, Vec<u8>)>,
    failed: Option<String>,
) -> BTreeMap<String, weir_core::checkpoint::OperatorSnapshot> {
    let outcome = match failed {
        Some(reason) => Err(format!("the worker could not produce them: {reason}")),
        None => tokio::task::block_in_place(|| {
            shared
                .staging
                .stage(attempt, task, checkpoint, &mut snapshot, files)
        })
        .map_err(|e| e.to_string()),
    };
    if let Err(reason) = outcome {
        let (head, subtask) = task;
        let message = format!(
            "staging the checkpoint {checkpoint} files of node {head} subtask {subtask} from worker {worker} failed: {reason}"
        );
        tracing::warn!(
            job = %shared.name,
            checkpoint,
            worker,
            operator_node = head,
            subtask,
            %reason,
            "job '{}': {message}; checkpoint {checkpoint} fails, and the worker sends the files again with the next one",
            shared.name
        );
        let _ = tx.send(wire::encode(&Wire::Resend {
            attempt,
            head,
            subtask,
        }));
        let error = weir_core::checkpoint::DeferredFiles::default();
        error.set(Err(Error::User(message)));
        for snap in snapshot.values_mut() {
            snap.files.clear();
            snap.deferred.push(error.clone());
        }
    }
    snapshot
}

/// Worker `id` is gone: its running tasks fail, which cancels and restarts the attempt.
fn lost(shared: &Shared, id: u32, reason: &str) {
    let mut st = shared.state();
    let Some(w) = st.workers.remove(&id) else {
        return;
    };
    let ended = matches!(st.phase, "finished" | "failed");
    if !ended {
        shared.workers_lost.inc();
        tracing::warn!(
            job = %shared.name,
            worker = id,
            peer = %w.peer,
            reason,
            "job '{}': worker {id} ({}) lost: {reason}",
            shared.name,
            w.peer
        );
    }
    if let Some(route) = st.route.as_mut() {
        for task in 0..route.worker_of.len() {
            if route.worker_of[task] == id && !std::mem::replace(&mut route.done[task], true) {
                let _ = route.events.send(TaskEvent::Done {
                    task,
                    result: Ok(Err(Error::Remote {
                        message: format!("worker {id} at {} was lost: {reason}", w.data),
                        deterministic: false,
                        secondary: false,
                    })),
                });
            }
        }
    }
    drop(st);
    let _ = shared.changed.send(());
}
