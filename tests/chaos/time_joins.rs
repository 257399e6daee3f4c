//! Joins by time through crashes: the `joins` example (an interval join, then a temporal
//! join, over one file of two interleaved streams out of order) is killed with SIGKILL at
//! random moments and resumed at parallelism 1, 2 and 3 in turn, so its buffered records
//! and versions move between subtasks by key group; its committed output must be exactly
//! that of an uninterrupted run, which must in turn be the brute-force join of the input.

use super::event_time::difference;
use crate::harness::{ExampleRun, Rng, committed_lines, kill_at_random, soak_factor};
use std::collections::{BTreeMap, BTreeSet};

/// The example's defaults.
const MAX_DELAY: i64 = 5;
const LOWER: i64 = -5;
const UPPER: i64 = 10;

/// One input line: (side L/R/D, event time, key, value).
pub type Line = (char, i64, String, i64);

/// `n` lines over `keys` keys, out of order by at most the watermark's bound (so none is
/// late: the output then does not depend on how the two sides interleave at the join);
/// `deletes` lets rows be deleted (temporal join). A key has at most one R/D line per time.
pub fn lines(n: usize, keys: u64, seed: u64, deletes: bool) -> Vec<Line> {
    let mut rng = Rng::new(seed);
    let mut t = 0i64;
    let mut versions = BTreeSet::new();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        t += rng.below(2) as i64;
        let ts = t - rng.below(MAX_DELAY as u64 + 1) as i64;
        let key = format!("k{}", rng.below(keys));
        let value = rng.below(1000) as i64;
        let side = match rng.below(10) {
            0..5 => 'L',
            5 if deletes => 'D',
            _ => 'R',
        };
        if side != 'L' && !versions.insert((key.clone(), ts)) {
            continue;
        }
        out.push((side, ts, key, value));
    }
    out
}

pub fn to_text(lines: &[Line]) -> String {
    lines
        .iter()
        .map(|(s, ts, k, v)| format!("{s},{ts},{k},{v}\n"))
        .collect()
}

/// Every pair of a left and a right line of one key within the interval, as the example
/// writes it (`key,left_ts,left_value,right_ts,right_value`), sorted.
pub fn interval_model(lines: &[Line]) -> Vec<String> {
    let mut right: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    for (s, ts, k, v) in lines {
        if *s == 'R' {
            right.entry(k).or_default().push((*ts, *v));
        }
    }
    let mut out = Vec::new();
    for (s, ts, k, v) in lines.iter().filter(|l| l.0 == 'L') {
        debug_assert_eq!(*s, 'L');
        for (rt, rv) in right.get(k.as_str()).into_iter().flatten() {
            if ts + LOWER <= *rt && *rt <= ts + UPPER {
                out.push(format!("{k},{ts},{v},{rt},{rv}"));
            }
        }
    }
    out.sort_unstable();
    out
}

/// Every left line with the row's value at its time (the newest R or D line of its key at
/// or before it; `-` for none or a delete), as the example writes it (`key,ts,value,row`).
pub fn temporal_model(lines: &[Line]) -> Vec<String> {
    let mut versions: BTreeMap<&str, BTreeMap<i64, Option<i64>>> = BTreeMap::new();
    for (s, ts, k, v) in lines {
        if *s != 'L' {
            versions
                .entry(k)
                .or_default()
                .insert(*ts, (*s == 'R').then_some(*v));
        }
    }
    let mut out: Vec<String> = lines
        .iter()
        .filter(|l| l.0 == 'L')
        .map(|(_, ts, k, v)| {
            let row = versions
                .get(k.as_str())
                .and_then(|vs| vs.range(..=ts).next_back())
                .and_then(|(_, row)| *row)
                .map_or("-".to_string(), |r| r.to_string());
            format!("{k},{ts},{v},{row}")
        })
        .collect();
    out.sort_unstable();
    out
}

/// An input file with output and checkpoint directories for `joins`.
struct Run {
    run: ExampleRun,
    join: &'static str,
}

impl std::ops::Deref for Run {
    type Target = ExampleRun;
    fn deref(&self) -> &ExampleRun {
        &self.run
    }
}

impl Run {
    fn new(join: &'static str, state: &'static str, text: &str) -> Run {
        Run {
            run: ExampleRun::new(
                "joins",
                env!("CARGO_BIN_EXE_joins"),
                "input.csv",
                text,
                &["--join", join, "--state", state],
            ),
            join,
        }
    }

    fn committed(&self) -> Vec<String> {
        let dir = self.output.join(if self.join == "interval" {
            "pairs"
        } else {
            "joined"
        });
        committed_lines(&dir, true)
    }
}

/// An uninterrupted run equals the model; a run killed a dozen times and resumed at
/// parallelism 1, 2 and 3 in turn equals the uninterrupted run.
fn survives_kills(join: &'static str, state: &'static str, input: &[Line], want: Vec<String>) {
    let text = to_text(input);
    let uninterrupted = Run::new(join, state, &text);
    uninterrupted.run_to_end(2);
    let reference = uninterrupted.committed();
    let diff = difference(join, &reference, &want);
    assert!(
        diff.is_empty(),
        "an uninterrupted run differs from the model: {diff}"
    );

    // About 1.5 s of input at 2,000 lines/s: up to a dozen runs of 50–250 ms, each killed
    // (unless it got to the end by itself), then one run to the end.
    let chaos = Run::new(join, state, &text);
    let landed = kill_at_random("joins", 12 * soak_factor(), 0x701, 200, |i| {
        chaos.command([1, 2, 3][i % 3], Some(2_000))
    });
    eprintln!("{join} join: {landed} kills landed before a run read the whole input");
    assert!(landed >= 4, "only {landed} kills landed while the job ran");
    chaos.run_to_end(2);
    let diff = difference(join, &chaos.committed(), &reference);
    assert!(
        diff.is_empty(),
        "killed and resumed, the job committed another output than an uninterrupted run: {diff}"
    );
}

#[test]
fn sigkill_and_rescale_change_no_interval_join_result() {
    let input = lines(3_000, 8, 41, false);
    let want = interval_model(&input);
    assert!(want.len() > 1_000, "only {} pairs", want.len());
    survives_kills("interval", "rocksdb", &input, want);
}

#[test]
fn sigkill_and_rescale_change_no_temporal_join_result() {
    let input = lines(3_000, 8, 43, true);
    let want = temporal_model(&input);
    let rows = want.iter().filter(|l| !l.ends_with(",-")).count();
    // Records found a row, and deletes and the time before a key's first version left
    // records without one.
    assert!(
        rows > 1_000 && want.len() - rows > 100,
        "{rows} of {} with a row",
        want.len()
    );
    survives_kills("temporal", "memory", &input, want);
}
