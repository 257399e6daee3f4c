//! Property: for random inputs and random failure points, the committed output of a job
//! that fails and restarts itself from its checkpoints equals that of an uninterrupted run.

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use weir::prelude::*;

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
}
