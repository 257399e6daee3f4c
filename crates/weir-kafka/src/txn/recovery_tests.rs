//! Tests of the restore's decisions ([`Restore`]): fencing, what became of a marker
//! partition, which pending epochs committed, and refusing output the checkpoint does not
//! cover — by example, and by simulating whole lifecycles (checkpoints, savepoints, crashes,
//! rollbacks, rescales, renames, trimmed and recreated marker topics) against a modelled
//! marker log whose ground truth is known.

use super::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

fn ident(prefix: &str) -> SinkIdentity {
    SinkIdentity {
        prefix: prefix.into(),
        marker_topic: format!("m.{prefix}"),
        topic: "out".into(),
    }
}

fn pe(epoch: u64, token: u64, marker: PartitionOffset) -> PendingEpoch {
    PendingEpoch {
        epoch,
        slot: 0,
        token,
        records: 1,
        first_offsets: vec![(0, 0)],
        marker,
    }
}

fn km(prefix: &str, subtask: u32, offset: i64, token: u64) -> KnownMarker {
    KnownMarker {
        topic: format!("m.{prefix}"),
        partition: 0,
        key: marker_key(prefix, subtask),
        subtask,
        offset,
        token: Some(token),
        copy: 0,
    }
}

#[allow(clippy::too_many_arguments)]
fn snap(
    prefix: &str,
    subtask: u32,
    parallelism: u32,
    pool: u32,
    lineage: u64,
    pending: Vec<PendingEpoch>,
    known: Vec<KnownMarker>,
) -> SinkSnapshot {
    SinkSnapshot {
        version: SNAPSHOT_VERSION,
        identity: ident(prefix),
        subtask,
        parallelism,
        pool,
        lineage_token: lineage,
        lineage_tokens: vec![lineage],
        pending,
        known,
    }
}

fn closes(lineage: u64, subtask: u32, epoch: u64, token: u64) -> MarkerValue {
    MarkerValue::Closes {
        lineage,
        subtask,
        epoch,
        token,
        copy: 0,
    }
}

fn sm(offset: i64, key: &str, value: MarkerValue) -> ScannedMarker {
    ScannedMarker {
        offset,
        key: key.into(),
        value,
    }
}

fn intact(topic: &str, markers: Vec<ScannedMarker>) -> BTreeMap<MarkerPartition, Scanned> {
    [(
        (topic.to_string(), 0),
        Scanned {
            incarnation: Incarnation::Intact,
            low: 0,
            markers,
        },
    )]
    .into()
}

fn ids(prefix: &str, list: &[(u32, u32)]) -> Vec<String> {
    list.iter()
        .map(|&(l, s)| transactional_id(prefix, l, s))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Fencing
// ---------------------------------------------------------------------------------------

fn three_subtasks(prefix: &str) -> Vec<SinkSnapshot> {
    (0..3)
        .map(|s| snap(prefix, s, 3, 2, 7, vec![], vec![]))
        .collect()
}

#[test]
fn fencing_at_the_same_parallelism_covers_the_subtasks_own_ids() {
    let r = Restore::new(ident("p"), &three_subtasks("p"), 1, 3, 9);
    assert_eq!(r.fence(2, &BTreeMap::new()), ids("p", &[(1, 0), (1, 1)]));
    assert_eq!(
        r.writers.iter().map(|w| w.subtask).collect::<Vec<_>>(),
        vec![1]
    );
}

#[test]
fn fencing_after_rescaling_covers_the_subtasks_taken_over() {
    // 3 → 1: subtask 0 takes all three
    let r = Restore::new(ident("p"), &three_subtasks("p"), 0, 1, 9);
    assert_eq!(
        r.fence(2, &BTreeMap::new()),
        ids("p", &[(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)])
    );
    // 3 → 2: subtask 0 takes 0 and 2
    let r = Restore::new(ident("p"), &three_subtasks("p"), 0, 2, 9);
    assert_eq!(
        r.fence(2, &BTreeMap::new()),
        ids("p", &[(0, 0), (0, 1), (2, 0), (2, 1)])
    );
    assert_eq!(
        r.writers.iter().map(|w| w.subtask).collect::<Vec<_>>(),
        vec![0, 2]
    );
    // 3 → 4: subtask 3 is new and takes nothing, but fences its own ids
    let r = Restore::new(ident("p"), &three_subtasks("p"), 3, 4, 9);
    assert_eq!(r.fence(2, &BTreeMap::new()), ids("p", &[(3, 0), (3, 1)]));
    assert!(r.writers.is_empty());
}

#[test]
fn fencing_covers_the_largest_pool_and_registered_runs() {
    // this run's pool (with its growth) is larger than the snapshots'
    let r = Restore::new(ident("p"), &three_subtasks("p"), 0, 3, 9);
    assert_eq!(
        r.fence(4, &BTreeMap::new()),
        ids("p", &[(0, 0), (0, 1), (0, 2), (0, 3)])
    );
    // a run at parallelism 6 with pool 3 crashed before its first checkpoint
    let reg = [(
        "p".to_string(),
        Registered {
            parallelism: 6,
            pool: 3,
        },
    )]
    .into();
    assert_eq!(
        r.fence(1, &reg),
        ids("p", &[(0, 0), (0, 1), (0, 2), (3, 0), (3, 1), (3, 2)])
    );
    // nothing restored: the registry alone bounds what to fence
    let r = Restore::new(ident("p"), &[], 1, 2, 0);
    assert_eq!(r.fence(2, &BTreeMap::new()), ids("p", &[(1, 0), (1, 1)]));
    assert_eq!(
        r.fence(1, &reg),
        ids(
            "p",
            &[
                (1, 0),
                (1, 1),
                (1, 2),
                (3, 0),
                (3, 1),
                (3, 2),
                (5, 0),
                (5, 1),
                (5, 2)
            ]
        )
    );
}

#[test]
fn after_a_rename_both_prefixes_are_fenced() {
    // checkpoint written under "old" at parallelism 2, restored under "new" at 1
    let snaps: Vec<_> = (0..2)
        .map(|s| snap("old", s, 2, 3, 7, vec![], vec![]))
        .collect();
    let r = Restore::new(ident("new"), &snaps, 0, 1, 9);
    assert_eq!(
        r.registries(&snaps),
        vec![
            ("new".to_string(), "m.new".to_string()),
            ("old".to_string(), "m.old".to_string())
        ]
    );
    let mut want = ids("new", &[(0, 0), (0, 1)]);
    want.extend(ids(
        "old",
        &[(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)],
    ));
    assert_eq!(r.fence(2, &BTreeMap::new()), want);
    assert_eq!(r.writers[0].identity, ident("old"));
}

// ---------------------------------------------------------------------------------------
// What became of a partition, and where to read it
// ---------------------------------------------------------------------------------------

#[test]
fn incarnations() {
    let rec = Recorded {
        offset: 10,
        key: "p/0".into(),
        token: Some(5),
        copy: 0,
        legacy_epoch: None,
    };
    let ours = closes(1, 0, 3, 5).encode();
    let other = closes(1, 0, 3, 6).encode();
    let inc = |exists, low, high, at: Option<(&[u8], &[u8])>| {
        Restore::incarnation(Some(&rec), exists, low, high, at)
    };
    assert_eq!(
        inc(true, 0, 20, Some((b"p/0", ours.as_bytes()))),
        Incarnation::Intact
    );
    // another marker at that offset, or none: the topic was recreated
    assert_eq!(
        inc(true, 0, 20, Some((b"p/0", other.as_bytes()))),
        Incarnation::Replaced
    );
    assert_eq!(
        inc(true, 0, 20, Some((b"p/1", ours.as_bytes()))),
        Incarnation::Replaced
    );
    assert_eq!(inc(true, 0, 20, None), Incarnation::Replaced);
    // a copy a restore wrote, closing the same transaction at the same offset of a
    // recreated topic, is not the original
    let copy = MarkerValue::Closes {
        lineage: 1,
        subtask: 0,
        epoch: 3,
        token: 5,
        copy: 77,
    }
    .encode();
    assert_eq!(
        inc(true, 0, 20, Some((b"p/0", copy.as_bytes()))),
        Incarnation::Replaced
    );
    // the partition ends before the offset: recreated
    assert_eq!(inc(true, 0, 10, None), Incarnation::Replaced);
    // it starts after the offset: retention
    assert_eq!(inc(true, 11, 30, None), Incarnation::Trimmed);
    assert_eq!(inc(false, 0, 0, None), Incarnation::Missing);
    assert_eq!(
        Restore::incarnation(None, true, 0, 5, None),
        Incarnation::Unrecorded
    );
    assert_eq!(
        Restore::incarnation(None, false, 0, 0, None),
        Incarnation::Missing
    );
    // version 1: the key alone, or the legacy epoch of a pending marker
    let v1 = Recorded {
        token: None,
        ..rec.clone()
    };
    assert!(v1.matches(b"p/0", b"anything"));
    let v1_pending = Recorded {
        token: None,
        legacy_epoch: Some(3),
        ..rec
    };
    assert!(v1_pending.matches(b"p/0", b"3"));
    assert!(!v1_pending.matches(b"p/0", b"4"));
}

#[test]
fn scans_start_at_the_oldest_recorded_marker_when_offsets_compare() {
    let s0 = snap(
        "p",
        0,
        2,
        1,
        7,
        vec![pe(9, 90, (0, 40))],
        vec![km("p", 0, 30, 80)],
    );
    let s1 = snap("p", 1, 2, 1, 7, vec![], vec![km("p", 1, 12, 70)]);
    let r = Restore::new(ident("p"), &[s0, s1], 0, 2, 9);
    assert_eq!(r.marker_topics(), vec!["m.p".to_string()]);
    let parts = r.marker_partitions(&[("m.p".to_string(), vec![0, 1])].into());
    assert_eq!(
        parts,
        vec![
            (
                ("m.p".to_string(), 0),
                Some(Recorded {
                    offset: 40,
                    key: "p/0".into(),
                    token: Some(90),
                    copy: 0,
                    legacy_epoch: None
                })
            ),
            (("m.p".to_string(), 1), None),
        ]
    );
    let tp = ("m.p".to_string(), 0);
    assert_eq!(r.scan_start(&tp, Incarnation::Intact, 0), Some(12));
    assert_eq!(r.scan_start(&tp, Incarnation::Trimmed, 20), Some(20));
    assert_eq!(r.scan_start(&tp, Incarnation::Replaced, 3), Some(3));
    assert_eq!(r.scan_start(&tp, Incarnation::Missing, 0), None);
    let other = ("m.p".to_string(), 1);
    assert_eq!(r.scan_start(&other, Incarnation::Unrecorded, 5), Some(5));
}

// ---------------------------------------------------------------------------------------
// Deciding
// ---------------------------------------------------------------------------------------

/// Subtask 0 of 1 with epochs 4 (token 40, marker at 10) and 5 (token 50, marker at 11)
/// pending, lineage 7.
fn two_pending() -> Restore {
    let s = snap(
        "p",
        0,
        1,
        3,
        7,
        vec![pe(4, 40, (0, 10)), pe(5, 50, (0, 11))],
        vec![km("p", 0, 11, 50)],
    );
    Restore::new(ident("p"), &[s], 0, 1, 5)
}

#[test]
fn an_epoch_committed_iff_a_committed_marker_closes_its_token() {
    let r = two_pending();
    // epoch 4's marker committed, epoch 5's not (aborted: invisible to read_committed)
    let d = r
        .decide(
            &intact("m.p", vec![sm(10, "p/0", closes(7, 0, 4, 40))]),
            false,
        )
        .unwrap();
    assert_eq!(d.writers[0].committed, vec![4]);
    assert_eq!(d.writers[0].replay, vec![pe(5, 50, (0, 11))]);
    assert!(d.writers[0].ask_output.is_empty() && d.accepted_newer.is_empty());
    // an earlier restore re-produced epoch 5: its marker, later in the log, closes token 50
    let d = r
        .decide(
            &intact(
                "m.p",
                vec![
                    sm(10, "p/0", closes(7, 0, 4, 40)),
                    sm(12, "p/0", closes(7, 0, 5, 50)),
                ],
            ),
            false,
        )
        .unwrap();
    assert_eq!(d.writers[0].committed, vec![4, 5]);
    assert!(d.writers[0].replay.is_empty());
}

#[test]
fn a_marker_naming_the_same_checkpoint_id_but_another_transaction_commits_nothing() {
    // A run restored into a new checkpoint directory numbered its checkpoints anew: its
    // committed marker for "checkpoint 5" closes another transaction.
    let r = two_pending();
    let other_lineage = intact("m.p", vec![sm(12, "p/0", closes(8, 0, 5, 999))]);
    let d = r.decide(&other_lineage, false).unwrap();
    assert!(d.writers[0].committed.is_empty());
    assert_eq!(d.writers[0].replay.len(), 2);
}

#[test]
fn gone_markers_leave_the_decision_to_the_output() {
    let r = two_pending();
    let tp = ("m.p".to_string(), 0);
    for (inc, low, why) in [
        (Incarnation::Trimmed, 20, "was removed by retention"),
        (Incarnation::Replaced, 0, "is not there"),
        (Incarnation::Missing, 0, "does not exist"),
    ] {
        let scanned = [(
            tp.clone(),
            Scanned {
                incarnation: inc,
                low,
                markers: vec![],
            },
        )]
        .into();
        let d = r.decide(&scanned, false).unwrap();
        let w = &d.writers[0];
        assert!(w.committed.is_empty() && w.replay.is_empty(), "{inc:?}");
        assert_eq!(w.ask_output.len(), 2);
        assert!(
            w.ask_output[0].1.contains(why),
            "{inc:?}: {}",
            w.ask_output[0].1
        );
    }
    // intact, but epoch 4's marker alone fell to retention: only epoch 4 is in doubt
    let scanned = [(
        tp.clone(),
        Scanned {
            incarnation: Incarnation::Intact,
            low: 11,
            markers: vec![],
        },
    )]
    .into();
    let d = r.decide(&scanned, false).unwrap();
    assert_eq!(d.writers[0].replay, vec![pe(5, 50, (0, 11))]);
    assert_eq!(d.writers[0].ask_output.len(), 1);
    // a recreated topic that holds a marker closing the token (a restore re-produced it
    // there) still proves the commit
    let scanned = [(
        tp,
        Scanned {
            incarnation: Incarnation::Replaced,
            low: 0,
            markers: vec![sm(0, "p/0", closes(7, 0, 4, 40))],
        },
    )]
    .into();
    let d = r.decide(&scanned, false).unwrap();
    assert_eq!(d.writers[0].committed, vec![4]);
    assert_eq!(d.writers[0].ask_output.len(), 1);
}

#[test]
fn newer_output_of_the_lineage_is_refused_unless_accepted() {
    let r = two_pending();
    let newer = intact(
        "m.p",
        vec![
            sm(10, "p/0", closes(7, 0, 4, 40)),
            sm(11, "p/0", closes(7, 0, 5, 50)),
            // checkpoint 6 committed after the restored checkpoint 5
            sm(14, "p/0", closes(7, 0, 6, 60)),
        ],
    );
    let e = r.decide(&newer, false).unwrap_err();
    assert_eq!(
        e,
        NewerCommit {
            subtask: 0,
            epoch: 6,
            marker: ("m.p".into(), 0, 14),
            key: "p/0".into(),
            token: Some(60),
            copy: 0,
            checkpoint: 5,
        }
    );
    assert!(e.to_string().contains(
        "subtask 0 already committed the output of checkpoint 6 (marker m.p/0 at offset 14), \
         which checkpoint 5 being restored does not cover"
    ));
    let d = r.decide(&newer, true).unwrap();
    assert_eq!(d.accepted_newer, vec![e]);
    assert_eq!(d.writers[0].committed, vec![4, 5]);
    // the same epoch id in the output of a new run in a new checkpoint directory is no
    // less newer: ids are not compared
    let low_id = intact("m.p", vec![sm(14, "p/0", closes(7, 0, 2, 61))]);
    assert_eq!(r.decide(&low_id, false).unwrap_err().epoch, 2);
}

#[test]
fn markers_of_other_lineages_other_shares_and_known_ones_are_not_newer() {
    // subtask 1 of 2 restores writer 1; writer 0 is subtask 0's to check
    let s0 = snap("p", 0, 2, 3, 7, vec![], vec![km("p", 0, 5, 1)]);
    let s1 = snap("p", 1, 2, 3, 7, vec![], vec![km("p", 1, 6, 2)]);
    let r = Restore::new(ident("p"), &[s0.clone(), s1.clone()], 1, 2, 9);
    let scanned = intact(
        "m.p",
        vec![
            sm(5, "p/0", closes(7, 0, 3, 1)),
            sm(6, "p/1", closes(7, 1, 3, 2)),
            // another lineage (a fresh start under the same prefix)
            sm(8, "p/1", closes(99, 1, 20, 77)),
            // newer output of writer 0: subtask 0 refuses it
            sm(9, "p/0", closes(7, 0, 10, 3)),
        ],
    );
    assert!(r.decide(&scanned, false).is_ok());
    let r0 = Restore::new(ident("p"), &[s0, s1], 0, 2, 9);
    assert_eq!(r0.decide(&scanned, false).unwrap_err().epoch, 10);
    // a writer the checkpoint never saw (a later run at a larger parallelism)
    let r1 = Restore::new(ident("p"), &three_subtasks("p")[..1], 0, 1, 9);
    let unknown = intact("m.p", vec![sm(3, "p/4", closes(7, 4, 12, 5))]);
    assert_eq!(r1.decide(&unknown, false).unwrap_err().subtask, 4);
}

#[test]
fn a_rename_keeps_the_lineage_and_reads_the_old_markers() {
    let s = snap("old", 0, 1, 3, 7, vec![pe(4, 40, (0, 10))], vec![]);
    let r = Restore::new(ident("new"), &[s], 0, 1, 4);
    assert_eq!(r.lineage_token(123), 7);
    assert_eq!(
        r.marker_topics(),
        vec!["m.new".to_string(), "m.old".to_string()]
    );
    let parts: Vec<MarkerPartition> = r
        .marker_partitions(
            &[
                ("m.new".to_string(), vec![0]),
                ("m.old".to_string(), vec![0]),
            ]
            .into(),
        )
        .into_iter()
        .map(|(tp, _)| tp)
        .collect();
    assert_eq!(parts, vec![("m.new".into(), 0), ("m.old".into(), 0)]);
    let mut scanned = intact("m.old", vec![sm(10, "old/0", closes(7, 0, 4, 40))]);
    scanned.insert(
        ("m.new".into(), 0),
        Scanned {
            incarnation: Incarnation::Unrecorded,
            low: 0,
            markers: vec![],
        },
    );
    let d = r.decide(&scanned, false).unwrap();
    assert_eq!(d.writers[0].committed, vec![4]);
    // output of the lineage under the new name, which the checkpoint never saw, is newer
    scanned.get_mut(&("m.new".to_string(), 0)).unwrap().markers =
        vec![sm(0, "new/0", closes(7, 0, 5, 50))];
    assert_eq!(r.decide(&scanned, false).unwrap_err().epoch, 5);
}

#[test]
fn version_1_snapshots_are_read_and_decided_by_their_legacy_markers() {
    #[derive(serde::Serialize)]
    struct V1 {
        version: u32,
        lineage: u32,
        parallelism: u32,
        pool: u32,
        pending: Vec<PendingEpoch>,
        last_committed_marker: Option<PartitionOffset>,
    }
    let bytes = bincode::serde::encode_to_vec(
        V1 {
            version: 1,
            lineage: 0,
            parallelism: 1,
            pool: 3,
            pending: vec![pe(6, 60, (0, 20))],
            last_committed_marker: Some((0, 15)),
        },
        bincode::config::standard(),
    )
    .unwrap();
    let s = decode_snapshot(&bytes, &ident("p")).unwrap();
    assert_eq!(s.version, 1);
    assert_eq!(s.identity, ident("p"));
    assert!(s.lineage_tokens.is_empty());
    assert_eq!(
        s.known,
        vec![KnownMarker {
            token: None,
            ..km("p", 0, 15, 0)
        }]
    );
    let r = Restore::new(ident("p"), &[s], 0, 1, 6);
    assert_eq!(r.lineage_token(123), 123);
    // the legacy marker at the recorded offset names checkpoint 6: committed
    let d = r
        .decide(
            &intact(
                "m.p",
                vec![
                    sm(15, "p/0", MarkerValue::Legacy { epoch: 5 }),
                    sm(20, "p/0", MarkerValue::Legacy { epoch: 6 }),
                ],
            ),
            false,
        )
        .unwrap();
    assert_eq!(d.writers[0].committed, vec![6]);
    // a legacy marker of a later checkpoint id is newer output, as before
    let e = r
        .decide(
            &intact("m.p", vec![sm(22, "p/0", MarkerValue::Legacy { epoch: 7 })]),
            false,
        )
        .unwrap_err();
    assert_eq!((e.epoch, e.checkpoint), (7, 6));
    // a version we do not know is refused with both versions named
    let bytes = bincode::serde::encode_to_vec(9u32, bincode::config::standard()).unwrap();
    assert_eq!(
        decode_snapshot(&bytes, &ident("p")).unwrap_err(),
        "the sink's checkpoint state has version 9, this weir reads versions 1 and 2"
    );
}

#[test]
fn the_new_run_carries_the_markers_of_its_share() {
    let s0 = snap(
        "p",
        0,
        2,
        3,
        7,
        vec![pe(4, 40, (0, 10))],
        vec![km("p", 0, 8, 30)],
    );
    let s1 = snap("p", 1, 2, 3, 7, vec![], vec![km("p", 1, 9, 31)]);
    let r = Restore::new(ident("p"), &[s0, s1], 0, 1, 4);
    let scanned = intact("m.p", vec![]);
    // epoch 4 re-produced at offset 12
    let carried = r.carry(&scanned, &nothing_decided(&r), vec![km("p", 0, 12, 40)]);
    assert_eq!(carried, vec![km("p", 0, 12, 40), km("p", 1, 9, 31)]);
    // at parallelism 2, subtask 1 carries writer 1 only
    let r = Restore::new(ident("p"), &r_snaps_again(), 1, 2, 4);
    assert_eq!(
        r.carry(&scanned, &nothing_decided(&r), vec![]),
        vec![km("p", 1, 9, 31)]
    );
    // markers of a recreated partition are dropped: their offsets mean nothing now
    let replaced = [(
        ("m.p".to_string(), 0),
        Scanned {
            incarnation: Incarnation::Replaced,
            low: 0,
            markers: vec![],
        },
    )]
    .into();
    assert_eq!(r.carry(&replaced, &nothing_decided(&r), vec![]), vec![]);
}

fn nothing_decided(r: &Restore) -> Decision {
    Decision {
        writers: r
            .writers
            .iter()
            .map(|w| WriterDecision {
                subtask: w.subtask,
                committed: vec![],
                closed_by: vec![],
                replay: vec![],
                ask_output: vec![],
            })
            .collect(),
        accepted_newer: vec![],
    }
}

fn r_snaps_again() -> Vec<SinkSnapshot> {
    vec![
        snap("p", 0, 2, 3, 7, vec![], vec![km("p", 0, 8, 30)]),
        snap("p", 1, 2, 3, 7, vec![], vec![km("p", 1, 9, 31)]),
    ]
}

#[test]
fn the_lineage_token_is_the_smallest_restored_one() {
    let snaps = vec![
        snap("p", 0, 2, 3, 70, vec![], vec![]),
        snap("p", 1, 2, 3, 7, vec![], vec![]),
    ];
    for s in 0..3 {
        let r = Restore::new(ident("p"), &snaps, s, 3, 4);
        assert_eq!(r.lineage_tokens, vec![7, 70]);
        assert_eq!(r.lineage_token(5), 7);
    }
    assert_eq!(Restore::new(ident("p"), &[], 0, 1, 0).lineage_token(5), 5);
}

// ---------------------------------------------------------------------------------------
// Whole lifecycles against a modelled marker log
// ---------------------------------------------------------------------------------------

#[path = "recovery_sim.rs"]
mod sim;
