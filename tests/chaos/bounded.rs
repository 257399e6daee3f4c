//! Bounded jobs with checkpoints end: sources that finish at different times wait for the
//! final checkpoint together, and transactional sinks hand over everything exactly once.

use std::sync::mpsc;
use std::time::Duration;
use weir::prelude::*;

#[test]
fn sources_finishing_at_different_times_end_with_a_final_checkpoint() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("slow.txt");
    std::fs::write(
        &file,
        (0..400).map(|i| format!("{i}\n")).collect::<String>(),
    )
    .expect("write input");
    let env = Env::new().parallelism(1).checkpoints(
        CheckpointConfig::new(dir.path().join("ck")).interval(Duration::from_millis(10)),
    );
    // The collection ends at once; the file source needs about 100 ms more.
    let fast = env
        .from_collection((1000..1010).collect::<Vec<i64>>())
        .uid("fast");
    let slow = env
        .read_text_file_at_rate(&file, 4_000)
        .uid("slow")
        .map(|l: String| l.parse::<i64>().expect("number"));
    let out = fast.union(&[slow]).collect();
    let (tx, rx) = mpsc::channel();
    let handle = env.execute_async("bounded").expect("start");
    std::thread::spawn(move || {
        let _ = tx.send(handle.join());
    });
    let result = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the job did not end: it hung")
        .expect("the job failed");
    assert!(
        result.checkpoints_completed >= 1,
        "no final checkpoint was taken"
    );
    let mut want: Vec<i64> = (0..400).chain(1000..1010).collect();
    want.sort_unstable();
    assert_eq!(out.sorted(), want);
}

#[test]
fn at_least_once_mode_runs_without_alignment() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("in.txt");
    std::fs::write(
        &file,
        (0..300).map(|i| format!("{i}\n")).collect::<String>(),
    )
    .expect("write input");
    let mut ck = CheckpointConfig::new(dir.path().join("ck")).interval(Duration::from_millis(10));
    ck.exactly_once = false;
    let env = Env::new().parallelism(2).checkpoints(ck);
    let a = env
        .read_text_file_at_rate(&file, 3_000)
        .uid("a")
        .map(|l: String| l.parse::<i64>().expect("number"));
    let b = env
        .from_collection((1000..1100).collect::<Vec<i64>>())
        .uid("b");
    let sums = a
        .union(&[b])
        .key_by(|v| v % 7)
        .reduce(|x, y| x + y)
        .uid("sums")
        .collect();
    let (tx, rx) = mpsc::channel();
    let handle = env.execute_async("at-least-once").expect("start");
    std::thread::spawn(move || {
        let _ = tx.send(handle.join());
    });
    let result = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the job hung")
        .expect("the job failed");
    assert!(
        result.checkpoints_completed >= 2,
        "expected periodic checkpoints, got {}",
        result.checkpoints_completed
    );
    // Without failures, at-least-once gives the same rolling sums: one per record, and each
    // key's total among them.
    let mut want = std::collections::BTreeMap::new();
    for v in (0..300).chain(1000..1100) {
        *want.entry(v % 7).or_insert(0) += v;
    }
    let got = sums.values();
    assert_eq!(got.len(), 400);
    for (k, total) in want {
        assert!(got.contains(&total), "key {k}: total {total} never emitted");
    }
}
