//! The backends under test, opened, checkpointed and restored the way the runtime does it:
//! a checkpoint's heap tables by key group, its store files copied to a directory, a
//! restore at any parallelism given every old subtask's checkpoint.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;
use weir_core::checkpoint::{KeyGroupBlobs, LocalFile, RestoredInstance};
use weir_core::data::key_group_range;
use weir_core::ids::CheckpointId;
use weir_core::state::{KeyContext, KeyedStateBackend, StateContext};
use weir_state::MemoryBackend;

/// Key groups of every test.
pub const MAX_PARALLELISM: usize = 128;

/// What a checkpoint of one subtask's keyed state left behind.
pub struct Snap {
    keyed: BTreeMap<String, KeyGroupBlobs>,
    /// The store's files, copied away (persistent backends). The suite does not note
    /// which key groups the subtask owned: all of them, as far as the restore knows
    /// (the files hold only the subtask's own).
    files: Option<RestoredInstance>,
}

/// A backend the suite runs against.
pub trait Harness {
    /// A new instance of subtask `subtask` of `parallelism`, restored from the
    /// checkpoints of all old subtasks in `restore` (they hold only their key groups).
    fn backend(
        &self,
        subtask: usize,
        parallelism: usize,
        restore: &[Snap],
    ) -> Box<dyn KeyedStateBackend>;
    /// A temporary directory that lives as long as the harness.
    fn tmp(&self) -> &Path;
}

/// The heap tables of `snaps` restricted to the key groups of `range`, as the runtime
/// hands them to a restored subtask.
fn keyed_for(snaps: &[Snap], range: std::ops::Range<u32>) -> BTreeMap<String, KeyGroupBlobs> {
    let mut out: BTreeMap<String, KeyGroupBlobs> = BTreeMap::new();
    for s in snaps {
        for (name, blobs) in &s.keyed {
            out.entry(name.clone())
                .or_default()
                .extend(blobs.iter().filter(|(g, _)| range.contains(g)).cloned());
        }
    }
    out
}

/// Opens subtask `subtask` of `parallelism` of the harness's backend.
pub fn open<H: Harness>(
    h: &H,
    subtask: usize,
    parallelism: usize,
    restore: &[Snap],
) -> (Rc<KeyContext<u64>>, StateContext<u64>) {
    let key = KeyContext::<u64>::new();
    let backend = h.backend(subtask, parallelism, restore);
    (key.clone(), StateContext::new(key, backend))
}

thread_local! {
    static SNAPS: Cell<u64> = const { Cell::new(0) };
}

/// Checkpoints `ctx` as checkpoint `id`, and copies its store files away as checkpoint
/// storage would.
pub fn checkpoint<H: Harness>(h: &H, ctx: &StateContext<u64>, id: u64) -> Snap {
    let hooks = ctx.hooks();
    let mut snap = hooks.borrow_mut().snapshot(CheckpointId(id)).unwrap();
    snap.resolve_files().unwrap();
    let dir = (!snap.files.is_empty()).then(|| {
        let n = SNAPS.with(|c| {
            c.set(c.get() + 1);
            c.get()
        });
        let dir = h.tmp().join(format!("snap-{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut files = Vec::new();
        for f in &snap.files {
            let path = dir.join(f.path.file_name().unwrap());
            std::fs::copy(&f.path, &path).unwrap();
            files.push(LocalFile {
                path,
                name: f.name.clone(),
                shared: f.shared,
            });
        }
        RestoredInstance {
            key_groups: 0..MAX_PARALLELISM as u32,
            files,
            local_copy: false,
        }
    });
    Snap {
        keyed: snap.keyed,
        files: dir,
    }
}

/// The memory backend.
pub struct Memory(tempfile::TempDir);

impl Memory {
    pub fn new() -> Self {
        Memory(tempfile::tempdir().unwrap())
    }
}

impl Harness for Memory {
    fn backend(
        &self,
        subtask: usize,
        parallelism: usize,
        restore: &[Snap],
    ) -> Box<dyn KeyedStateBackend> {
        let range = key_group_range(subtask, MAX_PARALLELISM, parallelism);
        Box::new(MemoryBackend::new(
            MAX_PARALLELISM,
            keyed_for(restore, range),
        ))
    }
    fn tmp(&self) -> &Path {
        self.0.path()
    }
}

/// The RocksDB backend, with real databases in a temporary directory and a write-back
/// cache of `cache_entries` entries per state.
#[cfg(feature = "rocksdb")]
pub struct Rocks {
    tmp: tempfile::TempDir,
    cache_entries: usize,
}

#[cfg(feature = "rocksdb")]
impl Rocks {
    /// A cache far smaller than the tests' state: every few writes write back and evict.
    pub fn new() -> Self {
        Rocks::with_cache(16)
    }
    pub fn with_cache(cache_entries: usize) -> Self {
        Rocks {
            tmp: tempfile::tempdir().unwrap(),
            cache_entries,
        }
    }
}

#[cfg(feature = "rocksdb")]
impl Harness for Rocks {
    fn backend(
        &self,
        subtask: usize,
        parallelism: usize,
        restore: &[Snap],
    ) -> Box<dyn KeyedStateBackend> {
        let cfg = weir_state::RocksDbConfig {
            local_dir: self.tmp.path().join("local"),
            cache_entries: self.cache_entries,
            ..weir_state::RocksDbConfig::default()
        };
        let range = key_group_range(subtask, MAX_PARALLELISM, parallelism);
        let from: Vec<RestoredInstance> = restore.iter().filter_map(|s| s.files.clone()).collect();
        Box::new(
            weir_state::RocksDbBackend::open(
                &cfg,
                &format!("op1-{subtask}"),
                MAX_PARALLELISM,
                subtask,
                parallelism,
                keyed_for(restore, range),
                &from,
            )
            .unwrap(),
        )
    }
    fn tmp(&self) -> &Path {
        self.tmp.path()
    }
}
