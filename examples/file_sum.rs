//! file_sum: running sums per key from a text file into an exactly-once file sink, with
//! checkpoints and automatic resume.
//!
//! ```text
//! cargo run --release --example file_sum -- --input IN --output OUTDIR --checkpoint-dir CKDIR \
//!     [--checkpoint-interval-ms MS] [--parallelism P] [--max-rate RECORDS_PER_S] [--lease-ms MS] \
//!     [--web HOST:PORT] [--secret-file PATH] [--tls-dir DIR] [--measure-bytes]
//!     [--latency-tracking-ms MS] [--checkpoint-mode MODE] [--sink-rate RECORDS_PER_S]
//!     [--checkpoint-timeout-ms MS] [--cancellation-timeout-ms MS]
//! ```
//!
//! - IN holds lines `key,value` (key: text without commas, value: an i64).
//! - For every input line the job emits `key,sum` — the key's running sum after that line —
//!   into the exactly-once file sink in OUTDIR. Committed files are `part-<subtask>-<checkpoint>`;
//!   files starting with a dot are not committed yet and must be ignored by readers.
//! - OUTDIR may be an object-storage URL (`s3://bucket/prefix`; also `gs://`, `az://`):
//!   committed objects `part-<subtask>-<counter>` then appear whole when their checkpoint
//!   completes, and nothing else is needed than the standard environment (`AWS_ENDPOINT_URL`,
//!   `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ALLOW_HTTP=true`), never
//!   logged (docs/checkpoints.md, "Output to object storage").
//! - Checkpoints go to CKDIR every MS milliseconds (default 1000). Started again with the same
//!   CKDIR, the job resumes from the latest complete checkpoint; kill it at any moment
//!   (even with `kill -9`) and the committed output still holds every running sum exactly once.
//! - `--parallelism` sets the parallelism of the keyed sum and the sink (the file is read by
//!   one reader so each key's lines stay in file order); it may change between runs.
//! - `--max-rate` throttles the reader, so a kill can land mid-run.
//! - `--checkpoint-mode aligned|unaligned|aligned-timeout|aligned-timeout:MS` sets how
//!   checkpoint barriers pass the records queued in the job's channels (docs/checkpoints.md):
//!   `aligned` (the default) waits until every record ahead of a barrier is processed;
//!   `unaligned` lets barriers overtake them and stores those records with the checkpoint
//!   (they are processed again on restore, so the output stays exactly-once);
//!   `aligned-timeout:MS` aligns and goes unaligned once a checkpoint's alignment has taken
//!   MS milliseconds (`aligned-timeout` alone: 200 ms).
//! - `--sink-rate RECORDS_PER_S` lets each sink subtask write at most that many records per
//!   second (a throttle right before the sink): a slow sink, as a database that takes
//!   1–3k rows/s. Records back up into the keyed exchange and the reader slows down to the
//!   sink's pace (backpressure), which is what unaligned checkpoints are for. At least 1.
//! - `--rebalance-before-sink` spreads the sums over the sink subtasks round-robin (a
//!   second exchange, before the throttle of `--sink-rate`) instead of writing each key
//!   where it was summed: every sink subtask then reads from every sum subtask, and its
//!   checkpoint barriers align over several channels. A key's sums may then land in
//!   several part files.
//! - `--state rocksdb|memory` picks the keyed state backend. The default is rocksdb (files
//!   checkpointed incrementally) when the example is built with `--features rocksdb`, and
//!   memory otherwise (the quickstart's crate builds without RocksDB by default).
//! - `--state-cache-entries N` (rocksdb only) sets how many entries the RocksDB backend's
//!   write-back cache keeps per state and subtask (default 1,048,576); a small cache makes
//!   the job write back and evict between checkpoints, as a state larger than memory does.
//! - `--from-savepoint PATH` starts from a savepoint (or a specific checkpoint) instead of
//!   the latest checkpoint in CKDIR. Take a savepoint of a running job with
//!   `weir savepoint trigger CKDIR`, or stop it with one with `weir savepoint stop CKDIR`
//!   (the job then exits 0 and prints the savepoint's path).
//! - If CKDIR holds checkpoints but none of them can be restored (all corrupt), the job
//!   fails naming each one; `--start-fresh-if-unusable` starts from scratch instead.
//! - One run at a time owns CKDIR and OUTDIR. A second run pointed at either while the first
//!   lives is refused with the owner's pid, host and job; after a `kill -9` the next run on
//!   the machine takes over at once, and a frozen run (or one on a dead host of a shared
//!   volume) is taken over once it has not renewed its lease for `--lease-ms` (default
//!   15000). A frozen run that thaws after that stops without writing anything.
//! - `--web HOST:PORT` serves the job's REST API (`/v1/job`, `/v1/operators`,
//!   `/v1/checkpoints`, `/v1/exceptions`, `POST /v1/savepoints`, `POST /v1/job/cancel`) and
//!   its metrics (`/metrics`) while it runs; port 0 picks a free port, printed at the start
//!   (docs/operations.md). `--secret-file PATH` (or the environment variable
//!   `WEIR_SECRET_FILE`) makes its actions require the secret in that file.
//! - `--latency-tracking-ms MS` turns on latency tracking: the reader sends a latency marker
//!   every MS milliseconds and the sink observes its age into the histogram
//!   `weir_end_to_end_latency_seconds` on `/metrics` (docs/operations.md). MS must be at
//!   least 1.
//! - `--checkpoint-timeout-ms MS` (default 600000) aborts a checkpoint not complete after
//!   MS milliseconds, and restarts the job from its latest completed checkpoint: a timeout
//!   means a task, its state or the checkpoint storage stopped answering.
//!   `--cancellation-timeout-ms MS` (default 180000) is how long the job then waits for each
//!   task to stop before it leaves a stuck one behind (docs/checkpoints.md, "Checkpoints that time out").
//! - Exits 0 once the input is consumed and the final checkpoint has committed everything;
//!   a malformed line fails the job with the line's content and number.
//!
//! The same job runs as a cluster (docs/cluster.md):
//!
//! ```text
//! file_sum --cluster coordinator --listen HOST:PORT --workers N [--heartbeat-timeout-ms MS] <job flags as above>
//! file_sum --cluster worker --coordinator HOST:PORT [--slots S] [--join-timeout-ms MS] [--secret-file PATH] [--tls-dir DIR]
//! ```
//!
//! - The coordinator waits for N workers, runs the job on their slots (a slot runs one
//!   subtask of every operator, so parallelism P needs P slots), and exits 0 when the job
//!   has finished and committed. Its job flags are handed to every worker, which builds
//!   the same pipeline from them; input, output and checkpoint directories must be visible
//!   to every process (one machine, or a shared file system).
//! - A worker joins (waiting up to `--join-timeout-ms`, default 60000, for the coordinator
//!   to be up), runs the subtasks it is given, and exits 0 when the coordinator says the
//!   job is done. `--slots` defaults to 2.
//! - `--secret-file PATH` (or `WEIR_SECRET_FILE`) on every process: the coordinator and
//!   the workers prove to each other that they hold the same secret on every connection
//!   (a process without it, or with another, is refused and counted), and the REST API's
//!   actions need it. `--tls-dir DIR` (or `WEIR_TLS_DIR`; `tls.crt`, `tls.key`, `ca.crt`)
//!   on every process encrypts the cluster's connections, each side checking the other's
//!   certificate against the CA, and serves the REST API over https.
//! - A worker that stops answering for `--heartbeat-timeout-ms` (default 5000) is declared
//!   lost: the job restarts on the remaining workers from its last complete checkpoint, or
//!   waits for a new worker when slots are short. The output is the same as one process's.

use anyhow::{Context, bail};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use weir::cluster::{ClusterConfig, Credentials, join_with};
use weir::prelude::*;

/// How this process takes part.
enum Role {
    Alone,
    Coordinator {
        listen: String,
        workers: usize,
        heartbeat_timeout_ms: u64,
    },
    Worker {
        coordinator: String,
        slots: usize,
        join_timeout_ms: u64,
    },
}

struct Args {
    role: Role,
    /// The job flags as given, handed to the workers by a coordinator.
    job_args: Vec<String>,
    input: PathBuf,
    output: PathBuf,
    checkpoint_dir: PathBuf,
    interval_ms: u64,
    parallelism: usize,
    max_rate: Option<u64>,
    from_savepoint: Option<PathBuf>,
    start_fresh_if_unusable: bool,
    state: BackendKind,
    lease_ms: Option<u64>,
    /// `--checkpoint-timeout-ms` and `--cancellation-timeout-ms`.
    checkpoint_timeout_ms: Option<u64>,
    cancellation_timeout_ms: Option<u64>,
    /// Where to serve the REST API (this process only: never handed to workers).
    web: Option<String>,
    /// The secret the REST API's actions need (`--secret-file`, or `WEIR_SECRET_FILE`).
    secret: Option<weir::Secret>,
    /// TLS settings (`--tls-dir`, or `WEIR_TLS_DIR`).
    tls: Option<weir::Tls>,
    /// Measure the bytes records take on channels (`--measure-bytes`, with `--web`).
    measure_bytes: bool,
    latency_tracking_ms: Option<u64>,
    /// How barriers pass records in flight (`--checkpoint-mode`).
    mode: CheckpointMode,
    /// Records per second each sink subtask writes at most (`--sink-rate`).
    sink_rate: Option<u64>,
    /// A round-robin exchange between the sums and the sink (`--rebalance-before-sink`).
    rebalance_before_sink: bool,
}

fn parse_args(argv: Vec<String>) -> anyhow::Result<Args> {
    let mut role = None::<String>;
    let mut listen = None;
    let mut workers = None;
    let mut heartbeat_timeout_ms = 5000;
    let mut coordinator = None;
    let mut slots = 2;
    let mut join_timeout_ms = 60_000;
    let mut job_args = Vec::new();
    let mut input = None;
    let mut output = None;
    let mut checkpoint_dir = None;
    let mut interval_ms = 1000;
    let mut parallelism = 1;
    let mut max_rate = None;
    let mut from_savepoint = None;
    let mut start_fresh_if_unusable = false;
    let mut cache_entries: Option<usize> = None;
    let mut lease_ms = None;
    let mut checkpoint_timeout_ms = None;
    let mut cancellation_timeout_ms = None;
    let mut web = None;
    let mut secret_file = None;
    let mut tls_dir = None;
    let mut measure_bytes = false;
    let mut latency_tracking_ms = None;
    let mut mode = CheckpointMode::default();
    let mut sink_rate = None;
    let mut rebalance_before_sink = false;
    // RocksDB when this example is built with the `rocksdb` feature, the heap otherwise.
    let mut state = BackendKind::parse(if cfg!(feature = "rocksdb") {
        "rocksdb"
    } else {
        "memory"
    })?;
    let mut it = argv.into_iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            let v = it.next().with_context(|| format!("{flag} needs a value"))?;
            if !matches!(
                flag.as_str(),
                "--cluster"
                    | "--listen"
                    | "--workers"
                    | "--heartbeat-timeout-ms"
                    | "--coordinator"
                    | "--slots"
                    | "--join-timeout-ms"
                    | "--web"
                    | "--secret-file"
                    | "--tls-dir"
            ) {
                job_args.push(flag.clone());
                job_args.push(v.clone());
            }
            anyhow::Ok(v)
        };
        match flag.as_str() {
            "--cluster" => role = Some(value()?),
            "--listen" => listen = Some(value()?),
            "--workers" => workers = Some(value()?.parse().context("--workers")?),
            "--heartbeat-timeout-ms" => {
                heartbeat_timeout_ms = value()?.parse().context("--heartbeat-timeout-ms")?
            }
            "--coordinator" => coordinator = Some(value()?),
            "--slots" => slots = value()?.parse().context("--slots")?,
            "--join-timeout-ms" => {
                join_timeout_ms = value()?.parse().context("--join-timeout-ms")?
            }
            "--input" => input = Some(PathBuf::from(value()?)),
            "--output" => output = Some(PathBuf::from(value()?)),
            "--checkpoint-dir" => checkpoint_dir = Some(PathBuf::from(value()?)),
            "--checkpoint-interval-ms" => {
                interval_ms = value()?.parse().context("--checkpoint-interval-ms")?
            }
            "--parallelism" => parallelism = value()?.parse().context("--parallelism")?,
            "--max-rate" => max_rate = Some(value()?.parse().context("--max-rate")?),
            "--from-savepoint" => from_savepoint = Some(PathBuf::from(value()?)),
            "--start-fresh-if-unusable" => {
                start_fresh_if_unusable = true;
                job_args.push(flag.clone());
            }
            // Handed to the workers too: they measure.
            "--measure-bytes" => {
                measure_bytes = true;
                job_args.push(flag.clone());
            }
            "--state" => state = BackendKind::parse(&value()?)?,
            "--lease-ms" => lease_ms = Some(value()?.parse().context("--lease-ms")?),
            "--checkpoint-timeout-ms" => {
                checkpoint_timeout_ms = Some(value()?.parse().context("--checkpoint-timeout-ms")?)
            }
            "--cancellation-timeout-ms" => {
                cancellation_timeout_ms =
                    Some(value()?.parse().context("--cancellation-timeout-ms")?)
            }
            "--web" => web = Some(value()?),
            "--secret-file" => secret_file = Some(PathBuf::from(value()?)),
            "--tls-dir" => tls_dir = Some(PathBuf::from(value()?)),
            "--latency-tracking-ms" => {
                latency_tracking_ms = Some(value()?.parse().context("--latency-tracking-ms")?)
            }
            "--state-cache-entries" => {
                cache_entries = Some(value()?.parse().context("--state-cache-entries")?)
            }
            "--checkpoint-mode" => mode = parse_mode(&value()?)?,
            "--sink-rate" => sink_rate = Some(parse_sink_rate(&value()?)?),
            // Handed to the workers too: it shapes the graph.
            "--rebalance-before-sink" => {
                rebalance_before_sink = true;
                job_args.push(flag.clone());
            }
            "-h" | "--help" => {
                println!(
                    "usage: file_sum --input IN --output OUTDIR|s3://BUCKET/PREFIX --checkpoint-dir CKDIR \
                     [--checkpoint-interval-ms MS] [--parallelism P] [--max-rate RECORDS_PER_S] \
                     [--from-savepoint PATH] [--start-fresh-if-unusable] [--state rocksdb|memory] \
                     [--state-cache-entries N] [--lease-ms MS] [--checkpoint-timeout-ms MS] \
                     [--cancellation-timeout-ms MS] [--web HOST:PORT] [--secret-file PATH] \
                     [--tls-dir DIR] [--measure-bytes] [--latency-tracking-ms MS] \
                     [--checkpoint-mode aligned|unaligned|aligned-timeout[:MS]] [--sink-rate RECORDS_PER_S] [--rebalance-before-sink]\n       \
                     file_sum --cluster coordinator --listen HOST:PORT --workers N \
                     [--heartbeat-timeout-ms MS] <job flags>\n       \
                     file_sum --cluster worker --coordinator HOST:PORT [--slots S] [--join-timeout-ms MS] [--secret-file PATH] [--tls-dir DIR]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown flag {other}; see --help"),
        }
    }
    if let Some(n) = cache_entries {
        state = with_cache_entries(state, n)?;
    }
    let role = match role.as_deref() {
        None => Role::Alone,
        Some("coordinator") => Role::Coordinator {
            listen: listen.context("--cluster coordinator needs --listen HOST:PORT")?,
            workers: workers.context("--cluster coordinator needs --workers N")?,
            heartbeat_timeout_ms,
        },
        Some("worker") => {
            let coordinator =
                coordinator.context("--cluster worker needs --coordinator HOST:PORT")?;
            // A worker gets the job flags from the coordinator.
            return Ok(Args {
                role: Role::Worker {
                    coordinator,
                    slots,
                    join_timeout_ms,
                },
                job_args,
                input: PathBuf::new(),
                output: PathBuf::new(),
                checkpoint_dir: PathBuf::new(),
                interval_ms,
                parallelism,
                max_rate,
                from_savepoint,
                start_fresh_if_unusable,
                state,
                lease_ms,
                checkpoint_timeout_ms,
                cancellation_timeout_ms,
                web: None,
                secret: weir::Secret::from_file_or_env(secret_file.as_deref())?,
                tls: weir::Tls::from_dir_or_env(tls_dir.as_deref())?,
                measure_bytes,
                latency_tracking_ms,
                mode,
                sink_rate,
                rebalance_before_sink,
            });
        }
        Some(other) => bail!("--cluster is `coordinator` or `worker`, not `{other}`"),
    };
    Ok(Args {
        role,
        job_args,
        input: input.context("--input IN is required")?,
        output: output.context("--output OUTDIR is required")?,
        checkpoint_dir: checkpoint_dir.context("--checkpoint-dir CKDIR is required")?,
        interval_ms,
        parallelism,
        max_rate,
        from_savepoint,
        start_fresh_if_unusable,
        state,
        lease_ms,
        checkpoint_timeout_ms,
        cancellation_timeout_ms,
        web,
        secret: weir::Secret::from_file_or_env(secret_file.as_deref())?,
        tls: weir::Tls::from_dir_or_env(tls_dir.as_deref())?,
        measure_bytes,
        latency_tracking_ms,
        mode,
        sink_rate,
        rebalance_before_sink,
    })
}

/// `--checkpoint-mode`: the runtime's own words for the modes, and its error message.
fn parse_mode(text: &str) -> anyhow::Result<CheckpointMode> {
    text.parse::<CheckpointMode>()
        .map_err(|e| anyhow::anyhow!("--checkpoint-mode: {e}"))
}

/// `--sink-rate`: a positive number of records per second.
fn parse_sink_rate(text: &str) -> anyhow::Result<u64> {
    match text.parse::<u64>() {
        Ok(0) => bail!("--sink-rate must be at least 1 record per second"),
        Ok(r) => Ok(r),
        Err(e) => bail!("--sink-rate {text:?} is not a number of records per second: {e}"),
    }
}

/// The backend with a write-back cache of `n` entries per state (RocksDB only).
fn with_cache_entries(state: BackendKind, n: usize) -> anyhow::Result<BackendKind> {
    if n == 0 {
        bail!("--state-cache-entries must be at least 1");
    }
    match state {
        #[cfg(feature = "rocksdb")]
        BackendKind::RocksDb(mut cfg) => {
            cfg.cache_entries = n;
            Ok(BackendKind::RocksDb(cfg))
        }
        other => bail!(
            "--state-cache-entries applies to the rocksdb state backend only, not to `{}`",
            other.name()
        ),
    }
}

/// Keeps a running sum per key and emits it after every record.
#[derive(Default)]
struct RunningSum {
    sum: Option<ValueState<i64>>,
}

impl KeyedProcessFunction<String, (String, i64), (String, i64)> for RunningSum {
    fn open(&mut self, state: &mut StateContext<String>) -> weir::Result<()> {
        self.sum = Some(state.value_state("sum")?);
        Ok(())
    }
    fn process(
        &mut self,
        (key, value): (String, i64),
        ctx: &mut KeyedContext<'_, String, (String, i64)>,
    ) -> weir::Result<()> {
        let sum = self.sum.as_mut().expect("opened");
        let next = sum
            .get()?
            .unwrap_or(0)
            .checked_add(value)
            .ok_or_else(|| Error::user(format!("sum of key '{key}' overflows i64")))?;
        sum.set(next)?;
        ctx.emit((key, next));
        Ok(())
    }
}

/// Lets at most `per_sec` records a second through one subtask (`--sink-rate`): sleeps
/// whenever it is ahead of that pace, so the sink after it is slow and records back up
/// upstream. A throttle that fell behind (the input was slower) starts over instead of
/// letting a burst through.
struct Throttle {
    per_sec: u64,
    start: Option<Instant>,
    passed: u64,
}

impl Throttle {
    fn new(per_sec: u64) -> Self {
        Throttle {
            per_sec,
            start: None,
            passed: 0,
        }
    }
}

impl ProcessFunction<(String, i64), (String, i64)> for Throttle {
    fn process(
        &mut self,
        record: (String, i64),
        ctx: &mut ProcessContext<'_, (String, i64)>,
    ) -> weir::Result<()> {
        let now = Instant::now();
        let start = *self.start.get_or_insert(now);
        let due = start + Duration::from_secs_f64(self.passed as f64 / self.per_sec as f64);
        if due > now + Duration::from_millis(1) {
            std::thread::sleep(due - now);
        } else if now > due + Duration::from_millis(100) {
            self.start = Some(now);
            self.passed = 0;
        }
        self.passed += 1;
        ctx.emit(record);
        Ok(())
    }
}

fn parse_line(line: &str) -> weir::Result<(String, i64)> {
    let (key, value) = line
        .split_once(',')
        .ok_or_else(|| Error::Malformed(format!("expected `key,value`, got {line:?}")))?;
    let value = value
        .trim()
        .parse::<i64>()
        .map_err(|e| Error::Malformed(format!("value of {line:?} is not an i64: {e}")))?;
    Ok((key.to_string(), value))
}

fn main() -> anyhow::Result<()> {
    let mut args = parse_args(std::env::args().skip(1).collect())?;
    let mut cluster = None;
    match std::mem::replace(&mut args.role, Role::Alone) {
        Role::Alone => {}
        Role::Coordinator {
            listen,
            workers,
            heartbeat_timeout_ms,
        } => {
            let mut c = ClusterConfig::coordinator(&listen, workers, args.job_args.clone());
            c.heartbeat_timeout = Duration::from_millis(heartbeat_timeout_ms);
            c.heartbeat_interval = c.heartbeat_interval.min(c.heartbeat_timeout / 4);
            cluster = Some(c);
        }
        Role::Worker {
            coordinator,
            slots,
            join_timeout_ms,
        } => {
            // With a secret, the worker and the coordinator (and the workers among
            // themselves) prove to each other that they hold it.
            let credentials = Credentials {
                secret: args.secret.clone(),
                tls: args.tls.clone(),
            };
            let joined = join_with(
                &coordinator,
                slots,
                Duration::from_millis(join_timeout_ms),
                credentials,
            )?;
            // Build the pipeline from the coordinator's job flags.
            args = parse_args(joined.args().to_vec()).context("the coordinator's job flags")?;
            if !matches!(args.role, Role::Alone) {
                bail!("the coordinator handed out cluster flags as job flags");
            }
            cluster = Some(ClusterConfig::worker(joined));
        }
    }
    run(args, cluster)
}

fn run(args: Args, cluster: Option<ClusterConfig>) -> anyhow::Result<()> {
    let worker = cluster
        .as_ref()
        .is_some_and(|c| matches!(c.role, weir::cluster::ClusterRole::Worker(_)));
    let mut checkpoints = CheckpointConfig::new(&args.checkpoint_dir)
        .interval(Duration::from_millis(args.interval_ms));
    checkpoints.restore_from = args.from_savepoint.clone();
    checkpoints.start_fresh_if_unusable = args.start_fresh_if_unusable;
    checkpoints.mode = args.mode;
    if let Some(ms) = args.lease_ms {
        checkpoints.lease = Duration::from_millis(ms);
    }
    if let Some(ms) = args.checkpoint_timeout_ms {
        checkpoints.timeout = Duration::from_millis(ms);
    }
    let mut env = Env::new()
        .parallelism(args.parallelism)
        .state_backend(args.state.clone())
        .checkpoints(checkpoints);
    if let Some(ms) = args.cancellation_timeout_ms {
        env = env.cancellation_timeout(Duration::from_millis(ms));
    }
    if let Some(c) = cluster {
        env = env.cluster(c);
    }
    if let Some(a) = &args.web {
        env = env.web_address(a);
    }
    if let Some(s) = &args.secret {
        env = env.secret(s.clone());
    }
    if let Some(t) = &args.tls {
        env = env.tls(t.clone());
    }
    env = env.measure_bytes(args.measure_bytes);
    if let Some(ms) = args.latency_tracking_ms {
        env = env.latency_tracking_interval(std::time::Duration::from_millis(ms));
    }
    let lines = match args.max_rate {
        Some(r) => env.read_text_file_at_rate(&args.input, r),
        None => env.read_text_file(&args.input),
    };
    let mut sums = lines
        .parallelism(1)
        .uid("file-source")
        .try_map(|line| parse_line(&line))
        .name("parse")
        .parallelism(1)
        .key_by(|(k, _)| k.clone())
        .process(RunningSum::default)
        .name("running-sum")
        .uid("running-sum");
    if args.rebalance_before_sink {
        sums = sums.rebalance();
    }
    if let Some(rate) = args.sink_rate {
        sums = sums
            .process(move || Throttle::new(rate))
            .name("sink-throttle")
            .uid("sink-throttle");
    }
    sums.write_text_exactly_once(&args.output, |(k, s)| format!("{k},{s}"))
        .uid("sink");
    let handle = env.execute_async("file_sum").context("file_sum failed")?;
    if let Some(a) = handle.web_address() {
        let scheme = if args.tls.is_some() { "https" } else { "http" };
        tracing::info!(address = %a, "REST API at {scheme}://{a}/v1/job");
        tracing::info!(address = %a, "dashboard at {scheme}://{a}/");
    }
    let result = handle.join().context("file_sum failed")?;
    if worker {
        tracing::info!("worker done");
        return Ok(());
    }
    if result.stopped_with_savepoint {
        let path = result
            .savepoints
            .last()
            .context("stopped without a savepoint path")?;
        println!("stopped with savepoint {}", path.display());
        return Ok(());
    }
    tracing::info!(
        lines = result.records_read(),
        "done, {} lines read in {:.2}s",
        result.records_read(),
        result.elapsed.as_secs_f64()
    );
    Ok(())
}
