//! Windows and timers in RocksDB through crashes: `late_sessions` on the RocksDB backend
//! with a write-back cache of 4 entries per state table, so nearly every window pane,
//! session and timer lives in RocksDB rather than in memory, is killed with SIGKILL at
//! random moments and resumed at parallelism 1, 2 and 3 in turn (each restore splits or
//! merges key groups of panes and timers). Its committed window results and late records
//! must be exactly those of an uninterrupted run on the memory backend, line for line:
//! one line per (key, window) firing, with its count and sum.

use crate::event_time::{assert_same, events, model, to_text};
use crate::harness::{ExampleRun, committed_lines, kill_at_random, soak_factor};
use std::path::Path;

/// A `late_sessions` run with `args` on `input`.
fn run(text: &str, args: &[&str]) -> ExampleRun {
    ExampleRun::new(
        "late_sessions",
        env!("CARGO_BIN_EXE_late_sessions"),
        "input.csv",
        text,
        args,
    )
}

/// The committed (window results, late records), sorted.
fn committed(run: &ExampleRun, complete: bool) -> (Vec<String>, Vec<String>) {
    let read = |d: &Path| {
        if d.exists() {
            committed_lines(d, complete)
        } else {
            Vec::new()
        }
    };
    (
        read(&run.output.join("sessions")),
        read(&run.output.join("late")),
    )
}

/// Runs `windows` (extra flags) uninterrupted on the heap, then killed and resumed on
/// RocksDB with a tiny cache; both must commit the same lines. Returns the reference.
fn killed_on_rocksdb_equals_heap(
    text: &str,
    windows: &[&str],
    seed: u64,
) -> (Vec<String>, Vec<String>) {
    let heap_args: Vec<&str> = ["--state", "memory"]
        .iter()
        .chain(windows)
        .copied()
        .collect();
    let reference = run(text, &heap_args);
    reference.run_to_end(2);
    let reference = committed(&reference, true);

    let rocks_args: Vec<&str> = ["--state", "rocksdb", "--state-cache-entries", "4"]
        .iter()
        .chain(windows)
        .copied()
        .collect();
    let chaos = run(text, &rocks_args);
    let landed = kill_at_random("late_sessions", 16 * soak_factor(), seed, 250, |i| {
        chaos.command([1, 2, 3][i % 3], Some(1_500))
    });
    eprintln!("rocks_windows {windows:?}: {landed} kills landed before a run read the whole input");
    assert!(
        landed >= 5,
        "only {landed} kills landed while the job was running"
    );
    chaos.run_to_end(2);
    assert_same(
        &committed(&chaos, true),
        &reference,
        "killed and resumed on RocksDB, the job committed another output than an \
         uninterrupted run on the heap",
    );
    reference
}

/// Session windows: sessions and their timers in RocksDB, merged and deleted as records
/// bridge sessions; 200 keys against a cache of 4 entries.
#[test]
fn sigkill_with_sessions_and_timers_in_rocksdb_changes_no_result() {
    let input = events(3_000 * soak_factor(), 200, 23);
    let reference = killed_on_rocksdb_equals_heap(&to_text(&input), &[], 0x5E55);
    assert_same(
        &reference,
        &model(&input),
        "an uninterrupted run differs from the model",
    );
}

/// Sliding windows: one pane per (key, window) in RocksDB, four windows per record, each
/// with a timer at its end and one at its cleanup time.
#[test]
fn sigkill_with_sliding_window_panes_in_rocksdb_changes_no_result() {
    let input = events(3_000 * soak_factor(), 200, 29);
    let (fired, late) =
        killed_on_rocksdb_equals_heap(&to_text(&input), &["--sliding", "40,10"], 0x511D);
    // The input exercises what is at stake: late records, and windows fired again within
    // the allowed lateness (the same key and window twice).
    assert!(late.len() > 100, "only {} late records", late.len());
    let windows: std::collections::BTreeSet<&str> = fired
        .iter()
        .map(|l| &l[..l.match_indices(',').nth(2).unwrap().0])
        .collect();
    assert!(
        fired.len() > windows.len() + 20,
        "too few late firings: {} firings of {} windows",
        fired.len(),
        windows.len()
    );
}

/// The example's window and cache flags refuse bad values, saying what they take.
#[test]
fn bad_window_and_cache_flags_are_refused_saying_why() {
    for (args, want) in [
        (
            &["--sliding", "40"][..],
            "--sliding takes SIZE,SLIDE (two integers), got \"40\"",
        ),
        (
            &["--sliding", "40,0"][..],
            "--sliding 40,0: SIZE and SLIDE must be positive",
        ),
        (
            &["--state", "memory", "--state-cache-entries", "4"][..],
            "--state-cache-entries applies to the rocksdb state backend only, not to `memory`",
        ),
        (
            &["--state", "rocksdb", "--state-cache-entries", "0"][..],
            "--state-cache-entries must be at least 1",
        ),
    ] {
        let out = run("1,a,1\n", args)
            .command(1, None)
            .output()
            .expect("run late_sessions");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} must be refused");
        assert!(err.contains(want), "unclear error for {args:?}:\n{err}");
    }
}
