//! Shared helpers for weir's end-to-end tests (`tests/end_to_end`).
//!
//! Owns the test-only sources and sinks that make runs deterministic and observable:
//! [`event_time`] (a source that drives watermarks record by record), [`BySubtask`] (a sink
//! that remembers which subtask saw each record), [`Stamped`] (a sink that keeps each
//! record's timestamp) and [`join_within`] (waits for a job with a deadline instead of
//! hanging). Everything here uses only the public API (`weir::prelude`).

pub mod browser;
pub mod harness;
pub mod s3;

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir::prelude::*;

/// How long any test job may run before the test fails instead of hanging.
pub const JOB_DEADLINE: Duration = Duration::from_secs(10);

/// Waits for a started job, failing the test if it has not ended within `limit`.
///
/// # Panics
/// When the job is still running after `limit`.
pub fn join_within(handle: JobHandle, limit: Duration) -> weir::Result<JobResult> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(handle.join());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("the job did not end within {limit:?}"))
}

/// Runs the pipeline of `env` with [`JOB_DEADLINE`].
pub fn run(env: &Env) -> weir::Result<JobResult> {
    join_within(env.execute_async("test")?, JOB_DEADLINE)
}

/// Runs the pipeline of `env`, which must fail, and returns its error.
///
/// # Panics
/// When the job succeeds or does not end within [`JOB_DEADLINE`].
pub fn run_failing(env: &Env) -> weir::Error {
    match run(env) {
        Ok(r) => panic!("the job should have failed but succeeded: {r:?}"),
        Err(e) => e,
    }
}

/// Emits one record per poll and reports itself idle in between, so the runtime ticks
/// after every record.
struct Paced<T> {
    items: Arc<Vec<(T, Timestamp)>>,
    next: usize,
    started: bool,
}

impl<T: Data> SourceFunction<T> for Paced<T> {
    fn poll(&mut self, out: &mut SourceOutput<'_, T>) -> weir::Result<SourceStatus> {
        if !self.started {
            // The runtime ticks before the first poll; idle once so that the first record,
            // like every other, is polled at least 1 ms after the previous tick.
            self.started = true;
            return Ok(SourceStatus::Idle(1));
        }
        if let Some((v, ts)) = self.items.get(self.next) {
            out.emit_at(v.clone(), *ts)?;
            self.next += 1;
        }
        Ok(if self.next >= self.items.len() {
            SourceStatus::Finished
        } else {
            SourceStatus::Idle(1)
        })
    }
}

/// A timestamped stream whose watermark advances deterministically after every record:
/// after record `i` the watermark is `max(ts_0..=ts_i) - max_delay - 1` (Flink's bounded
/// out-of-orderness), so lateness can be tested exactly.
///
/// How: the source emits one record per poll, and every poll follows an idle one
/// (`Idle(1)`); the runtime sleeps at least 1 ms after an idle poll, so the wall-clock
/// millisecond always changes between two polls and the source task sends a
/// processing-time tick after each record.
/// The watermark operator (emit interval zero, chained to the source at parallelism 1)
/// emits its watermark on every tick. Records and watermarks then travel in order on each
/// channel, so every downstream subtask sees exactly this interleaving.
pub fn event_time<T: Data + Sync>(
    env: &Env,
    items: Vec<(T, Timestamp)>,
    max_delay: Timestamp,
) -> Stream<T> {
    let items = Arc::new(items);
    env.source("paced", move |_| Paced {
        items: items.clone(),
        next: 0,
        started: false,
    })
    .parallelism(1)
    .with_watermarks(
        WatermarkStrategy::bounded_out_of_orderness(max_delay).with_emit_interval(Duration::ZERO),
    )
    .parallelism(1)
}

/// The records a [`BySubtask`] sink received, with the index of the subtask that got each.
pub struct BySubtask<T> {
    seen: Arc<Mutex<Vec<(usize, T)>>>,
}

impl<T> Clone for BySubtask<T> {
    fn clone(&self) -> Self {
        BySubtask {
            seen: self.seen.clone(),
        }
    }
}

impl<T: Data + Ord> BySubtask<T> {
    /// Adds the sink after `stream` with the given parallelism.
    pub fn attach(stream: &Stream<T>, parallelism: usize) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let target = seen.clone();
        stream
            .sink("by-subtask", move || SubtaskSink {
                target: target.clone(),
                subtask: usize::MAX,
            })
            .parallelism(parallelism);
        BySubtask { seen }
    }

    /// The sorted records each subtask received, by subtask index.
    pub fn per_subtask(&self) -> BTreeMap<usize, Vec<T>> {
        let mut m: BTreeMap<usize, Vec<T>> = BTreeMap::new();
        for (s, v) in self.seen.lock().unwrap().iter() {
            m.entry(*s).or_default().push(v.clone());
        }
        for v in m.values_mut() {
            v.sort();
        }
        m
    }
}

struct SubtaskSink<T> {
    target: Arc<Mutex<Vec<(usize, T)>>>,
    subtask: usize,
}

impl<T: Send + 'static> SinkFunction<T> for SubtaskSink<T> {
    fn open(&mut self, ctx: &SinkContext) -> weir::Result<()> {
        self.subtask = ctx.subtask;
        Ok(())
    }
    fn invoke(&mut self, value: T, _ts: Timestamp) -> weir::Result<()> {
        self.target.lock().unwrap().push((self.subtask, value));
        Ok(())
    }
}

/// The records a [`Stamped`] sink received, each with its event timestamp, in arrival
/// order per sink subtask.
pub struct Stamped<T> {
    seen: Arc<Mutex<Vec<(T, Timestamp)>>>,
}

impl<T: Data> Stamped<T> {
    /// Adds a `for_each` sink after `stream` that keeps records and timestamps.
    pub fn attach(stream: &Stream<T>) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let target = seen.clone();
        stream.for_each(move || {
            let target = target.clone();
            move |v, ts| {
                target.lock().unwrap().push((v, ts));
                Ok(())
            }
        });
        Stamped { seen }
    }

    /// Everything received, in arrival order (meaningful with one sink subtask).
    pub fn values(&self) -> Vec<(T, Timestamp)> {
        self.seen.lock().unwrap().clone()
    }
}

/// Groups `(key, value)` pairs by key, keeping the order of values within each key.
pub fn by_key<K: Ord + Clone, V: Clone>(items: &[(K, V)]) -> BTreeMap<K, Vec<V>> {
    let mut m: BTreeMap<K, Vec<V>> = BTreeMap::new();
    for (k, v) in items {
        m.entry(k.clone()).or_default().push(v.clone());
    }
    m
}

/// Shorthand for a `(String, i64)` record.
pub fn kv(k: &str, v: i64) -> (String, i64) {
    (k.to_string(), v)
}

/// A name no other test of this run uses (a topic, a schema, an operator): the prefix, the
/// process id, the clock and a counter, joined by `_`.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}_{}_{:x}_{}",
        std::process::id(),
        nanos & 0xffff_ffff,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Waits for a child process with a deadline; kills it and fails the test if it hangs.
pub fn wait_within(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    try_wait_within(child, limit)
        .unwrap_or_else(|| panic!("the child process did not exit within {limit:?}"))
}

/// Waits for a child process with a deadline; `None` (after killing it) if it hangs, so
/// the caller can say more about it (its log).
pub fn try_wait_within(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for a child process") {
            return Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for a child process with a deadline while reading its standard output and error
/// as they come, so that a child logging more than a pipe holds is never blocked on it.
/// Returns its exit status (`None`, after killing it, when it hangs) and its standard error.
pub fn wait_reading_output(
    child: &mut std::process::Child,
    limit: Duration,
) -> (Option<std::process::ExitStatus>, String) {
    fn drain<R: std::io::Read + Send + 'static>(
        pipe: Option<R>,
    ) -> Option<std::thread::JoinHandle<String>> {
        pipe.map(|mut pipe| {
            std::thread::spawn(move || {
                let mut text = String::new();
                let _ = pipe.read_to_string(&mut text);
                text
            })
        })
    }
    let err = drain(child.stderr.take());
    let out = drain(child.stdout.take());
    let status = try_wait_within(child, limit);
    // The child has ended (or was killed): its pipes are closed and the readers finish.
    let _ = out.map(|reader| reader.join());
    let log = err
        .and_then(|reader| reader.join().ok())
        .unwrap_or_default();
    (status, log)
}

/// A small deterministic random number generator (xorshift64*), so every run of a test
/// sees the same input and kill schedule for a given seed.
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// The next number.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Stderr of a finished child (spawned with `Stdio::piped()`), for failure messages.
pub fn stderr_of(child: &mut std::process::Child) -> String {
    use std::io::Read;
    let mut s = String::new();
    if let Some(e) = child.stderr.as_mut() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

/// Polls `cond` every 10 ms until it holds, failing the test after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The address of a service the tests need: the environment variable `var` if it is set,
/// otherwise `scripts/SCRIPT start` run with `env`, whose last line of output is the
/// address. A service started here is stopped (`scripts/SCRIPT stop`, same `env`) by a
/// small watcher process once this test process and every other test process that asked
/// for the same service meanwhile have exited: `cargo test` leaves nothing running behind
/// it, and a run that starts while an earlier one ends keeps its service.
///
/// # Panics
/// When the script fails; the message holds its standard error.
pub fn service_address(var: &str, script: &str, env: &[(&str, std::ffi::OsString)]) -> String {
    if let Ok(v) = std::env::var(var)
        && !v.trim().is_empty()
    {
        return v.trim().to_string();
    }
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(script);
    let users = ServiceUsers::new(script, env);
    // Started and registered under the lock a leaving test process's watcher takes to stop
    // the service: a run that starts right after another ends never gets a service being
    // stopped or deleted under it.
    // `flock -o`: the server the script starts must not inherit (and so hold) the lock.
    let out = std::process::Command::new("flock")
        .arg("-o")
        .arg(&users.lock)
        .args([
            "bash",
            "-c",
            "bash \"$0\" start && mkdir -p \"$1\" && touch \"$1/$2\"",
        ])
        .arg(&path)
        .arg(&users.dir)
        .arg(std::process::id().to_string())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap_or_else(|e| panic!("run scripts/{script} (through flock): {e}"));
    assert!(
        out.status.success(),
        "scripts/{script} start failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stop_when_this_process_exits(&path, env, &users);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_else(|| panic!("scripts/{script} start printed no address"))
        .trim()
        .to_string()
}

/// Where the test processes using one service instance (a script and its environment)
/// register, and the lock that orders their starts and stops.
struct ServiceUsers {
    lock: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl ServiceUsers {
    fn new(script: &str, env: &[(&str, std::ffi::OsString)]) -> ServiceUsers {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        env.hash(&mut h);
        let base = std::env::temp_dir().join("weir-test-services");
        std::fs::create_dir_all(&base).expect("create the test services' directory");
        let name = format!("{}-{:016x}", script.trim_end_matches(".sh"), h.finish());
        ServiceUsers {
            lock: base.join(format!("{name}.lock")),
            dir: base.join(format!("{name}.users")),
        }
    }
}

/// Starts a watcher, in its own process group so that it outlives this process, that runs
/// `script stop` once this process has exited. A test binary has no hook that runs after
/// its last test, so the watcher polls whether this process is still alive.
fn stop_when_this_process_exits(
    script: &std::path::Path,
    env: &[(&str, std::ffi::OsString)],
    users: &ServiceUsers,
) {
    use std::os::unix::process::CommandExt;
    // Once this process is gone: unregister it, and stop the service unless another live
    // test process registered as its user meanwhile (two test binaries, or two runs,
    // sharing one service).
    let release = "rm -f \"$1/$2\"; for f in \"$1\"/*; do [ -e \"$f\" ] || continue; \
                   if kill -0 \"${f##*/}\" 2>/dev/null; then exit 0; fi; rm -f \"$f\"; done; \
                   exec bash \"$0\" stop";
    let watch = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
         exec flock -o \"$3\" bash -c '{release}' \"$0\" \"$1\" {pid}",
        pid = std::process::id()
    );
    let started = std::process::Command::new("bash")
        .arg("-c")
        .arg(watch)
        .arg(script)
        .arg(&users.dir)
        .arg(std::process::id().to_string())
        .arg(&users.lock)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn();
    if let Err(e) = started {
        eprintln!(
            "warning: cannot watch the test process to stop {} afterwards: {e}",
            script.display()
        );
    }
}

/// What an operator does to a running job from a shell, through its checkpoint directory:
/// the helpers of the lifecycle tests (`tests/chaos/lifecycle.rs`, `tests/kafka/lifecycle.rs`).
pub mod operator {
    use std::path::Path;

    /// Asks the job checkpointing into `dir` for a savepoint (`"savepoint"`) or a savepoint
    /// and a stop (`"stop"`): the request file, written whole and renamed into place, as
    /// `weir savepoint trigger|stop DIR` does.
    pub fn request_savepoint(dir: &Path, what: &str) {
        let tmp = dir.join(".request.tmp");
        std::fs::write(&tmp, what).expect("write the savepoint request");
        std::fs::rename(&tmp, dir.join(weir::SAVEPOINT_REQUEST_FILE))
            .expect("place the savepoint request");
    }

    /// Withdraws a request the job never took (as `weir savepoint` does on timeout).
    pub fn withdraw_request(dir: &Path) {
        let _ = std::fs::remove_file(dir.join(weir::SAVEPOINT_REQUEST_FILE));
    }

    /// The newest complete `chk-` or `sp-` id (`prefix`) in `dir`; 0 when there is none.
    pub fn newest_complete(dir: &Path, prefix: &str) -> u64 {
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().join("_metadata").exists())
                    .filter_map(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        name.strip_prefix(prefix)?.split('-').next()?.parse().ok()
                    })
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0)
    }

    /// Copies a savepoint (a directory tree) to `to`, as `cp -r` would.
    pub fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).expect("create the copy");
        for e in std::fs::read_dir(from)
            .expect("read the savepoint")
            .flatten()
        {
            let target = to.join(e.file_name());
            if e.path().is_dir() {
                copy_dir(&e.path(), &target);
            } else {
                std::fs::copy(e.path(), &target).expect("copy a savepoint file");
            }
        }
    }

    /// The path printed by a job that stopped with a savepoint (`stopped with savepoint P`).
    pub fn stopped_with(log: &str) -> Option<std::path::PathBuf> {
        log.lines()
            .find_map(|l| l.strip_prefix("stopped with savepoint "))
            .map(|p| std::path::PathBuf::from(p.trim()))
    }
}

/// A client of a job's REST API (`Env::web_address`), over plain HTTP/1.1 on loopback: one
/// request per connection, as the server answers.
pub mod rest {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    /// Sends `method path` with `body` (JSON when not empty); returns the status code and
    /// the response body.
    ///
    /// # Panics
    /// When the server cannot be reached or answers something that is not HTTP.
    pub fn call(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut c = TcpStream::connect(addr).expect("connect to the REST API");
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            c,
            "{method} {path} HTTP/1.1\r\nHost: weir\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        c.read_to_string(&mut response).expect("read the response");
        let (head, body) = response
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("not an HTTP response: {response}"));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status in {head}"));
        (status, body.to_string())
    }

    /// `GET path`, which must answer 200 with JSON.
    pub fn get(addr: SocketAddr, path: &str) -> serde_json::Value {
        let (status, body) = call(addr, "GET", path, "");
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }

    /// `POST path` with `body`: the status and the JSON answer.
    pub fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, serde_json::Value) {
        let (status, text) = call(addr, "POST", path, body);
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("POST {path}: {e}: {text}"));
        (status, v)
    }

    /// The operator named `name` in a `/v1/operators` answer.
    ///
    /// # Panics
    /// When there is none.
    pub fn operator<'a>(ops: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
        ops["operators"]
            .as_array()
            .expect("operators")
            .iter()
            .find(|o| o["name"] == name)
            .unwrap_or_else(|| panic!("no operator '{name}' in {ops:#}"))
    }
}

/// Certificates for the TLS tests: a CA of the test's own, and certificates it signs,
/// written as a TLS directory (`tls.crt`, `tls.key`, `ca.crt`) as a Kubernetes secret
/// mounts them.
pub mod certs {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, date_time_ymd};
    use std::path::{Path, PathBuf};

    /// A certificate authority.
    pub struct Ca {
        issuer: Issuer<'static, KeyPair>,
        pem: String,
    }

    impl Ca {
        /// A new self-signed CA.
        pub fn new(name: &str) -> Ca {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            let key = KeyPair::generate().unwrap();
            let pem = params.self_signed(&key).unwrap().pem();
            Ca {
                issuer: Issuer::new(params, key),
                pem,
            }
        }

        /// Writes a certificate for `localhost` / `127.0.0.1` signed by this CA, its key
        /// and the CA into `dir/name/`; returns that directory. `expired` makes one whose
        /// validity ended in 2020.
        pub fn issue(&self, dir: &Path, name: &str, expired: bool) -> PathBuf {
            let mut params =
                CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                    .unwrap();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            if expired {
                params.not_before = date_time_ymd(2019, 1, 1);
                params.not_after = date_time_ymd(2020, 1, 1);
            }
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &self.issuer).unwrap();
            let out = dir.join(name);
            std::fs::create_dir_all(&out).unwrap();
            std::fs::write(out.join("tls.crt"), cert.pem()).unwrap();
            std::fs::write(out.join("tls.key"), key.serialize_pem()).unwrap();
            std::fs::write(out.join("ca.crt"), &self.pem).unwrap();
            out
        }

        /// The CA's certificate, PEM.
        pub fn pem(&self) -> &str {
            &self.pem
        }
    }
}

/// The snippets of the section "Writing tables out: upserts" of docs/getting-started.md
/// (copied by build.rs), compiled as doc tests here, where weir-postgres and weir-kafka are
/// dependencies.
#[cfg(doctest)]
#[doc = include_str!(concat!(env!("OUT_DIR"), "/upserts.md"))]
pub struct UpsertsGuide;
