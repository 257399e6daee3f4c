//! Property: for random inputs and random failure points, the committed output of a job
//! that fails and restarts itself from its checkpoints equals that of an uninterrupted run
//! — for a running sum, and for event-time session windows with late data.

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use weir::prelude::*;

use crate::event_time::{
    CountSum, Event, GAP, LATENESS, MAX_DELAY, assert_same, events, model, to_text,
};

#[derive(Default)]
struct RunningSum {
    sum: Option<ValueState<i64>>,
}

impl KeyedProcessFunction<u32, (u32, i64), (u32, i64)> for RunningSum {
    fn open(&mut self, state: &mut StateContext<u32>) -> weir::Result<()> {
        self.sum = Some(state.value_state("sum")?);
        Ok(())
    }
    fn process(
        &mut self,
        (k, v): (u32, i64),
        ctx: &mut KeyedContext<'_, u32, (u32, i64)>,
    ) -> weir::Result<()> {
        let s = self.sum.as_mut().expect("opened");
        let next = s.get()?.unwrap_or(0) + v;
        s.set(next)?;
        ctx.emit((k, next));
        Ok(())
    }
}

/// Panics at the records whose positions are in `failures`, each once (the job restarts
/// and reads the record again).
fn failing_at(failures: Vec<usize>) -> impl Fn(usize) + Send + Sync + 'static {
    let next_failure = AtomicUsize::new(0);
    move |i| {
        let n = next_failure.load(Ordering::SeqCst);
        if failures.get(n) == Some(&i) {
            next_failure.fetch_add(1, Ordering::SeqCst);
            panic!("injected failure at record {i}");
        }
    }
}

/// The committed lines in `dir`, sorted; no uncommitted file may be left.
fn committed(dir: &std::path::Path) -> Vec<String> {
    if dir.exists() {
        crate::harness::committed_lines(dir, true)
    } else {
        Vec::new()
    }
}

/// Runs `late_sessions`' pipeline over `input` in this process, failing at the records
/// whose positions are in `failures`, and returns the committed (sessions, late records).
fn run_sessions(
    input: &[Event],
    failures: Vec<usize>,
    parallelism: usize,
) -> (Vec<String>, Vec<String>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("in.csv");
    let text: String = to_text(input)
        .lines()
        .enumerate()
        .map(|(i, l)| format!("{i},{l}\n"))
        .collect();
    std::fs::write(&file, text).expect("write input");
    let out = dir.path().join("out");
    let mut ck = CheckpointConfig::new(dir.path().join("ck")).interval(Duration::from_millis(10));
    ck.restart =
        weir::RestartStrategy::fixed_delay(failures.len() as u32 + 1, Duration::from_millis(1));
    let env = Env::new().parallelism(parallelism).checkpoints(ck);
    let fail = failing_at(failures);
    let late = OutputTag::<Event>::new("late");
    let sessions = env
        .read_text_file_at_rate(&file, 5_000)
        .parallelism(1)
        .uid("source")
        .map(move |line: String| {
            let mut p = line.splitn(4, ',');
            let mut next = || p.next().expect("field");
            let i: usize = next().parse().expect("index");
            let ts: i64 = next().parse().expect("ts");
            let k = next().to_string();
            let v: i64 = next().parse().expect("value");
            fail(i);
            (ts, k, v)
        })
        .parallelism(1)
        .with_watermarks(
            WatermarkStrategy::bounded_out_of_orderness(MAX_DELAY)
                .with_timestamps(|e: &Event| e.0)
                .with_per_record_watermarks(),
        )
        .parallelism(1)
        .uid("watermarks")
        .key_by(|e| e.1.clone())
        .window(WindowAssigner::session(GAP))
        .allowed_lateness(LATENESS)
        .side_output_late_data(&late)
        .aggregate_with_window(CountSum, |k: &String, w: &TimeWindow, (n, sum)| {
            format!("{k},{},{},{n},{sum}", w.start, w.end)
        })
        .uid("sessions");
    sessions
        .write_text_exactly_once(out.join("sessions"), |l| l.clone())
        .uid("sessions-sink");
    sessions
        .side_output(&late)
        .write_text_exactly_once(out.join("late"), |(ts, k, v)| format!("{ts},{k},{v}"))
        .uid("late-sink");
    env.execute("property-sessions")
        .expect("the job recovers from every injected failure");
    (
        committed(&out.join("sessions")),
        committed(&out.join("late")),
    )
}

/// Runs the job over `input`, failing at the records whose positions are in `failures`
/// (each once), and returns the committed (key, sum) lines.
fn run(input: &[(u32, i64)], failures: Vec<usize>, parallelism: usize) -> BTreeMap<u32, Vec<i64>> {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("in.csv");
    let text: String = input
        .iter()
        .enumerate()
        .map(|(i, (k, v))| format!("{i},{k},{v}\n"))
        .collect();
    std::fs::write(&file, text).expect("write input");
    let out = dir.path().join("out");
    let mut ck = CheckpointConfig::new(dir.path().join("ck")).interval(Duration::from_millis(10));
    ck.restart =
        weir::RestartStrategy::fixed_delay(failures.len() as u32 + 1, Duration::from_millis(1));
    let env = Env::new().parallelism(parallelism).checkpoints(ck);
    let failures = Arc::new(failures);
    let next_failure = Arc::new(AtomicUsize::new(0));
    env.read_text_file_at_rate(&file, 5_000)
        .parallelism(1)
        .uid("source")
        .map(move |line: String| {
            let mut parts = line.split(',');
            let i: usize = parts.next().and_then(|p| p.parse().ok()).expect("index");
            let k: u32 = parts.next().and_then(|p| p.parse().ok()).expect("key");
            let v: i64 = parts.next().and_then(|p| p.parse().ok()).expect("value");
            let n = next_failure.load(Ordering::SeqCst);
            if failures.get(n) == Some(&i) {
                next_failure.fetch_add(1, Ordering::SeqCst);
                panic!("injected failure at record {i}");
            }
            (k, v)
        })
        .parallelism(1)
        .key_by(|(k, _)| *k)
        .process(RunningSum::default)
        .uid("sum")
        .write_text_exactly_once(&out, |(k, s)| format!("{k},{s}"))
        .uid("sink");
    env.execute("property")
        .expect("the job recovers from every injected failure");
    let mut got: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
    for e in std::fs::read_dir(&out).expect("output") {
        let e = e.expect("entry");
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(".weir-owner-") {
            continue; // who owned the directory, not output
        }
        assert!(!name.starts_with('.'), "uncommitted file left behind");
        for line in std::fs::read_to_string(e.path()).expect("read").lines() {
            let (k, s) = line.split_once(',').expect("k,s");
            got.entry(k.parse().expect("k"))
                .or_default()
                .push(s.parse().expect("s"));
        }
    }
    for sums in got.values_mut() {
        sums.sort_unstable();
    }
    got
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn restarts_from_checkpoints_change_nothing(
        input in prop::collection::vec((0u32..8, 1i64..100), 50..600),
        fail_at in prop::collection::vec(0.0f64..1.0, 0..4),
        parallelism in 1usize..=3,
    ) {
        let mut failures: Vec<usize> = fail_at.iter().map(|f| (f * input.len() as f64) as usize).collect();
        failures.sort_unstable();
        failures.dedup();
        let mut reference: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
        let mut sums: BTreeMap<u32, i64> = BTreeMap::new();
        for (k, v) in &input {
            let s = sums.entry(*k).or_default();
            *s += v;
            reference.entry(*k).or_default().push(*s);
        }
        let uninterrupted = run(&input, vec![], parallelism);
        prop_assert_eq!(&uninterrupted, &reference);
        let with_failures = run(&input, failures, parallelism);
        prop_assert_eq!(with_failures, uninterrupted);
    }

    /// Session windows over out-of-order data with late records: where the job fails
    /// changes neither the firings nor the late records (the watermark is restored).
    #[test]
    fn restarts_change_no_event_time_result(
        seed in any::<u64>(),
        n in 100usize..600,
        fail_at in prop::collection::vec(0.0f64..1.0, 1..4),
        parallelism in 1usize..=3,
    ) {
        let input = events(n, 4, seed);
        let mut failures: Vec<usize> = fail_at.iter().map(|f| (f * n as f64) as usize).collect();
        failures.sort_unstable();
        failures.dedup();
        let uninterrupted = run_sessions(&input, vec![], parallelism);
        assert_same(&uninterrupted, &model(&input), "an uninterrupted run differs from the model");
        let with_failures = run_sessions(&input, failures.clone(), parallelism);
        assert_same(
            &with_failures,
            &uninterrupted,
            &format!("failing at records {failures:?} changed the output"),
        );
    }
}
