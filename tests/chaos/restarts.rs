//! Restart strategies over a job's life: failures injected at chosen records of a job that
//! reads at a fixed rate, so they are spread over time (each after a stable period) or come
//! in a burst. The job runs in a child process (this test binary, started again for one
//! case), so the test sees what a user sees: the exit, the log lines on standard error and
//! the committed output.
//!
//! - Under the default strategy, five failures spread over time are all restarted and the
//!   committed output is exact (the old limit of 3 restarts per run ended the job).
//! - An exponential delay that allows 1 restart in a row survives the same five failures,
//!   since each stable period resets its count, and gives up on a burst of 2, saying so.
//! - A failure rate of 1 per 300 ms survives them too; one of 2 per 10 s gives up on a
//!   burst of 3, saying which strategy gave up and why.
//! - A malformed record (a failure a restart would run into again) fails the job at once.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use weir::RestartStrategy;
use weir::prelude::*;

/// Lines of input; the job reads them at [`RATE`] lines per second.
const LINES: usize = 8_000;
const RATE: u64 = 2_000;
const KEYS: usize = 10;
/// Records that fail once each, 1,500 lines apart: after a restart the job reads at least
/// those lines again before the next failure, so every failure comes after at least 0.75 s
/// of running (the reader cannot go faster than [`RATE`]).
const SPREAD: [usize; 5] = [1_500, 3_000, 4_500, 6_000, 7_500];
/// The case variable that makes this binary run one job instead of the tests.
const CASE: &str = "WEIR_RESTART_CASE";

/// One scenario: the strategy, the records that fail (once each), and whether their
/// failure is one a restart would run into again.
fn case(name: &str) -> (RestartStrategy, Vec<usize>, bool) {
    let ms = Duration::from_millis;
    let limited = RestartStrategy::ExponentialDelay(weir::ExponentialDelay {
        max_attempts: Some(1),
        reset_threshold: ms(500),
        ..weir::ExponentialDelay::default()
    });
    match name {
        "default-spread" => (RestartStrategy::default(), SPREAD.to_vec(), false),
        "exponential-spread" => (limited, SPREAD.to_vec(), false),
        // The second failure comes right after the restart, once the job has read again
        // the lines since its last checkpoint (50 ms apart): well within 500 ms.
        "exponential-burst" => (limited, vec![3_000, 3_001], false),
        "rate-spread" => (
            RestartStrategy::failure_rate(1, ms(300), ms(10)),
            SPREAD.to_vec(),
            false,
        ),
        "rate-burst" => (
            RestartStrategy::failure_rate(2, ms(10_000), ms(10)),
            vec![3_000, 3_001, 3_002],
            false,
        ),
        "deterministic" => (RestartStrategy::default(), vec![1_000], true),
        other => panic!("unknown case {other}"),
    }
}

/// Key and value of line `i`.
fn line(i: usize) -> (usize, i64) {
    (i % KEYS, (i * 7 % 13) as i64 + 1)
}

/// Run by a child process only (see [`run_case`]): the job of one case, in the directory
/// `WEIR_RESTART_DIR`; writes how it ended to the file `result` there.
#[test]
#[ignore = "the restart tests run it in a child process"]
fn restart_case_job() {
    let name = std::env::var(CASE).expect("run by the restart tests");
    let dir = std::path::PathBuf::from(std::env::var("WEIR_RESTART_DIR").expect("dir"));
    let (strategy, failures, deterministic) = case(&name);
    let input = dir.join("in.csv");
    let text: String = (0..LINES)
        .map(|i| {
            let (k, v) = line(i);
            format!("{i},{k},{v}\n")
        })
        .collect();
    std::fs::write(&input, text).expect("write input");
    let mut ck = CheckpointConfig::new(dir.join("ck")).interval(Duration::from_millis(50));
    ck.restart = strategy;
    let env = Env::new().parallelism(2).checkpoints(ck);
    let failures = Arc::new(failures);
    let next = Arc::new(AtomicUsize::new(0));
    env.read_text_file_at_rate(&input, RATE)
        .parallelism(1)
        .uid("source")
        .try_map(move |l: String| {
            let mut parts = l.split(',').map(|p| p.parse::<i64>().expect("number"));
            let (i, k, v) = (parts.next(), parts.next(), parts.next());
            let (i, k, v) = (i.expect("i") as usize, k.expect("k"), v.expect("v"));
            let n = next.load(Ordering::SeqCst);
            if failures.get(n) == Some(&i) {
                next.fetch_add(1, Ordering::SeqCst);
                return Err(if deterministic {
                    Error::Malformed(format!("injected bad record {i}"))
                } else {
                    Error::user(format!("injected failure at record {i}"))
                });
            }
            Ok((k, v))
        })
        .name("parse")
        .parallelism(1)
        .key_by(|(k, _)| *k)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .uid("sums")
        .write_text_exactly_once(dir.join("out"), |(k, s)| format!("{k},{s}"))
        .uid("sink");
    let result = match env.execute("restarts") {
        Ok(r) => format!("restarts={}", r.restarts),
        Err(e) => format!("failed: {e}"),
    };
    std::fs::write(dir.join("result"), result).expect("write the result");
}

/// What a case's run showed.
struct Run {
    /// `restarts=N` or `failed: ERROR`.
    result: String,
    stderr: String,
    /// Committed sums per key, sorted.
    output: BTreeMap<usize, Vec<i64>>,
}

/// Runs case `name` in a child process and collects what it left.
fn run_case(name: &str) -> Run {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "restarts::restart_case_job",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CASE, name)
        .env("WEIR_RESTART_DIR", dir.path())
        .env_remove("WEIR_FAILPOINTS")
        .output()
        .expect("start the job's process");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let result = std::fs::read_to_string(dir.path().join("result"))
        .unwrap_or_else(|e| panic!("case {name} left no result ({e}):\n{stdout}\n{stderr}"));
    let mut output: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(dir.path().join("out")) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            for l in std::fs::read_to_string(e.path())
                .expect("part file")
                .lines()
            {
                let (k, s) = l.split_once(',').expect("key,sum");
                output
                    .entry(k.parse().expect("key"))
                    .or_default()
                    .push(s.parse().expect("sum"));
            }
        }
    }
    for sums in output.values_mut() {
        sums.sort_unstable();
    }
    Run {
        result,
        stderr,
        output,
    }
}

/// Every key's running sums, each once.
fn expected() -> BTreeMap<usize, Vec<i64>> {
    let mut sums = [0i64; KEYS];
    let mut out: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
    for i in 0..LINES {
        let (k, v) = line(i);
        sums[k] += v;
        out.entry(k).or_default().push(sums[k]);
    }
    out
}

/// The job restarted after each of the five spread failures and its output is exact.
fn assert_survived_five(run: &Run, name: &str) {
    assert_eq!(run.result, "restarts=5", "{name}:\n{}", run.stderr);
    for i in SPREAD {
        let line =
            format!("injected failure at record {i}; restarting from the last complete checkpoint");
        assert!(
            run.stderr.contains(&line),
            "{name}: no {line:?} in\n{}",
            run.stderr
        );
    }
    assert!(
        run.output == expected(),
        "{name}: the committed output is not exact"
    );
}

#[test]
fn the_default_strategy_restarts_five_failures_spread_over_time() {
    let run = run_case("default-spread");
    assert_survived_five(&run, "default-spread");
    // Less than the default's 10 minutes apart: five restarts in a row, 100 ms to 1.6 s.
    assert!(
        run.stderr
            .contains("(restart 5; exponential delay: restart 5 in a row;"),
        "{}",
        run.stderr
    );
}

#[test]
fn exponential_delay_resets_its_count_after_each_stable_period() {
    let run = run_case("exponential-spread");
    assert_survived_five(&run, "exponential-spread");
    assert!(
        run.stderr
            .contains("(restart 5; exponential delay: restart 1 of 1 in a row;"),
        "{}",
        run.stderr
    );
}

#[test]
fn exponential_delay_gives_up_on_a_burst_past_its_limit() {
    let run = run_case("exponential-burst");
    assert_eq!(
        run.result,
        "failed: operator 'parse' (subtask 1/1) failed: injected failure at record 3001"
    );
    let want = "[weir] job 'restarts' failed after 1 restart: operator 'parse' (subtask 1/1) \
                failed: injected failure at record 3001; not restarting: the exponential-delay \
                strategy allows at most 1 restart in a row, and the job failed again after running";
    assert!(run.stderr.contains(want), "no {want:?} in\n{}", run.stderr);
    assert!(
        run.stderr
            .contains("(the count resets after 500 ms without failure)"),
        "{}",
        run.stderr
    );
}

#[test]
fn failure_rate_restarts_failures_spread_wider_than_its_interval() {
    let run = run_case("rate-spread");
    assert_survived_five(&run, "rate-spread");
    assert!(
        run.stderr
            .contains("(restart 5; failure rate: failure 1 of at most 1 per 300 ms)"),
        "{}",
        run.stderr
    );
}

#[test]
fn failure_rate_gives_up_on_a_burst_of_three_saying_why() {
    let run = run_case("rate-burst");
    assert_eq!(
        run.result,
        "failed: operator 'parse' (subtask 1/1) failed: injected failure at record 3002"
    );
    let want = "[weir] job 'restarts' failed after 2 restarts: operator 'parse' (subtask 1/1) \
                failed: injected failure at record 3002; not restarting: the failure-rate \
                strategy allows at most 2 failures per 10 s, and this is failure 3 within ";
    assert!(run.stderr.contains(want), "no {want:?} in\n{}", run.stderr);
    assert_eq!(
        run.stderr
            .matches("restarting from the last complete checkpoint")
            .count(),
        2,
        "{}",
        run.stderr
    );
}

#[test]
fn a_malformed_record_fails_the_job_at_once_whatever_the_strategy() {
    let run = run_case("deterministic");
    assert_eq!(
        run.result,
        "failed: operator 'parse' (subtask 1/1) failed: malformed record: injected bad record 1000"
    );
    assert!(
        run.stderr
            .contains("not restarting, since a restart would fail the same way"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("restarting from"), "{}", run.stderr);
}
