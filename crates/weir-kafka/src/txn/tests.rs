//! Unit and property tests of the sink's transaction bookkeeping: [`TxnBook`] against a
//! reference model (pool growth and the markers a snapshot knows included), the record
//! header and [`EpochCollector`]. The restore's decisions are in `recovery_tests.rs`.

use super::book::Slot;
use super::*;
use proptest::prelude::*;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::collections::BTreeSet;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// Begins (or continues) a transaction, writes `records` (> 0) records, each delivered on
/// partition 0 at `100 * epoch + seq`, and pre-commits it at barrier `epoch`.
fn write_epoch(
    book: &mut TxnBook,
    epoch: u64,
    records: u64,
    marker: PartitionOffset,
) -> PendingEpoch {
    book.begin().expect("begin");
    for i in 0..records {
        assert_eq!(book.next_seq(), Ok(i), "seq of record {i} of epoch {epoch}");
        book.delivered(0, 100 * epoch as i64 + i as i64);
    }
    book.precommit(epoch, marker)
        .expect("precommit")
        .cloned()
        .expect("an epoch with records is pre-committed")
}

/// The (partition, offset) of every marker a snapshot knows, in key order.
fn known_at(s: &SinkSnapshot) -> Vec<PartitionOffset> {
    s.known.iter().map(|k| (k.partition, k.offset)).collect()
}

fn slots_state(book: &TxnBook) -> Vec<Slot> {
    book.slots.clone()
}

// ---------------------------------------------------------------------------------------
// TxnBook
// ---------------------------------------------------------------------------------------

#[test]
fn new_book_is_empty() {
    let book = TxnBook::new(3, 2);
    assert_eq!(book.pool(), 2);
    assert_eq!(book.open_slot(), None);
    assert_eq!(book.open_records(), 0);
    assert_eq!(book.pending().count(), 0);
    assert_eq!(book.complete(u64::MAX), Vec::<(u32, u64)>::new());
    assert_eq!(slots_state(&book), vec![Slot::Free, Slot::Free]);
    assert_eq!(SNAPSHOT_VERSION, 2);
    assert_eq!(
        book.snapshot(5),
        SinkSnapshot {
            version: 2,
            identity: SinkIdentity::default(),
            subtask: 3,
            parallelism: 5,
            pool: 2,
            lineage_token: 0,
            lineage_tokens: vec![],
            pending: vec![],
            known: vec![],
        }
    );
}

#[test]
fn pool_of_zero_is_one() {
    let mut book = TxnBook::new(0, 0);
    assert_eq!(book.pool(), 1);
    assert_eq!(book.begin(), Ok(0));
    assert_eq!(book.snapshot(1).pool, 1);
}

#[test]
fn begin_picks_lowest_free_slot() {
    let mut book = TxnBook::new(0, 3);
    assert_eq!(book.begin(), Ok(0));
    assert_eq!(book.open_slot(), Some(0));
    assert_eq!(slots_state(&book), vec![Slot::Open, Slot::Free, Slot::Free]);
    assert_eq!(write_epoch(&mut book, 1, 1, (0, 0)).slot, 0);
    assert_eq!(book.open_slot(), None);
    assert_eq!(book.begin(), Ok(1));
    assert_eq!(write_epoch(&mut book, 2, 1, (0, 1)).slot, 1);
    assert_eq!(book.begin(), Ok(2));
    assert_eq!(write_epoch(&mut book, 3, 1, (0, 2)).slot, 2);
    assert_eq!(
        slots_state(&book),
        vec![Slot::Pending(1), Slot::Pending(2), Slot::Pending(3)]
    );

    // slot 0 is freed first: it is the lowest free one
    assert_eq!(book.committed(1), Ok(()));
    assert_eq!(book.begin(), Ok(0));
    assert_eq!(write_epoch(&mut book, 4, 1, (0, 3)).slot, 0);

    // slots 1 and 2 freed while 0 still pending: 1 is the lowest free, not 2 or round robin
    assert_eq!(book.committed(2), Ok(()));
    assert_eq!(book.committed(3), Ok(()));
    assert_eq!(
        slots_state(&book),
        vec![Slot::Pending(4), Slot::Free, Slot::Free]
    );
    assert_eq!(book.begin(), Ok(1));
    assert_eq!(
        slots_state(&book),
        vec![Slot::Pending(4), Slot::Open, Slot::Free]
    );
}

#[test]
fn begin_while_open_returns_the_open_slot() {
    let mut book = TxnBook::new(0, 3);
    assert_eq!(book.begin(), Ok(0));
    assert_eq!(book.next_seq(), Ok(0));
    assert_eq!(book.next_seq(), Ok(1));
    book.delivered(4, 17);
    assert_eq!(book.begin(), Ok(0));
    assert_eq!(book.begin(), Ok(0));
    // nothing was reset by the repeated begins, and no new token was taken
    assert_eq!(book.open_records(), 2);
    assert_eq!(book.open_token(), Some(0));
    assert_eq!(book.next_seq(), Ok(2));
    assert_eq!(slots_state(&book), vec![Slot::Open, Slot::Free, Slot::Free]);
    let p = book.precommit(1, (0, 0)).unwrap().cloned();
    assert_eq!(
        p,
        Some(PendingEpoch {
            epoch: 1,
            slot: 0,
            token: 0,
            records: 3,
            first_offsets: vec![(4, 17)],
            marker: (0, 0),
        })
    );
}

#[test]
fn next_seq_restarts_at_zero_for_each_epoch() {
    let mut book = TxnBook::new(1, 2);
    assert_eq!(book.begin(), Ok(0));
    assert_eq!(book.next_seq(), Ok(0));
    assert_eq!(book.next_seq(), Ok(1));
    assert_eq!(book.next_seq(), Ok(2));
    assert_eq!(book.open_records(), 3);
    let p = book.precommit(1, (0, 10)).unwrap().cloned().unwrap();
    assert_eq!(p.records, 3);
    assert_eq!(book.open_records(), 0);

    assert_eq!(book.begin(), Ok(1));
    assert_eq!(book.open_records(), 0);
    assert_eq!(book.next_seq(), Ok(0));
    assert_eq!(book.next_seq(), Ok(1));
    let p = book.precommit(2, (0, 11)).unwrap().cloned().unwrap();
    assert_eq!((p.epoch, p.slot, p.records), (2, 1, 2));

    // after a commit the reused slot starts at 0 too
    assert_eq!(book.committed(1), Ok(()));
    assert_eq!(book.begin(), Ok(0));
    assert_eq!(book.next_seq(), Ok(0));
}

#[test]
fn next_seq_without_open_transaction_fails() {
    let mut book = TxnBook::new(0, 2);
    assert_eq!(book.next_seq(), Err(BookError::NoOpenTransaction));
    assert_eq!(book.open_records(), 0);
    write_epoch(&mut book, 1, 2, (0, 0));
    // the epoch was pre-committed: nothing is open any more
    assert_eq!(book.next_seq(), Err(BookError::NoOpenTransaction));
    assert_eq!(book.open_slot(), None);
    assert_eq!(book.pending().next().unwrap().records, 2);
    assert_eq!(
        BookError::NoOpenTransaction.to_string(),
        "a record was written outside a transaction"
    );
}

#[test]
fn delivered_keeps_minimum_offset_per_partition() {
    let mut book = TxnBook::new(0, 1);
    book.begin().unwrap();
    for (p, o) in [
        (1, 40),
        (0, 7),
        (1, 38),
        (1, 50),
        (0, 7),
        (2, 100),
        (0, 9),
        (-1, 3),
    ] {
        book.next_seq().unwrap();
        book.delivered(p, o);
    }
    let p = book.precommit(1, (5, 6)).unwrap().cloned().unwrap();
    assert_eq!(
        p,
        PendingEpoch {
            epoch: 1,
            slot: 0,
            token: 0,
            records: 8,
            first_offsets: vec![(-1, 3), (0, 7), (1, 38), (2, 100)],
            marker: (5, 6),
        }
    );
}

#[test]
fn delivered_without_open_epoch_is_ignored() {
    let mut book = TxnBook::new(0, 2);
    book.delivered(0, 1); // before any transaction
    book.begin().unwrap();
    book.next_seq().unwrap();
    book.delivered(0, 10);
    let p1 = book.precommit(1, (0, 0)).unwrap().cloned().unwrap();
    assert_eq!(p1.first_offsets, vec![(0, 10)]);

    // a late report after the barrier touches neither the pending epoch nor the next one
    book.delivered(0, 2);
    book.delivered(3, 2);
    assert_eq!(book.pending().next(), Some(&p1));
    book.begin().unwrap();
    book.next_seq().unwrap();
    book.delivered(0, 20);
    let p2 = book.precommit(2, (0, 1)).unwrap().cloned().unwrap();
    assert_eq!(p2.first_offsets, vec![(0, 20)]);
    assert_eq!(
        book.pending().cloned().collect::<Vec<_>>(),
        vec![p1.clone(), p2]
    );
    assert_eq!(p1.first_offsets, vec![(0, 10)]);
}

#[test]
fn precommit_of_empty_open_epoch_keeps_transaction_open() {
    let mut book = TxnBook::new(0, 2);
    assert_eq!(book.begin(), Ok(0));
    assert_eq!(book.open_token(), Some(0));
    assert_eq!(book.precommit(1, (0, 9)), Ok(None));
    assert_eq!(book.open_slot(), Some(0));
    assert_eq!(book.open_token(), Some(0));
    assert_eq!(book.open_records(), 0);
    assert_eq!(book.pending().count(), 0);
    assert_eq!(book.snapshot(1).pending, Vec::<PendingEpoch>::new());
    assert_eq!(slots_state(&book), vec![Slot::Open, Slot::Free]);
    assert_eq!(book.complete(1), Vec::<(u32, u64)>::new());

    // the same transaction (same token) carries the next epoch, numbered from 0
    assert_eq!(book.begin(), Ok(0));
    assert_eq!(book.open_token(), Some(0));
    assert_eq!(book.next_seq(), Ok(0));
    assert_eq!(book.next_seq(), Ok(1));
    book.delivered(2, 5);
    let p = book.precommit(2, (0, 10)).unwrap().cloned();
    assert_eq!(
        p,
        Some(PendingEpoch {
            epoch: 2,
            slot: 0,
            token: 0,
            records: 2,
            first_offsets: vec![(2, 5)],
            marker: (0, 10),
        })
    );
    assert_eq!(slots_state(&book), vec![Slot::Pending(2), Slot::Free]);
}

#[test]
fn precommit_with_nothing_open_returns_none() {
    let mut book = TxnBook::new(0, 2);
    assert_eq!(book.precommit(1, (0, 0)), Ok(None));
    assert_eq!(book.open_slot(), None);
    assert_eq!(book.pending().count(), 0);
    assert_eq!(slots_state(&book), vec![Slot::Free, Slot::Free]);

    let p3 = write_epoch(&mut book, 3, 1, (0, 3));
    // nothing open, a newer barrier: nothing to do, and it does not count as pre-committed
    assert_eq!(book.precommit(4, (0, 4)), Ok(None));
    assert_eq!(book.pending().cloned().collect::<Vec<_>>(), vec![p3]);
    let p4 = write_epoch(&mut book, 4, 1, (0, 5));
    assert_eq!((p4.epoch, p4.slot), (4, 1));
}

#[test]
fn barriers_that_precommit_nothing_do_not_advance_the_epoch_order() {
    // Documented behaviour: only pre-committed epochs are checked against, so a barrier id
    // that closed nothing can be followed by a smaller one.
    let mut book = TxnBook::new(0, 2);
    book.begin().unwrap();
    assert_eq!(book.precommit(5, (0, 0)), Ok(None));
    book.next_seq().unwrap();
    let p = book.precommit(3, (0, 1)).unwrap().cloned().unwrap();
    assert_eq!((p.epoch, p.slot, p.records), (3, 0, 1));
}

#[test]
fn epoch_order_violations_are_rejected_without_side_effects() {
    let mut book = TxnBook::new(0, 3);
    let p5 = write_epoch(&mut book, 5, 1, (0, 50));
    assert_eq!(book.begin(), Ok(1));
    assert_eq!(book.next_seq(), Ok(0));
    book.delivered(1, 1);

    assert_eq!(
        book.precommit(5, (0, 51)),
        Err(BookError::EpochOrder {
            epoch: 5,
            newest: 5
        })
    );
    assert_eq!(
        book.precommit(4, (0, 51)),
        Err(BookError::EpochOrder {
            epoch: 4,
            newest: 5
        })
    );
    assert_eq!(
        book.precommit(0, (0, 51)),
        Err(BookError::EpochOrder {
            epoch: 0,
            newest: 5
        })
    );
    // unchanged: the open epoch is still open with its record and delivery
    assert_eq!(book.open_slot(), Some(1));
    assert_eq!(book.open_records(), 1);
    assert_eq!(
        book.pending().cloned().collect::<Vec<_>>(),
        vec![p5.clone()]
    );
    assert_eq!(
        slots_state(&book),
        vec![Slot::Pending(5), Slot::Open, Slot::Free]
    );

    let p6 = book.precommit(6, (0, 52)).unwrap().cloned().unwrap();
    assert_eq!(
        p6,
        PendingEpoch {
            epoch: 6,
            slot: 1,
            token: 1,
            records: 1,
            first_offsets: vec![(1, 1)],
            marker: (0, 52),
        }
    );

    // the order is checked even with nothing open, and survives commits
    assert_eq!(
        book.precommit(6, (0, 53)),
        Err(BookError::EpochOrder {
            epoch: 6,
            newest: 6
        })
    );
    assert_eq!(book.committed(5), Ok(()));
    assert_eq!(book.committed(6), Ok(()));
    book.begin().unwrap();
    book.next_seq().unwrap();
    assert_eq!(
        book.precommit(2, (0, 53)),
        Err(BookError::EpochOrder {
            epoch: 2,
            newest: 6
        })
    );
    assert_eq!(
        BookError::EpochOrder {
            epoch: 4,
            newest: 5
        }
        .to_string(),
        "barrier for checkpoint 4 arrived after checkpoint 5 was pre-committed; checkpoint ids \
         must increase"
    );
}

#[test]
fn complete_returns_covered_pending_epochs_oldest_first() {
    let mut book = TxnBook::new(0, 4);
    assert_eq!(book.complete(0), Vec::<(u32, u64)>::new());
    write_epoch(&mut book, 2, 1, (0, 0));
    write_epoch(&mut book, 4, 2, (0, 1));
    write_epoch(&mut book, 6, 3, (0, 2));
    assert_eq!(book.complete(0), Vec::<(u32, u64)>::new());
    assert_eq!(book.complete(1), Vec::<(u32, u64)>::new());
    assert_eq!(book.complete(2), vec![(0, 2)]);
    assert_eq!(book.complete(3), vec![(0, 2)]);
    assert_eq!(book.complete(4), vec![(0, 2), (1, 4)]);
    assert_eq!(book.complete(5), vec![(0, 2), (1, 4)]);
    assert_eq!(book.complete(6), vec![(0, 2), (1, 4), (2, 6)]);
    assert_eq!(book.complete(u64::MAX), vec![(0, 2), (1, 4), (2, 6)]);
    // complete does not change anything
    assert_eq!(
        book.pending().map(|p| p.epoch).collect::<Vec<_>>(),
        vec![2, 4, 6]
    );

    for (slot, epoch) in book.complete(4) {
        assert_eq!(book.committed(epoch), Ok(()), "slot {slot}");
    }
    assert_eq!(book.complete(4), Vec::<(u32, u64)>::new());
    assert_eq!(book.complete(6), vec![(2, 6)]);
}

#[test]
fn committed_must_be_the_oldest_pending_epoch() {
    let mut book = TxnBook::new(0, 3);
    assert_eq!(
        book.committed(1),
        Err(BookError::CommitOrder {
            epoch: 1,
            oldest: None
        })
    );
    let p2 = write_epoch(&mut book, 2, 1, (0, 20));
    let p4 = write_epoch(&mut book, 4, 1, (0, 40));
    assert_eq!(
        book.committed(4),
        Err(BookError::CommitOrder {
            epoch: 4,
            oldest: Some(2)
        })
    );
    assert_eq!(
        book.committed(3),
        Err(BookError::CommitOrder {
            epoch: 3,
            oldest: Some(2)
        })
    );
    assert_eq!(
        book.committed(1),
        Err(BookError::CommitOrder {
            epoch: 1,
            oldest: Some(2)
        })
    );
    // the failures changed nothing
    assert_eq!(
        book.pending().cloned().collect::<Vec<_>>(),
        vec![p2, p4.clone()]
    );
    assert_eq!(known_at(&book.snapshot(1)), vec![(0, 40)]);

    assert_eq!(book.committed(2), Ok(()));
    assert_eq!(
        slots_state(&book),
        vec![Slot::Free, Slot::Pending(4), Slot::Free]
    );
    assert_eq!(
        book.committed(2),
        Err(BookError::CommitOrder {
            epoch: 2,
            oldest: Some(4)
        })
    );
    assert_eq!(book.pending().cloned().collect::<Vec<_>>(), vec![p4]);
    assert_eq!(book.committed(4), Ok(()));
    assert_eq!(
        book.committed(4),
        Err(BookError::CommitOrder {
            epoch: 4,
            oldest: None
        })
    );
    assert_eq!(slots_state(&book), vec![Slot::Free; 3]);
    assert_eq!(
        BookError::CommitOrder {
            epoch: 4,
            oldest: Some(2)
        }
        .to_string(),
        "epoch 4 reported committed, but the oldest pending epoch is Some(2)"
    );
    assert_eq!(
        BookError::CommitOrder {
            epoch: 4,
            oldest: None
        }
        .to_string(),
        "epoch 4 reported committed, but the oldest pending epoch is None"
    );
}

#[test]
fn pool_exhaustion_and_recovery() {
    for pool in 1..=3u32 {
        let mut book = TxnBook::new(0, pool);
        for e in 1..=u64::from(pool) {
            assert_eq!(book.begin(), Ok(e as u32 - 1), "pool {pool}");
            write_epoch(&mut book, e, 1, (0, e as i64));
        }
        let all: Vec<u64> = (1..=u64::from(pool)).collect();
        assert_eq!(
            book.begin(),
            Err(BookError::PoolExhausted {
                pool,
                pending: all.clone()
            })
        );
        // the failed begin opened nothing
        assert_eq!(book.open_slot(), None);
        assert_eq!(book.next_seq(), Err(BookError::NoOpenTransaction));
        assert_eq!(book.precommit(100, (0, 0)), Ok(None));

        // one commit frees the oldest slot
        assert_eq!(book.complete(1), vec![(0, 1)]);
        assert_eq!(book.committed(1), Ok(()));
        assert_eq!(book.begin(), Ok(0));
        let next = u64::from(pool) + 1;
        assert_eq!(write_epoch(&mut book, next, 1, (0, 0)).slot, 0);
        assert_eq!(
            book.begin(),
            Err(BookError::PoolExhausted {
                pool,
                pending: (2..=next).collect()
            })
        );

        // committing everything frees every slot
        let to_commit = book.complete(next);
        let expected: Vec<(u32, u64)> = (2..=next)
            .map(|e| (if e == next { 0 } else { e as u32 - 1 }, e))
            .collect();
        assert_eq!(to_commit, expected);
        for (_, e) in to_commit {
            assert_eq!(book.committed(e), Ok(()));
        }
        assert_eq!(book.pending().count(), 0);
        assert_eq!(slots_state(&book), vec![Slot::Free; pool as usize]);
        assert_eq!(book.begin(), Ok(0));
    }
    assert_eq!(
        BookError::PoolExhausted {
            pool: 2,
            pending: vec![1, 2]
        }
        .to_string(),
        "all 2 transactional producers hold epochs waiting for a checkpoint to complete \
         ([1, 2]): checkpoints are failing, or savepoints were taken one after another without \
         a checkpoint completing in between (an intermediate savepoint commits nothing; the \
         next checkpoint commits it); fix the checkpoint failures, space the savepoints out, \
         or raise the sink's producer pool size"
    );
}

#[test]
fn pool_of_one_with_open_transaction_is_not_exhausted() {
    let mut book = TxnBook::new(0, 1);
    assert_eq!(book.begin(), Ok(0));
    // an open (not pending) slot is simply returned again
    assert_eq!(book.begin(), Ok(0));
}

#[test]
fn each_transaction_takes_the_next_token_from_the_run_id() {
    assert_eq!(TxnBook::new(0, 1).open_token(), None);
    let mut fresh = TxnBook::new(0, 1);
    assert_eq!(fresh.begin(), Ok(0));
    assert_eq!(fresh.open_token(), Some(0)); // without a run id, tokens start at 0

    let mut book = TxnBook::new(1, 2).with_run_id(500);
    assert_eq!(book.open_token(), None);
    assert_eq!(book.begin(), Ok(0));
    assert_eq!(book.open_token(), Some(500));
    assert_eq!(book.begin(), Ok(0));
    assert_eq!(book.open_token(), Some(500));
    let p1 = write_epoch(&mut book, 1, 1, (0, 1));
    assert_eq!((p1.slot, p1.token), (0, 500));
    assert_eq!(book.open_token(), None);
    let p2 = write_epoch(&mut book, 2, 1, (0, 2));
    assert_eq!((p2.slot, p2.token), (1, 501));
    // a failed begin takes no token
    assert!(matches!(book.begin(), Err(BookError::PoolExhausted { .. })));
    assert!(matches!(book.begin(), Err(BookError::PoolExhausted { .. })));
    assert_eq!(book.open_token(), None);
    assert_eq!(book.committed(1), Ok(()));
    // the reused slot gets a new token
    assert_eq!(book.begin(), Ok(0));
    assert_eq!(book.open_token(), Some(502));
    let p3 = write_epoch(&mut book, 3, 2, (0, 3));
    assert_eq!((p3.slot, p3.token), (0, 502));
    assert_eq!(
        book.snapshot(1)
            .pending
            .iter()
            .map(|p| (p.epoch, p.token))
            .collect::<Vec<_>>(),
        vec![(2, 501), (3, 502)]
    );
}

#[test]
fn tokens_wrap_around() {
    let mut book = TxnBook::new(0, 3).with_run_id(u64::MAX - 1);
    assert_eq!(write_epoch(&mut book, 1, 1, (0, 0)).token, u64::MAX - 1);
    assert_eq!(write_epoch(&mut book, 2, 1, (0, 0)).token, u64::MAX);
    assert_eq!(write_epoch(&mut book, 3, 1, (0, 0)).token, 0);
}

#[test]
fn aborted_checkpoints_are_committed_by_a_later_completion() {
    let mut book = TxnBook::new(0, 4);
    let p1 = write_epoch(&mut book, 1, 1, (0, 10));
    let p2 = write_epoch(&mut book, 2, 2, (0, 20));
    let p3 = write_epoch(&mut book, 3, 3, (1, 30));
    let p4 = write_epoch(&mut book, 4, 1, (1, 40));
    // checkpoint 1 completes
    assert_eq!(book.complete(1), vec![(0, 1)]);
    assert_eq!(book.committed(1), Ok(()));
    // the snapshot knows the newest marker per partition, committed or pending
    assert_eq!(known_at(&book.snapshot(1)), vec![p2.marker, p4.marker]);
    // checkpoint 2 aborted (never notified), checkpoint 3 completes: 2 and 3 commit
    assert_eq!(book.complete(3), vec![(1, 2), (2, 3)]);
    assert_eq!(book.committed(2), Ok(()));
    assert_eq!(book.committed(3), Ok(()));
    assert_eq!(
        book.snapshot(1).known,
        vec![
            KnownMarker {
                topic: String::new(),
                partition: 0,
                key: "/0".into(),
                subtask: 0,
                offset: 20,
                token: Some(p2.token),
                copy: 0,
            },
            KnownMarker {
                topic: String::new(),
                partition: 1,
                key: "/0".into(),
                subtask: 0,
                offset: 40,
                token: Some(p4.token),
                copy: 0,
            },
        ]
    );
    let _ = (p1, p3);
    assert_eq!(book.pending().cloned().collect::<Vec<_>>(), vec![p4]);
    assert_eq!(
        slots_state(&book),
        vec![Slot::Free, Slot::Free, Slot::Free, Slot::Pending(4)]
    );
    // a stale, late notification of checkpoint 2 covers nothing now
    assert_eq!(book.complete(2), Vec::<(u32, u64)>::new());
}

fn identity() -> SinkIdentity {
    SinkIdentity {
        prefix: "sums".into(),
        marker_topic: "weir-markers.sums".into(),
        topic: "out".into(),
    }
}

fn known(partition: i32, key: &str, subtask: u32, offset: i64, token: u64) -> KnownMarker {
    KnownMarker {
        topic: "weir-markers.sums".into(),
        partition,
        key: key.into(),
        subtask,
        offset,
        token: Some(token),
        copy: 0,
    }
}

#[test]
fn snapshot_contents() {
    let mut book = TxnBook::new(2, 3)
        .with_run_id(7000)
        .with_max_pool(5)
        .with_identity(identity(), 44, &[55, 44]);
    assert_eq!(book.lineage_token(), 44);
    assert_eq!(book.begin(), Ok(0));
    book.next_seq().unwrap();
    book.next_seq().unwrap();
    book.delivered(1, 40);
    book.delivered(0, 12);
    book.delivered(1, 39);
    let p10 = book.precommit(10, (0, 100)).unwrap().cloned().unwrap();
    assert_eq!(
        p10,
        PendingEpoch {
            epoch: 10,
            slot: 0,
            token: 7000,
            records: 2,
            first_offsets: vec![(0, 12), (1, 39)],
            marker: (0, 100),
        }
    );
    assert_eq!(book.begin(), Ok(1));
    book.next_seq().unwrap();
    book.delivered(2, 7);
    let p11 = book.precommit(11, (0, 105)).unwrap().cloned().unwrap();
    assert_eq!(
        p11,
        PendingEpoch {
            epoch: 11,
            slot: 1,
            token: 7001,
            records: 1,
            first_offsets: vec![(2, 7)],
            marker: (0, 105),
        }
    );
    // an open epoch is not part of the snapshot
    assert_eq!(book.begin(), Ok(2));
    assert_eq!(book.open_token(), Some(7002));
    book.next_seq().unwrap();
    book.delivered(0, 99);

    let s = book.snapshot(4);
    assert_eq!(
        s,
        SinkSnapshot {
            version: SNAPSHOT_VERSION,
            identity: identity(),
            subtask: 2,
            parallelism: 4,
            // the pool may grow to 5: a restore fences all 5 ids
            pool: 5,
            lineage_token: 44,
            lineage_tokens: vec![44, 55],
            pending: vec![p10.clone(), p11.clone()],
            known: vec![known(0, "sums/2", 2, 105, 7001)],
        }
    );
    assert_eq!(book.pending().cloned().collect::<Vec<_>>(), s.pending);

    // the snapshot round-trips through the checkpoint encoding
    let bytes = encode_snapshot(&s).unwrap();
    assert_eq!(decode_snapshot(&bytes, &SinkIdentity::default()), Ok(s));

    assert_eq!(book.committed(10), Ok(()));
    assert_eq!(book.committed(11), Ok(()));
    let s = book.snapshot(7);
    assert_eq!((s.parallelism, s.pending.clone()), (7, vec![]));
    assert_eq!(s.known, vec![known(0, "sums/2", 2, 105, 7001)]);
}

#[test]
fn carried_markers_stay_until_this_subtask_writes_newer_ones() {
    let carried = vec![
        // this subtask's own newest marker of the previous run
        known(0, "sums/1", 1, 50, 1),
        // a subtask it took over (rescaled from 4 to 3), and an old name of the sink
        known(0, "sums/4", 4, 60, 2),
        KnownMarker {
            topic: "weir-markers.old".into(),
            ..known(0, "old/1", 1, 7, 3)
        },
    ];
    let mut book = TxnBook::new(1, 2)
        .with_identity(identity(), 9, &[9])
        .carry(carried.clone());
    let mut sorted = carried.clone();
    sorted.sort_by(|a, b| (&a.topic, a.partition, &a.key).cmp(&(&b.topic, b.partition, &b.key)));
    assert_eq!(book.snapshot(3).known, sorted);
    // a pending epoch of this run replaces its own entry; the others stay
    let p = write_epoch(&mut book, 8, 1, (0, 70));
    let s = book.snapshot(3);
    assert_eq!(s.known.len(), 3);
    assert!(s.known.contains(&known(0, "sums/1", 1, 70, p.token)));
    assert!(s.known.contains(&carried[1]) && s.known.contains(&carried[2]));
    // committed, it stays the newest
    assert_eq!(book.committed(8), Ok(()));
    assert!(
        book.snapshot(3)
            .known
            .contains(&known(0, "sums/1", 1, 70, p.token))
    );
}

#[test]
fn the_pool_grows_up_to_its_maximum_when_savepoints_keep_epochs_pending() {
    // pool 3, may grow to 5: savepoints 2 and 3 are not notified, checkpoint 4 is in flight
    let mut book = TxnBook::new(0, 3).with_max_pool(5);
    assert_eq!(book.max_pool(), 5);
    write_epoch(&mut book, 1, 1, (0, 1)); // checkpoint 1
    assert_eq!(book.complete(1), vec![(0, 1)]);
    assert_eq!(book.committed(1), Ok(()));
    write_epoch(&mut book, 2, 1, (0, 2)); // savepoint 2: slot 0
    write_epoch(&mut book, 3, 1, (0, 3)); // savepoint 3: slot 1
    write_epoch(&mut book, 4, 1, (0, 4)); // checkpoint 4: slot 2, not yet notified
    assert_eq!(book.pool(), 3);
    assert_eq!(book.begin(), Ok(3)); // the epoch after barrier 4: a fourth slot
    assert_eq!(book.pool(), 4);
    assert_eq!(book.snapshot(1).pool, 5);
    write_epoch(&mut book, 5, 1, (0, 5)); // savepoint 5
    assert_eq!(book.begin(), Ok(4));
    write_epoch(&mut book, 6, 1, (0, 6));
    assert_eq!(
        book.begin(),
        Err(BookError::PoolExhausted {
            pool: 5,
            pending: vec![2, 3, 4, 5, 6]
        })
    );
    // checkpoint 6 completes: everything up to it commits, oldest first, slots free again
    let order = book.complete(6);
    assert_eq!(order, vec![(0, 2), (1, 3), (2, 4), (3, 5), (4, 6)]);
    for (_, e) in order {
        assert_eq!(book.committed(e), Ok(()));
    }
    assert_eq!(book.begin(), Ok(0));
    assert_eq!(book.pool(), 5);
    // a maximum below the pool is the pool
    assert_eq!(TxnBook::new(0, 3).with_max_pool(1).max_pool(), 3);
}

#[test]
fn book_errors_are_std_errors() {
    let e: Box<dyn std::error::Error> = Box::new(BookError::NoOpenTransaction);
    assert_eq!(e.to_string(), "a record was written outside a transaction");
}

// ---------------------------------------------------------------------------------------
// TxnBook against a reference model
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    /// Begins (or continues) a transaction without writing to it.
    Begin,
    /// Writes a record (after `begin` unless `begin` is false), then its delivery report.
    Record {
        begin: bool,
        partition: i32,
        offset: i64,
    },
    /// A delivery report on its own (late, or with nothing open).
    Deliver { partition: i32, offset: i64 },
    /// The next barrier, `gap` above the previous barrier id.
    Barrier { gap: u64 },
    /// A barrier not newer than the newest pre-committed epoch.
    StaleBarrier { back: u64 },
    /// A checkpoint (picked among 0 and the barrier ids so far) completed; commit `commit`
    /// of the returned epochs in order (`None`: all of them; `Some(0)`: skip).
    Complete { pick: usize, commit: Option<usize> },
    /// `committed` with an arbitrary or non-oldest pending epoch.
    WrongCommit { pick: usize, epoch: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Begin),
        12 => (prop::bool::weighted(0.9), 0i32..3, 0i64..1000)
            .prop_map(|(begin, partition, offset)| Op::Record { begin, partition, offset }),
        2 => (0i32..3, 0i64..1000).prop_map(|(partition, offset)| Op::Deliver { partition, offset }),
        4 => (1u64..4).prop_map(|gap| Op::Barrier { gap }),
        1 => (0u64..3).prop_map(|back| Op::StaleBarrier { back }),
        3 => (any::<usize>(), prop::option::of(0usize..3))
            .prop_map(|(pick, commit)| Op::Complete { pick, commit }),
        1 => (any::<usize>(), 0u64..40).prop_map(|(pick, epoch)| Op::WrongCommit { pick, epoch }),
    ]
}

#[derive(Debug)]
struct ModelOpen {
    slot: u32,
    token: u64,
    records: u64,
    first: BTreeMap<i32, i64>,
}

#[derive(Debug)]
struct Model {
    subtask: u32,
    /// Slots now, and the most the pool may grow to.
    pool: u32,
    max_pool: u32,
    run_id: u64,
    /// Transactions begun so far: the next one's token is `run_id + begun`.
    begun: u64,
    /// Tokens of every transaction that was pre-committed.
    tokens: Vec<u64>,
    open: Option<ModelOpen>,
    pending: Vec<PendingEpoch>,
    barriers: Vec<u64>,
    newest: Option<u64>,
    /// Per marker partition, the newest committed marker's offset and token.
    committed_markers: BTreeMap<i32, (i64, u64)>,
    /// Successful `next_seq` calls.
    seq_calls: u64,
    committed_records: u64,
    committed: Vec<u64>,
}

impl Model {
    fn new(subtask: u32, pool: u32, max_pool: u32, run_id: u64) -> Self {
        Model {
            subtask,
            pool,
            max_pool,
            run_id,
            begun: 0,
            tokens: Vec::new(),
            open: None,
            pending: Vec::new(),
            barriers: Vec::new(),
            newest: None,
            committed_markers: BTreeMap::new(),
            seq_calls: 0,
            committed_records: 0,
            committed: Vec::new(),
        }
    }

    fn lowest_free(&self) -> Option<u32> {
        let used: BTreeSet<u32> = self
            .pending
            .iter()
            .map(|p| p.slot)
            .chain(self.open.as_ref().map(|o| o.slot))
            .collect();
        (0..self.pool).find(|s| !used.contains(s))
    }

    /// The markers a snapshot knows: the newest per partition, committed or pending.
    fn known(&self) -> Vec<KnownMarker> {
        let mut newest = self.committed_markers.clone();
        for p in &self.pending {
            let e = newest.entry(p.marker.0).or_insert((p.marker.1, p.token));
            if p.marker.1 >= e.0 {
                *e = (p.marker.1, p.token);
            }
        }
        newest
            .into_iter()
            .map(|(partition, (offset, token))| KnownMarker {
                topic: String::new(),
                partition,
                key: format!("/{}", self.subtask),
                subtask: self.subtask,
                offset,
                token: Some(token),
                copy: 0,
            })
            .collect()
    }

    fn commit_oldest(&mut self) {
        let p = self.pending.remove(0);
        self.committed_markers
            .insert(p.marker.0, (p.marker.1, p.token));
        self.committed_records += p.records;
        self.committed.push(p.epoch);
    }

    fn apply(&mut self, book: &mut TxnBook, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Begin => self.begin(book)?,
            Op::Record {
                begin,
                partition,
                offset,
            } => {
                if begin {
                    self.begin(book)?;
                }
                match &mut self.open {
                    Some(o) => {
                        // dense sequence numbers: the next one is the count so far
                        prop_assert_eq!(book.next_seq(), Ok(o.records));
                        o.records += 1;
                        self.seq_calls += 1;
                    }
                    None => prop_assert_eq!(book.next_seq(), Err(BookError::NoOpenTransaction)),
                }
                self.deliver(book, partition, offset);
            }
            Op::Deliver { partition, offset } => self.deliver(book, partition, offset),
            Op::Barrier { gap } => {
                let epoch = self.barriers.last().copied().unwrap_or(0) + gap;
                let marker = ((epoch % 3) as i32, epoch as i64 * 7);
                self.barriers.push(epoch);
                let got = book.precommit(epoch, marker).map(|p| p.cloned());
                match self.open.take() {
                    Some(o) if o.records > 0 => {
                        let p = PendingEpoch {
                            epoch,
                            slot: o.slot,
                            token: o.token,
                            records: o.records,
                            first_offsets: o.first.into_iter().collect(),
                            marker,
                        };
                        prop_assert_eq!(got, Ok(Some(p.clone())));
                        self.pending.push(p);
                        self.tokens.push(o.token);
                        self.newest = Some(epoch);
                    }
                    other => {
                        prop_assert_eq!(got, Ok(None));
                        self.open = other;
                    }
                }
            }
            Op::StaleBarrier { back } => {
                if let Some(newest) = self.newest {
                    let epoch = newest - back.min(newest);
                    prop_assert_eq!(
                        book.precommit(epoch, (0, 0)).map(|p| p.cloned()),
                        Err(BookError::EpochOrder { epoch, newest })
                    );
                }
            }
            Op::Complete { pick, commit } => {
                let candidates: Vec<u64> = std::iter::once(0)
                    .chain(self.barriers.iter().copied())
                    .collect();
                let checkpoint = candidates[pick % candidates.len()];
                let list = book.complete(checkpoint);
                let expected: Vec<(u32, u64)> = self
                    .pending
                    .iter()
                    .filter(|p| p.epoch <= checkpoint)
                    .map(|p| (p.slot, p.epoch))
                    .collect();
                prop_assert_eq!(&list, &expected);
                let n = commit.unwrap_or(list.len()).min(list.len());
                for &(slot, epoch) in &list[..n] {
                    prop_assert_eq!(self.pending[0].slot, slot);
                    prop_assert_eq!(book.committed(epoch), Ok(()));
                    self.commit_oldest();
                }
            }
            Op::WrongCommit { pick, epoch } => {
                let target = if self.pending.len() >= 2 && pick % 2 == 0 {
                    self.pending[1 + (pick / 2) % (self.pending.len() - 1)].epoch
                } else {
                    epoch
                };
                let oldest = self.pending.first().map(|p| p.epoch);
                if oldest == Some(target) {
                    prop_assert_eq!(book.committed(target), Ok(()));
                    self.commit_oldest();
                } else {
                    prop_assert_eq!(
                        book.committed(target),
                        Err(BookError::CommitOrder {
                            epoch: target,
                            oldest
                        })
                    );
                }
            }
        }
        Ok(())
    }

    fn begin(&mut self, book: &mut TxnBook) -> Result<(), TestCaseError> {
        let expected = match (&self.open, self.lowest_free()) {
            (Some(o), _) => Ok(o.slot),
            (None, Some(s)) => Ok(s),
            // the pool grows by one slot at a time, up to its maximum
            (None, None) if self.pool < self.max_pool => {
                self.pool += 1;
                Ok(self.pool - 1)
            }
            (None, None) => Err(BookError::PoolExhausted {
                pool: self.max_pool,
                pending: self.pending.iter().map(|p| p.epoch).collect(),
            }),
        };
        prop_assert_eq!(book.begin(), expected.clone());
        if let (Ok(slot), None) = (expected, &self.open) {
            self.open = Some(ModelOpen {
                slot,
                token: self.run_id.wrapping_add(self.begun),
                records: 0,
                first: BTreeMap::new(),
            });
            self.begun += 1;
        }
        Ok(())
    }

    fn deliver(&mut self, book: &mut TxnBook, partition: i32, offset: i64) {
        book.delivered(partition, offset);
        if let Some(o) = &mut self.open {
            let e = o.first.entry(partition).or_insert(offset);
            *e = (*e).min(offset);
        }
    }

    fn check(&self, book: &TxnBook) -> Result<(), TestCaseError> {
        let pending: Vec<PendingEpoch> = book.pending().cloned().collect();
        prop_assert_eq!(&pending, &self.pending);
        prop_assert_eq!(book.open_slot(), self.open.as_ref().map(|o| o.slot));
        prop_assert_eq!(book.open_token(), self.open.as_ref().map(|o| o.token));
        prop_assert_eq!(
            book.open_records(),
            self.open.as_ref().map_or(0, |o| o.records)
        );
        prop_assert_eq!(book.pool(), self.pool);

        // slots in use == open + pending, and each slot says what holds it
        let in_use = book.slots.iter().filter(|s| **s != Slot::Free).count();
        prop_assert_eq!(
            in_use,
            usize::from(book.open_slot().is_some()) + pending.len()
        );
        for (i, s) in book.slots.iter().enumerate() {
            let i = i as u32;
            let expected = if book.open_slot() == Some(i) {
                Slot::Open
            } else if let Some(p) = pending.iter().find(|p| p.slot == i) {
                Slot::Pending(p.epoch)
            } else {
                Slot::Free
            };
            prop_assert_eq!(*s, expected, "slot {}", i);
        }

        // no slot shared by two live epochs
        let live: Vec<u32> = pending
            .iter()
            .map(|p| p.slot)
            .chain(book.open_slot())
            .collect();
        let distinct: BTreeSet<u32> = live.iter().copied().collect();
        prop_assert_eq!(distinct.len(), live.len(), "slots shared: {:?}", live);

        // pending epochs strictly increasing, never empty
        prop_assert!(
            pending.windows(2).all(|w| w[0].epoch < w[1].epoch),
            "pending epochs not increasing: {:?}",
            pending
        );
        prop_assert!(pending.iter().all(|p| p.records > 0));

        // complete() returns a prefix of the pending epochs: those <= the checkpoint
        let probes = [0, u64::MAX]
            .into_iter()
            .chain(self.barriers.iter().copied())
            .chain(
                pending
                    .iter()
                    .flat_map(|p| [p.epoch - 1, p.epoch, p.epoch + 1]),
            );
        for c in probes {
            let got = book.complete(c);
            let prefix: Vec<(u32, u64)> = pending
                .iter()
                .take(got.len())
                .map(|p| (p.slot, p.epoch))
                .collect();
            prop_assert_eq!(&got, &prefix, "complete({}) is not a prefix", c);
            prop_assert!(got.iter().all(|&(_, e)| e <= c));
            if let Some(next) = pending.get(got.len()) {
                prop_assert!(next.epoch > c);
            }
        }

        // every sequence number handed out belongs to exactly one epoch's record count
        let pending_records: u64 = pending.iter().map(|p| p.records).sum();
        prop_assert_eq!(
            self.seq_calls,
            self.committed_records + pending_records + book.open_records()
        );
        prop_assert!(self.committed.windows(2).all(|w| w[0] < w[1]));

        // one token per transaction: pre-committed ones in begin order, the open one after
        let expected_tokens: Vec<u64> = (0..self.begun)
            .map(|i| self.run_id.wrapping_add(i))
            .collect();
        let tokens: Vec<u64> = self
            .tokens
            .iter()
            .copied()
            .chain(self.open.as_ref().map(|o| o.token))
            .collect();
        prop_assert_eq!(tokens, expected_tokens);

        prop_assert_eq!(
            book.snapshot(3),
            SinkSnapshot {
                version: SNAPSHOT_VERSION,
                identity: SinkIdentity::default(),
                subtask: self.subtask,
                parallelism: 3,
                pool: self.max_pool,
                lineage_token: 0,
                lineage_tokens: vec![],
                pending: self.pending.clone(),
                known: self.known(),
            }
        );
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn book_matches_reference_model(
        subtask in 0u32..8,
        pool in 1u32..5,
        extra in 0u32..3,
        run_id in prop_oneof![Just(0u64), any::<u64>(), (u64::MAX - 20)..=u64::MAX],
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let mut book = TxnBook::new(subtask, pool)
            .with_run_id(run_id)
            .with_max_pool(pool + extra);
        let mut model = Model::new(subtask, pool, pool + extra, run_id);
        model.check(&book)?;
        for op in &ops {
            model.apply(&mut book, op)?;
            model.check(&book)?;
        }
        // finally everything pending can be committed in order
        let all = book.complete(u64::MAX);
        prop_assert_eq!(all.len(), model.pending.len());
        for (_, e) in all {
            prop_assert_eq!(book.committed(e), Ok(()));
            model.commit_oldest();
        }
        model.check(&book)?;
        prop_assert_eq!(book.slots.iter().filter(|s| **s != Slot::Free).count(),
            usize::from(book.open_slot().is_some()));
    }
}

// ---------------------------------------------------------------------------------------
// Header
// ---------------------------------------------------------------------------------------

#[test]
fn header_layout_is_big_endian() {
    assert_eq!(TXN_HEADER, "weir.txn");
    assert_eq!(
        encode_header(1, 2, 3),
        [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3]
    );
    let bytes: Vec<u8> = (1..=20).collect();
    assert_eq!(
        encode_header(0x0102_0304, 0x0506_0708_090a_0b0c, 0x0d0e_0f10_1112_1314).to_vec(),
        bytes
    );
    assert_eq!(
        decode_header(&bytes),
        Some((0x0102_0304, 0x0506_0708_090a_0b0c, 0x0d0e_0f10_1112_1314))
    );
}

#[test]
fn header_roundtrip_at_boundaries() {
    assert_eq!(encode_header(0, 0, 0), [0; 20]);
    assert_eq!(encode_header(u32::MAX, u64::MAX, u64::MAX), [0xff; 20]);
    for (l, e, s) in [
        (0, 0, 0),
        (u32::MAX, u64::MAX, u64::MAX),
        (u32::MAX, 0, u64::MAX),
        (0, u64::MAX, 0),
        (1, u64::MAX - 1, 1),
        (u32::MAX - 1, 1, u64::MAX - 1),
    ] {
        assert_eq!(decode_header(&encode_header(l, e, s)), Some((l, e, s)));
    }
}

#[test]
fn header_of_wrong_length_is_rejected() {
    let good = encode_header(7, 8, 9);
    assert_eq!(decode_header(&[]), None);
    assert_eq!(decode_header(&good[..19]), None);
    assert_eq!(decode_header(&good[..1]), None);
    assert_eq!(decode_header(b"short"), None);
    let mut long = good.to_vec();
    long.push(0);
    assert_eq!(decode_header(&long), None);
    assert_eq!(decode_header(&[0xff; 40]), None);
    assert_eq!(decode_header(&long[..20]), Some((7, 8, 9)));
}

proptest! {
    #[test]
    fn header_roundtrips(l in any::<u32>(), e in any::<u64>(), s in any::<u64>()) {
        prop_assert_eq!(decode_header(&encode_header(l, e, s)), Some((l, e, s)));
    }

    #[test]
    fn every_twenty_bytes_decode_and_reencode(b in any::<[u8; 20]>()) {
        let (l, e, s) = decode_header(&b).expect("20 bytes decode");
        prop_assert_eq!(encode_header(l, e, s), b);
    }

    #[test]
    fn other_lengths_never_decode(b in prop::collection::vec(any::<u8>(), 0..64)) {
        prop_assume!(b.len() != 20);
        prop_assert_eq!(decode_header(&b), None);
    }
}

// ---------------------------------------------------------------------------------------
// EpochCollector
// ---------------------------------------------------------------------------------------

#[test]
fn collector_keeps_first_copy_and_orders_by_seq() {
    let h = |s| encode_header(4, 9, s);
    let mut c = EpochCollector::<&str>::new(4, 9, 3);
    assert!(!c.is_complete());
    assert_eq!(c.missing(10), vec![0, 1, 2]);
    assert!(c.offer(&h(2), || "c"));
    assert_eq!(c.missing(10), vec![0, 1]);
    assert!(c.offer(&h(0), || "a"));
    // a second copy (from an aborted re-produce) is not taken, nor even built
    assert!(!c.offer(&h(2), || panic!("duplicate built")));
    assert!(!c.offer(&h(0), || "a again"));
    assert!(!c.is_complete());
    assert_eq!(c.missing(10), vec![1]);
    assert!(c.offer(&h(1), || "b"));
    assert!(c.is_complete());
    assert_eq!(c.missing(10), Vec::<u64>::new());
    assert!(!c.offer(&h(1), || "b again"));
    assert!(c.is_complete());
    assert_eq!(c.finish(), Ok(vec!["a", "b", "c"]));
}

#[test]
fn collector_ignores_records_of_others_and_garbage() {
    let built = Cell::new(0u32);
    let mut c = EpochCollector::<u32>::new(4, 9, 3);
    let mut long = encode_header(4, 9, 0).to_vec();
    long.push(0);
    let rejected: Vec<Vec<u8>> = vec![
        encode_header(5, 9, 0).to_vec(),        // other lineage
        encode_header(3, 9, 1).to_vec(),        // other lineage
        encode_header(4, 8, 0).to_vec(),        // other token
        encode_header(4, 10, 1).to_vec(),       // other token
        encode_header(4, 9, 3).to_vec(),        // seq out of range
        encode_header(4, 9, u64::MAX).to_vec(), // seq far out of range
        encode_header(4, 9, 0)[..19].to_vec(),  // truncated
        long,                                   // too long
        vec![],                                 // empty
        b"not a weir header at all".to_vec(),   // garbage
    ];
    for (i, header) in rejected.iter().enumerate() {
        let kept = c.offer(header, || {
            built.set(built.get() + 1);
            i as u32
        });
        assert!(!kept, "header {i} was kept");
    }
    assert_eq!(built.get(), 0, "a rejected record was built");
    assert!(!c.is_complete());
    assert_eq!(c.missing(10), vec![0, 1, 2]);
    assert!(c.offer(&encode_header(4, 9, 1), || 42));
    assert_eq!(c.finish(), Err(vec![0, 2]));
}

#[test]
fn collector_missing_respects_limit() {
    let mut c = EpochCollector::<u8>::new(0, 1, 5);
    assert!(c.offer(&encode_header(0, 1, 1), || 1));
    assert!(c.offer(&encode_header(0, 1, 3), || 3));
    assert_eq!(c.missing(10), vec![0, 2, 4]);
    assert_eq!(c.missing(3), vec![0, 2, 4]);
    assert_eq!(c.missing(2), vec![0, 2]);
    assert_eq!(c.missing(1), vec![0]);
    assert_eq!(c.missing(0), Vec::<u64>::new());
    assert_eq!(c.finish(), Err(vec![0, 2, 4]));
}

#[test]
fn collector_finish_lists_at_most_ten_missing() {
    let mut c = EpochCollector::<u8>::new(0, 1, 25);
    for s in [0, 5, 12] {
        assert!(c.offer(&encode_header(0, 1, s), || s as u8));
    }
    assert_eq!(c.missing(usize::MAX).len(), 22);
    assert_eq!(c.finish(), Err(vec![1, 2, 3, 4, 6, 7, 8, 9, 10, 11]));
}

#[test]
fn collector_of_zero_records_is_complete_at_once() {
    let mut c = EpochCollector::<u8>::new(0, 1, 0);
    assert!(c.is_complete());
    assert_eq!(c.missing(10), Vec::<u64>::new());
    assert!(!c.offer(&encode_header(0, 1, 0), || 0));
    assert!(c.is_complete());
    assert_eq!(c.finish(), Ok(Vec::<u8>::new()));
}

#[test]
fn collector_gathers_an_epoch_written_through_the_book() {
    let mut book = TxnBook::new(3, 2).with_run_id(40);
    // an earlier transaction of the same lineage, with the same sequence numbers
    let older = write_epoch(&mut book, 11, 1, (0, 0));
    assert_eq!(older.token, 40);
    book.begin().unwrap();
    let token = book.open_token().unwrap();
    assert_eq!(token, 41);
    let mut log: Vec<(Vec<u8>, String)> = Vec::new();
    for _ in 0..5 {
        let seq = book.next_seq().unwrap();
        log.push((encode_header(3, token, seq).to_vec(), format!("r{seq}")));
    }
    let p = book.precommit(12, (0, 0)).unwrap().cloned().unwrap();
    assert_eq!((p.token, p.records), (41, 5));
    // what a restore reads back: the records in reverse, a second (aborted) copy of some,
    // and records of another transaction and another lineage in between
    let mut read: Vec<(Vec<u8>, String)> = log.iter().rev().cloned().collect();
    read.insert(
        2,
        (encode_header(3, 41, 1).to_vec(), "copy of r1".to_string()),
    );
    read.insert(
        0,
        (
            encode_header(3, older.token, 0).to_vec(),
            "older".to_string(),
        ),
    );
    read.push((
        encode_header(2, 41, 0).to_vec(),
        "other lineage".to_string(),
    ));
    read.push((encode_header(3, 41, 4).to_vec(), "copy of r4".to_string()));
    let mut c = EpochCollector::new(3, p.token, p.records);
    let kept: Vec<bool> = read.iter().map(|(h, r)| c.offer(h, || r.clone())).collect();
    // read: older, r4, r3, copy of r1, r2, r1, r0, other lineage, copy of r4
    assert_eq!(
        kept,
        vec![false, true, true, true, true, false, true, false, false]
    );
    // the first copy of seq 1 to arrive wins
    assert_eq!(
        c.finish(),
        Ok(vec![
            "r0".to_string(),
            "copy of r1".to_string(),
            "r2".to_string(),
            "r3".to_string(),
            "r4".to_string(),
        ])
    );
}

proptest! {
    /// Whatever arrives in whatever order, the collector keeps the first copy of each seq
    /// and finishes with the records in seq order, or the first missing ones.
    #[test]
    fn collector_model(
        records in 0u64..30,
        arrivals in prop::collection::vec((0u64..35, any::<bool>(), 0u8..4), 0..80),
    ) {
        let mut c = EpochCollector::<(u64, usize)>::new(1, 5, records);
        let mut first: BTreeMap<u64, usize> = BTreeMap::new();
        for (i, &(seq, _, noise)) in arrivals.iter().enumerate() {
            let header = match noise {
                0 => encode_header(2, 5, seq).to_vec(),
                1 => encode_header(1, 6, seq).to_vec(),
                _ => encode_header(1, 5, seq).to_vec(),
            };
            let expect = noise >= 2 && seq < records && !first.contains_key(&seq);
            prop_assert_eq!(c.offer(&header, || (seq, i)), expect);
            if expect {
                first.insert(seq, i);
            }
            prop_assert_eq!(c.is_complete(), first.len() as u64 == records);
        }
        let missing: Vec<u64> = (0..records).filter(|s| !first.contains_key(s)).collect();
        prop_assert_eq!(c.missing(usize::MAX), missing.clone());
        prop_assert_eq!(c.missing(3), missing.iter().copied().take(3).collect::<Vec<_>>());
        let expected = if missing.is_empty() {
            Ok(first.into_iter().collect::<Vec<_>>())
        } else {
            Err(missing.into_iter().take(10).collect::<Vec<_>>())
        };
        prop_assert_eq!(c.finish(), expected);
    }
}
