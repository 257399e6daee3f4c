//! Async I/O (`map_async`, `try_map_async`, `process_async`) with exact outputs: ordered
//! and unordered results, watermarks that never overtake pending results, timeouts and
//! their handler, retries, the capacity bound, keyed streams and clear errors.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use weir::async_io::{AsyncFunction, AsyncOptions};
use weir::prelude::*;
use weir::retry::{Outcome, RetryPolicy};
use weir_tests::{Stamped, event_time, kv, run, run_failing};

/// Calls that finish in reverse order: call `i` waits until call `i + 1` has finished
/// (the last one finishes at once), so completion order is fixed without any timing.
#[derive(Clone)]
struct Reverse {
    gates: Arc<Vec<Notify>>,
}

impl Reverse {
    fn new(n: usize) -> Self {
        Reverse {
            gates: Arc::new((0..n).map(|_| Notify::new()).collect()),
        }
    }

    fn call(&self, i: usize) -> impl Future<Output = ()> + Send + use<> {
        let wait = self.wait(i);
        let this = self.clone();
        async move {
            wait.await;
            this.release(i);
        }
    }

    /// Waits for call `i`'s turn without letting call `i - 1` go: a test that wants to see
    /// results in completion order lets the next call go only once a result has come out
    /// (`release`), since "finished" inside the call is not yet "emitted".
    fn wait(&self, i: usize) -> impl Future<Output = ()> + Send + use<> {
        let gates = self.gates.clone();
        async move {
            if i + 1 < gates.len() {
                gates[i].notified().await;
            }
        }
    }

    /// Lets call `i - 1` finish.
    fn release(&self, i: usize) {
        if i > 0 {
            self.gates[i - 1].notify_one();
        }
    }
}

fn opts(capacity: usize) -> AsyncOptions {
    AsyncOptions::new(capacity, Duration::from_secs(30))
}

#[test]
fn ordered_results_keep_input_order_although_calls_finish_in_reverse() {
    let env = Env::new().parallelism(1);
    let calls = Reverse::new(20);
    let out = env
        .from_collection((0..20usize).collect::<Vec<_>>())
        .map_async(opts(20), move |i| {
            let done = calls.call(i);
            async move {
                done.await;
                i * 10
            }
        })
        .collect();
    run(&env).unwrap();
    assert_eq!(out.values(), (0..20).map(|i| i * 10).collect::<Vec<_>>());
}

#[test]
fn unordered_results_leave_as_their_calls_finish() {
    let env = Env::new().parallelism(1);
    let calls = Reverse::new(20);
    let emitted = calls.clone();
    let out = env
        .from_collection((0..20usize).collect::<Vec<_>>())
        .map_async(opts(20).unordered(), move |i| {
            let turn = calls.wait(i);
            async move {
                turn.await;
                i * 10
            }
        })
        .map(move |r| {
            emitted.release(r / 10);
            r
        })
        .collect();
    run(&env).unwrap();
    assert_eq!(
        out.values(),
        (0..20).rev().map(|i| i * 10).collect::<Vec<_>>()
    );
}

/// Records 1..=20 at timestamps 1..=20, a watermark after each; calls finish in reverse,
/// so the first record's result comes last. Had a watermark passed a pending result, the
/// window after the async operator would drop that result as late.
type WindowSums = Vec<((String, i64), Timestamp)>;

fn windows_after_async(unordered: bool) -> (WindowSums, Vec<(String, i64)>) {
    let env = Env::new().parallelism(1);
    let input: Vec<((String, i64), Timestamp)> = (1..=20).map(|t| (kv("k", t), t)).collect();
    let calls = Reverse::new(20);
    let o = if unordered {
        opts(20).unordered()
    } else {
        opts(20)
    };
    let late = OutputTag::<(String, i64)>::new("late");
    let sums = event_time(&env, input, 0)
        .map_async(o, move |(k, v): (String, i64)| {
            let done = calls.call(v as usize - 1);
            async move {
                done.await;
                (k, v * 100)
            }
        })
        .key_by(|(k, _)| k.clone())
        .window(WindowAssigner::tumbling(5))
        .side_output_late_data(&late)
        .reduce(|a, b| (a.0, a.1 + b.1));
    let late_out = sums.side_output(&late).collect();
    let out = Stamped::attach(&sums);
    run(&env).unwrap();
    let mut got = out.values();
    got.sort();
    (got, late_out.values())
}

#[test]
fn watermarks_never_overtake_pending_results_in_either_mode() {
    // Windows [0,5), [5,10), [10,15), [15,20), [20,25) of the values × 100.
    let expected = vec![
        (kv("k", 1000), 4),
        (kv("k", 3500), 9),
        (kv("k", 6000), 14),
        (kv("k", 8500), 19),
        (kv("k", 2000), 24),
    ];
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    for unordered in [false, true] {
        let (sums, late) = windows_after_async(unordered);
        assert_eq!(sums, expected_sorted, "unordered: {unordered}");
        assert_eq!(late, Vec::<(String, i64)>::new(), "unordered: {unordered}");
    }
}

/// Answers even numbers at once and never answers odd ones; a timed-out call emits the
/// number with -1.
struct HalfAnswered;

impl AsyncFunction<i64, (i64, i64)> for HalfAnswered {
    type Error = String;
    // Not an `async fn`: its future would borrow `self`, and the call's future must be
    // 'static (clippy's suggestion does not see the bound).
    #[allow(clippy::manual_async_fn)]
    fn call(&self, n: i64) -> impl Future<Output = Result<(i64, i64), String>> + Send + 'static {
        async move {
            if n % 2 == 1 {
                std::future::pending::<()>().await;
            }
            Ok((n, n * 2))
        }
    }
    fn on_timeout(&self, n: &i64, after: Duration) -> weir::Result<Option<(i64, i64)>> {
        assert_eq!(after, Duration::from_millis(300));
        Ok(if *n == 5 { None } else { Some((*n, -1)) })
    }
}

#[test]
fn the_timeout_handler_decides_what_a_timed_out_call_emits() {
    let env = Env::new().parallelism(2);
    let out = env
        .from_collection((1..=8i64).collect::<Vec<_>>())
        .process_async(
            AsyncOptions::new(10, Duration::from_millis(300)),
            HalfAnswered,
        )
        .collect();
    run(&env).unwrap();
    // 5 timed out and its handler emitted nothing.
    assert_eq!(
        out.sorted(),
        vec![(1, -1), (2, 4), (3, -1), (4, 8), (6, 12), (7, -1), (8, 16)]
    );
}

#[test]
fn a_timeout_without_a_handler_fails_the_job_and_says_what_to_do() {
    let env = Env::new().parallelism(1);
    env.from_collection(vec![1i64])
        .map_async(
            AsyncOptions::new(4, Duration::from_millis(100)),
            |n| async move {
                std::future::pending::<()>().await;
                n
            },
        )
        .name("lookup")
        .collect();
    let e = run_failing(&env).to_string();
    assert!(e.contains("lookup"), "{e}");
    assert!(e.contains("timed out after 100ms"), "{e}");
    assert!(e.contains("on_timeout"), "{e}");
}

fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        base: Duration::from_millis(1),
        cap: Duration::from_millis(4),
        max_attempts: 5,
        budget_ratio: 1.0,
        budget_reserve: 100.0,
    }
}

#[test]
fn failed_calls_are_retried_under_the_retry_policy() {
    let env = Env::new().parallelism(2);
    let attempts: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let seen = attempts.clone();
    let out = env
        .from_collection((1..=30i64).collect::<Vec<_>>())
        .try_map_async(opts(8).retry(fast_retries()), move |n| {
            let attempts = seen.clone();
            async move {
                let mut a = attempts.lock().unwrap();
                let tries = a.entry(n).or_default();
                *tries += 1;
                // Every call fails twice, then answers.
                if *tries < 3 {
                    Err(format!("service unavailable for {n}"))
                } else {
                    Ok(n * n)
                }
            }
        })
        .collect();
    run(&env).unwrap();
    assert_eq!(out.sorted(), (1..=30).map(|n| n * n).collect::<Vec<_>>());
    let attempts = attempts.lock().unwrap();
    assert_eq!(attempts.len(), 30);
    assert!(attempts.values().all(|a| *a == 3), "{attempts:?}");
}

#[test]
fn a_failed_call_without_retries_fails_the_job_with_its_error() {
    let env = Env::new().parallelism(1);
    env.from_collection(vec![1i64, 2])
        .try_map_async(opts(4), |n| async move {
            if n == 2 {
                Err(format!("no price for item {n}"))
            } else {
                Ok(n)
            }
        })
        .collect();
    let e = run_failing(&env).to_string();
    assert!(e.contains("failed after 1 attempt"), "{e}");
    assert!(e.contains("retries are off"), "{e}");
    assert!(e.contains("no price for item 2"), "{e}");
}

/// Fails every call; `unknown` errors are permanent.
struct Unknown(Arc<AtomicUsize>);

impl AsyncFunction<i64, i64> for Unknown {
    type Error = String;
    fn call(&self, n: i64) -> impl Future<Output = Result<i64, String>> + Send + 'static {
        self.0.fetch_add(1, Ordering::SeqCst);
        async move { Err(format!("unknown item {n}")) }
    }
    fn classify(&self, e: &String) -> Outcome {
        if e.starts_with("unknown") {
            Outcome::Permanent
        } else {
            Outcome::Retryable { retry_after: None }
        }
    }
}

#[test]
fn a_permanent_error_is_not_retried() {
    let env = Env::new().parallelism(1);
    let calls = Arc::new(AtomicUsize::new(0));
    env.from_collection(vec![7i64])
        .process_async(opts(4).retry(fast_retries()), Unknown(calls.clone()))
        .collect();
    let e = run_failing(&env).to_string();
    assert!(e.contains("not retryable"), "{e}");
    assert!(e.contains("unknown item 7"), "{e}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn retries_that_run_out_fail_the_job_naming_the_attempts() {
    let env = Env::new().parallelism(1);
    env.from_collection(vec![3i64])
        .try_map_async(opts(4).retry(fast_retries()), |n| async move {
            Err::<i64, _>(format!("503 for {n}"))
        })
        .collect();
    let e = run_failing(&env).to_string();
    assert!(e.contains("failed after 5 attempts"), "{e}");
    assert!(e.contains("attempt limit"), "{e}");
    assert!(e.contains("503 for 3"), "{e}");
}

#[test]
fn never_more_calls_in_flight_than_the_capacity() {
    let env = Env::new().parallelism(1);
    let (now, max) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n, m) = (now.clone(), max.clone());
    let out = env
        .from_collection((0..60i64).collect::<Vec<_>>())
        .map_async(opts(4).unordered(), move |x| {
            let (now, max) = (n.clone(), m.clone());
            async move {
                let inside = now.fetch_add(1, Ordering::SeqCst) + 1;
                max.fetch_max(inside, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                x + 1
            }
        })
        .collect();
    run(&env).unwrap();
    assert_eq!(out.sorted(), (1..=60).collect::<Vec<_>>());
    // The source is far faster than 20 ms a call: the operator fills up to its capacity
    // and then takes a record only when a call has finished.
    assert_eq!(max.load(Ordering::SeqCst), 4);
}

#[test]
fn keyed_map_async_keeps_each_keys_order_across_subtasks() {
    let env = Env::new().parallelism(3);
    let input: Vec<(String, i64)> = (0..90).map(|i| kv(&format!("k{}", i % 7), i)).collect();
    let out = env
        .from_collection(input.clone())
        .key_by(|(k, _)| k.clone())
        .map_async(opts(16), |(k, v)| async move {
            // Later records of a key answer sooner: only the ordered queue keeps them in order.
            tokio::time::sleep(Duration::from_millis(((90 - v) % 5) as u64)).await;
            (k, v * 2)
        })
        .collect();
    run(&env).unwrap();
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (k, v) in out.values() {
        per_key.entry(k).or_default().push(v);
    }
    let mut expected: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (k, v) in input {
        expected.entry(k).or_default().push(v * 2);
    }
    assert_eq!(per_key, expected);
}

#[test]
fn a_panicking_call_fails_the_job_naming_the_operator() {
    let env = Env::new().parallelism(1);
    env.from_collection(vec![1i64])
        .map_async(opts(2), |n| async move {
            if n == 1 {
                panic!("the client library broke");
            }
            n
        })
        .name("enrich")
        .collect();
    let e = run_failing(&env).to_string();
    assert!(e.contains("enrich"), "{e}");
    assert!(e.contains("panicked"), "{e}");
}

#[test]
#[should_panic(expected = "capacity must be at least 1")]
fn a_capacity_of_zero_is_refused_where_the_operator_is_declared() {
    let env = Env::new();
    env.from_collection(vec![1i64])
        .map_async(opts(0), |n| async move { n });
}

/// Keyed `map_async` with checkpoints: the first run fails for good after some checkpoints
/// (calls in flight at each), the second resumes from its checkpoint at another
/// parallelism and the committed output holds every line once.
fn keyed_run(
    dir: &std::path::Path,
    parallelism: usize,
    fail_at: Option<i64>,
) -> weir::Result<JobResult> {
    let input = dir.join("in.csv");
    let mut config = CheckpointConfig::new(dir.join("ck")).interval(Duration::from_millis(100));
    config.restart = weir::RestartStrategy::None;
    let env = Env::new().parallelism(parallelism).checkpoints(config);
    env.read_text_file_at_rate(&input, 400)
        .uid("lines")
        .parallelism(1)
        .map(|l: String| {
            let (k, v) = l.split_once(',').unwrap();
            (k.to_string(), v.parse::<i64>().unwrap())
        })
        .key_by(|(k, _)| k.clone())
        .map_async(opts(8), |(k, v)| async move {
            tokio::time::sleep(Duration::from_millis(40)).await;
            (k, v, v * 3)
        })
        .uid("calls")
        .try_map(move |(k, v, a)| match fail_at {
            Some(n) if v >= n => Err(Error::user("the first run stops here")),
            _ => Ok((k, v, a)),
        })
        .write_text_exactly_once(dir.join("out"), |(k, v, a)| format!("{k},{v},{a}"))
        .uid("sink");
    run(&env)
}

#[test]
fn keyed_calls_in_flight_at_a_checkpoint_are_made_again_after_a_rescale() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = (0..500).map(|i| format!("k{},{i}", i % 7)).collect();
    std::fs::write(dir.path().join("in.csv"), lines.join("\n") + "\n").unwrap();
    let e = keyed_run(dir.path(), 2, Some(300)).unwrap_err();
    assert!(e.to_string().contains("the first run stops here"), "{e}");
    keyed_run(dir.path(), 3, None).unwrap();
    let mut got = Vec::new();
    for f in std::fs::read_dir(dir.path().join("out")).unwrap() {
        let f = f.unwrap();
        if !f.file_name().to_string_lossy().starts_with('.') {
            got.extend(
                std::fs::read_to_string(f.path())
                    .unwrap()
                    .lines()
                    .map(str::to_string),
            );
        }
    }
    got.sort();
    let mut expected: Vec<String> = (0..500)
        .map(|i| format!("k{},{i},{}", i % 7, i * 3))
        .collect();
    expected.sort();
    assert_eq!(got.len(), 500, "every line once");
    assert_eq!(got, expected);
}

#[test]
fn an_async_closure_is_accepted_as_it_is() {
    let env = Env::new().parallelism(1);
    let out = env
        .from_collection(vec![1i64, 2, 3])
        .map_async(opts(4), async |n: i64| n * 7)
        .collect();
    run(&env).unwrap();
    assert_eq!(out.values(), vec![7, 14, 21]);
}
