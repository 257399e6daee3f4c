//! q9, winning bids: every auction with its winning bid.
//!
//! ```sql
//! SELECT id, itemName, description, initialBid, reserve, dateTime, expires, seller,
//!        category, extra, auction, bidder, price, bid_dateTime, bid_extra
//! FROM (
//!     SELECT A.*, B.auction, B.bidder, B.price, B.dateTime AS bid_dateTime,
//!            B.extra AS bid_extra,
//!            ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.dateTime ASC) AS rownum
//!     FROM auction A, bid B
//!     WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
//! )
//! WHERE rownum <= 1;
//! ```
//!
//! Flink keeps every auction and bid and updates each auction's top bid as bids arrive.
//! Here [`winning_bids`] closes each auction when the watermark passes its expiry and
//! emits its final winner once: the same final result, append-only.

use super::winning::{FLINK, winning_bids};
use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::{Auction, Event};

/// A q9 result row: the auction's columns, then the winning bid's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub auction: Auction,
    pub bid_auction: i64,
    pub bidder: i64,
    pub price: i64,
    pub bid_date_time: i64,
    pub bid_extra: String,
}

/// The query over the event stream.
pub fn query(events: &Stream<Event>) -> Stream<Row> {
    winning_bids(events, FLINK, |a| a, |b| (b.auction, b.bidder, b.extra))
        .map(|w| {
            let (bid_auction, bidder, bid_extra) = w.bid;
            Row {
                auction: w.auction,
                bid_auction,
                bidder,
                price: w.price,
                bid_date_time: w.date_time,
                bid_extra,
            }
        })
        .name("q9")
}
