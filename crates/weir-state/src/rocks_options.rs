//! The settings of the RocksDB backend, and the RocksDB options every instance opens with
//! (and every SST file it writes or ingests is built with).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::budget::{DEFAULT_MEMORY_BUDGET_BYTES, SlotMemory};

/// Settings of the RocksDB backend.
///
/// Memory is set by one number, [`memory_budget_bytes`](Self::memory_budget_bytes), for
/// all of the job's RocksDB memory and write-back caches (see [`SlotPlan`](crate::SlotPlan)).
///
/// ```
/// use weir_state::{BackendKind, RocksDbConfig};
/// let cfg = RocksDbConfig { memory_budget_bytes: 1 << 30, ..RocksDbConfig::default() };
/// let backend = BackendKind::RocksDb(cfg);
/// assert_eq!(backend.name(), "rocksdb");
/// ```
#[derive(Debug, Clone)]
pub struct RocksDbConfig {
    /// Local working directory for the instances (not the checkpoint directory).
    pub local_dir: PathBuf,
    /// The job's memory for RocksDB (block cache, memtables, index and filter blocks) and
    /// the typed write-back caches, split evenly over its slots; default 512 MiB
    /// ([`DEFAULT_MEMORY_BUDGET_BYTES`](crate::DEFAULT_MEMORY_BUDGET_BYTES)). A job whose slots would get less than 16 MiB
    /// each fails to start, saying so.
    pub memory_budget_bytes: usize,
    /// Entries each state table keeps in its typed write-back cache; 0 (the default)
    /// sizes the caches from the budget: a quarter of each slot's part, shared by the
    /// slot's tables. A number here is taken from the budget as
    /// [`WRITE_BACK_ENTRY_BYTES`](crate::WRITE_BACK_ENTRY_BYTES) per entry per slot.
    pub cache_entries: usize,
    /// Local recovery (on by default): a process restarted on the same machine restores
    /// each instance from the local copy the previous process kept of its last checkpoint
    /// (the RocksDB checkpoint it took in `local_dir`) when that copy holds exactly the
    /// checkpoint's files (names and sizes), instead of fetching them from checkpoint
    /// storage. It costs no extra disk: the copy is the one every checkpoint is taken
    /// from. Turn it off when `local_dir` is not trusted to survive intact between runs.
    pub local_recovery: bool,
    /// Partitioned index and filter blocks (off by default): each SST file's index and bloom
    /// filter are cut into 4 KiB partitions under a small top-level index kept in the
    /// cache, so a read loads only the partition its key falls in, and a file's index and
    /// filter take the cache a piece at a time. It costs point reads of existing keys a
    /// second index lookup (keyed-sum at 20M keys: 28% slower). Since the block cache is
    /// cut into shards large enough for a whole-file filter (decision 0055), a sliding
    /// window over 1M keys runs as fast without it; consider it when index and filter
    /// blocks together approach the block cache's size. Flink's
    /// `state.backend.rocksdb.memory.partitioned-index-filters`; see
    /// docs/decisions/0051-partitioned-index-and-filters.md.
    pub partitioned_index_filters: bool,
}

impl Default for RocksDbConfig {
    fn default() -> Self {
        RocksDbConfig {
            local_dir: std::env::temp_dir().join("weir-rocksdb"),
            memory_budget_bytes: DEFAULT_MEMORY_BUDGET_BYTES,
            cache_entries: 0,
            local_recovery: true,
            partitioned_index_filters: false,
        }
    }
}

/// Bloom filter bits per key of every SST file: the database's own and the ingested ones.
pub(crate) const BLOOM_BITS_PER_KEY: f64 = 10.0;

/// Entries per bucket of a data block's hash index (RocksDB's suggested 0.75).
const DATA_BLOCK_HASH_RATIO: f64 = 0.75;

/// The format of every SST file an instance writes or ingests: bloom filters, whole-file or
/// (`partitioned`) cut into partitions under a two-level index whose top level stays pinned
/// in the cache ([`RocksDbConfig::partitioned_index_filters`]).
pub(crate) fn table_options(partitioned: bool) -> rocksdb::BlockBasedOptions {
    let mut table = rocksdb::BlockBasedOptions::default();
    // Keyed state reads many keys that do not exist yet (the first record of every
    // key): bloom filters answer those without reading data blocks.
    table.set_bloom_filter(BLOOM_BITS_PER_KEY, false);
    // A point read finds its key within a data block through a small hash table at the
    // block's end (about 1.3 bytes per entry) instead of a binary search over the block's
    // restart points, where keyed-sum at 20M keys and P=1 spent 6.5% of its task thread
    // (decision 0065).
    // Files written without it (earlier releases) are read as before.
    table.set_data_block_index_type(rocksdb::DataBlockIndexType::BinaryAndHash);
    table.set_data_block_hash_ratio(DATA_BLOCK_HASH_RATIO);
    if partitioned {
        table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
        table.set_partition_filters(true);
        table.set_pin_top_level_index_and_filter(true);
    }
    table
}

/// The options of every instance (and of a restored one: the same).
pub(crate) fn db_options(memory: &SlotMemory, partitioned: bool) -> rocksdb::Options {
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    // Universal compaction (decision 0064): sorted runs of about the same size are merged
    // with each other, instead of every level-0 file bringing a rewrite of the whole next
    // level (keys are spread over all of it). It rewrites each byte fewer times, and a
    // checkpoint's flush of a memtable that is not yet full costs one more small run, not
    // one more rewrite of a level. A full merge comes when the other runs together pass
    // twice the largest (RocksDB's default space amplification, 200%).
    opts.set_compaction_style(rocksdb::DBCompactionStyle::Universal);
    opts.set_universal_compaction_options(&rocksdb::UniversalCompactOptions::default());
    opts.set_level_zero_file_num_compaction_trigger(SORTED_RUNS_TRIGGER);
    // Every checkpoint flushes the memtables into a new level-0 file that the next
    // merges rewrite soon: compressing it costs CPU on the other core at every
    // checkpoint for little space, so only what compactions write (levels 2 and deeper
    // under universal compaction) is compressed.
    opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
    opts.set_compression_per_level(&[
        rocksdb::DBCompressionType::None,
        rocksdb::DBCompressionType::None,
        rocksdb::DBCompressionType::Lz4,
        rocksdb::DBCompressionType::Lz4,
        rocksdb::DBCompressionType::Lz4,
        rocksdb::DBCompressionType::Lz4,
        rocksdb::DBCompressionType::Lz4,
    ]);
    // Until the instance's files say how many keys a file holds (size_compaction_files).
    opts.set_target_file_size_base(MAX_FILE_BYTES as u64);
    let mut table = table_options(partitioned);
    memory.configure(&mut opts, &mut table);
    // Bloom filters in the memtable as well as in every SST file.
    opts.set_memtable_whole_key_filtering(true);
    opts.set_memtable_prefix_bloom_ratio(0.1);
    opts.set_block_based_table_factory(&table);
    opts
}

/// Sorted runs (level-0 files and the runs below them) that start a merge. More runs make
/// each read of a key that is not there ask more bloom filters: a sliding window, whose
/// every event reads 60 new panes, ran 7-17% slower at 12 than at 8. Fewer runs merge
/// more often: keyed-sum at 20M keys ran 27-32% slower at 4 (decision 0064).
const SORTED_RUNS_TRIGGER: i32 = 8;

/// RocksDB instances open in this process, and the threads of the process's compaction
/// pool (RocksDB's low-priority pool, shared by every instance).
static COMPACTION_POOL: std::sync::Mutex<(usize, usize)> = std::sync::Mutex::new((0, 0));

/// An open instance's claim on a compaction thread: while it lives, the process's pool has
/// one thread per open instance, up to the machine's cores, so that each instance can
/// compact while the others do (each runs one compaction at a time: two background jobs,
/// one flush and one compaction). RocksDB alone sizes the pool by one instance's options:
/// one thread for the whole process. See
/// docs/decisions/0060-a-compaction-thread-per-instance.md.
pub(crate) struct CompactionThread(());

impl CompactionThread {
    pub(crate) fn claim() -> Self {
        resize_compaction_pool(1);
        CompactionThread(())
    }
}

impl Drop for CompactionThread {
    fn drop(&mut self) {
        resize_compaction_pool(-1);
    }
}

fn resize_compaction_pool(change: isize) {
    let mut pool = COMPACTION_POOL.lock().unwrap_or_else(|e| e.into_inner());
    pool.0 = pool.0.saturating_add_signed(change);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let want = pool.0.clamp(1, cores);
    if want != pool.1 {
        match rocksdb::Env::new() {
            Ok(mut env) => {
                env.set_low_priority_background_threads(want as i32);
                pool.1 = want;
            }
            Err(e) => tracing::warn!("could not size RocksDB's compaction threads: {e}"),
        }
    }
}

/// Bytes of hashes a compaction's whole-file filter builder may hold. The builder keeps 8
/// bytes per key of the file it is writing until the file is finished, and RocksDB charges
/// them to no cache: small keys that compress well (window panes, timers) put 15M keys, 116
/// MB of hashes, in a file of RocksDB's default 64 MiB. See
/// docs/decisions/0057-compaction-files-sized-by-their-keys.md.
pub(crate) const FILTER_BUILDER_BYTES: usize = 16 << 20;

/// The largest and smallest sizes at which a compaction cuts its output files: RocksDB's
/// default, and a floor that keeps the number of files of a large state reasonable.
const MAX_FILE_BYTES: usize = 64 << 20;
const MIN_FILE_BYTES: usize = 2 << 20;

/// The size at which a compaction should cut its output files so that a file holds at
/// most as many keys as `builder_bytes` of filter hashes stand for, given SST files that
/// hold `entries` entries in `bytes` bytes (whole MiB, between 2 and 64 MiB).
pub(crate) fn compaction_file_bytes(bytes: u64, entries: u64, builder_bytes: usize) -> usize {
    if entries == 0 {
        return MAX_FILE_BYTES;
    }
    let keys = (builder_bytes / 8) as u128;
    let size = (keys * bytes as u128 / entries as u128).min(MAX_FILE_BYTES as u128) as usize;
    (size & !((1 << 20) - 1)).max(MIN_FILE_BYTES)
}

/// Sizes the files an instance's compactions write by the entries its SST files hold now
/// ([`compaction_file_bytes`], for the level whose files hold the most entries per byte:
/// the deepest levels are compressed, and their compactions write the largest files): at
/// once when that size is below `current`, and when it is an eighth or more above it
/// (each change writes a new OPTIONS file). Called when the instance opens and after each
/// of its checkpoints; a failure to read or set the option leaves the size as it was.
pub(crate) fn size_compaction_files(db: &rocksdb::DB, current: &AtomicUsize, builder_bytes: usize) {
    let Ok(files) = db.live_files() else { return };
    let mut levels = std::collections::BTreeMap::<i32, (u64, u64)>::new();
    for f in &files {
        let level = levels.entry(f.level).or_default();
        level.0 += f.size as u64;
        level.1 += f.num_entries;
    }
    // Levels of less than a megabyte say little: a few keys, and the files' own metadata.
    let Some((bytes, entries)) = levels
        .into_values()
        .filter(|(bytes, entries)| *bytes >= 1 << 20 && *entries > 0)
        .min_by(|a, b| (a.0 as u128 * b.1 as u128).cmp(&(b.0 as u128 * a.1 as u128)))
    else {
        return;
    };
    let want = compaction_file_bytes(bytes, entries, builder_bytes);
    let now = current.load(Ordering::Relaxed);
    if want == now || (want > now && want - now < now / 8) {
        return;
    }
    match db.set_options(&[("target_file_size_base", &want.to_string())]) {
        Ok(()) => {
            current.store(want, Ordering::Relaxed);
            tracing::debug!(
                files = files.len(),
                bytes_per_entry = bytes as f64 / entries as f64,
                "compactions now cut files at {} MiB",
                want >> 20
            );
        }
        Err(e) => tracing::warn!("could not set the size of compaction output files: {e}"),
    }
}

/// The size the compactions of a new instance cut files at, until its files say otherwise.
pub(crate) fn initial_compaction_file_bytes() -> AtomicUsize {
    AtomicUsize::new(MAX_FILE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_hold_as_many_keys_as_the_filter_builder_allows() {
        // Keyed-sum's 100-byte values: RocksDB's 64 MiB.
        assert_eq!(
            compaction_file_bytes(110 << 20, 1 << 20, 16 << 20),
            64 << 20
        );
        // Window panes compressed to 4.6 bytes each: 2M keys, 9 MiB.
        assert_eq!(compaction_file_bytes(46 << 20, 10 << 20, 16 << 20), 9 << 20);
        // Nothing on disk yet, or entries of a byte: the bounds.
        assert_eq!(compaction_file_bytes(0, 0, 16 << 20), 64 << 20);
        assert_eq!(compaction_file_bytes(1 << 20, 1 << 20, 16 << 20), 2 << 20);
    }

    /// The memory of a job's only slot, with instances under `dir` and a budget of `budget`.
    fn one_slot(dir: &std::path::Path, budget: usize) -> std::sync::Arc<SlotMemory> {
        let cfg = RocksDbConfig {
            local_dir: dir.join("local"),
            memory_budget_bytes: budget,
            ..RocksDbConfig::default()
        };
        SlotMemory::of_slot(&cfg, 0, 1).unwrap()
    }

    /// Tried as two slots of one process run: each instance compacts while the other does.
    /// RocksDB alone sizes its process-wide pool by one instance's options (one thread),
    /// and the second instance's compaction waited for the first's.
    #[test]
    fn two_open_instances_compact_at_the_same_time() {
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let memory = one_slot(tmp.path(), 64 << 20);
        let instances: Vec<(rocksdb::DB, CompactionThread)> = (0..2)
            .map(|i| {
                let mut opts = db_options(&memory, false);
                // Only the compactions this test starts.
                opts.set_disable_auto_compactions(true);
                let db = rocksdb::DB::open(&opts, tmp.path().join(format!("db{i}"))).unwrap();
                (db, CompactionThread::claim())
            })
            .collect();
        // Eight overlapping level-0 files each: a compaction of some tens of milliseconds.
        for (db, _) in &instances {
            for file in 0..8u64 {
                let mut batch = rocksdb::WriteBatch::default();
                for k in 0..20_000u64 {
                    batch.put(
                        (k * 7 + file).to_be_bytes(),
                        (k ^ file).to_le_bytes().repeat(4),
                    );
                }
                db.write(batch).unwrap();
                db.flush().unwrap();
            }
        }
        let running = |db: &rocksdb::DB| {
            db.property_int_value("rocksdb.num-running-compactions")
                .unwrap()
                .unwrap_or(0)
        };
        let done = std::sync::atomic::AtomicUsize::new(0);
        let mut at_once = false;
        std::thread::scope(|s| {
            for (db, _) in &instances {
                let done = &done;
                s.spawn(move || {
                    db.compact_range::<&[u8], &[u8]>(None, None);
                    done.fetch_add(1, Ordering::SeqCst);
                });
            }
            // Watch both until both compactions have returned.
            while done.load(Ordering::SeqCst) < 2 {
                at_once |= instances.iter().all(|(db, _)| running(db) > 0);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        for (db, _) in &instances {
            let files = db.live_files().unwrap();
            assert!(files.iter().all(|f| f.level > 0), "{files:?}");
        }
        assert!(
            at_once,
            "the two instances never compacted at the same time"
        );
    }

    /// Tried as a user upgrading and rolling back: files written by a release that
    /// compacted by levels (level 0 and deeper levels) open under universal compaction
    /// with every entry, merge on, and the result opens by levels again.
    #[test]
    fn files_of_either_compaction_style_open_under_the_other() {
        let tmp = tempfile::tempdir().unwrap();
        let memory = one_slot(tmp.path(), 16 << 20);
        let path = tmp.path().join("db");
        let by_levels = || {
            let mut opts = db_options(&memory, false);
            opts.set_compaction_style(rocksdb::DBCompactionStyle::Level);
            opts.set_level_zero_file_num_compaction_trigger(8);
            opts
        };
        let write = |db: &rocksdb::DB, round: u64| {
            for file in 0..4u64 {
                let mut batch = rocksdb::WriteBatch::default();
                for k in (file..30_000).step_by(4) {
                    batch.put(k.to_be_bytes(), (k * 1000 + round).to_le_bytes());
                }
                db.write(batch).unwrap();
                db.flush().unwrap();
            }
        };
        let check = |db: &rocksdb::DB, round: u64| {
            let mut n = 0u64;
            for item in db.iterator(rocksdb::IteratorMode::Start) {
                let (k, v) = item.unwrap();
                let k = u64::from_be_bytes(k[..].try_into().unwrap());
                assert_eq!(k, n);
                assert_eq!(
                    u64::from_le_bytes(v[..].try_into().unwrap()),
                    k * 1000 + round
                );
                n += 1;
            }
            assert_eq!(n, 30_000);
        };
        {
            let db = rocksdb::DB::open(&by_levels(), &path).unwrap();
            write(&db, 1);
            db.compact_range::<&[u8], &[u8]>(None, None);
            write(&db, 2);
            let levels: std::collections::BTreeSet<i32> =
                db.live_files().unwrap().iter().map(|f| f.level).collect();
            assert!(levels.contains(&0) && levels.len() >= 2, "{levels:?}");
        }
        {
            let db = rocksdb::DB::open(&db_options(&memory, false), &path).unwrap();
            check(&db, 2);
            write(&db, 3);
            db.compact_range::<&[u8], &[u8]>(None, None);
            write(&db, 4);
            check(&db, 4);
        }
        let db = rocksdb::DB::open(&by_levels(), &path).unwrap();
        check(&db, 4);
        write(&db, 5);
        db.compact_range::<&[u8], &[u8]>(None, None);
        check(&db, 5);
    }

    /// Tried as an upgrade and a rollback would: files whose data blocks have no hash index
    /// (an earlier release's) and files whose blocks have one answer point reads together,
    /// one by one and batched, in either release, before and after they are merged:
    /// overwritten, deleted and missing keys included.
    #[test]
    fn data_blocks_with_and_without_a_hash_index_answer_point_reads_alike() {
        let tmp = tempfile::tempdir().unwrap();
        let memory = one_slot(tmp.path(), 16 << 20);
        let path = tmp.path().join("db");
        // With the default column family named, as weir opens its instances.
        let open = |opts: &rocksdb::Options| rocksdb::DB::open_cf(opts, &path, ["default"]);
        let without_hash = || {
            let mut opts = db_options(&memory, false);
            let mut table = table_options(false);
            table.set_data_block_index_type(rocksdb::DataBlockIndexType::BinarySearch);
            memory.configure(&mut opts, &mut table);
            opts.set_block_based_table_factory(&table);
            opts
        };
        type Expected = std::collections::BTreeMap<u64, Vec<u8>>;
        let mut expected = Expected::new();
        let write = |db: &rocksdb::DB,
                     expected: &mut Expected,
                     keys: std::ops::Range<u64>,
                     round: u64,
                     every: u64| {
            let mut batch = rocksdb::WriteBatch::default();
            for k in keys {
                if k % (every + 4) == 0 {
                    batch.delete(k.to_be_bytes());
                    expected.remove(&k);
                } else if k % every == 0 {
                    let v = (k * 10 + round).to_le_bytes().repeat(8);
                    batch.put(k.to_be_bytes(), &v);
                    expected.insert(k, v);
                }
            }
            db.write(batch).unwrap();
            db.flush().unwrap();
        };
        let check = |db: &rocksdb::DB, expected: &Expected| {
            let keys: Vec<[u8; 8]> = (0..26_000u64).map(u64::to_be_bytes).collect();
            let cf = db.cf_handle("default").unwrap();
            for chunk in keys.chunks(32) {
                let batched = db.batched_multi_get_cf(cf, chunk.iter(), true);
                for (key, value) in chunk.iter().zip(batched) {
                    let k = u64::from_be_bytes(*key);
                    let want = expected.get(&k).map(Vec::as_slice);
                    assert_eq!(value.unwrap().as_deref(), want, "batched read of {k}");
                    assert_eq!(db.get(key).unwrap().as_deref(), want, "read of {k}");
                }
            }
        };
        {
            let db = open(&without_hash()).unwrap();
            write(&db, &mut expected, 0..20_000, 1, 1);
        }
        {
            let db = open(&db_options(&memory, false)).unwrap();
            check(&db, &expected);
            write(&db, &mut expected, 0..25_000, 2, 3);
            assert_eq!(db.live_files().unwrap().len(), 2);
            check(&db, &expected);
        }
        let db = open(&without_hash()).unwrap();
        check(&db, &expected);
        db.compact_range::<&[u8], &[u8]>(None, None);
        check(&db, &expected);
        drop(db);
        let db = open(&db_options(&memory, false)).unwrap();
        db.compact_range::<&[u8], &[u8]>(None, None);
        check(&db, &expected);
    }

    /// Tried on real files: small entries, as window panes are, get files cut so that no
    /// compaction output holds more keys than the builder's allowance stands for.
    #[test]
    fn a_compaction_cuts_files_of_small_entries_at_the_filter_builders_allowance() {
        let tmp = tempfile::tempdir().unwrap();
        let memory = one_slot(tmp.path(), 16 << 20);
        let db = rocksdb::DB::open(&db_options(&memory, false), tmp.path().join("db")).unwrap();
        let current = initial_compaction_file_bytes();
        // An allowance of 1 MiB of hashes: 131,072 keys per file.
        let allowance = 1 << 20;
        let max_keys = (allowance / 8) as u64;
        // 1.2M entries of an 8-byte key and 16 bytes that do not compress (the deepest
        // level is LZ4-compressed), written and sized after each flush as a checkpoint does.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for chunk in 0..24u64 {
            let mut batch = rocksdb::WriteBatch::default();
            for i in 0..50_000u64 {
                let mut value = [0u8; 16];
                for half in value.chunks_mut(8) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    half.copy_from_slice(&x.to_le_bytes());
                }
                batch.put((chunk * 50_000 + i).to_be_bytes(), value);
            }
            db.write(batch).unwrap();
            db.flush().unwrap();
            size_compaction_files(&db, &current, allowance);
        }
        let target = current.load(Ordering::Relaxed);
        assert!(target < 8 << 20, "{target}");
        db.compact_range::<&[u8], &[u8]>(None, None);
        let files = db.live_files().unwrap();
        let keys: u64 = files.iter().map(|f| f.num_entries).sum();
        assert_eq!(keys, 24 * 50_000, "{files:?}");
        let most = files.iter().map(|f| f.num_entries).max().unwrap();
        // A file is cut after the block that passes its size: a few hundred keys more.
        assert!(
            most <= max_keys * 11 / 10,
            "{most} keys in one file: {files:?}"
        );
        assert!(files.len() >= 9, "{} files: {files:?}", files.len());
    }
}
