//! q11, user sessions: how many bids each bidder makes per session of activity.
//!
//! ```sql
//! SELECT B.bidder, count(*) AS bid_count,
//!        SESSION_START(B.dateTime, INTERVAL '10' SECOND) AS starttime,
//!        SESSION_END(B.dateTime, INTERVAL '10' SECOND) AS endtime
//! FROM bid B
//! GROUP BY B.bidder, SESSION(B.dateTime, INTERVAL '10' SECOND);
//! ```
//!
//! Keyed session windows: each bid opens `[t, t + 10 s)` and windows of a bidder that
//! overlap or touch merge (as Flink's do), so a session ends when more than 10 s pass
//! without a bid. A session is emitted when the watermark passes its end.

use super::bids;
use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::Event;

/// The inactivity gap that closes a session.
pub const GAP_MS: i64 = 10_000;

/// A q11 result row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub bidder: i64,
    pub bid_count: u64,
    /// The session's first bid time.
    pub start_time: i64,
    /// The session's last bid time + 10 s.
    pub end_time: i64,
}

/// The query over the event stream.
pub fn query(events: &Stream<Event>) -> Stream<Row> {
    bids(events)
        .map(|b| b.bidder)
        .key_by(|bidder| *bidder)
        .window(WindowAssigner::session(GAP_MS))
        .aggregate_with_window(Count, |bidder, w, bid_count| Row {
            bidder: *bidder,
            bid_count,
            start_time: w.start,
            end_time: w.end,
        })
        .name("q11-sessions")
}
