//! `weir-bench recovery` builds RocksDB state, checkpoints it, and restarts from that
//! checkpoint. A small run, so the benchmark cannot silently stop working.

use std::process::Command;

#[test]
fn the_recovery_benchmark_builds_checkpoints_and_restores() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ck = dir.path().join("ck");
    let out = Command::new(env!("CARGO_BIN_EXE_weir-bench"))
        .args([
            "recovery",
            "--keys",
            "3000",
            "--value-bytes",
            "100",
            "--parallelism",
            "2",
        ])
        .arg("--checkpoint-dir")
        .arg(&ck)
        .output()
        .expect("weir-bench starts");
    assert!(
        out.status.success(),
        "weir-bench recovery failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).expect("UTF-8 output");
    let v: serde_json::Value = serde_json::from_str(line.trim()).expect("one JSON line");
    assert_eq!(v["keys"], 3000);
    assert_eq!(v["parallelism"], 2);
    // 3,000 incompressible 100-byte values are in the checkpoint.
    let bytes = v["checkpoint_dir_bytes"]
        .as_u64()
        .expect("checkpoint_dir_bytes");
    assert!(bytes >= 300_000, "checkpoint holds only {bytes} bytes");
}
