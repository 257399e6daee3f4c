//! Restoring a RocksDB instance from a checkpoint's SST files.
//!
//! Owns how a new instance is made out of the old subtasks' instances: it never re-inserts
//! entries one by one. The old instance whose key groups overlap the new subtask's most is
//! the base: its files are hard-linked (copied across file systems) into the new database
//! directory and opened as they are. Without a change of parallelism that is all. With
//! one, the base is clipped to the subtask's key groups (whole files outside them are
//! dropped, the rest deleted by range, and those ranges compacted away in the background
//! once the instance runs and the process's other restores are done), and every other
//! overlapping instance is opened read-only, its entries of those key groups written to
//! SST files with `SstFileWriter`, several parts at once, and ingested (their keys overlap
//! no live key of the base). This is how Flink's RocksDB backend restores incrementally.
//!
//! Every key of every column family starts with its 2-byte big-endian key group; the
//! clipping relies on it. An instance encodes its state keys one way for its whole life
//! ([`KeyEncoding`]); each checkpoint names it in a small file, [`KEY_ENCODING_FILE`], and
//! the instance restored takes the encoding of the instances it is made of. Fetching the
//! files from checkpoint storage, and local recovery, are the runtime's; the snapshot
//! itself is `rocks.rs`'s.

use crate::rocks::{err, io};
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use weir_core::checkpoint::RestoredInstance;
use weir_core::state::KeyEncoding;
use weir_core::{Error, Result};

/// The file of an instance's checkpoint that names how its state keys are encoded
/// ([`KeyEncoding::name`]). A checkpoint without one was written before weir had it:
/// its keys are [`KeyEncoding::LittleEndian`].
pub(crate) const KEY_ENCODING_FILE: &str = "WEIR-KEY-ENCODING";

/// The SST files an instance was restored with and kept as they were: local name →
/// (name in checkpoint storage, size). A checkpoint names such a file as storage already
/// does, so it is not stored again (RocksDB never reuses a file number, and the size is
/// checked as well).
#[derive(Debug, Default)]
pub(crate) struct Restored {
    files: HashMap<String, (String, u64)>,
    /// Ranges the restore deleted (column family, from, to), to compact away in the
    /// background once the instance runs.
    pub(crate) compact: Vec<DeletedRange>,
    /// How the restored instance's keys are encoded (a new instance: the default).
    pub(crate) key_encoding: KeyEncoding,
}

impl Restored {
    /// The name in checkpoint storage of the local SST file `file` of `size` bytes, when
    /// the instance was restored with it.
    pub(crate) fn stored_name(&self, file: &str, size: u64) -> Option<String> {
        self.files
            .get(file)
            .filter(|(_, s)| *s == size)
            .map(|(name, _)| name.clone())
    }
}

/// A key range a restore deleted: column family, from, to (exclusive).
pub(crate) type DeletedRange = (String, Vec<u8>, Vec<u8>);

/// The first key of key group `g` (and the end of the keys of `g - 1`).
fn group_key(g: u32) -> Vec<u8> {
    match u16::try_from(g) {
        Ok(g) => g.to_be_bytes().to_vec(),
        // Past the last possible key group: above every key.
        Err(_) => vec![0xFF, 0xFF, 0xFF],
    }
}

/// Above every key (key groups stay below 0x8000).
const END: &[u8] = &[0xFF, 0xFF, 0xFF];

fn overlap(a: &Range<u32>, b: &Range<u32>) -> Range<u32> {
    a.start.max(b.start)..a.end.min(b.end)
}

/// Every column family of `names`, each with `opts`.
///
/// `DB::open_cf` and its read-only twin give each named column family RocksDB's default
/// options instead: a block cache of its own (32 MiB per instance, outside the memory
/// budget), no bloom filters, 64 MiB memtables.
fn descriptors(opts: &rocksdb::Options, names: &[String]) -> Vec<rocksdb::ColumnFamilyDescriptor> {
    names
        .iter()
        .map(|name| rocksdb::ColumnFamilyDescriptor::new(name, opts.clone()))
        .collect()
}

/// Opens the database at `dir` with every column family it has (a new one: `default`),
/// all with the instance's options.
fn open_db(
    opts: &rocksdb::Options,
    dir: &Path,
) -> std::result::Result<rocksdb::DB, rocksdb::Error> {
    let cfs = rocksdb::DB::list_cf(opts, dir).unwrap_or_else(|_| vec!["default".to_string()]);
    rocksdb::DB::open_cf_descriptors(opts, dir, descriptors(opts, &cfs))
}

/// The failure of RocksDB's `what` on the restored files of `from` (at `path`).
///
/// When RocksDB finds the files corrupt, incomplete or unfit (a bad block or table, a file
/// its manifest names that is not there, options it cannot open them with), the
/// checkpoint's state cannot be restored: [`Error::Unrestorable`], on which the job falls
/// back to an older checkpoint instead of restoring this one again and again. Unless the
/// files are the local copy of local recovery, which may be what is damaged: then, as for
/// an operating-system failure (a full disk), the next attempt tries again, and fetches
/// the files from checkpoint storage.
fn restore_failed(from: &RestoredInstance, what: &str, path: &Path, e: rocksdb::Error) -> Error {
    use rocksdb::ErrorKind as K;
    let the_files = matches!(
        e.kind(),
        K::Corruption | K::NotFound | K::InvalidArgument | K::NotSupported
    ) || (e.kind() == K::IOError
        && e.as_ref().contains("No such file or directory"));
    let message = format!(
        "restoring RocksDB state of key groups {:?} from the checkpoint's files failed: \
         RocksDB {what} {}: {e}",
        from.key_groups,
        path.display()
    );
    if the_files {
        files_failed(from, message)
    } else {
        Error::User(message)
    }
}

/// A failure (`message`) of the restored files of `from` themselves, which restoring the
/// same files again would repeat: [`Error::Unrestorable`], unless they are the local copy
/// of local recovery (see [`restore_failed`]).
fn files_failed(from: &RestoredInstance, message: String) -> Error {
    if from.local_copy {
        Error::User(format!(
            "{message} (these files are the local copy kept for local recovery; the next \
             attempt fetches them from checkpoint storage)"
        ))
    } else {
        Error::Unrestorable(message)
    }
}

/// Makes the instance at `dir` (under the instance's `root`) for key groups `range` out of
/// `instances`; returns it and the files it kept as they were.
pub(crate) fn restore(
    opts: &rocksdb::Options,
    root: &Path,
    dir: &Path,
    range: Range<u32>,
    instances: &[RestoredInstance],
    partitioned: bool,
) -> Result<(rocksdb::DB, Restored)> {
    let mut overlapping: Vec<&RestoredInstance> = instances
        .iter()
        .filter(|i| !overlap(&i.key_groups, &range).is_empty())
        .collect();
    // The base: the most key groups in common (the lowest on a tie).
    overlapping.sort_by_key(|i| {
        let o = overlap(&i.key_groups, &range);
        (std::cmp::Reverse(o.end - o.start), i.key_groups.start)
    });
    let Some((base, others)) = overlapping.split_first() else {
        let db = open_db(opts, dir).map_err(|e| err("open", dir, e))?;
        return Ok((db, Restored::default()));
    };
    let key_encoding = key_encoding_of(base)?;
    for other in others {
        let theirs = key_encoding_of(other)?;
        if theirs != key_encoding {
            return Err(Error::User(format!(
                "restoring RocksDB state of key groups {range:?}: the old instances of key \
                 groups {:?} and {:?} encode their keys differently ({} and {}), so they \
                 cannot be merged; restore the checkpoint at its own parallelism ({} \
                 instances) first",
                base.key_groups,
                other.key_groups,
                key_encoding.name(),
                theirs.name(),
                instances.len()
            )));
        }
    }
    let started = std::time::Instant::now();
    let _restoring = Restoring::start();
    let mut restored = place(base, dir)?;
    restored.key_encoding = key_encoding;
    let mut db = open_db(opts, dir).map_err(|e| restore_failed(base, "open", dir, e))?;
    restored.compact = clip(&db, dir, &base.key_groups, &range)?;
    for (i, other) in others.iter().enumerate() {
        let groups = overlap(&other.key_groups, &range);
        let n = ingest(&mut db, opts, root, (i, other), groups, partitioned)?;
        tracing::debug!(from = ?other.key_groups, entries = n, "ingested the key groups of another old instance");
    }
    tracing::info!(
        key_groups = ?range,
        base = ?base.key_groups,
        others = others.len(),
        files = restored.files.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "restored RocksDB instance from checkpoint files"
    );
    Ok((db, restored))
}

/// Links (or copies) the files of `from` into the new directory `dir` under their local
/// names.
fn place(from: &RestoredInstance, dir: &Path) -> Result<Restored> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut restored = HashMap::new();
    for f in &from.files {
        let local = f.path.file_name().ok_or_else(|| {
            Error::Config(format!(
                "checkpoint file {} has no file name ({})",
                f.name,
                f.path.display()
            ))
        })?;
        let target = dir.join(local);
        let size = match std::fs::metadata(&f.path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let message = format!(
                    "restoring RocksDB state of key groups {:?}: file {} of the checkpoint \
                     (stored as {}) is missing",
                    from.key_groups,
                    f.path.display(),
                    f.name
                );
                return Err(files_failed(from, message));
            }
            Err(e) => return Err(Error::io(f.path.display(), e)),
        };
        if std::fs::hard_link(&f.path, &target).is_err() {
            std::fs::copy(&f.path, &target).map_err(io(&f.path))?;
        }
        let local = local.to_string_lossy().into_owned();
        if f.shared && local.ends_with(".sst") {
            restored.insert(local, (f.name.clone(), size));
        }
    }
    Ok(Restored {
        files: restored,
        compact: Vec::new(),
        key_encoding: KeyEncoding::default(),
    })
}

/// How the old instance's keys are encoded: what its [`KEY_ENCODING_FILE`] names, or,
/// without one, [`KeyEncoding::LittleEndian`] (a checkpoint from before the file).
fn key_encoding_of(instance: &RestoredInstance) -> Result<KeyEncoding> {
    let Some(file) = instance
        .files
        .iter()
        .find(|f| f.path.file_name().is_some_and(|n| n == KEY_ENCODING_FILE))
    else {
        return Ok(KeyEncoding::LittleEndian);
    };
    let text = std::fs::read_to_string(&file.path).map_err(io(&file.path))?;
    KeyEncoding::parse(&text).ok_or_else(|| {
        Error::User(format!(
            "restoring RocksDB state of key groups {:?}: checkpoint file {} names the key \
             encoding {:?}, which this weir build does not know; restore the checkpoint \
             with the weir release that wrote it",
            instance.key_groups,
            file.name,
            text.trim()
        ))
    })
}

/// Removes from `db` (the base, which owned `had`) every key group outside `keep`: files
/// wholly outside are dropped, the rest deleted by range (range tombstones: reads skip
/// them at once). Returns, per column family, the span of the ranges deleted, to compact
/// away in the background, as Flink does after a rescale: compacting them here would
/// rewrite every file that spans the subtask's key groups and the others (most of them),
/// before the first record. One span, not one compaction per range: universal
/// compaction merges every run of a column family whatever range it is asked for
/// (decision 0064), so a second range would merge it all again.
fn clip(
    db: &rocksdb::DB,
    dir: &Path,
    had: &Range<u32>,
    keep: &Range<u32>,
) -> Result<Vec<DeletedRange>> {
    let mut ranges = Vec::new();
    if had.start < keep.start {
        ranges.push((Vec::new(), group_key(keep.start)));
    }
    if had.end > keep.end {
        ranges.push((group_key(keep.end), END.to_vec()));
    }
    let mut compact = Vec::new();
    if ranges.is_empty() {
        return Ok(compact);
    }
    let mut write = rocksdb::WriteOptions::default();
    write.disable_wal(true);
    let cfs = rocksdb::DB::list_cf(&rocksdb::Options::default(), dir)
        .unwrap_or_else(|_| vec!["default".to_string()]);
    for name in &cfs {
        let cf = db
            .cf_handle(name)
            .ok_or_else(|| Error::Config(format!("internal: column family {name} not open")))?;
        for (from, to) in &ranges {
            db.delete_file_in_range_cf(cf, from, to)
                .map_err(|e| err("drop files outside the key groups", dir, e))?;
            db.delete_range_cf_opt(cf, from, to, &write)
                .map_err(|e| err("delete outside the key groups", dir, e))?;
        }
        // The ranges are in key order: the first starts the span, the last ends it.
        compact.push((
            name.clone(),
            ranges[0].0.clone(),
            ranges[ranges.len() - 1].1.clone(),
        ));
    }
    Ok(compact)
}

/// Restores ([`restore`]) running in this process now, and the signal of their end.
static RESTORING: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// One restore running, from its start to its end (or its failure).
struct Restoring(());

impl Restoring {
    fn start() -> Self {
        *RESTORING.0.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        Restoring(())
    }
}

impl Drop for Restoring {
    fn drop(&mut self) {
        let mut n = RESTORING.0.lock().unwrap_or_else(|e| e.into_inner());
        *n -= 1;
        if *n == 0 {
            RESTORING.1.notify_all();
        }
    }
}

/// Returns once no restore runs in this process. A rescale's compaction of what its clip
/// deleted rewrites the whole instance (universal compaction merges every run, decision
/// 0064); started while another instance of the same rescale still writes the key groups
/// it ingests, it took the core that ingest needed (10 GB, 2 → 3 on 2 cores: the restore
/// of the instance that ingests took 9 s, with the compactions of the other two beside
/// it). See docs/decisions/0066-rescale-ingests-first.md.
fn wait_for_restores() {
    let n = RESTORING.0.lock().unwrap_or_else(|e| e.into_inner());
    let _n = RESTORING.1.wait_while(n, |n| *n > 0);
}

/// Compacts the ranges a rescale deleted (see [`clip`]), on a background thread, once no
/// restore runs in the process; the instance waits for it before it closes.
pub(crate) fn compact_in_background(
    db: &std::sync::Arc<rocksdb::DB>,
    ranges: Vec<DeletedRange>,
) -> Option<std::thread::JoinHandle<()>> {
    if ranges.is_empty() {
        return None;
    }
    let db = db.clone();
    std::thread::Builder::new()
        .name("weir-rocksdb-clip".into())
        .spawn(move || {
            wait_for_restores();
            let started = std::time::Instant::now();
            for (cf, from, to) in &ranges {
                if let Some(cf) = db.cf_handle(cf) {
                    db.compact_range_cf(cf, Some(from), Some(to));
                }
            }
            tracing::debug!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "compacted the key groups a rescale removed"
            );
        })
        .ok()
}

/// Ingests into `db` the entries of key groups `groups` of `other`: its files are placed in
/// a scratch directory, opened read-only, and the entries of each column family written to
/// SST files, one per part of `groups` ([`split`]), the parts at once, then ingested
/// together. Returns the number of entries.
fn ingest(
    db: &mut rocksdb::DB,
    opts: &rocksdb::Options,
    root: &Path,
    (i, other): (usize, &RestoredInstance),
    groups: Range<u32>,
    partitioned: bool,
) -> Result<u64> {
    let scratch = root.join(format!("restore-{i}"));
    let result = (|| {
        place(other, &scratch)?;
        let failed = |what, e| restore_failed(other, what, &scratch, e);
        let cfs = rocksdb::DB::list_cf(opts, &scratch).map_err(|e| failed("open", e))?;
        let src = rocksdb::DB::open_cf_descriptors_read_only(
            opts,
            &scratch,
            descriptors(opts, &cfs),
            false,
        )
        .map_err(|e| failed("open", e))?;
        let mut n = 0;
        for name in &cfs {
            if db.cf_handle(name).is_none() {
                db.create_cf(name, opts)
                    .map_err(|e| err("create column family", &scratch, e))?;
            }
            let cf = src
                .cf_handle(name)
                .ok_or_else(|| Error::Config(format!("internal: column family {name} not open")))?;
            let parts = split(&groups, ingest_writers());
            let paths: Vec<PathBuf> = (0..parts.len())
                .map(|j| root.join(format!("restore-{i}-{name}-{j}.sst")))
                .collect();
            let written = write_parts((&src, other), cf, &parts, &paths, partitioned);
            let ingested = written.and_then(|written| {
                let files: Vec<&PathBuf> = paths
                    .iter()
                    .zip(&written)
                    .filter(|(_, w)| **w > 0)
                    .map(|(p, _)| p)
                    .collect();
                if !files.is_empty() {
                    let mut ingest = rocksdb::IngestExternalFileOptions::default();
                    ingest.set_move_files(true);
                    let target = db.cf_handle(name).expect("created above");
                    db.ingest_external_file_cf_opts(target, &ingest, files)
                        .map_err(|e| err("ingest", root, e))?;
                }
                Ok(written.iter().sum::<u64>())
            });
            for path in &paths {
                let _ = std::fs::remove_file(path);
            }
            n += ingested?;
        }
        Ok(n)
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// Parts an ingest cuts its key groups into, each written to its own SST file on its own
/// thread: one per core, up to 4. Writing one file alone was bound by one core (encoding,
/// LZ4, copying into the page cache) while the other waited.
fn ingest_writers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// `groups` cut into at most `parts` ranges of consecutive key groups, in order, as even
/// as whole key groups allow; none empty.
pub(crate) fn split(groups: &Range<u32>, parts: usize) -> Vec<Range<u32>> {
    let len = groups.end.saturating_sub(groups.start) as usize;
    let parts = parts.clamp(1, len.max(1));
    (0..parts)
        .map(|j| {
            let at = |j: usize| groups.start + (len * j / parts) as u32;
            at(j)..at(j + 1)
        })
        .filter(|r| !r.is_empty())
        .collect()
}

/// Writes each part of `parts` to its file of `paths`, on a thread each; the entries
/// written to each (none: no file).
fn write_parts(
    (src, from): (&rocksdb::DB, &RestoredInstance),
    cf: &rocksdb::ColumnFamily,
    parts: &[Range<u32>],
    paths: &[PathBuf],
    partitioned: bool,
) -> Result<Vec<u64>> {
    if let ([part], [path]) = (parts, paths) {
        return Ok(vec![write_sst((src, from), cf, part, path, partitioned)?]);
    }
    std::thread::scope(|scope| {
        let writers: Vec<_> = parts
            .iter()
            .zip(paths)
            .map(|(part, path)| {
                std::thread::Builder::new()
                    .name("weir-restore-ingest".into())
                    .spawn_scoped(scope, move || {
                        write_sst((src, from), cf, part, path, partitioned)
                    })
                    .map_err(|e| Error::io(path.display(), e))
            })
            .collect();
        writers
            .into_iter()
            .map(|w| {
                w?.join().unwrap_or_else(|_| {
                    Err(Error::User(format!(
                        "restoring RocksDB state of key groups {:?}: writing an SST file \
                         of the ingested key groups panicked",
                        from.key_groups
                    )))
                })
            })
            .collect()
    })
}

/// Writes the entries of key groups `groups` of column family `cf` of `src` (restored from
/// `from`) to the SST file
/// `path`; the number written (none: no file).
fn write_sst(
    (src, from): (&rocksdb::DB, &RestoredInstance),
    cf: &rocksdb::ColumnFamily,
    groups: &Range<u32>,
    path: &Path,
    partitioned: bool,
) -> Result<u64> {
    let mut read = rocksdb::ReadOptions::default();
    read.set_iterate_upper_bound(group_key(groups.end));
    // A bulk read: keep these blocks out of the cache.
    read.fill_cache(false);
    let start = group_key(groups.start);
    let iter = src.iterator_cf_opt(
        cf,
        read,
        rocksdb::IteratorMode::From(&start, rocksdb::Direction::Forward),
    );
    let mut opts = rocksdb::Options::default();
    opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
    opts.set_block_based_table_factory(&crate::rocks_options::table_options(partitioned));
    let mut writer = rocksdb::SstFileWriter::create(&opts);
    let mut n = 0u64;
    for item in iter {
        let (k, v) = item.map_err(|e| restore_failed(from, "read", src.path(), e))?;
        if n == 0 {
            writer
                .open(path)
                .map_err(|e| err("create SST file", path, e))?;
        }
        writer
            .put(&k, &v)
            .map_err(|e| err("write SST file", path, e))?;
        n += 1;
    }
    if n > 0 {
        writer
            .finish()
            .map_err(|e| err("finish SST file", path, e))?;
    }
    Ok(n)
}

#[cfg(test)]
pub(crate) mod tests;
