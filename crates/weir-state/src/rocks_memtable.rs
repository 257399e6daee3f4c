//! The memtable path of a snapshot: when the caches wrote back since the last snapshot
//! (so the memtable holds entries the checkpoint must flush anyway), the barrier's changes
//! join them there and the checkpoint flushes both as one level-0 file. Owns nothing else
//! of the snapshot (see `SnapshotJob` in the parent module).

use super::{SnapshotJob, SortedRun, err};
use weir_core::Result;
use weir_core::state::WRITE_CHUNK_BYTES;

/// The bytes a write batch takes for one entry beyond its key and value: a type tag and
/// two length prefixes (varints of up to five bytes each).
const BATCH_ENTRY_OVERHEAD: usize = 11;

/// Writes `run` (sorted changes) to `db` in batches of about [`WRITE_CHUNK_BYTES`], each
/// allocated at its final size.
///
/// One batch for a whole run grew its buffer by doubling to the run's size: a series of
/// ever larger allocations, freed together after the write, that the allocator kept as
/// free pages (RocksDB's batch strings were the largest source of them in a
/// window-heavy job). Batches of one size reuse the same memory write after write. The
/// writes need not be atomic: a snapshot's checkpoint is taken after the last of them, and
/// the task reads these entries from its write-back cache until they are all written.
pub(super) fn write_in_batches(
    db: &rocksdb::DB,
    run: &[(&[u8], Option<&[u8]>)],
    opts: &rocksdb::WriteOptions,
) -> std::result::Result<(), rocksdb::Error> {
    let size =
        |(k, v): &(&[u8], Option<&[u8]>)| k.len() + v.map_or(0, <[u8]>::len) + BATCH_ENTRY_OVERHEAD;
    let mut rest = run;
    while !rest.is_empty() {
        let (mut n, mut bytes) = (0, 0);
        while n < rest.len() && (n == 0 || bytes + size(&rest[n]) <= WRITE_CHUNK_BYTES) {
            bytes += size(&rest[n]);
            n += 1;
        }
        // The batch's 12-byte header (sequence number and count) comes first.
        let mut b = rocksdb::WriteBatch::with_capacity_bytes(12 + bytes);
        for (k, v) in &rest[..n] {
            match v {
                Some(v) => b.put(k, v),
                None => b.delete(k),
            }
        }
        db.write_opt(b, opts)?;
        rest = &rest[n..];
    }
    Ok(())
}

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
    /// a second one, and every level-0 file is one more sorted run that brings the next
    /// merge closer (decision 0064): with state far larger than the caches, compactions
    /// are most of what a checkpoint every second costs.
    pub(super) fn write_to_memtable(&self, tables: &[SortedRun<'_>]) -> Result<()> {
        let mut write = rocksdb::WriteOptions::default();
        write.disable_wal(true);
        for run in tables {
            write_in_batches(&self.db, run, &write).map_err(|e| err("write", &self.dir, e))?;
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

    #[test]
    fn a_write_back_larger_than_a_chunk_lands_whole_in_batches_of_a_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        let db = rocksdb::DB::open(&opts, dir.path()).unwrap();
        // Keys 0..40,000 present; the changes put 5,000.. (300 bytes each, about 3.5 MiB:
        // several chunks) and delete every key below 5,000 that is a multiple of 3.
        for i in 0u32..40_000 {
            db.put(i.to_be_bytes(), b"old").unwrap();
        }
        let value = vec![7u8; 300];
        let keys: Vec<[u8; 4]> = (0u32..40_000).map(u32::to_be_bytes).collect();
        let run: Vec<(&[u8], Option<&[u8]>)> = keys
            .iter()
            .enumerate()
            .filter(|(i, _)| *i >= 5_000 || i % 3 == 0)
            .map(|(i, k)| (&k[..], (i >= 5_000).then_some(&value[..])))
            .collect();
        let bytes: usize = run
            .iter()
            .map(|(k, v)| k.len() + v.map_or(0, <[u8]>::len))
            .sum();
        assert!(bytes > 3 * super::WRITE_CHUNK_BYTES);
        super::write_in_batches(&db, &run, &rocksdb::WriteOptions::default()).unwrap();
        for (i, k) in keys.iter().enumerate() {
            let got = db.get(k).unwrap();
            let want: Option<&[u8]> = if i >= 5_000 {
                Some(&value)
            } else if i % 3 == 0 {
                None
            } else {
                Some(b"old")
            };
            assert_eq!(got.as_deref(), want, "key {i}");
        }
    }
}
