//! weir-runtime: the local executor.
//!
//! Expands a logical graph into tasks (chains of operators × parallelism), connects them
//! with bounded channels of record batches, runs each task on its own thread, combines
//! watermarks per input channel, and fails the whole job promptly when any operator fails.
//! It must not contain operator logic (that is weir-core's) or storage (weir-state's).
#![deny(missing_docs)]

mod alignment;
mod checkpoints;
pub mod cluster;
mod config;
mod failpoint;
mod job;
mod latency;
pub mod logging;
mod owner;
mod plan;
mod restart;
mod secret;
mod status;
mod task;
mod tls;
mod web;

pub use cluster::{ClusterConfig, ClusterRole, Joined, join};
pub use config::{
    CheckpointConfig, CheckpointMode, DEFAULT_ALIGNED_TIMEOUT, DEFAULT_CANCELLATION_TIMEOUT,
    DEFAULT_IN_FLIGHT_TARGET, JobConfig,
};
pub use job::{JobHandle, JobResult, SAVEPOINT_REQUEST_FILE, TaskStats, execute, start};
pub use logging::LogFormat;
pub use restart::{ExponentialDelay, FailureRate, FixedDelay, RestartStrategy};
pub use secret::{MIN_SECRET_LEN, SECRET_FILE_VAR, Secret};
pub use tls::{TLS_DIR_VAR, Tls};
pub use web::dashboard;
