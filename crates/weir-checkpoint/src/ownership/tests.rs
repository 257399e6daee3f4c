//! The driver against real files, in one process (the end-to-end tests with real processes
//! are in the workspace's chaos tests).

use super::*;

const LEASE: Duration = Duration::from_millis(600);

fn acquire(dir: &Path) -> Result<Ownership> {
    Ownership::acquire(
        "job-a",
        vec![Claim::new(dir, "checkpoint directory")],
        LEASE,
        &mut |_| {},
    )
}

/// A record written by a process that is not this one.
fn foreign(pid: u32, host: &str, renewed_ms: u64) -> OwnerRecord {
    let me = record::me();
    OwnerRecord {
        token: "foreign".into(),
        job: "job-b".into(),
        host: host.into(),
        machine: me.machine.clone(),
        pid,
        pid_start: None,
        since_ms: renewed_ms,
        renewed_ms,
        lease_ms: LEASE.as_millis() as u64,
        released: false,
        dirs: vec![],
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_second_run_is_refused_with_the_owner_named_until_the_first_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ck");
    let first = acquire(&dir).unwrap();
    let e = acquire(&dir).unwrap_err();
    let Error::Owned { dir: d, message } = &e else {
        panic!("{e}")
    };
    assert_eq!(d, &dir);
    let me = record::me();
    for part in [
        format!(
            "the checkpoint directory {} is owned by job 'job-a'",
            dir.display()
        ),
        format!("pid {} on host {}", me.pid, me.host),
        "Stop that run".to_string(),
    ] {
        assert!(message.contains(&part), "{part:?} not in: {message}");
    }
    first.verify().unwrap();
    assert!(first.lost().is_none());
    drop(first);
    let third = acquire(&dir).unwrap();
    third.verify().unwrap();
}

#[test]
fn a_refused_run_gives_back_what_it_took() {
    let tmp = tempfile::tempdir().unwrap();
    let (ck, out) = (tmp.path().join("ck"), tmp.path().join("out"));
    let owner = Ownership::acquire(
        "job-a",
        vec![Claim::new(&out, "output directory of sink 'sink'")],
        LEASE,
        &mut |_| {},
    )
    .unwrap();
    let claims = vec![
        Claim::new(&ck, "checkpoint directory"),
        Claim::new(&out, "output directory of sink 'sink'"),
    ];
    let e = Ownership::acquire("job-b", claims.clone(), LEASE, &mut |_| {}).unwrap_err();
    assert!(
        e.to_string().contains("output directory of sink 'sink'"),
        "{e}"
    );
    // ck was taken and given back: a third run may have it.
    acquire(&ck).unwrap();
    drop(owner);
    Ownership::acquire("job-b", claims, LEASE, &mut |_| {}).unwrap();
}

#[test]
fn the_record_of_a_gone_process_on_this_machine_is_taken_over_at_once() {
    if record::me().machine.is_none() {
        return; // no /proc: nothing can be proven gone
    }
    let tmp = tempfile::tempdir().unwrap();
    let now = crate::storage::layout::unix_millis();
    let mut dead = foreign(u32::MAX - 1, &record::me().host, now);
    dead.lease_ms = 3_600_000;
    assert!(record::create(tmp.path(), 7, &dead).unwrap());
    let started = Instant::now();
    let mut told = Vec::new();
    let o = Ownership::acquire(
        "job-a",
        vec![Claim::new(tmp.path(), "checkpoint directory")],
        LEASE,
        &mut |m| told.push(m.to_string()),
    )
    .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3600),
        "did not wait for the lease"
    );
    assert!(told.is_empty(), "{told:?}");
    assert_eq!(record::read_current(tmp.path()).unwrap().seq(), 8);
    o.verify().unwrap();
}

#[test]
fn a_silent_owner_on_another_host_is_watched_for_a_whole_lease_then_taken_over() {
    let tmp = tempfile::tempdir().unwrap();
    let stale = crate::storage::layout::unix_millis() - 10 * LEASE.as_millis() as u64;
    assert!(record::create(tmp.path(), 3, &foreign(1, "elsewhere", stale)).unwrap());
    let started = Instant::now();
    let mut told = Vec::new();
    let o = Ownership::acquire(
        "job-a",
        vec![Claim::new(tmp.path(), "checkpoint directory")],
        LEASE,
        &mut |m| told.push(m.to_string()),
    )
    .unwrap();
    assert!(
        started.elapsed() >= LEASE,
        "took over before a whole lease of silence"
    );
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(told[0].contains("pid 1 on host elsewhere"), "{}", told[0]);
    assert!(told[0].contains("waiting up to"), "{}", told[0]);
    assert_eq!(record::read_current(tmp.path()).unwrap().seq(), 4);
    o.verify().unwrap();
}

#[test]
fn a_fresh_record_of_another_host_is_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let now = crate::storage::layout::unix_millis();
    let mut r = foreign(1, "elsewhere", now);
    r.lease_ms = 3_600_000;
    assert!(record::create(tmp.path(), 1, &r).unwrap());
    let e = acquire(tmp.path()).unwrap_err();
    assert!(e.to_string().contains("pid 1 on host elsewhere"), "{e}");
    assert!(
        e.to_string()
            .contains("takes over once it has not renewed its lease for 3600.0s"),
        "{e}"
    );
}

#[test]
fn the_holder_renews_and_keeps_two_records_at_most() {
    let tmp = tempfile::tempdir().unwrap();
    let o = acquire(tmp.path()).unwrap();
    assert_eq!(record::list(tmp.path()).unwrap(), [1]);
    wait_until("three renewals", || {
        record::read_current(tmp.path()).unwrap().seq() >= 4
    });
    o.verify().unwrap();
    drop(o);
    let seen = record::read_current(tmp.path()).unwrap();
    assert!(seen.record().unwrap().released);
    let seqs = record::list(tmp.path()).unwrap();
    assert_eq!(
        seqs,
        [seen.seq() - 1, seen.seq()],
        "older records are deleted"
    );
    assert_eq!(current_owner(tmp.path()).unwrap(), None);
}

#[test]
fn a_holder_whose_directory_was_taken_over_stops_and_does_not_release_it() {
    let tmp = tempfile::tempdir().unwrap();
    let o = acquire(tmp.path()).unwrap();
    // Another run took over (as after watching this one frozen for a whole lease).
    let seq = record::read_current(tmp.path()).unwrap().seq();
    let now = crate::storage::layout::unix_millis();
    assert!(record::create(tmp.path(), seq + 5, &foreign(4242, "other-host", now)).unwrap());
    let e = o.verify().unwrap_err();
    let Error::OwnershipLost { message, .. } = &e else {
        panic!("{e}")
    };
    assert!(
        message.contains("lost ownership of the checkpoint directory"),
        "{message}"
    );
    assert!(
        message.contains("now owned by job 'job-b' (pid 4242 on host other-host"),
        "{message}"
    );
    assert!(o.lost().is_some());
    assert!(o.verify().is_err(), "lost for good");
    drop(o);
    let seen = record::read_current(tmp.path()).unwrap();
    assert_eq!(
        seen.record().unwrap().token,
        "foreign",
        "the new owner's record stays current"
    );
}

#[test]
fn the_renewal_thread_notices_a_takeover() {
    let tmp = tempfile::tempdir().unwrap();
    let o = acquire(tmp.path()).unwrap();
    let seq = record::read_current(tmp.path()).unwrap().seq();
    let now = crate::storage::layout::unix_millis();
    // The taker writes the very number the holder renews with next.
    assert!(record::create(tmp.path(), seq + 1, &foreign(4242, "other-host", now)).unwrap());
    wait_until("the loss", || o.lost().is_some());
    assert!(matches!(o.verify(), Err(Error::OwnershipLost { .. })));
}

#[test]
fn a_too_short_lease_is_a_configuration_error() {
    let tmp = tempfile::tempdir().unwrap();
    let e = Ownership::acquire(
        "j",
        vec![Claim::new(tmp.path(), "checkpoint directory")],
        Duration::from_millis(10),
        &mut |_| {},
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
}

#[test]
fn a_storage_whose_owner_lost_the_directory_writes_and_deletes_nothing() {
    use crate::{CheckpointId, CheckpointKind, CheckpointStorage, Manifest};
    let tmp = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::open(tmp.path()).unwrap();
    let o = acquire(storage.dir()).unwrap();
    let storage = storage.owned_by(o.clone());
    let write = |id: u64| {
        let w = storage.begin(CheckpointId(id), CheckpointKind::Checkpoint)?;
        w.finish(Manifest::new(
            "job-a",
            CheckpointId(id),
            CheckpointKind::Checkpoint,
            128,
        ))
    };
    write(1).unwrap();
    write(2).unwrap();
    let aborted = storage
        .begin(CheckpointId(3), CheckpointKind::Checkpoint)
        .unwrap();
    // Taken over while this run was (say) frozen.
    let seq = record::read_current(storage.dir()).unwrap().seq();
    let now = crate::storage::layout::unix_millis();
    assert!(record::create(storage.dir(), seq + 3, &foreign(4242, "other-host", now)).unwrap());
    let e = write(4).unwrap_err();
    assert!(matches!(e, Error::OwnershipLost { .. }), "{e}");
    assert!(matches!(
        storage.retain(1),
        Err(Error::OwnershipLost { .. })
    ));
    assert!(matches!(
        storage.discard(CheckpointId(3)),
        Err(Error::OwnershipLost { .. })
    ));
    assert!(matches!(
        storage.begin(CheckpointId(5), CheckpointKind::Checkpoint),
        Err(Error::OwnershipLost { .. })
    ));
    assert!(matches!(
        storage.savepoint(CheckpointId(5), "late"),
        Err(Error::OwnershipLost { .. })
    ));
    drop(aborted);
    let complete: Vec<u64> = storage
        .list()
        .unwrap()
        .iter()
        .filter(|c| c.complete)
        .map(|c| c.id.0)
        .collect();
    assert_eq!(complete, [1, 2], "no manifest written, nothing deleted");
    assert!(storage.dir().join("chk-00000000000000000003").exists());
}

/// Object storage (`memory://` here; the chaos tests use a real S3-compatible server).
mod on_object_storage {
    use super::*;

    fn url(name: &str) -> PathBuf {
        PathBuf::from(format!("memory://owners-{name}/ck"))
    }

    #[test]
    fn a_second_run_is_refused_until_the_first_ends() {
        let dir = url("refused");
        let first = acquire(&dir).unwrap();
        let e = acquire(&dir).unwrap_err();
        let Error::Owned { dir: d, message } = &e else {
            panic!("{e}")
        };
        assert_eq!(d, &dir);
        assert!(
            message.contains(&format!("pid {}", std::process::id())),
            "{message}"
        );
        first.verify().unwrap();
        // Renewals go on; the run keeps the directory.
        std::thread::sleep(LEASE * 2);
        first.verify().unwrap();
        let store = weir_objstore::Store::open(dir.to_str().unwrap()).unwrap();
        let records = store.list(".weir-owners/").unwrap();
        assert!(!records.is_empty() && records.len() <= 3, "{records:?}");
        drop(first);
        acquire(&dir).unwrap().verify().unwrap();
    }

    #[test]
    fn of_runs_racing_for_one_number_at_most_one_creates_it() {
        let dir = url("race");
        let record = |token: &str| {
            let mut r = foreign(1, "elsewhere", 1);
            r.token = token.into();
            r
        };
        for seq in 1..=40u64 {
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(3));
            let winners: Vec<bool> = (0..3)
                .map(|i| {
                    let (dir, barrier, r) =
                        (dir.clone(), barrier.clone(), record(&format!("t{i}")));
                    std::thread::spawn(move || {
                        barrier.wait();
                        record::create(&dir, seq, &r).unwrap()
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            assert!(
                winners.iter().filter(|w| **w).count() <= 1,
                "seq {seq}: {winners:?}"
            );
            // Losers removed their objects: a winner's record is the only one of its number.
            let store = weir_objstore::Store::open(dir.to_str().unwrap()).unwrap();
            let at_seq = store.list(&format!(".weir-owners/{seq:020}-")).unwrap();
            assert_eq!(
                at_seq.len(),
                usize::from(winners.contains(&true)),
                "seq {seq}"
            );
        }
    }

    #[test]
    fn a_stray_losing_record_does_not_take_the_directory() {
        let dir = url("stray");
        let run = acquire(&dir).unwrap();
        let store = weir_objstore::Store::open(dir.to_str().unwrap()).unwrap();
        let seq = record::list(&dir).unwrap().last().copied().unwrap();
        // A loser that crashed between writing its object and deleting it, with a token
        // that sorts first.
        let stray = serde_json::to_vec(&foreign(1, "elsewhere", 1)).unwrap();
        store
            .put(&format!(".weir-owners/{seq:020}-0000"), stray)
            .unwrap();
        run.verify().unwrap();
        drop(run);
    }
}
