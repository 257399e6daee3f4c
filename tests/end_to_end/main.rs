//! weir's end-to-end tests: whole pipelines built with the public DSL (`weir::prelude`),
//! run on the local runtime, with exact expected outputs.
//!
//! Run with `cargo test -p weir-tests`. Shared sources, sinks and the deadline runner are
//! in `tests/lib.rs` (`weir_tests`). Outputs of parallel sinks are sorted (or grouped by
//! key, keeping per-key order) before comparing; no test sleeps to synchronise.

mod async_io;
mod broadcast;
mod checkpoint_stats;
mod cluster;
mod cluster_auth;
mod cluster_tls;
mod connect;
mod dashboard;
mod dedup;
mod docs;
mod errors;
mod in_flight;
mod joins;
mod latency;
mod logging;
mod memory_budget;
mod metrics_endpoint;
mod object_output;
mod object_storage;
mod operators;
mod parallelism;
mod parquet_output;
mod process_functions;
mod prometheus;
mod rest_api;
mod rest_figures;
mod rest_secret;
mod restore_files;
mod rocks_windows;
mod sources_sinks;
mod state_kinds;
mod state_renames;
mod tables;
mod time_joins;
mod timers;
mod unaligned;
mod unaligned_completions;
mod watermark_alignment;
mod windows;
