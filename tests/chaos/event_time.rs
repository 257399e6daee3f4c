//! Event time through crashes: `late_sessions` (session windows over out-of-order data
//! with watermarks after every record, allowed lateness and a late-data side output) is
//! killed with SIGKILL at random moments and resumed, at parallelism 1, 2 and 3 in turn;
//! its committed sessions and late records must be exactly those of an uninterrupted run,
//! which must in turn be those of a plain-Rust model of the windows.

use crate::harness::{ExampleRun, Rng, committed_lines, kill_at_random, soak_factor};
use std::collections::BTreeMap;
use std::path::Path;

/// The job's settings (the example's defaults).
pub const MAX_DELAY: i64 = 5;
pub const GAP: i64 = 10;
pub const LATENESS: i64 = 20;

/// One input record: (event time, key, value).
pub type Event = (i64, String, i64);

/// `n` records over `keys` keys, mostly within the out-of-orderness bound, with a share of
/// records delayed past it: some join their session within the allowed lateness (late
/// firings), some come after their session was dropped (late records). Pauses close
/// sessions.
pub fn events(n: usize, keys: u64, seed: u64) -> Vec<Event> {
    let mut rng = Rng::new(seed);
    let mut t = 0i64;
    (0..n)
        .map(|_| {
            t += 1 + rng.below(3) as i64;
            if rng.below(40) == 0 {
                t += 3 * GAP;
            }
            let ts = match rng.below(100) {
                0..55 => t - rng.below(MAX_DELAY as u64 + 1) as i64,
                55..75 => t - MAX_DELAY - 1 - rng.below((GAP + LATENESS) as u64) as i64,
                _ => t - MAX_DELAY - GAP - LATENESS - rng.below(200) as i64,
            };
            let key = format!("k{}", rng.below(keys));
            (ts, key, 1 + rng.below(100) as i64)
        })
        .collect()
}

pub fn to_text(events: &[Event]) -> String {
    events
        .iter()
        .map(|(ts, k, v)| format!("{ts},{k},{v}\n"))
        .collect()
}

/// An open session of the model: [start, end), count, sum, fired.
struct Session {
    start: i64,
    end: i64,
    count: u64,
    sum: i64,
    fired: bool,
}

/// What the job must write, computed the plain way: per record, in file order, the
/// session it joins (or that it is late), then the watermark it advances (largest
/// timestamp - max delay - 1), firing and dropping sessions. Returns the sorted session
/// lines (`key,start,end,count,sum`, one per firing) and late lines (`ts,key,value`).
pub fn model(events: &[Event]) -> (Vec<String>, Vec<String>) {
    let mut open: BTreeMap<String, Vec<Session>> = BTreeMap::new();
    let (mut fired, mut late) = (Vec::new(), Vec::new());
    let mut wm = i64::MIN;
    let mut max_ts = i64::MIN;
    let line = |k: &str, s: &Session| format!("{k},{},{},{},{}", s.start, s.end, s.count, s.sum);
    let advance = |open: &mut BTreeMap<String, Vec<Session>>, fired: &mut Vec<String>, wm: i64| {
        for (k, sessions) in open.iter_mut() {
            for s in sessions.iter_mut() {
                if !s.fired && s.end - 1 <= wm {
                    s.fired = true;
                    fired.push(line(k, s));
                }
            }
            sessions.retain(|s| (s.end - 1).saturating_add(LATENESS) > wm);
        }
    };
    for (ts, k, v) in events {
        let sessions = open.entry(k.clone()).or_default();
        let (mut start, mut end) = (*ts, ts + GAP);
        let mut absorbed: Vec<Session> = Vec::new();
        loop {
            let before = absorbed.len();
            let (hit, rest): (Vec<_>, Vec<_>) = std::mem::take(sessions)
                .into_iter()
                .partition(|s| start <= s.end && end >= s.start);
            *sessions = rest;
            for s in hit {
                start = start.min(s.start);
                end = end.max(s.end);
                absorbed.push(s);
            }
            if absorbed.len() == before {
                break;
            }
        }
        if (end - 1).saturating_add(LATENESS) <= wm {
            late.push(format!("{ts},{k},{v}"));
            sessions.extend(absorbed);
        } else {
            let mut s = Session {
                start,
                end,
                count: 1,
                sum: *v,
                fired: end - 1 <= wm,
            };
            for a in absorbed {
                s.count += a.count;
                s.sum += a.sum;
            }
            if s.fired {
                fired.push(line(k, &s));
            }
            sessions.push(s);
        }
        if *ts > max_ts {
            max_ts = *ts;
            let next = max_ts - MAX_DELAY - 1;
            if next > wm {
                wm = next;
                advance(&mut open, &mut fired, wm);
            }
        }
    }
    advance(&mut open, &mut fired, i64::MAX);
    fired.sort_unstable();
    late.sort_unstable();
    (fired, late)
}

/// What `got` has that `want` lacks and the reverse (both sorted), for a readable
/// assertion message; empty when they are equal.
pub fn difference(what: &str, got: &[String], want: &[String]) -> String {
    let (mut extra, mut missing) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    loop {
        match (got.get(i), want.get(j)) {
            (Some(a), Some(b)) if a == b => {
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a > b => {
                missing.push(b);
                j += 1;
            }
            (Some(a), _) => {
                extra.push(a);
                i += 1;
            }
            (None, Some(b)) => {
                missing.push(b);
                j += 1;
            }
            (None, None) => break,
        }
    }
    if extra.is_empty() && missing.is_empty() {
        return String::new();
    }
    format!(
        "{what}: {} more than expected {extra:?}, {} missing {missing:?}",
        extra.len(),
        missing.len()
    )
}

/// Asserts equal (sessions, late records), naming the differences.
pub fn assert_same(
    got: &(Vec<String>, Vec<String>),
    want: &(Vec<String>, Vec<String>),
    what: &str,
) {
    let diffs = [
        difference("session firings", &got.0, &want.0),
        difference("late records", &got.1, &want.1),
    ];
    let diffs: Vec<&String> = diffs.iter().filter(|d| !d.is_empty()).collect();
    assert!(diffs.is_empty(), "{what}:\n{diffs:?}");
}

/// An input file with output and checkpoint directories for `late_sessions`.
struct Run(ExampleRun);

impl std::ops::Deref for Run {
    type Target = ExampleRun;
    fn deref(&self) -> &ExampleRun {
        &self.0
    }
}

impl Run {
    fn new(text: &str) -> Run {
        Run(ExampleRun::new(
            "late_sessions",
            env!("CARGO_BIN_EXE_late_sessions"),
            "input.csv",
            text,
            &["--state", "memory"],
        ))
    }

    /// The committed (sessions, late records), sorted.
    fn committed(&self, complete: bool) -> (Vec<String>, Vec<String>) {
        let read = |d: &Path| {
            if d.exists() {
                committed_lines(d, complete)
            } else {
                Vec::new()
            }
        };
        (
            read(&self.output.join("sessions")),
            read(&self.output.join("late")),
        )
    }
}

#[test]
fn sigkill_and_rescale_change_no_event_time_result() {
    let input = events(3_000 * soak_factor(), 6, 19);
    let text = to_text(&input);
    let (sessions, late) = model(&input);
    // The input exercises what is at stake: late records, and sessions fired again.
    assert!(late.len() > 100, "only {} late records", late.len());
    let mut firings: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for l in &sessions {
        let mut p = l.splitn(3, ',');
        *firings
            .entry((p.next().unwrap(), p.next().unwrap()))
            .or_default() += 1;
    }
    assert!(
        firings.values().filter(|n| **n > 1).count() > 20,
        "too few late firings"
    );

    let uninterrupted = Run::new(&text);
    uninterrupted.run_to_end(2);
    let reference = uninterrupted.committed(true);
    assert_same(
        &reference,
        &(sessions, late),
        "an uninterrupted run differs from the model",
    );

    // About 2 s of input at 1,500 records/s: a dozen runs or more of 50–300 ms, each killed,
    // until one gets to the end by itself.
    let chaos = Run::new(&text);
    let landed = kill_at_random("late_sessions", 16 * soak_factor(), 0xE7E7, 250, |i| {
        chaos.command([1, 2, 3][i % 3], Some(1_500))
    });
    eprintln!("event_time: {landed} kills landed before a run read the whole input");
    assert!(
        landed >= 5,
        "only {landed} kills landed while the job was running"
    );
    chaos.run_to_end(2);
    assert_same(
        &chaos.committed(true),
        &reference,
        "killed and resumed, the job committed another output than an uninterrupted run",
    );
}

/// Count and sum of a session's values (the aggregate of `late_sessions`).
pub struct CountSum;

impl weir::prelude::AggregateFunction<Event, (u64, i64), (u64, i64)> for CountSum {
    fn create(&self) -> (u64, i64) {
        (0, 0)
    }
    fn add(&self, acc: &mut (u64, i64), e: Event) {
        acc.0 += 1;
        acc.1 += e.2;
    }
    fn result(&self, acc: &(u64, i64)) -> (u64, i64) {
        *acc
    }
    fn merge(&self, acc: &mut (u64, i64), other: (u64, i64)) {
        acc.0 += other.0;
        acc.1 += other.1;
    }
}
