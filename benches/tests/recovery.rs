//! `weir-bench recovery` builds RocksDB state in one process, kills it with SIGKILL once a
//! checkpoint holds every key, and measures a second process from its start to its first
//! record. Small runs, so the benchmark cannot silently stop working.

mod support;

/// A small state: 3,000 keys of 100 bytes, built at parallelism 2.
const SMALL: [&str; 7] = [
    "recovery",
    "--keys",
    "3000",
    "--value-bytes",
    "100",
    "--parallelism",
    "2",
];

fn run(extra: &[&str]) -> serde_json::Value {
    run_with(extra, &[])
}

fn run_with(extra: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let work = dir.path().join("work");
    let w = work.to_str().expect("a UTF-8 temp path");
    let args = [&SMALL[..], &["--dir", w], extra].concat();
    let v = support::bench_with(&args, env);
    assert!(!work.exists(), "the benchmark removes its data");
    assert_eq!(v["keys"], 3000);
    assert_eq!(v["parallelism"], 2);
    // 3,000 incompressible 100-byte values are in checkpoint storage.
    let bytes = v["state_bytes"].as_u64().expect("state_bytes");
    assert!(
        bytes >= 300_000,
        "checkpoint storage holds only {bytes} bytes"
    );
    let restored = v["checkpoint_bytes"].as_u64().expect("checkpoint_bytes");
    assert!(
        restored >= 300_000,
        "the checkpoint restored holds {restored} bytes: {v}"
    );
    let first = v["first_record_s"].as_f64().expect("first_record_s");
    let all = v["all_subtasks_s"].as_f64().expect("all_subtasks_s");
    assert!(first > 0.0 && first <= all, "{v}");
    assert!(v["verify_s"].as_f64().is_some(), "{v}");
    assert_eq!(v["cold"], false);
    v
}

#[test]
fn the_recovery_benchmark_restores_from_the_local_copy() {
    let v = run(&[]);
    assert_eq!(v["restore_parallelism"], 2);
    assert_eq!(v["local_copies_used"], 2, "{v}");
}

/// As after a crash on a cold disk, reading the restored checkpoint's checksums takes 5 s
/// (a fail point): the restarted job takes its first record before that, since the
/// checksums are read while it runs.
#[test]
fn the_restarted_job_does_not_wait_for_the_checksums_of_its_checkpoint() {
    let v = run_with(
        &["--no-local-recovery"],
        &[("WEIR_FAILPOINTS", "restore.verify=sleep:5000")],
    );
    let first = v["first_record_s"].as_f64().expect("first_record_s");
    assert!(
        first < 5.0,
        "the first record waited for the checksums: {v}"
    );
}

#[test]
fn the_recovery_benchmark_rescales_from_checkpoint_storage() {
    let v = run(&["--restore-parallelism", "3", "--no-local-recovery"]);
    assert_eq!(v["restore_parallelism"], 3);
    assert_eq!(v["local_copies_used"], 0, "{v}");
}

#[test]
fn the_recovery_benchmark_restarts_again_from_a_kept_directory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let work = dir.path().join("work");
    let w = work.to_str().expect("a UTF-8 temp path");
    let base = SMALL;
    let first = support::bench(&[&base[..], &["--dir", w, "--keep"]].concat());
    assert!(first["build_s"].as_f64().is_some(), "{first}");
    assert!(work.join("ck").exists(), "--keep keeps the checkpoints");
    // The same state again: no build, and a restart that rescales 2 -> 3.
    let again = support::bench(
        &[
            &base[..],
            &["--dir", w, "--again", "--restore-parallelism", "3"],
        ]
        .concat(),
    );
    assert_eq!(again["again"], true, "{again}");
    assert!(again["build_s"].is_null(), "{again}");
    assert_eq!(again["restore_parallelism"], 3);
    assert!(
        again["state_bytes"].as_u64().expect("state_bytes") >= 300_000,
        "{again}"
    );
    let t = again["first_record_s"].as_f64().expect("first_record_s");
    assert!(
        t > 0.0 && t <= again["all_subtasks_s"].as_f64().expect("all"),
        "{again}"
    );
    // A directory without a checkpoint is refused with a message that says what to do.
    let empty = dir.path().join("empty");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir-bench"))
        .args(base)
        .args(["--again", "--dir"])
        .arg(&empty)
        .output()
        .expect("weir-bench starts");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("holds no complete checkpoint"), "{err}");
}
