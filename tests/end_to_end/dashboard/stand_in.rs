//! A stand-in for a job's server: the dashboard's own files, and `/v1/*` answered as a
//! test says: HTTP 500, a small healthy job with Kafka partitions, a cluster and an
//! exception, or a connection closed without an answer.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// Mode: every `/v1/*` request answers HTTP 500 with a JSON error.
pub const FAIL: u8 = 0;
/// Mode: the views of a small healthy job.
pub const OK: u8 = 1;
/// Mode: the connection closes without an answer.
pub const DROP: u8 = 2;

/// Serves the dashboard's own files (from weir-runtime) and answers `/v1/*` as `mode`
/// says; one request per connection.
pub fn serve(mode: Arc<AtomicU8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mode = mode.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut request = String::new();
                if reader.read_line(&mut request).is_err() {
                    return;
                }
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let path = request.split_whitespace().nth(1).unwrap_or("/").to_string();
                let (status, kind, body) = answer(&path, mode.load(Ordering::SeqCst));
                if status.is_empty() {
                    return; // DROP: close without a word
                }
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    addr
}

fn answer(path: &str, mode: u8) -> (&'static str, &'static str, String) {
    if let Some(a) = weir_runtime::dashboard::asset(path) {
        return ("200 OK", a.content_type, a.body.to_string());
    }
    let json = "application/json";
    match mode {
        FAIL => (
            "500 Internal Server Error",
            json,
            r#"{"status": 500, "error": "injected failure"}"#.into(),
        ),
        DROP => ("", json, String::new()),
        _ => {
            let body = match path {
                "/v1/job" => serde_json::json!({
                    "name": "stand-in", "state": "RUNNING", "start_time_ms": 1,
                    "end_time_ms": null, "uptime_ms": 61000, "attempt": 2, "restarts": 1,
                    "parallelism": 2, "tasks": 2, "checkpointing": false,
                    "stopped_with_savepoint": false, "failure": null,
                    "cluster": {
                        "role": "coordinator", "address": "10.0.0.1:7000", "phase": "running",
                        "slots": 2,
                        "workers": [{ "id": 1, "address": "10.0.0.2:41000",
                            "data_address": "10.0.0.2:41001", "slots": 2, "tasks": 2 }],
                    },
                }),
                "/v1/operators" => serde_json::json!({
                    "attempt": 2,
                    "operators": [
                        {
                            "id": 0, "name": "orders", "kind": "source", "parallelism": 2,
                            "task": 0, "chained": false, "records_in": 0, "records_out": 900,
                            "records_in_per_second": 0.0, "records_out_per_second": 15.0,
                            "busy_ratio": 0.2, "backpressured_ratio": 0.0,
                            "watermark": null, "watermark_lag_ms": null, "subtasks": [],
                            "bytes_in": null, "bytes_out": 57600, "state_bytes": 2048,
                            "partitions": [
                                { "subtask": 0, "topic": "orders", "partition": 0,
                                  "position": 123, "high_watermark": 150, "lag": 27 },
                                { "subtask": 1, "topic": "orders", "partition": 1,
                                  "position": 4000, "high_watermark": 4000, "lag": 0 },
                            ],
                        },
                        {
                            "id": 1, "name": "print<b>!</b>", "kind": "sink", "parallelism": 2,
                            "task": 1, "chained": false, "records_in": 900, "records_out": 0,
                            "records_in_per_second": 15.0, "records_out_per_second": 0.0,
                            "busy_ratio": 0.0, "backpressured_ratio": 0.0,
                            "watermark": null, "watermark_lag_ms": null, "subtasks": [],
                        },
                    ],
                    "edges": [{ "from": 0, "port": 0, "to": 1, "gate": 0,
                        "partitioning": "HASH", "chained": false }],
                }),
                "/v1/checkpoints" => serde_json::json!({
                    "enabled": false, "config": null, "latest_completed": null, "history": [],
                    "counts": { "completed": 0, "failed": 0, "in_progress": 0 },
                }),
                "/v1/exceptions" => serde_json::json!({ "exceptions": [{
                    "time_ms": 1_700_000_000_000_i64, "attempt": 1, "operator": "print",
                    "subtask": 1, "message": "operator 'print' (subtask 2/2) failed: disk full",
                    "root_cause": "disk full",
                }]}),
                _ => return ("404 Not Found", json, "{}".into()),
            };
            ("200 OK", json, body.to_string())
        }
    }
}
