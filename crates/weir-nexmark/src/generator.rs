//! The canonical Nexmark generator: every event is a pure function of its event id (kind,
//! entity ids, random fields via a Java-compatible LCG seeded with the id) and its event
//! number (timestamp). See `docs/nexmark.md` for the specification it follows.

use crate::config::NexmarkConfig;
use crate::model::{Auction, Bid, Event, Person};
use crate::rng::JavaRandom;
use std::sync::{Arc, OnceLock};

/// The first person id.
const FIRST_PERSON_ID: i64 = 1000;
/// The first auction id.
const FIRST_AUCTION_ID: i64 = 1000;
/// The first category id.
const FIRST_CATEGORY_ID: i64 = 10;
/// Number of categories.
const NUM_CATEGORIES: i32 = 5;
/// Person ids a random person id may run ahead of the newest person.
const PERSON_ID_LEAD: i64 = 10;
/// Auction ids a random auction id may run ahead of the newest auction.
const AUCTION_ID_LEAD: i64 = 10;
/// Persons per hot-seller batch.
const HOT_SELLER_RATIO: i64 = 100;
/// Auctions per hot-auction batch.
const HOT_AUCTION_RATIO: i64 = 100;
/// Persons per hot-bidder batch.
const HOT_BIDDER_RATIO: i64 = 100;
/// A bid is on a hot channel with probability 1 − 1/this.
const HOT_CHANNELS_RATIO: i32 = 2;
/// Entries of the channel table.
const CHANNELS_NUMBER: usize = 10_000;
/// Shortest random string before trimming.
const MIN_STRING_LENGTH: i32 = 3;

const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const US_CITIES: [&str; 10] = [
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
];
const FIRST_NAMES: [&str; 11] = [
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];
const LAST_NAMES: [&str; 9] = [
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
];
const HOT_CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];

/// A `(channel, url)` pair shared by every bid that names it.
type Channel = (Arc<str>, Arc<str>);

/// One generator's share of the stream: events `0..max_events` of a timeline starting at
/// `base_time`.
#[derive(Debug, Clone)]
pub struct GeneratorConfig {
    /// The parameters (shared by all splits).
    pub config: NexmarkConfig,
    /// Event time of this generator's first event.
    pub base_time: i64,
    /// Event id of this generator's first event.
    pub first_event_id: i64,
    /// Event number of this generator's first event.
    pub first_event_number: i64,
    /// Events this generator emits.
    pub max_events: u64,
    /// Microseconds of event time between two events of this generator.
    pub inter_event_delay_us: f64,
}

impl GeneratorConfig {
    /// The whole stream as one generator (not yet split).
    ///
    /// `max_events` is `num_events`, or for an unbounded stream (`num_events == 0`)
    /// `i64::MAX div (total proportion × largest average size)`. The delay between two
    /// events is `1e6 / first_event_rate × num_event_generators` µs: each of the
    /// `num_event_generators` splits runs on its own timeline.
    pub fn new(config: NexmarkConfig) -> Self {
        let max_events = if config.num_events == 0 {
            let largest = config
                .avg_person_byte_size
                .max(config.avg_auction_byte_size)
                .max(config.avg_bid_byte_size)
                .max(1);
            let denom = (config.total_proportion().max(1) as i64).saturating_mul(largest as i64);
            (i64::MAX / denom) as u64
        } else {
            config.num_events
        };
        let inter_event_delay_us =
            1_000_000.0 / config.first_event_rate as f64 * config.num_event_generators as f64;
        GeneratorConfig {
            base_time: config.base_time,
            first_event_id: config.first_event_id,
            first_event_number: config.first_event_number,
            max_events,
            inter_event_delay_us,
            config,
        }
    }

    /// Splits into `n` generators with contiguous id ranges on parallel timelines.
    ///
    /// Each gets `max_events div n` events (the last one also the remainder), the same
    /// base time, first event number and delay, and the next range of event ids.
    ///
    /// # Panics
    /// If `n == 0`.
    pub fn split(&self, n: u64) -> Vec<GeneratorConfig> {
        assert!(n > 0, "cannot split a generator into 0 parts");
        let sub = self.max_events / n;
        let mut first_event_id = self.first_event_id;
        (0..n)
            .map(|i| {
                let max_events = if i == n - 1 {
                    self.max_events - sub * (n - 1)
                } else {
                    sub
                };
                let g = GeneratorConfig {
                    first_event_id,
                    max_events,
                    ..self.clone()
                };
                first_event_id += max_events as i64;
                g
            })
            .collect()
    }

    /// The event number of this generator's `count`-th event (0-based): with an
    /// out-of-order group size n > 1, permuted within each block of n numbers.
    #[inline]
    pub fn event_number(&self, count: u64) -> i64 {
        let e = self.first_event_number + count as i64;
        let n = self.config.out_of_order_group_size as i64;
        if n <= 1 {
            e
        } else {
            (e / n) * n + e.wrapping_mul(953) % n
        }
    }

    /// The event id of this generator's `count`-th event (decides its kind, entity ids
    /// and random fields).
    #[inline]
    pub fn event_id(&self, count: u64) -> i64 {
        self.first_event_id + self.event_number(count)
    }

    /// The timestamp of this generator's `count`-th event.
    #[inline]
    pub fn timestamp(&self, count: u64) -> i64 {
        self.timestamp_for_number(self.event_number(count))
    }

    /// The timestamp of event number `number`: the base time plus the number's delay,
    /// truncated to µs, then to ms.
    #[inline]
    fn timestamp_for_number(&self, number: i64) -> i64 {
        self.base_time + (number as f64 * self.inter_event_delay_us) as i64 / 1000
    }

    /// This generator's `count`-th event.
    pub fn event(&self, count: u64) -> Event {
        let number = self.event_number(count);
        let eid = self.first_event_id + number;
        let ts = self.timestamp_for_number(number);
        let c = &self.config;
        let total = c.total_proportion() as i64;
        let rem = eid % total;
        let mut rng = JavaRandom::new(eid);
        if rem < c.person_proportion as i64 {
            Event::Person(self.person(&mut rng, eid, ts))
        } else if rem < (c.person_proportion + c.auction_proportion) as i64 {
            Event::Auction(self.auction(&mut rng, eid, number, ts))
        } else {
            Event::Bid(self.bid(&mut rng, eid, ts))
        }
    }

    /// The id (base 0) of the newest person at or before event `eid`.
    #[inline]
    fn last_person_id(&self, eid: i64) -> i64 {
        let c = &self.config;
        let pp = c.person_proportion as i64;
        let total = c.total_proportion() as i64;
        let epoch = eid / total;
        let mut offset = eid % total;
        if offset >= pp {
            offset = pp - 1;
        }
        epoch * pp + offset
    }

    /// The id (base 0) of the newest auction at or before event `eid`.
    #[inline]
    fn last_auction_id(&self, eid: i64) -> i64 {
        let c = &self.config;
        let pp = c.person_proportion as i64;
        let ap = c.auction_proportion as i64;
        let total = c.total_proportion() as i64;
        let mut epoch = eid / total;
        let mut offset = eid % total;
        if offset < pp {
            epoch -= 1;
            offset = ap - 1;
        } else if offset >= pp + ap {
            offset = ap - 1;
        } else {
            offset -= pp;
        }
        epoch * ap + offset
    }

    /// A random ("cold") person id (base 0): one of the newest active persons or the
    /// next few ids.
    #[inline]
    fn random_person_id(&self, rng: &mut JavaRandom, eid: i64) -> i64 {
        let n = self.last_person_id(eid) + 1;
        let active = n.min(self.config.num_active_people as i64);
        n - active + rng.below_i64(active + PERSON_ID_LEAD)
    }

    /// A random ("cold") auction id (base 0): one of the auctions in flight or the next
    /// few ids.
    #[inline]
    fn random_auction_id(&self, rng: &mut JavaRandom, eid: i64) -> i64 {
        let hi = self.last_auction_id(eid);
        let lo = (hi - self.config.num_in_flight_auctions as i64).max(0);
        lo + rng.below_i64(hi - lo + 1 + AUCTION_ID_LEAD)
    }

    fn person(&self, rng: &mut JavaRandom, eid: i64, ts: i64) -> Person {
        let id = self.last_person_id(eid) + FIRST_PERSON_ID;
        let first = FIRST_NAMES[rng.below_i32(FIRST_NAMES.len() as i32) as usize];
        let last = LAST_NAMES[rng.below_i32(LAST_NAMES.len() as i32) as usize];
        let mut name = String::with_capacity(first.len() + 1 + last.len());
        name.push_str(first);
        name.push(' ');
        name.push_str(last);

        let mut email_address = String::with_capacity(7 + 1 + 5 + 4);
        push_rand_string(&mut email_address, rng, 7, ' ');
        email_address.push('@');
        push_rand_string(&mut email_address, rng, 5, ' ');
        email_address.push_str(".com");

        let mut credit_card = String::with_capacity(19);
        for i in 0..4 {
            if i > 0 {
                credit_card.push(' ');
            }
            let v = rng.below_i32(10_000);
            for d in [1000, 100, 10, 1] {
                credit_card.push((b'0' + (v / d % 10) as u8) as char);
            }
        }

        let city = US_CITIES[rng.below_i32(US_CITIES.len() as i32) as usize];
        let state = US_STATES[rng.below_i32(US_STATES.len() as i32) as usize];
        let current =
            8 + name.len() + email_address.len() + credit_card.len() + city.len() + state.len();
        let extra = extra(rng, current, self.config.avg_person_byte_size);
        Person {
            id,
            name,
            email_address,
            credit_card,
            city: city.to_owned(),
            state: state.to_owned(),
            date_time: ts,
            extra,
        }
    }

    fn auction(&self, rng: &mut JavaRandom, eid: i64, number: i64, ts: i64) -> Auction {
        let c = &self.config;
        let id = self.last_auction_id(eid) + FIRST_AUCTION_ID;
        let seller = if rng.below_i32(c.hot_sellers_ratio as i32) > 0 {
            (self.last_person_id(eid) / HOT_SELLER_RATIO) * HOT_SELLER_RATIO
        } else {
            self.random_person_id(rng, eid)
        } + FIRST_PERSON_ID;
        let category = FIRST_CATEGORY_ID + rng.below_i32(NUM_CATEGORIES) as i64;
        let initial_bid = price(rng);

        let events_for_auctions =
            (c.num_in_flight_auctions * c.total_proportion()) / c.auction_proportion;
        let horizon = self.timestamp_for_number(number + events_for_auctions as i64) - ts;
        let expires = ts + 1 + rng.below_i64((2 * horizon).max(1));

        let mut item_name = String::with_capacity(20);
        push_rand_string(&mut item_name, rng, 20, ' ');
        let mut description = String::with_capacity(100);
        push_rand_string(&mut description, rng, 100, ' ');
        let reserve = initial_bid + price(rng);
        let current = 8 + item_name.len() + description.len() + 40;
        let extra = extra(rng, current, c.avg_auction_byte_size);
        Auction {
            id,
            item_name,
            description,
            initial_bid,
            reserve,
            date_time: ts,
            expires,
            seller,
            category,
            extra,
        }
    }

    fn bid(&self, rng: &mut JavaRandom, eid: i64, ts: i64) -> Bid {
        let c = &self.config;
        let auction = if rng.below_i32(c.hot_auction_ratio as i32) > 0 {
            (self.last_auction_id(eid) / HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
        } else {
            self.random_auction_id(rng, eid)
        } + FIRST_AUCTION_ID;
        let bidder = if rng.below_i32(c.hot_bidders_ratio as i32) > 0 {
            (self.last_person_id(eid) / HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
        } else {
            self.random_person_id(rng, eid)
        } + FIRST_PERSON_ID;
        let price = price(rng);
        let extra = extra(rng, 32, c.avg_bid_byte_size);
        // Project convention: the channel is drawn after `extra`, so the fields Beam has
        // stay bit-identical to Beam's bid.
        let (channel, url) = if rng.below_i32(HOT_CHANNELS_RATIO) > 0 {
            let i = rng.below_i32(HOT_CHANNELS.len() as i32) as usize;
            LOCAL_HOT_CHANNELS.with(|hot| hot[i].clone())
        } else {
            channel_table()[rng.below_i32(CHANNELS_NUMBER as i32) as usize].clone()
        };
        Bid {
            auction,
            bidder,
            price,
            channel,
            url,
            date_time: ts,
            extra,
        }
    }
}

thread_local! {
    /// This thread's copies of the hot channels. Half of all bids name one of these four
    /// pairs; with one shared copy, generator threads would contend for its reference
    /// counts.
    static LOCAL_HOT_CHANNELS: [Channel; 4] =
        hot_channels().each_ref().map(|(c, u)| (Arc::from(&**c), Arc::from(&**u)));
}

/// A log-uniform price in cents on [100, 10^8): `round(10^(6·u) × 100)`.
#[inline]
fn price(rng: &mut JavaRandom) -> i64 {
    java_round(10f64.powf(rng.next_f64() * 6.0) * 100.0)
}

/// Java's `Math.round` for the (finite, non-negative, moderate) values used here:
/// round half up. `x + 0.5` is exact below 2^52, so `floor` gives the exact result.
#[inline]
fn java_round(x: f64) -> i64 {
    (x + 0.5).floor() as i64
}

/// Appends Nexmark's `nextString(max, pad)`: 3..max characters, each `pad` with
/// probability 1/13 and otherwise a random lower-case letter, then trimmed of leading
/// and trailing spaces (Java's `trim`; other pads are kept).
fn push_rand_string(out: &mut String, rng: &mut JavaRandom, max: i32, pad: char) {
    let start = out.len();
    let len = MIN_STRING_LENGTH + rng.below_i32(max - MIN_STRING_LENGTH);
    for _ in 0..len {
        if rng.below_i32(13) == 0 {
            out.push(pad);
        } else {
            out.push((b'a' + rng.below_i32(26) as u8) as char);
        }
    }
    if pad == ' ' {
        let trimmed_end = start + out[start..].trim_end_matches(' ').len();
        out.truncate(trimmed_end);
        let leading = out[start..].len() - out[start..].trim_start_matches(' ').len();
        if leading > 0 {
            out.drain(start..start + leading);
        }
    }
}

/// Nexmark's `nextExactString(len)`: `len` characters with codes 72..=122, six per
/// 32-bit draw (Java remainder, so negative draws give the upper-case and punctuation
/// part of the range).
fn exact_string(rng: &mut JavaRandom, len: usize) -> String {
    let mut out = Vec::with_capacity(len);
    for _ in 0..len / 6 {
        out.extend_from_slice(&six_chars(rng.next_i32()));
    }
    let rest = len % 6;
    if rest > 0 {
        out.extend_from_slice(&six_chars(rng.next_i32())[..rest]);
    }
    String::from_utf8(out).expect("exact strings are ASCII")
}

/// The six characters one draw `v` gives: `97 + (v rem 26)`, then the same of `v div 26`,
/// and so on. Truncating divisions compose, so each character is computed from `v`
/// directly (independent operations instead of a chain of divisions).
#[inline]
fn six_chars(v: i32) -> [u8; 6] {
    #[inline]
    fn char_of(v: i32) -> u8 {
        (97 + v % 26) as u8
    }
    [
        char_of(v),
        char_of(v / 26),
        char_of(v / 676),
        char_of(v / 17_576),
        char_of(v / 456_976),
        char_of(v / 11_881_376),
    ]
}

/// Nexmark's `nextExtra(current, avg)`: padding so that a record of `current` bytes
/// reaches `avg` bytes on average (empty if it is already larger).
fn extra(rng: &mut JavaRandom, current: usize, avg: u64) -> String {
    let (current, avg) = (current as i64, avg as i64);
    if current > avg {
        return String::new();
    }
    let d = avg - current;
    let delta = java_round(d as f64 * 0.2);
    let size = d - delta
        + if delta == 0 {
            0
        } else {
            rng.below_i32((2 * delta) as i32) as i64
        };
    exact_string(rng, size as usize)
}

/// `https://www.nexmark.com/d1/d2/d3/item.htm?query=1` with three random directories.
fn base_url(rng: &mut JavaRandom) -> String {
    let mut url = String::with_capacity(80);
    url.push_str("https://www.nexmark.com/");
    push_rand_string(&mut url, rng, 5, '_');
    url.push('/');
    push_rand_string(&mut url, rng, 5, '_');
    url.push('/');
    push_rand_string(&mut url, rng, 5, '_');
    url.push_str("/item.htm?query=1");
    url
}

/// The four hot channels with their urls, `HOT_URLS[i]` drawn from seed `10000 + i`.
fn hot_channels() -> &'static [Channel; 4] {
    static TABLE: OnceLock<[Channel; 4]> = OnceLock::new();
    TABLE.get_or_init(|| {
        std::array::from_fn(|i| {
            let url = base_url(&mut JavaRandom::new((CHANNELS_NUMBER + i) as i64));
            (Arc::from(HOT_CHANNELS[i]), Arc::from(url))
        })
    })
}

/// The 10,000 cold channels `channel-j` with their urls, entry `j` drawn from seed `j`.
fn channel_table() -> &'static [Channel] {
    static TABLE: OnceLock<Vec<Channel>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..CHANNELS_NUMBER)
            .map(|j| {
                let mut rng = JavaRandom::new(j as i64);
                let mut url = base_url(&mut rng);
                if rng.below_i32(10) > 0 {
                    url.push_str("&channel_id=");
                    url.push_str(&(j as i32).reverse_bits().wrapping_abs().to_string());
                }
                (Arc::from(format!("channel-{j}")), Arc::from(url))
            })
            .collect()
    })
}

/// The generators of a configuration: its stream split `num_event_generators` ways.
pub fn splits(config: &NexmarkConfig) -> Vec<GeneratorConfig> {
    GeneratorConfig::new(config.clone()).split(config.num_event_generators.max(1))
}

/// Every event of a bounded configuration, split by split (the reference order for models).
pub fn events(config: &NexmarkConfig) -> impl Iterator<Item = Event> + use<> {
    splits(config)
        .into_iter()
        .flat_map(|g| (0..g.max_events).map(move |c| g.event(c)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BASE_TIME;

    fn g0(num_events: u64) -> NexmarkConfig {
        NexmarkConfig {
            num_events,
            ..Default::default()
        }
    }

    fn event(n: u64) -> Event {
        GeneratorConfig::new(g0(0)).event(n)
    }

    fn person(n: u64) -> Person {
        event(n).person().expect("a person")
    }

    fn auction(n: u64) -> Auction {
        event(n).auction().expect("an auction")
    }

    fn bid(n: u64) -> Bid {
        event(n).bid().expect("a bid")
    }

    const T0: i64 = 1_436_918_400_000;
    const URL: &str = "https://www.nexmark.com/";

    #[test]
    fn config_g0() {
        let g = GeneratorConfig::new(g0(0));
        assert_eq!(g.max_events, 368_934_881_474_191);
        assert_eq!(g.inter_event_delay_us, 100.0);
        assert_eq!(
            (g.base_time, g.first_event_id, g.first_event_number),
            (BASE_TIME, 0, 0)
        );
        let g4 = GeneratorConfig::new(NexmarkConfig {
            num_event_generators: 4,
            ..g0(1_000_000)
        });
        assert_eq!(g4.max_events, 1_000_000);
        assert_eq!(g4.inter_event_delay_us, 400.0);
    }

    #[test]
    fn split_ranges() {
        let g = GeneratorConfig::new(g0(100_003));
        let parts = g.split(3);
        let got: Vec<(i64, u64)> = parts
            .iter()
            .map(|p| (p.first_event_id, p.max_events))
            .collect();
        assert_eq!(got, [(0, 33_334), (33_334, 33_334), (66_668, 33_335)]);
        for p in &parts {
            assert_eq!(p.base_time, BASE_TIME);
            assert_eq!(p.first_event_number, 0);
            assert_eq!(p.inter_event_delay_us, g.inter_event_delay_us);
            assert_eq!(p.timestamp(0), BASE_TIME);
        }
        assert_eq!(g.split(1)[0].max_events, 100_003);
    }

    #[test]
    fn event_numbers_out_of_order() {
        let c = NexmarkConfig {
            out_of_order_group_size: 1000,
            ..g0(0)
        };
        let g = GeneratorConfig::new(c);
        assert_eq!(g.event_number(0), 0);
        assert_eq!(g.event_number(1), 953);
        assert_eq!(g.event_number(2), 906);
        assert_eq!(g.event_number(1001), 1953);
        let mut block: Vec<i64> = (0..1000).map(|c| g.event_number(c)).collect();
        block.sort_unstable();
        assert_eq!(block, (0..1000).collect::<Vec<_>>());
        let plain = GeneratorConfig::new(g0(0));
        assert_eq!(plain.event_number(12_345), 12_345);
        assert_eq!(plain.event_id(12_345), 12_345);
    }

    #[test]
    fn timestamps() {
        let g = GeneratorConfig::new(g0(0));
        assert_eq!(g.timestamp(0), T0);
        assert_eq!(g.timestamp(9), T0);
        assert_eq!(g.timestamp(10), T0 + 1);
        assert_eq!(g.timestamp(99_999), T0 + 9_999);
    }

    #[test]
    fn entity_ids() {
        let g = GeneratorConfig::new(g0(0));
        // Persons at 0, 50, 100; auctions at 1-3, 51-53.
        assert_eq!(g.last_person_id(0), 0);
        assert_eq!(g.last_person_id(49), 0);
        assert_eq!(g.last_person_id(50), 1);
        assert_eq!(g.last_auction_id(1), 0);
        assert_eq!(g.last_auction_id(3), 2);
        assert_eq!(g.last_auction_id(4), 2);
        assert_eq!(g.last_auction_id(50), 2);
        assert_eq!(g.last_auction_id(51), 3);
        assert_eq!(g.last_auction_id(0), -1);
    }

    #[test]
    fn golden_event_0() {
        let p = person(0);
        assert_eq!(p.id, 1000);
        assert_eq!(p.name, "Peter Jones");
        assert_eq!(p.email_address, "nhd@xcat.com");
        assert_eq!(p.credit_card, "7241 7320 9143 4888");
        assert_eq!(p.city, "Portland");
        assert_eq!(p.state, "WY");
        assert_eq!(p.date_time, T0);
        assert_eq!(p.extra.len(), 156);
        assert!(p.extra.starts_with("WN_HS_bnpk"), "{}", p.extra);
    }

    #[test]
    fn golden_event_1() {
        let a = auction(1);
        assert_eq!(a.id, 1000);
        assert_eq!(a.item_name, "wkx mgee");
        assert_eq!(a.description, "eszpqxtdxrvwmmywkmogoahf");
        assert_eq!((a.initial_bid, a.reserve), (28_873, 29_448));
        assert_eq!((a.date_time, a.expires), (T0, T0 + 11));
        assert_eq!((a.seller, a.category), (1000, 13));
        assert_eq!(a.extra.len(), 346);
        assert!(a.extra.starts_with("zcurskufss"), "{}", a.extra);
    }

    #[test]
    fn golden_events_2_3() {
        let a = auction(2);
        assert_eq!(a.id, 1001);
        assert_eq!((a.initial_bid, a.reserve), (25_626_290, 28_805_847));
        assert_eq!((a.date_time, a.expires), (T0, T0 + 202));
        assert_eq!((a.seller, a.category), (1000, 12));
        let a = auction(3);
        assert_eq!(a.id, 1002);
        assert_eq!(a.item_name, "gxycmhtobprpd");
        assert_eq!((a.initial_bid, a.reserve), (267, 422_398));
        assert_eq!((a.date_time, a.expires), (T0, T0 + 1));
        assert_eq!((a.seller, a.category), (1000, 10));
    }

    #[test]
    fn golden_bids_4_5_7() {
        let b = bid(4);
        assert_eq!((b.auction, b.bidder, b.price), (1000, 1001, 32_530_001));
        assert_eq!(&*b.channel, "Facebook");
        assert_eq!(
            &*b.url,
            "https://www.nexmark.com/nlmv/gcg/yzf/item.htm?query=1"
        );
        assert_eq!(b.date_time, T0);
        assert_eq!(b.extra.len(), 77);
        assert!(b.extra.starts_with("fdiysaV^]N"), "{}", b.extra);

        let b = bid(5);
        assert_eq!((b.auction, b.bidder, b.price), (1000, 1009, 468_715));
        assert_eq!(&*b.channel, "Apple");
        assert_eq!(
            &*b.url,
            "https://www.nexmark.com/rppg/h__/afrw/item.htm?query=1"
        );

        let b = bid(7);
        assert_eq!((b.auction, b.bidder, b.price), (1000, 1001, 3_126_206));
        assert_eq!(&*b.channel, "channel-738");
        assert_eq!(
            &*b.url,
            "https://www.nexmark.com/hqes/tok_/__n/item.htm?query=1&channel_id=1195376640"
        );
    }

    #[test]
    fn golden_events_50_51() {
        let p = person(50);
        assert_eq!(p.id, 1001);
        assert_eq!(p.name, "Sarah Smith");
        assert_eq!(p.email_address, "f  y@yumv.com");
        assert_eq!(p.credit_card, "0892 2755 1923 0591");
        assert_eq!(p.city, "Los Angeles");
        assert_eq!(p.state, "ID");
        assert_eq!(p.date_time, T0 + 5);

        let a = auction(51);
        assert_eq!(a.id, 1003);
        assert_eq!((a.initial_bid, a.reserve), (5_037_490, 5_980_861));
        assert_eq!((a.date_time, a.expires), (T0 + 5, T0 + 8));
        assert_eq!((a.seller, a.category), (1000, 11));
    }

    #[test]
    fn golden_event_99999() {
        let b = bid(99_999);
        assert_eq!((b.auction, b.bidder, b.price), (6900, 2901, 76_433));
        assert_eq!(&*b.channel, "Baidu");
        assert_eq!(
            &*b.url,
            "https://www.nexmark.com/hscm/hxm/wpph/item.htm?query=1"
        );
        assert_eq!(b.date_time, 1_436_918_409_999);
    }

    #[test]
    fn golden_tables() {
        let hot: Vec<&str> = hot_channels().iter().map(|(_, u)| &**u).collect();
        let dirs = [
            "cozb/_r_/r_cg",
            "nlmv/gcg/yzf",
            "hscm/hxm/wpph",
            "rppg/h__/afrw",
        ];
        let want: Vec<String> = dirs
            .iter()
            .map(|d| format!("{URL}{d}/item.htm?query=1"))
            .collect();
        assert_eq!(hot, want);
        let names: Vec<&str> = hot_channels().iter().map(|(c, _)| &**c).collect();
        assert_eq!(names, HOT_CHANNELS);

        let table = channel_table();
        assert_eq!(table.len(), 10_000);
        let want = [
            ("xnhd/xcat/bwmn", "0"),
            ("_jyw/rnmg/bo_e", "-2147483648"),
            ("arin/yawv/wlac", "1073741824"),
        ];
        for (j, (dirs, id)) in want.iter().enumerate() {
            assert_eq!(&*table[j].0, format!("channel-{j}"));
            assert_eq!(
                &*table[j].1,
                format!("{URL}{dirs}/item.htm?query=1&channel_id={id}")
            );
        }
        let with_id = table
            .iter()
            .filter(|(_, u)| u.contains("&channel_id="))
            .count();
        assert_eq!(with_id, 9_015);
    }

    /// The aggregate checksums of the Nexmark specification, over a stream of events.
    #[derive(Debug, Default, PartialEq, Eq)]
    struct Sums {
        persons: i64,
        auctions: i64,
        bids: i64,
        person_id: i64,
        person_extra_len: i64,
        seller: i64,
        category: i64,
        initial_bid: i64,
        reserve: i64,
        auction_length: i64,
        auction_extra_len: i64,
        bid_auction: i64,
        bidder: i64,
        bid_price: i64,
        bid_date_time: i64,
        bid_extra_len: i64,
        url_len: i64,
        hot_channel_bids: i64,
    }

    impl Sums {
        fn add(&mut self, e: &Event) {
            match e {
                Event::Person(p) => {
                    self.persons += 1;
                    self.person_id += p.id;
                    self.person_extra_len += p.extra.len() as i64;
                }
                Event::Auction(a) => {
                    self.auctions += 1;
                    self.seller += a.seller;
                    self.category += a.category;
                    self.initial_bid += a.initial_bid;
                    self.reserve += a.reserve;
                    self.auction_length += a.expires - a.date_time;
                    self.auction_extra_len += a.extra.len() as i64;
                }
                Event::Bid(b) => {
                    self.bids += 1;
                    self.bid_auction += b.auction;
                    self.bidder += b.bidder;
                    self.bid_price += b.price;
                    self.bid_date_time += b.date_time;
                    self.bid_extra_len += b.extra.len() as i64;
                    self.url_len += b.url.len() as i64;
                    self.hot_channel_bids += HOT_CHANNELS.contains(&&*b.channel) as i64;
                }
            }
        }
    }

    /// The event without its timeline-dependent fields (timestamps and `expires`).
    fn timeless(e: Event) -> Event {
        match e {
            Event::Person(p) => Event::Person(Person { date_time: 0, ..p }),
            Event::Auction(a) => Event::Auction(Auction {
                date_time: 0,
                expires: 0,
                ..a
            }),
            Event::Bid(b) => Event::Bid(Bid { date_time: 0, ..b }),
        }
    }

    #[test]
    fn checksums_g0_100k() {
        let mut s = Sums::default();
        events(&g0(100_000)).for_each(|e| s.add(&e));
        let want = Sums {
            persons: 2_000,
            auctions: 6_000,
            bids: 92_000,
            person_id: 3_999_000,
            person_extra_len: 278_557,
            seller: 11_266_569,
            category: 71_909,
            initial_bid: 42_818_320_499,
            reserve: 84_210_428_628,
            auction_length: 1_006_849,
            auction_extra_len: 2_341_727,
            bid_auction: 363_648_112,
            bidder: 172_130_989,
            bid_price: 667_953_890_778,
            bid_date_time: 132_196_493_259_970_000,
            bid_extra_len: 6_211_297,
            url_len: 5_828_516,
            hot_channel_bids: 45_980,
        };
        assert_eq!(s, want);
    }

    /// G0 and G0-P4 over 1,000,000 events: the checksums of both, and the same events
    /// apart from timestamps and `expires`. The splits of G0-P4 cover contiguous id ranges
    /// in order, so both streams hold the same event ids at the same positions.
    #[test]
    fn checksums_g0_and_p4_1m() {
        let p4 = NexmarkConfig {
            num_event_generators: 4,
            ..g0(1_000_000)
        };
        let (mut s1, mut s4) = (Sums::default(), Sums::default());
        let mut n = 0;
        for (a, b) in events(&g0(1_000_000)).zip(events(&p4)) {
            s1.add(&a);
            s4.add(&b);
            assert_eq!(timeless(a), timeless(b));
            n += 1;
        }
        assert_eq!(n, 1_000_000);
        let want = Sums {
            persons: 20_000,
            auctions: 60_000,
            bids: 920_000,
            person_id: 219_990_000,
            person_extra_len: 2_784_290,
            seller: 650_505_402,
            category: 720_077,
            initial_bid: 430_393_391_801,
            reserve: 857_978_436_688,
            auction_length: 10_022_075,
            auction_extra_len: 23_392_922,
            bid_auction: 28_477_004_074,
            bidder: 9_975_213_650,
            bid_price: 6_659_865_839_701,
            bid_date_time: 1_321_964_973_999_700_000,
            bid_extra_len: 62_095_010,
            url_len: 58_282_450,
            hot_channel_bids: 460_063,
        };
        assert_eq!(s1, want);
        let want4 = Sums {
            auction_length: 40_204_643,
            bid_date_time: 1_321_964_974_000_180_000,
            ..want
        };
        assert_eq!(s4, want4);
    }

    #[test]
    fn splitting_changes_only_timestamps_and_expires() {
        let config = g0(100_003);
        let split = NexmarkConfig {
            num_event_generators: 3,
            ..config.clone()
        };
        let sorted = |c: &NexmarkConfig| {
            let mut v: Vec<Event> = events(c).map(timeless).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(sorted(&config), sorted(&split));
        // The timestamps do change: each split starts at the base time, 300 µs apart.
        let gens = splits(&split);
        assert_eq!(gens.len(), 3);
        for g in &gens {
            assert_eq!(g.event(0).date_time(), BASE_TIME);
            assert_eq!(g.event(10).date_time(), BASE_TIME + 3);
        }
    }

    #[test]
    fn out_of_order_holds_the_same_events() {
        let config = g0(100_000);
        let ooo = NexmarkConfig {
            out_of_order_group_size: 1000,
            ..config.clone()
        };
        let mut permuted: Vec<Event> = events(&ooo).collect();
        let mut plain: Vec<Event> = events(&config).collect();
        assert_ne!(permuted, plain, "the stream is permuted");
        // Within each block of 1000 the order changes, never across blocks.
        for (i, e) in permuted.iter().enumerate() {
            let block_start = BASE_TIME + (i as i64 / 1000) * 100;
            assert!((block_start..block_start + 100).contains(&e.date_time()));
        }
        permuted.sort_unstable();
        plain.sort_unstable();
        assert_eq!(permuted, plain);
    }

    #[test]
    fn events_are_pure_functions_of_the_count() {
        let g = GeneratorConfig::new(g0(0));
        for c in [0, 1, 4, 50, 777, 123_456] {
            assert_eq!(g.event(c), g.event(c));
        }
    }

    /// Generation speed: `cargo test --release -p weir-nexmark -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing; run in release mode"]
    fn speed_10m() {
        let n = 10_000_000;
        let start = std::time::Instant::now();
        let mut bytes = 0usize;
        for e in events(&g0(n)) {
            bytes += std::hint::black_box(&e).date_time() as usize & 1;
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{n} events in {secs:.3} s: {:.2} M events/s ({bytes})",
            n as f64 / secs / 1e6
        );
    }

    /// Parallel generation speed, one thread per split:
    /// `cargo test --release -p weir-nexmark -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing; run in release mode"]
    fn speed_parallel() {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
        let n = 10_000_000;
        let config = NexmarkConfig {
            num_event_generators: threads,
            ..g0(n)
        };
        let start = std::time::Instant::now();
        std::thread::scope(|s| {
            for g in splits(&config) {
                s.spawn(move || {
                    for c in 0..g.max_events {
                        std::hint::black_box(g.event(c));
                    }
                });
            }
        });
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{n} events on {threads} threads in {secs:.3} s: {:.2} M events/s",
            n as f64 / secs / 1e6
        );
    }
}
