//! `weir-bench backpressure` runs its throttled keyed job in a checkpoint mode and reports
//! the checkpoints it completed. Small runs, so the benchmark cannot silently stop working;
//! no timing is asserted.

mod support;

/// The complete checkpoints (`chk-*/_metadata`) in `dir`.
fn manifests(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("checkpoint dir")
        .flatten()
        .filter(|e| e.path().join("_metadata").exists())
        .count() as u64
}

#[test]
fn the_backpressure_benchmark_reports_the_checkpoints_it_took() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ck = dir.path().join("ck");
    let v = support::bench(&[
        "backpressure",
        "--checkpoint-mode",
        "unaligned",
        "--parallelism",
        "2",
        "--seconds",
        "5",
        "--rate",
        "20000",
        "--keys",
        "100",
        "--state",
        "memory",
        "--checkpoint-interval-ms",
        "200",
        "--checkpoint-dir",
        ck.to_str().expect("a UTF-8 temp path"),
    ]);
    assert_eq!(v["mode"], "unaligned");
    assert_eq!(v["throttled"], true);
    assert_eq!(v["parallelism"], 2);
    assert_eq!(v["source_rate"], 20000);
    assert_eq!(v["sink_rate_per_subtask"], 1000);
    let completed = v["checkpoints_completed"].as_u64().expect("a count");
    assert!(completed >= 1, "no checkpoint completed in 5 s: {v}");
    // Every completed checkpoint of the run is in the directory, read from its manifest.
    assert_eq!(manifests(&ck), completed, "{v}");
    let (p50, p99, max) = (
        v["checkpoint_p50_ms"].as_u64().expect("p50"),
        v["checkpoint_p99_ms"].as_u64().expect("p99"),
        v["checkpoint_max_ms"].as_u64().expect("max"),
    );
    assert!(p50 <= p99 && p99 <= max, "{v}");
    assert!(v["checkpoint_bytes"].as_u64().expect("bytes") > 0, "{v}");
    assert!(v["alignment_p99_ms"].is_u64(), "{v}");
    assert!(v["records_per_sec"].as_u64().expect("records/s") > 0, "{v}");
}

#[test]
fn without_throttling_the_benchmark_reports_records_per_second() {
    let v = support::bench(&[
        "backpressure",
        "--checkpoint-mode",
        "aligned-timeout:100",
        "--seconds",
        "3",
        "--keys",
        "100",
        "--state",
        "memory",
        "--no-throttle",
    ]);
    assert_eq!(v["mode"], "aligned-timeout:100");
    assert_eq!(v["throttled"], false);
    assert!(v["source_rate"].is_null() && v["sink_rate_per_subtask"].is_null());
    assert!(v["records_per_sec"].as_u64().expect("records/s") > 0, "{v}");
}

#[test]
fn an_unknown_checkpoint_mode_is_refused_with_the_accepted_ones() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir-bench"))
        .args([
            "backpressure",
            "--checkpoint-mode",
            "sideways",
            "--seconds",
            "1",
        ])
        .output()
        .expect("weir-bench starts");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--checkpoint-mode")
            && err.contains("unknown checkpoint mode \"sideways\"")
            && err.contains("aligned-timeout:MS"),
        "unclear error:\n{err}"
    );
}
