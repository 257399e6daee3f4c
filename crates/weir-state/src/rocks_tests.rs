//! The RocksDB backend's own tests: snapshots in the background, and their failures.

use super::*;
use weir_core::checkpoint::OperatorSnapshot;
use weir_core::state::{KeyContext, StateContext};

fn config(dir: &Path) -> RocksDbConfig {
    RocksDbConfig {
        local_dir: dir.join("local"),
        // Far fewer entries than keys: every few writes evict.
        cache_entries: 8,
        ..RocksDbConfig::default()
    }
}

fn context(
    cfg: &RocksDbConfig,
    restore_from: &[RestoredInstance],
) -> (Rc<KeyContext<u64>>, StateContext<u64>) {
    let backend =
        RocksDbBackend::open(cfg, "op1-0", 128, 0, 1, BTreeMap::new(), restore_from).unwrap();
    let key = KeyContext::<u64>::new();
    (key.clone(), StateContext::new(key, Box::new(backend)))
}

/// Copies a snapshot's files to a directory, as a restore brings them back.
fn restore_dir(snap: &OperatorSnapshot, dir: &Path) -> RestoredInstance {
    crate::rocks_restore::tests::keep(snap, dir, 0..128)
}

/// The background part of a snapshot writes exactly the state at the barrier, even
/// when the task overwrites and evicts every key right after it.
#[test]
fn a_snapshot_holds_the_state_at_its_barrier() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let (key, mut ctx) = context(&cfg, &[]);
    let mut value = ctx.value_state::<u64>("value").unwrap();
    let mut map = ctx.map_state::<u32, u64>("map").unwrap();
    for k in 0..300u64 {
        key.set(k);
        value.set(k).unwrap();
        map.put(1, 2 * k).unwrap();
    }
    for k in (0..300u64).step_by(7) {
        key.set(k);
        value.clear().unwrap();
    }
    let hooks = ctx.hooks();
    let mut snap = hooks.borrow_mut().snapshot(CheckpointId(1)).unwrap();
    for k in 0..300u64 {
        key.set(k);
        value.set(k + 1_000).unwrap();
        map.clear().unwrap();
    }
    snap.resolve_files().unwrap();
    assert!(snap.files.iter().any(|f| f.shared), "{:?}", snap.files);
    let dir = restore_dir(&snap, &tmp.path().join("restore"));
    drop((value, map, hooks, ctx));

    let (key, mut ctx) = context(&cfg, &[dir]);
    let value = ctx.value_state::<u64>("value").unwrap();
    let map = ctx.map_state::<u32, u64>("map").unwrap();
    for k in 0..300u64 {
        key.set(k);
        let want = (k % 7 != 0).then_some(k);
        assert_eq!(value.get().unwrap(), want, "key {k}");
        assert_eq!(map.entries().unwrap(), vec![(1, 2 * k)], "key {k}");
    }
}

/// Checkpoint after checkpoint completes while the task goes on reading its state
/// from RocksDB, as a running job's task does while its snapshot is written. RocksDB
/// 10.4's checkpoint could wait forever for a file purge that a released iterator had
/// found nothing to do for (decision 0058): this test hung at checkpoint 2, 42 and 82.
#[test]
fn checkpoints_complete_while_the_task_reads_its_state() {
    const CHECKPOINTS: u64 = 500;
    const KEYS: u64 = 16;
    const ENTRIES: u64 = 32;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let (progress, completed) = std::sync::mpsc::channel();
    let task = std::thread::spawn(move || {
        let cfg = config(&root);
        let (key, mut ctx) = context(&cfg, &[]);
        let mut map = ctx.map_state::<u64, u64>("map").unwrap();
        let hooks = ctx.hooks();
        for id in 1..=CHECKPOINTS {
            for k in 0..KEYS {
                key.set(k);
                map.put(id % ENTRIES, k).unwrap();
            }
            let mut snap = hooks.borrow_mut().snapshot(CheckpointId(id)).unwrap();
            let written = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let waiter = {
                let (deferred, written) = (snap.deferred.clone(), written.clone());
                std::thread::spawn(move || {
                    for d in deferred {
                        let _ = d.wait();
                    }
                    written.store(true, Ordering::Release);
                })
            };
            // Reads (each a RocksDB iterator over one key's map) until it is written.
            let mut reads = 0u64;
            while !written.load(Ordering::Acquire) {
                key.set(reads % KEYS);
                assert_eq!(map.entries().unwrap().len() as u64, id.min(ENTRIES));
                reads += 1;
            }
            waiter.join().unwrap();
            snap.resolve_files().unwrap();
            progress.send(id).unwrap();
        }
    });
    let limit = std::time::Duration::from_secs(60);
    let mut done = 0;
    while done < CHECKPOINTS {
        match completed.recv_timeout(limit) {
            Ok(id) => done = id,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("checkpoint {} did not complete within {limit:?}", done + 1)
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    task.join().unwrap();
    assert_eq!(done, CHECKPOINTS);
}

/// A failed background snapshot fails the checkpoint with the file it failed on, and
/// the task with it at its next snapshot (or write); nothing is silently lost.
#[test]
fn a_failed_background_snapshot_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let (key, mut ctx) = context(&cfg, &[]);
    let mut value = ctx.value_state::<u64>("value").unwrap();
    key.set(1);
    value.set(1).unwrap();
    // The local working directory disappears under the running job.
    std::fs::remove_dir_all(&cfg.local_dir).unwrap();
    let hooks = ctx.hooks();
    let mut snap = hooks.borrow_mut().snapshot(CheckpointId(1)).unwrap();
    let e = snap.resolve_files().unwrap_err().to_string();
    assert!(
        e.contains("ingest-1.sst") && e.contains("RocksDB create SST file"),
        "{e}"
    );
    let e = hooks
        .borrow_mut()
        .snapshot(CheckpointId(2))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("writing the RocksDB snapshot of checkpoint 1 failed"),
        "{e}"
    );
}
