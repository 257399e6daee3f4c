//! `weir-bench keyed-sum --workers N` runs keyed-sum as a cluster of worker processes. So
//! that the benchmark cannot silently measure a broken run, its `results` must equal the
//! single-process run's for the same flags, and a failing run must leave no worker behind.

mod support;

use serde_json::Value;
use std::process::Command;
use support::bench;

/// Runs keyed-sum alone and on `workers` worker processes with the same job flags and
/// checks that both emitted the same records.
fn same_results(job: &[&str], workers: usize) -> (Value, Value) {
    let mut alone = vec!["keyed-sum"];
    alone.extend(job);
    let one = bench(&alone);
    let workers = workers.to_string();
    let mut cluster = alone.clone();
    cluster.extend(["--workers", &workers]);
    let many = bench(&cluster);
    assert!(one["results"].as_u64().unwrap() > 0, "{one}");
    assert_eq!(
        many["results"], one["results"],
        "alone: {one}\ncluster: {many}"
    );
    assert_eq!(many["workers"].as_u64(), Some(workers.parse().unwrap()));
    assert_eq!(many["restarts"].as_u64(), Some(0), "{many}");
    assert!(one.get("workers").is_none(), "{one}");
    for field in [
        "events",
        "keys",
        "parallelism",
        "state",
        "checkpoint_interval_ms",
    ] {
        assert_eq!(many[field], one[field], "{field}");
    }
    assert!(many["events_per_sec"].as_u64().unwrap() > 0, "{many}");
    if cfg!(target_os = "linux") {
        // The workers' CPU is counted too: more than the idle coordinator's.
        assert!(many["cpu_s"].as_f64().unwrap() > 0.0, "{many}");
    }
    (one, many)
}

#[test]
fn two_workers_emit_what_one_process_emits() {
    let job = ["--events", "300000", "--keys", "1000", "--parallelism", "2"];
    let (one, many) = same_results(&job, 2);
    // Each of the two subtasks emits on every 1000th of its records.
    let r = one["results"].as_u64().unwrap();
    assert!((299..=300).contains(&r), "{one}");
    assert_eq!(many["slots_per_worker"].as_u64(), Some(1), "{many}");
}

#[test]
fn uneven_placement_and_checkpoints_give_the_same_results() {
    for state in ["memory", "rocksdb"] {
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let mut runs = Vec::new();
        for (d, workers) in dirs.iter().zip([None, Some("2")]) {
            let dir = d.path().join("ck");
            let mut args = vec![
                "keyed-sum",
                "--events",
                "300000",
                "--keys",
                "5000",
                "--parallelism",
                "3",
                "--state",
                state,
                "--checkpoint-interval-ms",
                "50",
                "--checkpoint-dir",
                dir.to_str().unwrap(),
            ];
            if let Some(w) = workers {
                args.extend(["--workers", w]);
            }
            runs.push(bench(&args));
        }
        let (one, many) = (&runs[0], &runs[1]);
        assert_eq!(
            many["results"], one["results"],
            "alone: {one}\ncluster: {many}"
        );
        assert!(one["results"].as_u64().unwrap() > 0, "{one}");
        // Parallelism 3 on 2 workers: 2 slots each, one left idle.
        assert_eq!(many["slots_per_worker"].as_u64(), Some(2), "{many}");
        assert_eq!(many["restarts"].as_u64(), Some(0), "{many}");
    }
}

/// A coordinator that cannot start fails the run, and the workers it started are killed
/// rather than left waiting for it.
#[test]
fn a_failed_run_leaves_no_worker_behind() {
    // Something that accepts connections but is not a coordinator holds the port, so the
    // coordinator cannot listen and the workers connect to a peer that never answers.
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = squatter.local_addr().unwrap().to_string();
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_weir-bench"))
        .args([
            "keyed-sum",
            "--events",
            "1000",
            "--parallelism",
            "2",
            "--workers",
            "2",
            "--listen",
            &address,
        ])
        .output()
        .expect("weir-bench starts");
    assert!(!out.status.success(), "the run cannot succeed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot listen"), "{stderr}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "the coordinator gave up at once, not after the workers' join timeout"
    );
    #[cfg(target_os = "linux")]
    {
        let left: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains("cluster-worker") && c.contains(&address))
            .collect();
        assert!(left.is_empty(), "workers left running: {left:?}");
    }
    drop(squatter);
}
