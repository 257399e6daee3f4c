//! Named fail points for fault-injection tests.
//!
//! `WEIR_FAILPOINTS=name=action[,name=action...]` turns fail points on; actions:
//! `kill` (the process sends itself SIGKILL, as `kill -9` would), `exit` (exits at once
//! with status 86, no cleanup), `panic`, `sleep:MS` (the thread waits, then goes on),
//! `error` (where the code checks for it). Each named
//! point fires the first time it is hit (`N*action`: the N-th time; `every*action`: every time). Names in the runtime: `checkpoint.before_metadata`,
//! `checkpoint.after_metadata`, `checkpoint.after_metadata_with_channel_state` (the same
//! point, hit only by checkpoints that stored in-flight records: complete, and no sink
//! has committed it yet), `savepoint.before_metadata` (a savepoint's files are written,
//! its manifest is not), `cluster.stage` (`error`: staging a worker's checkpoint files
//! fails), `cluster.final_notice` (`sleep:MS`: a worker hands its tasks the final
//! checkpoint's trigger late), `restore.verify` (`sleep:MS`: reading the checksums of a
//! checkpoint's files, before or during a restore, starts late); in sinks: `sink.after_precommit`, `sink.before_commit`, `sink.after_commit`; in the RocksDB backend: `rocksdb.snapshot` (`sleep:MS`: an instance's background snapshot hangs).

pub use weir_core::failpoint::hit;
