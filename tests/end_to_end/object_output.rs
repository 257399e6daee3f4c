//! The exactly-once text sink writing to a real S3-compatible server (S3Proxy, see
//! tests/s3.rs): exact output read back from the bucket, objects that appear only whole.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir::prelude::*;
use weir_tests::{run, s3};

/// Every committed object below `url` with its text.
fn committed(store: &weir_objstore::Store) -> BTreeMap<String, String> {
    store
        .list("part-")
        .unwrap()
        .into_iter()
        .filter(|o| !s3::is_server_temporary(&o.name))
        .map(|o| {
            let bytes = store.get(&o.name).unwrap().expect("listed object");
            (o.name, String::from_utf8(bytes).unwrap())
        })
        .collect()
}

/// Running sums per key from 4,000 records into S3 at parallelism 2 with a checkpoint
/// every 20 ms. While the job runs, an operator before the sink reads back every object
/// it can list: each must already hold its final content (objects appear whole, never
/// growing or partial). At the end the objects hold every key's running sums exactly once,
/// and the server holds nothing else below the prefix (no markers, no parts).
#[test]
fn running_sums_reach_the_bucket_exactly_once_and_objects_appear_whole() {
    let server = s3::shared();
    let url = s3::url("e2e-object-sink");
    let store = weir_objstore::Store::open(&url).unwrap();
    let ck = tempfile::tempdir().unwrap();
    let records: Vec<(u64, i64)> = (0..4000u64).map(|i| (i % 7, (i % 13) as i64 + 1)).collect();
    let mut expected: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    let mut sums: BTreeMap<u64, i64> = BTreeMap::new();
    for (k, v) in &records {
        let s = sums.entry(*k).or_default();
        *s += v;
        expected.entry(*k).or_default().push(*s);
    }

    let input = ck.path().join("input.csv");
    let text: String = records.iter().map(|(k, v)| format!("{k},{v}\n")).collect();
    std::fs::write(&input, text).unwrap();

    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let looked = Arc::new(AtomicU64::new(0));
    let (observer, seen_in_job, looked_in_job) = (store.clone(), seen.clone(), looked.clone());
    let env = Env::new().parallelism(2).checkpoints(
        CheckpointConfig::new(ck.path().join("ck")).interval(Duration::from_millis(20)),
    );
    // One reader at 8,000 lines a second (half a second), so the job spans checkpoints
    // and each key's lines stay in input order.
    env.read_text_file_at_rate(&input, 8000)
        .parallelism(1)
        .map(|l: String| {
            let (k, v) = l.split_once(',').unwrap();
            (k.parse::<u64>().unwrap(), v.parse::<i64>().unwrap())
        })
        .parallelism(1)
        .key_by(|r: &(u64, i64)| r.0)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .map(move |r| {
            if looked_in_job.fetch_add(1, Ordering::Relaxed) % 100 == 0 {
                let now = committed(&observer);
                seen_in_job.lock().unwrap().extend(now);
            }
            r
        })
        .write_text_exactly_once(&url, |(k, s)| format!("{k},{s}"));
    run(&env).unwrap();

    let objects = committed(&store);
    let mut got: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for (name, text) in &objects {
        assert!(
            name.starts_with("part-0-") || name.starts_with("part-1-"),
            "{name}"
        );
        for line in text.lines() {
            let (k, s) = line.split_once(',').expect("key,sum");
            got.entry(k.parse().unwrap())
                .or_default()
                .push(s.parse().unwrap());
        }
    }
    for sums in got.values_mut() {
        sums.sort_unstable();
    }
    assert_eq!(got, expected, "every running sum exactly once");

    let seen = seen.lock().unwrap();
    assert!(
        !seen.is_empty(),
        "no object was visible while the job ran: it should span several checkpoints"
    );
    for (name, text) in seen.iter() {
        assert_eq!(
            Some(text),
            objects.get(name),
            "{name} was visible with other content than its final one"
        );
    }
    let prefix = url.strip_prefix(&format!("s3://{}/", s3::BUCKET)).unwrap();
    let files = server.object_names(s3::BUCKET, prefix);
    assert_eq!(
        files,
        objects.keys().cloned().collect::<Vec<_>>(),
        "the server holds exactly the committed objects below the prefix"
    );
}

/// A bucket that does not exist, and a server that does not answer: the job fails with
/// the URL and what failed, and no credentials.
#[test]
fn a_missing_bucket_is_reported_with_its_url() {
    let server = s3::shared();
    let url = "s3://weir-no-such-bucket/out";
    let env = Env::new();
    env.from_collection(vec![1i64, 2])
        .write_text_exactly_once(url, |n| n.to_string());
    let e = weir_tests::run_failing(&env).to_string();
    assert!(
        e.contains("s3://weir-no-such-bucket/out")
            && e.contains("the bucket does not exist: create it, or fix the URL"),
        "{e}"
    );
    for (k, v) in server.env() {
        if k == "AWS_SECRET_ACCESS_KEY" {
            assert!(!e.contains(&v), "the secret is in the message: {e}");
        }
    }
}
