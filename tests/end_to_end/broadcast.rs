//! Broadcast state: rules broadcast to every parallel instance of a keyed operator, read
//! there (read-only) beside keyed state and timers; the plain (not keyed) form; and the
//! errors a user meets. Readings wait in keyed state until the watermark of both inputs
//! passes them, so outputs are exact however the two inputs interleave.

use weir::prelude::*;
use weir_tests::{BySubtask, event_time, run, run_failing};

/// A rule: from event time `ts` on, readings of `sensor` above the threshold are alerts
/// (`None`: no more alerts).
type Rule = (String, Option<i64>);
/// A sensor's rule history: (from event time, threshold), in time order.
type History = Vec<(Timestamp, Option<i64>)>;

/// Readings wait per sensor (list state, a timer at their time); when the watermark of
/// both inputs passes them, every rule up to their time has arrived.
struct Alerts {
    rules: BroadcastStateDescriptor<String, History>,
    pending: ListState<(Timestamp, i64)>,
}

impl BroadcastProcessFunction<String, (String, i64), Rule, String> for Alerts {
    fn process_element(
        &mut self,
        (_, value): (String, i64),
        ctx: &mut ReadOnlyContext<'_, String, String>,
    ) -> Result<()> {
        let ts = ctx.timestamp().expect("timestamped readings");
        self.pending.add((ts, value))?;
        ctx.register_event_time_timer(ts);
        Ok(())
    }

    fn process_broadcast_element(
        &mut self,
        (sensor, threshold): Rule,
        ctx: &mut BroadcastContext<'_, String, String>,
    ) -> Result<()> {
        let from = ctx.timestamp().expect("timestamped rules");
        let mut rules = ctx.broadcast_state(&self.rules)?;
        let mut history = rules.get(&sensor).cloned().unwrap_or_default();
        history.push((from, threshold));
        rules.put(sensor, history);
        Ok(())
    }

    fn on_timer(
        &mut self,
        ts: Timestamp,
        _: TimeDomain,
        ctx: &mut ReadOnlyContext<'_, String, String>,
    ) -> Result<()> {
        let sensor = ctx.key().clone();
        let rules = ctx.broadcast_state(&self.rules)?;
        let limit = rules.get(&sensor).and_then(|h| {
            h.iter()
                .take_while(|(from, _)| *from <= ts)
                .last()
                .and_then(|r| r.1)
        });
        let (due, later): (Vec<_>, Vec<_>) =
            self.pending.get()?.into_iter().partition(|(t, _)| *t == ts);
        self.pending.update(later)?;
        for (_, v) in due {
            match limit {
                Some(l) if v > l => ctx.emit(format!("{ts} {sensor} {v} > {l}")),
                _ => {}
            }
        }
        Ok(())
    }
}

fn thresholds_over_time(backend: BackendKind) {
    let env = Env::new().parallelism(3).state_backend(backend);
    let rules = event_time(
        &env,
        vec![
            (("a".to_string(), Some(10)), 0),
            (("b".to_string(), Some(40)), 2),
            (("a".to_string(), Some(20)), 5),
            (("b".to_string(), None), 8),
            (("c".to_string(), Some(0)), 8),
            (("a".to_string(), Some(0)), 9),
        ],
        0,
    );
    let readings = event_time(
        &env,
        vec![
            (("a".to_string(), 5), 1),
            (("b".to_string(), 50), 2),
            (("a".to_string(), 15), 3),
            (("c".to_string(), 7), 3),
            (("a".to_string(), 25), 4),
            (("a".to_string(), 15), 5),
            (("b".to_string(), 8), 6),
            (("a".to_string(), 30), 7),
            (("b".to_string(), 100), 9),
            (("c".to_string(), 7), 10),
            (("a".to_string(), 1), 12),
        ],
        0,
    );
    let descriptor = BroadcastStateDescriptor::<String, History>::new("rules");
    let broadcast = rules.broadcast_state(&descriptor);
    let alerts = readings
        .key_by(|r| r.0.clone())
        .connect(&broadcast)
        .process_with_state(move |state| {
            Ok(Alerts {
                rules: descriptor.clone(),
                pending: state.list_state("pending")?,
            })
        })
        .collect();
    run(&env).unwrap();
    // a: 10 from 0, 20 from 5, 0 from 9; b: 40 from 2, none from 8; c: 0 from 8.
    assert_eq!(
        alerts.sorted(),
        vec![
            "10 c 7 > 0",
            "12 a 1 > 0",
            "2 b 50 > 40",
            "3 a 15 > 10",
            "4 a 25 > 10",
            "7 a 30 > 20",
        ]
    );
}

#[test]
fn rules_broadcast_to_a_keyed_stream_apply_from_their_event_time_on() {
    thresholds_over_time(BackendKind::Memory);
}

#[test]
fn rules_broadcast_to_a_keyed_stream_on_rocksdb() {
    thresholds_over_time(BackendKind::parse("rocksdb").unwrap());
}

/// Every instance reports each broadcast record it receives, and the block list it holds
/// once its input ends.
struct Report {
    blocked: BroadcastStateDescriptor<String, ()>,
}

impl BroadcastProcessFunction<(), String, String, String> for Report {
    fn process_element(
        &mut self,
        word: String,
        ctx: &mut ReadOnlyContext<'_, (), String>,
    ) -> Result<()> {
        // Registered once per subtask (timers of the key `()`): at the end of input the
        // block list is complete.
        ctx.register_event_time_timer(MAX_WATERMARK - 1);
        let _ = word;
        Ok(())
    }
    fn process_broadcast_element(
        &mut self,
        word: String,
        ctx: &mut BroadcastContext<'_, (), String>,
    ) -> Result<()> {
        ctx.broadcast_state(&self.blocked)?.put(word.clone(), ());
        let subtask = ctx.subtask();
        ctx.emit(format!("{subtask} got {word}"));
        Ok(())
    }
    fn on_timer(
        &mut self,
        _: Timestamp,
        _: TimeDomain,
        ctx: &mut ReadOnlyContext<'_, (), String>,
    ) -> Result<()> {
        let words: Vec<String> = ctx
            .broadcast_state(&self.blocked)?
            .iter()
            .map(|(w, ())| w.clone())
            .collect();
        ctx.emit(format!("holds {}", words.join(",")));
        Ok(())
    }
}

#[test]
fn every_instance_of_a_plain_stream_receives_every_broadcast_record() {
    let env = Env::new().parallelism(3);
    let blocked = BroadcastStateDescriptor::<String, ()>::new("blocked");
    let words = env.from_collection(vec!["x".to_string(); 30]).rebalance();
    let block_list = env
        .from_collection(vec!["spam".to_string(), "eggs".into()])
        .broadcast_state(&blocked);
    let out = words
        .connect(&block_list)
        .process(move || Report {
            blocked: blocked.clone(),
        })
        .name("report");
    let seen = BySubtask::attach(&out, 1);
    run(&env).unwrap();
    let mut got: Vec<String> = seen.per_subtask().into_values().flatten().collect();
    got.sort();
    let mut want: Vec<String> = (0..3)
        .flat_map(|s| [format!("{s} got eggs"), format!("{s} got spam")])
        .collect();
    want.extend(["holds eggs,spam"; 3].map(String::from));
    want.sort();
    assert_eq!(got, want);
}

/// Reads a broadcast state the stream does not declare.
struct Undeclared;

impl BroadcastProcessFunction<u32, u32, u32, u32> for Undeclared {
    fn process_element(&mut self, v: u32, ctx: &mut ReadOnlyContext<'_, u32, u32>) -> Result<()> {
        let other = BroadcastStateDescriptor::<u32, u32>::new("other");
        ctx.broadcast_state(&other)?;
        ctx.emit(v);
        Ok(())
    }
    fn process_broadcast_element(
        &mut self,
        _: u32,
        _: &mut BroadcastContext<'_, u32, u32>,
    ) -> Result<()> {
        Ok(())
    }
}

#[test]
fn a_broadcast_state_the_stream_does_not_declare_fails_the_job_naming_it() {
    let env = Env::new().parallelism(2);
    let declared = BroadcastStateDescriptor::<u32, u32>::new("limits");
    let rules = env.from_collection(vec![1u32]).broadcast_state(&declared);
    env.from_collection(vec![1u32, 2])
        .key_by(|v| *v)
        .connect(&rules)
        .process(|| Undeclared)
        .name("undeclared")
        .discard();
    let err = run_failing(&env).to_string();
    assert!(err.contains("undeclared"), "{err}");
    assert!(
        err.contains("broadcast state 'other'") && err.contains(r#"["limits"]"#),
        "{err}"
    );
}

/// Uses keyed state where there is no key: on the broadcast side.
struct KeyedOnBroadcast {
    seen: ValueState<u32>,
}

impl BroadcastProcessFunction<u32, u32, u32, u32> for KeyedOnBroadcast {
    fn process_element(&mut self, v: u32, _: &mut ReadOnlyContext<'_, u32, u32>) -> Result<()> {
        self.seen.set(v)
    }
    fn process_broadcast_element(
        &mut self,
        v: u32,
        _: &mut BroadcastContext<'_, u32, u32>,
    ) -> Result<()> {
        self.seen.set(v)
    }
}

#[test]
fn keyed_state_on_the_broadcast_side_fails_the_job_saying_why() {
    let env = Env::new().parallelism(2);
    let d = BroadcastStateDescriptor::<u32, u32>::new("d");
    let rules = env.from_collection(vec![1u32]).broadcast_state(&d);
    env.from_collection(vec![1u32, 2])
        .key_by(|v| *v)
        .connect(&rules)
        .process_with_state(|state| {
            Ok(KeyedOnBroadcast {
                seen: state.value_state("seen")?,
            })
        })
        .name("keyed-on-broadcast")
        .discard();
    let err = run_failing(&env).to_string();
    assert!(err.contains("keyed-on-broadcast"), "{err}");
    assert!(
        err.contains("keyed state cannot be used in process_broadcast_element"),
        "{err}"
    );
}
