//! Running `file_sum` as a child process and checking its committed output.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub use weir_tests::Rng;

/// One chaos scenario: an input file, an output and a checkpoint directory.
pub struct Scenario {
    /// Keeps the scenario's files alive.
    pub _dir: tempfile::TempDir,
    pub input: PathBuf,
    pub output: PathBuf,
    pub checkpoints: PathBuf,
    /// Expected running sums per key, in input order.
    pub expected: BTreeMap<String, Vec<i64>>,
    /// More `file_sum` flags, given to every run.
    pub extra_args: Vec<String>,
}

impl Scenario {
    /// Writes `lines` random `key,value` lines over `keys` keys (values 1..=1000, so every
    /// key's prefix sums are strictly increasing and distinct).
    pub fn new(lines: usize, keys: u64, seed: u64) -> Scenario {
        let dir = tempfile::tempdir().expect("temp dir");
        let input = dir.path().join("input.csv");
        let mut rng = Rng::new(seed);
        let mut text = String::new();
        let mut sums: BTreeMap<String, i64> = BTreeMap::new();
        let mut expected: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for _ in 0..lines {
            let key = format!("key-{}", rng.below(keys));
            let value = 1 + rng.below(1000) as i64;
            text.push_str(&format!("{key},{value}\n"));
            let s = sums.entry(key.clone()).or_default();
            *s += value;
            expected.entry(key).or_default().push(*s);
        }
        std::fs::write(&input, text).expect("write input");
        let output = dir.path().join("out");
        let checkpoints = dir.path().join("ck");
        Scenario {
            _dir: dir,
            input,
            output,
            checkpoints,
            expected,
            extra_args: Vec::new(),
        }
    }

    /// The `file_sum` command for this scenario.
    pub fn command(&self, parallelism: usize, max_rate: Option<u64>, interval_ms: u64) -> Command {
        self.command_in(&self.checkpoints, parallelism, max_rate, interval_ms)
    }

    /// The `file_sum` command for this scenario, checkpointing into `checkpoints`.
    pub fn command_in(
        &self,
        checkpoints: &Path,
        parallelism: usize,
        max_rate: Option<u64>,
        interval_ms: u64,
    ) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_file_sum"));
        c.arg("--input")
            .arg(&self.input)
            .arg("--output")
            .arg(&self.output)
            .arg("--checkpoint-dir")
            .arg(checkpoints)
            .arg("--checkpoint-interval-ms")
            .arg(interval_ms.to_string())
            .arg("--parallelism")
            .arg(parallelism.to_string())
            .env_remove("WEIR_FAILPOINTS")
            // The tests read the default human log lines.
            .env_remove("RUST_LOG")
            .env_remove("WEIR_LOG_FORMAT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(r) = max_rate {
            c.arg("--max-rate").arg(r.to_string());
        }
        c.args(&self.extra_args);
        c
    }

    /// Starts `file_sum` (at 10,000 lines/s, checkpoints every 50 ms, with `env` added to
    /// its environment) `runs` times and SIGKILLs each run a random `from..from + spread`
    /// milliseconds into it, unless it ended by then (it must have succeeded). Returns the
    /// moments the kills landed.
    pub fn kill_at_random_moments(
        &self,
        parallelism: usize,
        runs: usize,
        (from, spread): (u64, u64),
        rng: &mut Rng,
        env: &[(String, String)],
    ) -> Vec<std::time::SystemTime> {
        use std::os::unix::process::ExitStatusExt;
        let mut kills = Vec::new();
        for _ in 0..runs {
            let mut child = self
                .command(parallelism, Some(10_000), 50)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .spawn()
                .expect("start file_sum");
            std::thread::sleep(std::time::Duration::from_millis(from + rng.below(spread)));
            let status = match child.try_wait().expect("poll file_sum") {
                Some(status) => status,
                None => {
                    child.kill().expect("SIGKILL file_sum");
                    let status = child.wait().expect("reap file_sum");
                    if status.signal() == Some(9) {
                        kills.push(std::time::SystemTime::now());
                        continue;
                    }
                    status
                }
            };
            // It ended on its own, before the poll or between the poll and the kill (a run
            // that only had the end of the input left): that must be a success.
            let err = stderr_of(&mut child);
            assert!(
                status.success(),
                "file_sum failed on its own: {status}\n{err}"
            );
        }
        kills
    }

    /// Runs `file_sum` to completion (no faults) and asserts it exits 0.
    pub fn run_to_end(&self, parallelism: usize) {
        let out = self
            .command(parallelism, None, 100)
            .output()
            .expect("start file_sum");
        assert!(
            out.status.success(),
            "file_sum failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Moves the committed output of checkpoints from `from` on out of the output directory,
    /// as an operator who accepts that it is produced again does (next to the checkpoint
    /// directory, in `moved`).
    pub fn move_output_from(&self, from: u64) {
        let moved = self.checkpoints.with_file_name("moved");
        std::fs::create_dir_all(&moved).expect("a place for moved output");
        for e in std::fs::read_dir(&self.output).expect("output").flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let of = name
                .strip_prefix("part-")
                .and_then(|n| n.split_once('-'))
                .and_then(|(_, id)| id.parse::<u64>().ok());
            if of.is_some_and(|id| id >= from) {
                std::fs::rename(e.path(), moved.join(&name)).expect("move output");
            }
        }
    }

    /// Checks the committed output against the input: exactly the prefix sums per key,
    /// each once, and no uncommitted file left behind (the records of who owned the
    /// directory, `.weir-owner-…`, stay).
    pub fn check(&self) {
        for entry in std::fs::read_dir(&self.output).expect("output dir") {
            let name = entry.expect("dir entry").file_name();
            let name = name.to_string_lossy();
            assert!(
                !name.starts_with('.') || name.starts_with(".weir-owner-"),
                "an uncommitted file is left after a completed run: {name}"
            );
        }
        self.check_committed();
    }

    /// Checks the committed output against the input (exactly the prefix sums per key,
    /// each once), ignoring uncommitted files (a process cut off from its cluster may
    /// leave some behind).
    pub fn check_committed(&self) {
        let mut parts = Vec::new();
        for entry in std::fs::read_dir(&self.output).expect("output dir") {
            let entry = entry.expect("dir entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let text = std::fs::read_to_string(entry.path()).expect("read part file");
            parts.push((name, text));
        }
        self.check_parts(parts);
    }

    /// Checks the full history of every key: the committed files, read in the order of
    /// the checkpoints that committed them (`part-<subtask>-<checkpoint>`), hold each key's
    /// running sums exactly in input order, each once. A key's records go through one
    /// subtask at a time, so this holds across restarts and rescales. Also asserts that
    /// no uncommitted file is left (the run finished).
    pub fn check_history(&self) {
        self.check();
        let mut parts: Vec<((u64, u64), std::path::PathBuf)> = Vec::new();
        for entry in std::fs::read_dir(&self.output).expect("output dir") {
            let entry = entry.expect("dir entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let order = name
                .strip_prefix("part-")
                .and_then(|n| n.split_once('-'))
                .and_then(|(w, c)| Some((c.parse::<u64>().ok()?, w.parse::<u64>().ok()?)))
                .unwrap_or_else(|| panic!("unexpected committed file {name}"));
            parts.push((order, entry.path()));
        }
        parts.sort();
        let mut got: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for (_, path) in parts {
            let text = std::fs::read_to_string(&path).expect("read part file");
            for line in text.lines() {
                let (k, v) = line.split_once(',').expect("key,sum");
                got.entry(k.to_string())
                    .or_default()
                    .push(v.parse().expect("sum"));
            }
        }
        for (key, want) in &self.expected {
            let have = &got[key];
            let at = want.iter().zip(have).position(|(a, b)| a != b);
            assert!(
                at.is_none() && have.len() == want.len(),
                "key {key}: its committed history differs from the input's running sums at \
                 #{} (expected {:?}, committed {:?}; {} expected, {} committed)",
                at.unwrap_or(want.len().min(have.len())),
                at.map(|i| want[i]),
                at.map(|i| have[i]),
                want.len(),
                have.len()
            );
        }
    }

    /// Checks committed parts, as `(name, text)`, against the input (exactly the prefix
    /// sums per key, each once), wherever they were read from.
    pub fn check_parts(&self, parts: Vec<(String, String)>) {
        let mut got: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for (name, text) in parts {
            for line in text.lines() {
                let (k, v) = line
                    .split_once(',')
                    .unwrap_or_else(|| panic!("bad output line {line:?} in {name}"));
                got.entry(k.to_string())
                    .or_default()
                    .push(v.parse().expect("sum"));
            }
        }
        assert_eq!(
            got.keys().collect::<BTreeSet<_>>(),
            self.expected.keys().collect::<BTreeSet<_>>(),
            "the output has a different set of keys than the input"
        );
        for (key, want) in &self.expected {
            let mut have = got[key].clone();
            have.sort_unstable();
            let dupes = have.windows(2).filter(|w| w[0] == w[1]).count();
            let have_set: BTreeSet<i64> = have.iter().copied().collect();
            let missing = want.iter().filter(|s| !have_set.contains(s)).count();
            assert!(
                dupes == 0 && missing == 0 && have.len() == want.len(),
                "key {key}: {dupes} duplicated and {missing} missing sums ({} committed, {} expected)",
                have.len(),
                want.len()
            );
        }
    }
}

pub use weir_tests::{stderr_of, wait_within};

pub use weir_tests::wait_for;

/// True when `dir` holds at least one complete checkpoint.
pub fn has_complete_checkpoint(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten().any(|e| {
                e.file_name().to_string_lossy().starts_with("chk-")
                    && e.path().join("_metadata").exists()
            })
        })
        .unwrap_or(false)
}

/// An example other than `file_sum` set up for chaos runs: its input file, its output and
/// checkpoint directories, and the flags every run gives it (checkpoints every 40 ms).
pub struct ExampleRun {
    /// Keeps the run's files alive.
    _dir: tempfile::TempDir,
    name: &'static str,
    binary: &'static str,
    pub input: PathBuf,
    pub output: PathBuf,
    pub checkpoints: PathBuf,
    args: Vec<String>,
}

impl ExampleRun {
    /// Writes `text` to the input file `input_name`; `binary` is the example's
    /// `CARGO_BIN_EXE_...`, `args` the flags it gets besides input, output, checkpoints and
    /// parallelism.
    pub fn new(
        name: &'static str,
        binary: &'static str,
        input_name: &str,
        text: &str,
        args: &[&str],
    ) -> ExampleRun {
        let dir = tempfile::tempdir().expect("temp dir");
        let input = dir.path().join(input_name);
        std::fs::write(&input, text).expect("write input");
        ExampleRun {
            name,
            binary,
            input,
            output: dir.path().join("out"),
            checkpoints: dir.path().join("ck"),
            args: args.iter().map(|a| a.to_string()).collect(),
            _dir: dir,
        }
    }

    /// The example's command at `parallelism`, its reader throttled to `max_rate` lines/s.
    pub fn command(&self, parallelism: usize, max_rate: Option<u64>) -> Command {
        let mut c = Command::new(self.binary);
        c.arg("--input")
            .arg(&self.input)
            .arg("--output")
            .arg(&self.output)
            .arg("--checkpoint-dir")
            .arg(&self.checkpoints)
            .args(["--checkpoint-interval-ms", "40"])
            .arg("--parallelism")
            .arg(parallelism.to_string())
            .args(&self.args)
            .env_remove("WEIR_FAILPOINTS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(r) = max_rate {
            c.arg("--max-rate").arg(r.to_string());
        }
        c
    }

    /// Runs the example to its end (a minute at most); it must succeed. Returns its log
    /// (standard error).
    pub fn run_to_end(&self, parallelism: usize) -> String {
        let mut child = self
            .command(parallelism, None)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.name));
        let limit = std::time::Duration::from_secs(60);
        let (status, err) = weir_tests::wait_reading_output(&mut child, limit);
        let Some(status) = status else {
            let lines: Vec<&str> = err.lines().collect();
            panic!(
                "{} did not end within {limit:?}; the end of its log:\n{}",
                self.name,
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        };
        assert!(status.success(), "{} failed: {status}\n{err}", self.name);
        err
    }
}

pub use weir_tests::harness::{Checkpoints, kill_at_random};

/// How many times the soak mode multiplies the kills.
pub fn soak_factor() -> usize {
    if std::env::var_os("WEIR_SOAK").is_some() {
        10
    } else {
        1
    }
}

/// The id of the newest complete checkpoint in `dir`.
pub fn latest_checkpoint(dir: &Path) -> Option<u64> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.path().join("_metadata").exists())
        .filter_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_prefix("chk-")
                .and_then(|n| n.parse().ok())
        })
        .max()
}

/// The checkpoint id of the newest committed output file (`part-<w>-<id>`) in `output`.
pub fn newest_committed_output(output: &Path) -> Option<u64> {
    std::fs::read_dir(output)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("part-")?
                .split_once('-')?
                .1
                .parse::<u64>()
                .ok()
        })
        .max()
}

impl Scenario {
    /// After a run to the end: damages, with `damage`, every retained checkpoint from the
    /// one that committed the newest output on (the final checkpoint may have committed
    /// nothing, if the last records went out just before it), so that a restore falls back
    /// past output already committed. `damage` gets a checkpoint directory and returns the
    /// file it changed; the newest such file is returned.
    pub fn damage_from_newest_output(&self, mut damage: impl FnMut(&Path) -> PathBuf) -> PathBuf {
        let newest = latest_checkpoint(&self.checkpoints).expect("a checkpoint");
        let from = newest_committed_output(&self.output).expect("committed output");
        let mut newest_damaged = None;
        for id in (from..=newest).rev() {
            let dir = self.checkpoints.join(format!("chk-{id:020}"));
            if dir.join("_metadata").exists() {
                newest_damaged.get_or_insert(damage(&dir));
            }
        }
        newest_damaged.expect("the checkpoint of the newest output is retained")
    }
}

/// Every committed line in `dir` (files not starting with a dot), sorted; asserts that no
/// uncommitted file is left when `complete` (the run finished).
pub fn committed_lines(dir: &Path, complete: bool) -> Vec<String> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).expect("output dir") {
        let entry = entry.expect("dir entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            assert!(
                !complete || name.starts_with(".weir-owner-"),
                "an uncommitted file is left after a completed run: {name}"
            );
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).expect("read part file");
        lines.extend(text.lines().map(str::to_string));
    }
    lines.sort_unstable();
    lines
}

/// The position of the first line of `log` containing `what`.
pub fn line_of(log: &str, what: &str) -> usize {
    log.lines()
        .position(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no line says {what:?}:\n{log}"))
}
