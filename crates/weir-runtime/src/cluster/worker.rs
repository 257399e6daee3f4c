//! The worker: joins a coordinator, runs the tasks it is given, bridges the channels that
//! cross to other workers, and reconnects when it loses the coordinator.

use super::data::{DataPlane, RemoteLink};
use super::mono_us;
use super::sent::{SentFiles, ack_files};
use super::transport::{Reader, Writer};
use super::wire::{self, Body, Deploy, Wire, WireError, WireEvent};
use super::worker_restore::{operators_of, restore, restored_files};
use crate::job::{Commands, Subset};
use crate::task::{JobShared, StartGate, TaskCommand, TaskEvent};
use crate::{JobResult, TaskStats};
use crossbeam_channel::Sender;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use weir_core::{Error, Result};

/// A worker's connection to a coordinator, made by [`join`]: the job it runs and the
/// arguments to build that job's graph from.
pub struct Joined {
    rt: tokio::runtime::Runtime,
    coordinator: String,
    slots: u32,
    wait: Duration,
    job: String,
    args: Vec<String>,
    heartbeat: Duration,
    timeout: Duration,
    conn: Option<(Reader, Writer)>,
    /// What this worker proves itself with, to the coordinator and to other workers.
    credentials: Credentials,
}

/// What a worker proves itself with: the job's secret and its TLS settings, the same as
/// the coordinator's (docs/cluster.md). The default is neither: plain, unauthenticated
/// connections.
///
/// ```
/// let c = weir_runtime::cluster::Credentials::default();
/// assert!(c.secret.is_none() && c.tls.is_none());
/// ```
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// The job's shared secret.
    pub secret: Option<crate::Secret>,
    /// TLS settings: this process's certificate and key, and the cluster's CA.
    pub tls: Option<crate::Tls>,
}

impl Credentials {
    /// The secret and TLS settings the environment names (`WEIR_SECRET_FILE`,
    /// `WEIR_TLS_DIR`); neither when unset.
    pub fn from_env() -> Result<Credentials> {
        Ok(Credentials {
            secret: crate::Secret::from_env()?,
            tls: crate::Tls::from_env()?,
        })
    }
}

impl std::fmt::Debug for Joined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Joined")
            .field("coordinator", &self.coordinator)
            .field("job", &self.job)
            .field("slots", &self.slots)
            .finish()
    }
}

impl Joined {
    /// The name of the job the coordinator runs.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The job's arguments as the coordinator was given them: build the same graph from
    /// them (the coordinator refuses a worker whose graph differs).
    pub fn args(&self) -> &[String] {
        &self.args
    }
}

/// Connects to the coordinator at `coordinator` (`host:port`) as a worker with `slots`
/// slots, retrying for up to `wait` while it is not up yet.
///
/// # Errors
/// The coordinator cannot be reached within `wait`, or refuses the worker.
///
/// ```no_run
/// let joined = weir_runtime::join("127.0.0.1:7700", 2, std::time::Duration::from_secs(30))?;
/// println!("running job {} with arguments {:?}", joined.job(), joined.args());
/// # Ok::<(), weir_core::Error>(())
/// ```
pub fn join(coordinator: &str, slots: usize, wait: Duration) -> Result<Joined> {
    join_with(coordinator, slots, wait, Credentials::default())
}

/// [`join`] for a cluster whose processes hold a shared secret and/or TLS settings: this
/// worker and the coordinator (and later the workers among themselves) connect over TLS
/// with certificates of the cluster's CA and prove to each other that they hold the
/// secret, before anything else crosses the connection (docs/cluster.md).
///
/// # Errors
/// As [`join`]; also when the coordinator holds another secret or CA, or none.
///
/// ```no_run
/// use weir_runtime::{Secret, Tls, cluster::{Credentials, join_with}};
/// let credentials = Credentials {
///     secret: Some(Secret::from_file("/etc/weir/admin/secret")?),
///     tls: Some(Tls::from_dir("/etc/weir/tls")?),
/// };
/// let joined = join_with("127.0.0.1:7700", 2, std::time::Duration::from_secs(30), credentials)?;
/// # Ok::<(), weir_core::Error>(())
/// ```
pub fn join_with(
    coordinator: &str,
    slots: usize,
    wait: Duration,
    credentials: Credentials,
) -> Result<Joined> {
    if slots == 0 {
        return Err(Error::Config("a worker needs at least 1 slot".into()));
    }
    crate::logging::init()?;
    let rt = super::runtime("worker")?;
    let (conn, job, args, heartbeat, timeout) =
        rt.block_on(hello(coordinator, wait, &credentials))?;
    Ok(Joined {
        rt,
        coordinator: coordinator.to_string(),
        slots: slots as u32,
        wait,
        job,
        args,
        heartbeat,
        timeout,
        conn: Some(conn),
        credentials,
    })
}

type Welcomed = ((Reader, Writer), String, Vec<String>, Duration, Duration);

/// Connects (retrying within `wait`) and exchanges Hello / Welcome.
async fn hello(coordinator: &str, wait: Duration, credentials: &Credentials) -> Result<Welcomed> {
    let deadline = Instant::now() + wait;
    let mut delay = Duration::from_millis(50);
    let stream = loop {
        match TcpStream::connect(coordinator).await {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(Error::Config(format!(
                    "cannot reach the coordinator at {coordinator} within {} ms: {e}; check that it runs and that the address is right",
                    wait.as_millis()
                )));
            }
            Err(_) => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
    };
    if credentials.tls.is_none() && stream.peer_addr().is_ok_and(|a| !a.ip().is_loopback()) {
        tracing::warn!(
            "this worker's connections are plain text: give every process \
             TLS settings (--tls-dir) to encrypt them"
        );
    }
    let io = |e: std::io::Error| {
        super::transport::io_error(&format!("the coordinator at {coordinator}"), e)
    };
    let peer = format!("the coordinator at {coordinator}");
    let (mut r, mut w) = super::transport::client(stream, credentials.tls.as_ref(), &peer).await?;
    tokio::time::timeout(
        wait.max(Duration::from_secs(5)),
        super::auth::client(&mut r, &mut w, credentials.secret.as_ref(), &peer),
    )
    .await
    .map_err(|_| {
        Error::Config(format!(
            "{coordinator} accepted the connection but did not complete the authentication"
        ))
    })??;
    wire::write_frame(
        &mut w,
        &wire::encode(&Wire::Hello {
            protocol: wire::PROTOCOL,
        }),
    )
    .await
    .map_err(io)?;
    // Something that accepts the connection but never answers must not hold us forever.
    let answer_within = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_secs(5));
    let answer = tokio::time::timeout(answer_within, read(&mut r, coordinator))
        .await
        .map_err(|_| {
            Error::Config(format!(
                "{coordinator} accepted the connection but did not answer as a weir coordinator within {} ms",
                answer_within.as_millis()
            ))
        })??;
    match answer {
        Wire::Welcome {
            job,
            args,
            heartbeat_ms,
            timeout_ms,
        } => Ok((
            (r, w),
            job,
            args,
            Duration::from_millis(heartbeat_ms),
            Duration::from_millis(timeout_ms),
        )),
        Wire::Refused { reason } => Err(Error::Config(format!(
            "the coordinator at {coordinator} refused this worker: {reason}"
        ))),
        other => Err(Error::Config(format!(
            "unexpected answer from the coordinator at {coordinator}: {other:?}"
        ))),
    }
}

async fn read(r: &mut Reader, coordinator: &str) -> Result<Wire> {
    match wire::read_frame(r).await {
        Ok(Some(body)) => match wire::decode(&body) {
            Ok(Body::Wire(w)) => Ok(w),
            _ if super::auth::refusal(&body).is_some() => Err(Error::Config(format!(
                "the coordinator at {coordinator} refused this worker: {}",
                super::auth::refusal(&body).unwrap_or_default()
            ))),
            _ => Err(Error::Config(format!(
                "{coordinator} is not a weir coordinator (it sent something else)"
            ))),
        },
        Ok(None) => Err(Error::Remote {
            message: format!("the coordinator at {coordinator} closed the connection"),
            deterministic: false,
            secondary: false,
        }),
        Err(e) => Err(super::transport::io_error(
            &format!("the coordinator at {coordinator}"),
            e,
        )),
    }
}

/// One attempt's share on this worker.
struct WorkerAttempt {
    attempt: u64,
    cancel: Arc<AtomicBool>,
    gate: Option<Arc<StartGate>>,
    commands: HashMap<(usize, usize), Sender<TaskCommand>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    restore_dir: Option<PathBuf>,
    /// Which checkpoint files the coordinator holds for each task.
    sent: Arc<Mutex<SentFiles>>,
}

impl WorkerAttempt {
    fn idle(attempt: u64) -> Self {
        WorkerAttempt {
            attempt,
            cancel: Arc::new(AtomicBool::new(false)),
            gate: None,
            commands: HashMap::new(),
            threads: Vec::new(),
            restore_dir: None,
            sent: Arc::default(),
        }
    }

    fn sent(&self) -> std::sync::MutexGuard<'_, SentFiles> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stop(self) {
        self.cancel.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
        if let Some(d) = self.restore_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Why the connection to the coordinator ended.
enum Ended {
    /// The job is over.
    Job(Option<String>),
    /// The coordinator is gone (or we were cut off): reconnect.
    Lost(String),
    /// This worker was cancelled (`JobHandle::cancel`): leave the cluster.
    Cancelled,
}

/// Runs as a worker until the coordinator says the job is over.
pub(crate) fn run(name: &str, job: Arc<JobShared>, joined: Joined) -> Result<JobResult> {
    let started = Instant::now();
    let Joined {
        rt,
        coordinator,
        slots,
        wait,
        job: job_name,
        args,
        mut heartbeat,
        mut timeout,
        mut conn,
        credentials,
    } = joined;
    if job_name != name {
        return Err(Error::Config(format!(
            "the coordinator runs job '{job_name}' but this program builds job '{name}'"
        )));
    }
    let fingerprint = super::fingerprint(&job.graph, &job.plan, &job.cfg);
    let data = DataPlane::start(&rt, "0.0.0.0:0", credentials.clone())?;
    let stats: Arc<Mutex<HashMap<(usize, usize), TaskStats>>> = Arc::default();
    let mut attempts = 0u32;
    loop {
        let (mut r, mut w) = match conn.take() {
            Some(c) => c,
            None => {
                let (c, j, a, hb, to) = rt.block_on(hello(&coordinator, wait, &credentials))?;
                if j != job_name || a != args {
                    return Err(Error::Config(format!(
                        "the coordinator at {coordinator} now runs another job ('{j}' with arguments {a:?}); this worker ran '{job_name}' with {args:?}"
                    )));
                }
                (heartbeat, timeout) = (hb, to);
                c
            }
        };
        let me = rt.block_on(async {
            let register = Wire::Register {
                fingerprint,
                slots,
                data_port: data.port(),
            };
            wire::write_frame(&mut w, &wire::encode(&register))
                .await
                .map_err(|e| Error::io(format!("the coordinator at {coordinator}"), e))?;
            match read(&mut r, &coordinator).await? {
                Wire::Accepted { worker } => Ok(worker),
                Wire::Refused { reason } => Err(Error::Config(format!(
                    "the coordinator at {coordinator} refused this worker: {reason}"
                ))),
                other => Err(Error::Config(format!(
                    "unexpected answer from the coordinator: {other:?}"
                ))),
            }
        })?;
        tracing::info!(
            job = name,
            worker = me,
            coordinator = %coordinator,
            slots,
            "worker {me}: joined the coordinator at {coordinator} with {slots} slot(s)"
        );
        // The lease: this worker acts on the coordinator's word only until three quarters
        // of the heartbeat timeout after its last answered ping was sent. The coordinator
        // waits the full timeout after the last ping it heard before it declares us lost,
        // so we stop first.
        let lease_us = (timeout.as_micros() as u64) * 3 / 4;
        let lease = Arc::new(AtomicU64::new(mono_us() + lease_us));
        let (out, mut out_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let (ctl_tx, ctl_rx) = crossbeam_channel::unbounded::<Option<Wire>>();
        let writer = rt.spawn(async move {
            let _ = wire::pump(w, &mut out_rx).await;
        });
        let reader = {
            let lease = lease.clone();
            rt.spawn(async move {
                while let Ok(Some(body)) = wire::read_frame(&mut r).await {
                    match wire::decode(&body) {
                        Ok(Body::Wire(Wire::Pong { nonce })) => {
                            lease.fetch_max(nonce + lease_us, Ordering::SeqCst);
                        }
                        Ok(Body::Wire(msg)) => {
                            if ctl_tx.send(Some(msg)).is_err() {
                                return;
                            }
                        }
                        _ => break,
                    }
                }
                let _ = ctl_tx.send(None);
            })
        };
        // The attempt whose tasks run here (0: none), for the figures sent with each ping.
        let deployed = Arc::new(AtomicU64::new(0));
        let pinger = {
            let out = out.clone();
            let deployed = deployed.clone();
            let job = job.clone();
            rt.spawn(async move {
                let mut tick = tokio::time::interval(heartbeat);
                loop {
                    tick.tick().await;
                    if out
                        .send(wire::encode(&Wire::Ping { nonce: mono_us() }))
                        .is_err()
                    {
                        return;
                    }
                    if let Some(members) = job.alignment.local_reports() {
                        let _ = out.send(wire::encode(&Wire::Alignment { members }));
                    }
                    let attempt = deployed.load(Ordering::SeqCst);
                    if attempt > 0 {
                        let tasks = job.status.figures();
                        let _ = out.send(wire::encode(&Wire::Figures { attempt, tasks }));
                    }
                }
            })
        };
        let mut current: Option<WorkerAttempt> = None;
        let ended = loop {
            let msg = ctl_rx.recv_timeout(Duration::from_millis(20));
            if job.cancel.load(Ordering::SeqCst) {
                break Ended::Cancelled;
            }
            if mono_us() > lease.load(Ordering::SeqCst) {
                break Ended::Lost(format!(
                    "no answer from the coordinator for {} ms",
                    lease_us / 1000
                ));
            }
            match msg {
                Ok(Some(Wire::Deploy(d))) => {
                    if let Some(a) = current.take() {
                        a.stop();
                    }
                    job.status.clear_tasks();
                    job.status.set_detailed(d.count_records);
                    // Figures only go to a coordinator that serves them.
                    deployed.store(
                        if d.count_records { d.attempt } else { 0 },
                        Ordering::SeqCst,
                    );
                    attempts += 1;
                    current = Some(start_attempt(&job, &data, me, d, &out, &stats));
                }
                Ok(Some(Wire::Start { attempt })) => {
                    if let Some(a) = current.as_ref().filter(|a| a.attempt == attempt)
                        && let Some(g) = &a.gate
                    {
                        g.arrive();
                    }
                }
                Ok(Some(Wire::Command {
                    attempt,
                    head,
                    subtask,
                    command,
                })) => {
                    let task = (head as usize, subtask as usize);
                    if let Some(a) = current.as_ref().filter(|a| a.attempt == attempt)
                        && let Some(c) = a.commands.get(&task)
                    {
                        match command {
                            TaskCommand::Complete(id) => a.sent().completed(task, id.0),
                            TaskCommand::Abort(id) => a.sent().aborted(task, id.0),
                            // A slow link to the coordinator, for the tests: the final
                            // checkpoint's barriers may come first.
                            TaskCommand::Trigger(_, true) => {
                                crate::failpoint::hit("cluster.final_notice")
                            }
                            _ => {}
                        }
                        let _ = c.send(command);
                    }
                }
                Ok(Some(Wire::Resend {
                    attempt,
                    head,
                    subtask,
                })) => {
                    if let Some(a) = current.as_ref().filter(|a| a.attempt == attempt) {
                        a.sent().resend((head as usize, subtask as usize));
                    }
                }
                Ok(Some(Wire::Cancel { attempt })) => {
                    if let Some(a) = current.as_ref().filter(|a| a.attempt == attempt) {
                        a.cancel.store(true, Ordering::SeqCst);
                    }
                }
                Ok(Some(Wire::JobEnded { error })) => break Ended::Job(error),
                Ok(Some(Wire::Alignment { members })) => job.alignment.import(&members),
                Ok(Some(other)) => {
                    tracing::warn!(message = ?other, "unexpected message from the coordinator");
                }
                Ok(None) | Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    break Ended::Lost("the connection to the coordinator closed".into());
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            }
        };
        if matches!(ended, Ended::Cancelled) {
            // Leave before the tasks stop: the coordinator then learns the loss of this
            // worker as the cause, not the tasks' cancellation.
            writer.abort();
            reader.abort();
        }
        if let Some(a) = current.take() {
            a.stop();
        }
        data.clear(0);
        pinger.abort();
        reader.abort();
        drop(out);
        match ended {
            Ended::Job(error) => {
                // Let the writer flush, then close.
                let _ = rt
                    .block_on(async { tokio::time::timeout(Duration::from_secs(1), writer).await });
                rt.shutdown_timeout(Duration::from_secs(1));
                if let Some(e) = error {
                    return Err(Error::Remote {
                        message: format!("the job failed: {e}"),
                        deterministic: true,
                        secondary: false,
                    });
                }
                tracing::info!(job = name, worker = me, "worker {me}: the job is finished");
                super::report_object_storage(&job, &format!("worker {me}"));
                let mut tasks: Vec<TaskStats> = stats
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .values()
                    .cloned()
                    .collect();
                tasks.sort_by(|a, b| (&a.name, a.subtask).cmp(&(&b.name, b.subtask)));
                return Ok(JobResult {
                    name: name.to_string(),
                    elapsed: started.elapsed(),
                    tasks,
                    savepoints: Vec::new(),
                    stopped_with_savepoint: false,
                    checkpoints_completed: 0,
                    restarts: attempts.saturating_sub(1),
                });
            }
            Ended::Cancelled => {
                // The closed connection told the coordinator at once: it restarts the job
                // on the other workers, as for any lost worker.
                rt.shutdown_timeout(Duration::from_secs(1));
                tracing::info!(
                    job = name,
                    worker = me,
                    "worker {me}: cancelled; left the cluster"
                );
                return Err(Error::Cancelled);
            }
            Ended::Lost(reason) => {
                writer.abort();
                tracing::warn!(
                    job = name,
                    worker = me,
                    %reason,
                    "worker {me}: {reason}; stopped its tasks, reconnecting to {coordinator}"
                );
            }
        }
    }
}

/// Starts this worker's share of an attempt. Failures are reported to the coordinator as
/// failures of the tasks, which restarts the attempt.
fn start_attempt(
    job: &Arc<JobShared>,
    data: &DataPlane,
    me: u32,
    d: Deploy,
    out: &tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    stats: &Arc<Mutex<HashMap<(usize, usize), TaskStats>>>,
) -> WorkerAttempt {
    let attempt = d.attempt;
    // The tasks' events carry the worker and the coordinator's attempt number.
    let _span = tracing::info_span!("attempt", cluster_attempt = attempt, worker = me).entered();
    let local: HashSet<(usize, usize)> = d
        .tasks
        .iter()
        .filter(|(_, _, w)| *w == me)
        .map(|(h, s, _)| (*h as usize, *s as usize))
        .collect();
    if local.is_empty() {
        data.clear(attempt);
        return WorkerAttempt::idle(attempt);
    }
    let fail = |e: &Error| {
        for (h, s) in &local {
            send_event(
                out,
                attempt,
                *h,
                *s,
                WireEvent::Done {
                    records: 0,
                    error: Some(WireError::from_error(e)),
                },
            );
        }
    };
    let mut restore_dir = None;
    let mut map = crate::checkpoints::RestoreMap::new();
    let mut restored_from = None;
    if let Some(path) = &d.restore {
        let dir = crate::job::restore_scratch_dir();
        restore_dir = Some(dir.clone());
        let restored = tracing::info_span!("restore", path = %path.display())
            .in_scope(|| restore(job, path, &dir, &operators_of(job, &local)));
        match restored {
            Ok((m, manifest)) => {
                map = m;
                restored_from = Some(manifest);
            }
            Err(e) => {
                fail(&e);
                let mut a = WorkerAttempt::idle(attempt);
                a.restore_dir = restore_dir;
                return a;
            }
        }
    }
    // The files each task was restored with are in checkpoint storage already: its first
    // acknowledgement leaves out those it still uses (a savepoint's are its own copies).
    let sent: Arc<Mutex<SentFiles>> = Arc::default();
    if restored_from
        .as_ref()
        .is_some_and(|m| !m.kind.is_savepoint())
    {
        let mut sent = sent.lock().unwrap_or_else(|p| p.into_inner());
        for (task, names) in restored_files(job, &map, &local) {
            sent.restored(task, names);
        }
    }
    let built_out = out.clone();
    let gate = Arc::new(StartGate::clustered(
        local.len(),
        Box::new(move || {
            let _ = built_out.send(wire::encode(&Wire::Built { attempt }));
        }),
    ));
    let mut links = Vec::new();
    let launched = crate::job::launch_local(
        job,
        map,
        Some(Subset {
            local: &local,
            links: &mut |key, link| links.push((key, link)),
            start: gate.clone(),
        }),
    );
    let launched = match launched {
        Ok(l) => l,
        Err(e) => {
            fail(&e);
            let mut a = WorkerAttempt::idle(attempt);
            a.restore_dir = restore_dir;
            return a;
        }
    };
    let placement: HashMap<(usize, usize), u32> = d
        .tasks
        .iter()
        .map(|(h, s, w)| ((*h as usize, *s as usize), *w))
        .collect();
    let remote: Vec<RemoteLink> = links
        .into_iter()
        .map(|(key, link)| {
            let consumer = (key.node as usize, key.consumer as usize);
            let from = job.graph.nodes[key.node as usize].inputs[key.gate as usize]
                .from
                .0;
            let producer = (job.plan.head_of[from], key.producer as usize);
            let outgoing = local.contains(&producer);
            let peer = placement[if outgoing { &consumer } else { &producer }];
            RemoteLink {
                key,
                link,
                outgoing,
                peer,
            }
        })
        .collect();
    let addresses: HashMap<u32, String> = d.workers.iter().cloned().collect();
    let mut threads = launched.threads;
    let cancel = launched.cancel.clone();
    match data.wire_attempt(
        attempt,
        me,
        &addresses,
        remote,
        &cancel,
        &job.cfg.exchange_config(),
    ) {
        Ok(t) => threads.extend(t),
        Err(e) => {
            // The tasks are running: cancelling them makes each report its end; the
            // coordinator learns the cause from this report.
            cancel.store(true, Ordering::SeqCst);
            if let Some((h, s)) = local.iter().next() {
                send_event(
                    out,
                    attempt,
                    *h,
                    *s,
                    WireEvent::Done {
                        records: 0,
                        error: Some(WireError::from_error(&e)),
                    },
                );
            }
        }
    }
    let mut commands = HashMap::new();
    let mut keys = Vec::new();
    for r in &launched.running {
        let key = (r.key.node.0, r.key.subtask.0);
        keys.push((key, r.name.clone(), r.is_source));
        if let Commands::Local(s) = &r.commands {
            commands.insert(key, s.clone());
        }
    }
    // With checkpoints on object storage this worker stores its tasks' files itself and
    // acknowledges with references; otherwise it sends them to the coordinator.
    let task_storage = match task_storage(job, restored_from.as_ref()) {
        Ok(s) => s,
        Err(e) => {
            cancel.store(true, Ordering::SeqCst);
            fail(&e);
            None
        }
    };
    // Relays the tasks' reports to the coordinator.
    let events = launched.events;
    let out = out.clone();
    let stats = stats.clone();
    let sent_files = sent.clone();
    let forwarder = std::thread::Builder::new()
        .name("weir-worker-events".into())
        .spawn(move || {
            for ev in events {
                match ev {
                    TaskEvent::Ack {
                        task,
                        id,
                        mut snapshot,
                        alignment,
                        sync,
                    } => {
                        let ((h, s), _, _) = &keys[task];
                        let (files, failed, stored) = match &task_storage {
                            Some((storage, names)) => {
                                store_acknowledged(storage, names, id, *s, &mut snapshot)
                            }
                            None => {
                                let (files, failed) =
                                    ack_files(&mut snapshot, &sent_files, (*h, *s), id.0);
                                (files, failed, Vec::new())
                            }
                        };
                        send_event(
                            &out,
                            attempt,
                            *h,
                            *s,
                            WireEvent::Ack {
                                id: id.0,
                                snapshot,
                                files,
                                failed,
                                stored,
                                alignment_us: alignment.as_micros() as u64,
                                sync_us: sync.as_micros() as u64,
                            },
                        );
                    }
                    TaskEvent::SourceFinished { task } => {
                        let ((h, s), _, _) = &keys[task];
                        send_event(&out, attempt, *h, *s, WireEvent::SourceFinished);
                    }
                    TaskEvent::Done { task, result } => {
                        let ((h, s), name, is_source) = &keys[task];
                        let (records, error) = match result {
                            Ok(Ok(n)) => (n, None),
                            Ok(Err(e)) => (0, Some(WireError::from_error(&e))),
                            Err(p) => (0, Some(WireError::from_error(&Error::from_panic(p)))),
                        };
                        stats.lock().unwrap_or_else(|p| p.into_inner()).insert(
                            (*h, *s),
                            TaskStats {
                                name: name.clone(),
                                subtask: *s,
                                records,
                                is_source: *is_source,
                            },
                        );
                        send_event(&out, attempt, *h, *s, WireEvent::Done { records, error });
                    }
                }
            }
        });
    match forwarder {
        Ok(t) => threads.push(t),
        Err(e) => {
            cancel.store(true, Ordering::SeqCst);
            tracing::error!(error = %e, "cannot start the event relay thread");
        }
    }
    WorkerAttempt {
        attempt,
        cancel,
        gate: Some(gate),
        commands,
        threads,
        restore_dir,
        sent,
    }
}

/// The checkpoint storage this worker stores its tasks' files in, when the job's
/// checkpoints are on object storage (with the operators' names for the file names); `None`
/// in a directory, whose files go to the coordinator's staging area. When the attempt
/// restored checkpoint `restored`, that storage knows its files are stored: the first
/// checkpoint uploads only what changed since.
fn task_storage(
    job: &JobShared,
    restored: Option<&weir_checkpoint::Manifest>,
) -> Result<
    Option<(
        weir_checkpoint::CheckpointStorage,
        crate::checkpoints::OperatorNames,
    )>,
> {
    let Some(cfg) = &job.cfg.checkpoint else {
        return Ok(None);
    };
    if !cfg.dir.to_str().is_some_and(weir_objstore::is_url) {
        return Ok(None);
    }
    let storage = weir_checkpoint::CheckpointStorage::open(&cfg.dir).map_err(|e| {
        Error::Config(format!(
            "this worker cannot open checkpoint storage {}: {e}; every process needs the \
             same object storage settings (AWS_* environment variables)",
            cfg.dir.display()
        ))
    })?;
    if let Some(m) = restored {
        storage.remember_restored(m);
    }
    let names = crate::checkpoints::OperatorNames::new(&job.graph, &job.plan);
    Ok(Some((storage, names)))
}

type AckFiles = (
    Vec<(String, Vec<u8>)>,
    Option<String>,
    Vec<(String, weir_core::checkpoint::StoredSnapshot)>,
);

/// Stores a task's snapshots of checkpoint `id` in object storage: the acknowledgement's
/// references, or why it failed (the coordinator then fails the checkpoint).
fn store_acknowledged(
    storage: &weir_checkpoint::CheckpointStorage,
    names: &crate::checkpoints::OperatorNames,
    id: weir_core::ids::CheckpointId,
    subtask: usize,
    snapshot: &mut std::collections::BTreeMap<String, weir_core::checkpoint::OperatorSnapshot>,
) -> AckFiles {
    match crate::checkpoints::store_task_snapshots(storage, names, id, subtask, snapshot) {
        Ok(()) => {
            let stored = snapshot
                .iter_mut()
                .filter_map(|(op, snap)| snap.stored.take().map(|s| (op.clone(), s)))
                .collect();
            (Vec::new(), None, stored)
        }
        Err(e) => {
            tracing::warn!(checkpoint = id.0, error = %e, "storing checkpoint files failed");
            for snap in snapshot.values_mut() {
                *snap = weir_core::checkpoint::OperatorSnapshot::default();
            }
            let reason = format!("storing them in {} failed: {e}", storage.dir().display());
            (Vec::new(), Some(reason), Vec::new())
        }
    }
}

fn send_event(
    out: &tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    attempt: u64,
    head: usize,
    subtask: usize,
    event: WireEvent,
) {
    let _ = out.send(wire::encode(&Wire::Event {
        attempt,
        head: head as u32,
        subtask: subtask as u32,
        event,
    }));
}
