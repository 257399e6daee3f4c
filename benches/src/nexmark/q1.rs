//! q1, currency conversion: every bid with its price in euros.
//!
//! ```sql
//! SELECT auction, bidder, 0.908 * price AS price, dateTime, extra FROM bid;
//! ```
//!
//! `0.908 * price` is an exact DECIMAL in SQL; here it is the integer `price * 908` at
//! scale 3 (thousandths of a cent), never a float.

use super::bids;
use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::Event;

/// A q1 result row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub auction: i64,
    pub bidder: i64,
    /// `0.908 × price`, in thousandths (scale 3).
    pub price_milli: i64,
    pub date_time: i64,
    pub extra: String,
}

/// The query over the event stream.
pub fn query(events: &Stream<Event>) -> Stream<Row> {
    bids(events)
        .map(|b| Row {
            auction: b.auction,
            bidder: b.bidder,
            price_milli: b.price * 908,
            date_time: b.date_time,
            extra: b.extra,
        })
        .name("q1")
}
