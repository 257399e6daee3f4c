//! weir-state: keyed state backends.
//!
//! [`MemoryBackend`] keeps every table on the heap, typed, with no serialization on the
//! record path: the fastest choice for jobs whose state fits in memory. A RocksDB backend
//! (behind a default feature) joins it with the checkpoint work; jobs pick a backend with
//! [`BackendKind`] and user code does not change.
#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::rc::Rc;
use weir_core::Result;
use weir_core::checkpoint::KeyGroupBlobs;
use weir_core::state::{KeyedStateBackend, StateTableInfo, duplicate_state_name};

/// Which keyed state backend a job uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// Typed tables on the heap ([`MemoryBackend`]).
    #[default]
    Memory,
}

impl BackendKind {
    /// Parses a backend name as users write it (`memory`).
    ///
    /// ```
    /// use weir_state::BackendKind;
    /// assert_eq!(BackendKind::parse("memory").unwrap(), BackendKind::Memory);
    /// assert!(BackendKind::parse("redis").unwrap_err().to_string().contains("memory"));
    /// ```
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "memory" | "heap" => Ok(BackendKind::Memory),
            other => Err(weir_core::Error::Config(format!(
                "unknown state backend '{other}'; available: memory (rocksdb arrives with checkpoints)"
            ))),
        }
    }

    /// Creates a backend instance for one operator subtask; `restore` holds the keyed
    /// state (table name → entries per key group) it starts from.
    pub fn create(
        self,
        max_parallelism: usize,
        restore: BTreeMap<String, KeyGroupBlobs>,
    ) -> Box<dyn KeyedStateBackend> {
        match self {
            BackendKind::Memory => Box::new(MemoryBackend::new(max_parallelism, restore)),
        }
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
    restore: BTreeMap<String, KeyGroupBlobs>,
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
        }
    }
}

impl KeyedStateBackend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn register(&mut self, name: &str, table: Rc<dyn StateTableInfo>) -> Result<()> {
        if self.tables.contains_key(name) {
            return Err(duplicate_state_name(name));
        }
        if let Some(blobs) = self.restore.remove(name) {
            table.restore(&blobs)?;
        }
        self.tables.insert(name.to_string(), table);
        Ok(())
    }

    fn snapshot(&self) -> Result<BTreeMap<String, KeyGroupBlobs>> {
        self.tables
            .iter()
            .map(|(n, t)| Ok((n.clone(), t.snapshot(self.max_parallelism)?)))
            .collect()
    }

    fn entries(&self) -> usize {
        self.tables.values().map(|t| t.entries()).sum()
    }
}
