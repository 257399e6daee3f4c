//! Timers of keyed process functions: event-time timers fire in time order once the
//! watermark passes them (and at end of input), deleted timers never fire, a timer
//! registered twice fires once; processing-time timers fire on the wall clock, and at
//! end of input those not yet due are dropped and counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use weir::metrics;
use weir::prelude::*;
use weir_tests::{Stamped, event_time, run, unique};

/// What the timer test function reports: ("rec", key, record timestamp, watermark) or
/// ("timer", key, timer time, watermark at firing).
type Report = (String, String, Timestamp, Timestamp);

/// `(key, t)` with `t >= 0` registers an event-time timer at `t`; `t < 0` deletes the one
/// at `-t`.
struct TimerCommands;

impl KeyedProcessFunction<String, (String, i64), Report> for TimerCommands {
    fn process(
        &mut self,
        (key, t): (String, i64),
        ctx: &mut KeyedContext<'_, String, Report>,
    ) -> Result<()> {
        if t >= 0 {
            ctx.register_event_time_timer(t);
        } else {
            ctx.delete_event_time_timer(-t);
        }
        let ts = ctx.timestamp().expect("records carry timestamps");
        let wm = ctx.current_watermark();
        ctx.emit(("rec".into(), key, ts, wm));
        Ok(())
    }

    fn on_timer(
        &mut self,
        time: Timestamp,
        domain: TimeDomain,
        ctx: &mut KeyedContext<'_, String, Report>,
    ) -> Result<()> {
        assert_eq!(domain, TimeDomain::EventTime);
        assert_eq!(ctx.timestamp(), Some(time));
        let (key, wm) = (ctx.key().clone(), ctx.current_watermark());
        ctx.emit(("timer".into(), key, time, wm));
        Ok(())
    }
}

fn cmd(k: &str, t: i64, ts: Timestamp) -> ((String, i64), Timestamp) {
    ((k.to_string(), t), ts)
}

fn report(kind: &str, k: &str, t: Timestamp, wm: Timestamp) -> (Report, Timestamp) {
    // Records keep their timestamp; timer outputs get the timer's time.
    ((kind.to_string(), k.to_string(), t, wm), t)
}

#[test]
fn event_time_timers_fire_in_order_when_the_watermark_passes() {
    let env = Env::new().parallelism(1);
    let input = vec![
        cmd("a", 15, 10), // wm 9
        cmd("a", 12, 11), // wm 10
        cmd("b", 12, 12), // wm 11
        cmd("a", 15, 13), // duplicate of a@15; wm 12 fires a@12, b@12
        cmd("b", 14, 14), // wm 13
        cmd("b", -14, 14),
        cmd("a", 30, 16),  // wm 15 fires a@15 (once)
        cmd("b", 100, 17), // wm 16
        cmd("a", 5, 18),   // already behind the watermark: fires at the next one (17)
    ]; // end of input: a@30, b@100 at the maximum watermark; b@14 was deleted
    let out = Stamped::attach(
        &event_time(&env, input, 0)
            .key_by(|(k, _)| k.clone())
            .process(|| TimerCommands),
    );
    run(&env).unwrap();
    assert_eq!(
        out.values(),
        vec![
            report("rec", "a", 10, MIN_WATERMARK),
            report("rec", "a", 11, 9),
            report("rec", "b", 12, 10),
            report("rec", "a", 13, 11),
            report("timer", "a", 12, 12),
            report("timer", "b", 12, 12),
            report("rec", "b", 14, 12),
            report("rec", "b", 14, 13),
            report("rec", "a", 16, 13),
            report("timer", "a", 15, 15),
            report("rec", "b", 17, 15),
            report("rec", "a", 18, 16),
            report("timer", "a", 5, 17),
            report("timer", "a", 30, MAX_WATERMARK),
            report("timer", "b", 100, MAX_WATERMARK),
        ]
    );
}

#[test]
fn event_time_timers_fire_per_key_at_any_parallelism() {
    let env = Env::new().parallelism(3);
    let keys = ["k0", "k1", "k2", "k3", "k4", "k5"];
    let mut input = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let i = i as i64;
        input.push(cmd(k, 100 + i, i)); // fires at end of input
        input.push(cmd(k, 50, i)); // registered twice: fires once
        input.push(cmd(k, 50, i));
        input.push(cmd(k, 70 + i, i));
        input.push(cmd(k, -(70 + i), i)); // deleted
    }
    let out = event_time(&env, input, 0)
        .key_by(|(k, _)| k.clone())
        .process(|| TimerCommands)
        .filter(|r| r.0 == "timer")
        .map(|(_, k, t, _)| (k, t))
        .collect();
    run(&env).unwrap();
    let mut expected = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        expected.push((k.to_string(), 50));
        expected.push((k.to_string(), 100 + i as i64));
    }
    expected.sort();
    assert_eq!(out.sorted(), expected);
}

fn wall_clock_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// On each record, registers a processing-time timer 20 ms ahead (twice), and one 5 ms
/// ahead that it deletes at once. Reports (key, fired at the registered time, not early).
struct Alarm {
    registered: Option<ValueState<i64>>,
    fired: Arc<AtomicUsize>,
}

impl KeyedProcessFunction<String, String, (String, bool, bool)> for Alarm {
    fn open(&mut self, state: &mut StateContext<String>) -> Result<()> {
        self.registered = Some(state.value_state("registered")?);
        Ok(())
    }

    fn process(
        &mut self,
        _v: String,
        ctx: &mut KeyedContext<'_, String, (String, bool, bool)>,
    ) -> Result<()> {
        let now = ctx.current_processing_time();
        let wall = wall_clock_ms();
        // Processing time is the wall clock as of the last tick: never in the future, and
        // not far behind.
        assert!(
            now <= wall && wall - now < 5_000,
            "current_processing_time() = {now}, wall clock = {wall}"
        );
        let at = now + 20;
        ctx.register_processing_time_timer(at);
        ctx.register_processing_time_timer(at);
        ctx.register_processing_time_timer(now + 5);
        ctx.delete_processing_time_timer(now + 5);
        self.registered.as_mut().unwrap().set(at)
    }

    fn on_timer(
        &mut self,
        time: Timestamp,
        domain: TimeDomain,
        ctx: &mut KeyedContext<'_, String, (String, bool, bool)>,
    ) -> Result<()> {
        assert_eq!(domain, TimeDomain::ProcessingTime);
        let registered = self.registered.as_ref().unwrap().get()?;
        let not_early = wall_clock_ms() >= time && ctx.current_processing_time() >= time;
        ctx.emit((ctx.key().clone(), registered == Some(time), not_early));
        self.fired.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Emits its records, then stays alive (idle) until `done` reaches `target` or a
/// deadline passes, so that processing-time timers get a chance to fire.
struct UntilDone {
    records: Vec<String>,
    done: Arc<AtomicUsize>,
    target: usize,
    deadline: Instant,
}

impl SourceFunction<String> for UntilDone {
    fn poll(&mut self, out: &mut SourceOutput<'_, String>) -> Result<SourceStatus> {
        for r in self.records.drain(..) {
            out.emit(r)?;
        }
        if self.done.load(Ordering::SeqCst) >= self.target || Instant::now() > self.deadline {
            return Ok(SourceStatus::Finished);
        }
        Ok(SourceStatus::Idle(1))
    }
}

#[test]
fn processing_time_timers_fire_once_on_the_wall_clock() {
    let env = Env::new().parallelism(2);
    let fired = Arc::new(AtomicUsize::new(0));
    let (f1, f2) = (fired.clone(), fired.clone());
    // Shorter than the job deadline, so a timer that never fires fails the assertion below.
    let deadline = Instant::now() + Duration::from_secs(5);
    let out = env
        .source("until-done", move |ctx| UntilDone {
            records: if ctx.subtask == 0 {
                vec!["a".into(), "b".into(), "c".into()]
            } else {
                vec![]
            },
            done: f1.clone(),
            target: 3,
            deadline,
        })
        .key_by(|k| k.clone())
        .process(move || Alarm {
            registered: None,
            fired: f2.clone(),
        })
        .collect();
    run(&env).unwrap();
    assert_eq!(
        fired.load(Ordering::SeqCst),
        3,
        "every timer fired before the deadline"
    );
    let t = |k: &str| (k.to_string(), true, true);
    // One firing per key (the duplicate registration merged, the deleted timer never fired).
    assert_eq!(out.sorted(), vec![t("a"), t("b"), t("c")]);
}

#[test]
fn a_timer_far_in_event_time_fires_at_end_of_input() {
    let env = Env::new().parallelism(2);
    let far = 4_000_000_000_000_000i64;
    let out = env
        .from_timestamped(vec![
            (("x".to_string(), far), 1),
            (("y".to_string(), far + 1), 2),
        ])
        .with_watermarks(WatermarkStrategy::monotonous())
        .key_by(|(k, _)| k.clone())
        .process(|| TimerCommands)
        .filter(|r| r.0 == "timer")
        .collect();
    run(&env).unwrap();
    assert_eq!(
        out.sorted(),
        vec![
            ("timer".to_string(), "x".to_string(), far, MAX_WATERMARK),
            ("timer".to_string(), "y".to_string(), far + 1, MAX_WATERMARK)
        ]
    );
}

/// `(key, t)` registers a processing-time timer at `t` (ms since the Unix epoch); a firing
/// reports (key, t).
struct ProcessingTimers;

impl KeyedProcessFunction<String, (String, i64), (String, i64)> for ProcessingTimers {
    fn process(
        &mut self,
        (_, t): (String, i64),
        ctx: &mut KeyedContext<'_, String, (String, i64)>,
    ) -> Result<()> {
        ctx.register_processing_time_timer(t);
        Ok(())
    }

    fn on_timer(
        &mut self,
        time: Timestamp,
        domain: TimeDomain,
        ctx: &mut KeyedContext<'_, String, (String, i64)>,
    ) -> Result<()> {
        assert_eq!(domain, TimeDomain::ProcessingTime);
        ctx.emit((ctx.key().clone(), time));
        Ok(())
    }
}

#[test]
fn at_end_of_input_due_processing_time_timers_fire_and_the_others_are_dropped_and_counted() {
    let env = Env::new().parallelism(2);
    let name = unique("processing-timers");
    let far = wall_clock_ms() + 3_600_000; // an hour from now
    let mut input: Vec<(String, i64)> = ["a", "b", "c", "d", "e"]
        .iter()
        .enumerate()
        .map(|(i, k)| (k.to_string(), far + i as i64))
        .collect();
    input.push(("a".to_string(), far + 10)); // a second timer of key a
    input.push(("due".to_string(), 1)); // long due: fires at the next tick or at the end
    let out = env
        .from_collection(input)
        .key_by(|(k, _)| k.clone())
        .process(|| ProcessingTimers)
        .name(&name)
        .collect();
    // Ends without waiting for the timers (run fails the test after 10 s).
    run(&env).unwrap();
    assert_eq!(out.values(), vec![("due".to_string(), 1)]);
    let op = [("operator", name.as_str())];
    assert_eq!(metrics::sum("processing_timers_dropped_total", &op), 6.0);
}
