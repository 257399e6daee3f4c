//! The REST API of a running job (`Env::web_address`): its views checked exactly where
//! they are deterministic (graph shape, record counts at the end of a bounded job,
//! checkpoint ids, failures), its actions, its errors, and docs/openapi.json against what
//! the server answers. Every wait polls the API with a deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use weir::prelude::*;
use weir_tests::rest::{self, operator};
use weir_tests::{JOB_DEADLINE, join_within, wait_for};

/// Emits `count` numbers (1, 2, ...), then stays idle until `release` is set, then
/// finishes: the job keeps running for as long as the test needs.
struct Held {
    next: i64,
    count: i64,
    release: Arc<AtomicBool>,
}

impl SourceFunction<i64> for Held {
    fn poll(&mut self, out: &mut SourceOutput<'_, i64>) -> Result<SourceStatus> {
        if self.next < self.count {
            self.next += 1;
            out.emit(self.next)?;
            return Ok(SourceStatus::More);
        }
        if self.release.load(Ordering::SeqCst) {
            Ok(SourceStatus::Finished)
        } else {
            Ok(SourceStatus::Idle(5))
        }
    }
}

fn held(env: &Env, count: i64, release: &Arc<AtomicBool>) -> Stream<i64> {
    let release = release.clone();
    env.source("numbers", move |_| Held {
        next: 0,
        count,
        release: release.clone(),
    })
    .parallelism(1)
}

/// The ids and kinds of complete checkpoints `weir checkpoints list DIR` prints.
fn listed(dir: &std::path::Path) -> Vec<(u64, String)> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir-cli"))
        .args(["checkpoints", "list"])
        .arg(dir)
        .output()
        .expect("run weir checkpoints list");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| l.contains("complete"))
        .map(|l| {
            let mut f = l.split_whitespace();
            (
                f.next().unwrap().parse().unwrap(),
                f.next().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn the_api_shows_the_graph_while_running_and_exact_counts_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let release = Arc::new(AtomicBool::new(false));
    let env = Env::new()
        .parallelism(2)
        .web_address("127.0.0.1:0")
        .checkpoints(CheckpointConfig::new(dir.path()).interval(Duration::ZERO));
    held(&env, 1000, &release)
        .map(|v| v * 2)
        .name("double")
        .key_by(|v| v % 4)
        .reduce(|a, b| a + b)
        .name("sum")
        .discard();
    let handle = env.execute_async("rest-graph").unwrap();
    let addr = handle.web_address().expect("a web address");
    assert_eq!(handle.metrics_address(), Some(addr), "one server");

    let job = rest::get(addr, "/v1/job");
    assert_eq!(job["name"], "rest-graph");
    assert_eq!(job["parallelism"], 2);
    assert_eq!(job["checkpointing"], true);
    assert_eq!(job["cluster"], serde_json::Value::Null);
    assert!(job["start_time_ms"].as_i64().unwrap() > 0);

    // Running: every record read, all of them through every operator.
    wait_for("1000 records into the sink", JOB_DEADLINE, || {
        let ops = rest::get(addr, "/v1/operators");
        operator(&ops, "discard")["records_in"] == 1000
    });
    let job = rest::get(addr, "/v1/job");
    assert_eq!(job["state"], "RUNNING");
    assert_eq!(job["attempt"], 1);
    assert_eq!(job["restarts"], 0);
    assert_eq!(job["tasks"], 5, "numbers, double ×2, sum+discard ×2");

    let ops = rest::get(addr, "/v1/operators");
    let names: Vec<&str> = ops["operators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["numbers", "double", "sum", "discard"]);
    let id = |name: &str| operator(&ops, name)["id"].as_u64().unwrap();
    for (name, kind, parallelism, chained, task) in [
        ("numbers", "source", 1, false, "numbers"),
        ("double", "operator", 2, false, "double"),
        ("sum", "operator", 2, false, "sum"),
        ("discard", "sink", 2, true, "sum"),
    ] {
        let o = operator(&ops, name);
        assert_eq!(o["kind"], kind, "{name}");
        assert_eq!(o["parallelism"], parallelism, "{name}");
        assert_eq!(o["chained"], chained, "{name}");
        assert_eq!(o["task"].as_u64(), Some(id(task)), "{name}");
        assert_eq!(
            o["subtasks"].as_array().unwrap().len(),
            parallelism,
            "{name}"
        );
    }
    let edges: Vec<(u64, u64, &str, bool)> = ops["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["from"].as_u64().unwrap(),
                e["to"].as_u64().unwrap(),
                e["partitioning"].as_str().unwrap(),
                e["chained"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        edges,
        [
            (id("numbers"), id("double"), "REBALANCE", false),
            (id("double"), id("sum"), "HASH", false),
            (id("sum"), id("discard"), "FORWARD", true),
        ]
    );
    for (name, records_in, records_out) in [
        ("numbers", 0, 1000),
        ("double", 1000, 1000),
        ("sum", 1000, 1000),
        ("discard", 1000, 0),
    ] {
        let o = operator(&ops, name);
        assert_eq!(o["records_in"], records_in, "{name}: {o:#}");
        assert_eq!(o["records_out"], records_out, "{name}: {o:#}");
        let per_subtask: u64 = o["subtasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["records_out"].as_u64().unwrap())
            .sum();
        assert_eq!(per_subtask, records_out, "{name}");
        for s in o["subtasks"].as_array().unwrap() {
            let total = s["busy_ratio"].as_f64().unwrap()
                + s["idle_ratio"].as_f64().unwrap()
                + s["backpressured_ratio"].as_f64().unwrap();
            assert!((total - 1.0).abs() < 1e-6, "{name}: {s:#}");
            assert_eq!(s["running"], true);
        }
    }
    // Rebalance over 2 subtasks: 500 each, exactly.
    let double = operator(&ops, "double");
    for s in double["subtasks"].as_array().unwrap() {
        assert_eq!(s["records_in"], 500, "{double:#}");
    }
    // No watermarks in this job: none is reported yet.
    assert_eq!(operator(&ops, "sum")["watermark"], serde_json::Value::Null);
    assert_eq!(rest::get(addr, "/v1/checkpoints")["counts"]["completed"], 0);

    // Ended: the final figures stay readable until the handle is joined.
    release.store(true, Ordering::SeqCst);
    wait_for("the job to end", JOB_DEADLINE, || handle.is_finished());
    let job = rest::get(addr, "/v1/job");
    assert_eq!(job["state"], "FINISHED", "{job:#}");
    assert_eq!(job["failure"], serde_json::Value::Null);
    assert!(job["end_time_ms"].as_i64().unwrap() >= job["start_time_ms"].as_i64().unwrap());
    let ops = rest::get(addr, "/v1/operators");
    assert_eq!(operator(&ops, "discard")["records_in"], 1000);
    for s in operator(&ops, "sum")["subtasks"].as_array().unwrap() {
        assert_eq!(s["running"], false);
        // The end of input is the maximum watermark: no lag to report.
        assert_eq!(s["watermark"], i64::MAX, "{s:#}");
        assert_eq!(s["watermark_lag_ms"], serde_json::Value::Null);
    }
    // The final checkpoint, id 1 in a fresh directory, acknowledged by all 5 tasks.
    let ck = rest::get(addr, "/v1/checkpoints");
    assert_eq!(ck["counts"]["completed"], 1, "{ck:#}");
    assert_eq!(ck["counts"]["failed"], 0);
    assert_eq!(ck["config"]["interval_ms"], 0);
    let latest = &ck["latest_completed"];
    assert_eq!(latest["id"], 1);
    assert_eq!(latest["kind"], "final");
    assert_eq!(latest["status"], "COMPLETED");
    assert_eq!(latest["acks"].as_array().unwrap().len(), 5);
    assert!(std::path::Path::new(latest["path"].as_str().unwrap()).exists());
    assert_eq!(listed(dir.path()), [(1, "final".to_string())]);
    assert_eq!(
        rest::get(addr, "/v1/exceptions")["exceptions"],
        serde_json::json!([])
    );
    let (status, body) = rest::post(addr, "/v1/job/cancel", "");
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("FINISHED"),
        "{body}"
    );

    let result = join_within(handle, JOB_DEADLINE).unwrap();
    assert_eq!(result.records_read(), 1000);
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the API still answers after join"
    );
}

#[test]
fn checkpoints_savepoints_and_a_stop_through_the_api_match_the_checkpoint_directory() {
    let dir = tempfile::tempdir().unwrap();
    let release = Arc::new(AtomicBool::new(false));
    let env = Env::new()
        .parallelism(2)
        .web_address("127.0.0.1:0")
        .checkpoints(CheckpointConfig::new(dir.path()).interval(Duration::from_millis(20)));
    held(&env, 100, &release)
        .key_by(|v| v % 3)
        .reduce(|a, b| a + b)
        .name("sum")
        .discard();
    let handle = env.execute_async("rest-checkpoints").unwrap();
    let addr = handle.web_address().unwrap();

    wait_for("3 completed checkpoints", JOB_DEADLINE, || {
        rest::get(addr, "/v1/checkpoints")["counts"]["completed"]
            .as_u64()
            .unwrap()
            >= 3
    });
    let (status, body) = rest::post(addr, "/v1/savepoints", "");
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["action"], "savepoint");
    let after = body["after_checkpoint_id"].as_u64().unwrap();
    let savepoint = |ck: &serde_json::Value| -> Option<serde_json::Value> {
        ck["history"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["kind"] == "savepoint" && c["id"].as_u64().unwrap() > after)
            .cloned()
    };
    wait_for("the savepoint", JOB_DEADLINE, || {
        savepoint(&rest::get(addr, "/v1/checkpoints")).is_some_and(|s| s["status"] == "COMPLETED")
    });
    let sp = savepoint(&rest::get(addr, "/v1/checkpoints")).unwrap();
    let path = std::path::PathBuf::from(sp["path"].as_str().unwrap());
    assert!(path.join("_metadata").exists(), "{sp:#}");
    assert_eq!(rest::get(addr, "/v1/job")["state"], "RUNNING");

    let (status, body) = rest::post(addr, "/v1/savepoints", r#"{"stop": true}"#);
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["action"], "stop-with-savepoint");
    wait_for("the job to stop", JOB_DEADLINE, || handle.is_finished());
    let job = rest::get(addr, "/v1/job");
    assert_eq!(job["state"], "FINISHED", "{job:#}");
    assert_eq!(job["stopped_with_savepoint"], true);

    let ck = rest::get(addr, "/v1/checkpoints");
    let history = ck["history"].as_array().unwrap();
    // Newest first, one id after the other.
    let ids: Vec<u64> = history.iter().map(|c| c["id"].as_u64().unwrap()).collect();
    for w in ids.windows(2) {
        assert_eq!(w[0], w[1] + 1, "{ids:?}");
    }
    // The stop's savepoint is the last checkpoint completed (a periodic one triggered
    // while it was written never completes: the job stopped).
    let last = &ck["latest_completed"];
    assert_eq!(last["kind"], "savepoint", "{ck:#}");
    assert!(
        history
            .iter()
            .take_while(|c| c["id"] != last["id"])
            .all(|c| c["status"] != "COMPLETED" && c["kind"] == "checkpoint"),
        "{ck:#}"
    );
    for c in history.iter().filter(|c| c["status"] == "COMPLETED") {
        // Three tasks: the source and two subtasks of sum+discard.
        assert_eq!(c["acks"].as_array().unwrap().len(), 3, "{c:#}");
        assert!(
            c["duration_ms"].is_u64() && c["size_bytes"].is_u64(),
            "{c:#}"
        );
        for a in c["acks"].as_array().unwrap() {
            assert!(a["ack_ms"].as_u64().unwrap() <= c["duration_ms"].as_u64().unwrap() + 1);
        }
    }
    assert_eq!(
        ck["counts"]["completed"].as_u64().unwrap() as usize,
        history
            .iter()
            .filter(|c| c["status"] == "COMPLETED")
            .count()
    );
    // Every checkpoint and savepoint the directory still holds is a completed one of the
    // API's history, of the same kind.
    let on_disk = listed(dir.path());
    assert!(on_disk.len() >= 2, "{on_disk:?}");
    for (id, kind) in &on_disk {
        assert!(
            history.iter().any(|c| c["id"] == *id
                && c["kind"] == kind.as_str()
                && c["status"] == "COMPLETED"),
            "{id} {kind} of the directory is not in {history:#?}"
        );
    }
    assert_eq!(Some(on_disk.last().unwrap().0), last["id"].as_u64());
    let result = join_within(handle, JOB_DEADLINE).unwrap();
    assert!(result.stopped_with_savepoint);
    assert_eq!(result.savepoints.len(), 2);
}

#[test]
fn a_failure_shows_in_exceptions_with_its_operator_and_subtask_and_the_job_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let release = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicBool::new(false));
    let env = Env::new()
        .parallelism(1)
        .web_address("127.0.0.1:0")
        .checkpoints(CheckpointConfig {
            restart: weir::RestartStrategy::fixed_delay(1, Duration::from_millis(10)),
            ..CheckpointConfig::new(dir.path()).interval(Duration::ZERO)
        });
    let f = failed.clone();
    held(&env, 10, &release)
        .try_map(move |v| {
            if v == 7 && !f.swap(true, Ordering::SeqCst) {
                return Err(Error::user("cannot handle 7 today"));
            }
            Ok(v)
        })
        .name("fragile")
        .disable_chaining()
        .discard();
    let handle = env.execute_async("rest-failure").unwrap();
    let addr = handle.web_address().unwrap();
    wait_for(
        "the second attempt to read everything",
        JOB_DEADLINE,
        || {
            let job = rest::get(addr, "/v1/job");
            job["attempt"] == 2
                && job["state"] == "RUNNING"
                && operator(&rest::get(addr, "/v1/operators"), "discard")["records_in"] == 10
        },
    );
    let job = rest::get(addr, "/v1/job");
    assert_eq!(job["restarts"], 1);
    let ex = rest::get(addr, "/v1/exceptions");
    let list = ex["exceptions"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{ex:#}");
    assert_eq!(list[0]["operator"], "fragile");
    assert_eq!(list[0]["subtask"], 0);
    assert_eq!(list[0]["attempt"], 1);
    assert_eq!(list[0]["root_cause"], "cannot handle 7 today");
    assert!(
        list[0]["message"]
            .as_str()
            .unwrap()
            .contains("operator 'fragile' (subtask 1/1)"),
        "{ex:#}"
    );
    release.store(true, Ordering::SeqCst);
    join_within(handle, JOB_DEADLINE).unwrap();
}

/// Sleeps on every record: a sink slower than its input.
struct Slow;

impl SinkFunction<i64> for Slow {
    fn invoke(&mut self, _: i64, _: Timestamp) -> Result<()> {
        std::thread::sleep(Duration::from_millis(1));
        Ok(())
    }
}

#[test]
fn a_slow_sink_is_busy_and_backpressures_its_upstream_and_cancel_stops_the_job() {
    let release = Arc::new(AtomicBool::new(false));
    let env = Env::new()
        .parallelism(1)
        .exchange(8, 2)
        .web_address("127.0.0.1:0");
    held(&env, i64::MAX, &release)
        .rebalance()
        .sink("slow", || Slow);
    let handle = env.execute_async("rest-backpressure").unwrap();
    let addr = handle.web_address().unwrap();
    let mut last = serde_json::Value::Null;
    wait_for(
        "the source backpressured and the sink busy, over half of the time",
        JOB_DEADLINE,
        || {
            last = rest::get(addr, "/v1/operators");
            let source = &operator(&last, "numbers")["subtasks"][0];
            let sink = &operator(&last, "slow")["subtasks"][0];
            // Null until the tasks are launched.
            source["backpressured_ratio"].as_f64().unwrap_or(0.0) > 0.5
                && sink["busy_ratio"].as_f64().unwrap_or(0.0) > 0.5
        },
    );
    let source = operator(&last, "numbers");
    assert!(
        source["backpressured_ratio"].as_f64().unwrap() > 0.5,
        "{last:#}"
    );
    assert!(source["subtasks"][0]["backpressured_ms"].as_u64().unwrap() > 0);
    let sink = operator(&last, "slow");
    assert!(sink["busy_ratio"].as_f64().unwrap() > 0.5, "{last:#}");
    assert!(sink["subtasks"][0]["backpressured_ratio"].as_f64().unwrap() < 0.5);

    // Without checkpoints there are no savepoints: the API says why.
    let (status, body) = rest::post(addr, "/v1/savepoints", "");
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("no checkpoints"),
        "{body}"
    );

    let (status, body) = rest::post(addr, "/v1/job/cancel", "");
    assert_eq!(status, 202, "{body}");
    let err = join_within(handle, JOB_DEADLINE).unwrap_err();
    assert!(matches!(err, Error::Cancelled), "{err}");
}

#[test]
fn unknown_paths_wrong_methods_and_bad_bodies_get_json_errors() {
    let release = Arc::new(AtomicBool::new(false));
    let dir = tempfile::tempdir().unwrap();
    let env = Env::new()
        .parallelism(1)
        .web_address("127.0.0.1:0")
        .checkpoints(CheckpointConfig::new(dir.path()).interval(Duration::ZERO));
    held(&env, 3, &release).discard();
    let handle = env.execute_async("rest-errors").unwrap();
    let addr = handle.web_address().unwrap();
    let (status, body) = rest::call(addr, "GET", "/v1/nothing", "");
    assert_eq!(status, 404, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], 404);
    assert!(v["error"].as_str().unwrap().contains("/v1/nothing"), "{v}");
    let (status, body) = rest::call(addr, "GET", "/v1/savepoints", "");
    assert_eq!(status, 405, "{body}");
    assert!(body.contains("POST"), "{body}");
    let (status, body) = rest::post(addr, "/v1/savepoints", r#"{"stop": "yes"}"#);
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("\"stop\""),
        "{body}"
    );
    // The routes the server lists are the ones it serves.
    let index = rest::get(addr, "/v1");
    assert_eq!(index["version"], "v1");
    assert!(index["routes"].as_array().unwrap().len() >= 8);
    release.store(true, Ordering::SeqCst);
    join_within(handle, JOB_DEADLINE).unwrap();
}

/// docs/openapi.json against the server: every documented GET answers 200 with every
/// property its schema requires, every documented POST exists (not 404 or 405), and the
/// server's route list is the documented one.
#[test]
fn the_openapi_file_matches_what_a_running_job_answers() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json"),
    )
    .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let schemas = &doc["components"]["schemas"];
    let release = Arc::new(AtomicBool::new(false));
    let dir = tempfile::tempdir().unwrap();
    let env = Env::new()
        .parallelism(2)
        .web_address("127.0.0.1:0")
        .checkpoints(CheckpointConfig::new(dir.path()).interval(Duration::from_millis(20)));
    held(&env, 50, &release)
        .key_by(|v| v % 2)
        .reduce(|a, b| a + b)
        .discard();
    let handle = env.execute_async("rest-openapi").unwrap();
    let addr = handle.web_address().unwrap();
    wait_for("a completed checkpoint", JOB_DEADLINE, || {
        rest::get(addr, "/v1/checkpoints")["counts"]["completed"] != 0
    });
    // Fill the history with an exception-free but complete picture, then check shapes.
    let served: Vec<(String, String)> = rest::get(addr, "/v1")["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["method"].as_str().unwrap().to_lowercase(),
                r["path"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut documented = Vec::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            documented.push((method.clone(), path.clone()));
            if method != "get" || path == "/metrics" {
                continue;
            }
            let answer = rest::get(addr, path);
            let schema = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
                .as_str()
                .unwrap_or_else(|| panic!("GET {path} documents no JSON schema"))
                .trim_start_matches("#/components/schemas/");
            check(schemas, schema, &answer, path);
        }
    }
    documented.sort();
    let mut served_sorted = served.clone();
    served_sorted.sort();
    assert_eq!(documented, served_sorted);
    let (status, _) = rest::call(addr, "GET", "/metrics", "");
    assert_eq!(status, 200);
    release.store(true, Ordering::SeqCst);
    join_within(handle, JOB_DEADLINE).unwrap();
}

/// Checks that `value` has every property `schema` requires, recursively into objects
/// and arrays of objects described by `$ref`.
fn check(schemas: &serde_json::Value, schema: &str, value: &serde_json::Value, at: &str) {
    let s = &schemas[schema];
    assert!(s.is_object(), "no schema {schema}");
    let obj = value
        .as_object()
        .unwrap_or_else(|| panic!("{at}: {schema} expects an object, got {value}"));
    for r in s["required"].as_array().into_iter().flatten() {
        let key = r.as_str().unwrap();
        assert!(
            obj.contains_key(key),
            "{at}: {schema} requires '{key}': {value:#}"
        );
    }
    for (key, prop) in s["properties"].as_object().into_iter().flatten() {
        let Some(v) = obj.get(key) else { continue };
        if v.is_null() {
            continue;
        }
        let nested = prop["$ref"].as_str().or_else(|| {
            prop["anyOf"]
                .as_array()?
                .iter()
                .find_map(|a| a["$ref"].as_str())
        });
        if let Some(r) = nested {
            check(
                schemas,
                r.trim_start_matches("#/components/schemas/"),
                v,
                &format!("{at}.{key}"),
            );
        }
        if let (Some(r), Some(items)) = (prop["items"]["$ref"].as_str(), v.as_array()) {
            for (i, item) in items.iter().enumerate() {
                check(
                    schemas,
                    r.trim_start_matches("#/components/schemas/"),
                    item,
                    &format!("{at}.{key}[{i}]"),
                );
            }
        }
    }
}

/// `file_sum --web 127.0.0.1:0`: the example serves the API while it runs, and a stop with
/// a savepoint through it ends the process as `weir savepoint stop` does.
#[test]
fn file_sum_serves_the_api_and_stops_with_a_savepoint_through_it() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.csv");
    let lines: String = (0..100_000)
        .map(|i| format!("k{},{}\n", i % 10, i))
        .collect();
    std::fs::write(&input, lines).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_file_sum"))
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(dir.path().join("out"))
        .arg("--checkpoint-dir")
        .arg(dir.path().join("ck"))
        .args(["--checkpoint-interval-ms", "100", "--max-rate", "2000"])
        .args(["--state", "memory", "--web", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr: std::net::SocketAddr = loop {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "file_sum ended early"
        );
        if let Some((_, rest)) = line.trim().split_once("[file_sum] REST API at http://") {
            break rest.trim_end_matches("/v1/job").parse().unwrap();
        }
    };
    // Drain the rest of standard error so the process never blocks on it.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    wait_for("file_sum to run and checkpoint", JOB_DEADLINE, || {
        let job = rest::get(addr, "/v1/job");
        job["state"] == "RUNNING" && rest::get(addr, "/v1/checkpoints")["counts"]["completed"] != 0
    });
    let ops = rest::get(addr, "/v1/operators");
    let names: Vec<&str> = ops["operators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"parse") && names.contains(&"running-sum"),
        "{names:?}"
    );
    assert!(
        operator(&ops, "parse")["records_in"].as_u64().unwrap() > 0,
        "{ops:#}"
    );
    let (status, body) = rest::post(addr, "/v1/savepoints", r#"{"stop": true}"#);
    assert_eq!(status, 202, "{body}");
    let status = weir_tests::wait_within(&mut child, JOB_DEADLINE);
    assert!(status.success(), "{status:?}");
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    let path = weir_tests::operator::stopped_with(&out).expect("a savepoint path");
    assert!(path.join("_metadata").exists(), "{out}");
}

/// A cluster's coordinator serves the API for the whole job: its state, workers, graph, the
/// figures its workers report, checkpoints acknowledged by the workers' tasks, and a stop
/// with a savepoint that ends every worker.
#[test]
fn a_cluster_coordinator_serves_the_api_and_stops_the_cluster_through_it() {
    use weir::cluster::{ClusterConfig, join};
    let address = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let dir = tempfile::tempdir().unwrap();
    let release = Arc::new(AtomicBool::new(false));
    let build = |env: &Env| {
        held(env, 100, &release)
            .key_by(|v| v % 2)
            .reduce(|a, b| a + b)
            .name("sum")
            .discard();
    };
    let coordinator = Env::new()
        .parallelism(2)
        .web_address("127.0.0.1:0")
        .measure_bytes(true)
        .checkpoints(CheckpointConfig::new(dir.path()).interval(Duration::from_millis(20)))
        .cluster(ClusterConfig::coordinator(&address, 1, vec![]));
    build(&coordinator);
    let handle = coordinator.execute_async("rest-cluster").unwrap();
    let addr = handle.web_address().unwrap();
    let worker = {
        let address = address.clone();
        let dir = dir.path().to_path_buf();
        let release = release.clone();
        std::thread::spawn(move || {
            let joined = join(&address, 2, Duration::from_secs(30)).expect("join");
            let env = Env::new()
                .parallelism(2)
                .measure_bytes(true)
                .checkpoints(CheckpointConfig::new(&dir).interval(Duration::from_millis(20)))
                .cluster(ClusterConfig::worker(joined));
            held(&env, 100, &release)
                .key_by(|v| v % 2)
                .reduce(|a, b| a + b)
                .name("sum")
                .discard();
            env.execute("rest-cluster")
        })
    };
    wait_for(
        "a checkpoint of the cluster",
        Duration::from_secs(30),
        || rest::get(addr, "/v1/checkpoints")["counts"]["completed"] != 0,
    );
    let job = rest::get(addr, "/v1/job");
    assert_eq!(job["state"], "RUNNING", "{job:#}");
    assert_eq!(job["attempt"], 1);
    let cluster = &job["cluster"];
    assert_eq!(cluster["address"], address.as_str(), "{job:#}");
    assert_eq!(cluster["slots"], 2);
    assert_eq!(cluster["workers"].as_array().unwrap().len(), 1);
    assert_eq!(cluster["workers"][0]["tasks"], 3, "{job:#}");
    // The worker reports its tasks' figures with its heartbeats.
    wait_for("the worker's figures", Duration::from_secs(30), || {
        let ops = rest::get(addr, "/v1/operators");
        operator(&ops, "sum")["records_in"] == 100 && operator(&ops, "discard")["records_in"] == 100
    });
    let ops = rest::get(addr, "/v1/operators");
    assert_eq!(operator(&ops, "sum")["parallelism"], 2);
    assert_eq!(ops["edges"].as_array().unwrap().len(), 2);
    assert_eq!(operator(&ops, "numbers")["records_out"], 100);
    // 1..=100 without timestamps: one byte each, and nine for the missing timestamp.
    assert_eq!(operator(&ops, "numbers")["bytes_out"], 1000, "{ops:#}");
    assert_eq!(operator(&ops, "sum")["bytes_in"], 1000, "{ops:#}");
    for s in operator(&ops, "sum")["subtasks"].as_array().unwrap() {
        assert_eq!(s["running"], true, "{ops:#}");
        let total = s["busy_ratio"].as_f64().unwrap()
            + s["idle_ratio"].as_f64().unwrap()
            + s["backpressured_ratio"].as_f64().unwrap();
        assert!((total - 1.0).abs() < 1e-6, "{s:#}");
    }
    let ck = rest::get(addr, "/v1/checkpoints");
    let latest = &ck["latest_completed"];
    // The source and two subtasks of sum+discard, all on the worker.
    assert_eq!(latest["acks"].as_array().unwrap().len(), 3, "{ck:#}");

    let (status, body) = rest::post(addr, "/v1/savepoints", r#"{"stop": true}"#);
    assert_eq!(status, 202, "{body}");
    let result = join_within(handle, Duration::from_secs(30)).unwrap();
    assert!(result.stopped_with_savepoint);
    worker.join().unwrap().expect("the worker ends cleanly");
}

/// Runs `weir job ARGS`; its exit success, standard output and standard error.
fn weir_job(args: &[&str]) -> (bool, String, String) {
    weir_job_with(args, &[])
}

/// Runs `weir job ARGS` with `env` set (and no `WEIR_SECRET_FILE` from the test's own
/// environment); its exit success, standard output and standard error.
pub(crate) fn weir_job_with(
    args: &[&str],
    env: &[(&str, &std::path::Path)],
) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir-cli"))
        .arg("job")
        .args(args)
        .env_remove("WEIR_SECRET_FILE")
        .envs(env.iter().copied())
        .output()
        .expect("run weir job");
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// `weir job status|savepoint|cancel --web`: the CLI through the REST API, with the
/// semantics of `weir savepoint trigger|stop` (wait for the savepoint, print its path).
#[test]
fn the_weir_cli_reads_status_takes_savepoints_stops_and_cancels_through_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let release = Arc::new(AtomicBool::new(false));
    let env = Env::new()
        .parallelism(2)
        .web_address("127.0.0.1:0")
        .checkpoints(CheckpointConfig::new(dir.path()).interval(Duration::from_millis(50)));
    held(&env, 100, &release)
        .key_by(|v| v % 2)
        .reduce(|a, b| a + b)
        .name("sum")
        .discard();
    let handle = env.execute_async("rest-cli").unwrap();
    let web = handle.web_address().unwrap().to_string();
    wait_for("100 records summed", JOB_DEADLINE, || {
        operator(
            &rest::get(handle.web_address().unwrap(), "/v1/operators"),
            "sum",
        )["records_in"]
            == 100
    });

    let (ok, out, err) = weir_job(&["status", "--web", &web]);
    assert!(ok, "{err}");
    assert!(out.contains("job:             rest-cli\n"), "{out}");
    assert!(out.contains("state:           RUNNING\n"), "{out}");
    let sum_line = out.lines().find(|l| l.starts_with("sum ")).expect(&out);
    assert!(sum_line.contains(" 100 "), "{out}");
    let (ok, out, _) = weir_job(&["status", "--web", &web, "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["job"]["name"], "rest-cli");

    let (ok, out, err) = weir_job(&["savepoint", "--web", &web]);
    assert!(ok, "{err}");
    let first = std::path::PathBuf::from(out.trim());
    assert!(first.join("_metadata").exists(), "{out}");
    assert_eq!(
        rest::get(handle.web_address().unwrap(), "/v1/job")["state"],
        "RUNNING"
    );

    let (ok, out, err) = weir_job(&["savepoint", "--stop", "--web", &web]);
    assert!(ok, "{err}");
    let stopped = std::path::PathBuf::from(out.trim());
    assert!(stopped.join("_metadata").exists(), "{out}");
    assert_ne!(first, stopped);
    let result = join_within(handle, JOB_DEADLINE).unwrap();
    assert!(result.stopped_with_savepoint);
    assert_eq!(result.savepoints.last(), Some(&stopped));

    // The job is gone: the CLI says where it looked.
    let (ok, _, err) = weir_job(&["status", "--web", &web, "--timeout-s", "2"]);
    assert!(!ok);
    assert!(
        err.contains(&format!("cannot reach the job's REST API at {web}")),
        "{err}"
    );

    // Cancel, on a second job.
    let release = Arc::new(AtomicBool::new(false));
    let env = Env::new().parallelism(1).web_address("127.0.0.1:0");
    held(&env, 10, &release).discard();
    let handle = env.execute_async("rest-cli-cancel").unwrap();
    let web = handle.web_address().unwrap().to_string();
    let (ok, out, err) = weir_job(&["savepoint", "--web", &web]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("answered 409") && err.contains("no checkpoints"),
        "{err}"
    );
    let (ok, out, err) = weir_job(&["cancel", "--web", &web]);
    assert!(ok, "{err}");
    assert!(out.contains("cancelling"), "{out}");
    let err = join_within(handle, JOB_DEADLINE).unwrap_err();
    assert!(matches!(err, Error::Cancelled), "{err}");
}

/// Emits `count` numbers with event time = the number, then stays idle until `release`.
struct HeldAt(Held);

impl SourceFunction<i64> for HeldAt {
    fn poll(&mut self, out: &mut SourceOutput<'_, i64>) -> Result<SourceStatus> {
        let h = &mut self.0;
        if h.next < h.count {
            h.next += 1;
            out.emit_at(h.next, h.next)?;
            return Ok(SourceStatus::More);
        }
        if h.release.load(Ordering::SeqCst) {
            Ok(SourceStatus::Finished)
        } else {
            Ok(SourceStatus::Idle(5))
        }
    }
}

/// Watermarks as the operators see them: exactly the bounded-out-of-orderness watermark of
/// the input read so far, and its lag behind the wall clock.
#[test]
fn operators_report_their_current_watermark_and_its_lag() {
    let release = Arc::new(AtomicBool::new(false));
    let env = Env::new().parallelism(1).web_address("127.0.0.1:0");
    let r = release.clone();
    env.source("timed", move |_| {
        HeldAt(Held {
            next: 0,
            count: 500,
            release: r.clone(),
        })
    })
    .with_watermarks(
        WatermarkStrategy::bounded_out_of_orderness(100).with_emit_interval(Duration::ZERO),
    )
    .key_by(|v| v % 3)
    .reduce(|a, b| a.max(b))
    .name("max")
    .discard();
    let handle = env.execute_async("rest-watermarks").unwrap();
    let addr = handle.web_address().unwrap();
    // The largest timestamp is 500: the watermark is 500 - 100 - 1.
    wait_for("the watermark 399 at 'max'", JOB_DEADLINE, || {
        operator(&rest::get(addr, "/v1/operators"), "max")["watermark"] == 399
    });
    let ops = rest::get(addr, "/v1/operators");
    let max = operator(&ops, "max");
    let lag = max["watermark_lag_ms"].as_i64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(lag > 0 && lag <= now - 399, "{max:#}");
    assert_eq!(max["subtasks"][0]["watermark"], 399);
    // The chained sink reads the same watermark; the source emits none of its own.
    assert_eq!(operator(&ops, "discard")["watermark"], 399);
    assert_eq!(
        operator(&ops, "timed")["watermark"],
        serde_json::Value::Null
    );
    assert_eq!(operator(&ops, "watermarks")["records_in"], 500, "{ops:#}");
    release.store(true, Ordering::SeqCst);
    join_within(handle, JOB_DEADLINE).unwrap();
}

/// The metrics an operator registers itself (here a dedup operator's) appear under its
/// subtask in /v1/operators.
#[test]
fn an_operators_own_metrics_appear_under_its_subtasks() {
    let release = Arc::new(AtomicBool::new(false));
    let env = Env::new().parallelism(1).web_address("127.0.0.1:0");
    let errors = OutputTag::<IdempotencyError<i64>>::new("errors");
    // 1..=12 as v % 4: every value after its first record is a duplicate.
    held(&env, 12, &release)
        .map(|v| v % 4)
        .dedup_by(|v| *v, Duration::from_secs(3600), &errors)
        .name("dedup-rest")
        .discard();
    let handle = env.execute_async("rest-metrics").unwrap();
    let addr = handle.web_address().unwrap();
    let metric = |ops: &serde_json::Value, name: &str| {
        operator(ops, "dedup-rest")["subtasks"][0]["metrics"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["name"] == name).cloned())
    };
    wait_for("8 duplicates suppressed", JOB_DEADLINE, || {
        let ops = rest::get(addr, "/v1/operators");
        metric(&ops, "duplicates_suppressed_total").is_some_and(|m| m["value"] == 8.0)
            && metric(&ops, "dedup_state_entries").is_some_and(|m| m["value"] == 4.0)
    });
    let ops = rest::get(addr, "/v1/operators");
    let m = metric(&ops, "duplicates_suppressed_total").unwrap();
    assert_eq!(m["labels"], serde_json::json!({}), "{m}");
    release.store(true, Ordering::SeqCst);
    join_within(handle, JOB_DEADLINE).unwrap();
}
