//! Process functions as in Flink's DataStream API: side outputs from keyed, co- and
//! non-keyed process functions (exact records and timestamps, through checkpoint
//! barriers), errors for undeclared side outputs, and state handles built by the factory.

use std::path::Path;
use std::time::Duration;
use weir::prelude::*;
use weir_tests::{Stamped, event_time, run, run_failing};

/// (account, cents)
type Tx = (u32, i64);

const SMALL: i64 = 100;
const LARGE: i64 = 50_000;
const MINUTE: i64 = 60_000;

/// Flink's fraud detector in event time: a small transaction followed by a large one
/// within a minute is an alert (main output); a large one that is not goes to `review`;
/// a small one that no transaction followed within the minute goes to `expired` when its
/// timer fires, and the timer clears it.
struct FraudDetector {
    small: ValueState<(i64, Timestamp)>,
    review: OutputTag<Tx>,
    expired: OutputTag<Tx>,
}

impl KeyedProcessFunction<u32, Tx, (u32, i64, i64)> for FraudDetector {
    fn process(
        &mut self,
        (account, cents): Tx,
        ctx: &mut KeyedContext<'_, u32, (u32, i64, i64)>,
    ) -> Result<()> {
        let ts = ctx.timestamp().expect("records carry timestamps");
        let previous = self.small.get()?;
        if let Some((_, at)) = previous {
            ctx.delete_event_time_timer(at + MINUTE);
            self.small.clear()?;
        }
        if cents > LARGE {
            match previous.filter(|(_, at)| ts < at + MINUTE) {
                Some((small, _)) => ctx.emit((account, small, cents)),
                None => ctx.output(&self.review, (account, cents))?,
            }
        }
        if cents < SMALL {
            ctx.register_event_time_timer(ts + MINUTE);
            self.small.set((cents, ts))?;
        }
        Ok(())
    }

    fn on_timer(
        &mut self,
        _time: Timestamp,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<'_, u32, (u32, i64, i64)>,
    ) -> Result<()> {
        if let Some((cents, _)) = self.small.get()? {
            ctx.output(&self.expired, (*ctx.key(), cents))?;
        }
        self.small.clear()
    }
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

#[test]
fn a_keyed_process_function_emits_to_side_outputs_from_records_and_timers() {
    let env = Env::new().parallelism(2);
    let review = OutputTag::<Tx>::new("review");
    let expired = OutputTag::<Tx>::new("expired");
    let (r, e) = (review.clone(), expired.clone());
    // The watermark follows each record (max delay 0): after a record at t it is t - 1.
    let input = vec![
        ((1, 50), 1_000),
        ((1, 60_000), 20_000), // alert
        ((2, 90_000), 30_000), // large alone: review
        ((3, 10), 40_000),
        ((5, 1_000), 101_000), // its watermark (100_999) fires 3's timer: 3's small expires
        ((3, 70_000), 102_000), // 3's state was cleared by the timer: review
        ((6, 20), 200_000),    // expires at the end of input (maximum watermark)
    ];
    let alerts = event_time(&env, input, 0)
        .key_by(|(account, _)| *account)
        .process_with_state(move |state| {
            Ok(FraudDetector {
                small: state.value_state("small")?,
                review: r.clone(),
                expired: e.clone(),
            })
        })
        .with_side_output(&review)
        .with_side_output(&expired)
        .with_side_output(&review); // declaring twice declares once
    let for_review = Stamped::attach(&alerts.side_output(&review));
    let expirations = Stamped::attach(&alerts.side_output(&expired));
    let alerts = Stamped::attach(&alerts);
    run(&env).unwrap();
    // Side records take the record's timestamp, or the timer's.
    assert_eq!(sorted(alerts.values()), vec![((1, 50, 60_000), 20_000)]);
    assert_eq!(
        sorted(for_review.values()),
        vec![((2, 90_000), 30_000), ((3, 70_000), 102_000)]
    );
    assert_eq!(
        sorted(expirations.values()),
        vec![((3, 10), 100_000), ((6, 20), 260_000)]
    );
}

/// Input 1 passes through; input 2 reports each key's number of input-2 records so far
/// to the side output.
struct CountSecond {
    count: ValueState<u64>,
    counts: OutputTag<(String, u64)>,
}

impl CoProcessFunction<String, (String, i64), String, (String, i64)> for CountSecond {
    fn process1(
        &mut self,
        v: (String, i64),
        ctx: &mut CoContext<'_, String, (String, i64)>,
    ) -> Result<()> {
        ctx.emit(v);
        Ok(())
    }
    fn process2(
        &mut self,
        k: String,
        ctx: &mut CoContext<'_, String, (String, i64)>,
    ) -> Result<()> {
        let n = self.count.update(|c| c.unwrap_or(0) + 1)?;
        ctx.output(&self.counts, (k, n))
    }
}

#[test]
fn a_keyed_co_process_function_emits_to_side_outputs() {
    let env = Env::new().parallelism(2);
    let counts = OutputTag::<(String, u64)>::new("counts");
    let tag = counts.clone();
    let values = env
        .from_collection(vec![("a".to_string(), 1i64), ("b".into(), 2)])
        .key_by(|(k, _)| k.clone());
    let keys = env
        .from_collection(vec!["a".to_string(), "b".into(), "a".into()])
        .key_by(|k| k.clone());
    let out = values
        .connect(&keys)
        .process_with_state(move |state| {
            Ok(CountSecond {
                count: state.value_state("count")?,
                counts: tag.clone(),
            })
        })
        .with_side_output(&counts);
    let side = out.side_output(&counts).collect();
    let main = out.collect();
    run(&env).unwrap();
    assert_eq!(main.sorted(), vec![("a".to_string(), 1), ("b".into(), 2)]);
    assert_eq!(
        side.sorted(),
        vec![("a".to_string(), 1), ("a".into(), 2), ("b".into(), 1)]
    );
}

/// Reports (value, timestamp, watermark) of each record: even values on the main output,
/// odd ones on the side output.
struct Report {
    odd: OutputTag<(i64, Timestamp, Timestamp)>,
}

impl ProcessFunction<i64, (i64, Timestamp, Timestamp)> for Report {
    fn process(
        &mut self,
        v: i64,
        ctx: &mut ProcessContext<'_, (i64, Timestamp, Timestamp)>,
    ) -> Result<()> {
        let r = (v, ctx.timestamp().unwrap(), ctx.current_watermark());
        if v % 2 == 0 {
            ctx.emit(r);
            Ok(())
        } else {
            ctx.output(&self.odd, r)
        }
    }
}

#[test]
fn a_process_function_on_a_non_keyed_stream_sees_timestamps_and_watermarks() {
    let env = Env::new().parallelism(2);
    let odd = OutputTag::<(i64, Timestamp, Timestamp)>::new("odd");
    let tag = odd.clone();
    let out = event_time(&env, vec![(1, 10), (2, 20), (3, 30), (4, 40)], 0)
        .process(move || Report { odd: tag.clone() })
        .with_side_output(&odd)
        .parallelism(1);
    let side = out.side_output(&odd).collect();
    let main = out.collect();
    run(&env).unwrap();
    // Each record sees the watermark of the records before it.
    assert_eq!(main.sorted(), vec![(2, 20, 9), (4, 40, 29)]);
    assert_eq!(side.sorted(), vec![(1, 10, MIN_WATERMARK), (3, 30, 19)]);
}

#[test]
fn emitting_to_an_undeclared_side_output_fails_the_job_naming_the_tag() {
    let env = Env::new().parallelism(1);
    let odd = OutputTag::<(i64, Timestamp, Timestamp)>::new("odd-values");
    let tag = odd.clone();
    // The tag is given to the function but never declared on the operator.
    env.from_timestamped(vec![(1i64, 1)])
        .process(move || Report { odd: tag.clone() })
        .name("report")
        .collect();
    let e = run_failing(&env);
    let msg = e.to_string();
    for part in [
        "operator 'report'",
        "side output 'odd-values'",
        "with_side_output",
    ] {
        assert!(msg.contains(part), "error {msg:?} should mention {part:?}");
    }
    assert!(e.is_deterministic(), "a restart would fail the same way");
}

#[test]
#[should_panic(expected = "operator 'map' cannot declare side output 'late'")]
fn only_process_functions_declare_side_outputs() {
    let env = Env::new();
    let late = OutputTag::<i64>::new("late");
    let _ = env
        .from_collection(vec![1i64])
        .map(|x| x + 1)
        .with_side_output(&late);
}

#[test]
#[should_panic(expected = "operator 'reduce' cannot declare side output 'late'")]
fn a_rolling_reduce_declares_no_side_outputs() {
    let env = Env::new();
    let late = OutputTag::<(i64, i64)>::new("late");
    let _ = env
        .from_collection(vec![(1i64, 1i64)])
        .key_by(|(k, _)| *k)
        .reduce(|a, b| (a.0, a.1 + b.1))
        .with_side_output(&late);
}

#[test]
fn an_error_of_the_state_factory_fails_the_job_naming_the_operator() {
    struct Never;
    impl KeyedProcessFunction<i64, i64, i64> for Never {
        fn process(&mut self, _: i64, _: &mut KeyedContext<'_, i64, i64>) -> Result<()> {
            unreachable!("the factory failed")
        }
    }
    let env = Env::new().parallelism(1);
    env.from_collection(vec![1i64])
        .key_by(|x| *x)
        .process_with_state(|_| -> Result<Never> { Err(Error::user("no limits configured")) })
        .name("limits")
        .collect();
    let msg = run_failing(&env).to_string();
    assert!(
        msg.contains("operator 'limits'") && msg.contains("no limits configured"),
        "{msg}"
    );
}

/// The committed lines of an exactly-once file sink's directory, sorted.
fn committed_lines(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue; // uncommitted
        }
        let text = std::fs::read_to_string(entry.path()).unwrap();
        lines.extend(text.lines().map(str::to_string));
    }
    lines.sort();
    lines
}

#[test]
fn side_outputs_pass_checkpoint_barriers_like_the_main_output() {
    // Exactly-once file sinks commit only when a checkpoint their barrier reached
    // completes: a side port that did not forward barriers would keep the final
    // checkpoint from completing and its records uncommitted.
    let dir = tempfile::tempdir().unwrap();
    let (ck, evens_dir, odds_dir) = (
        dir.path().join("ck"),
        dir.path().join("evens"),
        dir.path().join("odds"),
    );
    let env = Env::new()
        .parallelism(2)
        .checkpoints(CheckpointConfig::new(&ck).interval(Duration::ZERO));
    let odd = OutputTag::<(i64, Timestamp, Timestamp)>::new("odd");
    let tag = odd.clone();
    let out = env
        .from_timestamped((1..=6).map(|v| (v, v * 10)).collect())
        .with_watermarks(WatermarkStrategy::monotonous())
        .process(move || Report { odd: tag.clone() })
        .with_side_output(&odd);
    // The sinks run at another parallelism than the process function, so they are not
    // chained to it: barriers reach them through channels, after the records before them.
    out.write_text_exactly_once(&evens_dir, |r| format!("{} at {}", r.0, r.1))
        .parallelism(1);
    out.side_output(&odd)
        .write_text_exactly_once(&odds_dir, |r| format!("{} at {}", r.0, r.1))
        .parallelism(1);
    run(&env).unwrap();
    assert_eq!(
        committed_lines(&evens_dir),
        vec!["2 at 20", "4 at 40", "6 at 60"]
    );
    assert_eq!(
        committed_lines(&odds_dir),
        vec!["1 at 10", "3 at 30", "5 at 50"]
    );
}
