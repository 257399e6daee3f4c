//! The broadcast operator driven directly: thresholds from the broadcast side applied to
//! keyed data, keyed state and timers on the data side, what the broadcast side may not
//! do, and checkpoints (one copy, written by subtask 0) restored at other parallelisms.

use super::*;
use crate::checkpoint::{Participants, RestoreState};
use crate::dsl::SourceFigures;
use crate::error::Error;
use crate::state::{BackendSnapshot, KeyedStateBackend, StateTableInfo, ValueState};
use std::sync::Arc;

struct NoBackend;

impl KeyedStateBackend for NoBackend {
    fn name(&self) -> &'static str {
        "test"
    }
    fn register(&mut self, _: &str, _: Rc<dyn StateTableInfo>) -> Result<()> {
        Ok(())
    }
    fn entries(&self) -> usize {
        0
    }
    fn snapshot(&self, _: CheckpointId) -> Result<BackendSnapshot> {
        Ok(BackendSnapshot::default())
    }
}

/// Everything the operator emitted, as "value@ts" (main) or "side:value@ts".
#[derive(Clone, Default)]
struct Log(Rc<RefCell<Vec<String>>>);

impl Log {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.borrow_mut())
    }
}

impl<T: std::fmt::Debug> Output<T> for Log {
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        self.0.borrow_mut().push(format!("{value:?}@{ts}"));
        Ok(())
    }
    fn control(&mut self, _event: Control) -> Result<()> {
        Ok(())
    }
}

fn limits() -> BroadcastStateDescriptor<String, i64> {
    BroadcastStateDescriptor::new("limits")
}

/// Readings `(sensor, value)` keyed by sensor; rules `(sensor, limit)`, a negative limit
/// removes the sensor's rule. Emits `(sensor, value, limit)` for readings over their limit,
/// and on the event-time timer one time unit later `(sensor, count of readings, limit now)`.
struct Alerts {
    limits: BroadcastStateDescriptor<String, i64>,
    count: Option<ValueState<i64>>,
    touch_keyed_state_on_broadcast: bool,
}

impl BroadcastProcessFunction<String, (String, i64), (String, i64), (String, i64, i64)> for Alerts {
    fn open(&mut self, state: &mut StateContext<String>) -> Result<()> {
        self.count = Some(state.value_state("count")?);
        Ok(())
    }
    fn process_element(
        &mut self,
        (sensor, v): (String, i64),
        ctx: &mut ReadOnlyContext<'_, String, (String, i64, i64)>,
    ) -> Result<()> {
        let count = self.count.as_mut().expect("opened");
        count.update(|c| c.unwrap_or(0) + 1)?;
        if let Some(ts) = ctx.timestamp() {
            ctx.register_event_time_timer(ts + 1);
        }
        if let Some(limit) = ctx.broadcast_state(&self.limits)?.get(&sensor)
            && v > *limit
        {
            ctx.emit((sensor, v, *limit));
        }
        Ok(())
    }
    fn process_broadcast_element(
        &mut self,
        (sensor, limit): (String, i64),
        ctx: &mut BroadcastContext<'_, String, (String, i64, i64)>,
    ) -> Result<()> {
        if self.touch_keyed_state_on_broadcast {
            self.count.as_mut().expect("opened").get()?;
        }
        let mut state = ctx.broadcast_state(&self.limits)?;
        if limit < 0 {
            state.remove(&sensor);
        } else {
            state.put(sensor.clone(), limit);
        }
        if ctx.subtask() == 0 {
            let n = state_len(ctx, &self.limits);
            ctx.emit((format!("rule {sensor}"), limit, n));
        }
        Ok(())
    }
    fn on_timer(
        &mut self,
        _time: Timestamp,
        _domain: TimeDomain,
        ctx: &mut ReadOnlyContext<'_, String, (String, i64, i64)>,
    ) -> Result<()> {
        let n = self.count.as_mut().expect("opened").get()?.unwrap_or(0);
        let key = ctx.key().clone();
        let limit = ctx
            .broadcast_state(&self.limits)?
            .get(&key)
            .copied()
            .unwrap_or(-1);
        ctx.emit((key, n, limit));
        Ok(())
    }
}

fn state_len(
    ctx: &mut BroadcastContext<'_, String, (String, i64, i64)>,
    d: &BroadcastStateDescriptor<String, i64>,
) -> i64 {
    ctx.broadcast_state(d).map(|s| s.len() as i64).unwrap_or(-1)
}

/// One built subtask: its data input, broadcast input, control and what it emitted.
struct Subtask {
    data: Box<dyn Output<(String, i64)>>,
    rules: Box<dyn Output<(String, i64)>>,
    control: Box<dyn crate::graph::ControlSink>,
    participants: Participants,
    log: Log,
}

fn subtask(
    index: usize,
    parallelism: usize,
    restore: Option<&RestoreState>,
    decls: &[Declaration],
    f: Alerts,
) -> Result<Subtask> {
    let participants = Participants::default();
    let figures = SourceFigures::default();
    let backend = || -> Result<Box<dyn KeyedStateBackend>> { Ok(Box::new(NoBackend)) };
    let ctx = BuildContext {
        name: "alerts",
        subtask: index,
        parallelism,
        max_parallelism: 128,
        state_backend: &backend,
        operator_id: "alerts",
        participants: &participants,
        restore,
        checkpointing: true,
        checkpoint_timing: None,
        source_figures: &figures,
        alignment: None,
    };
    let info = OpInfo::from_ctx(&ctx);
    let state = StateContext::new(crate::state::KeyContext::new(), Box::new(NoBackend));
    let log = Log::default();
    let key_fn: KeyFn<(String, i64), String> = Arc::new(|r: &(String, i64)| r.0.clone());
    let (data, rules, control) = build(
        &ctx,
        key_fn,
        decls,
        f,
        state,
        Box::new(log.clone()),
        SideOutputs::default(),
        info,
    )?;
    Ok(Subtask {
        data,
        rules,
        control,
        participants,
        log,
    })
}

fn alerts() -> Alerts {
    Alerts {
        limits: limits(),
        count: None,
        touch_keyed_state_on_broadcast: false,
    }
}

fn decls() -> Vec<Declaration> {
    vec![limits().declaration()]
}

fn reading(s: &mut Subtask, sensor: &str, v: i64, ts: Timestamp) {
    s.data.record((sensor.to_string(), v), ts).unwrap();
}

fn rule(s: &mut Subtask, sensor: &str, limit: i64, ts: Timestamp) {
    s.rules.record((sensor.to_string(), limit), ts).unwrap();
}

#[test]
fn rules_change_what_the_data_side_emits_and_timers_read_the_current_rules() {
    let mut s = subtask(0, 1, None, &decls(), alerts()).unwrap();
    // Before any rule, readings pass unmatched: that order is the job's to arrange.
    reading(&mut s, "a", 50, 1);
    rule(&mut s, "a", 10, 2);
    reading(&mut s, "a", 5, 3);
    reading(&mut s, "a", 11, 4);
    rule(&mut s, "a", 20, 5);
    reading(&mut s, "a", 11, 6);
    reading(&mut s, "b", 99, 7);
    rule(&mut s, "a", -1, 8);
    reading(&mut s, "a", 30, 9);
    s.control.control(Control::Watermark(100)).unwrap();
    assert_eq!(
        s.log.take(),
        vec![
            r#"("rule a", 10, 1)@2"#,
            r#"("a", 11, 10)@4"#,
            r#"("rule a", 20, 1)@5"#,
            r#"("rule a", -1, 0)@8"#,
            // Timers fire at the watermark, after every reading: a's count is 5 and its
            // rule is gone, b's count is 1 without a rule; a's timers at 2, 4, 5, 7, 10
            // and b's at 8 fire in time order.
            r#"("a", 5, -1)@2"#,
            r#"("a", 5, -1)@4"#,
            r#"("a", 5, -1)@5"#,
            r#"("a", 5, -1)@7"#,
            r#"("b", 1, -1)@8"#,
            r#"("a", 5, -1)@10"#,
        ]
    );
}

#[test]
fn keyed_state_on_the_broadcast_side_fails_naming_the_operator() {
    let mut f = alerts();
    f.touch_keyed_state_on_broadcast = true;
    let mut s = subtask(0, 1, None, &decls(), f).unwrap();
    reading(&mut s, "a", 1, 1);
    let err = s.rules.record(("a".to_string(), 1), 2).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("alerts"), "{msg}");
    assert!(msg.contains("process_broadcast_element"), "{msg}");
}

#[test]
fn a_state_the_stream_does_not_declare_is_a_config_error_naming_it() {
    let other = BroadcastStateDescriptor::<String, i64>::new("other");
    let mut s = subtask(0, 1, None, &[other.declaration()], alerts()).unwrap();
    let err = s.rules.record(("a".to_string(), 1), 1).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("'limits'"), "{msg}");
    assert!(msg.contains(r#"["other"]"#), "{msg}");
    assert!(msg.contains(".broadcast_state(&descriptor)"), "{msg}");

    let wrong_types = BroadcastStateDescriptor::<String, String>::new("limits");
    let mut s = subtask(0, 1, None, &[wrong_types.declaration()], alerts()).unwrap();
    let err = s.rules.record(("a".to_string(), 1), 1).unwrap_err();
    assert!(err.to_string().contains("other types"), "{err}");
}

#[test]
fn two_states_with_one_name_are_refused() {
    let d = vec![limits().declaration(), limits().declaration()];
    let Err(err) = subtask(0, 1, None, &d, alerts()) else {
        panic!("built")
    };
    assert!(matches!(err, Error::Config(_)), "{err}");
    assert!(err.to_string().contains("declared twice"), "{err}");
}

fn snapshot(s: &Subtask) -> OperatorSnapshot {
    s.participants
        .snapshot(CheckpointId(1))
        .unwrap()
        .remove("alerts")
        .unwrap_or_default()
}

#[test]
fn only_subtask_0_writes_the_copy_and_every_new_subtask_restores_it() {
    // Two subtasks receive the same rules (a broadcast input).
    let mut old: Vec<Subtask> = (0..2)
        .map(|i| subtask(i, 2, None, &decls(), alerts()).unwrap())
        .collect();
    for s in &mut old {
        rule(s, "a", 10, 1);
        rule(s, "b", 20, 2);
        rule(s, "c", 30, 3);
        rule(s, "c", -1, 4);
    }
    let snaps: Vec<OperatorSnapshot> = old.iter().map(snapshot).collect();
    assert!(snaps[0].operator.is_some());
    assert_eq!(
        snaps[0].description.as_deref(),
        Some("broadcast state (limits: 2 entries)")
    );
    assert!(snaps[1].operator.is_none(), "subtask 1 wrote a copy");

    // What the runtime hands each new subtask: the operator state of every old one.
    let restore = RestoreState {
        operator: snaps.iter().filter_map(|s| s.operator.clone()).collect(),
        ..RestoreState::default()
    };
    for parallelism in [3, 1] {
        for i in 0..parallelism {
            let mut s = subtask(i, parallelism, Some(&restore), &decls(), alerts()).unwrap();
            reading(&mut s, "a", 11, 10);
            reading(&mut s, "b", 11, 11);
            reading(&mut s, "b", 21, 12);
            assert_eq!(
                s.log.take(),
                vec![r#"("a", 11, 10)@10"#, r#"("b", 21, 20)@12"#],
                "subtask {i} of {parallelism}"
            );
            // And the restored copy is checkpointed again, by subtask 0 only.
            assert_eq!(snapshot(&s).operator.is_some(), i == 0);
        }
    }
}

#[test]
fn a_copy_whose_types_changed_fails_the_restore_naming_the_state() {
    let mut s = subtask(0, 1, None, &decls(), alerts()).unwrap();
    rule(&mut s, "a", 10, 1);
    let restore = RestoreState {
        operator: vec![snapshot(&s).operator.unwrap()],
        ..RestoreState::default()
    };
    let changed = BroadcastStateDescriptor::<u64, String>::new("limits");
    let Err(err) = subtask(0, 1, Some(&restore), &[changed.declaration()], alerts()) else {
        panic!("restored")
    };
    let msg = err.to_string();
    assert!(
        msg.contains("'limits'") && msg.contains("type changed"),
        "{msg}"
    );
}

/// Renamed by a new job version, a broadcast state starts empty under its new name; the
/// old one is kept in the new version's checkpoints, so rolling back finds its rules.
#[test]
fn a_state_no_longer_declared_is_kept_and_a_new_one_starts_empty() {
    let mut s = subtask(0, 1, None, &decls(), alerts()).unwrap();
    rule(&mut s, "a", 10, 1);
    let restore = RestoreState {
        operator: vec![snapshot(&s).operator.unwrap()],
        ..RestoreState::default()
    };
    let renamed = BroadcastStateDescriptor::<String, i64>::new("limits-v2");
    let mut f = alerts();
    f.limits = renamed.clone();
    let mut s = subtask(0, 1, Some(&restore), &[renamed.declaration()], f).unwrap();
    reading(&mut s, "a", 11, 2);
    assert!(s.log.take().is_empty());
    let renamed_snapshot = snapshot(&s);
    assert_eq!(
        renamed_snapshot.description.as_deref(),
        Some("broadcast state (limits-v2: 0 entries, limits: not declared, kept)")
    );
    // Rolled back on the renamed version's checkpoint: the rule for "a" is there.
    let restore = RestoreState {
        operator: vec![renamed_snapshot.operator.unwrap()],
        ..RestoreState::default()
    };
    let mut s = subtask(0, 1, Some(&restore), &decls(), alerts()).unwrap();
    reading(&mut s, "a", 11, 3);
    assert_eq!(s.log.take(), vec![r#"("a", 11, 10)@3"#]);
    assert_eq!(
        snapshot(&s).description.as_deref(),
        Some("broadcast state (limits: 1 entries, limits-v2: not declared, kept)")
    );
}
