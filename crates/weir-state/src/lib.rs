//! weir-state: keyed state backends.
//!
//! [`MemoryBackend`] keeps every table on the heap, typed, with no serialization on the
//! record path: the fastest choice for jobs whose state fits in memory. The RocksDB
//! backend (feature `rocksdb`, which applications turn on) keeps value, list and map state in RocksDB
//! behind a typed write-back cache and checkpoints incrementally; jobs pick a backend with
//! [`BackendKind`] and user code does not change.
#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::rc::Rc;
use weir_core::Result;
use weir_core::checkpoint::KeyGroupBlobs;
use weir_core::state::{BackendSnapshot, KeyedStateBackend, StateTableInfo, duplicate_state_name};

#[cfg(feature = "rocksdb")]
mod budget;
#[cfg(feature = "rocksdb")]
mod rocks;
#[cfg(feature = "rocksdb")]
mod rocks_options;
#[cfg(feature = "rocksdb")]
mod rocks_restore;
#[cfg(feature = "rocksdb")]
pub use budget::{
    DEFAULT_MEMORY_BUDGET_BYTES, MIN_ROCKSDB_BYTES_PER_SLOT, SlotMemoryUsage, SlotPlan,
    WRITE_BACK_ENTRY_BYTES, rocksdb_memory,
};
#[cfg(feature = "rocksdb")]
pub use rocks::{RocksDbBackend, RocksDbConfig, RocksStore};

/// Which keyed state backend a job uses.
#[derive(Debug, Clone, Default)]
pub enum BackendKind {
    /// Typed tables on the heap ([`MemoryBackend`]).
    #[default]
    Memory,
    /// RocksDB with a typed write-back cache ([`RocksDbBackend`]).
    #[cfg(feature = "rocksdb")]
    RocksDb(RocksDbConfig),
}

/// What a backend instance is created with.
pub struct BackendParams<'a> {
    /// Names the instance (operator and subtask), for its working directory.
    pub label: &'a str,
    /// Number of key groups.
    pub max_parallelism: usize,
    /// The subtask the backend serves.
    pub subtask: usize,
    /// The operator's parallelism.
    pub parallelism: usize,
    /// The job's slots (its largest parallelism): the RocksDB memory budget is split over
    /// them, and subtask `i` of every operator shares slot `i`'s part.
    pub slots: usize,
    /// Restored heap tables: name → entries per key group.
    pub restore: BTreeMap<String, KeyGroupBlobs>,
    /// The old subtasks' persistent-backend instances to restore from (those whose key
    /// groups overlap this subtask's), their files on local disk.
    pub restore_from: &'a [weir_core::checkpoint::RestoredInstance],
}

impl BackendKind {
    /// Parses a backend name as users write it (`memory`).
    ///
    /// ```
    /// use weir_state::BackendKind;
    /// assert!(matches!(BackendKind::parse("memory").unwrap(), BackendKind::Memory));
    /// assert!(BackendKind::parse("redis").unwrap_err().to_string().contains("memory"));
    /// ```
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "memory" | "heap" => Ok(BackendKind::Memory),
            #[cfg(feature = "rocksdb")]
            "rocksdb" => Ok(BackendKind::RocksDb(RocksDbConfig::default())),
            other => Err(weir_core::Error::Config(format!(
                "unknown state backend '{other}'; available: memory, rocksdb{}",
                if cfg!(feature = "rocksdb") {
                    ""
                } else {
                    " (build weir-state with the `rocksdb` feature)"
                }
            ))),
        }
    }

    /// The backend's name as users write it.
    pub fn name(&self) -> &'static str {
        match self {
            BackendKind::Memory => "memory",
            #[cfg(feature = "rocksdb")]
            BackendKind::RocksDb(_) => "rocksdb",
        }
    }

    /// True when a restore may use the local copy a previous process kept of the
    /// checkpoint instead of fetching its files (`RocksDbConfig::local_recovery`); the
    /// memory backend keeps no files.
    ///
    /// ```
    /// use weir_state::BackendKind;
    /// assert!(!BackendKind::Memory.local_recovery());
    /// ```
    pub fn local_recovery(&self) -> bool {
        match self {
            BackendKind::Memory => false,
            #[cfg(feature = "rocksdb")]
            BackendKind::RocksDb(cfg) => cfg.local_recovery,
        }
    }

    /// Creates a backend instance for one operator subtask, loaded with its restored state.
    pub fn create(&self, p: BackendParams<'_>) -> Result<Box<dyn KeyedStateBackend>> {
        match self {
            BackendKind::Memory => {
                if !p.restore_from.is_empty() {
                    return Err(weir_core::Error::Config(format!(
                        "operator {} is restored from a checkpoint whose keyed state is in RocksDB files, but \
                         the job now uses the memory backend, which cannot read them; run the job with the \
                         rocksdb backend to restore it",
                        p.label
                    )));
                }
                Ok(Box::new(MemoryBackend::new(p.max_parallelism, p.restore)))
            }
            #[cfg(feature = "rocksdb")]
            BackendKind::RocksDb(cfg) => Ok(Box::new(RocksDbBackend::open_in_slot(cfg, p)?)),
        }
    }
}

/// Registers `table` under a unique `name`, loading its restored entries first.
///
/// Entries that do not decode fail naming the state
/// ([`weir_core::state::state_type_changed`]): a restart cannot help.
pub(crate) fn register_table(
    tables: &mut BTreeMap<String, Rc<dyn StateTableInfo>>,
    restore: &mut BTreeMap<String, KeyGroupBlobs>,
    name: &str,
    table: Rc<dyn StateTableInfo>,
) -> Result<()> {
    if tables.contains_key(name) {
        return Err(duplicate_state_name(name));
    }
    if let Some(blobs) = restore.remove(name) {
        table
            .restore(&blobs)
            .map_err(|e| weir_core::state::state_type_changed(name, e))?;
    }
    tables.insert(name.to_string(), table);
    Ok(())
}

/// Adds to a snapshot's `keyed` tables the restored keyed state that no table of the
/// operator declared (`restore` holds what registration left): a state that the new job
/// version renamed or no longer has. It is kept in every checkpoint as it was restored,
/// by key group (a rescale splits it like the rest), so the job version that declares it
/// again, or the older version rolled back to, finds it. `warned` makes the warning that
/// names such state come once per subtask. In-flight records of unaligned checkpoints
/// ([`CHANNEL_STATE_TABLE`](weir_core::exchange::CHANNEL_STATE_TABLE)) are the runtime's,
/// not state: never carried.
pub(crate) fn carry_undeclared(
    restore: &BTreeMap<String, KeyGroupBlobs>,
    keyed: &mut BTreeMap<String, KeyGroupBlobs>,
    warned: &std::cell::Cell<bool>,
) {
    let undeclared: Vec<(&String, &KeyGroupBlobs)> = restore
        .iter()
        .filter(|(name, blobs)| {
            name.as_str() != weir_core::exchange::CHANNEL_STATE_TABLE && !blobs.is_empty()
        })
        .collect();
    if undeclared.is_empty() {
        return;
    }
    if !warned.replace(true) {
        let names: Vec<&str> = undeclared.iter().map(|(n, _)| n.as_str()).collect();
        tracing::warn!(
            states = ?names,
            "the checkpoint holds keyed state that this operator does not declare (renamed, or \
             no longer used): it is kept in every checkpoint as it was, unused, and a job \
             version that declares it again finds it"
        );
    }
    for (name, blobs) in undeclared {
        keyed.insert(name.clone(), blobs.clone());
    }
}

/// The in-memory keyed state backend: one typed hash map per state.
///
/// ```
/// use weir_core::state::{KeyContext, StateContext};
/// use weir_state::MemoryBackend;
/// let key = KeyContext::<u64>::new();
/// let mut ctx = StateContext::new(key.clone(), Box::new(MemoryBackend::default()));
/// let mut count = ctx.value_state::<u64>("count").unwrap();
/// key.set(7);
/// count.set(3).unwrap();
/// assert_eq!(ctx.entries(), 1);
/// assert!(ctx.value_state::<u64>("count").is_err(), "names are unique per operator");
/// ```
pub struct MemoryBackend {
    tables: BTreeMap<String, Rc<dyn StateTableInfo>>,
    max_parallelism: usize,
    /// Restored state not (yet) registered: loaded into its table when it is, carried
    /// into snapshots as it is otherwise ([`carry_undeclared`]).
    restore: BTreeMap<String, KeyGroupBlobs>,
    /// The warning about undeclared state was logged.
    warned: std::cell::Cell<bool>,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new(weir_core::data::DEFAULT_MAX_PARALLELISM, BTreeMap::new())
    }
}

impl MemoryBackend {
    /// A backend over `max_parallelism` key groups that loads `restore` into each table
    /// when the table is registered.
    pub fn new(max_parallelism: usize, restore: BTreeMap<String, KeyGroupBlobs>) -> Self {
        MemoryBackend {
            tables: BTreeMap::new(),
            max_parallelism,
            restore,
            warned: std::cell::Cell::new(false),
        }
    }
}

impl KeyedStateBackend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn register(&mut self, name: &str, table: Rc<dyn StateTableInfo>) -> Result<()> {
        register_table(&mut self.tables, &mut self.restore, name, table)
    }

    fn snapshot(&self, _id: weir_core::ids::CheckpointId) -> Result<BackendSnapshot> {
        let mut keyed = self
            .tables
            .iter()
            .map(|(n, t)| Ok((n.clone(), t.snapshot(self.max_parallelism)?)))
            .collect::<Result<_>>()?;
        carry_undeclared(&self.restore, &mut keyed, &self.warned);
        Ok(BackendSnapshot {
            keyed,
            files: Vec::new(),
            deferred: None,
        })
    }

    fn entries(&self) -> usize {
        self.tables.values().map(|t| t.entries()).sum()
    }

    fn live_bytes(&self) -> Option<u64> {
        Some(self.tables.values().filter_map(|t| t.live_bytes()).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Restored keyed state that no table declares is written into every snapshot as it
    /// was restored; in-flight records of an unaligned checkpoint, and state with no
    /// entries in this subtask's key groups, are not.
    #[test]
    fn undeclared_state_is_carried_into_every_snapshot() {
        let restore: BTreeMap<String, KeyGroupBlobs> = [
            (
                "renamed".to_string(),
                vec![(3, b"x".to_vec()), (9, b"y".to_vec())],
            ),
            (
                weir_core::exchange::CHANNEL_STATE_TABLE.to_string(),
                vec![(0, b"in-flight".to_vec())],
            ),
            ("elsewhere".to_string(), Vec::new()),
        ]
        .into_iter()
        .collect();
        let backend = MemoryBackend::new(128, restore);
        for id in 1..=2 {
            let snap = backend.snapshot(weir_core::ids::CheckpointId(id)).unwrap();
            let tables: Vec<(&str, &KeyGroupBlobs)> =
                snap.keyed.iter().map(|(n, b)| (n.as_str(), b)).collect();
            assert_eq!(
                tables,
                vec![("renamed", &vec![(3, b"x".to_vec()), (9, b"y".to_vec())])],
                "checkpoint {id}"
            );
        }
    }
}
