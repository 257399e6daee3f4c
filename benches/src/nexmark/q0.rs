//! q0, pass-through: every bid, unchanged. Measures the source and the framework.
//!
//! ```sql
//! SELECT auction, bidder, price, dateTime, extra FROM bid;
//! ```

use super::bids;
use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::Event;

/// A q0 result row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub auction: i64,
    pub bidder: i64,
    pub price: i64,
    pub date_time: i64,
    pub extra: String,
}

/// The query over the event stream.
pub fn query(events: &Stream<Event>) -> Stream<Row> {
    bids(events)
        .map(|b| Row {
            auction: b.auction,
            bidder: b.bidder,
            price: b.price,
            date_time: b.date_time,
            extra: b.extra,
        })
        .name("q0")
}
