//! The worker: joins a coordinator, runs the tasks it is given, bridges the channels that
//! cross to other workers, and reconnects when it loses the coordinator.
//!
//! An attempt's tasks on this worker are started, relayed and stopped by `worker_attempt`.

use super::data::DataPlane;
use super::mono_us;
use super::transport::{Reader, Writer};
use super::wire::{self, Body, Wire};
use super::worker_attempt::{WorkerAttempt, start_attempt};
use crate::task::{JobShared, TaskCommand};
use crate::{JobResult, TaskStats};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
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
                        a.stop(job.cfg.cancellation_timeout);
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
            a.stop(job.cfg.cancellation_timeout);
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
