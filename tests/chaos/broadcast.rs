//! Broadcast state through crashes: `rules_alerts` (alert rules broadcast to a keyed
//! operator whose readings wait in keyed state for the watermark) is killed with SIGKILL
//! mid-run and resumed — at the same parallelism (2 → 2), then at others (→ 3 → 1) — and
//! its committed alerts must be exactly those of a plain-Rust model of the rules, which an
//! uninterrupted run must match too. Every checkpoint holds one copy of the broadcast
//! state, whatever the parallelism.

use crate::event_time::difference;
use crate::harness::{Rng, committed_lines, latest_checkpoint, stderr_of, wait_within};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How far readings come out of order (the example's default `--max-delay`).
const MAX_DELAY: i64 = 5;
const READINGS: usize = 3_000;
const RULES: usize = 120;
/// Readings per second: the whole file takes about 2 s.
const READINGS_RATE: u64 = 1_500;

/// A reading (ts, sensor, value) and a rule (ts, sensor, threshold or off).
type Reading = (i64, String, i64);
type Rule = (i64, String, Option<i64>);

/// Readings `ts,sensor,value` over 8 sensors, out of order by up to `MAX_DELAY`, and rules
/// `ts,sensor,threshold|off` spread over the same time, in order.
fn input(seed: u64) -> (Vec<Reading>, Vec<Rule>) {
    let mut rng = Rng::new(seed);
    let mut t = 0i64;
    let readings: Vec<_> = (0..READINGS)
        .map(|_| {
            t += rng.below(3) as i64;
            let ts = t - rng.below(MAX_DELAY as u64 + 1) as i64;
            (ts, format!("s{}", rng.below(8)), rng.below(1_000) as i64)
        })
        .collect();
    let end = t;
    let mut rules: Vec<_> = (0..RULES)
        .map(|_| {
            let ts = rng.below(end as u64) as i64;
            let threshold = (rng.below(10) != 0).then(|| 500 + rng.below(500) as i64);
            (ts, format!("s{}", rng.below(8)), threshold)
        })
        .collect();
    rules.sort_by_key(|r| r.0); // stable: lines of one time keep their order
    (readings, rules)
}

/// The alerts, the plain way: per reading, the last rule of its sensor from its time or
/// before (a later line wins at equal times); an alert when the value is above it.
fn model(readings: &[Reading], rules: &[Rule]) -> Vec<String> {
    let mut history: BTreeMap<&str, Vec<(i64, Option<i64>)>> = BTreeMap::new();
    for (ts, sensor, threshold) in rules {
        history.entry(sensor).or_default().push((*ts, *threshold));
    }
    let mut alerts: Vec<String> = readings
        .iter()
        .filter_map(|(ts, sensor, v)| {
            let limit = history
                .get(sensor.as_str())?
                .iter()
                .rfind(|(from, _)| from <= ts)?
                .1?;
            (*v > limit).then(|| format!("{ts},{sensor},{v},{limit}"))
        })
        .collect();
    alerts.sort_unstable();
    alerts
}

/// Input files with output and checkpoint directories for `rules_alerts`.
struct Run {
    _dir: tempfile::TempDir,
    readings: PathBuf,
    rules: PathBuf,
    output: PathBuf,
    checkpoints: PathBuf,
}

impl Run {
    fn new(readings: &[Reading], rules: &[Rule]) -> Run {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = |name: &str| dir.path().join(name);
        let text: String = readings
            .iter()
            .map(|(ts, s, v)| format!("{ts},{s},{v}\n"))
            .collect();
        std::fs::write(path("readings.csv"), text).expect("write readings");
        let text: String = rules
            .iter()
            .map(|(ts, s, t)| match t {
                Some(t) => format!("{ts},{s},{t}\n"),
                None => format!("{ts},{s},off\n"),
            })
            .collect();
        std::fs::write(path("rules.csv"), text).expect("write rules");
        Run {
            readings: path("readings.csv"),
            rules: path("rules.csv"),
            output: path("out"),
            checkpoints: path("ck"),
            _dir: dir,
        }
    }

    fn start(&self, parallelism: usize, throttled: bool) -> Child {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rules_alerts"));
        c.arg("--readings")
            .arg(&self.readings)
            .arg("--rules")
            .arg(&self.rules)
            .arg("--output")
            .arg(&self.output)
            .arg("--checkpoint-dir")
            .arg(&self.checkpoints)
            .args(["--checkpoint-interval-ms", "40"])
            .args(["--parallelism", &parallelism.to_string()])
            .args(["--state", "rocksdb"])
            .env_remove("WEIR_FAILPOINTS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if throttled {
            // Rules at the pace of the readings, so kills land between rule changes too.
            let rules_rate = (RULES as u64 * READINGS_RATE).div_ceil(READINGS as u64);
            c.args(["--readings-rate", &READINGS_RATE.to_string()])
                .args(["--rules-rate", &rules_rate.to_string()]);
        }
        c.spawn().expect("start rules_alerts")
    }

    fn run_to_end(&self, parallelism: usize) {
        let mut child = self.start(parallelism, false);
        let status = wait_within(&mut child, Duration::from_secs(60));
        let err = stderr_of(&mut child);
        assert!(status.success(), "rules_alerts failed: {status}\n{err}");
    }

    /// Starts a throttled run, waits (polling, with a deadline) until it has completed two
    /// more checkpoints than there were, and kills it with SIGKILL while it still runs.
    fn run_and_kill(&self, parallelism: usize) {
        let before = latest_checkpoint(&self.checkpoints).unwrap_or(0);
        let mut child = self.start(parallelism, true);
        let deadline = Instant::now() + Duration::from_secs(30);
        while latest_checkpoint(&self.checkpoints).unwrap_or(0) < before + 2 {
            if let Some(status) = child.try_wait().expect("poll rules_alerts") {
                let err = stderr_of(&mut child);
                panic!("rules_alerts ended before it could be killed: {status}\n{err}");
            }
            assert!(Instant::now() < deadline, "no checkpoint within 30 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        child.kill().expect("SIGKILL rules_alerts");
        let status = child.wait().expect("reap rules_alerts");
        assert_eq!(
            status.signal(),
            Some(9),
            "rules_alerts ended by itself before the kill: {status}\n{}",
            stderr_of(&mut child)
        );
    }

    fn committed(&self, complete: bool) -> Vec<String> {
        if self.output.exists() {
            committed_lines(&self.output, complete)
        } else {
            Vec::new()
        }
    }
}

/// The broadcast state descriptions of the alert operator's subtasks in the newest
/// checkpoint (`None` for a subtask that stored no copy).
fn broadcast_copies(checkpoints: &Path) -> Vec<Option<String>> {
    let id = latest_checkpoint(checkpoints).expect("a checkpoint");
    let path = checkpoints.join(format!("chk-{id:020}")).join("_metadata");
    let text = std::fs::read_to_string(&path).expect("read _metadata");
    let manifest: serde_json::Value = serde_json::from_str(&text).expect("parse _metadata");
    let alerts = manifest["operators"]
        .as_array()
        .expect("operators")
        .iter()
        .find(|op| op["uid"] == "alerts")
        .expect("the alert operator in the checkpoint");
    alerts["subtasks"]
        .as_array()
        .expect("subtasks")
        .iter()
        .map(|st| st["operator_state"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn sigkill_and_rescale_keep_broadcast_rules_and_alerts_exact() {
    let (readings, rules) = input(34);
    let expected = model(&readings, &rules);
    // Rules switch alerts on, change thresholds and switch them off over the run.
    assert!(expected.len() > 300, "only {} alerts", expected.len());
    assert!(rules.iter().any(|r| r.2.is_none()));

    let uninterrupted = Run::new(&readings, &rules);
    uninterrupted.run_to_end(2);
    let got = uninterrupted.committed(true);
    let diff = difference("alerts", &got, &expected);
    assert!(
        diff.is_empty(),
        "an uninterrupted run differs from the model: {diff}"
    );

    let chaos = Run::new(&readings, &rules);
    for parallelism in [2, 2, 3] {
        chaos.run_and_kill(parallelism);
        // One copy of the broadcast state per checkpoint, by whichever parallelism ran.
        let copies = broadcast_copies(&chaos.checkpoints);
        assert_eq!(copies.len(), parallelism);
        let stored: Vec<&String> = copies.iter().flatten().collect();
        assert_eq!(stored.len(), 1, "copies of the broadcast state: {copies:?}");
        let entries: usize = stored[0]
            .strip_prefix("broadcast state (rules: ")
            .and_then(|rest| rest.strip_suffix(" entries)"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("not a broadcast state: {}", stored[0]));
        // The resumed run depends on the restored rules: its input holds no earlier ones.
        assert!(entries > 0, "the checkpoint's broadcast state is empty");
    }
    chaos.run_to_end(1);
    let got = chaos.committed(true);
    let diff = difference("alerts", &got, &expected);
    assert!(
        diff.is_empty(),
        "killed and resumed at parallelism 2, 2, 3 and 1, the job committed other alerts: {diff}"
    );
}

#[test]
fn a_malformed_rule_fails_the_job_naming_the_line() {
    let readings = vec![(1, "s1".to_string(), 10)];
    let run = Run::new(&readings, &[]);
    std::fs::write(&run.rules, "0,s1,5\n3,s1,high\n").expect("write rules");
    let mut child = run.start(2, false);
    let status = wait_within(&mut child, Duration::from_secs(60));
    let err = stderr_of(&mut child);
    assert!(!status.success(), "a malformed rule was accepted");
    assert!(
        err.contains(r#"expected `ts,sensor,threshold` (an integer or `off`), got "3,s1,high""#),
        "{err}"
    );
}
