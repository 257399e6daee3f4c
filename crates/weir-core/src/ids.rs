//! Newtypes for the protocol values that cross crate boundaries.
//!
//! Owns the identifiers only; nothing here allocates or does I/O.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id {
    ($(#[$m:meta])* $name:ident($t:ty)) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub $t);
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id!(
    /// Position of a node in the logical graph (the order the DSL created it).
    NodeId(usize)
);
id!(
    /// A subtask's index within its operator's parallelism.
    SubtaskIndex(usize)
);
id!(
    /// A key group: the unit in which keyed state is split across subtasks.
    KeyGroup(u32)
);
id!(
    /// A checkpoint's number, increasing within a job.
    CheckpointId(u64)
);
