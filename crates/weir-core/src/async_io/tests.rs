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
