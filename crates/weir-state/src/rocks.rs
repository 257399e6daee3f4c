//! The RocksDB keyed state backend.
//!
//! Each keyed operator subtask owns a RocksDB instance in a local working directory, with
//! the write-ahead log off (the checkpoint is the durability point). Value, list and map
//! states are typed write-back caches over it (see `weir_core::state::CachedTable`): the
//! cache is written to RocksDB in one batch at every checkpoint barrier or when it
//! outgrows its capacity. A snapshot flushes the memtable and takes a RocksDB checkpoint
//! (hard links); its SST files are immutable, so checkpoint storage keeps each once and
//! later checkpoints reference it (incremental checkpoints). Internal tables (timers,
//! window contents) stay on the heap and are checkpointed as encoded key groups.
//!
//! Restoring — at any parallelism — opens the old subtasks' checkpointed databases
//! read-only and copies the key groups this subtask now owns into a fresh instance.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use weir_core::checkpoint::{KeyGroupBlobs, LocalFile};
use weir_core::data::key_group_range;
use weir_core::ids::CheckpointId;
use weir_core::state::{BackendSnapshot, KeyedStateBackend, KvStore, StateTableInfo};
use weir_core::{Error, Result};

/// Settings of the RocksDB backend.
#[derive(Debug, Clone)]
pub struct RocksDbConfig {
    /// Local working directory for the instances (not the checkpoint directory).
    pub local_dir: PathBuf,
    /// Entries each state table keeps in its typed write-back cache.
    pub cache_entries: usize,
    /// RocksDB block cache per instance, in bytes.
    pub block_cache_bytes: usize,
    /// RocksDB memtable size per instance, in bytes.
    pub write_buffer_bytes: usize,
}

impl Default for RocksDbConfig {
    fn default() -> Self {
        RocksDbConfig {
            local_dir: std::env::temp_dir().join("weir-rocksdb"),
            cache_entries: 1 << 20,
            block_cache_bytes: 64 << 20,
            write_buffer_bytes: 32 << 20,
        }
    }
}

fn err(what: &str, path: &Path, e: rocksdb::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source: std::io::Error::other(format!("RocksDB {what}: {e}")),
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::io(path.display(), e)
}

static INSTANCE: AtomicU64 = AtomicU64::new(0);

/// One RocksDB instance.
pub struct RocksStore {
    db: Option<rocksdb::DB>,
    dir: PathBuf,
    root: PathBuf,
    instance: String,
    write: rocksdb::WriteOptions,
    max_parallelism: usize,
    cache_entries: usize,
}

impl RocksStore {
    fn open(cfg: &RocksDbConfig, label: &str, max_parallelism: usize) -> Result<Self> {
        let n = INSTANCE.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let instance = format!("{label}-{}-{n}-{nanos:x}", std::process::id());
        // Instance directories are `{label}-{pid}-{n}-{nanos}`, the label `op{node}-{subtask}`:
        // the pid is the third field.
        weir_core::scratch::remove_orphans(&cfg.local_dir, |name| {
            name.split('-').nth(2)?.parse().ok()
        });
        let root = cfg.local_dir.join(&instance);
        let dir = root.join("db");
        std::fs::create_dir_all(&root).map_err(io(&root))?;
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.set_write_buffer_size(cfg.write_buffer_bytes);
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
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_block_cache(&rocksdb::Cache::new_lru_cache(cfg.block_cache_bytes));
        // Keyed state reads many keys that do not exist yet (the first record of every
        // key): bloom filters answer those without reading data blocks, in the memtable
        // and in every SST file.
        table.set_bloom_filter(10.0, false);
        opts.set_memtable_whole_key_filtering(true);
        opts.set_memtable_prefix_bloom_ratio(0.1);
        opts.set_block_based_table_factory(&table);
        let db = rocksdb::DB::open(&opts, &dir).map_err(|e| err("open", &dir, e))?;
        let mut write = rocksdb::WriteOptions::default();
        write.disable_wal(true);
        Ok(RocksStore {
            db: Some(db),
            dir,
            root,
            instance,
            write,
            max_parallelism,
            cache_entries: cfg.cache_entries,
        })
    }

    fn db(&self) -> &rocksdb::DB {
        self.db.as_ref().expect("open until dropped")
    }

    /// Copies the entries of key groups `range` from a checkpointed database into this one.
    fn load_from(&self, old: &Path, range: std::ops::Range<u32>) -> Result<u64> {
        let opts = rocksdb::Options::default();
        let src = rocksdb::DB::open_for_read_only(&opts, old, false)
            .map_err(|e| err("open for restore", old, e))?;
        let start = (range.start as u16).to_be_bytes();
        let mut batch = rocksdb::WriteBatch::default();
        let mut n = 0u64;
        let iter = src.iterator(rocksdb::IteratorMode::From(
            &start,
            rocksdb::Direction::Forward,
        ));
        for item in iter {
            let (k, v) = item.map_err(|e| err("read for restore", old, e))?;
            let g = u16::from_be_bytes([k[0], k[1]]) as u32;
            if g >= range.end {
                break;
            }
            batch.put(&k, &v);
            n += 1;
            if batch.len() >= 10_000 {
                self.db()
                    .write_opt(std::mem::take(&mut batch), &self.write)
                    .map_err(|e| err("write", &self.dir, e))?;
            }
        }
        self.db()
            .write_opt(batch, &self.write)
            .map_err(|e| err("write", &self.dir, e))?;
        Ok(n)
    }

    /// Flushes the memtable and takes a checkpoint; returns its files.
    fn checkpoint(&self, id: CheckpointId) -> Result<Vec<LocalFile>> {
        self.db().flush().map_err(|e| err("flush", &self.dir, e))?;
        let target = self.root.join(format!("chk-{}", id.0));
        if target.exists() {
            std::fs::remove_dir_all(&target).map_err(io(&target))?;
        }
        rocksdb::checkpoint::Checkpoint::new(self.db())
            .and_then(|c| c.create_checkpoint(&target))
            .map_err(|e| err("checkpoint", &target, e))?;
        // Local checkpoints before the previous one were copied to storage already.
        for e in std::fs::read_dir(&self.root)
            .map_err(io(&self.root))?
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(n) = name
                .strip_prefix("chk-")
                .and_then(|n| n.parse::<u64>().ok())
                && n + 1 < id.0
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let mut files = Vec::new();
        for e in std::fs::read_dir(&target).map_err(io(&target))?.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            let shared = file.ends_with(".sst");
            let name = if shared {
                format!("{}-{file}", self.instance)
            } else {
                format!("{}-{}-{file}", self.instance, id.0)
            };
            files.push(LocalFile {
                path: e.path(),
                name,
                shared,
            });
        }
        files.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(files)
    }
}

impl Drop for RocksStore {
    fn drop(&mut self) {
        drop(self.db.take());
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl KvStore for RocksStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db().get(key).map_err(|e| err("get", &self.dir, e))
    }
    fn write(&self, batch: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<()> {
        let mut b = rocksdb::WriteBatch::default();
        for (k, v) in batch {
            match v {
                Some(v) => b.put(k, v),
                None => b.delete(k),
            }
        }
        self.db()
            .write_opt(b, &self.write)
            .map_err(|e| err("write", &self.dir, e))
    }
    fn max_parallelism(&self) -> usize {
        self.max_parallelism
    }
    fn cache_capacity(&self) -> usize {
        self.cache_entries
    }
}

/// The RocksDB backend of one keyed operator subtask.
pub struct RocksDbBackend {
    store: Rc<RocksStore>,
    tables: BTreeMap<String, Rc<dyn StateTableInfo>>,
    restore: BTreeMap<String, KeyGroupBlobs>,
}

impl RocksDbBackend {
    /// Opens a fresh instance and loads the key groups of `subtask` from `restore_dirs`.
    pub fn open(
        cfg: &RocksDbConfig,
        label: &str,
        max_parallelism: usize,
        subtask: usize,
        parallelism: usize,
        restore: BTreeMap<String, KeyGroupBlobs>,
        restore_dirs: &[PathBuf],
    ) -> Result<Self> {
        let store = RocksStore::open(cfg, label, max_parallelism)?;
        let range = key_group_range(subtask, max_parallelism, parallelism);
        for dir in restore_dirs {
            let n = store.load_from(dir, range.clone())?;
            tracing::debug!(from = %dir.display(), entries = n, "restored RocksDB key groups");
        }
        Ok(RocksDbBackend {
            store: Rc::new(store),
            tables: BTreeMap::new(),
            restore,
        })
    }

    /// The instance's database directory.
    pub fn path(&self) -> &Path {
        &self.store.dir
    }
}

impl KeyedStateBackend for RocksDbBackend {
    fn name(&self) -> &'static str {
        "rocksdb"
    }

    fn register(&mut self, name: &str, table: Rc<dyn StateTableInfo>) -> Result<()> {
        crate::register_table(&mut self.tables, &mut self.restore, name, table)
    }

    fn entries(&self) -> usize {
        self.tables.values().map(|t| t.entries()).sum()
    }

    fn snapshot(&self, id: CheckpointId) -> Result<BackendSnapshot> {
        let mut keyed = BTreeMap::new();
        for (name, t) in &self.tables {
            if t.is_persistent() {
                t.flush()?;
            } else {
                keyed.insert(name.clone(), t.snapshot(self.store.max_parallelism)?);
            }
        }
        Ok(BackendSnapshot {
            keyed,
            files: self.store.checkpoint(id)?,
        })
    }

    fn store(&self) -> Option<Rc<dyn KvStore>> {
        Some(self.store.clone())
    }
}
