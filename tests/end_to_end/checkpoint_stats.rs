//! What a checkpoint's manifest says about its size, read as an operator would read it.

use weir::prelude::*;

/// With RocksDB, the manifest's sizes count the RocksDB files, not just the encoded
/// operator state: the first checkpoint of a run writes everything it references, so its
/// `bytes` and `full_bytes` both equal the sum of its files' sizes.
#[test]
fn manifest_sizes_count_every_file_of_a_rocksdb_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ck = CheckpointConfig::new(dir.path()).interval(std::time::Duration::ZERO);
    let env = Env::new()
        .parallelism(1)
        .state_backend(BackendKind::parse("rocksdb").unwrap())
        .checkpoints(ck);
    let input: Vec<(u32, i64)> = (0..5_000u32).map(|i| (i % 1_000, i64::from(i))).collect();
    env.from_collection(input)
        .key_by(|(k, _)| *k)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .uid("sum")
        .discard();
    env.execute("sizes").unwrap();

    let final_dir = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("_metadata").exists())
        .expect("the final checkpoint");
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(final_dir.join("_metadata")).unwrap()).unwrap();
    let files: Vec<&serde_json::Value> = m["operators"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|o| o["subtasks"].as_array().unwrap())
        .flat_map(|s| s["files"].as_array().unwrap())
        .collect();
    let sum: u64 = files.iter().map(|f| f["size"].as_u64().unwrap()).sum();
    assert!(
        files
            .iter()
            .any(|f| f["name"].as_str().unwrap().ends_with(".sst")),
        "the RocksDB checkpoint holds SST files: {files:?}"
    );
    assert_eq!(m["stats"]["bytes"].as_u64(), Some(sum));
    assert_eq!(m["stats"]["full_bytes"].as_u64(), Some(sum));
}
