//! The life of a job, tried as an operator lives it: `file_sum` runs as a real process and
//! goes through savepoints (`savepoint trigger` and `savepoint stop`, requested through the
//! checkpoint directory exactly as `weir savepoint` does), `kill -9`, resumes from a
//! savepoint copied elsewhere, resumes into a new checkpoint directory, rescales and plain
//! restarts — first the three sequences that once lost or blocked output, then random
//! sequences from a seeded generator. After the last step the job runs to the end and the
//! committed output must hold, per key, exactly the prefix sums of the input: none lost,
//! none twice.
//!
//! The random sequences run once with the memory backend and once with the sums in
//! RocksDB behind a tiny write-back cache. CI runs `SEQUENCES` and `ROCKSDB_SEQUENCES`
//! sequences; `WEIR_SOAK=1` runs ten times as many.

use crate::harness::{Rng, Scenario, soak_factor, wait_for};
use std::fmt::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::Duration;
use weir_tests::operator::{
    copy_dir, newest_complete as newest, request_savepoint, stopped_with, withdraw_request,
};

/// Random sequences in CI (each 6–10 steps).
const SEQUENCES: usize = 6;

/// Random sequences on RocksDB in CI.
const ROCKSDB_SEQUENCES: usize = 3;

/// How long one wait (a checkpoint, a savepoint, a stop, a run to the end) may take.
const LIMIT: Duration = Duration::from_secs(60);

/// One thing an operator does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Start the job if it is not running, then let it complete one more checkpoint.
    RunAWhile,
    /// SIGKILL the running job.
    Kill,
    /// Take a savepoint while the job keeps running, and wait until it is written.
    SavepointTrigger,
    /// Stop the job with a savepoint.
    SavepointStop,
    /// Copy the savepoint the job stopped with to another path and resume from the copy,
    /// in the same checkpoint directory or in a new one.
    ResumeFromCopy { new_checkpoint_dir: bool },
    /// The next start runs at this parallelism (a running job is stopped with a savepoint
    /// and started again from it, as a rescale is done).
    Rescale(usize),
    /// Start the job again as it was (it resumes on its own).
    PlainRestart,
}

/// The job and everything the operator has done to it.
struct Life {
    s: Scenario,
    /// The checkpoint directory the next start uses.
    checkpoints: PathBuf,
    parallelism: usize,
    child: Option<Child>,
    /// Runs started so far (names their log files).
    runs: usize,
    /// The savepoint of the last stop, while no run has started since.
    stopped_with: Option<PathBuf>,
    /// The input was consumed and the final checkpoint committed it.
    finished: bool,
    /// What happened, for the failure message.
    history: String,
}

impl Life {
    fn new(lines: usize, keys: u64, seed: u64) -> Life {
        let s = Scenario::new(lines, keys, seed);
        let checkpoints = s.checkpoints.clone();
        Life {
            s,
            checkpoints,
            parallelism: 2,
            child: None,
            runs: 0,
            stopped_with: None,
            finished: false,
            history: String::new(),
        }
    }

    fn root(&self) -> PathBuf {
        self.s.input.parent().expect("scenario dir").to_path_buf()
    }

    fn log_path(&self, run: usize) -> PathBuf {
        self.root().join(format!("run-{run}.log"))
    }

    fn note(&mut self, what: impl AsRef<str>) {
        let _ = writeln!(self.history, "  {}", what.as_ref());
    }

    /// Fails with the steps taken and the last run's log.
    fn fail(&self, what: &str) -> ! {
        let log = std::fs::read_to_string(self.log_path(self.runs)).unwrap_or_default();
        panic!("{what}\nsteps:\n{}last run's output:\n{log}", self.history);
    }

    /// Starts a run (resuming on its own, or from `from`).
    fn start(&mut self, from: Option<&Path>) {
        assert!(self.child.is_none());
        self.runs += 1;
        let log = std::fs::File::create(self.log_path(self.runs)).expect("log file");
        let mut cmd = self
            .s
            .command_in(&self.checkpoints, self.parallelism, Some(8_000), 50);
        cmd.stdout(Stdio::from(log.try_clone().expect("log file")))
            .stderr(Stdio::from(log));
        if let Some(p) = from {
            cmd.arg("--from-savepoint").arg(p);
        }
        self.note(format!(
            "run {}: start at parallelism {} in {}{}",
            self.runs,
            self.parallelism,
            self.checkpoints
                .file_name()
                .unwrap_or_default()
                .to_string_lossy(),
            from.map(|p| format!(" from {}", p.display()))
                .unwrap_or_default()
        ));
        self.child = Some(cmd.spawn().expect("start file_sum"));
        self.stopped_with = None;
    }

    fn ensure_running(&mut self) {
        if self.child.is_none() && !self.finished {
            self.start(None);
        }
    }

    /// The job exited: it must have exited 0, by finishing its input or by a stop.
    fn exited(&mut self, status: ExitStatus) -> String {
        self.child = None;
        let log = std::fs::read_to_string(self.log_path(self.runs)).unwrap_or_default();
        if !status.success() {
            self.fail(&format!("run {} failed: {status}", self.runs));
        }
        // A request the job never took is withdrawn, as `weir savepoint` does on timeout.
        withdraw_request(&self.checkpoints);
        match stopped_with(&log) {
            Some(p) => {
                self.note(format!(
                    "run {} stopped with savepoint {}",
                    self.runs,
                    p.display()
                ));
                self.stopped_with = Some(p);
            }
            None => {
                self.finished = true;
                self.note(format!("run {} finished its input", self.runs));
            }
        }
        log
    }

    /// Waits until `cond` holds or the job exits; false if it exited.
    fn wait_running(&mut self, what: &str, mut cond: impl FnMut(&Path) -> bool) -> bool {
        let dir = self.checkpoints.clone();
        let mut status = None;
        let child = self.child.as_mut().expect("a running job");
        wait_for(what, LIMIT, || {
            status = child.try_wait().expect("poll file_sum");
            status.is_some() || cond(&dir)
        });
        match status {
            Some(st) => {
                self.exited(st);
                false
            }
            None => true,
        }
    }

    /// A request right after a start may come before the job made its checkpoint
    /// directory: the operator makes it (the job takes a request it finds there when it
    /// starts).
    fn request(&self, what: &str) {
        std::fs::create_dir_all(&self.checkpoints).expect("make the checkpoint directory");
        request_savepoint(&self.checkpoints, what);
    }

    fn apply(&mut self, step: Step, rng: &mut Rng) {
        self.note(format!("{step:?}"));
        match step {
            Step::RunAWhile => {
                self.ensure_running();
                if self.child.is_some() {
                    let before = newest(&self.checkpoints, "chk-");
                    self.wait_running("one more checkpoint", |d| newest(d, "chk-") > before);
                    // Land the next step at a random moment between two checkpoints.
                    std::thread::sleep(Duration::from_millis(rng.below(50)));
                }
            }
            Step::Kill => {
                if let Some(mut child) = self.child.take() {
                    child.kill().expect("SIGKILL file_sum");
                    let status = child.wait().expect("reap file_sum");
                    if status.signal() != Some(9) {
                        self.child = Some(child);
                        self.exited(status);
                    } else {
                        self.note(format!("run {} killed with SIGKILL", self.runs));
                    }
                }
            }
            Step::SavepointTrigger => {
                if self.child.is_some() {
                    let before = newest(&self.checkpoints, "sp-");
                    self.request("savepoint");
                    self.wait_running("the savepoint", |d| newest(d, "sp-") > before);
                }
            }
            Step::SavepointStop => self.stop(),
            Step::ResumeFromCopy { new_checkpoint_dir } => {
                let Some(sp) = self.stopped_with.clone() else {
                    return;
                };
                let copy = self.root().join(format!("copy-{}", self.runs));
                copy_dir(&sp, &copy);
                if new_checkpoint_dir {
                    self.checkpoints = self.root().join(format!("ck-{}", self.runs));
                }
                self.start(Some(&copy));
            }
            Step::Rescale(p) => {
                if self.child.is_some() {
                    self.stop();
                }
                self.parallelism = p;
                if self.stopped_with.is_some() {
                    // A plain start resumes from the savepoint the job stopped with.
                    self.start(None);
                }
            }
            Step::PlainRestart => {
                if self.child.is_none() {
                    self.start(None);
                }
            }
        }
    }

    fn stop(&mut self) {
        if self.child.is_none() {
            return;
        }
        self.request("stop");
        let child = self.child.as_mut().expect("running");
        let mut status = None;
        wait_for("the stop with a savepoint", LIMIT, || {
            status = child.try_wait().expect("poll file_sum");
            status.is_some()
        });
        self.exited(status.expect("exited"));
    }

    /// Runs the job to the end of its input and checks the committed output.
    fn finish_and_check(mut self) {
        self.note("to the end");
        if self.child.is_none() {
            self.start(None);
        }
        let mut child = self.child.take().expect("running");
        let mut status = None;
        wait_for("the run to the end", LIMIT * 3, || {
            status = child.try_wait().expect("poll file_sum");
            status.is_some()
        });
        self.child = Some(child);
        self.exited(status.expect("exited"));
        if !self.finished {
            self.fail("the last run stopped before the end of its input");
        }
        let history = std::mem::take(&mut self.history);
        let check = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.s.check()));
        if let Err(e) = check {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{msg}\nsteps:\n{history}");
        }
    }
}

impl Drop for Life {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A random operator's sequence of 6–10 steps.
fn random_steps(rng: &mut Rng) -> Vec<Step> {
    let n = 6 + rng.below(5) as usize;
    (0..n)
        .map(|_| match rng.below(14) {
            0..=3 => Step::RunAWhile,
            4..=5 => Step::Kill,
            6..=7 => Step::SavepointTrigger,
            8..=9 => Step::SavepointStop,
            10 => Step::ResumeFromCopy {
                new_checkpoint_dir: false,
            },
            11 => Step::ResumeFromCopy {
                new_checkpoint_dir: true,
            },
            12 => Step::Rescale(1 + rng.below(3) as usize),
            _ => Step::PlainRestart,
        })
        .collect()
}

fn live(seed: u64, steps: &[Step]) {
    live_with(seed, steps, &[]);
}

/// [`live`] with `file_sum` given `args` besides (a state backend).
fn live_with(seed: u64, steps: &[Step], args: &[&str]) {
    let mut life = Life::new(20_000, 20, seed);
    life.s.extra_args = args.iter().map(|a| a.to_string()).collect();
    let mut rng = Rng::new(seed ^ 0x5EED);
    for &step in steps {
        life.apply(step, &mut rng);
    }
    life.finish_and_check();
}

/// Stopped with a savepoint, the savepoint copied elsewhere, resumed from the copy with a
/// new checkpoint directory and the same output directory.
#[test]
fn resume_a_copied_savepoint_into_a_new_checkpoint_directory() {
    live(
        101,
        &[
            Step::RunAWhile,
            Step::RunAWhile,
            Step::SavepointStop,
            Step::ResumeFromCopy {
                new_checkpoint_dir: true,
            },
            Step::RunAWhile,
        ],
    );
}

/// A savepoint taken while the job runs, then `kill -9` before the next checkpoint, then
/// started again.
#[test]
fn savepoint_then_kill_then_restart() {
    for seed in [102, 103] {
        live(
            seed,
            &[
                Step::RunAWhile,
                Step::SavepointTrigger,
                Step::Kill,
                Step::PlainRestart,
                Step::RunAWhile,
                Step::SavepointTrigger,
                Step::Kill,
            ],
        );
    }
}

/// Stopped with a savepoint, then started again without naming it, then at another
/// parallelism.
#[test]
fn plain_restart_after_a_stop_resumes_from_its_savepoint() {
    live(
        104,
        &[
            Step::RunAWhile,
            Step::SavepointStop,
            Step::PlainRestart,
            Step::RunAWhile,
            Step::Rescale(3),
            Step::RunAWhile,
            Step::Rescale(1),
        ],
    );
}

/// `sequences` random sequences (times the soak factor) from the generator seeded with
/// `rng_seed`, the scenarios seeded from `first_seed` on, `file_sum` given `args`.
fn random_lifecycles(sequences: usize, rng_seed: u64, first_seed: u64, args: &[&str]) {
    let mut rng = Rng::new(rng_seed);
    for i in 0..sequences * soak_factor() {
        let seed = first_seed + i as u64;
        let steps = random_steps(&mut rng);
        eprintln!("lifecycle sequence {i} (seed {seed}, {args:?}): {steps:?}");
        live_with(seed, &steps, args);
    }
}

/// Random sequences of everything above.
#[test]
fn random_lifecycles_keep_every_sum_exactly_once() {
    random_lifecycles(SEQUENCES, 0x11FE, 200, &[]);
}

/// Random sequences with the sums in RocksDB behind a write-back cache of four entries,
/// so nearly every sum is in RocksDB's files: savepoints carry those files, copies of
/// them restore into new directories and at other parallelisms, and `kill -9` lands
/// while RocksDB snapshots are being written.
#[test]
fn random_lifecycles_on_rocksdb_keep_every_sum_exactly_once() {
    random_lifecycles(
        ROCKSDB_SEQUENCES,
        0x5EED_0CC5,
        400,
        &["--state", "rocksdb", "--state-cache-entries", "4"],
    );
}

/// Stopped with a savepoint that is then moved out of the checkpoint directory: a plain
/// start refuses, naming the savepoint (an older checkpoint would write its committed
/// output again); started from the moved savepoint, the job finishes exactly once.
#[test]
fn a_plain_start_after_the_stop_savepoint_was_moved_names_it() {
    let mut life = Life::new(20_000, 20, 105);
    let mut rng = Rng::new(105);
    life.apply(Step::RunAWhile, &mut rng);
    life.apply(Step::RunAWhile, &mut rng);
    life.apply(Step::SavepointStop, &mut rng);
    let Some(sp) = life.stopped_with.clone() else {
        life.fail("the job finished before it could be stopped");
    };
    let moved = life.root().join("archive");
    std::fs::rename(&sp, &moved).expect("move the savepoint away");
    let out = life
        .s
        .command(life.parallelism, None, 50)
        .output()
        .expect("run file_sum");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a plain start must refuse:\n{err}");
    assert!(
        err.contains("last stopped with savepoint") && err.contains(&sp.display().to_string()),
        "the refusal does not name the savepoint:\n{err}"
    );
    life.note("a plain start refused; resume from the moved savepoint");
    life.start(Some(&moved));
    life.finish_and_check();
}

/// Every checkpoint of the directory is corrupt: the job does not start over on its own
/// (it would commit every sum again) but fails naming each checkpoint; with
/// `--start-fresh-if-unusable`, after the old output was moved away, it starts from
/// scratch and commits every sum once.
#[test]
fn corrupt_checkpoints_never_start_the_job_over_silently() {
    let s = Scenario::new(5_000, 10, 106);
    let mut child = s
        .command(1, Some(5_000), 20)
        .spawn()
        .expect("start file_sum");
    wait_for("two checkpoints", LIMIT, || {
        crate::harness::latest_checkpoint(&s.checkpoints).is_some_and(|id| id >= 2)
    });
    child.kill().expect("SIGKILL file_sum");
    child.wait().expect("reap file_sum");
    let mut damaged = Vec::new();
    for e in std::fs::read_dir(&s.checkpoints)
        .expect("checkpoints")
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("chk-") && e.path().join("_metadata").exists() {
            for f in std::fs::read_dir(e.path()).expect("checkpoint").flatten() {
                if f.file_name().to_string_lossy().ends_with(".state") {
                    let mut bytes = std::fs::read(f.path()).expect("state file");
                    bytes[0] ^= 0xFF;
                    std::fs::write(f.path(), bytes).expect("damage state file");
                }
            }
            damaged.push(name);
        }
    }
    assert!(damaged.len() >= 2, "{damaged:?}");
    let out = s.command(1, None, 20).output().expect("run file_sum");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the job must not start over:\n{err}");
    assert!(err.contains("none can be restored"), "{err}");
    for name in &damaged {
        assert!(err.contains(name.as_str()), "{name} is not named:\n{err}");
    }
    // The operator moves the old output away and asks for a fresh start.
    std::fs::rename(&s.output, s.checkpoints.with_file_name("old-out")).expect("move output");
    let out = s
        .command(1, None, 20)
        .arg("--start-fresh-if-unusable")
        .output()
        .expect("run file_sum");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s.check();
}

/// A bounded job that ran to its end and is started again, as an operator might by
/// mistake: the run says the job had already finished (not "resuming from final"), exits
/// 0, and writes nothing more.
#[test]
fn a_finished_job_started_again_says_it_had_finished() {
    let s = Scenario::new(300, 4, 77);
    s.run_to_end(2);
    s.check();
    let files = |dir: &Path| {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("output dir")
            .map(|e| {
                e.expect("dir entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        names
    };
    let before = files(&s.output);
    let out = s.command(2, None, 100).output().expect("start file_sum");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the second start failed: {stderr}");
    assert!(
        stderr.contains(
            "[weir] job 'file_sum' had already finished: resuming after its end (final checkpoint"
        ),
        "the second start does not say the job had finished:\n{stderr}"
    );
    assert!(
        stderr.contains("To process the input again, give the job a new checkpoint directory."),
        "{stderr}"
    );
    assert_eq!(files(&s.output), before, "the second start wrote output");
    s.check();
}
