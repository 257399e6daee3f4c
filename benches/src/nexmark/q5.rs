//! q5, hot items: the auctions with the most bids in each sliding window.
//!
//! ```sql
//! SELECT AuctionBids.auction, AuctionBids.num
//! FROM (
//!     SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime
//!     FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
//!     GROUP BY auction, window_start, window_end
//! ) AS AuctionBids
//! JOIN (
//!     SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
//!     FROM (...the same counts...) AS CountBids
//!     GROUP BY CountBids.starttime, CountBids.endtime
//! ) AS MaxBids
//! ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime
//!    AND AuctionBids.num >= MaxBids.maxn;
//! ```
//!
//! Two cascaded windows. Bids are counted per auction in sliding windows of 10 s every 2 s;
//! each count leaves its window stamped with the window's last millisecond. The counts are
//! then keyed by window and gathered by a tumbling window of 2 s (which holds exactly one
//! sliding window's end), where every auction whose count equals the maximum is emitted,
//! ties included.

use super::bids;
use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::Event;

/// Window length.
pub const SIZE_MS: i64 = 10_000;
/// Distance between window starts.
pub const SLIDE_MS: i64 = 2_000;

/// A q5 result row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub auction: i64,
    pub num: u64,
}

/// The query over the event stream.
pub fn query(events: &Stream<Event>) -> Stream<Row> {
    bids(events)
        .key_by(|b| b.auction)
        .window(WindowAssigner::sliding(SIZE_MS, SLIDE_MS))
        .aggregate_with_window(Count, |auction, w, num| (w.start, *auction, num))
        .name("q5-auction-bids")
        .key_by(|(start, _, _)| *start)
        .window(WindowAssigner::tumbling(SLIDE_MS))
        .process(|_start, _w, counts, out| {
            let max = counts.iter().map(|c| c.2).max().unwrap_or(0);
            for &(_, auction, num) in counts.iter().filter(|c| c.2 == max) {
                out.emit(Row { auction, num });
            }
            Ok(())
        })
        .name("q5-hot-items")
}
