//! weir's PostgreSQL sinks against a real PostgreSQL server, tried as a user would: the
//! APPLY protocol with concurrent and repeated applies, jobs writing through the apply-once
//! and fenced sinks with duplicates, poison records and retries, and `payments_apply_once`
//! run as a child process and killed with SIGKILL; changelogs upserted into tables, also
//! by `upsert_totals` killed with SIGKILL.
//!
//! The server is `WEIR_POSTGRES_URL` if set (CI starts one with `scripts/postgres.sh
//! start`), otherwise the tests start one themselves with that script. Every test works in
//! a schema of its own.

mod chaos;
mod protocol;
mod sinks;
mod support;
mod unaligned;
mod upsert_chaos;
mod upserts;
