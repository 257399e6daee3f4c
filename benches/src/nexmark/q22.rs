//! q22, get URL directories: the first three directories of each bid's URL.
//!
//! ```sql
//! SELECT auction, bidder, price, channel,
//!     SPLIT_INDEX(url, '/', 3) AS dir1,
//!     SPLIT_INDEX(url, '/', 4) AS dir2,
//!     SPLIT_INDEX(url, '/', 5) AS dir3
//! FROM bid;
//! ```
//!
//! `SPLIT_INDEX` splits at every `/`, keeping empty tokens, and indexes from 0
//! (`https:`, ``, `www.nexmark.com`, dir1, ...); an index past the end gives NULL.

use super::bids;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use weir::prelude::*;
use weir_nexmark::Event;

/// A q22 result row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub auction: i64,
    pub bidder: i64,
    pub price: i64,
    pub channel: Arc<str>,
    pub dir1: Option<String>,
    pub dir2: Option<String>,
    pub dir3: Option<String>,
}

/// The query over the event stream.
pub fn query(events: &Stream<Event>) -> Stream<Row> {
    bids(events)
        .map(|b| {
            let mut parts = b.url.split('/').skip(3).map(str::to_string);
            Row {
                auction: b.auction,
                bidder: b.bidder,
                price: b.price,
                channel: b.channel.clone(),
                dir1: parts.next(),
                dir2: parts.next(),
                dir3: parts.next(),
            }
        })
        .name("q22")
}
