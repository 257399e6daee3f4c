//! q21, add channel id: each bid with the id of its channel.
//!
//! ```sql
//! SELECT auction, bidder, price, channel,
//!     CASE
//!         WHEN lower(channel) = 'apple' THEN '0'
//!         WHEN lower(channel) = 'google' THEN '1'
//!         WHEN lower(channel) = 'facebook' THEN '2'
//!         WHEN lower(channel) = 'baidu' THEN '3'
//!         ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2)
//!     END AS channel_id
//! FROM bid
//! WHERE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) IS NOT NULL
//!    OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu');
//! ```
//!
//! The regular expression is spelled out: the text after a `channel_id=` that starts the
//! URL or follows a `&`, up to the next `&`.

use super::bids;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use weir::prelude::*;
use weir_nexmark::Event;

/// A q21 result row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub auction: i64,
    pub bidder: i64,
    pub price: i64,
    pub channel: Arc<str>,
    pub channel_id: String,
}

/// The channels with a fixed id (compared case-insensitively).
const HOT_CHANNELS: [(&str, &str); 4] = [
    ("apple", "0"),
    ("google", "1"),
    ("facebook", "2"),
    ("baidu", "3"),
];

/// `REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2)`.
pub fn channel_id_of(url: &str) -> Option<&str> {
    const NEEDLE: &str = "channel_id=";
    let mut from = 0;
    while let Some(i) = url[from..].find(NEEDLE) {
        let at = from + i;
        if at == 0 || url.as_bytes()[at - 1] == b'&' {
            let rest = &url[at + NEEDLE.len()..];
            return Some(rest.split('&').next().unwrap_or(""));
        }
        from = at + 1;
    }
    None
}

/// The query over the event stream.
pub fn query(events: &Stream<Event>) -> Stream<Row> {
    bids(events)
        .flat_map(|b| {
            let hot = HOT_CHANNELS
                .iter()
                .find(|(name, _)| b.channel.eq_ignore_ascii_case(name))
                .map(|(_, id)| *id);
            let id = hot.or_else(|| channel_id_of(&b.url))?.to_string();
            Some(Row {
                auction: b.auction,
                bidder: b.bidder,
                price: b.price,
                channel: b.channel,
                channel_id: id,
            })
        })
        .name("q21")
}
