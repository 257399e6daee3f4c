//! Cluster mode with real processes on loopback: a coordinator and workers running
//! `file_sum`, a worker SIGKILLed and replaced, the coordinator SIGKILLed and restarted,
//! and a worker frozen (SIGSTOP) until the cluster gives up on it, then thawed — a zombie
//! of an older attempt. Each time the committed output must hold every key's prefix sums
//! exactly once, as a single process's would.

use crate::harness::{Scenario, latest_checkpoint, wait_for, wait_within};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A free port on loopback (bound, then released for the coordinator to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// One cluster run of a scenario: the processes and their logs.
pub(super) struct Cluster<'a> {
    s: &'a Scenario,
    pub(super) address: String,
    /// The coordinator's REST API address (`--web`), which `weir cluster` talks to.
    pub(super) web: String,
    /// The secret file every process is started with (`--secret-file`), if any.
    pub(super) secret: Option<PathBuf>,
    /// The TLS directory every process is started with (`--tls-dir`), if any.
    pub(super) tls: Option<PathBuf>,
    /// Environment variables every process is started with (object storage settings).
    pub(super) env: Vec<(String, String)>,
    /// The workers the coordinator waits for (`--workers`).
    pub(super) workers: usize,
    /// The source's records per second (`--max-rate`).
    pub(super) max_rate: u64,
    logs: PathBuf,
    started: usize,
    /// A worker was started: the coordinator's address is known and must stay.
    workers_started: bool,
}

impl<'a> Cluster<'a> {
    pub(super) fn new(s: &'a Scenario) -> Self {
        // In the scenario's own temporary directory (output may be an object-storage URL).
        let logs = s._dir.path().join("logs");
        std::fs::create_dir_all(&logs).expect("log dir");
        Cluster {
            s,
            address: format!("127.0.0.1:{}", free_port()),
            web: format!("127.0.0.1:{}", free_port()),
            secret: None,
            tls: None,
            env: Vec::new(),
            workers: 3,
            max_rate: 6_000,
            logs,
            started: 0,
            workers_started: false,
        }
    }

    fn log_file(&mut self, what: &str) -> (PathBuf, std::fs::File) {
        self.started += 1;
        let path = self.logs.join(format!("{}-{what}.log", self.started));
        let f = std::fs::File::create(&path).expect("log file");
        (path, f)
    }

    /// Starts the coordinator: 3 workers (unless [`Cluster::workers`] says otherwise),
    /// parallelism 4, heartbeat timeout 2 s.
    pub(super) fn coordinator(&mut self) -> (Child, PathBuf) {
        self.coordinator_with(&[])
    }

    /// The coordinator with extra job flags; its stdout and stderr go to the log.
    fn coordinator_with(&mut self, extra: &[&str]) -> (Child, PathBuf) {
        self.coordinator_env(extra, &[])
    }

    /// The coordinator with extra job flags and environment variables. Until a worker was
    /// started, a coordinator that could not bind its ports (another test's process took
    /// one after [`free_port`] released it) is started again on new ones.
    pub(super) fn coordinator_env(
        &mut self,
        extra: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> (Child, PathBuf) {
        for _ in 0..5 {
            let (mut child, path) = self.spawn_coordinator(extra, env);
            if self.workers_started || !lost_its_ports(&mut child, &path) {
                return (child, path);
            }
            self.address = format!("127.0.0.1:{}", free_port());
            self.web = format!("127.0.0.1:{}", free_port());
        }
        panic!("the coordinator found its ports taken five times in a row");
    }

    fn spawn_coordinator(
        &mut self,
        extra: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> (Child, PathBuf) {
        let (path, log) = self.log_file("coordinator");
        let mut c = self.s.command(4, Some(self.max_rate), 100);
        c.args(extra);
        if let Some(secret) = &self.secret {
            c.arg("--secret-file").arg(secret);
        }
        if let Some(tls) = &self.tls {
            c.arg("--tls-dir").arg(tls);
        }
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        c.envs(env.iter().copied());
        c.arg("--cluster")
            .arg("coordinator")
            .arg("--listen")
            .arg(&self.address)
            .arg("--workers")
            .arg(self.workers.to_string())
            .arg("--heartbeat-timeout-ms")
            .arg("2000")
            .arg("--web")
            .arg(&self.web)
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log);
        (c.spawn().expect("start the coordinator"), path)
    }

    pub(super) fn worker(&mut self, slots: usize) -> (Child, PathBuf) {
        self.worker_with(slots, None)
    }

    /// A worker, with a fail point turned on when `failpoints` names one.
    pub(super) fn worker_with(
        &mut self,
        slots: usize,
        failpoints: Option<&str>,
    ) -> (Child, PathBuf) {
        self.workers_started = true;
        let (path, log) = self.log_file("worker");
        let mut c = Command::new(env!("CARGO_BIN_EXE_file_sum"));
        if let Some(secret) = &self.secret {
            c.arg("--secret-file").arg(secret);
        }
        if let Some(tls) = &self.tls {
            c.arg("--tls-dir").arg(tls);
        }
        c.arg("--cluster")
            .arg("worker")
            .arg("--coordinator")
            .arg(&self.address)
            .arg("--slots")
            .arg(slots.to_string())
            .env_remove("WEIR_FAILPOINTS")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(f) = failpoints {
            c.env("WEIR_FAILPOINTS", f);
        }
        (c.spawn().expect("start a worker"), path)
    }
}

/// The cluster's processes and their logs; any still running when the test ends (it
/// failed) are killed.
pub(super) struct Processes(pub(super) Vec<(Child, PathBuf)>);

impl Drop for Processes {
    fn drop(&mut self) {
        for (c, _) in &mut self.0 {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Waits until a coordinator listens or exits; true when it exited because a port it was
/// given is in use.
fn lost_its_ports(child: &mut Child, log: &Path) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if read(log).contains("coordinator listening on") {
            return false;
        }
        if child.try_wait().expect("poll the coordinator").is_some() {
            return read(log).contains("Address already in use");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Waits until the scenario's checkpoint directory holds a complete checkpoint newer
/// than `after`.
pub(super) fn wait_checkpoint_after(s: &Scenario, after: u64) {
    wait_for(
        &format!("a checkpoint after {after}"),
        Duration::from_secs(60),
        || latest_checkpoint(&s.checkpoints).is_some_and(|c| c > after),
    );
}

/// Runs `weir cluster ARGS --web ADDRESS` and returns its stdout; it must succeed.
pub(super) fn weir_cluster(web: &str, args: &[&str]) -> String {
    let out = weir_cluster_output(web, args);
    assert!(
        out.status.success(),
        "weir cluster {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Runs `weir cluster ARGS --web ADDRESS`, whatever its outcome.
pub(super) fn weir_cluster_output(web: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_weir-cli"))
        .arg("cluster")
        .args(args)
        .args(["--web", web])
        .env_remove("WEIR_SECRET_FILE")
        .output()
        .expect("run weir")
}

pub(super) fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn count(path: &Path, needle: &str) -> usize {
    read(path).matches(needle).count()
}

/// Waits for a line in a log.
pub(super) fn wait_log(path: &Path, needle: &str, times: usize) {
    let limit = Duration::from_secs(60);
    let deadline = std::time::Instant::now() + limit;
    while count(path, needle) < times {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {needle:?} (×{times}) in {}:\n{}",
            path.display(),
            read(path)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{sig} failed");
}

/// Waits for a process to exit 0; on failure shows its log.
pub(super) fn expect_success(child: &mut Child, log: &Path, what: &str) {
    let limit = Duration::from_secs(120);
    let Some(status) = weir_tests::try_wait_within(child, limit) else {
        panic!(
            "{what} did not exit within {limit:?}:
{}",
            read(log)
        );
    };
    assert!(status.success(), "{what} failed: {status}\n{}", read(log));
}

/// After a stop with a savepoint: waits for the coordinator and the workers to exit 0 and
/// returns the savepoint's path, as the coordinator logged it.
pub(super) fn stopped_with_savepoint(
    coord: &mut Child,
    coord_log: &Path,
    workers: Vec<(Child, PathBuf)>,
) -> String {
    expect_success(
        coord,
        coord_log,
        "the coordinator stopping with a savepoint",
    );
    for (mut w, log) in workers {
        expect_success(&mut w, &log, "a worker");
    }
    let log = read(coord_log);
    log.lines()
        .find_map(|l| l.strip_prefix("stopped with savepoint "))
        .unwrap_or_else(|| panic!("no savepoint path in the log:\n{log}"))
        .to_string()
}

/// Starts workers one after the other (so their ids follow), with 2, 1 and 1 slots: four
/// slots for parallelism 4, none to spare.
pub(super) fn start_workers(cl: &mut Cluster<'_>, coord_log: &Path) -> Vec<(Child, PathBuf)> {
    let mut workers = Vec::new();
    for (i, slots) in [2, 1, 1].into_iter().enumerate() {
        workers.push(cl.worker(slots));
        wait_log(coord_log, &format!("worker {} joined", i + 1), 1);
    }
    workers
}

#[test]
fn a_worker_killed_mid_run_is_replaced_and_the_output_is_exact() {
    let s = Scenario::new(40_000, 40, 51);
    let mut cl = Cluster::new(&s);
    let (mut coord, coord_log) = cl.coordinator();
    let mut workers = start_workers(&mut cl, &coord_log);
    wait_checkpoint_after(&s, 2);
    // What an operator sees: three workers, their slots and tasks (worker 1 runs the
    // source and subtasks 0 and 3 of the keyed sum, workers 2 and 3 one subtask each).
    let status: serde_json::Value =
        serde_json::from_str(&weir_cluster(&cl.web, &["status", "--json"])).expect("JSON");
    assert_eq!(status["job"]["name"], "file_sum");
    assert_eq!(status["job"]["state"], "RUNNING");
    assert_eq!(status["job"]["cluster"]["phase"], "running");
    let workers_seen: Vec<(u64, u64, u64)> = status["job"]["cluster"]["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .map(|w| {
            let n = |f: &str| w[f].as_u64().expect("a number");
            (n("id"), n("slots"), n("tasks"))
        })
        .collect();
    assert_eq!(workers_seen, vec![(1, 2, 3), (2, 1, 1), (3, 1, 1)]);
    assert!(
        status["checkpoints"]["latest_completed"]["id"]
            .as_u64()
            .is_some_and(|c| c >= 3)
    );
    let text = weir_cluster(&cl.web, &["status"]);
    assert!(text.contains("workers:         3 (4 slots)"), "{text}");
    // Worker 3 runs subtask 2 of the keyed sum and its sink.
    let (mut victim, _) = workers.remove(2);
    victim.kill().expect("SIGKILL a worker");
    victim.wait().expect("reap the worker");
    wait_log(&coord_log, "worker 3 (", 1);
    // Three slots are left for four subtasks: the job waits for a replacement.
    wait_log(&coord_log, "waiting for 1 worker(s) and 4 slot(s)", 1);
    let (mut replacement, replacement_log) = cl.worker(1);
    expect_success(&mut coord, &coord_log, "the coordinator");
    for (mut w, log) in workers {
        expect_success(&mut w, &log, "a worker");
    }
    expect_success(&mut replacement, &replacement_log, "the replacement worker");
    let log = read(&coord_log);
    // A killed worker's socket closes (EOF) or, when data to it was still unread in its
    // receive buffer, is reset by the kernel: either way the coordinator names the loss.
    assert!(
        log.contains("lost: connection closed")
            || log.contains("lost: connection failed: Connection reset by peer"),
        "{log}"
    );
    assert!(log.contains("resuming from checkpoint"), "{log}");
    assert!(log.contains("worker 4 joined"), "{log}");
    s.check();
}

#[test]
fn a_coordinator_killed_mid_run_is_restarted_and_the_workers_rejoin() {
    let s = Scenario::new(40_000, 40, 52);
    let mut cl = Cluster::new(&s);
    let (mut coord, coord_log) = cl.coordinator();
    let workers = start_workers(&mut cl, &coord_log);
    wait_checkpoint_after(&s, 2);
    coord.kill().expect("SIGKILL the coordinator");
    coord.wait().expect("reap the coordinator");
    for (_, log) in &workers {
        wait_log(log, "reconnecting", 1);
    }
    let (mut coord, coord_log) = cl.coordinator();
    expect_success(&mut coord, &coord_log, "the restarted coordinator");
    for (mut w, log) in workers {
        expect_success(&mut w, &log, "a worker");
    }
    let log = read(&coord_log);
    assert!(log.contains("resuming from checkpoint"), "{log}");
    s.check();
}

#[test]
fn a_worker_cut_off_and_back_cannot_commit_output_of_its_old_attempt() {
    let s = Scenario::new(40_000, 40, 53);
    let mut cl = Cluster::new(&s);
    let (mut coord, coord_log) = cl.coordinator();
    let mut workers = Vec::new();
    for (i, slots) in [2, 1].into_iter().enumerate() {
        workers.push(cl.worker(slots));
        wait_log(&coord_log, &format!("worker {} joined", i + 1), 1);
    }
    // Worker 3 freezes itself right after its sink pre-committed a checkpoint, with
    // records after that barrier still in its channels: to the cluster it goes silent.
    let (mut zombie, zombie_log) = cl.worker_with(1, Some("sink.after_precommit=stop"));
    wait_log(&zombie_log, "fail point 'sink.after_precommit': stop", 1);
    wait_log(&coord_log, "lost: no heartbeat", 1);
    let (mut replacement, replacement_log) = cl.worker(1);
    wait_log(&coord_log, "deployed", 2);
    let after = latest_checkpoint(&s.checkpoints).unwrap_or(0);
    wait_checkpoint_after(&s, after);
    // Thaw it while the new attempt runs, its subtask now running elsewhere: it finishes
    // its snapshot, writes what is left in its channels, and must stop on its own.
    signal(&zombie, "CONT");
    wait_log(&zombie_log, "no answer from the coordinator", 1);
    expect_success(&mut coord, &coord_log, "the coordinator");
    for (mut w, log) in workers {
        expect_success(&mut w, &log, "a worker");
    }
    expect_success(&mut replacement, &replacement_log, "the replacement worker");
    expect_success(&mut zombie, &zombie_log, "the thawed worker");
    // The zombie may leave uncommitted files; the committed output is exact.
    s.check_committed();
}

#[test]
fn savepoint_stop_and_cancel_go_through_the_coordinator() {
    let s = Scenario::new(40_000, 40, 54);
    let mut cl = Cluster::new(&s);
    // The coordinator's actions need its secret; the views do not.
    let secrets = s.output.with_file_name("secrets");
    std::fs::create_dir_all(&secrets).expect("secrets dir");
    let secret = secrets.join("secret");
    std::fs::write(&secret, "cluster-secret-0123456789abcdef\n").expect("write the secret");
    let wrong = secrets.join("wrong");
    std::fs::write(&wrong, "not-the-secret-0123456789abcdef\n").expect("write a wrong one");
    let secret_arg = secret.to_str().expect("utf-8 path");
    let wrong_arg = wrong.to_str().expect("utf-8 path");
    // Every process holds the secret: workers prove it to the coordinator and to each
    // other; a worker without it is refused.
    cl.secret = Some(secret.clone());

    // Stop with a savepoint through the coordinator's REST API, then resume from it.
    let (mut coord, coord_log) = cl.coordinator();
    let workers = start_workers(&mut cl, &coord_log);
    wait_checkpoint_after(&s, 1);
    let refused = weir_cluster_output(&cl.web, &["savepoint", "--stop"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert!(err.contains("answered 401"), "{err}");
    assert!(err.contains("--secret-file PATH"), "{err}");
    let refused = weir_cluster_output(&cl.web, &["cancel", "--secret-file", wrong_arg]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert!(err.contains("is not this job's secret"), "{err}");
    let text = weir_cluster(&cl.web, &["status"]);
    assert!(text.contains("state:           RUNNING"), "{text}");
    // A worker started without the secret is refused and exits, naming what to give.
    let intruder = Command::new(env!("CARGO_BIN_EXE_file_sum"))
        .args(["--cluster", "worker", "--coordinator", &cl.address])
        .args(["--join-timeout-ms", "5000"])
        .env_remove("WEIR_SECRET_FILE")
        .output()
        .expect("run a worker without the secret");
    let err = String::from_utf8_lossy(&intruder.stderr);
    assert!(!intruder.status.success(), "{err}");
    assert!(
        err.contains("this cluster requires authentication"),
        "{err}"
    );
    assert!(read(&coord_log).contains("refused a connection from"));
    let said = weir_cluster(
        &cl.web,
        &["savepoint", "--stop", "--secret-file", secret_arg],
    );
    let savepoint = stopped_with_savepoint(&mut coord, &coord_log, workers);
    assert_eq!(
        said.trim(),
        savepoint,
        "weir cluster savepoint prints its path"
    );

    // Resume from the savepoint, then cancel over RPC: everyone stops, non-zero.
    let (mut coord, coord_log) =
        cl.coordinator_with(&["--from-savepoint", &savepoint, "--secret-file", secret_arg]);
    let workers = start_workers(&mut cl, &coord_log);
    wait_log(&coord_log, "resuming from savepoint", 1);
    let done = latest_checkpoint(&s.checkpoints).unwrap_or(0);
    wait_checkpoint_after(&s, done);
    let said = weir_cluster(&cl.web, &["cancel", "--secret-file", secret_arg]);
    assert_eq!(said, format!("cancelling the job at {}\n", cl.web));
    let status = wait_within(&mut coord, Duration::from_secs(60));
    assert!(!status.success(), "a cancelled job exits non-zero");
    assert!(
        read(&coord_log).contains("job cancelled"),
        "{}",
        read(&coord_log)
    );
    for (mut w, log) in workers {
        let status = wait_within(&mut w, Duration::from_secs(60));
        assert!(
            !status.success(),
            "a worker of a cancelled job exits non-zero"
        );
        assert!(read(&log).contains("job cancelled"), "{}", read(&log));
    }

    // Started again, the job resumes from its latest checkpoint and finishes exactly.
    let (mut coord, coord_log) = cl.coordinator();
    let workers = start_workers(&mut cl, &coord_log);
    expect_success(&mut coord, &coord_log, "the coordinator");
    for (mut w, log) in workers {
        expect_success(&mut w, &log, "a worker");
    }
    s.check();
}
