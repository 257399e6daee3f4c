//! `/metrics` with Flink-like names: per-operator records and per-task time figures read
//! from the status model, the checkpoint histograms checked against the REST API, and the
//! end-to-end latency histogram of latency markers (Flink's), which sinks count exactly
//! as many times as the sources sent them and user functions never see. Every wait polls
//! with a deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use weir::cluster::{ClusterConfig, join};
use weir::metrics;
use weir::prelude::*;
use weir_tests::rest::{self, operator};
use weir_tests::{JOB_DEADLINE, join_within, unique, wait_for};

const LATENCY: &str = "weir_end_to_end_latency_seconds";
const EMITTED: &str = "weir_latency_markers_emitted_total";

/// Emits `count` numbers (1, 2, ...) then idles until `done` says it may finish.
struct Numbers<F> {
    next: i64,
    count: i64,
    done: F,
}

impl<F: FnMut() -> bool + Send + 'static> SourceFunction<i64> for Numbers<F> {
    fn poll(&mut self, out: &mut SourceOutput<'_, i64>) -> Result<SourceStatus> {
        if self.next < self.count {
            self.next += 1;
            out.emit(self.next)?;
            return Ok(SourceStatus::More);
        }
        if (self.done)() {
            Ok(SourceStatus::Finished)
        } else {
            Ok(SourceStatus::Idle(2))
        }
    }
}

/// The value of every sample of `name` whose labels include `want`, from a scrape.
fn samples(text: &str, name: &str, want: &[(&str, &str)]) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, labels) = series.split_once('{').unwrap_or((series, "}"));
            let labels = labels.strip_suffix('}')?;
            let matches = n == name
                && want
                    .iter()
                    .all(|(k, v)| labels.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
            matches.then(|| (labels.to_string(), value.parse().expect("a number")))
        })
        .collect()
}

fn scrape(addr: std::net::SocketAddr) -> String {
    let (status, body) = rest::call(addr, "GET", "/metrics", "");
    assert_eq!(status, 200, "{body}");
    body
}

fn total(text: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    samples(text, name, want).iter().map(|(_, v)| v).sum()
}

#[test]
fn metrics_show_exact_records_per_operator_and_checkpoint_histograms_match_the_api() {
    let job = unique("prometheus-records");
    let dir = tempfile::tempdir().unwrap();
    let release = Arc::new(AtomicBool::new(false));
    let env = Env::new()
        .parallelism(2)
        .web_address("127.0.0.1:0")
        .checkpoints(CheckpointConfig::new(dir.path()).interval(Duration::ZERO));
    let r = release.clone();
    env.source("numbers", move |_| Numbers {
        next: 0,
        count: 100,
        done: {
            let r = r.clone();
            move || r.load(Ordering::SeqCst)
        },
    })
    .parallelism(1)
    .map(|v| v * 2)
    .name("double")
    .key_by(|v| v % 5)
    .reduce(|a, b| a + b)
    .name("sum")
    .discard();
    let handle = env.execute_async(&job).unwrap();
    let addr = handle.web_address().expect("a web address");
    let j = job.as_str();
    wait_for("every record at the sink", JOB_DEADLINE, || {
        let text = scrape(addr);
        total(
            &text,
            "weir_operator_records_in_total",
            &[("job", j), ("operator", "discard")],
        ) == 100.0
    });
    let text = scrape(addr);
    let one = |name: &str, op: &str, subtask: &str| -> f64 {
        let s = samples(
            &text,
            name,
            &[("job", j), ("operator", op), ("subtask", subtask)],
        );
        assert_eq!(s.len(), 1, "{name} of {op}/{subtask} in\n{text}");
        s[0].1
    };
    assert_eq!(
        one("weir_operator_records_out_total", "numbers", "0"),
        100.0
    );
    assert_eq!(one("weir_operator_records_in_total", "numbers", "0"), 0.0);
    // One producer rebalancing over two subtasks: exactly half each.
    for subtask in ["0", "1"] {
        assert_eq!(
            one("weir_operator_records_in_total", "double", subtask),
            50.0
        );
        assert_eq!(
            one("weir_operator_records_out_total", "double", subtask),
            50.0
        );
    }
    let sum_in = total(
        &text,
        "weir_operator_records_in_total",
        &[("job", j), ("operator", "sum")],
    );
    let sum_out = total(
        &text,
        "weir_operator_records_out_total",
        &[("job", j), ("operator", "sum")],
    );
    assert_eq!((sum_in, sum_out), (100.0, 100.0));
    // The same figures as /v1/operators.
    let ops = rest::get(addr, "/v1/operators");
    assert_eq!(operator(&ops, "sum")["records_in"], 100);
    // Per task: the three tasks (numbers; double; sum with discard chained) and their
    // subtasks, with ms per second between 0 and 1000.
    let busy = samples(&text, "weir_task_busy_time_ms_per_second", &[("job", j)]);
    let mut tasks: Vec<&str> = busy.iter().map(|(l, _)| l.as_str()).collect();
    tasks.sort();
    assert_eq!(
        tasks,
        vec![
            format!("job=\"{j}\",task=\"double\",subtask=\"0\""),
            format!("job=\"{j}\",task=\"double\",subtask=\"1\""),
            format!("job=\"{j}\",task=\"numbers\",subtask=\"0\""),
            format!("job=\"{j}\",task=\"sum\",subtask=\"0\""),
            format!("job=\"{j}\",task=\"sum\",subtask=\"1\""),
        ]
    );
    for name in [
        "weir_task_busy_time_ms_per_second",
        "weir_task_idle_time_ms_per_second",
        "weir_task_backpressured_time_ms_per_second",
    ] {
        for (l, v) in samples(&text, name, &[("job", j)]) {
            assert!((0.0..=1000.0).contains(&v), "{name}{{{l}}} = {v}");
        }
    }

    // Two savepoints, each waited for: the histograms count exactly what the API reports.
    for _ in 0..2 {
        let (status, body) = rest::post(addr, "/v1/savepoints", r#"{"timeout_ms": 20000}"#);
        assert_eq!(status, 200, "{body}");
    }
    let ck = rest::get(addr, "/v1/checkpoints");
    assert_eq!(ck["counts"]["completed"], 2, "{ck:#}");
    let text = scrape(addr);
    let jl = [("job", j)];
    assert_eq!(
        total(&text, "weir_checkpoint_duration_seconds_count", &jl),
        2.0
    );
    assert_eq!(total(&text, "weir_checkpoint_size_bytes_count", &jl), 2.0);
    let inf = [("job", j), ("le", "+Inf")];
    assert_eq!(
        total(&text, "weir_checkpoint_duration_seconds_bucket", &inf),
        2.0
    );
    let sizes: f64 = ck["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "COMPLETED")
        .map(|c| c["size_bytes"].as_f64().unwrap())
        .sum();
    assert!(sizes > 0.0);
    assert_eq!(total(&text, "weir_checkpoint_size_bytes_sum", &jl), sizes);
    assert!(text.contains("# TYPE weir_checkpoint_duration_seconds histogram\n"));
    // Latency tracking is off: no latency series of this job (other tests' may be there).
    assert!(
        samples(&text, &format!("{LATENCY}_count"), &jl).is_empty(),
        "{text}"
    );

    release.store(true, Ordering::SeqCst);
    join_within(handle, JOB_DEADLINE).unwrap();
}

/// numbers (P2, each subtask counting 1..=count) → check (P2, a map that fails on anything but 1..=count, counting its
/// calls) → keyed sum (P2) → counted (P2, a sink counting its records). The source ends
/// once each of its subtasks sent `markers` latency markers (or at once with tracking off).
fn tracked(
    env: &Env,
    job: &str,
    count: i64,
    markers: f64,
    calls: &Arc<AtomicU64>,
    sunk: &Arc<AtomicU64>,
) {
    let job = job.to_string();
    let calls = calls.clone();
    let sunk = sunk.clone();
    env.source("numbers", move |ctx| {
        let (job, subtask) = (job.clone(), ctx.subtask.to_string());
        Numbers {
            next: 0,
            count,
            done: move || {
                let l = [
                    ("job", job.as_str()),
                    ("source", "numbers"),
                    ("subtask", subtask.as_str()),
                ];
                metrics::value(EMITTED, &l).unwrap_or(0.0) >= markers
            },
        }
    })
    .map(move |v| {
        assert!((1..=count).contains(&v), "the check saw {v}");
        calls.fetch_add(1, Ordering::SeqCst);
        v
    })
    .name("check")
    .key_by(|v| v % 3)
    .reduce(|a, b| a + b)
    .for_each(move || {
        let sunk = sunk.clone();
        move |_, _| {
            sunk.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    });
}

#[test]
fn every_latency_marker_a_source_sends_is_observed_once_by_a_sink_and_never_seen_by_user_functions()
{
    let job = unique("latency-on");
    let (calls, sunk) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let env = Env::new()
        .parallelism(2)
        .latency_tracking_interval(Duration::from_millis(1));
    tracked(&env, &job, 1000, 5.0, &calls, &sunk);
    let handle = env.execute_async(&job).unwrap();
    join_within(handle, JOB_DEADLINE).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2000);
    assert_eq!(sunk.load(Ordering::SeqCst), 2000);
    let j = [("job", job.as_str())];
    let emitted = metrics::sum(EMITTED, &j);
    assert!(emitted >= 10.0, "the sources sent {emitted} markers");
    // The histogram reads as its count: one observation per marker.
    assert_eq!(metrics::sum(LATENCY, &j), emitted);
    let text = metrics::render();
    let sink = samples(&text, &format!("{LATENCY}_count"), &j);
    assert_eq!(sink.len(), 1, "{text}");
    assert_eq!(
        sink[0].0,
        format!("job=\"{job}\",sink=\"for_each\",source=\"numbers\"")
    );
    assert_eq!(sink[0].1, emitted);
    let inf = samples(
        &text,
        &format!("{LATENCY}_bucket"),
        &[("job", job.as_str()), ("le", "+Inf")],
    );
    assert_eq!(inf.len(), 1);
    assert_eq!(inf[0].1, emitted);
    assert!(text.contains(&format!("# TYPE {LATENCY} histogram\n")));
}

#[test]
fn without_latency_tracking_no_marker_is_sent_or_observed() {
    let job = unique("latency-off");
    let (calls, sunk) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let env = Env::new().parallelism(2);
    tracked(&env, &job, 1000, 0.0, &calls, &sunk);
    join_within(env.execute_async(&job).unwrap(), JOB_DEADLINE).unwrap();
    assert_eq!(sunk.load(Ordering::SeqCst), 2000);
    let j = [("job", job.as_str())];
    assert_eq!(
        metrics::value(
            EMITTED,
            &[
                ("job", job.as_str()),
                ("source", "numbers"),
                ("subtask", "0")
            ]
        ),
        None
    );
    let text = metrics::render();
    assert!(
        samples(&text, &format!("{LATENCY}_count"), &j).is_empty(),
        "{text}"
    );
    assert!(samples(&text, EMITTED, &j).is_empty(), "{text}");
    assert_eq!(metrics::sum(LATENCY, &j), 0.0);
}

#[test]
fn a_zero_latency_tracking_interval_is_refused_with_what_to_do() {
    let env = Env::new().latency_tracking_interval(Duration::ZERO);
    env.from_collection(vec![1i64]).discard();
    let err = env.execute("zero-latency").unwrap_err().to_string();
    assert!(
        err.contains("latency tracking interval must be longer than 0 ms; leave it unset"),
        "{err}"
    );
}

#[test]
fn latency_markers_cross_cluster_links_between_workers() {
    let job = unique("latency-cluster");
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("127.0.0.1:{}", l.local_addr().unwrap().port());
    drop(l);
    let build = |env: &Env, calls: &Arc<AtomicU64>, sunk: &Arc<AtomicU64>| {
        tracked(env, &job, 200, 4.0, calls, sunk);
    };
    let counters = || (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let coordinator = Env::new()
        .parallelism(2)
        .latency_tracking_interval(Duration::from_millis(1))
        .cluster(ClusterConfig::coordinator(&address, 2, vec![]));
    let (c1, s1) = counters();
    build(&coordinator, &c1, &s1);
    let coordinator = coordinator
        .execute_async(&job)
        .expect("start the coordinator");
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let (address, job) = (address.clone(), job.clone());
            std::thread::spawn(move || {
                let joined = join(&address, 1, Duration::from_secs(30)).expect("join");
                let env = Env::new()
                    .parallelism(2)
                    .latency_tracking_interval(Duration::from_millis(1))
                    .cluster(ClusterConfig::worker(joined));
                let (calls, sunk) = counters();
                tracked(&env, &job, 200, 4.0, &calls, &sunk);
                env.execute(&job).expect("the worker's share");
                (calls.load(Ordering::SeqCst), sunk.load(Ordering::SeqCst))
            })
        })
        .collect();
    join_within(coordinator, Duration::from_secs(60)).expect("the cluster job");
    let (mut calls, mut sunk) = (0, 0);
    for w in workers {
        let (c, s) = w.join().expect("worker thread");
        calls += c;
        sunk += s;
    }
    // The source has parallelism 2: two subtasks of 200 numbers each.
    assert_eq!((calls, sunk), (400, 400));
    let j = [("job", job.as_str())];
    let emitted = metrics::sum(EMITTED, &j);
    assert!(emitted >= 8.0, "the sources sent {emitted} markers");
    assert_eq!(metrics::sum(LATENCY, &j), emitted);
}

/// Every series the Grafana dashboard queries is one docs/operations.md documents.
#[test]
fn the_grafana_dashboard_queries_documented_series() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/weir.json")).unwrap(),
    )
    .expect("the dashboard parses");
    let docs = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let mut queried = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("an expression");
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if !(word.starts_with("weir_") || word.starts_with("checkpoint")) {
                    continue;
                }
                let series = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| word.strip_suffix(s))
                    .filter(|_| word.contains("_seconds_") || word.contains("_bytes_"))
                    .unwrap_or(word);
                assert!(
                    docs.contains(&format!("`{series}")),
                    "{series} is not documented"
                );
                queried += 1;
            }
        }
    }
    assert!(queried >= 9, "{queried} series queried");
}
