//! One memory budget for the RocksDB backend of a job.
//!
//! [`RocksDbConfig::memory_budget_bytes`] covers, per job, everything the RocksDB backend
//! keeps in memory: RocksDB's block cache, its memtables (a `WriteBufferManager` charges
//! them to the same cache), its index and filter blocks (cached, level-0 ones pinned), and
//! the typed write-back caches in front of it. The budget is split evenly over the job's
//! slots (a slot runs one subtask of every operator, so a job has as many slots as its
//! largest parallelism); the keyed operator subtasks of one slot share that slot's part:
//! one cache, one write buffer manager, one write-back allowance.
//!
//! Of a slot's part, a quarter goes to the write-back caches (shared evenly by the slot's
//! persistent state tables; a value-state cache measures its entries' size from their
//! encoded form, list and map caches count [`WRITE_BACK_ENTRY_BYTES`] per entry) and the rest to RocksDB,
//! half of which its memtables may take. An explicit
//! [`cache_entries`](RocksDbConfig::cache_entries) sizes the write-back caches instead and
//! RocksDB gets what is left.

use crate::RocksDbConfig;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use weir_core::{Error, Result};

/// The default memory budget of a job's RocksDB backend: 512 MiB (about what Flink's
/// default managed memory gives a task manager).
pub const DEFAULT_MEMORY_BUDGET_BYTES: usize = 512 << 20;

/// The least memory a slot's RocksDB may have: below it every read goes to disk and
/// memtables flush after a few hundred writes.
pub const MIN_ROCKSDB_BYTES_PER_SLOT: usize = 12 << 20;

/// Memory one write-back cache entry is counted at: its hash-map slot, a value of about
/// 100 bytes on the heap, and its encoded copy while a checkpoint writes it.
pub const WRITE_BACK_ENTRY_BYTES: usize = 320;

/// How a slot's part of the budget is divided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotPlan {
    /// The slot's part of the budget.
    pub slot_bytes: usize,
    /// RocksDB's share: block cache, memtables, index and filter blocks.
    pub rocksdb_bytes: usize,
    /// Memtables, at most (charged to RocksDB's share).
    pub memtable_bytes: usize,
    /// The write-back caches' share, in bytes (`None`: sized in entries by `cache_entries`).
    pub write_back_bytes: Option<usize>,
}

impl SlotPlan {
    /// Divides `cfg`'s budget over `slots` slots; fails with what to change when a slot's
    /// part is too small to be useful.
    ///
    /// ```
    /// use weir_state::{RocksDbConfig, SlotPlan};
    /// let cfg = RocksDbConfig { memory_budget_bytes: 256 << 20, ..RocksDbConfig::default() };
    /// let plan = SlotPlan::new(&cfg, 2).unwrap();
    /// assert_eq!(plan.slot_bytes, 128 << 20);
    /// assert_eq!(plan.write_back_bytes, Some(32 << 20));
    /// assert_eq!(plan.rocksdb_bytes, 96 << 20);
    /// let small = RocksDbConfig { memory_budget_bytes: 1 << 20, ..RocksDbConfig::default() };
    /// assert!(SlotPlan::new(&small, 1).unwrap_err().to_string().contains("at least"));
    /// ```
    pub fn new(cfg: &RocksDbConfig, slots: usize) -> Result<SlotPlan> {
        let slots = slots.max(1);
        let min_slot = MIN_ROCKSDB_BYTES_PER_SLOT * 4 / 3;
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        if cfg.memory_budget_bytes == 0 {
            return Err(Error::Config(format!(
                "the RocksDB memory budget is 0; give it at least {:.0} MiB per slot ({slots} slot(s) here), \
                 or leave it at its default of {:.0} MiB",
                mib(min_slot),
                mib(DEFAULT_MEMORY_BUDGET_BYTES)
            )));
        }
        let slot_bytes = cfg.memory_budget_bytes / slots;
        let (rocksdb_bytes, write_back_bytes) = if cfg.cache_entries == 0 {
            let write_back = slot_bytes / 4;
            (slot_bytes - write_back, Some(write_back))
        } else {
            let write_back = cfg.cache_entries.saturating_mul(WRITE_BACK_ENTRY_BYTES);
            (slot_bytes.saturating_sub(write_back), None)
        };
        if rocksdb_bytes < MIN_ROCKSDB_BYTES_PER_SLOT {
            let why = if cfg.cache_entries == 0 {
                format!(
                    "gives each of its {slots} slot(s) {:.1} MiB; it needs at least {:.0} MiB per slot \
                     ({:.0} MiB for this job)",
                    mib(slot_bytes),
                    mib(min_slot),
                    mib(min_slot * slots)
                )
            } else {
                format!(
                    "leaves {:.1} MiB per slot ({slots} slot(s)) for RocksDB once the write-back caches of \
                     {} entries ({:.1} MiB at {WRITE_BACK_ENTRY_BYTES} bytes each) are taken; RocksDB needs at \
                     least {:.0} MiB per slot: raise the budget or lower cache_entries (0 sizes the caches \
                     from the budget)",
                    mib(rocksdb_bytes),
                    cfg.cache_entries,
                    mib(cfg.cache_entries.saturating_mul(WRITE_BACK_ENTRY_BYTES)),
                    mib(MIN_ROCKSDB_BYTES_PER_SLOT)
                )
            };
            return Err(Error::Config(format!(
                "the RocksDB memory budget of {:.1} MiB is too small: it {why}",
                mib(cfg.memory_budget_bytes)
            )));
        }
        Ok(SlotPlan {
            slot_bytes,
            rocksdb_bytes,
            memtable_bytes: rocksdb_bytes / 2,
            write_back_bytes,
        })
    }
}

/// The smallest shard of a slot's block cache: a whole-file filter or index block of a
/// large SST file is megabytes, and a block larger than its shard's free room is evicted
/// as soon as it is read (then read and checksummed again at the next lookup).
const MIN_CACHE_SHARD_BYTES: usize = 32 << 20;

/// The slot's LRU block cache of `bytes`, in as few shards as keep each at least
/// [`MIN_CACHE_SHARD_BYTES`] (at most 64). RocksDB's own default cuts a cache into shards
/// of 512 KiB and up (64 shards of 2.3 MiB for 150 MiB), too small for such blocks next
/// to the memtables charged to the same cache. A slot's threads (its tasks, one flush
/// and compactions) are few, so fewer shards cost little in lock contention.
fn block_cache(bytes: usize) -> rocksdb::Cache {
    let mut opts = rocksdb::LruCacheOptions::default();
    opts.set_capacity(bytes);
    opts.set_num_shard_bits(cache_shard_bits(bytes));
    rocksdb::Cache::new_lru_cache_opts(&opts)
}

/// The cache of `bytes` is cut into 2^bits shards of at least [`MIN_CACHE_SHARD_BYTES`].
fn cache_shard_bits(bytes: usize) -> i32 {
    (bytes / MIN_CACHE_SHARD_BYTES).clamp(1, 64).ilog2() as i32
}

/// Full memtables an instance flushes together into one level-0 file.
///
/// Every flush adds a level-0 file, and every few level-0 files bring a compaction (a
/// merge of sorted runs since decision 0064; before it, into the next level, which with
/// keys spread over the whole key space rewrote that level). Flushing memtables in pairs
/// halves those compactions, which are most of the CPU time
/// of a job whose state is far larger than its budget, and keeps each memtable (a skip
/// list the task thread inserts into and reads) as small as before: larger memtables
/// instead made the window operators' inserts and reads slower (decision 0062).
const MEMTABLES_PER_FLUSH: i32 = 2;

/// The memory one slot's RocksDB instances share.
pub(crate) struct SlotMemory {
    plan: SlotPlan,
    explicit_entries: usize,
    cache: rocksdb::Cache,
    write_buffers: rocksdb::WriteBufferManager,
    /// Persistent state tables of the slot's instances: they share the write-back share.
    tables: AtomicUsize,
}

type Registry = HashMap<(usize, usize, PathBuf, usize, usize), Weak<SlotMemory>>;

static SLOTS: Mutex<Option<Registry>> = Mutex::new(None);

impl SlotMemory {
    /// The memory of slot `slot` of `slots`, shared with the other instances of that slot
    /// (same settings) that are open in this process.
    pub(crate) fn of_slot(cfg: &RocksDbConfig, slot: usize, slots: usize) -> Result<Arc<Self>> {
        let plan = SlotPlan::new(cfg, slots)?;
        let id = (
            cfg.memory_budget_bytes,
            cfg.cache_entries,
            cfg.local_dir.clone(),
            slots.max(1),
            slot % slots.max(1),
        );
        let mut guard = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
        let registry = guard.get_or_insert_with(HashMap::new);
        registry.retain(|_, w| w.strong_count() > 0);
        if let Some(m) = registry.get(&id).and_then(Weak::upgrade) {
            return Ok(m);
        }
        let cache = block_cache(plan.rocksdb_bytes);
        let write_buffers = rocksdb::WriteBufferManager::new_write_buffer_manager_with_cache(
            plan.memtable_bytes,
            false,
            cache.clone(),
        );
        let m = Arc::new(SlotMemory {
            plan,
            explicit_entries: cfg.cache_entries,
            cache,
            write_buffers,
            tables: AtomicUsize::new(0),
        });
        registry.insert(id, Arc::downgrade(&m));
        Ok(m)
    }

    /// Puts an instance's memory under the slot's budget.
    pub(crate) fn configure(
        &self,
        opts: &mut rocksdb::Options,
        table: &mut rocksdb::BlockBasedOptions,
    ) {
        table.set_block_cache(&self.cache);
        table.set_cache_index_and_filter_blocks(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        opts.set_write_buffer_manager(&self.write_buffers);
        // Each memtable at most an eighth of the memtable allowance, and at least 1 MiB.
        opts.set_write_buffer_size((self.plan.memtable_bytes / 8).clamp(1 << 20, 64 << 20));
        // A full memtable waits for the next one and the two are flushed into one level-0
        // file (up to three memtables per instance: two waiting and one being written).
        opts.set_min_write_buffer_number_to_merge(MEMTABLES_PER_FLUSH);
        opts.set_max_write_buffer_number(MEMTABLES_PER_FLUSH + 1);
    }

    /// Entries each persistent table of the slot keeps in its write-back cache, for
    /// entries of `entry_bytes` each (0: not known, counted at [`WRITE_BACK_ENTRY_BYTES`]).
    pub(crate) fn cache_entries(&self, entry_bytes: usize) -> usize {
        match self.plan.write_back_bytes {
            None => self.explicit_entries,
            Some(bytes) => {
                let tables = self.tables.load(Ordering::Relaxed).max(1);
                let entry = if entry_bytes == 0 {
                    WRITE_BACK_ENTRY_BYTES
                } else {
                    entry_bytes
                };
                (bytes / entry / tables).max(1)
            }
        }
    }

    /// A persistent table of one of the slot's instances was registered (`1`) or dropped
    /// (`-1` per table).
    pub(crate) fn add_tables(&self, n: isize) {
        if n >= 0 {
            self.tables.fetch_add(n as usize, Ordering::Relaxed);
        } else {
            self.tables.fetch_sub(n.unsigned_abs(), Ordering::Relaxed);
        }
    }
}

/// What one slot's RocksDB holds in memory right now ([`rocksdb_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotMemoryUsage {
    /// The slot's plan: its part of the budget and how it is divided.
    pub plan: SlotPlan,
    /// Bytes in the slot's block cache, memtables (reserved in it) included.
    pub cache_bytes: usize,
    /// Of those, bytes pinned by readers (iterators, level-0 index and filter blocks).
    pub pinned_bytes: usize,
    /// Bytes of the slot's memtables, mutable and being flushed.
    pub memtable_bytes: usize,
}

/// The memory of every slot whose RocksDB instances are open in this process, by RocksDB's
/// own counters: to see where a process's memory goes beside its resident set (the
/// write-back caches and the allocator's free pages are not in it).
///
/// ```
/// // No RocksDB instance is open: nothing to report.
/// assert!(weir_state::rocksdb_memory().is_empty());
/// ```
pub fn rocksdb_memory() -> Vec<SlotMemoryUsage> {
    let guard = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
    let mut slots: Vec<_> = guard
        .iter()
        .flat_map(|r| r.iter())
        .filter_map(|(id, w)| Some((id.4, w.upgrade()?)))
        .collect();
    slots.sort_by_key(|(slot, _)| *slot);
    slots
        .into_iter()
        .map(|(_, m)| SlotMemoryUsage {
            plan: m.plan,
            cache_bytes: m.cache.get_usage(),
            pinned_bytes: m.cache.get_pinned_usage(),
            memtable_bytes: m.write_buffers.get_usage(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BackendKind, BackendParams};
    use std::collections::BTreeMap;

    fn cfg(dir: &std::path::Path, budget: usize, entries: usize) -> RocksDbConfig {
        RocksDbConfig {
            local_dir: dir.to_path_buf(),
            memory_budget_bytes: budget,
            cache_entries: entries,
            ..RocksDbConfig::default()
        }
    }

    #[test]
    fn a_block_cache_has_few_shards_each_large_enough_for_a_whole_file_filter() {
        // A slot's RocksDB share of the default 512 MiB budget at P=1 (384 MiB): 8 shards
        // of 48 MiB, where RocksDB's own default would cut 64 of 6 MiB.
        assert_eq!(cache_shard_bits(384 << 20), 3);
        // 200 MiB at P=1: 150 MiB in 4 shards of 37.5 MiB.
        assert_eq!(cache_shard_bits(150 << 20), 2);
        // Small caches stay whole; the largest stop at 64 shards.
        assert_eq!(cache_shard_bits(12 << 20), 0);
        assert_eq!(cache_shard_bits(63 << 20), 0);
        assert_eq!(cache_shard_bits(64 << 20), 1);
        assert_eq!(cache_shard_bits(64 << 30), 6);
        for bytes in [12usize << 20, 100 << 20, 1 << 30, 5 << 30] {
            let shard = bytes >> cache_shard_bits(bytes);
            assert!(
                shard >= MIN_CACHE_SHARD_BYTES.min(bytes),
                "{bytes}: shard {shard}"
            );
        }
    }

    #[test]
    fn the_budget_is_split_per_slot_and_between_rocksdb_and_the_caches() {
        let dir = std::path::Path::new("unused");
        let plan = SlotPlan::new(&cfg(dir, 512 << 20, 0), 4).unwrap();
        assert_eq!(
            plan,
            SlotPlan {
                slot_bytes: 128 << 20,
                rocksdb_bytes: 96 << 20,
                memtable_bytes: 48 << 20,
                write_back_bytes: Some(32 << 20),
            }
        );
        // An explicit entry count is taken out of the slot's part.
        let plan = SlotPlan::new(&cfg(dir, 64 << 20, 100_000), 1).unwrap();
        assert_eq!(
            plan.rocksdb_bytes,
            (64 << 20) - 100_000 * WRITE_BACK_ENTRY_BYTES
        );
        assert_eq!(plan.write_back_bytes, None);
    }

    #[test]
    fn a_budget_too_small_to_be_useful_is_refused_with_what_to_change() {
        let dir = std::path::Path::new("unused");
        let e = SlotPlan::new(&cfg(dir, 0, 0), 2).unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid configuration: the RocksDB memory budget is 0; give it at least 16 MiB per slot \
             (2 slot(s) here), or leave it at its default of 512 MiB"
        );
        let e = SlotPlan::new(&cfg(dir, 24 << 20, 0), 2)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "invalid configuration: the RocksDB memory budget of 24.0 MiB is too small: it gives each of \
             its 2 slot(s) 12.0 MiB; it needs at least 16 MiB per slot (32 MiB for this job)"
        );
        let e = SlotPlan::new(&cfg(dir, 64 << 20, 1_000_000), 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("lower cache_entries (0 sizes the caches from the budget)"),
            "{e}"
        );
    }

    fn params(label: &str, subtask: usize, slots: usize) -> BackendParams<'_> {
        BackendParams {
            label,
            max_parallelism: 128,
            subtask,
            parallelism: slots,
            slots,
            restore: BTreeMap::new(),
            restore_from: &[],
        }
    }

    /// The operators of one slot share its write-back allowance: each persistent table
    /// gets an equal part, and a dropped operator gives its part back.
    #[test]
    fn the_tables_of_a_slot_share_its_write_back_allowance() {
        use weir_core::state::{KeyContext, StateContext};
        let tmp = tempfile::tempdir().unwrap();
        let kind = BackendKind::RocksDb(cfg(tmp.path(), 64 << 20, 0));
        let per_slot = (32 << 20) / 4 / WRITE_BACK_ENTRY_BYTES;
        let a = kind.create(params("op1-0", 0, 2)).unwrap();
        let store = a.store().unwrap();
        assert_eq!(store.cache_capacity(), per_slot);
        let mut ctx_a = StateContext::new(KeyContext::<u64>::new(), a);
        let _x = ctx_a.value_state::<u64>("x").unwrap();
        let _y = ctx_a.map_state::<u64, u64>("y").unwrap();
        assert_eq!(store.cache_capacity(), per_slot / 2);
        let b = kind.create(params("op2-0", 0, 2)).unwrap();
        let mut ctx_b = StateContext::new(KeyContext::<u64>::new(), b);
        let _z = ctx_b.list_state::<u64>("z").unwrap();
        assert_eq!(store.cache_capacity(), per_slot / 3);
        // Another slot has its own part.
        let c = kind.create(params("op1-1", 1, 2)).unwrap();
        assert_eq!(c.store().unwrap().cache_capacity(), per_slot);
        drop((ctx_b, _z));
        assert_eq!(store.cache_capacity(), per_slot / 2);
    }

    /// A full memtable is not flushed alone: it waits for the next, and the two become one
    /// level-0 file. Written into a slot of 64 MiB (memtables of 3 MiB), the first file
    /// holds more entries than the first memtable did when it filled.
    #[test]
    fn full_memtables_are_flushed_in_pairs() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = cfg(tmp.path(), 64 << 20, 0);
        let memory = SlotMemory::of_slot(&cfg, 0, 1).unwrap();
        // The options every instance opens with.
        let opts = crate::rocks_options::db_options(&memory, false);
        let db = rocksdb::DB::open(&opts, tmp.path().join("db")).unwrap();
        let mut write = rocksdb::WriteOptions::default();
        write.disable_wal(true);
        let property = |name: &str| db.property_int_value(name).unwrap().unwrap();
        let value = [7u8; 100];
        let mut first_full = None;
        let mut written = 0u64;
        // Until a file exists (at most 30 MiB of writes, ten memtables).
        while db.live_files().unwrap().is_empty() {
            assert!(written < 300_000, "no flush after {written} entries");
            let key = written.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes();
            db.put_opt(key, value, &write).unwrap();
            written += 1;
            // The write that fills a memtable switches it for a new one.
            if first_full.is_none() && property("rocksdb.num-immutable-mem-table") == 1 {
                first_full = Some(written - property("rocksdb.num-entries-active-mem-table"));
            }
        }
        let first_full = first_full.expect("a memtable filled before the first flush");
        let files = db.live_files().unwrap();
        assert_eq!(files.len(), 1);
        assert!(
            files[0].num_entries > first_full,
            "the first file holds {} entries, the first memtable held {first_full}",
            files[0].num_entries
        );
    }

    /// An instance keeps its blocks and memtables in its slot's cache: the one the
    /// budget sizes, not a block cache of RocksDB's own per instance.
    #[test]
    fn an_instance_uses_its_slots_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = cfg(tmp.path(), 64 << 20, 0);
        let backend =
            crate::RocksDbBackend::open(&cfg, "op1-0", 128, 0, 1, BTreeMap::new(), &[]).unwrap();
        assert_eq!(
            backend.property("rocksdb.block-cache-capacity"),
            Some(48 << 20)
        );
    }
}
