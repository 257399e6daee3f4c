//! RocksDB state restored from the checkpoint's own SST files: the first checkpoint after a
//! restore stores only what changed, not the whole state again.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;
use weir::prelude::*;
use weir_checkpoint::{CheckpointStorage, Manifest};
use weir_tests::run;

/// Keeps a running sum per key.
struct Sum(Option<ValueState<i64>>);

impl KeyedProcessFunction<u64, (u64, i64), (u64, i64)> for Sum {
    fn open(&mut self, s: &mut StateContext<u64>) -> Result<()> {
        self.0 = Some(s.value_state("sum")?);
        Ok(())
    }
    fn process(
        &mut self,
        (k, v): (u64, i64),
        ctx: &mut KeyedContext<'_, u64, (u64, i64)>,
    ) -> Result<()> {
        let sum = self.0.as_mut().unwrap();
        let total = sum.get()?.unwrap_or(0) + v;
        sum.set(total)?;
        ctx.emit((k, total));
        Ok(())
    }
}

/// Sums 20,000 records over 5,000 keys with the RocksDB backend, checkpointing into `ck`.
fn run_job(ck: &Path, local: &Path, parallelism: usize) -> Vec<(u64, i64)> {
    let rocks = weir::RocksDbConfig {
        local_dir: local.to_path_buf(),
        cache_entries: 100,
        ..weir::RocksDbConfig::default()
    };
    let env = Env::new()
        .parallelism(parallelism)
        .state_backend(BackendKind::RocksDb(rocks))
        .checkpoints(CheckpointConfig::new(ck).interval(Duration::ZERO));
    let input: Vec<(u64, i64)> = (0..20_000u64).map(|i| (i % 5_000, i as i64)).collect();
    let out = env
        .from_collection(input)
        .uid("input")
        .key_by(|(k, _)| *k)
        .process(|| Sum(None))
        .uid("sum")
        .collect();
    run(&env).unwrap();
    out.sorted()
}

/// The manifests of the complete checkpoints in `ck`, oldest first.
fn manifests(ck: &Path) -> Vec<Manifest> {
    let storage = CheckpointStorage::open(ck).unwrap();
    storage
        .list()
        .unwrap()
        .into_iter()
        .filter(|c| c.complete)
        .map(|c| storage.load(&c.path).unwrap())
        .collect()
}

fn shared_files(m: &Manifest) -> BTreeSet<(String, u64)> {
    m.files()
        .filter(|f| f.shared)
        .map(|f| (f.name.clone(), f.size))
        .collect()
}

#[test]
fn the_first_checkpoint_after_a_restore_stores_no_sst_file_again() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let out = run_job(&ck, &tmp.path().join("local"), 2);
    // Every key's final sum: keys k, k+5000, k+10000, k+15000.
    let finals: BTreeSet<(u64, i64)> = (0..5_000u64)
        .map(|k| (k, (4 * k + 30_000) as i64))
        .collect();
    assert!(finals.iter().all(|f| out.contains(f)));
    assert_eq!(out.len(), 20_000);
    let before = manifests(&ck);
    let first = before.last().expect("a final checkpoint").clone();
    let stored = shared_files(&first);
    assert!(!stored.is_empty(), "the RocksDB checkpoint holds SST files");

    // The same job again: it resumes after its end, reads nothing and checkpoints.
    let out = run_job(&ck, &tmp.path().join("local"), 2);
    assert_eq!(out, vec![]);
    let after = manifests(&ck);
    let next = after.last().unwrap();
    assert!(
        next.checkpoint_id > first.checkpoint_id,
        "no checkpoint after the restore"
    );
    // Every SST file of the new checkpoint is one the restored checkpoint had stored.
    let shared = shared_files(next);
    assert_eq!(
        shared, stored,
        "the restored state's files are shared, none new"
    );
    // What it wrote: only the files that are not shared (state files, RocksDB's own small
    // files), byte for byte.
    let own: u64 = next.files().filter(|f| !f.shared).map(|f| f.size).sum();
    assert_eq!(next.stats.bytes, own);
    let sst: u64 = stored.iter().map(|(_, s)| s).sum();
    assert!(next.stats.full_bytes >= own + sst, "{:?}", next.stats);
}
