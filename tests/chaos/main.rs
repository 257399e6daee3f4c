//! Exactly-once through crashes, tried the way an operator of weir would see it: the
//! `file_sum` example runs as a real child process, is killed with SIGKILL at random
//! moments and at every named fail point, is restarted each time (sometimes at another
//! parallelism, once from a savepoint), and the committed output is checked against the
//! input: for every key, the committed sums are exactly the prefix sums of its values —
//! a duplicate shows as a repeated sum, a loss as a missing one.
//!
//! Sizes are those the CI runs; `WEIR_SOAK=1` multiplies the number of kills by 10.

mod async_io;
mod bounded;
mod broadcast;
mod cluster;
mod cluster_object_storage;
mod cluster_restore;
mod cluster_staging;
mod cluster_tls;
mod cluster_unaligned;
mod event_time;
mod harness;
mod kills;
mod lifecycle;
mod local_recovery;
mod object_output;
mod object_storage;
mod ownership;
mod property;
mod restarts;
mod restore_verification;
mod rocks_windows;
mod storage;
mod stuck;
mod tables;
mod time_joins;
mod unaligned;
mod unrestorable;
mod upgrade;
