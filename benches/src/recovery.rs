//! `weir-bench recovery`: how long a keyed job with large RocksDB state takes from process
//! start to its first record processed after a crash.
//!
//! A child process (`weir-bench recovery-child --phase build`) fills RocksDB with `--keys`
//! keys of `--value-bytes` incompressible bytes from an unbounded source, keeps
//! checkpointing once a second, and is killed with SIGKILL once a checkpoint taken after
//! the last key is complete: a crash, which leaves its working directory behind (what local
//! recovery restores from). A second child (`--phase restore`, at `--restore-parallelism`)
//! is started from that checkpoint; its keyed subtasks note the time of their first record.
//! The run prints one JSON line: the time from starting the second process to the first
//! record processed by any subtask, and by every subtask.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use weir::prelude::*;

/// The flags of `weir-bench recovery`.
#[derive(clap::Args, Debug, Clone)]
pub struct RecoveryArgs {
    /// Number of keys (one state entry each).
    #[arg(long, default_value_t = 10_000_000)]
    pub keys: u64,
    /// Bytes per state value.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
    /// Parallelism of the run that builds the state.
    #[arg(long, default_value_t = 2)]
    pub parallelism: usize,
    /// Parallelism of the restarted run (default: the same).
    #[arg(long)]
    pub restore_parallelism: Option<usize>,
    /// Restore from checkpoint storage even when the killed process's local copy is there.
    #[arg(long)]
    pub no_local_recovery: bool,
    /// Working directory (must be new or empty): checkpoints, RocksDB's working directory,
    /// the children's logs. Removed at the end unless `--keep`.
    #[arg(long)]
    pub dir: PathBuf,
    /// Keep the working directory.
    #[arg(long)]
    pub keep: bool,
    /// Skip the build: crash-restart again from the kept working directory of an earlier
    /// run (`--keep`) with the same `--keys` and `--value-bytes`, so that one large state
    /// serves several measurements. Implies `--keep`.
    #[arg(long)]
    pub again: bool,
    /// Drop the machine's page cache (`/proc/sys/vm/drop_caches`, needs root) before the
    /// restart, so that the checkpoint's files come from disk, as after a reboot.
    #[arg(long)]
    pub cold: bool,
}

/// The flags of the hidden `weir-bench recovery-child`.
#[derive(clap::Args, Debug, Clone)]
pub struct ChildArgs {
    /// `build` or `restore`.
    #[arg(long)]
    pub phase: String,
    #[arg(long)]
    pub keys: u64,
    #[arg(long)]
    pub value_bytes: usize,
    #[arg(long)]
    pub parallelism: usize,
    #[arg(long)]
    pub no_local_recovery: bool,
    #[arg(long)]
    pub dir: PathBuf,
}

/// Runs the benchmark; its JSON line.
pub fn run(a: &RecoveryArgs) -> anyhow::Result<String> {
    let dir = &a.dir;
    if a.again {
        if latest_complete(&dir.join("ck")).is_none() {
            anyhow::bail!(
                "{} holds no complete checkpoint; --again restarts from the kept directory \
                 of an earlier run (--keep)",
                dir.display()
            );
        }
        return measure(a);
    }
    if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
        anyhow::bail!(
            "{} is not empty; give the benchmark a new directory",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir)?;
    let result = measure(a);
    if !a.keep {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

/// Runs the build phase until a checkpoint after its last key is complete, then kills it;
/// the seconds it took.
fn build_state(a: &RecoveryArgs, started: Instant) -> anyhow::Result<f64> {
    let dir = &a.dir;
    let mut build = child(a, "build", a.parallelism)?;
    let built = (0..a.parallelism).map(|s| dir.join(format!("built-{s}")));
    let built: Vec<PathBuf> = built.collect();
    // About 100,000 keys a second at least, however loaded the machine.
    let limit = Duration::from_secs(600 + a.keys / 100_000);
    wait(&mut build, dir, "build", limit, || {
        built.iter().all(|p| p.exists())
    })?;
    let last = latest_complete(&dir.join("ck")).unwrap_or(0);
    wait(&mut build, dir, "build", limit, || {
        latest_complete(&dir.join("ck")).is_some_and(|id| id >= last + 2)
    })?;
    build.kill()?;
    build.wait()?;
    Ok(started.elapsed().as_secs_f64())
}

fn measure(a: &RecoveryArgs) -> anyhow::Result<String> {
    let dir = &a.dir;
    let restore_p = a.restore_parallelism.unwrap_or(a.parallelism);
    let started = Instant::now();
    let build_s = if a.again {
        for s in 0..restore_p.max(a.parallelism) * 4 {
            let _ = std::fs::remove_file(dir.join(format!("first-{s}")));
        }
        None
    } else {
        Some(build_state(a, started)?)
    };
    let state_bytes = dir_bytes(&dir.join("ck").join("shared"));
    let checkpoint_bytes = full_bytes(&dir.join("ck"));
    if a.cold {
        drop_page_cache()?;
    }
    let t0 = SystemTime::now();
    let mut restore = child(a, "restore", restore_p)?;
    let firsts: Vec<PathBuf> = (0..restore_p)
        .map(|s| dir.join(format!("first-{s}")))
        .collect();
    let restored = wait(
        &mut restore,
        dir,
        "restore",
        Duration::from_secs(900),
        || firsts.iter().all(|p| p.exists()),
    );
    // Then until the checksums of the checkpoint, read while the job runs, verified: no
    // checkpoint of the restarted job completes before.
    let verified_line = |log: &str| {
        log.lines()
            .find(|l| l.contains("the files of restored checkpoint"))
            .map(str::to_string)
    };
    let verified = restored.and_then(|()| {
        wait(
            &mut restore,
            dir,
            "restore",
            Duration::from_secs(900),
            || {
                verified_line(&std::fs::read_to_string(dir.join("restore.log")).unwrap_or_default())
                    .is_some()
            },
        )
    });
    let _ = restore.kill();
    let _ = restore.wait();
    verified?;
    let mut times = Vec::new();
    for p in &firsts {
        let nanos: u128 = std::fs::read_to_string(p)?.trim().parse()?;
        let t = UNIX_EPOCH + Duration::from_nanos(nanos as u64);
        times.push(t.duration_since(t0).unwrap_or_default().as_secs_f64());
    }
    let first = times.iter().copied().fold(f64::INFINITY, f64::min);
    let all = times.iter().copied().fold(0.0, f64::max);
    let log = std::fs::read_to_string(dir.join("restore.log")).unwrap_or_default();
    let local_copies = log
        .lines()
        .find_map(|l| l.split("local_copies=").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok());
    let verify_s = verified_line(&log)
        .and_then(|l| {
            let ms = l.split("verified in ").nth(1)?.split_whitespace().next()?;
            ms.parse::<u64>().ok()
        })
        .map(|ms| ms as f64 / 1000.0);
    let round = |s: f64| (s * 1000.0).round() / 1000.0;
    Ok(serde_json::json!({
        "job": "recovery",
        "keys": a.keys,
        "value_bytes": a.value_bytes,
        "parallelism": a.parallelism,
        "restore_parallelism": restore_p,
        "local_recovery": !a.no_local_recovery,
        "local_copies_used": local_copies,
        "state_bytes": state_bytes,
        "checkpoint_bytes": checkpoint_bytes,
        "build_s": build_s.map(round),
        "again": a.again,
        "cold": a.cold,
        "first_record_s": round(first),
        "all_subtasks_s": round(all),
        "verify_s": verify_s,
    })
    .to_string())
}

/// Writes what is cached of the files to disk, then drops the page cache.
fn drop_page_cache() -> anyhow::Result<()> {
    let synced = Command::new("sync").status()?;
    anyhow::ensure!(synced.success(), "sync failed: {synced}");
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(|e| {
        anyhow::anyhow!(
            "--cold drops the page cache by writing /proc/sys/vm/drop_caches, which needs \
             root: {e}"
        )
    })
}

/// Starts `weir-bench recovery-child` for `phase`, its log in the working directory.
fn child(a: &RecoveryArgs, phase: &str, parallelism: usize) -> anyhow::Result<Child> {
    let log = std::fs::File::create(a.dir.join(format!("{phase}.log")))?;
    let mut c = Command::new(std::env::current_exe()?);
    c.arg("recovery-child")
        .args(["--phase", phase])
        .args(["--keys", &a.keys.to_string()])
        .args(["--value-bytes", &a.value_bytes.to_string()])
        .args(["--parallelism", &parallelism.to_string()])
        .arg("--dir")
        .arg(&a.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    if a.no_local_recovery {
        c.arg("--no-local-recovery");
    }
    Ok(c.spawn()?)
}

/// Polls `done` every 20 ms until it holds; fails when the child exits first or `limit`
/// passes (with the end of the child's log).
fn wait(
    child: &mut Child,
    dir: &Path,
    phase: &str,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return Ok(());
        }
        let tail = || {
            let log = std::fs::read_to_string(dir.join(format!("{phase}.log"))).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            lines[lines.len().saturating_sub(20)..].join("\n")
        };
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("the {phase} process ended ({status}):\n{}", tail());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            anyhow::bail!("the {phase} process took over {limit:?}:\n{}", tail());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The id of the newest complete checkpoint in `ck`.
fn latest_complete(ck: &Path) -> Option<u64> {
    std::fs::read_dir(ck)
        .ok()?
        .flatten()
        .filter(|e| e.path().join("_metadata").exists())
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("chk-")?.parse().ok())
        .max()
}

/// The size of everything the newest complete checkpoint in `ck` references (its
/// manifest's `full_bytes`): the state a restore starts from. `state_bytes` counts the
/// shared directory, which also holds files only older checkpoints still reference.
fn full_bytes(ck: &Path) -> Option<u64> {
    let id = latest_complete(ck)?;
    let path = ck.join(format!("chk-{id:020}")).join("_metadata");
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    manifest["stats"]["full_bytes"].as_u64()
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .sum()
}

/// One phase, in the child process: runs until killed.
pub fn run_child(a: &ChildArgs) -> weir::Result<()> {
    let restore = a.phase == "restore";
    let cfg = weir::RocksDbConfig {
        local_dir: a.dir.join("local"),
        cache_entries: 100_000,
        local_recovery: !a.no_local_recovery,
        ..Default::default()
    };
    let env = Env::new()
        .parallelism(a.parallelism)
        .state_backend(weir::BackendKind::RocksDb(cfg))
        .checkpoints(CheckpointConfig::new(a.dir.join("ck")).interval(Duration::from_secs(1)));
    let (keys, dir) = (a.keys, a.dir.clone());
    let marks = a.dir.clone();
    let value_bytes = a.value_bytes.max(16);
    // One `first-{n}` file per keyed subtask, numbered as they are made.
    let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    env.source("feed", move |ctx| Feed::new(keys, &ctx, dir.clone()))
        .uid("feed")
        .key_by(|(k, _)| *k)
        .process(move || {
            let n = made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Fill {
                value_bytes,
                state: None,
                first: restore.then(|| marks.join(format!("first-{n}"))),
            }
        })
        .uid("fill")
        .discard();
    env.execute("recovery")?;
    Ok(())
}

/// Emits its share of the keys once (then notes that it is done and idles); restored, it
/// emits a few records at a time forever.
struct Feed {
    keys: u64,
    next: u64,
    step: u64,
    subtask: usize,
    dir: PathBuf,
    restored: bool,
    marked: bool,
}

impl Feed {
    fn new(keys: u64, ctx: &SourceContext, dir: PathBuf) -> Feed {
        Feed {
            keys,
            next: ctx.subtask as u64,
            step: ctx.parallelism as u64,
            subtask: ctx.subtask,
            dir,
            restored: false,
            marked: false,
        }
    }
}

impl SourceFunction<(u64, i64)> for Feed {
    fn restore(&mut self, states: &[Vec<u8>], _ctx: &SourceContext) -> weir::Result<()> {
        self.restored = !states.is_empty();
        Ok(())
    }

    fn poll(&mut self, out: &mut SourceOutput<'_, (u64, i64)>) -> weir::Result<SourceStatus> {
        if self.restored {
            // A trickle over every key range, so that every subtask gets records.
            for i in 0..64 {
                let k = (self.next + i * self.keys / 64) % self.keys;
                out.emit((k, -1))?;
            }
            self.next += 1;
            return Ok(SourceStatus::Idle(5));
        }
        if self.next >= self.keys {
            if !self.marked {
                std::fs::write(self.dir.join(format!("built-{}", self.subtask)), b"")
                    .map_err(|e| weir::Error::io(self.dir.display(), e))?;
                self.marked = true;
            }
            return Ok(SourceStatus::Idle(100));
        }
        for _ in 0..1024 {
            if self.next >= self.keys {
                break;
            }
            out.emit((self.next, self.next as i64))?;
            self.next += self.step;
        }
        Ok(SourceStatus::More)
    }

    fn snapshot(&mut self) -> weir::Result<Option<(Vec<u8>, String)>> {
        Ok(Some((
            self.next.to_le_bytes().to_vec(),
            format!("next {}", self.next),
        )))
    }
}

/// Keeps a `value_bytes`-long value per key; restored, notes when its first record came.
struct Fill {
    value_bytes: usize,
    state: Option<ValueState<Vec<u8>>>,
    /// The file to note the first record in (the restore phase), until it is noted.
    first: Option<PathBuf>,
}

impl KeyedProcessFunction<u64, (u64, i64), u64> for Fill {
    fn open(&mut self, state: &mut StateContext<u64>) -> weir::Result<()> {
        self.state = Some(state.value_state("value")?);
        Ok(())
    }

    fn process(
        &mut self,
        (k, v): (u64, i64),
        _ctx: &mut KeyedContext<'_, u64, u64>,
    ) -> weir::Result<()> {
        if let Some(path) = self.first.take() {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            // Written whole, then renamed: the benchmark reads it as soon as it exists.
            let part = path.with_extension("part");
            std::fs::write(&part, now.to_string())
                .and_then(|()| std::fs::rename(&part, &path))
                .map_err(|e| weir::Error::io(path.display(), e))?;
        }
        if v < 0 {
            // A record of the restored run: the state must be there.
            let state = self.state.as_mut().expect("opened");
            if state.get()?.is_none() {
                return Err(weir::Error::User(format!("key {k} lost its state")));
            }
            return Ok(());
        }
        // Incompressible bytes, so the state's size on disk is about keys × value_bytes.
        let mut x = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut bytes: Vec<u8> = (0..self.value_bytes)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        bytes[..8].copy_from_slice(&v.to_le_bytes());
        self.state.as_mut().expect("opened").set(bytes)
    }
}
