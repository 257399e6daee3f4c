//! The memtable path of a snapshot: when the caches wrote back since the last snapshot
//! (so the memtable holds entries the checkpoint must flush anyway), the barrier's changes
//! join them there and the checkpoint flushes both as one level-0 file. Owns nothing else
//! of the snapshot (see `SnapshotJob` in the parent module).

use super::{SnapshotJob, SortedRun, err};
use weir_core::Result;

impl SnapshotJob {
    /// True when the memtables hold nothing: no cache wrote back since the last snapshot.
    pub(super) fn memtables_empty(&self) -> bool {
        let property = |name: &str| self.db.property_int_value(name).ok().flatten();
        property("rocksdb.num-entries-active-mem-table") == Some(0)
            && property("rocksdb.num-immutable-mem-table") == Some(0)
    }

    /// Writes the sorted changes into the memtable, which the checkpoint then flushes
    /// together with what the caches wrote back since the last snapshot: one level-0 file
    /// per checkpoint. Ingesting them as a file of their own would flush the memtable into
    /// a second one, and every level-0 file brings the next compaction of level 0 into the
    /// next level (a rewrite of that whole level when keys are spread over it) closer:
    /// with state far larger than the caches, those compactions are most of what a
    /// checkpoint every second costs.
    pub(super) fn write_to_memtable(&self, tables: &[SortedRun<'_>]) -> Result<()> {
        let mut write = rocksdb::WriteOptions::default();
        write.disable_wal(true);
        for run in tables {
            let mut b = rocksdb::WriteBatch::default();
            for (k, v) in run {
                match v {
                    Some(v) => b.put(k, v),
                    None => b.delete(k),
                }
            }
            self.db
                .write_opt(b, &write)
                .map_err(|e| err("write", &self.dir, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{RocksDbBackend, RocksDbConfig};
    use std::collections::BTreeMap;
    use weir_core::ids::CheckpointId;
    use weir_core::state::{KeyContext, StateContext};

    /// A checkpoint taken after the cache wrote entries back adds one SST file to the
    /// instance, holding both those entries and the barrier's changes, and so does one
    /// taken when nothing was written back since the last.
    #[test]
    fn a_checkpoint_adds_one_level_zero_file() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = RocksDbConfig {
            local_dir: tmp.path().join("local"),
            cache_entries: 64,
            ..RocksDbConfig::default()
        };
        let backend = RocksDbBackend::open(&cfg, "op1-0", 128, 0, 1, BTreeMap::new(), &[]).unwrap();
        let key = KeyContext::<u64>::new();
        let mut ctx = StateContext::new(key.clone(), Box::new(backend));
        let mut value = ctx.value_state::<u64>("value").unwrap();
        let hooks = ctx.hooks();
        let sst_files = |snap: &mut weir_core::checkpoint::OperatorSnapshot| {
            snap.resolve_files().unwrap();
            let mut names: Vec<String> = snap
                .files
                .iter()
                .filter(|f| f.shared)
                .map(|f| f.name.clone())
                .collect();
            names.sort();
            names
        };
        // 1,000 keys through a cache of 64: most were written back before the barrier.
        for k in 0..1_000u64 {
            key.set(k);
            value.set(k).unwrap();
        }
        let first = sst_files(&mut hooks.borrow_mut().snapshot(CheckpointId(1)).unwrap());
        assert_eq!(first.len(), 1, "{first:?}");
        for k in 0..1_000u64 {
            key.set(k);
            value.set(k + 1).unwrap();
        }
        let second = sst_files(&mut hooks.borrow_mut().snapshot(CheckpointId(2)).unwrap());
        assert_eq!(second.len(), 2, "{second:?}");
        assert!(second.contains(&first[0]), "{first:?} {second:?}");
        // A few keys, all still in the cache: nothing was written back; one file again.
        for k in 0..10u64 {
            key.set(k);
            value.set(k + 2).unwrap();
        }
        let third = sst_files(&mut hooks.borrow_mut().snapshot(CheckpointId(3)).unwrap());
        assert_eq!(third.len(), 3, "{third:?}");
        for k in 0..1_000u64 {
            key.set(k);
            assert_eq!(
                value.get().unwrap(),
                Some(k + 1 + u64::from(k < 10)),
                "key {k}"
            );
        }
    }
}
