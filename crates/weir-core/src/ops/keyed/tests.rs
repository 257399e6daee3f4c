//! The keyed process operator driven directly: side outputs and their control events,
//! and processing-time timers at the end of input.

use super::*;
use crate::ids::CheckpointId;
use crate::ops::side::{SideDecl, SideDecls};
use crate::state::{BackendSnapshot, KeyedStateBackend};
use std::any::Any;
use std::cell::RefCell;

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

/// Everything the operator's ports received, in order: "port:value@ts" or
/// "port:control".
#[derive(Clone, Default)]
struct Log(Rc<RefCell<Vec<String>>>);

struct Port<T> {
    name: &'static str,
    log: Log,
    _t: std::marker::PhantomData<T>,
}

impl<T: std::fmt::Debug> Output<T> for Port<T> {
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        self.log
            .0
            .borrow_mut()
            .push(format!("{}:{value:?}@{ts}", self.name));
        Ok(())
    }
    fn control(&mut self, event: Control) -> Result<()> {
        self.log
            .0
            .borrow_mut()
            .push(format!("{}:{event:?}", self.name));
        Ok(())
    }
}

fn port<T: std::fmt::Debug + 'static>(name: &'static str, log: &Log) -> Box<dyn Output<T>> {
    Box::new(Port {
        name,
        log: log.clone(),
        _t: std::marker::PhantomData,
    })
}

fn info(name: &str) -> OpInfo {
    OpInfo {
        name: Arc::from(name),
        subtask: 0,
        parallelism: 1,
    }
}

/// `(key, n)`: n < 0 emits -n to the side output `small`, n == 0 to an undeclared
/// tag, n > 0 to the main output; n == 1 also registers a processing-time timer that
/// is already due, n >= 2 one decades ahead (at a time that depends on n).
struct Router {
    small: OutputTag<i64>,
    undeclared: OutputTag<i64>,
}

impl KeyedProcessFunction<String, (String, i64), i64> for Router {
    fn process(
        &mut self,
        (_, n): (String, i64),
        ctx: &mut KeyedContext<'_, String, i64>,
    ) -> Result<()> {
        match n {
            ..0 => ctx.output(&self.small, -n)?,
            0 => ctx.output(&self.undeclared, 0)?,
            1 => {
                ctx.emit(n);
                ctx.register_processing_time_timer(1);
            }
            _ => {
                ctx.emit(n);
                // In the year 2096.
                ctx.register_processing_time_timer(4_000_000_000_000 + n);
            }
        }
        Ok(())
    }
    fn on_timer(
        &mut self,
        time: Timestamp,
        domain: TimeDomain,
        ctx: &mut KeyedContext<'_, String, i64>,
    ) -> Result<()> {
        assert_eq!((time, domain), (1, TimeDomain::ProcessingTime));
        ctx.output(&self.small, 1_000)
    }
}

fn operator(name: &str, log: &Log) -> KeyedProcess<String, (String, i64), i64, Router> {
    let small = OutputTag::<i64>::new("small");
    let decls = SideDecls::default();
    decls.lock().unwrap().push(SideDecl::new(&small, 1));
    let mut outputs: Vec<Box<dyn Any>> = vec![Box::new(()), Box::new(port::<i64>("side", log))];
    let side = SideOutputs::take(&decls, &mut outputs);
    let key_fn: crate::data::KeyFn<(String, i64), String> =
        Arc::new(|(k, _): &(String, i64)| k.clone());
    let state = StateContext::new(KeyContext::new(), Box::new(NoBackend));
    let f = Router {
        small,
        undeclared: OutputTag::new("nowhere"),
    };
    KeyedProcess::new(key_fn, f, state, port("main", log), info(name))
        .unwrap()
        .with_side_outputs(side)
}

fn key(k: &str, n: i64) -> (String, i64) {
    (k.to_string(), n)
}

#[test]
fn side_outputs_get_records_and_every_control_event_in_step_with_the_main_output() {
    let log = Log::default();
    let mut op = operator("side-outputs-in-step", &log);
    op.record(key("a", 5), 10).unwrap();
    op.record(key("a", -3), 11).unwrap();
    op.control(Control::Barrier(CheckpointId(1))).unwrap();
    op.record(key("b", -4), 12).unwrap();
    op.control(Control::Watermark(20)).unwrap();
    assert_eq!(
        *log.0.borrow(),
        vec![
            "main:5@10",
            "side:3@11",
            "side:Barrier(CheckpointId(1))",
            "main:Barrier(CheckpointId(1))",
            "side:4@12",
            "side:Watermark(20)",
            "main:Watermark(20)",
        ]
    );
}

#[test]
fn emitting_to_an_undeclared_side_output_fails_naming_the_tag() {
    let log = Log::default();
    let mut op = operator("undeclared-side-output", &log);
    let err = op.record(key("a", 0), 1).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("operator 'undeclared-side-output'")
            && msg.contains("side output 'nowhere'")
            && msg.contains("with_side_output"),
        "{msg}"
    );
    assert!(err.is_deterministic(), "a restart would fail the same way");
    assert!(log.0.borrow().is_empty());
}

#[test]
fn at_end_of_input_due_processing_timers_fire_and_the_others_are_dropped_and_counted() {
    let name = "processing-timers-at-end";
    let log = Log::default();
    let mut op = operator(name, &log);
    op.record(key("due", 1), 1).unwrap();
    for k in ["x", "y", "z"] {
        op.record(key(k, 2), 2).unwrap();
    }
    op.record(key("x", 3), 3).unwrap(); // another timer of x
    op.control(Control::End).unwrap();
    assert_eq!(
        *log.0.borrow(),
        vec![
            "main:1@1",
            "main:2@2",
            "main:2@2",
            "main:2@2",
            "main:3@3",
            // The due timer fires at the end (its output has no timestamp).
            &format!("side:1000@{NO_TIMESTAMP}"),
            "side:End",
            "main:End",
        ]
    );
    let labels = [("operator", name), ("subtask", "0")];
    assert_eq!(
        metrics::value("processing_timers_dropped_total", &labels),
        Some(4.0)
    );
    assert_eq!(op.timers.borrow_mut().processing.len(), 0);
}
