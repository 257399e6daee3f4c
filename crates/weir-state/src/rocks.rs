//! The RocksDB keyed state backend.
//!
//! Each keyed operator subtask owns a RocksDB instance in a local working directory, with
//! the write-ahead log off (the checkpoint is the durability point). Value, list and map
//! states are typed write-back caches over it (see `weir_core::state::CachedTable`,
//! `StoreListTable` and `StoreMapTable`; a list element and a map entry are each one
//! RocksDB entry, read in key order with [`KvStore::scan`]): the cache is written to
//! RocksDB a megabyte at a time when it outgrows its capacity, and at every checkpoint barrier. At the barrier the task thread only encodes the changed entries and
//! marks them clean; a background thread sorts them, writes them as one SST file, ingests
//! it and takes a RocksDB checkpoint (hard links) while the task goes on with records.
//! Until that thread is done the task does not write to RocksDB or evict from the cache
//! (the cache still holds every value being written). SST files are immutable, so
//! checkpoint storage keeps each once and later checkpoints reference it (incremental
//! checkpoints). Timers and window contents live in the database too (ordered timer keys,
//! one pane per key and window; see `weir_core::state`), so they are checkpointed
//! incrementally with the rest. A table registered as not persistent would be
//! checkpointed as encoded key groups; weir's operators register none on this backend.
//!
//! Restoring opens the checkpoint's SST files directly (see `rocks_restore`): at the same
//! parallelism the old instance's files are linked in and opened; at another, the old
//! instance that overlaps most is clipped to the subtask's key groups and the others'
//! entries are ingested.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use weir_core::checkpoint::{DeferredFiles, KeyGroupBlobs, LocalFile, RestoredInstance};
use weir_core::data::key_group_range;
use weir_core::ids::CheckpointId;
use weir_core::state::{BackendSnapshot, Changes, KeyedStateBackend, KvStore, StateTableInfo};
use weir_core::{Error, Result};

use crate::budget::SlotMemory;
pub use crate::rocks_options::RocksDbConfig;
use crate::rocks_options::{
    CompactionThread, FILTER_BUILDER_BYTES, db_options, initial_compaction_file_bytes,
    size_compaction_files, table_options,
};

pub(crate) fn err(what: &str, path: &Path, e: rocksdb::Error) -> Error {
    Error::Io {
        path: path.display().to_string(),
        source: std::io::Error::other(format!("RocksDB {what}: {e}")),
    }
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::io(path.display(), e)
}

static INSTANCE: AtomicU64 = AtomicU64::new(0);

/// One RocksDB instance.
pub struct RocksStore {
    db: Option<Arc<rocksdb::DB>>,
    dir: PathBuf,
    root: PathBuf,
    instance: String,
    write: rocksdb::WriteOptions,
    max_parallelism: usize,
    /// The memory this instance shares with the others of its slot.
    memory: Arc<SlotMemory>,
    /// SST files with partitioned index and filters ([`RocksDbConfig::partitioned_index_filters`]).
    partitioned: bool,
    /// Persistent tables registered on this instance (counted in `memory`).
    tables: std::cell::Cell<usize>,
    /// The snapshot being written in the background.
    inflight: RefCell<Option<JoinHandle<Result<()>>>>,
    /// SST files the instance was restored with, by their name here: their name in
    /// checkpoint storage and size (see [`crate::rocks_restore::Restored`]).
    restored: Arc<crate::rocks_restore::Restored>,
    /// The background compaction of the key groups a rescale removed, if running.
    compaction: Option<JoinHandle<()>>,
    /// The size compactions cut their output files at now (see
    /// [`crate::rocks_options::size_compaction_files`]).
    file_bytes: Arc<AtomicUsize>,
    /// This instance's thread of the process's compaction pool.
    _compaction_thread: CompactionThread,
}

/// The directory of `local_dir` that the instance directories of dead processes are moved
/// into, to be deleted in the background. Its name has no owner tag, so no process judges
/// it as an instance directory.
pub(crate) const TRASH_DIR: &str = ".trash";

/// Moves the instance directories of processes that no longer run (a `kill -9` leaves
/// them) out of `local_dir` into its [`TRASH_DIR`], and deletes what the trash holds on a
/// background thread. Deleting them in place, before the restore, took 0.05-0.6 s of a
/// restart at 5 GB that otherwise takes 0.2-0.4 s (decision 0067). A local copy that local
/// recovery uses was moved out of them before. What a process still deleting when it ends
/// leaves in the trash, the next process deletes.
fn clear_orphans(local_dir: &Path) {
    // Instance directories are `{label}-{owner tag}-{n}-{nanos}`, the label
    // `op{node}-{subtask}`: the owner tag is the third field.
    let orphans = weir_core::scratch::orphans(local_dir, |name| name.split('-').nth(2));
    let trash = local_dir.join(TRASH_DIR);
    for orphan in orphans {
        let moved = std::fs::create_dir_all(&trash).is_ok()
            && orphan
                .file_name()
                .is_some_and(|name| std::fs::rename(&orphan, trash.join(name)).is_ok());
        if !moved {
            // Already moved by another instance opening now, or the trash is not usable.
            let _ = std::fs::remove_dir_all(&orphan);
        }
    }
    // What the trash holds: moved just now, or left by a process that ended while
    // deleting it.
    if !has_entries(&trash) {
        return;
    }
    let mut emptying = EMPTYING.lock().unwrap_or_else(|e| e.into_inner());
    if !emptying.insert(trash.clone()) {
        // Its thread checks the trash again, under the lock, before it ends.
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("weir-rocksdb-trash".into())
        .spawn({
            let trash = trash.clone();
            move || empty_trash(&trash)
        });
    if let Err(e) = spawned {
        emptying.remove(&trash);
        tracing::warn!(
            "could not start a thread to delete dead processes' RocksDB directories: {e}"
        );
    }
}

/// Trash directories a thread of this process is emptying.
static EMPTYING: std::sync::Mutex<std::collections::BTreeSet<PathBuf>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

fn empty_trash(trash: &Path) {
    loop {
        // Another process may empty the same trash at the same time: each ignores what
        // the other already deleted.
        let mut stuck = None;
        for e in std::fs::read_dir(trash).into_iter().flatten().flatten() {
            if let Err(err) = std::fs::remove_dir_all(e.path())
                && e.path().exists()
            {
                stuck = Some((e.path(), err));
            }
        }
        let mut emptying = EMPTYING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((path, err)) = stuck {
            emptying.remove(trash);
            tracing::warn!(
                "could not delete {}, the RocksDB directory of a process that no longer runs: \
                 {err}; delete it by hand",
                path.display()
            );
            return;
        }
        if !has_entries(trash) {
            let _ = std::fs::remove_dir(trash);
            emptying.remove(trash);
            return;
        }
    }
}

fn has_entries(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

impl RocksStore {
    fn open(
        cfg: &RocksDbConfig,
        label: &str,
        max_parallelism: usize,
        (subtask, parallelism): (usize, usize),
        restore: &[RestoredInstance],
        memory: Arc<SlotMemory>,
    ) -> Result<Self> {
        let n = INSTANCE.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let owner = weir_core::scratch::owner_tag();
        let instance = format!("{label}-{owner}-{n}-{nanos:x}");
        clear_orphans(&cfg.local_dir);
        let root = cfg.local_dir.join(&instance);
        let dir = root.join("db");
        std::fs::create_dir_all(&root).map_err(io(&root))?;
        let partitioned = cfg.partitioned_index_filters;
        let opts = db_options(&memory, partitioned);
        let range = key_group_range(subtask, max_parallelism, parallelism);
        let (db, mut restored) =
            match crate::rocks_restore::restore(&opts, &root, &dir, range, restore, partitioned) {
                Ok(r) => r,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&root);
                    return Err(e);
                }
            };
        let mut write = rocksdb::WriteOptions::default();
        write.disable_wal(true);
        let db = Arc::new(db);
        let file_bytes = Arc::new(initial_compaction_file_bytes());
        size_compaction_files(&db, &file_bytes, FILTER_BUILDER_BYTES);
        let compaction =
            crate::rocks_restore::compact_in_background(&db, std::mem::take(&mut restored.compact));
        Ok(RocksStore {
            db: Some(db),
            compaction,
            dir,
            root,
            instance,
            write,
            max_parallelism,
            memory,
            partitioned,
            tables: std::cell::Cell::new(0),
            inflight: RefCell::new(None),
            restored: Arc::new(restored),
            file_bytes,
            _compaction_thread: CompactionThread::claim(),
        })
    }

    fn db(&self) -> &rocksdb::DB {
        self.db.as_ref().expect("open until dropped")
    }

    /// Starts writing a snapshot: `changes` are written into the database and a RocksDB
    /// checkpoint is taken on a background thread; its files are published in the result.
    /// The caller has settled the previous snapshot.
    fn snapshot_in_background(
        &self,
        id: CheckpointId,
        changes: Vec<Changes>,
    ) -> Result<DeferredFiles> {
        let files = DeferredFiles::default();
        let job = SnapshotJob {
            db: self.db.clone().expect("open until dropped"),
            dir: self.dir.clone(),
            root: self.root.clone(),
            instance: self.instance.clone(),
            restored: self.restored.clone(),
            partitioned: self.partitioned,
            file_bytes: self.file_bytes.clone(),
            id,
        };
        let published = files.clone();
        let handle = std::thread::Builder::new()
            .name("weir-rocksdb-snapshot".into())
            .spawn(move || {
                let result = catch_unwind(AssertUnwindSafe(|| job.run(changes)))
                    .unwrap_or_else(|p| Err(Error::from_panic(p)));
                let task_side = match &result {
                    Ok(_) => Ok(()),
                    Err(e) => Err(Error::User(format!(
                        "writing the RocksDB snapshot of checkpoint {} failed: {e}",
                        id.0
                    ))),
                };
                published.set(result);
                task_side
            })
            .map_err(|e| Error::io(self.root.display(), e))?;
        *self.inflight.borrow_mut() = Some(handle);
        Ok(files)
    }

    /// Waits for the snapshot being written in the background, if any.
    fn settle_inflight(&self) -> Result<()> {
        let Some(handle) = self.inflight.borrow_mut().take() else {
            return Ok(());
        };
        handle.join().unwrap_or_else(|p| Err(Error::from_panic(p)))
    }
}

/// One table's changes in key order: (store key, encoded value or `None` for a delete).
type SortedRun<'a> = Vec<(&'a [u8], Option<&'a [u8]>)>;

/// The background part of a snapshot.
struct SnapshotJob {
    db: Arc<rocksdb::DB>,
    dir: PathBuf,
    root: PathBuf,
    instance: String,
    restored: Arc<crate::rocks_restore::Restored>,
    partitioned: bool,
    file_bytes: Arc<AtomicUsize>,
    id: CheckpointId,
}

impl SnapshotJob {
    fn run(self, changes: Vec<Changes>) -> Result<Vec<LocalFile>> {
        // For the tests of a snapshot that never ends (`sleep:MS`).
        weir_core::failpoint::hit("rocksdb.snapshot");
        let tables: Vec<_> = changes
            .iter()
            .filter(|c| !c.is_empty())
            .map(Changes::sorted)
            .collect();
        if !tables.is_empty() {
            if self.memtables_empty() {
                self.ingest(&tables)?;
            } else {
                self.write_to_memtable(&tables)?;
            }
        }
        let files = self.checkpoint()?;
        size_compaction_files(&self.db, &self.file_bytes, FILTER_BUILDER_BYTES);
        Ok(files)
    }

    /// Writes the sorted changes of every table as one SST file and ingests it. The file
    /// takes a sequence number above everything in the database, which is right: no write
    /// reaches the database between the barrier and the end of this job.
    ///
    /// When the memtables are empty, building the file here, rather than writing the batch
    /// into the memtable and flushing it, skips the memtable's skip-list inserts and its
    /// flush.
    fn ingest(&self, tables: &[SortedRun<'_>]) -> Result<()> {
        let path = self.root.join(format!("ingest-{}.sst", self.id.0));
        let mut opts = rocksdb::Options::default();
        // Level 0 and 1 are not compressed (see `RocksStore::open`); same filter as there.
        opts.set_compression_type(rocksdb::DBCompressionType::None);
        opts.set_block_based_table_factory(&table_options(self.partitioned));
        let mut writer = rocksdb::SstFileWriter::create(&opts);
        writer
            .open(&path)
            .map_err(|e| err("create SST file", &path, e))?;
        // Merge the tables' sorted runs (their keys differ in the table name, so no key
        // repeats across them).
        let mut pos = vec![0usize; tables.len()];
        loop {
            let mut next: Option<usize> = None;
            for (t, run) in tables.iter().enumerate() {
                if let Some((k, _)) = run.get(pos[t])
                    && next.is_none_or(|n| *k < tables[n][pos[n]].0)
                {
                    next = Some(t);
                }
            }
            let Some(t) = next else { break };
            let (k, v) = tables[t][pos[t]];
            pos[t] += 1;
            match v {
                Some(v) => writer.put(k, v),
                None => writer.delete(k),
            }
            .map_err(|e| err("write SST file", &path, e))?;
        }
        writer
            .finish()
            .map_err(|e| err("finish SST file", &path, e))?;
        let mut ingest = rocksdb::IngestExternalFileOptions::default();
        ingest.set_move_files(true);
        self.db
            .ingest_external_file_opts(&ingest, vec![&path])
            .map_err(|e| err("ingest", &path, e))?;
        // Moving hard-links the file into the database; this name is left over.
        let _ = std::fs::remove_file(&path);
        Ok(())
    }

    /// Takes a RocksDB checkpoint (the memtable flushed, files hard-linked); returns its
    /// files.
    fn checkpoint(&self) -> Result<Vec<LocalFile>> {
        let id = self.id;
        self.db.flush().map_err(|e| err("flush", &self.dir, e))?;
        let target = self.root.join(format!("chk-{}", id.0));
        if target.exists() {
            std::fs::remove_dir_all(&target).map_err(io(&target))?;
        }
        rocksdb::checkpoint::Checkpoint::new(&self.db)
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
        let encoding = target.join(crate::rocks_restore::KEY_ENCODING_FILE);
        std::fs::write(&encoding, self.restored.key_encoding.name()).map_err(io(&encoding))?;
        let mut files = Vec::new();
        for e in std::fs::read_dir(&target).map_err(io(&target))?.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            let shared = file.ends_with(".sst");
            let name = if shared {
                // A file the instance was restored with keeps its name in storage, where
                // it is already: the first checkpoint after a restore stores only what
                // changed.
                let size = e.metadata().map_err(io(&e.path()))?.len();
                self.restored
                    .stored_name(&file, size)
                    .unwrap_or_else(|| format!("{}-{file}", self.instance))
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
        self.memory.add_tables(-(self.tables.get() as isize));
        let _ = self.settle_inflight();
        if let Some(c) = self.compaction.take() {
            let _ = c.join();
        }
        drop(self.db.take());
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl KvStore for RocksStore {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db().get(key).map_err(|e| err("get", &self.dir, e))
    }
    fn multi_get(&self, keys: &[&[u8]], each: &mut weir_core::state::EachValue<'_>) -> Result<()> {
        let db = self.db();
        let Some(cf) = db.cf_handle("default") else {
            for (i, k) in keys.iter().enumerate() {
                each(i, self.get(k)?.as_deref())?;
            }
            return Ok(());
        };
        // Sorted keys (the caller's promise) let RocksDB share its index and filter
        // lookups over the batch. The values stay pinned in the block cache until
        // the batch's results are dropped: callers keep batches small.
        let values = db.batched_multi_get_cf(cf, keys.iter().copied(), true);
        for (i, v) in values.into_iter().enumerate() {
            let v = v.map_err(|e| err("get", &self.dir, e))?;
            each(i, v.as_deref())?;
        }
        Ok(())
    }
    fn write(&self, changes: &Changes) -> Result<()> {
        self.settle_inflight()?;
        memtable::write_in_batches(self.db(), &changes.sorted(), &self.write)
            .map_err(|e| err("write", &self.dir, e))
    }
    fn scan(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut opts = rocksdb::ReadOptions::default();
        opts.set_iterate_upper_bound(end);
        let mut it = self.db().raw_iterator_opt(opts);
        it.seek(start);
        let mut out = Vec::new();
        while out.len() < limit
            && let (Some(k), Some(v)) = (it.key(), it.value())
        {
            out.push((k.to_vec(), v.to_vec()));
            it.next();
        }
        it.status().map_err(|e| err("scan", &self.dir, e))?;
        Ok(out)
    }
    fn max_parallelism(&self) -> usize {
        self.max_parallelism
    }
    fn cache_capacity(&self) -> usize {
        self.memory.cache_entries(0)
    }
    fn cache_capacity_for(&self, entry_bytes: usize) -> usize {
        self.memory.cache_entries(entry_bytes)
    }
    fn settle(&self) -> Result<()> {
        self.settle_inflight()
    }
    fn settling(&self) -> bool {
        self.inflight
            .borrow()
            .as_ref()
            .is_some_and(|h| !h.is_finished())
    }

    fn key_encoding(&self) -> weir_core::state::KeyEncoding {
        self.restored.key_encoding
    }
}

/// The RocksDB backend of one keyed operator subtask.
pub struct RocksDbBackend {
    store: Rc<RocksStore>,
    tables: BTreeMap<String, Rc<dyn StateTableInfo>>,
    restore: BTreeMap<String, KeyGroupBlobs>,
    /// The warning about undeclared heap state was logged ([`crate::carry_undeclared`]).
    warned: std::cell::Cell<bool>,
}

impl RocksDbBackend {
    /// Opens an instance for `subtask` of `parallelism`, restored from the old subtasks'
    /// instances whose key groups overlap its own (none: an empty instance).
    ///
    /// Without a change of parallelism the old instance's files are linked (or copied)
    /// into the new instance and opened as they are; with one, the old instance that
    /// overlaps most is the base, clipped to this subtask's key groups, and the others'
    /// entries of those key groups are ingested as SST files (see the crate's
    /// `rocks_restore` module). The instance has a slot of its own (`parallelism` slots);
    /// [`BackendKind::create`] places it in the job's slots instead.
    ///
    /// [`BackendKind::create`]: crate::BackendKind::create
    pub fn open(
        cfg: &RocksDbConfig,
        label: &str,
        max_parallelism: usize,
        subtask: usize,
        parallelism: usize,
        restore: BTreeMap<String, KeyGroupBlobs>,
        restore_from: &[RestoredInstance],
    ) -> Result<Self> {
        let memory = SlotMemory::of_slot(cfg, subtask, parallelism)?;
        Self::open_in(
            cfg,
            label,
            max_parallelism,
            (subtask, parallelism),
            restore,
            restore_from,
            memory,
        )
    }

    /// [`open`](Self::open) in slot `subtask % slots` of `slots`.
    pub(crate) fn open_in_slot(cfg: &RocksDbConfig, p: crate::BackendParams<'_>) -> Result<Self> {
        let memory = SlotMemory::of_slot(cfg, p.subtask, p.slots.max(p.parallelism))?;
        Self::open_in(
            cfg,
            p.label,
            p.max_parallelism,
            (p.subtask, p.parallelism),
            p.restore,
            p.restore_from,
            memory,
        )
    }

    fn open_in(
        cfg: &RocksDbConfig,
        label: &str,
        max_parallelism: usize,
        (subtask, parallelism): (usize, usize),
        restore: BTreeMap<String, KeyGroupBlobs>,
        restore_from: &[RestoredInstance],
        memory: Arc<SlotMemory>,
    ) -> Result<Self> {
        let store = RocksStore::open(
            cfg,
            label,
            max_parallelism,
            (subtask, parallelism),
            restore_from,
            memory,
        )?;
        Ok(RocksDbBackend {
            store: Rc::new(store),
            tables: BTreeMap::new(),
            restore,
            warned: std::cell::Cell::new(false),
        })
    }

    /// The instance's database directory.
    pub fn path(&self) -> &Path {
        &self.store.dir
    }

    /// A numeric RocksDB property of the instance, e.g. `rocksdb.block-cache-capacity`.
    #[cfg(test)]
    pub(crate) fn property(&self, name: &str) -> Option<u64> {
        self.store.db().property_int_value(name).ok().flatten()
    }
}

impl KeyedStateBackend for RocksDbBackend {
    fn name(&self) -> &'static str {
        "rocksdb"
    }

    fn register(&mut self, name: &str, table: Rc<dyn StateTableInfo>) -> Result<()> {
        let persistent = table.is_persistent();
        crate::register_table(&mut self.tables, &mut self.restore, name, table)?;
        if persistent {
            self.store.tables.set(self.store.tables.get() + 1);
            self.store.memory.add_tables(1);
        }
        Ok(())
    }

    fn entries(&self) -> usize {
        self.tables.values().map(|t| t.entries()).sum()
    }

    /// Heap tables (windows) by their entries; the database by RocksDB's estimate of its
    /// live data (`rocksdb.estimate-live-data-size`, from the SST files) plus its
    /// memtables (`rocksdb.cur-size-all-mem-tables`). Entries still in the write-back
    /// caches are not counted.
    fn live_bytes(&self) -> Option<u64> {
        let heap: u64 = self.tables.values().filter_map(|t| t.live_bytes()).sum();
        let db = self.store.db();
        let property = |name: &str| db.property_int_value(name).ok().flatten().unwrap_or(0);
        Some(
            heap + property("rocksdb.estimate-live-data-size")
                + property("rocksdb.cur-size-all-mem-tables"),
        )
    }

    fn snapshot(&self, id: CheckpointId) -> Result<BackendSnapshot> {
        // One snapshot at a time writes into the database.
        self.store.settle_inflight()?;
        let mut keyed = BTreeMap::new();
        let mut changes = Vec::new();
        for (name, t) in &self.tables {
            if t.is_persistent() {
                changes.extend(t.take_changes()?);
            } else {
                keyed.insert(name.clone(), t.snapshot(self.store.max_parallelism)?);
            }
        }
        // State in the database that no table declares stays there; restored heap state
        // (a checkpoint of the memory backend) is carried the same way.
        crate::carry_undeclared(&self.restore, &mut keyed, &self.warned);
        Ok(BackendSnapshot {
            keyed,
            files: Vec::new(),
            deferred: Some(self.store.snapshot_in_background(id, changes)?),
        })
    }

    fn store(&self) -> Option<Rc<dyn KvStore>> {
        Some(self.store.clone())
    }
}

#[path = "rocks_memtable.rs"]
mod memtable;

#[cfg(test)]
#[path = "rocks_timers_tests.rs"]
mod rocks_timers_tests;

#[cfg(test)]
#[path = "rocks_tests.rs"]
mod tests;
