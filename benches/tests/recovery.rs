//! `weir-bench recovery` builds RocksDB state in one process, kills it with SIGKILL once a
//! checkpoint holds every key, and measures a second process from its start to its first
//! record. Small runs, so the benchmark cannot silently stop working.

mod support;

fn run(extra: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let work = dir.path().join("work");
    let mut args = vec![
        "recovery",
        "--keys",
        "3000",
        "--value-bytes",
        "100",
        "--parallelism",
        "2",
        "--dir",
        work.to_str().expect("a UTF-8 temp path"),
    ];
    args.extend_from_slice(extra);
    let v = support::bench(&args);
    assert!(!work.exists(), "the benchmark removes its data");
    assert_eq!(v["keys"], 3000);
    assert_eq!(v["parallelism"], 2);
    // 3,000 incompressible 100-byte values are in checkpoint storage.
    let bytes = v["state_bytes"].as_u64().expect("state_bytes");
    assert!(
        bytes >= 300_000,
        "checkpoint storage holds only {bytes} bytes"
    );
    let first = v["first_record_s"].as_f64().expect("first_record_s");
    let all = v["all_subtasks_s"].as_f64().expect("all_subtasks_s");
    assert!(first > 0.0 && first <= all, "{v}");
    v
}

#[test]
fn the_recovery_benchmark_restores_from_the_local_copy() {
    let v = run(&[]);
    assert_eq!(v["restore_parallelism"], 2);
    assert_eq!(v["local_copies_used"], 2, "{v}");
}

#[test]
fn the_recovery_benchmark_rescales_from_checkpoint_storage() {
    let v = run(&["--restore-parallelism", "3", "--no-local-recovery"]);
    assert_eq!(v["restore_parallelism"], 3);
    assert_eq!(v["local_copies_used"], 0, "{v}");
}
