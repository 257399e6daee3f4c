//! How a restore shares the stored in-flight records among the new subtasks.

use super::queue::Stored;
use super::saved::{SavedState, share};
use crate::data::key_group_range;

fn saved(
    subtask: u32,
    parallelism: u32,
    records: &[(u32, &'static str)],
) -> SavedState<&'static str, i32> {
    SavedState {
        subtask,
        parallelism,
        records: records
            .iter()
            .map(|(r, s)| (*r, Stored::Pending(*s, 0)))
            .collect(),
    }
}

fn names(records: Vec<(u32, Stored<&'static str, i32>)>) -> Vec<&'static str> {
    records
        .into_iter()
        .map(|(_, s)| match s {
            Stored::Pending(n, _) => n,
            Stored::Done(..) => "done",
        })
        .collect()
}

fn old_states() -> Vec<SavedState<&'static str, i32>> {
    // Stored out of subtask order, as the checkpoint may list them.
    vec![
        saved(1, 2, &[(0, "c"), (0, "d")]),
        saved(0, 2, &[(0, "a"), (0, "b"), (0, "e")]),
    ]
}

#[test]
fn at_the_same_parallelism_each_subtask_gets_its_own_records_back() {
    assert_eq!(names(share(old_states(), None, 0, 2)), ["a", "b", "e"]);
    assert_eq!(names(share(old_states(), None, 1, 2)), ["c", "d"]);
}

#[test]
fn at_another_parallelism_records_are_spread_round_robin_each_exactly_once() {
    let mut all = Vec::new();
    for me in 0..3 {
        let mine = names(share(old_states(), None, me, 3));
        assert!(mine.len() <= 2, "{mine:?}");
        all.extend(mine);
    }
    all.sort();
    assert_eq!(all, ["a", "b", "c", "d", "e"]);
    assert_eq!(
        names(share(old_states(), None, 0, 1)),
        ["a", "b", "e", "c", "d"]
    );
}

#[test]
fn on_a_keyed_stream_records_go_to_the_owner_of_their_key_group() {
    let old = || {
        vec![
            saved(0, 2, &[(3, "g3"), (100, "g100"), (60, "g60")]),
            saved(1, 2, &[(127, "g127"), (64, "g64")]),
        ]
    };
    let mine = |me| names(share(old(), Some(key_group_range(me, 128, 3)), me, 3));
    // Three subtasks own key groups [0,43), [43,86), [86,128).
    assert_eq!(mine(0), ["g3"]);
    assert_eq!(mine(1), ["g60", "g64"]);
    assert_eq!(mine(2), ["g100", "g127"]);
}

mod queue_model {
    //! The queue against the rules it promises, on random interleavings of records,
    //! watermarks and completions.

    use super::super::queue::{Emit, OutputOrder, Queue};
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Record,
        Watermark,
        /// Completes the pending record at this position (modulo their number).
        Complete(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => Just(Step::Record),
            1 => Just(Step::Watermark),
            4 => any::<usize>().prop_map(Step::Complete),
        ]
    }

    /// Runs the steps, then completes what is still pending in order; returns what left
    /// the queue as record numbers and watermarks (`None`), and how many records there were.
    fn run(order: OutputOrder, steps: &[Step]) -> (Vec<Option<i64>>, Vec<Option<i64>>, i64) {
        let mut q = Queue::<i64, i64>::new(order);
        let mut out = Vec::new();
        // What entered, in order: records by number, watermarks as None.
        let mut entered = Vec::new();
        let mut pending: Vec<(u64, i64)> = Vec::new();
        let (mut records, mut watermarks) = (0i64, 0i64);
        for s in steps {
            match s {
                Step::Record => {
                    let seq = q.push(records, records, 0);
                    pending.push((seq, records));
                    entered.push(Some(records));
                    records += 1;
                }
                Step::Watermark => {
                    q.push_watermark(watermarks, &mut out);
                    entered.push(None);
                    watermarks += 1;
                }
                Step::Complete(i) if !pending.is_empty() => {
                    let (seq, n) = pending.remove(i % pending.len());
                    q.complete(seq, Some(n), &mut out);
                }
                Step::Complete(_) => {}
            }
            assert_eq!(q.in_flight(), pending.len());
        }
        for (seq, n) in pending.drain(..) {
            q.complete(seq, Some(n), &mut out);
        }
        assert!(q.is_empty());
        let left = out
            .into_iter()
            .map(|e| match e {
                Emit::Record(Some(n), ts) => {
                    assert_eq!(n, ts, "a result keeps its record's timestamp");
                    Some(n)
                }
                Emit::Record(None, _) => unreachable!("every call emitted"),
                Emit::Watermark(_) => None,
            })
            .collect();
        (entered, left, records)
    }

    /// Records between two watermarks, as sorted sets, in order.
    fn stretches(items: &[Option<i64>]) -> Vec<Vec<i64>> {
        let mut out = vec![Vec::new()];
        for i in items {
            match i {
                Some(n) => out.last_mut().unwrap().push(*n),
                None => out.push(Vec::new()),
            }
        }
        for s in &mut out {
            s.sort();
        }
        out
    }

    proptest! {
        #[test]
        fn ordered_output_is_the_input_order(steps in prop::collection::vec(step(), 0..80)) {
            let (entered, left, _) = run(OutputOrder::Ordered, &steps);
            prop_assert_eq!(left, entered);
        }

        #[test]
        fn unordered_output_never_moves_a_record_across_a_watermark(
            steps in prop::collection::vec(step(), 0..80)
        ) {
            let (entered, left, records) = run(OutputOrder::Unordered, &steps);
            // Every record leaves once, and each stays between the watermarks it came
            // between; watermarks leave in their order.
            prop_assert_eq!(stretches(&left), stretches(&entered));
            prop_assert_eq!(left.iter().flatten().count() as i64, records);
        }
    }
}
