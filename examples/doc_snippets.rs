//! The code snippets of weir's documentation, compiled and run as doc tests.
//!
//! Nothing to use here: this crate exists so that `cargo test --workspace` fails when a
//! snippet in `README.md`, `docs/getting-started.md`, `docs/checkpoints.md`,
//! `docs/cluster.md` or `docs/operations.md` stops
//! compiling or gives a different result.

#[doc = include_str!("../README.md")]
pub mod readme {}

#[doc = include_str!("../docs/getting-started.md")]
pub mod getting_started {}

#[doc = include_str!("../docs/checkpoints.md")]
pub mod checkpoints {}

#[doc = include_str!("../docs/cluster.md")]
pub mod cluster {}

#[doc = include_str!("../docs/operations.md")]
pub mod operations {}
