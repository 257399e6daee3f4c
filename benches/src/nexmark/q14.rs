//! q14, calculation: bids in a price band, with a time-of-day class and a character count.
//!
//! ```sql
//! SELECT auction, bidder, 0.908 * price AS price,
//!     CASE
//!         WHEN HOUR(dateTime) >= 8 AND HOUR(dateTime) <= 18 THEN 'dayTime'
//!         WHEN HOUR(dateTime) <= 6 OR HOUR(dateTime) >= 20 THEN 'nightTime'
//!         ELSE 'otherTime'
//!     END AS bidTimeType,
//!     dateTime, extra, count_char(extra, 'c') AS c_counts
//! FROM bid
//! WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000;
//! ```
//!
//! Exact decimal arithmetic, as in SQL: the price is `price × 908` at scale 3, and the band
//! is `10^9 < 908·price < 5·10^10`. Hours are UTC. `count_char` counts the bytes equal to
//! `'c'`.

use super::bids;
use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::Event;

/// The time-of-day class of a bid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum BidTimeType {
    /// 08:00–18:59 UTC.
    DayTime,
    /// 20:00–06:59 UTC.
    NightTime,
    /// 07:xx and 19:xx UTC.
    OtherTime,
}

/// A q14 result row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub auction: i64,
    pub bidder: i64,
    /// `0.908 × price`, in thousandths (scale 3).
    pub price_milli: i64,
    pub bid_time_type: BidTimeType,
    pub date_time: i64,
    pub extra: String,
    pub c_counts: u64,
}

/// The class of an epoch-millisecond time by its UTC hour.
pub fn bid_time_type(date_time: i64) -> BidTimeType {
    match date_time.div_euclid(3_600_000).rem_euclid(24) {
        8..=18 => BidTimeType::DayTime,
        0..=6 | 20..=23 => BidTimeType::NightTime,
        _ => BidTimeType::OtherTime,
    }
}

/// The query over the event stream.
pub fn query(events: &Stream<Event>) -> Stream<Row> {
    bids(events)
        .flat_map(|b| {
            let price_milli = b.price * 908;
            (price_milli > 1_000_000_000 && price_milli < 50_000_000_000).then(|| Row {
                auction: b.auction,
                bidder: b.bidder,
                price_milli,
                bid_time_type: bid_time_type(b.date_time),
                date_time: b.date_time,
                c_counts: b.extra.bytes().filter(|c| *c == b'c').count() as u64,
                extra: b.extra,
            })
        })
        .name("q14")
}
