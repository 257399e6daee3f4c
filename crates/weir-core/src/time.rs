//! Event time: timestamps and the special watermark values.
//!
//! A timestamp is an `i64` in the job's own unit (milliseconds for wall-clock data,
//! the event index for the benchmark generator). weir never interprets the unit.

/// An event-time timestamp or watermark, in the job's unit.
pub type Timestamp = i64;

/// The timestamp of a record that has none (no timestamp assigner ran).
pub const NO_TIMESTAMP: Timestamp = i64::MIN;

/// The watermark before any event time has been seen.
pub const MIN_WATERMARK: Timestamp = i64::MIN;

/// The watermark sent at end of input: every event-time timer and window fires.
pub const MAX_WATERMARK: Timestamp = i64::MAX;
