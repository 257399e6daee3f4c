//! weir-checkpoint: the checkpoint coordinator and checkpoint storage.
//!
//! Independent parts, glued together by the runtime:
//!
//! - [`coordinator`]: a sans-IO state machine that decides when checkpoint `n` is triggered,
//!   collects the tasks' acknowledgements, and tells the runtime when `n` is complete,
//!   aborted or subsumed ([`Coordinator`], [`Action`]). No threads, clocks or files.
//! - [`storage`]: checkpoints in a directory — state files, the `_metadata` manifest written
//!   last and atomically, verification (size + CRC-32) on load, fallback to the previous
//!   checkpoint when the newest is corrupt, savepoints and retention ([`CheckpointStorage`],
//!   [`Manifest`]).
//! - [`ownership`]: leases that let one run at a time own a checkpoint directory (or a sink's
//!   output directory), with a sans-IO protocol core ([`Ownership`]).
//!
//! None of them knows operators, state backends or channels; those belong to weir-state and
//! weir-runtime.
#![deny(missing_docs)]

pub mod coordinator;
mod error;
mod kind;
pub mod ownership;
pub mod storage;

pub use coordinator::{
    AbortReason, AckStats, Action, CheckpointStats, Coordinator, CoordinatorConfig, Participants,
    TaskKey, TimedOut,
};
pub use error::{Error, FileProblem, Result};
pub use kind::CheckpointKind;
pub use ownership::{Claim, DEFAULT_LEASE, OwnerRecord, Ownership};
pub use storage::{
    CheckpointInfo, CheckpointStorage, CheckpointWriter, DEFAULT_RETAINED, FileEntry,
    LatestComplete, LoadedCheckpoint, Manifest, ManifestStats, OperatorManifest, RetainReport,
    STOP_RECORD, SkippedCheckpoint, StopRecord, SubtaskManifest,
};
pub use weir_core::ids::CheckpointId;
