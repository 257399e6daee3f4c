//! The job's log lines on a real process (`file_sum`): the default human format, the JSON
//! format for log collectors (`WEIR_LOG_FORMAT=json`) with its fields and spans, filtering
//! with `RUST_LOG`, and the errors for settings the subscriber cannot understand.
//!
//! Each run checkpoints only at the end of its input (interval 0), so the checkpoint ids
//! are known: the first run's final checkpoint is 1, and a second run over the same
//! directory resumes from it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const LINES: usize = 500;

/// An input of `LINES` lines over 5 keys, and the directories of one job.
struct Job {
    dir: tempfile::TempDir,
    input: PathBuf,
}

impl Job {
    fn new() -> Job {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.csv");
        let text: String = (0..LINES).map(|i| format!("k{},{i}\n", i % 5)).collect();
        std::fs::write(&input, text).unwrap();
        Job { dir, input }
    }

    fn checkpoints(&self) -> PathBuf {
        self.dir.path().join("ck")
    }

    /// Runs `file_sum` to its end with the log settings `env` (none inherited).
    fn run(&self, env: &[(&str, &str)]) -> Output {
        let mut c = Command::new(env!("CARGO_BIN_EXE_file_sum"));
        c.arg("--input")
            .arg(&self.input)
            .arg("--output")
            .arg(self.dir.path().join("out"))
            .arg("--checkpoint-dir")
            .arg(self.checkpoints())
            .args(["--checkpoint-interval-ms", "0", "--state", "memory"])
            .env_remove("RUST_LOG")
            .env_remove("WEIR_LOG_FORMAT")
            .env_remove("WEIR_FAILPOINTS")
            .stdin(Stdio::null());
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("start file_sum")
    }

    /// Runs `file_sum`, which must succeed; returns its standard error.
    fn run_ok(&self, env: &[(&str, &str)]) -> String {
        let out = self.run(env);
        let err = String::from_utf8(out.stderr).expect("UTF-8 on stderr");
        assert!(
            out.status.success(),
            "file_sum failed: {}\n{err}",
            out.status
        );
        err
    }
}

fn checkpoint_dir(root: &Path, id: u64) -> String {
    root.join(format!("chk-{id:020}")).display().to_string()
}

/// Every line of `stderr` as a JSON object, failing on any line that is not one.
fn json_lines(stderr: &str) -> Vec<serde_json::Value> {
    stderr
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}\nall of it:\n{stderr}"));
            assert!(v.is_object(), "not a JSON object: {l}");
            v
        })
        .collect()
}

/// The one event whose message starts with `start`.
fn event<'a>(events: &'a [serde_json::Value], start: &str) -> &'a serde_json::Value {
    let found: Vec<_> = events
        .iter()
        .filter(|e| {
            e["fields"]["message"]
                .as_str()
                .unwrap_or("")
                .starts_with(start)
        })
        .collect();
    assert_eq!(found.len(), 1, "events starting {start:?}: {found:#?}");
    found[0]
}

fn span_names(e: &serde_json::Value) -> Vec<&str> {
    e["spans"]
        .as_array()
        .unwrap_or_else(|| panic!("no span list in {e}"))
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect()
}

#[test]
fn json_logs_are_one_object_per_line_with_fields_and_spans() {
    let job = Job::new();
    let ck = job.checkpoints();
    let events = json_lines(&job.run_ok(&[("WEIR_LOG_FORMAT", "json")]));
    for e in &events {
        let ts = e["timestamp"].as_str().unwrap_or_else(|| panic!("{e}"));
        assert!(ts.len() > 20 && ts.ends_with('Z'), "timestamp {ts}");
        assert!(e["level"].is_string() && e["target"].is_string(), "{e}");
    }
    let done = event(&events, "job 'file_sum': final checkpoint 1 complete (");
    assert_eq!(done["level"], "INFO");
    // The module that logged: a detail of weir's layout, but always one of its crates.
    assert!(
        done["target"]
            .as_str()
            .unwrap()
            .starts_with("weir_runtime::job"),
        "{done}"
    );
    assert_eq!(done["fields"]["job"], "file_sum");
    assert_eq!(done["fields"]["checkpoint"], 1);
    assert_eq!(done["fields"]["path"], checkpoint_dir(&ck, 1));
    assert!(done["fields"]["bytes"].as_u64().unwrap() > 0, "{done}");
    assert_eq!(
        done["span"],
        serde_json::json!({"name": "checkpoint", "id": 1, "kind": "final"})
    );
    assert_eq!(span_names(done), ["job", "attempt", "checkpoint"]);
    assert_eq!(done["spans"][0]["job"], "file_sum");
    assert_eq!(done["spans"][1]["attempt"], 0);
    let end = event(&events, &format!("done, {LINES} lines read in "));
    assert_eq!(end["target"], "file_sum");
    assert_eq!(end["fields"]["lines"], LINES);
    assert_eq!(events.len(), 2, "{events:#?}");

    // The second run resumes from checkpoint 1 (the end of the input), inside its restore span.
    let events = json_lines(&job.run_ok(&[("WEIR_LOG_FORMAT", "json")]));
    let resume = event(
        &events,
        "job 'file_sum' had already finished: resuming after its end",
    );
    assert_eq!(resume["level"], "INFO");
    assert_eq!(resume["fields"]["checkpoint"], 1);
    assert_eq!(resume["fields"]["kind"], "final");
    assert_eq!(resume["fields"]["path"], checkpoint_dir(&ck, 1));
    assert_eq!(
        resume["span"],
        serde_json::json!({"name": "restore", "checkpoint": 1, "path": checkpoint_dir(&ck, 1)})
    );
    assert_eq!(span_names(resume), ["job", "attempt", "restore"]);
    let done = event(&events, "job 'file_sum': final checkpoint 2 complete (");
    assert_eq!(done["fields"]["checkpoint"], 2);
    assert_eq!(done["span"]["id"], 2);
}

#[test]
fn the_default_format_is_one_human_line_per_event() {
    let job = Job::new();
    let err = job.run_ok(&[]);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    // TIME LEVEL [TAG] MESSAGE, the time in UTC (RFC 3339).
    let (time, rest) = lines[0].split_once(' ').unwrap();
    assert!(
        time.starts_with("20") && time.ends_with('Z'),
        "{}",
        lines[0]
    );
    let bytes_and_more = rest
        .strip_prefix(" INFO [weir] job 'file_sum': final checkpoint 1 complete (")
        .unwrap_or_else(|| panic!("{}", lines[0]));
    // The path is not in the message, so the line shows it as a field.
    assert!(
        bytes_and_more.ends_with(&format!(
            " ms) path={}",
            checkpoint_dir(&job.checkpoints(), 1)
        )),
        "{}",
        lines[0]
    );
    let (_, rest) = lines[1].split_once(' ').unwrap();
    assert!(
        rest.starts_with(&format!(" INFO [file_sum] done, {LINES} lines read in ")),
        "{}",
        lines[1]
    );
    assert!(
        !lines[1].contains("lines="),
        "the message shows it: {}",
        lines[1]
    );

    let err = job.run_ok(&[]);
    let resume = format!(
        " INFO [weir] job 'file_sum' had already finished: resuming after its end (final \
         checkpoint 1, {}); sources that had reached their end read nothing more. To process \
         the input again, give the job a new checkpoint directory.",
        checkpoint_dir(&job.checkpoints(), 1)
    );
    assert!(
        err.lines().any(|l| l.split_once(' ').unwrap().1 == resume),
        "no line{resume:?} in\n{err}"
    );
}

#[test]
fn rust_log_filters_the_lines() {
    let job = Job::new();
    // Nothing goes wrong: no warning, so nothing at all.
    assert_eq!(job.run_ok(&[("RUST_LOG", "warn")]), "");
    // weir's lines only, not the program's.
    let err = job.run_ok(&[("RUST_LOG", "warn,weir=info")]);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(
        lines[0].contains(" INFO [weir] job 'file_sum' had already finished"),
        "{err}"
    );
    // The checksums of the resumed checkpoint, read while the job ran: before the next
    // checkpoint completes, which waits for them.
    assert!(
        lines[1].contains(" INFO [weir] the files of restored checkpoint 1 verified in "),
        "{err}"
    );
    assert!(
        lines[2].contains(" INFO [weir] job 'file_sum': final checkpoint 2 complete ("),
        "{err}"
    );
    // Debug lines of one crate: the checkpoint's trigger.
    let err = job.run_ok(&[("RUST_LOG", "weir_runtime=debug")]);
    assert!(
        err.contains(" DEBUG [weir] job 'file_sum': final checkpoint 3 triggered"),
        "{err}"
    );
}

#[test]
fn log_settings_it_cannot_understand_are_refused() {
    let job = Job::new();
    let out = job.run(&[("WEIR_LOG_FORMAT", "xml")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(
            "invalid configuration: WEIR_LOG_FORMAT='xml' is not a log format: use 'human' \
             (the default) or 'json'"
        ),
        "{err}"
    );
    let out = job.run(&[("RUST_LOG", "weir=loud")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("RUST_LOG='weir=loud' is not a log filter")
            && err.contains("such as 'warn,weir=info,weir_kafka=debug'"),
        "{err}"
    );
    // Nothing ran: no checkpoint was written.
    assert!(!job.checkpoints().join(format!("chk-{:020}", 1)).exists());
}
