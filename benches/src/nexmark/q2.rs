//! q2, selection: the bids on every 123rd auction.
//!
//! ```sql
//! SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0;
//! ```

use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::Event;

/// A q2 result row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub auction: i64,
    pub price: i64,
}

/// The query over the event stream.
pub fn query(events: &Stream<Event>) -> Stream<Row> {
    events
        .flat_map(|e| match e {
            Event::Bid(b) if b.auction % 123 == 0 => Some(Row {
                auction: b.auction,
                price: b.price,
            }),
            _ => None,
        })
        .name("q2")
}
