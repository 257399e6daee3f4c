//! Bytes and state in `/v1/operators`: the encoded size of the records that cross
//! channels between tasks (exact, for records whose encoding is known), and the live
//! state size of keyed operators.

use std::time::Duration;
use weir::prelude::*;
use weir_tests::rest::{self, operator};
use weir_tests::{JOB_DEADLINE, join_within, wait_for};

/// The size of a record with no timestamp as weir's codec encodes it, computed from a
/// full encoding (the runtime adds up sizes without encoding).
fn size(v: u64) -> u64 {
    weir::codec::encode(&(v, NO_TIMESTAMP)).unwrap().len() as u64
}

/// collection (P1) → rebalance → copy (P2) → broadcast → echo (P2) → discard (chained):
/// every channel's bytes are the encoded records it carried, a broadcast's once per
/// receiving subtask; chained edges carry none and read `null`.
#[test]
fn bytes_in_and_out_are_the_encoded_records_crossing_channels() {
    let values: Vec<u64> = (0..300).collect();
    // 0..=250 take one byte each, 251.. three; no timestamp takes nine.
    let total: u64 = values.iter().map(|&v| size(v)).sum();
    assert_eq!(total, 251 * 10 + 49 * 12);
    let even: u64 = values
        .iter()
        .filter(|v| *v % 2 == 0)
        .map(|&v| size(v))
        .sum();

    let env = Env::new()
        .parallelism(2)
        .web_address("127.0.0.1:0")
        .measure_bytes(true);
    env.from_collection(values)
        .rebalance()
        .map(|v| v)
        .name("copy")
        .broadcast()
        .map(|v| v)
        .name("echo")
        .discard();
    let job = env.execute_async("rest-bytes").unwrap();
    let addr = job.web_address().unwrap();
    wait_for("the job to end", JOB_DEADLINE, || job.is_finished());
    let ops = rest::get(addr, "/v1/operators");
    let figures = |name: &str| {
        let o = operator(&ops, name);
        (o["bytes_in"].clone(), o["bytes_out"].clone())
    };
    let null = serde_json::Value::Null;
    assert_eq!(figures("collection"), (null.clone(), total.into()));
    assert_eq!(figures("copy"), (total.into(), (2 * total).into()));
    assert_eq!(figures("echo"), ((2 * total).into(), null.clone()));
    assert_eq!(figures("discard"), (null.clone(), null.clone()));
    // Round robin from the single source subtask: even values to subtask 0.
    let copy = &operator(&ops, "copy")["subtasks"];
    assert_eq!(copy[0]["bytes_in"], even);
    assert_eq!(copy[1]["bytes_in"], total - even);
    let echo = &operator(&ops, "echo")["subtasks"];
    assert_eq!(
        (&echo[0]["bytes_in"], &echo[1]["bytes_in"]),
        (&total.into(), &total.into())
    );
    join_within(job, Duration::from_secs(10)).unwrap();
}

/// Bytes are measured only when asked for: by default every `bytes_in` and `bytes_out`
/// is `null`, records and state are still reported.
#[test]
fn bytes_are_null_unless_the_job_measures_them() {
    let ops = keyed_sum(10);
    for o in ops["operators"].as_array().unwrap() {
        assert_eq!(o["bytes_in"], serde_json::Value::Null, "{o:#}");
        assert_eq!(o["bytes_out"], serde_json::Value::Null, "{o:#}");
        for s in o["subtasks"].as_array().unwrap() {
            assert_eq!(
                (&s["bytes_in"], &s["bytes_out"]),
                (&serde_json::Value::Null, &serde_json::Value::Null)
            );
        }
    }
    assert_eq!(operator(&ops, "sum")["records_in"], 200);
    assert_eq!(operator(&ops, "sum")["state_bytes"], 30);
}

/// Runs a keyed rolling sum over `keys` keys (20 records of value 1 each) to its end and
/// returns `/v1/operators`.
fn keyed_sum(keys: u64) -> serde_json::Value {
    keyed_sum_with(Env::new(), keys)
}

fn keyed_sum_with(env: Env, keys: u64) -> serde_json::Value {
    let records: Vec<(u64, u64)> = (0..20).flat_map(|_| (0..keys).map(|k| (k, 1))).collect();
    let env = env.parallelism(2).web_address("127.0.0.1:0");
    env.from_collection(records)
        .key_by(|(k, _)| *k)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .name("sum")
        .discard();
    let job = env.execute_async("rest-state").unwrap();
    let addr = job.web_address().unwrap();
    wait_for("the job to end", JOB_DEADLINE, || job.is_finished());
    let ops = rest::get(addr, "/v1/operators");
    join_within(job, Duration::from_secs(10)).unwrap();
    ops
}

/// The heap backend's live state is the encoded size of its entries (exact below 1,000
/// entries per table): one `(key, (key, sum))` entry per key, split over the subtasks by
/// key group, growing with the keys; operators without keyed state report `null`.
#[test]
fn state_bytes_are_the_encoded_live_entries_of_the_heap_backend() {
    let entry = |k: u64| weir::codec::encode(&(k, (k, 20u64))).unwrap().len() as u64;
    for keys in [10u64, 300] {
        let ops = keyed_sum(keys);
        let want: u64 = (0..keys).map(entry).sum();
        let sum = operator(&ops, "sum");
        assert_eq!(sum["state_bytes"], want, "{keys} keys: {sum:#}");
        let per_subtask: Vec<u64> = sum["subtasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["state_bytes"].as_u64().expect("both subtasks hold keys"))
            .collect();
        assert_eq!(per_subtask.iter().sum::<u64>(), want);
        assert_eq!(
            operator(&ops, "collection")["state_bytes"],
            serde_json::Value::Null
        );
        assert_eq!(
            operator(&ops, "discard")["state_bytes"],
            serde_json::Value::Null
        );
    }
    // 10 keys: 3 bytes each; 300 keys: keys from 251 on take 3 bytes twice.
    assert_eq!((0..10).map(entry).sum::<u64>(), 30);
    assert_eq!((0..300).map(entry).sum::<u64>(), 251 * 3 + 49 * 7);
}

/// With RocksDB, the live state is what RocksDB holds after the final checkpoint wrote the
/// cached values into it: at least the entries' encoded size (RocksDB adds its own key
/// prefixes and per-entry overhead), counted once the operator's subtasks measured it.
#[test]
fn state_bytes_of_the_rocksdb_backend_cover_its_entries_after_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let keys = 20_000u64;
    let env = Env::new()
        .state_backend(BackendKind::parse("rocksdb").unwrap())
        .checkpoints(CheckpointConfig::new(dir.path()).interval(Duration::from_secs(3600)));
    let ops = keyed_sum_with(env, keys);
    let heap: u64 = (0..keys)
        .map(|k| weir::codec::encode(&(k, (k, 20u64))).unwrap().len() as u64)
        .sum();
    let sum = operator(&ops, "sum");
    let rocks = sum["state_bytes"].as_u64().expect("a size");
    assert!(
        rocks >= heap,
        "RocksDB reports {rocks} bytes for {heap} bytes of entries"
    );
    for s in sum["subtasks"].as_array().unwrap() {
        assert!(s["state_bytes"].as_u64().unwrap() > 0, "{s:#}");
    }
}
