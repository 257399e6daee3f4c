//! A task whose output has no room, or that has an unaligned barrier waiting, stops
//! delivering a batch between two records: the records delivered before its snapshot are in
//! the operators' state and the rest of the batch is channel state, so after a restore
//! every record written before the barrier is seen exactly once. A command that waits for
//! the task (a checkpoint's completion) pauses a batch the same way.

use super::*;
use crossbeam_channel::Select;
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

fn cfg(batch_size: usize, channel_capacity: usize, target: Option<Duration>) -> ExchangeConfig {
    ExchangeConfig {
        batch_size,
        channel_capacity,
        flush_interval_ms: 1_000,
        max_parallelism: 128,
        in_flight_target: target,
    }
}

type Seen = Rc<RefCell<Vec<i64>>>;
type Hook = Rc<RefCell<Option<Box<dyn FnOnce()>>>>;

/// An operator input that keeps the values it is given, runs `hook` once when it is given
/// `at`, and writes every value on to `out`, if any.
struct Op {
    seen: Seen,
    at: i64,
    hook: Hook,
    out: Option<Box<dyn Output<i64> + Send>>,
}

impl Op {
    fn new(seen: &Seen) -> Self {
        Op {
            seen: seen.clone(),
            at: -1,
            hook: Hook::default(),
            out: None,
        }
    }
}

impl Output<i64> for Op {
    fn record(&mut self, value: i64, ts: Timestamp) -> Result<()> {
        self.seen.borrow_mut().push(value);
        if value == self.at
            && let Some(hook) = self.hook.borrow_mut().take()
        {
            hook();
        }
        match &mut self.out {
            Some(out) => out.record(value, ts),
            None => Ok(()),
        }
    }
    fn control(&mut self, _event: Control) -> Result<()> {
        Ok(())
    }
}

fn forward() -> TypedExchange<i64> {
    TypedExchange {
        partitioning: Partitioning::Forward,
    }
}

fn writer(set: &mut ChannelSet) -> Box<dyn Output<i64> + Send> {
    *set.writers
        .remove(0)
        .downcast::<Box<dyn Output<i64> + Send>>()
        .unwrap()
}

fn bind(exchange: &TypedExchange<i64>, set: &mut ChannelSet, op: Op) -> Box<dyn InputGate> {
    let input: Box<dyn Output<i64>> = Box::new(op);
    exchange
        .bind(set.readers.remove(0), Box::new(input))
        .unwrap()
}

/// Takes the next message of channel 0 (waiting for one) and delivers it.
fn next(g: &dyn InputGate) -> GateEvent {
    let mut sel = Select::new();
    g.select(&mut sel, 0);
    let op = sel.select();
    g.complete(0, op).unwrap()
}

#[test]
fn a_barrier_that_arrives_during_a_batch_splits_it_between_operator_and_channel_state() {
    let exchange = forward();
    let mut set = exchange.channels(1, 1, cfg(256, 16, None));
    let w = Rc::new(RefCell::new(writer(&mut set)));
    // Message 1: records 0..256, one full batch.
    for v in 0..256 {
        w.borrow_mut().record(v, 0).unwrap();
    }
    // While the consumer is at record 10 of it, the producer writes 256..259 (they stay in
    // its buffer) and then barrier 1 on the priority lane: the three records count as
    // before the barrier and go out at once as message 2.
    let seen = Seen::default();
    let mut op = Op::new(&seen);
    op.at = 10;
    let producer = w.clone();
    *op.hook.borrow_mut() = Some(Box::new(move || {
        let mut w = producer.borrow_mut();
        for v in 256..259 {
            w.record(v, 0).unwrap();
        }
        with_unaligned_barriers(|| w.control(Control::Barrier(CheckpointId(1)))).unwrap();
    }));
    let g = bind(&exchange, &mut set, op);
    // Delivery stops at the first check after the barrier appeared (every 64 records).
    assert_eq!(next(&*g), GateEvent::Records(64));
    assert_eq!(
        g.poll_priority(0),
        Some(GateEvent::Priority(CheckpointId(1), 2))
    );
    // The snapshot now: the operator's state covers the records it was given.
    let snapshot = seen.borrow().clone();
    assert_eq!(snapshot, (0..64).collect::<Vec<_>>());
    g.capture(0, None).unwrap();
    g.capture(0, Some(2)).unwrap();
    g.drain(0).unwrap();
    assert!(
        g.capture_done(0),
        "the records held at the barrier arrived without waiting for another send"
    );
    let blobs: Vec<_> = g.channel_state(0, 0, 0, 1).unwrap().into_iter().collect();
    // The producer goes on after the barrier, and ends.
    {
        let mut w = w.borrow_mut();
        for v in 259..300 {
            w.record(v, 0).unwrap();
        }
        w.control(Control::End).unwrap();
    }
    // The running job sees every record once, in order: the rest of message 1 first.
    loop {
        if g.resume(0).unwrap().is_some() {
            continue;
        }
        if next(&*g) == GateEvent::End {
            break;
        }
    }
    assert_eq!(*seen.borrow(), (0..300).collect::<Vec<_>>());
    // Restored from the checkpoint: the operators' state plus the replayed channel state
    // hold exactly the records written before the barrier, each once.
    let mut set = exchange.channels(1, 1, cfg(256, 16, None));
    let replayed = Seen::default();
    let g = bind(&exchange, &mut set, Op::new(&replayed));
    assert_eq!(g.replay(&blobs, 0, 0, 1, 128).unwrap(), 195);
    let mut restored = snapshot;
    restored.extend(replayed.borrow().iter());
    assert_eq!(restored, (0..259).collect::<Vec<_>>());
}

#[test]
fn a_batch_is_delivered_in_parts_while_the_operators_output_has_no_room() {
    let exchange = forward();
    let mut input = exchange.channels(1, 1, cfg(256, 16, None));
    // The operator writes every record on into a channel of 16 batches of 4 records.
    let mut output = exchange.channels(1, 1, cfg(4, 16, None));
    let out = *output
        .readers
        .remove(0)
        .downcast::<Vec<ChannelEnd<i64>>>()
        .unwrap();
    let seen = Seen::default();
    let mut op = Op::new(&seen);
    op.out = Some(writer(&mut output));
    let g = bind(&exchange, &mut input, op);
    let mut w = writer(&mut input);
    for v in 0..256 {
        w.record(v, 0).unwrap();
    }
    let mut downstream = Vec::new();
    // Each part fills the output channel exactly; without the pause the operator would
    // wait in its 17th send with nobody on this thread to empty the channel.
    let mut event = next(&*g);
    for part in 0..4 {
        assert_eq!(event, GateEvent::Records(64), "part {part}");
        assert!(!output_available(), "part {part}: the output is full");
        while let Ok(Msg::Batch(b)) = out[0].data().try_recv() {
            downstream.extend(b.into_iter().map(|(v, _)| v));
        }
        assert!(output_available(), "part {part}: the output was emptied");
        if part < 3 {
            event = g.resume(0).unwrap().expect("the rest of the batch");
        }
    }
    assert_eq!(g.resume(0).unwrap(), None);
    assert_eq!(downstream, (0..256).collect::<Vec<_>>());
    assert_eq!(*seen.borrow(), downstream);
}

#[test]
fn output_is_unavailable_while_a_channel_is_at_its_budget_or_full() {
    let exchange = forward();
    // A budgeted channel: batches of 4, limit 64 records until a rate is measured.
    let mut set = exchange.channels(1, 1, cfg(4, 64, Some(Duration::from_secs(1))));
    let mut w = writer(&mut set);
    assert!(output_available(), "nothing was sent on this thread yet");
    for v in 0..60 {
        w.record(v, 0).unwrap();
    }
    assert!(output_available(), "60 of 64 records queued");
    for v in 60..64 {
        w.record(v, 0).unwrap();
    }
    assert!(!output_available(), "64 of 64 records queued");
    let ends = *set
        .readers
        .remove(0)
        .downcast::<Vec<ChannelEnd<i64>>>()
        .unwrap();
    let Ok(Msg::Batch(b)) = ends[0].data().try_recv() else {
        panic!("a batch");
    };
    ends[0].budget().consumed(b.len());
    assert!(output_available(), "a batch was taken");
    w.record(64, 0).unwrap();
    w.record(65, 0).unwrap();
    w.record(66, 0).unwrap();
    w.record(67, 0).unwrap();
    assert!(!output_available());
    // A channel whose consumer is gone does not hold the task back: sending fails at once.
    drop(ends);
    assert!(output_available());
    let err = w.record(68, 0).and_then(|_| w.control(Control::Flush));
    assert!(err.is_err());

    // A fixed-capacity channel (no budget): unavailable while full.
    let mut set = exchange.channels(1, 1, cfg(4, 2, None));
    let mut w = writer(&mut set);
    for v in 0..8 {
        w.record(v, 0).unwrap();
    }
    assert!(!output_available(), "two batches in a channel of two");
    // A writer that is gone no longer counts.
    drop(w);
    assert!(output_available());
}

#[test]
fn a_batch_pauses_for_a_command_that_waits_and_resumes_where_it_stopped() {
    let exchange = forward();
    let mut set = exchange.channels(1, 1, cfg(256, 16, None));
    let mut w = writer(&mut set);
    for v in 0..256 {
        w.record(v, 0).unwrap();
    }
    // A command arrives for the task while the operator is at record 100 (a slow sink in
    // the middle of a long batch).
    let waiting = Rc::new(Cell::new(false));
    let seen = Seen::default();
    let mut op = Op::new(&seen);
    op.at = 100;
    let arrives = waiting.clone();
    *op.hook.borrow_mut() = Some(Box::new(move || arrives.set(true)));
    let check = waiting.clone();
    pause_delivery_when(Some(Box::new(move || check.get())));
    let g = bind(&exchange, &mut set, op);
    // Delivery stops at the first check after it arrived (every 64 records).
    assert_eq!(next(&*g), GateEvent::Records(128));
    assert_eq!(*seen.borrow(), (0..128).collect::<Vec<_>>());
    // The task takes the command; the rest of the same batch comes next, in order, in one
    // part (nothing waits any more).
    waiting.set(false);
    assert_eq!(g.resume(0).unwrap(), Some(GateEvent::Records(128)));
    assert_eq!(g.resume(0).unwrap(), None);
    assert_eq!(*seen.borrow(), (0..256).collect::<Vec<_>>());
    pause_delivery_when(None);
}
