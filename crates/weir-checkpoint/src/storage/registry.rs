//! The in-process registry of a checkpoint storage: which checkpoints are being written
//! (so that retention never deletes a directory or a shared file a live writer still
//! needs), and which shared files this process knows to be stored (so that a writer reuses
//! one without reading it, and never one that retention deleted since).
//!
//! Shared by every clone of a [`CheckpointStorage`](super::CheckpointStorage) behind one
//! lock; holds no files and does no I/O. The writer and retention keep it up to date.

use super::manifest::FileEntry;
use crate::error::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// What this process knows of its storage directory, under one lock.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    next_token: AtomicU64,
    books: Mutex<Books>,
}

/// The registry's contents.
#[derive(Debug, Default)]
pub(crate) struct Books {
    /// Checkpoints being written, by writer token.
    pub(crate) writers: HashMap<u64, InFlight>,
    /// Files in `shared/` that a writer of this process stored (or found stored) and that
    /// retention has not deleted since, by name:
    /// [`reuse_shared`](super::CheckpointWriter::reuse_shared) hands these out, retention
    /// forgets a file when it deletes it.
    pub(crate) stored: HashMap<String, FileEntry>,
}

/// One checkpoint being written.
#[derive(Debug)]
pub(crate) struct InFlight {
    pub(crate) dir: PathBuf,
    /// Shared files it wrote or reuses: retention keeps them.
    pub(crate) shared: HashSet<String>,
}

impl Registry {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn register(&self, dir: &Path) -> Result<u64> {
        let mut books = self.lock();
        if books.writers.values().any(|w| w.dir == dir) {
            return Err(Error::AlreadyExists {
                path: dir.to_path_buf(),
            });
        }
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let dir = dir.to_path_buf();
        books.writers.insert(
            token,
            InFlight {
                dir,
                shared: HashSet::new(),
            },
        );
        Ok(token)
    }

    pub(crate) fn protect_shared(&self, token: u64, name: &str) {
        if let Some(w) = self.lock().writers.get_mut(&token) {
            w.shared.insert(name.to_string());
        }
    }

    pub(crate) fn remember_stored(&self, entry: &FileEntry) {
        self.lock().stored.insert(entry.name.clone(), entry.clone());
    }

    pub(crate) fn unregister(&self, token: u64) {
        self.lock().writers.remove(&token);
    }
}
