//! weir's benchmark suite as a library: the Nexmark queries ([`nexmark`]), written in the
//! public DSL, which the `weir-bench` binary runs and the correctness tests check.

pub mod nexmark;
