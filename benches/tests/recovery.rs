//! `weir-bench recovery` builds RocksDB state, checkpoints it, and restarts from that
//! checkpoint. A small run, so the benchmark cannot silently stop working.

mod support;

#[test]
fn the_recovery_benchmark_builds_checkpoints_and_restores() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ck = dir.path().join("ck");
    let v = support::bench(&[
        "recovery",
        "--keys",
        "3000",
        "--value-bytes",
        "100",
        "--parallelism",
        "2",
        "--checkpoint-dir",
        ck.to_str().expect("a UTF-8 temp path"),
    ]);
    assert_eq!(v["keys"], 3000);
    assert_eq!(v["parallelism"], 2);
    // 3,000 incompressible 100-byte values are in the checkpoint.
    let bytes = v["checkpoint_dir_bytes"]
        .as_u64()
        .expect("checkpoint_dir_bytes");
    assert!(bytes >= 300_000, "checkpoint holds only {bytes} bytes");
}
