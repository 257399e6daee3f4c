//! The order in which async results leave the operator (sans-IO): Flink's ordered and
//! unordered element queues.
//!
//! Owns [`Queue`]: the records whose requests are in flight or whose results wait, and the
//! watermarks between them. It decides what may be emitted when a result arrives; it does
//! no I/O, spawns nothing and keeps no clock, so every rule is tested without threads.
//!
//! - **Ordered**: results leave in the order their records arrived; a watermark leaves
//!   when every record before it has left.
//! - **Unordered**: a result leaves as soon as it arrives, but never across a watermark: a
//!   watermark leaves once every record before it has, and the results of records after it
//!   wait until it has left. So a watermark never overtakes a pending result in either mode.

use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// In which order results are emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputOrder {
    /// In input order (Flink's `orderedWait`); a slow request holds back the ones after it.
    #[default]
    Ordered,
    /// As they complete, within the stretch between two watermarks (Flink's
    /// `unorderedWait`).
    Unordered,
}

/// What leaves the queue, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Emit<O> {
    /// A result (`None`: the record's timeout handler emitted nothing) with its record's
    /// timestamp.
    Record(Option<O>, Timestamp),
    /// A watermark.
    Watermark(Timestamp),
}

/// One record of the queue as a checkpoint stores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Stored<T, O> {
    /// Its request was in flight: re-issued on restore.
    Pending(T, Timestamp),
    /// Its result waited to be emitted: emitted on restore without a new request.
    Done(Option<O>, Timestamp),
}

struct Slot<T, O> {
    input: Option<T>,
    ts: Timestamp,
    /// Where the record goes on a restore at another parallelism (its key group on a keyed
    /// stream), kept for the checkpoint.
    route: u32,
    done: Option<Option<O>>,
}

/// The records in the operator and the watermarks between them.
pub(crate) struct Queue<T, O> {
    order: OutputOrder,
    next: u64,
    records: BTreeMap<u64, Slot<T, O>>,
    /// Watermarks waiting, with the sequence number they were given (records before them
    /// have smaller ones).
    watermarks: VecDeque<(u64, Timestamp)>,
    pending: usize,
}

impl<T, O> Queue<T, O> {
    pub(crate) fn new(order: OutputOrder) -> Self {
        Queue {
            order,
            next: 0,
            records: BTreeMap::new(),
            watermarks: VecDeque::new(),
            pending: 0,
        }
    }

    /// Records in the queue (in flight or waiting to be emitted): what the capacity bounds.
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// Records whose request is in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.pending
    }

    /// True when nothing (no record, no watermark) waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty() && self.watermarks.is_empty()
    }

    /// Adds a record whose request is about to be issued; returns its sequence number.
    pub(crate) fn push(&mut self, input: T, ts: Timestamp, route: u32) -> u64 {
        self.push_slot(Some(input), ts, route)
    }

    /// Adds a record whose result is already known (restored from a checkpoint).
    pub(crate) fn push_done(
        &mut self,
        output: Option<O>,
        ts: Timestamp,
        route: u32,
        out: &mut Vec<Emit<O>>,
    ) {
        let seq = self.push_slot(None, ts, route);
        self.complete(seq, output, out);
    }

    fn push_slot(&mut self, input: Option<T>, ts: Timestamp, route: u32) -> u64 {
        let seq = self.next;
        self.next += 1;
        self.records.insert(
            seq,
            Slot {
                input,
                ts,
                route,
                done: None,
            },
        );
        self.pending += 1;
        seq
    }

    /// The input of a record whose request is in flight (to issue it again).
    pub(crate) fn input(&self, seq: u64) -> Option<&T> {
        self.records.get(&seq).and_then(|s| s.input.as_ref())
    }

    /// Adds a watermark: it leaves at once when no record is before it.
    pub(crate) fn push_watermark(&mut self, w: Timestamp, out: &mut Vec<Emit<O>>) {
        if self.records.is_empty() && self.watermarks.is_empty() {
            out.push(Emit::Watermark(w));
            return;
        }
        let seq = self.next;
        self.next += 1;
        self.watermarks.push_back((seq, w));
        self.drain(out);
    }

    /// The result of record `seq` arrived (`None`: nothing to emit for it); appends what
    /// may leave now to `out`. A sequence number not in flight is ignored.
    pub(crate) fn complete(&mut self, seq: u64, output: Option<O>, out: &mut Vec<Emit<O>>) {
        let Some(slot) = self.records.get_mut(&seq) else {
            return;
        };
        if slot.done.is_some() {
            return;
        }
        self.pending -= 1;
        slot.input = None;
        match self.order {
            OutputOrder::Ordered => {
                slot.done = Some(output);
                self.drain(out);
            }
            OutputOrder::Unordered => {
                if self.watermarks.front().is_none_or(|(wseq, _)| seq < *wseq) {
                    let ts = slot.ts;
                    self.records.remove(&seq);
                    out.push(Emit::Record(output, ts));
                    self.drain(out);
                } else {
                    slot.done = Some(output);
                }
            }
        }
    }

    fn drain(&mut self, out: &mut Vec<Emit<O>>) {
        match self.order {
            OutputOrder::Ordered => loop {
                let first = self
                    .records
                    .first_key_value()
                    .map(|(s, slot)| (*s, slot.done.is_some()));
                match (first, self.watermarks.front()) {
                    (first, Some(&(wseq, w))) if first.is_none_or(|(s, _)| wseq < s) => {
                        self.watermarks.pop_front();
                        out.push(Emit::Watermark(w));
                    }
                    (Some((_, true)), _) => {
                        let (_, slot) = self.records.pop_first().expect("first record");
                        out.push(Emit::Record(slot.done.expect("done"), slot.ts));
                    }
                    _ => break,
                }
            },
            OutputOrder::Unordered => {
                while let Some(&(wseq, w)) = self.watermarks.front() {
                    if self
                        .records
                        .first_key_value()
                        .is_some_and(|(s, _)| *s < wseq)
                    {
                        break;
                    }
                    self.watermarks.pop_front();
                    out.push(Emit::Watermark(w));
                    // The next stretch's results that arrived meanwhile may leave now.
                    let end = self.watermarks.front().map_or(u64::MAX, |(s, _)| *s);
                    let ready: Vec<u64> = self
                        .records
                        .range(..end)
                        .filter(|(_, slot)| slot.done.is_some())
                        .map(|(s, _)| *s)
                        .collect();
                    for s in ready {
                        let slot = self.records.remove(&s).expect("ready record");
                        out.push(Emit::Record(slot.done.expect("done"), slot.ts));
                    }
                }
            }
        }
    }

    /// The records in arrival order, as a checkpoint stores them (watermarks are not
    /// stored: a resumed job re-establishes its watermark before any record).
    pub(crate) fn snapshot(&self) -> impl Iterator<Item = (u32, Stored<&T, &O>)> {
        self.records
            .values()
            .filter_map(|slot| match (&slot.done, &slot.input) {
                (Some(o), _) => Some((slot.route, Stored::Done(o.as_ref(), slot.ts))),
                (None, Some(i)) => Some((slot.route, Stored::Pending(i, slot.ts))),
                (None, None) => None,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(out: &[Emit<i32>]) -> Vec<String> {
        out.iter()
            .map(|e| match e {
                Emit::Record(Some(v), _) => v.to_string(),
                Emit::Record(None, _) => "-".to_string(),
                Emit::Watermark(w) => format!("W{w}"),
            })
            .collect()
    }

    #[test]
    fn ordered_results_leave_in_input_order() {
        let mut q = Queue::<&str, i32>::new(OutputOrder::Ordered);
        let mut out = Vec::new();
        let a = q.push("a", 1, 0);
        let b = q.push("b", 2, 0);
        let c = q.push("c", 3, 0);
        q.complete(c, Some(3), &mut out);
        q.complete(b, Some(2), &mut out);
        assert!(out.is_empty());
        assert_eq!((q.len(), q.in_flight()), (3, 1));
        q.complete(a, Some(1), &mut out);
        assert_eq!(records(&out), ["1", "2", "3"]);
        assert_eq!(out[0], Emit::Record(Some(1), 1));
        assert!(q.is_empty());
    }

    #[test]
    fn ordered_watermark_waits_for_the_records_before_it() {
        let mut q = Queue::<&str, i32>::new(OutputOrder::Ordered);
        let mut out = Vec::new();
        let a = q.push("a", 1, 0);
        q.push_watermark(5, &mut out);
        let b = q.push("b", 6, 0);
        q.complete(b, Some(2), &mut out);
        assert!(out.is_empty());
        q.complete(a, None, &mut out);
        assert_eq!(records(&out), ["-", "W5", "2"]);
    }

    #[test]
    fn a_watermark_with_nothing_before_it_leaves_at_once() {
        let mut q = Queue::<&str, i32>::new(OutputOrder::Unordered);
        let mut out = Vec::new();
        q.push_watermark(9, &mut out);
        assert_eq!(records(&out), ["W9"]);
    }

    #[test]
    fn unordered_results_leave_as_they_arrive_but_never_across_a_watermark() {
        let mut q = Queue::<&str, i32>::new(OutputOrder::Unordered);
        let mut out = Vec::new();
        let a = q.push("a", 1, 0);
        let b = q.push("b", 2, 0);
        q.push_watermark(5, &mut out);
        let c = q.push("c", 6, 0);
        q.push_watermark(10, &mut out);
        let d = q.push("d", 11, 0);
        q.complete(b, Some(2), &mut out);
        assert_eq!(records(&out), ["2"]);
        // c and d arrive before the watermarks ahead of them may leave.
        q.complete(d, Some(4), &mut out);
        q.complete(c, Some(3), &mut out);
        assert_eq!(records(&out), ["2"]);
        q.complete(a, Some(1), &mut out);
        assert_eq!(records(&out), ["2", "1", "W5", "3", "W10", "4"]);
        assert!(q.is_empty());
    }

    #[test]
    fn unordered_later_stretch_waits_while_the_earlier_one_is_pending() {
        let mut q = Queue::<&str, i32>::new(OutputOrder::Unordered);
        let mut out = Vec::new();
        let a = q.push("a", 1, 0);
        q.push_watermark(5, &mut out);
        let b = q.push("b", 6, 0);
        let c = q.push("c", 7, 0);
        q.complete(c, Some(3), &mut out);
        assert!(out.is_empty());
        q.complete(a, Some(1), &mut out);
        assert_eq!(records(&out), ["1", "W5", "3"]);
        q.complete(b, Some(2), &mut out);
        assert_eq!(records(&out), ["1", "W5", "3", "2"]);
    }

    #[test]
    fn snapshot_holds_pending_inputs_and_waiting_results_in_order() {
        let mut q = Queue::<&str, i32>::new(OutputOrder::Ordered);
        let mut out = Vec::new();
        q.push("a", 1, 0);
        let b = q.push("b", 2, 0);
        q.push_watermark(3, &mut out);
        q.push("c", 4, 0);
        q.complete(b, Some(20), &mut out);
        assert_eq!(
            q.snapshot().collect::<Vec<_>>(),
            [
                (0, Stored::Pending(&"a", 1)),
                (0, Stored::Done(Some(&20), 2)),
                (0, Stored::Pending(&"c", 4))
            ]
        );
        assert_eq!(q.input(b), None);
        // A restored result counts like a record until it leaves.
        let mut r = Queue::<&str, i32>::new(OutputOrder::Ordered);
        let x = r.push("x", 0, 0);
        r.push_done(Some(7), 1, 0, &mut out);
        assert_eq!(r.len(), 2);
        r.complete(x, Some(6), &mut out);
        assert_eq!(records(&out)[..], ["6", "7"]);
    }

    #[test]
    fn a_second_completion_is_ignored() {
        let mut q = Queue::<&str, i32>::new(OutputOrder::Unordered);
        let mut out = Vec::new();
        let a = q.push("a", 1, 0);
        q.complete(a, Some(1), &mut out);
        q.complete(a, Some(1), &mut out);
        q.complete(99, Some(1), &mut out);
        assert_eq!(records(&out), ["1"]);
        assert_eq!(q.in_flight(), 0);
    }
}
