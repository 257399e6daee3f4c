//! Operator implementations behind the DSL: stateless transforms, keyed process
//! functions, rolling aggregations, two-input functions, windows, joins and sinks.
//!
//! Each operator implements [`crate::output::Output`] for its input and owns the output it
//! writes to; user code runs inside [`guard`], which turns a panic or an error into an
//! [`crate::Error::Operator`] naming the operator and subtask.

pub mod basic;
pub mod broadcast;
pub mod co;
pub mod dedup;
pub mod file_sink;
pub mod interval_join;
pub mod keyed;
pub mod object_sink;
pub mod process;
pub(crate) mod side;
pub mod sink;
pub(crate) mod table;
pub mod table_agg;
pub mod temporal_join;
mod time_buffer;
#[cfg(test)]
mod time_join_tests;

use crate::error::{Error, Location, Result};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

/// Identifies an operator instance for error messages.
#[derive(Clone)]
pub struct OpInfo {
    /// Display name.
    pub name: Arc<str>,
    /// Subtask index.
    pub subtask: usize,
    /// Parallelism.
    pub parallelism: usize,
}

impl OpInfo {
    /// Builds the info from a build context.
    pub fn from_ctx(ctx: &crate::graph::BuildContext<'_>) -> Self {
        OpInfo {
            name: Arc::from(ctx.name),
            subtask: ctx.subtask,
            parallelism: ctx.parallelism,
        }
    }

    /// The location for errors.
    pub fn location(&self) -> Location {
        Location {
            operator: self.name.to_string(),
            subtask: self.subtask,
            parallelism: self.parallelism,
        }
    }
}

/// Runs user code, turning a panic or error into an operator error.
#[inline]
pub fn guard<R>(info: &OpInfo, f: impl FnOnce() -> Result<R>) -> Result<R> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(e.at(|| info.location())),
        Err(panic) => Err(Error::from_panic(panic).at(|| info.location())),
    }
}
