//! The PostgreSQL examples (`payments_apply_once`, `upsert_totals`) live in this package so that
//! `cargo run --example quickstart` never builds the PostgreSQL client (see Cargo.toml).
