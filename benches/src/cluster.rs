//! keyed-sum as a cluster: this process is the coordinator and starts the worker processes
//! itself, from its own executable, so one command measures a cluster run.
//!
//! A worker is `weir-bench cluster-worker --coordinator ADDR --slots S` (a hidden
//! subcommand). It joins, builds keyed-sum from the job flags the coordinator hands out
//! (the coordinator's own keyed-sum flags, without the cluster ones), and talks back to the
//! coordinator's process on its standard output, one line each:
//!
//! - `ready` once it has joined and is about to build and register the job graph;
//! - `results N` at the end: the records its sinks emitted;
//! - `cpu S` last: the CPU seconds its process used (when the platform tells).
//!
//! The coordinator's elapsed time leaves out the workers' start-up: it is the job's
//! elapsed time (from the start of `execute` to the end of the last task) less the time
//! from that start until the last worker said `ready`.

use crate::jobs::{self, Run, Setup};
use anyhow::{Context, anyhow, bail};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use weir::cluster::ClusterConfig;

/// What a cluster run adds to the JSON line.
pub struct ClusterRun {
    pub run: Run,
    pub workers: usize,
    pub slots_per_worker: usize,
    /// From the start of the job to the last worker's `ready` (left out of `run`).
    pub startup_s: f64,
    pub restarts: u32,
    /// CPU seconds the workers' processes used, start-up included (`None` when a worker
    /// could not tell).
    pub workers_cpu_s: Option<f64>,
}

/// The worker processes of one run. Dropping it kills and reaps those still running.
struct Workers {
    children: Vec<Child>,
    /// Every line a worker printed; ends when every worker closed its output.
    lines: std::sync::mpsc::Receiver<Line>,
}

/// (worker, when it was read, the line).
type Line = (usize, Instant, String);

impl Workers {
    fn spawn(n: usize, coordinator: &str, slots: usize) -> anyhow::Result<Workers> {
        let exe = std::env::current_exe().context("finding weir-bench's own executable")?;
        let (tx, rx) = std::sync::mpsc::channel::<Line>();
        let mut workers = Workers {
            children: Vec::new(),
            lines: rx,
        };
        for i in 0..n {
            let mut child = Command::new(&exe)
                .args(["cluster-worker", "--coordinator", coordinator, "--slots"])
                .arg(slots.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .with_context(|| format!("starting worker {i} ({})", exe.display()))?;
            let out = child.stdout.take().expect("stdout is piped");
            workers.children.push(child);
            let tx = tx.clone();
            std::thread::Builder::new()
                .name(format!("weir-bench-worker-{i}"))
                .spawn(move || {
                    for line in std::io::BufReader::new(out).lines() {
                        let Ok(line) = line else { break };
                        if tx.send((i, Instant::now(), line)).is_err() {
                            break;
                        }
                    }
                })
                .context("starting a thread to read a worker's output")?;
        }
        Ok(workers)
    }

    /// The first worker that exited unsuccessfully, with its status.
    fn failed(&mut self) -> Option<String> {
        self.children
            .iter_mut()
            .enumerate()
            .find_map(|(i, c)| match c.try_wait() {
                Ok(Some(status)) if !status.success() => Some(format!("worker {i} {status}")),
                Ok(_) => None,
                Err(e) => Some(format!("worker {i} cannot be waited for: {e}")),
            })
    }

    /// Waits up to `timeout` for every worker to exit; errors if one failed or hangs.
    fn wait(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        for (i, c) in self.children.iter_mut().enumerate() {
            loop {
                if let Some(status) = c.try_wait()? {
                    if !status.success() {
                        bail!("worker {i} {status}");
                    }
                    break;
                }
                if Instant::now() >= deadline {
                    bail!(
                        "worker {i} did not exit within {} s of the job's end",
                        timeout.as_secs()
                    );
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(())
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.children {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// A free port on the loopback interface, for the coordinator to listen on.
fn free_local_address() -> anyhow::Result<String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.to_string())
}

/// Runs keyed-sum on `workers` worker processes of `slots` slots each, with this process
/// as the coordinator listening on `listen` (a free loopback port when `None`). `job_args`
/// are the keyed-sum flags (subcommand included) every worker builds the job from.
pub fn keyed_sum(
    events: u64,
    keys: u64,
    mut setup: Setup,
    workers: usize,
    slots: usize,
    listen: Option<&str>,
    job_args: Vec<String>,
) -> anyhow::Result<ClusterRun> {
    let listen = match listen {
        Some(l) => l.to_string(),
        None => free_local_address()?,
    };
    setup.cluster = Some(ClusterConfig::coordinator(&listen, workers, job_args));
    let (job, _) = jobs::start_keyed_sum(events, keys, &setup)?;
    let started = Instant::now();
    let mut procs = match Workers::spawn(workers, &listen, slots) {
        Ok(p) => p,
        Err(e) => {
            job.cancel();
            let _ = job.join();
            return Err(e);
        }
    };
    let mut ready = vec![None::<Instant>; workers];
    let mut results = vec![None::<u64>; workers];
    let mut cpu = vec![None::<f64>; workers];
    let mut on_line = |(i, at, line): Line| -> anyhow::Result<()> {
        if line == "ready" {
            ready[i] = Some(at);
        } else if let Some(n) = line.strip_prefix("results ") {
            results[i] = Some(
                n.parse()
                    .with_context(|| format!("worker {i} printed {line:?}"))?,
            );
        } else if let Some(s) = line.strip_prefix("cpu ") {
            cpu[i] = s.parse().ok();
        } else {
            bail!("worker {i} printed {line:?}, expected `ready`, `results N` or `cpu S`");
        }
        Ok(())
    };
    // Watch the workers while the job runs: a worker that dies would leave the
    // coordinator waiting for slots for ever.
    let mut failure = None;
    while !job.is_finished() {
        match procs.lines.recv_timeout(Duration::from_millis(20)) {
            Ok(item) => {
                if let Err(e) = on_line(item) {
                    failure.get_or_insert(e);
                    job.cancel();
                }
            }
            Err(e) => {
                if e == std::sync::mpsc::RecvTimeoutError::Disconnected {
                    // Every worker closed its output; the coordinator is winding down.
                    std::thread::sleep(Duration::from_millis(20));
                }
                if let Some(f) = procs.failed() {
                    failure.get_or_insert(anyhow!("{f}; cancelling the job"));
                    job.cancel();
                }
            }
        }
    }
    let result = job.join();
    if let Some(f) = failure {
        return Err(f);
    }
    let r = result.context("the coordinator's job")?;
    // The coordinator told every worker the job is over: they print their results and exit.
    procs.wait(Duration::from_secs(30))?;
    while let Ok(item) = procs.lines.recv_timeout(Duration::from_secs(5)) {
        on_line(item)?;
    }
    let last_ready = ready
        .iter()
        .enumerate()
        .map(|(i, r)| r.ok_or_else(|| anyhow!("worker {i} never said it was ready")))
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .max()
        .unwrap_or(started);
    let total = results
        .iter()
        .enumerate()
        .map(|(i, r)| r.ok_or_else(|| anyhow!("worker {i} did not report its results")))
        .sum::<anyhow::Result<u64>>()?;
    let startup = last_ready.saturating_duration_since(started);
    Ok(ClusterRun {
        run: Run {
            elapsed_s: r.elapsed.saturating_sub(startup).as_secs_f64(),
            results: total,
            checkpoints: r.checkpoints_completed,
        },
        workers,
        slots_per_worker: slots,
        startup_s: startup.as_secs_f64(),
        restarts: r.restarts,
        workers_cpu_s: cpu.into_iter().sum(),
    })
}

/// A worker process: joins, builds keyed-sum from the coordinator's job flags, runs its
/// share, and prints `ready`, `results N` and `cpu S` (see the module's documentation).
pub fn worker(
    coordinator: &str,
    slots: usize,
    join_timeout: Duration,
    setup_from: impl FnOnce(&[String]) -> anyhow::Result<(u64, u64, Setup)>,
) -> anyhow::Result<()> {
    let credentials = weir::cluster::Credentials::from_env()?;
    let joined = weir::cluster::join_with(coordinator, slots, join_timeout, credentials)?;
    let (events, keys, mut setup) =
        setup_from(joined.args()).context("the coordinator's job flags")?;
    setup.cluster = Some(ClusterConfig::worker(joined));
    println!("ready");
    let (job, emitted) = jobs::start_keyed_sum(events, keys, &setup)?;
    job.join()?;
    println!("results {}", emitted.load(Ordering::SeqCst));
    if let Some(s) = weir_bench::nexmark::run::process_cpu_seconds() {
        println!("cpu {s}");
    }
    Ok(())
}
