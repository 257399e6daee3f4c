//! The three Nexmark event kinds and the event that holds one of them.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A person registers (an id, a name, contact details and a city).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Person {
    /// Unique, ≥ 1000, increasing with the event id.
    pub id: i64,
    /// "First Last".
    pub name: String,
    /// `xxx@yyy.com`.
    pub email_address: String,
    /// Four groups of four digits separated by single spaces.
    pub credit_card: String,
    /// One of ten US cities.
    pub city: String,
    /// One of six upper-case US state codes.
    pub state: String,
    /// Event time, epoch milliseconds (UTC).
    pub date_time: i64,
    /// Padding towards the average person size.
    pub extra: String,
}

/// A person opens an auction.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Auction {
    /// Unique, ≥ 1000, increasing with the event id.
    pub id: i64,
    /// Random lower-case words.
    pub item_name: String,
    /// Random lower-case words.
    pub description: String,
    /// Cents.
    pub initial_bid: i64,
    /// Cents; always above `initial_bid`.
    pub reserve: i64,
    /// Event time, epoch milliseconds (UTC).
    pub date_time: i64,
    /// End of the auction, epoch milliseconds; always after `date_time`.
    pub expires: i64,
    /// The seller's person id.
    pub seller: i64,
    /// 10..=14.
    pub category: i64,
    /// Padding towards the average auction size.
    pub extra: String,
}

/// A person bids on an auction.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Bid {
    /// The auction's id (which may not exist yet, or ever).
    pub auction: i64,
    /// The bidder's person id (which may not exist yet, or ever).
    pub bidder: i64,
    /// Cents.
    pub price: i64,
    /// "Google", "Facebook", "Baidu", "Apple" or "channel-N" (shared: 10,004 values).
    pub channel: Arc<str>,
    /// `https://www.nexmark.com/d1/d2/d3/item.htm?query=1[&channel_id=N]` (shared).
    pub url: Arc<str>,
    /// Event time, epoch milliseconds (UTC).
    pub date_time: i64,
    /// Padding towards the average bid size.
    pub extra: String,
}

/// One Nexmark event: exactly one of a person, an auction or a bid.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Event {
    /// A new person (2 % of events with the default proportions).
    Person(Person),
    /// A new auction (6 %).
    Auction(Auction),
    /// A bid (92 %).
    Bid(Bid),
}

impl Event {
    /// The event time of whichever kind this is.
    pub fn date_time(&self) -> i64 {
        match self {
            Event::Person(p) => p.date_time,
            Event::Auction(a) => a.date_time,
            Event::Bid(b) => b.date_time,
        }
    }

    /// The person, if this is one.
    pub fn person(self) -> Option<Person> {
        match self {
            Event::Person(p) => Some(p),
            _ => None,
        }
    }

    /// The auction, if this is one.
    pub fn auction(self) -> Option<Auction> {
        match self {
            Event::Auction(a) => Some(a),
            _ => None,
        }
    }

    /// The bid, if this is one.
    pub fn bid(self) -> Option<Bid> {
        match self {
            Event::Bid(b) => Some(b),
            _ => None,
        }
    }
}
