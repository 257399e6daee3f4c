//! The web dashboard at `/`, loaded in a real headless Chromium (`weir_tests::browser`):
//! the graph and checkpoint table of a running job checked against the REST API, a
//! 30-operator graph, and the page when the API fails. Each test saves a screenshot under
//! the target directory's `test-artifacts/`. Every wait polls the page with a deadline.

use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use weir::prelude::*;
use weir_tests::browser::{Browser, artifacts_dir};
use weir_tests::rest::{self, operator};
use weir_tests::{JOB_DEADLINE, join_within, wait_for};

mod stand_in;

/// How long the page may take to show what a test waits for (Chromium's start included).
const PAGE_DEADLINE: Duration = Duration::from_secs(30);

/// Emits `burst` numbers per poll, resting 2 ms in between, until `release` is set: a job
/// that runs, with steady rates, for as long as the test needs.
struct Steady {
    next: i64,
    burst: i64,
    release: Arc<AtomicBool>,
}

impl SourceFunction<i64> for Steady {
    fn poll(&mut self, out: &mut SourceOutput<'_, i64>) -> Result<SourceStatus> {
        if self.release.load(Ordering::SeqCst) {
            return Ok(SourceStatus::Finished);
        }
        for _ in 0..self.burst {
            self.next += 1;
            out.emit(self.next)?;
        }
        Ok(SourceStatus::Idle(2))
    }
}

fn steady(env: &Env, burst: i64, release: &Arc<AtomicBool>) -> Stream<i64> {
    let release = release.clone();
    env.source("numbers", move |_| Steady {
        next: 0,
        burst,
        release: release.clone(),
    })
    .parallelism(1)
}

/// A JavaScript expression's value as a list of strings.
fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|s| {
            s.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| s.to_string())
        })
        .collect()
}

#[test]
fn the_dashboard_draws_a_running_jobs_graph_and_checkpoint_table() {
    let dir = tempfile::tempdir().unwrap();
    let release = Arc::new(AtomicBool::new(false));
    let env = Env::new()
        .parallelism(2)
        .web_address("127.0.0.1:0")
        .checkpoints(CheckpointConfig::new(dir.path()).interval(Duration::ZERO));
    // The store is slower than its input: it is busy and its upstream backpressured, so
    // the screenshot shows both colours (the test asserts neither: timings vary).
    steady(&env, 40, &release)
        .map(|v| v * 2)
        .name("double")
        .key_by(|v| v % 8)
        .reduce(|a, b| a + b)
        .name("sum")
        .sink("store", || Store);
    let handle = env.execute_async("dashboard-e2e").unwrap();
    let addr = handle.web_address().unwrap();
    // Three savepoints, ids 1, 2, 3: no periodic checkpoint changes the history after them.
    for _ in 0..3 {
        let (status, body) = rest::post(addr, "/v1/savepoints", r#"{"timeout_ms": 20000}"#);
        assert_eq!(status, 200, "{body}");
    }
    let ck = rest::get(addr, "/v1/checkpoints");
    let ids: Vec<String> = ck["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].to_string())
        .collect();
    assert_eq!(ids, ["3", "2", "1"], "{ck:#}");

    let mut page = Browser::open(&format!("http://{addr}/"));
    page.wait_for(
        "the graph, the checkpoint table and a minute of throughput samples to start",
        "document.body.dataset.graphReady === 'true' \
         && document.body.dataset.checkpointsReady === 'true' \
         && document.body.dataset.jobState === 'RUNNING' \
         && document.querySelectorAll('tr.ckpt').length === 3 \
         && document.querySelector('#throughput-chart polyline').getAttribute('points').split(' ').length >= 4",
        PAGE_DEADLINE,
    );

    let ops = rest::get(addr, "/v1/operators");
    let names = |v: &Value| -> Vec<String> {
        let mut n: Vec<String> = v["operators"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["name"].as_str().unwrap().to_string())
            .collect();
        n.sort();
        n
    };
    let mut boxes =
        strings(&page.eval("[...document.querySelectorAll('g.op')].map(g => g.dataset.name)"));
    boxes.sort();
    assert_eq!(boxes, names(&ops));
    assert_eq!(boxes, ["double", "numbers", "store", "sum"]);
    // Each box is the operator's: its id, and its parallelism on its second line.
    for name in ["numbers", "double", "sum", "store"] {
        let o = operator(&ops, name);
        let text = page.eval(&format!(
            "document.getElementById('op-{}').textContent",
            o["id"]
        ));
        let text = text.as_str().unwrap();
        assert!(text.starts_with(name), "{text}");
        assert!(
            text.contains(&format!("parallelism {}", o["parallelism"])),
            "{text}"
        );
    }
    let chained = page.eval(&format!(
        "document.getElementById('op-{}').textContent",
        operator(&ops, "store")["id"]
    ));
    assert!(
        chained.as_str().unwrap().contains("chained to sum"),
        "{chained}"
    );
    // One arrow per edge, between the same operators, labelled with the partitioning.
    let edges = strings(&page.eval(
        "[...document.querySelectorAll('g.edge')].map(e => e.dataset.from + '>' + e.dataset.to + ' ' + e.textContent)",
    ));
    let expected: Vec<String> = ops["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let label = if e["chained"] == true {
                "chained".to_string()
            } else {
                e["partitioning"].as_str().unwrap().to_string()
            };
            format!("{}>{} {label}", e["from"], e["to"])
        })
        .collect();
    assert_eq!(edges, expected);
    assert_eq!(edges.len(), 3);
    // The checkpoint table lists the API's history, newest first, with kind and status.
    let rows = strings(&page.eval(
        "[...document.querySelectorAll('tr.ckpt')].map(r => [...r.cells].slice(0, 3).map(c => c.textContent).join(' '))",
    ));
    assert_eq!(
        rows,
        [
            "3 savepoint COMPLETED",
            "2 savepoint COMPLETED",
            "1 savepoint COMPLETED"
        ]
    );
    assert_eq!(
        page.eval("document.getElementById('job-state').textContent"),
        "RUNNING"
    );
    assert_eq!(
        page.eval("document.getElementById('job-name').textContent"),
        "dashboard-e2e"
    );
    assert_eq!(page.eval("document.getElementById('banner').hidden"), true);
    assert_eq!(page.eval("document.body.dataset.api"), "ok");
    // The duration chart has one point per completed checkpoint.
    assert_eq!(
        page.eval(
            "document.querySelector('#checkpoint-duration-chart polyline[data-series=duration]').getAttribute('points').split(' ').length"
        ),
        3
    );
    assert_eq!(
        page.eval("document.getElementById('lag-empty').textContent"),
        "No Kafka source in this job reports partitions."
    );
    assert_eq!(
        page.eval("document.getElementById('exceptions-empty').textContent"),
        "No exceptions."
    );
    // A click on a box shows its subtasks.
    let sum = operator(&ops, "sum");
    page.click(&format!("#op-{}", sum["id"]));
    page.wait_for(
        "the subtasks of sum",
        "document.querySelectorAll('#subtasks-table tr.subtask').length === 2",
        PAGE_DEADLINE,
    );
    assert_eq!(
        page.eval("document.getElementById('subtasks-of').textContent"),
        "of sum (operator, parallelism 2)"
    );
    let subtasks: Vec<String> = cells(&mut page, "#subtasks-table tr.subtask")
        .iter()
        .map(|r| r.split('|').take(2).collect::<Vec<_>>().join("|"))
        .collect();
    assert_eq!(subtasks, ["0|yes", "1|yes"]);
    page.eval("window.scrollTo(0, 0)");
    let shot = artifacts_dir().join("dashboard.png");
    page.screenshot(&shot);
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);
    println!("dashboard screenshot: {}", shot.display());

    // The page follows the job to its end.
    release.store(true, Ordering::SeqCst);
    page.wait_for(
        "the job's end",
        "document.body.dataset.jobState === 'FINISHED'",
        PAGE_DEADLINE,
    );
    drop(page);
    join_within(handle, JOB_DEADLINE).unwrap();
}

#[test]
fn a_graph_of_30_operators_draws_every_box_and_fits_on_request() {
    let release = Arc::new(AtomicBool::new(false));
    let env = Env::new().parallelism(2).web_address("127.0.0.1:0");
    let source = steady(&env, 5, &release);
    let mut expected = vec!["numbers".to_string()];
    // Two branches of maps (chained, with a rebalance every 4th) and a union at the end of
    // the second that also reads the first branch's second step: an edge across 10 columns.
    let mut early = None;
    for (branch, steps) in [("a", 14), ("b", 12)] {
        let mut s = source.clone();
        for i in 1..=steps {
            let name = format!("{branch}-step-{i:02}");
            s = s.map(move |v| v + i).name(&name);
            if i % 4 == 0 {
                s = s.rebalance();
            }
            if i == 2 && early.is_none() {
                early = Some(s.clone());
            }
            expected.push(name);
        }
        if branch == "b" {
            s = s.union(&[early.clone().unwrap()]);
            expected.push("union".to_string());
        }
        let sink = format!("{branch}-sink");
        s.sink(&sink, || DiscardSink);
        expected.push(sink);
    }
    assert_eq!(expected.len(), 30);
    expected.sort();
    let handle = env.execute_async("dashboard-30").unwrap();
    let addr = handle.web_address().unwrap();
    let ops = rest::get(addr, "/v1/operators");
    assert_eq!(ops["operators"].as_array().unwrap().len(), 30);

    let mut page = Browser::open(&format!("http://{addr}/"));
    page.wait_for(
        "30 boxes",
        "document.querySelectorAll('g.op').length === 30",
        PAGE_DEADLINE,
    );
    let mut boxes =
        strings(&page.eval("[...document.querySelectorAll('g.op')].map(g => g.dataset.name)"));
    boxes.sort();
    assert_eq!(boxes, expected);
    assert_eq!(
        page.eval("document.querySelectorAll('g.edge').length"),
        ops["edges"].as_array().unwrap().len()
    );
    // No two boxes overlap.
    let overlapping = page.eval(
        "(() => { const r = [...document.querySelectorAll('g.op rect')].map(e => e.getBBox()); \
           return r.some((a, i) => r.some((b, j) => i < j && a.x < b.x + b.width && b.x < a.x + a.width \
             && a.y < b.y + b.height && b.y < a.y + a.height)); })()",
    );
    assert_eq!(overlapping, false);
    // No edge crosses a box other than its own two.
    let crossing = page.eval(
        "(() => { const boxes = [...document.querySelectorAll('g.op')].map(g => [g.id, g.querySelector('rect').getBBox()]); \
           const hits = []; \
           for (const e of document.querySelectorAll('g.edge')) { \
             const p = e.querySelector('path'), len = p.getTotalLength(); \
             for (let l = 0; l <= len; l += 4) { const q = p.getPointAtLength(l); \
               for (const [id, b] of boxes) { \
                 if (id === 'op-' + e.dataset.from || id === 'op-' + e.dataset.to) continue; \
                 if (q.x > b.x + 1 && q.x < b.x + b.width - 1 && q.y > b.y + 1 && q.y < b.y + b.height - 1) \
                   hits.push(e.dataset.from + '>' + e.dataset.to + ' crosses ' + id); } } } \
           return [...new Set(hits)]; })()",
    );
    assert_eq!(crossing, serde_json::json!([]));
    // Wider than the screen: it scrolls; "Fit" brings all of it into view.
    let scroll = "document.getElementById('graph-scroll')";
    assert_eq!(
        page.eval(&format!("{scroll}.scrollWidth > {scroll}.clientWidth")),
        true
    );
    page.eval("document.getElementById('zoom-fit').click()");
    page.wait_for(
        "the graph to fit",
        &format!("{scroll}.scrollWidth <= {scroll}.clientWidth"),
        PAGE_DEADLINE,
    );
    page.screenshot(&artifacts_dir().join("dashboard-30-operators.png"));
    drop(page);
    release.store(true, Ordering::SeqCst);
    join_within(handle, JOB_DEADLINE).unwrap();
}

/// A sink that takes about 100 µs per record, like a write to a nearby database.
struct Store;

impl SinkFunction<i64> for Store {
    fn invoke(&mut self, _: i64, _: Timestamp) -> Result<()> {
        std::thread::sleep(Duration::from_micros(100));
        Ok(())
    }
}

/// Sinks nothing.
struct DiscardSink;

impl SinkFunction<i64> for DiscardSink {
    fn invoke(&mut self, _: i64, _: Timestamp) -> Result<()> {
        Ok(())
    }
}

/// The cells of the rows `selector` matches, each row's joined by `|`.
fn cells(page: &mut Browser, selector: &str) -> Vec<String> {
    strings(&page.eval(&format!(
        "[...document.querySelectorAll('{selector}')].map(r => [...r.cells].map(c => c.textContent.trim()).join('|'))"
    )))
}

#[test]
fn the_dashboard_says_when_the_api_fails_and_recovers_when_it_answers_again() {
    use std::sync::atomic::AtomicU8;
    let mode = Arc::new(AtomicU8::new(stand_in::FAIL));
    let addr = stand_in::serve(mode.clone());
    let mut page = Browser::open(&format!("http://{addr}/"));
    page.wait_for(
        "the error banner",
        "document.body.dataset.api === 'error'",
        PAGE_DEADLINE,
    );
    let banner = page.eval("document.getElementById('banner').textContent");
    let banner = banner.as_str().unwrap();
    assert!(
        banner.starts_with("Cannot reach the job's API: /v1/"),
        "{banner}"
    );
    assert!(
        banner.contains("answered HTTP 500 Internal Server Error: injected failure"),
        "{banner}"
    );
    assert!(banner.contains("nothing has been received yet"), "{banner}");
    assert_eq!(page.eval("document.getElementById('banner').hidden"), false);
    // Not a blank page: the sections are there, waiting.
    let text = page.eval("document.body.innerText");
    for expected in [
        "Job graph",
        "Checkpoint history",
        "Waiting for the job's graph",
    ] {
        assert!(text.as_str().unwrap().contains(expected), "{text}");
    }
    page.screenshot(&artifacts_dir().join("dashboard-api-error.png"));

    // It answers: the banner goes, the job shows.
    mode.store(stand_in::OK, Ordering::SeqCst);
    page.wait_for(
        "the banner to go",
        "document.body.dataset.api === 'ok' && document.getElementById('banner').hidden",
        PAGE_DEADLINE,
    );
    assert_eq!(
        page.eval("document.getElementById('job-name').textContent"),
        "stand-in"
    );
    assert_eq!(page.eval("document.body.dataset.jobState"), "RUNNING");
    // What the API reports beyond a local job's figures: Kafka partitions, bytes, the
    // cluster's workers, a failure.
    assert_eq!(
        cells(&mut page, "#lag-table tbody tr"),
        [
            "orders|0|orders|0|123|150|27|",
            "orders|1|orders|1|4000|4000|0|"
        ]
    );
    assert_eq!(
        cells(&mut page, "#exceptions-table tbody tr")[0]
            .split('|')
            .skip(1)
            .collect::<Vec<_>>(),
        [
            "1",
            "print #1",
            "disk fulloperator 'print' (subtask 2/2) failed: disk full"
        ]
    );
    assert_eq!(
        cells(&mut page, "#cluster table tbody tr"),
        ["1|10.0.0.2:41000|10.0.0.2:41001|2|2"]
    );
    assert_eq!(
        page.eval("document.getElementById('cluster-section').hidden"),
        false
    );
    let orders = page.eval("document.getElementById('op-0').textContent");
    assert!(
        orders
            .as_str()
            .unwrap()
            .contains("Kafka lag 27 · state 2.0 KiB"),
        "{orders}"
    );
    let row = cells(&mut page, "#operators-table tbody tr");
    assert!(row[0].ends_with("|–|56.3 KiB|2.0 KiB"), "{row:?}");
    let headers = strings(&page.eval(
        "[...document.querySelectorAll('#operators-table th')].slice(-3).map(c => c.textContent)",
    ));
    assert_eq!(headers, ["checkpointed state", "bytes out", "state"]);
    assert_eq!(page.eval("document.querySelectorAll('g.edge').length"), 1);
    // Names are text, never markup.
    assert_eq!(page.eval("document.querySelector('#op-1 b')"), Value::Null);
    assert_eq!(
        page.eval("document.querySelector('#op-1').dataset.name"),
        "print<b>!</b>"
    );
    assert_eq!(
        page.eval("document.querySelector('#op-1 text.name').textContent"),
        "print<b>!</b>"
    );
    page.screenshot(&artifacts_dir().join("dashboard-kafka-cluster.png"));

    // It goes silent: the banner says so and keeps the last figures' time.
    mode.store(stand_in::DROP, Ordering::SeqCst);
    page.wait_for(
        "the banner of a silent API",
        "document.body.dataset.api === 'error'",
        PAGE_DEADLINE,
    );
    let banner = page.eval("document.getElementById('banner').textContent");
    let banner = banner.as_str().unwrap();
    assert!(
        banner.contains("did not answer") && banner.contains("the figures below are from"),
        "{banner}"
    );
    assert_eq!(
        page.eval("document.getElementById('job-name').textContent"),
        "stand-in"
    );
}

/// `GET /` of a running job answers the page as HTML, and every file it names.
#[test]
fn the_job_serves_the_dashboard_and_its_files() {
    let release = Arc::new(AtomicBool::new(false));
    let env = Env::new().parallelism(1).web_address("127.0.0.1:0");
    steady(&env, 1, &release).discard();
    let handle = env.execute_async("dashboard-files").unwrap();
    let addr = handle.web_address().unwrap();
    for a in weir_runtime::dashboard::ASSETS {
        let (status, body) = rest::call(addr, "GET", a.path, "");
        assert_eq!(status, 200, "{}", a.path);
        assert_eq!(body, a.body, "{}", a.path);
    }
    let (status, body) = rest::call(addr, "GET", "/nothing", "");
    assert_eq!(status, 404);
    assert!(body.contains("dashboard at /"), "{body}");
    wait_for("the job to run", JOB_DEADLINE, || {
        rest::get(addr, "/v1/job")["state"] == "RUNNING"
    });
    release.store(true, Ordering::SeqCst);
    join_within(handle, JOB_DEADLINE).unwrap();
}

/// A cluster's coordinator serves the dashboard of the whole job: its graph, the figures
/// its worker reports, and the worker itself.
#[test]
fn a_cluster_coordinator_serves_the_dashboard_of_the_whole_job() {
    use weir::cluster::{ClusterConfig, join};
    let address = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let dir = tempfile::tempdir().unwrap();
    let release = Arc::new(AtomicBool::new(false));
    let build = |env: &Env, release: &Arc<AtomicBool>| {
        steady(env, 5, release)
            .key_by(|v| v % 2)
            .reduce(|a, b| a + b)
            .name("sum")
            .discard();
    };
    let coordinator = Env::new()
        .parallelism(2)
        .web_address("127.0.0.1:0")
        .checkpoints(CheckpointConfig::new(dir.path()).interval(Duration::from_millis(100)))
        .cluster(ClusterConfig::coordinator(&address, 1, vec![]));
    build(&coordinator, &release);
    let handle = coordinator.execute_async("dashboard-cluster").unwrap();
    let addr = handle.web_address().unwrap();
    let worker = {
        let address = address.clone();
        let dir = dir.path().to_path_buf();
        let release = release.clone();
        std::thread::spawn(move || {
            let joined = join(&address, 2, Duration::from_secs(30)).expect("join");
            let env = Env::new()
                .parallelism(2)
                .checkpoints(CheckpointConfig::new(&dir).interval(Duration::from_millis(100)))
                .cluster(ClusterConfig::worker(joined));
            build(&env, &release);
            env.execute("dashboard-cluster")
        })
    };
    let mut page = Browser::open(&format!("http://{addr}/"));
    page.wait_for(
        "the worker, a checkpoint and the worker's figures",
        "document.querySelectorAll('#cluster table tbody tr').length === 1 \
         && document.querySelectorAll('tr.ckpt.COMPLETED').length > 0 \
         && [...document.querySelectorAll('g.op')].every(g => /(in|out) [0-9.]+[kMG]?\\/s/.test(g.textContent))",
        Duration::from_secs(60),
    );
    let mut boxes =
        strings(&page.eval("[...document.querySelectorAll('g.op')].map(g => g.dataset.name)"));
    boxes.sort();
    assert_eq!(boxes, ["discard", "numbers", "sum"]);
    assert_eq!(page.eval("document.body.dataset.jobState"), "RUNNING");
    let job = rest::get(addr, "/v1/job");
    let w = &job["cluster"]["workers"][0];
    // Text as the page shows it: strings without quotes, numbers as they are.
    let text = |v: &Value| {
        v.as_str()
            .map(str::to_string)
            .unwrap_or_else(|| v.to_string())
    };
    let expected = ["id", "address", "data_address", "slots", "tasks"]
        .map(|k| text(&w[k]))
        .join("|");
    assert_eq!(cells(&mut page, "#cluster table tbody tr"), [expected]);
    drop(page);
    let (status, body) = rest::post(addr, "/v1/savepoints", r#"{"stop": true}"#);
    assert_eq!(status, 202, "{body}");
    join_within(handle, Duration::from_secs(30)).unwrap();
    worker.join().unwrap().expect("the worker ends cleanly");
}
