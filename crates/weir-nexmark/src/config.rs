//! The generator's configuration: the Nexmark parameters and one generator's share.

use serde::{Deserialize, Serialize};

/// Beam's fixed base time, 2015-07-15T00:00:00Z, in epoch milliseconds.
pub const BASE_TIME: i64 = 1_436_918_400_000;

/// The Nexmark parameters. `Default` is the canonical configuration G0: 10,000 events/s of
/// event time, one generator, proportions 1:3:46, Beam's base time, ids from 0, in order.
///
/// ```
/// use weir_nexmark::NexmarkConfig;
/// let c = NexmarkConfig { num_events: 1_000, num_event_generators: 2, ..Default::default() };
/// assert_eq!(c.total_proportion(), 50);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NexmarkConfig {
    /// Events in the whole stream (0 = unbounded).
    pub num_events: u64,
    /// Parallel timelines the stream is split into (each a contiguous range of event ids,
    /// each starting at `base_time`). The data's timestamps depend on it; ids and fields
    /// do not.
    pub num_event_generators: u64,
    /// Overall events per second of event time (spaces timestamps only).
    pub first_event_rate: u64,
    /// Share of persons in every `total_proportion()` events.
    pub person_proportion: u64,
    /// Share of auctions.
    pub auction_proportion: u64,
    /// Share of bids.
    pub bid_proportion: u64,
    /// Average person size in bytes (`extra` pads towards it).
    pub avg_person_byte_size: u64,
    /// Average auction size in bytes.
    pub avg_auction_byte_size: u64,
    /// Average bid size in bytes.
    pub avg_bid_byte_size: u64,
    /// A bid goes to the hot auction with probability 1 − 1/ratio.
    pub hot_auction_ratio: u64,
    /// An auction is by the hot seller with probability 1 − 1/ratio.
    pub hot_sellers_ratio: u64,
    /// A bid is by the hot bidder with probability 1 − 1/ratio.
    pub hot_bidders_ratio: u64,
    /// Auctions a cold bid picks from; also decides auction lengths.
    pub num_in_flight_auctions: u64,
    /// Persons a cold seller or bidder is picked from.
    pub num_active_people: u64,
    /// Events permuted within blocks of this size (1 = in order).
    pub out_of_order_group_size: u64,
    /// Event time of the first event, epoch milliseconds.
    pub base_time: i64,
    /// Id of the first event.
    pub first_event_id: i64,
    /// Number of the first event (decides its timestamp).
    pub first_event_number: i64,
}

impl Default for NexmarkConfig {
    fn default() -> Self {
        NexmarkConfig {
            num_events: 0,
            num_event_generators: 1,
            first_event_rate: 10_000,
            person_proportion: 1,
            auction_proportion: 3,
            bid_proportion: 46,
            avg_person_byte_size: 200,
            avg_auction_byte_size: 500,
            avg_bid_byte_size: 100,
            hot_auction_ratio: 2,
            hot_sellers_ratio: 4,
            hot_bidders_ratio: 4,
            num_in_flight_auctions: 100,
            num_active_people: 1000,
            out_of_order_group_size: 1,
            base_time: BASE_TIME,
            first_event_id: 0,
            first_event_number: 0,
        }
    }
}

impl NexmarkConfig {
    /// The sum of the three proportions (50 by default).
    pub fn total_proportion(&self) -> u64 {
        self.person_proportion + self.auction_proportion + self.bid_proportion
    }
}
