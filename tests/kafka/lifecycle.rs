//! The life of a Kafka job, tried as an operator lives it: `kafka_sum` runs as a real
//! process against the real broker while its input arrives in chunks, and goes through
//! savepoints (trigger and stop, requested through the checkpoint directory as
//! `weir savepoint` does), `kill -9`, resumes from a savepoint copied elsewhere, resumes
//! into a new checkpoint directory, rescales, a change of the sink's transactional-id
//! prefix and plain restarts. At the end an independent `read_committed` reader must see,
//! per key, exactly the prefix sums of the input: none lost, none twice.
//!
//! CI runs `SEQUENCES` random sequences; `WEIR_SOAK=1` runs ten times as many.

use crate::support::*;
use std::fmt::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::Duration;
use weir_tests::Rng;
use weir_tests::operator::{
    copy_dir, newest_complete, request_savepoint, stopped_with, withdraw_request,
};

/// Random sequences in CI.
const SEQUENCES: usize = 3;

/// How long one wait may take.
const LIMIT: Duration = Duration::from_secs(90);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Produce the next chunk of input, start the job if it is not running, and let it
    /// complete one more checkpoint.
    RunAWhile,
    Kill,
    SavepointTrigger,
    SavepointStop,
    ResumeFromCopy {
        new_checkpoint_dir: bool,
    },
    Rescale(usize),
    /// The next start uses another transactional-id prefix.
    ChangePrefix,
    PlainRestart,
}

struct Life {
    _dir: tempfile::TempDir,
    root: PathBuf,
    input_topic: String,
    output_topic: String,
    input: Vec<(String, i64)>,
    produced: usize,
    chunk: usize,
    checkpoints: PathBuf,
    parallelism: usize,
    prefix: String,
    interval_ms: u64,
    /// More kafka_sum flags for every start.
    extra_args: Vec<String>,
    child: Option<Child>,
    runs: usize,
    stopped_with: Option<PathBuf>,
    history: String,
}

impl Life {
    fn new(records: usize, chunks: usize, seed: u64) -> Life {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().to_path_buf();
        let input_topic = unique("life-in");
        let output_topic = unique("life-out");
        create_topic(&input_topic, 3);
        create_topic(&output_topic, 3);
        Life {
            _dir: dir,
            checkpoints: root.join("ck"),
            root,
            prefix: format!("{output_topic}-sum"),
            input_topic,
            output_topic,
            input: random_input(records, 12, seed),
            produced: 0,
            chunk: records.div_ceil(chunks),
            parallelism: 2,
            interval_ms: 200,
            extra_args: Vec::new(),
            child: None,
            runs: 0,
            stopped_with: None,
            history: String::new(),
        }
    }

    fn log_path(&self, run: usize) -> PathBuf {
        self.root.join(format!("run-{run}.log"))
    }

    fn note(&mut self, what: impl AsRef<str>) {
        let _ = writeln!(self.history, "  {}", what.as_ref());
    }

    fn fail(&self, what: &str) -> ! {
        let log = std::fs::read_to_string(self.log_path(self.runs)).unwrap_or_default();
        panic!("{what}\nsteps:\n{}last run's output:\n{log}", self.history);
    }

    fn produce_chunk(&mut self) {
        let end = (self.produced + self.chunk).min(self.input.len());
        if end > self.produced {
            produce(&self.input_topic, &self.input[self.produced..end]);
            self.note(format!("produced records {}..{end}", self.produced));
            self.produced = end;
        }
    }

    fn start(&mut self, from: Option<&Path>) {
        assert!(self.child.is_none());
        self.runs += 1;
        let log = std::fs::File::create(self.log_path(self.runs)).expect("log file");
        let mut cmd = kafka_sum(&self.input_topic, &self.output_topic, &self.checkpoints);
        cmd.arg("--transactional-id-prefix")
            .arg(&self.prefix)
            .arg("--parallelism")
            .arg(self.parallelism.to_string())
            .arg("--checkpoint-interval-ms")
            .arg(self.interval_ms.to_string())
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("log file")))
            .stderr(Stdio::from(log));
        if let Some(p) = from {
            cmd.arg("--from-savepoint").arg(p);
        }
        self.note(format!(
            "run {}: start at parallelism {}, prefix {}, in {}{}",
            self.runs,
            self.parallelism,
            self.prefix,
            self.checkpoints
                .file_name()
                .unwrap_or_default()
                .to_string_lossy(),
            from.map(|p| format!(" from {}", p.display()))
                .unwrap_or_default()
        ));
        self.child = Some(cmd.spawn().expect("start kafka_sum"));
        self.stopped_with = None;
    }

    /// The job exited on its own or by a stop: it must have exited 0.
    fn exited(&mut self, status: ExitStatus) {
        self.child = None;
        if !status.success() {
            self.fail(&format!("run {} failed: {status}", self.runs));
        }
        withdraw_request(&self.checkpoints);
        let log = std::fs::read_to_string(self.log_path(self.runs)).unwrap_or_default();
        match stopped_with(&log) {
            Some(p) => {
                self.note(format!(
                    "run {} stopped with savepoint {}",
                    self.runs,
                    p.display()
                ));
                self.stopped_with = Some(p);
            }
            None => self.fail(&format!("run {} ended without being asked to", self.runs)),
        }
    }

    /// Waits until `cond` holds; the job must keep running meanwhile.
    fn wait_running(&mut self, what: &str, mut cond: impl FnMut(&Path) -> bool) {
        let dir = self.checkpoints.clone();
        let mut status = None;
        let child = self.child.as_mut().expect("a running job");
        wait_for(what, LIMIT, || {
            status = child.try_wait().expect("poll kafka_sum");
            status.is_some() || cond(&dir)
        });
        if let Some(st) = status {
            self.child = None;
            self.fail(&format!("run {} ended on its own: {st}", self.runs));
        }
    }

    fn stop(&mut self) {
        if self.child.is_none() {
            return;
        }
        request_savepoint(&self.checkpoints, "stop");
        let child = self.child.as_mut().expect("running");
        let mut status = None;
        wait_for("the stop with a savepoint", LIMIT, || {
            status = child.try_wait().expect("poll kafka_sum");
            status.is_some()
        });
        self.exited(status.expect("exited"));
    }

    fn apply(&mut self, step: Step, rng: &mut Rng) {
        self.note(format!("{step:?}"));
        match step {
            Step::RunAWhile => {
                self.produce_chunk();
                if self.child.is_none() {
                    self.start(None);
                }
                let before = newest_complete(&self.checkpoints, "chk-");
                self.wait_running("one more checkpoint", |d| {
                    newest_complete(d, "chk-") > before
                });
                std::thread::sleep(Duration::from_millis(rng.below(self.interval_ms)));
            }
            Step::Kill => {
                if let Some(mut child) = self.child.take() {
                    child.kill().expect("SIGKILL kafka_sum");
                    let status = child.wait().expect("reap kafka_sum");
                    if status.signal() != Some(9) {
                        self.fail(&format!("run {} had ended on its own: {status}", self.runs));
                    }
                    self.note(format!("run {} killed with SIGKILL", self.runs));
                }
            }
            Step::SavepointTrigger => {
                if self.child.is_some() {
                    let before = newest_complete(&self.checkpoints, "sp-");
                    request_savepoint(&self.checkpoints, "savepoint");
                    self.wait_running("the savepoint", |d| newest_complete(d, "sp-") > before);
                }
            }
            Step::SavepointStop => self.stop(),
            Step::ResumeFromCopy { new_checkpoint_dir } => {
                let Some(sp) = self.stopped_with.clone() else {
                    return;
                };
                let copy = self.root.join(format!("copy-{}", self.runs));
                copy_dir(&sp, &copy);
                if new_checkpoint_dir {
                    self.checkpoints = self.root.join(format!("ck-{}", self.runs));
                }
                self.start(Some(&copy));
            }
            Step::Rescale(p) => {
                self.stop();
                self.parallelism = p;
                if self.stopped_with.is_some() {
                    self.start(None);
                }
            }
            Step::ChangePrefix => {
                self.stop();
                self.prefix = format!("{}-r{}", self.output_topic, self.runs);
                if self.stopped_with.is_some() {
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

    /// Produces the rest of the input, lets the job commit all of it, stops it, and checks.
    fn finish_and_check(mut self) {
        self.note("to the end");
        while self.produced < self.input.len() {
            self.produce_chunk();
        }
        if self.child.is_none() {
            self.start(None);
        }
        let want = self.input.len();
        let topic = self.output_topic.clone();
        // The job has caught up when at least every sum is committed and two more
        // checkpoints complete without adding any (the first one's commit is visible once
        // the second completes): then it has consumed all of its input.
        let deadline = std::time::Instant::now() + LIMIT * 2;
        loop {
            let before = read_all(&topic, "read_committed").len();
            for _ in 0..2 {
                let id = newest_complete(&self.checkpoints, "chk-");
                self.wait_running("a checkpoint", |d| newest_complete(d, "chk-") > id);
            }
            let after = read_all(&topic, "read_committed").len();
            if after >= want && after == before {
                break;
            }
            if std::time::Instant::now() > deadline {
                self.fail(&format!(
                    "the job did not catch up: {after} sums committed of {want} expected"
                ));
            }
        }
        self.stop();
        let expected = prefix_sums(&self.input);
        let got = committed_sums(&self.output_topic);
        let history = std::mem::take(&mut self.history);
        let check = std::panic::catch_unwind(|| assert_exactly_once(&expected, &got));
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

fn random_steps(rng: &mut Rng) -> Vec<Step> {
    let n = 6 + rng.below(4) as usize;
    (0..n)
        .map(|_| match rng.below(15) {
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
            13 => Step::ChangePrefix,
            _ => Step::PlainRestart,
        })
        .collect()
}

fn live(seed: u64, steps: &[Step]) {
    let mut life = Life::new(3_000, 6, seed);
    let mut rng = Rng::new(seed ^ 0x5EED);
    for &step in steps {
        life.apply(step, &mut rng);
    }
    life.finish_and_check();
}

/// A savepoint taken while the job runs with no periodic checkpoint yet, then `kill -9`,
/// then started again: the savepoint committed nothing, so the restart from scratch
/// writes every sum once.
#[test]
fn savepoint_then_kill_before_any_checkpoint() {
    let mut life = Life::new(2_000, 1, 301);
    // No periodic checkpoint within the test (a transaction must outlive the interval).
    life.interval_ms = 60_000;
    life.extra_args = vec!["--transaction-timeout-ms".into(), "120000".into()];
    life.produce_chunk();
    life.start(None);
    let topic = life.output_topic.clone();
    // Every sum written, inside the open transaction (read_uncommitted sees it).
    life.wait_running("every sum written", |_| {
        read_all(&topic, "read_uncommitted").len() >= 2_000
    });
    let mut rng = Rng::new(1);
    life.apply(Step::SavepointTrigger, &mut rng);
    life.apply(Step::Kill, &mut rng);
    life.interval_ms = 200;
    life.extra_args.clear();
    life.finish_and_check();
}

/// Stopped with a savepoint, resumed from a copy of it into a new checkpoint directory
/// under a new transactional-id prefix, at another parallelism.
#[test]
fn resume_a_copied_savepoint_elsewhere_under_a_new_prefix() {
    live(
        302,
        &[
            Step::RunAWhile,
            Step::RunAWhile,
            Step::SavepointStop,
            Step::Rescale(3),
            Step::ChangePrefix,
            Step::SavepointStop,
            Step::ResumeFromCopy {
                new_checkpoint_dir: true,
            },
            Step::RunAWhile,
        ],
    );
}

/// Random sequences of everything above.
#[test]
fn random_lifecycles_keep_every_sum_exactly_once() {
    let n = SEQUENCES
        * if std::env::var_os("WEIR_SOAK").is_some() {
            10
        } else {
            1
        };
    let mut rng = Rng::new(0x4AF4A);
    for i in 0..n {
        let seed = 400 + i as u64;
        let steps = random_steps(&mut rng);
        eprintln!("kafka lifecycle sequence {i} (seed {seed}): {steps:?}");
        live(seed, &steps);
    }
}
