//! A storage written by the run that owns its directory: the lease check before durable acts.
//!
//! Owns only the hook between [`CheckpointStorage`] and [`Ownership`](crate::Ownership); the
//! lease protocol is [`ownership`](crate::ownership)'s.

use super::CheckpointStorage;
use crate::error::Result;

impl CheckpointStorage {
    /// This storage, written by the run holding `owner` (a lease on this directory): from
    /// now on beginning a checkpoint, writing its manifest, retention and discarding first
    /// check that the run still owns the directory, and fail with
    /// [`Error::OwnershipLost`](crate::Error::OwnershipLost) otherwise. Reading needs no
    /// lease; a storage without an owner (read-only tools, tests) checks nothing.
    pub fn owned_by(mut self, owner: crate::Ownership) -> Self {
        self.owner = Some(owner);
        self
    }

    /// The lease this storage checks, if any.
    pub fn owner(&self) -> Option<&crate::Ownership> {
        self.owner.as_ref()
    }

    /// Fails when this storage has an owner that no longer owns the directory.
    pub(crate) fn check_owner(&self) -> Result<()> {
        self.owner.as_ref().map_or(Ok(()), crate::Ownership::verify)
    }
}
