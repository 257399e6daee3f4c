//! Built-in sources (collections, timestamped collections, iterators, text files, the
//! generator) and sinks (collect, text files, discard, for_each, print).

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use weir::prelude::*;
use weir_tests::{Stamped, kv, run};

#[test]
fn from_collection_emits_in_order_without_timestamps() {
    let env = Env::new().parallelism(1);
    let out = Stamped::attach(&env.from_collection(vec!["x".to_string(), "y".into(), "z".into()]));
    run(&env).unwrap();
    assert_eq!(
        out.values(),
        vec![
            ("x".to_string(), NO_TIMESTAMP),
            ("y".to_string(), NO_TIMESTAMP),
            ("z".to_string(), NO_TIMESTAMP)
        ]
    );
}

#[test]
fn from_collection_crosses_batch_boundaries_and_handles_empty_input() {
    let env = Env::new().parallelism(2);
    let many = env
        .from_collection((0..5000u32).collect::<Vec<_>>())
        .collect();
    let none = env.from_collection(Vec::<u32>::new()).collect();
    let r = run(&env).unwrap();
    assert_eq!(many.sorted(), (0..5000).collect::<Vec<_>>());
    assert!(none.is_empty());
    assert_eq!(r.records_read(), 5000);
}

#[test]
fn from_timestamped_attaches_the_given_timestamps() {
    let env = Env::new().parallelism(1);
    let out = Stamped::attach(&env.from_timestamped(vec![('a', 30), ('b', 10), ('c', -5)]));
    run(&env).unwrap();
    assert_eq!(out.values(), vec![('a', 30), ('b', 10), ('c', -5)]);
}

#[test]
fn from_iter_drains_the_iterator_once_in_order() {
    let env = Env::new().parallelism(1);
    let small = env.from_iter((0..5i64).map(|i| i * i)).collect();
    run(&env).unwrap();
    assert_eq!(small.values(), vec![0, 1, 4, 9, 16]);

    // More than one source batch (1024 records per poll), into parallel operators.
    let env = Env::new().parallelism(2);
    let big = env.from_iter(0..3000u64).map(|x| x * 2).collect();
    let r = run(&env).unwrap();
    assert_eq!(big.sorted(), (0..3000).map(|x| x * 2).collect::<Vec<_>>());
    assert_eq!(r.records_read(), 3000);
}

fn read_file_at(path: &std::path::Path, parallelism: usize) -> (Vec<String>, u64) {
    let env = Env::new().parallelism(parallelism);
    let lines = env.read_text_file(path).collect();
    let r = run(&env).unwrap();
    let subtasks = r.tasks.iter().filter(|t| t.name == "text-file").count();
    assert_eq!(
        subtasks, parallelism,
        "the file source runs at the job parallelism"
    );
    (lines.sorted(), r.records_read())
}

#[test]
fn read_text_file_gives_the_same_lines_at_any_parallelism() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("input.txt");
    // An empty line, a CRLF line ending and no newline at the end.
    std::fs::write(&path, "alpha\nbeta\n\ngamma\r\ndelta").unwrap();
    let mut expected: Vec<String> = ["alpha", "beta", "", "gamma", "delta"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    expected.sort();
    assert_eq!(read_file_at(&path, 1), (expected.clone(), 5));
    assert_eq!(read_file_at(&path, 3), (expected, 5));
}

#[test]
fn read_text_file_splits_a_long_file_across_subtasks_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.txt");
    let mut f = std::fs::File::create(&path).unwrap();
    for i in 0..2500 {
        writeln!(f, "line {i}").unwrap();
    }
    drop(f);
    let mut expected: Vec<String> = (0..2500).map(|i| format!("line {i}")).collect();
    expected.sort();
    assert_eq!(read_file_at(&path, 1), (expected.clone(), 2500));
    assert_eq!(read_file_at(&path, 3), (expected, 2500));
}

fn generated(parallelism: usize, events: u64, keys: u64) -> (Vec<(u64, i64)>, u64) {
    let env = Env::new().parallelism(parallelism);
    let stream = env.generator(events, keys);
    let out = stream.collect();
    // Every record's event timestamp is its index.
    let wrong_ts = Arc::new(AtomicU64::new(0));
    let w = wrong_ts.clone();
    stream.for_each(move || {
        let w = w.clone();
        move |(_, i): (u64, i64), ts| {
            if ts != i {
                w.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }
    });
    let r = run(&env).unwrap();
    assert_eq!(wrong_ts.load(Ordering::Relaxed), 0);
    (out.sorted(), r.records_read())
}

#[test]
fn generator_emits_each_index_once_with_its_key_at_any_parallelism() {
    let n = 2500u64;
    let expected: Vec<(u64, i64)> = (0..n).map(|i| (i % 7, i as i64)).collect();
    let mut expected = expected;
    expected.sort();
    assert_eq!(generated(1, n, 7), (expected.clone(), n));
    assert_eq!(generated(2, n, 7), (expected.clone(), n));
    assert_eq!(generated(3, n, 7), (expected, n));
    // keys = 0 is treated as one key.
    assert_eq!(generated(2, 3, 0), (vec![(0, 0), (0, 1), (0, 2)], 3));
}

#[test]
fn write_text_writes_one_part_file_per_subtask() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let env = Env::new().parallelism(2);
    env.from_collection((0..10i64).collect::<Vec<_>>())
        .rebalance()
        .map(|x| x * x)
        .write_text(&out_dir, |x| format!("sq={x}"));
    run(&env).unwrap();
    let mut parts: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    parts.sort();
    assert_eq!(parts, vec!["part-0", "part-1"]);
    let mut lines = Vec::new();
    for p in &parts {
        let text = std::fs::read_to_string(out_dir.join(p)).unwrap();
        assert!(text.ends_with('\n'), "{p} ends with a newline");
        let part: Vec<String> = text.lines().map(String::from).collect();
        // Round-robin gives each of the two subtasks five records.
        assert_eq!(part.len(), 5, "{p}: {part:?}");
        lines.extend(part);
    }
    lines.sort();
    let mut expected: Vec<String> = (0..10).map(|x| format!("sq={}", x * x)).collect();
    expected.sort();
    assert_eq!(lines, expected);
}

#[test]
fn discard_consumes_everything() {
    let env = Env::new().parallelism(2);
    env.generator(3000, 5)
        .map(|(k, v)| k as i64 + v)
        .discard()
        .name("drop-all")
        .parallelism(1);
    let r = run(&env).unwrap();
    assert_eq!(r.records_read(), 3000);
    let received: Vec<u64> = r
        .tasks
        .iter()
        .filter(|t| t.name == "drop-all")
        .map(|t| t.records)
        .collect();
    assert_eq!(
        received,
        vec![3000],
        "one discard subtask received every record"
    );
}

#[test]
fn for_each_runs_on_every_record_in_every_subtask() {
    let env = Env::new().parallelism(3);
    let sum = Arc::new(AtomicI64::new(0));
    let count = Arc::new(AtomicU64::new(0));
    let (s, c) = (sum.clone(), count.clone());
    env.from_collection((1..=1000i64).collect::<Vec<_>>())
        .rebalance()
        .for_each(move || {
            let (s, c) = (s.clone(), c.clone());
            move |v, _ts| {
                s.fetch_add(v, Ordering::Relaxed);
                c.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        });
    run(&env).unwrap();
    assert_eq!(sum.load(Ordering::Relaxed), 500_500);
    assert_eq!(count.load(Ordering::Relaxed), 1000);
}

#[test]
fn print_runs_to_completion() {
    let env = Env::new().parallelism(2);
    env.from_collection(vec![kv("print", 1), kv("me", 2)])
        .rebalance()
        .print()
        .name("printer");
    let r = run(&env).unwrap();
    assert_eq!(r.records_read(), 2);
    assert_eq!(r.tasks.iter().filter(|t| t.name == "printer").count(), 2);
    let received: u64 = r
        .tasks
        .iter()
        .filter(|t| t.name == "printer")
        .map(|t| t.records)
        .sum();
    assert_eq!(received, 2);
}
