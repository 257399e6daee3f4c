//! The settings of the RocksDB backend, and the RocksDB options every instance opens with
//! (and every SST file it writes or ingests is built with).

use std::path::PathBuf;

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

/// The format of every SST file an instance writes or ingests: bloom filters, whole-file or
/// (`partitioned`) cut into partitions under a two-level index whose top level stays pinned
/// in the cache ([`RocksDbConfig::partitioned_index_filters`]).
pub(crate) fn table_options(partitioned: bool) -> rocksdb::BlockBasedOptions {
    let mut table = rocksdb::BlockBasedOptions::default();
    // Keyed state reads many keys that do not exist yet (the first record of every
    // key): bloom filters answer those without reading data blocks.
    table.set_bloom_filter(BLOOM_BITS_PER_KEY, false);
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
    // Every checkpoint flushes the memtable into a new level-0 file that the next
    // compactions rewrite soon: compressing those first two levels costs CPU on the
    // other core at every checkpoint for little space, so only deeper levels are
    // compressed. Compacting level 0 once 8 files (not 4) have gathered merges more
    // overwrites of the same keys per rewrite.
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
    opts.set_level_zero_file_num_compaction_trigger(8);
    let mut table = table_options(partitioned);
    memory.configure(&mut opts, &mut table);
    // Bloom filters in the memtable as well as in every SST file.
    opts.set_memtable_whole_key_filtering(true);
    opts.set_memtable_prefix_bloom_ratio(0.1);
    opts.set_block_based_table_factory(&table);
    opts
}
