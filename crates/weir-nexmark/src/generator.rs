//! The canonical Nexmark generator: every event is a pure function of its event id (kind,
//! entity ids, and random fields drawn from a `java.util.Random` seeded with the id) and
//! of its event number (timestamp). `docs/nexmark.md` describes the model.

use crate::config::NexmarkConfig;
use crate::model::{Auction, Bid, Event, Person};
use crate::rng::JavaRandom;
use std::sync::{Arc, OnceLock};

const FIRST_PERSON_ID: i64 = 1000;
const FIRST_AUCTION_ID: i64 = 1000;
const FIRST_CATEGORY_ID: i64 = 10;
const NUM_CATEGORIES: i32 = 5;
const PERSON_ID_LEAD: i64 = 10;
const AUCTION_ID_LEAD: i64 = 10;
const HOT_SELLER_RATIO: i64 = 100;
const HOT_AUCTION_RATIO: i64 = 100;
const HOT_BIDDER_RATIO: i64 = 100;
const CHANNELS_NUMBER: usize = 10_000;
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

/// One generator's share of the stream: its events `0..max_events`, on a timeline that
/// starts at `base_time`.
///
/// ```
/// use weir_nexmark::{GeneratorConfig, NexmarkConfig};
/// let g = GeneratorConfig::new(NexmarkConfig { num_events: 100, ..Default::default() });
/// let parts = g.split(3);
/// assert_eq!(parts.iter().map(|p| p.max_events).collect::<Vec<_>>(), vec![33, 33, 34]);
/// assert_eq!(parts[1].first_event_id, 33);
/// ```
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
    /// The whole stream as one generator (not yet split). `num_events = 0` (unbounded)
    /// stands for Nexmark's practical maximum.
    pub fn new(config: NexmarkConfig) -> Self {
        let max_events = if config.num_events == 0 {
            let largest = config
                .avg_person_byte_size
                .max(config.avg_auction_byte_size)
                .max(config.avg_bid_byte_size);
            i64::MAX as u64 / (config.total_proportion() * largest).max(1)
        } else {
            config.num_events
        };
        let inter_event_delay_us = 1_000_000.0 / config.first_event_rate.max(1) as f64
            * config.num_event_generators.max(1) as f64;
        GeneratorConfig {
            base_time: config.base_time,
            first_event_id: config.first_event_id,
            first_event_number: config.first_event_number,
            max_events,
            inter_event_delay_us,
            config,
        }
    }

    /// Splits into `n` generators with contiguous id ranges on parallel timelines (the
    /// last takes the remainder). Each keeps this generator's event spacing.
    pub fn split(&self, n: u64) -> Vec<GeneratorConfig> {
        let n = n.max(1);
        let sub = self.max_events / n;
        (0..n)
            .map(|i| GeneratorConfig {
                first_event_id: self.first_event_id + (i * sub) as i64,
                max_events: if i == n - 1 {
                    self.max_events - sub * (n - 1)
                } else {
                    sub
                },
                ..self.clone()
            })
            .collect()
    }

    /// The event number of this generator's `count`-th event (0-based): events are
    /// permuted within blocks of `out_of_order_group_size`.
    #[inline]
    pub fn event_number(&self, count: u64) -> i64 {
        let e = self.first_event_number + count as i64;
        let n = self.config.out_of_order_group_size.max(1) as i64;
        if n == 1 {
            e
        } else {
            (e / n) * n + (e * 953) % n
        }
    }

    /// The timestamp of event number `number`.
    #[inline]
    fn timestamp_of_number(&self, number: i64) -> i64 {
        self.base_time + (number as f64 * self.inter_event_delay_us) as i64 / 1000
    }

    /// The timestamp of this generator's `count`-th event.
    #[inline]
    pub fn timestamp(&self, count: u64) -> i64 {
        self.timestamp_of_number(self.event_number(count))
    }

    /// This generator's `count`-th event.
    pub fn event(&self, count: u64) -> Event {
        let number = self.event_number(count);
        let id = self.first_event_id + number;
        let ts = self.timestamp_of_number(number);
        let c = &self.config;
        let mut rng = JavaRandom::new(id);
        let r = id.rem_euclid(c.total_proportion() as i64);
        if r < c.person_proportion as i64 {
            Event::Person(self.person(id, ts, &mut rng))
        } else if r < (c.person_proportion + c.auction_proportion) as i64 {
            Event::Auction(self.auction(number, id, ts, &mut rng))
        } else {
            Event::Bid(self.bid(id, ts, &mut rng))
        }
    }

    /// The newest person id (base 0) at or before event `id`.
    fn last_person(&self, id: i64) -> i64 {
        let c = &self.config;
        let (t, pp) = (c.total_proportion() as i64, c.person_proportion as i64);
        let (epoch, offset) = (id / t, (id % t).min(pp - 1));
        epoch * pp + offset
    }

    /// The newest auction id (base 0) at or before event `id`.
    fn last_auction(&self, id: i64) -> i64 {
        let c = &self.config;
        let t = c.total_proportion() as i64;
        let (pp, ap) = (c.person_proportion as i64, c.auction_proportion as i64);
        let (mut epoch, mut offset) = (id / t, id % t);
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

    /// A random recent person id (base 0), possibly a few ahead of the newest.
    fn random_person(&self, id: i64, rng: &mut JavaRandom) -> i64 {
        let n = self.last_person(id) + 1;
        let active = n.min(self.config.num_active_people as i64);
        n - active + rng.below_i64(active + PERSON_ID_LEAD)
    }

    /// A random auction id (base 0) among those in flight, possibly a few ahead.
    fn random_auction(&self, id: i64, rng: &mut JavaRandom) -> i64 {
        let hi = self.last_auction(id);
        let lo = (hi - self.config.num_in_flight_auctions as i64).max(0);
        lo + rng.below_i64(hi - lo + 1 + AUCTION_ID_LEAD)
    }

    fn person(&self, id: i64, ts: i64, rng: &mut JavaRandom) -> Person {
        let pid = self.last_person(id) + FIRST_PERSON_ID;
        let first = FIRST_NAMES[rng.below_i32(FIRST_NAMES.len() as i32) as usize];
        let last = LAST_NAMES[rng.below_i32(LAST_NAMES.len() as i32) as usize];
        let name = format!("{first} {last}");
        let mut email = rand_string(rng, 7, b' ');
        email.push('@');
        email.push_str(&rand_string(rng, 5, b' '));
        email.push_str(".com");
        let mut credit_card = String::with_capacity(19);
        for i in 0..4 {
            if i > 0 {
                credit_card.push(' ');
            }
            let n = rng.below_i32(10_000);
            for d in [1000, 100, 10, 1] {
                credit_card.push((b'0' + (n / d % 10) as u8) as char);
            }
        }
        let city = US_CITIES[rng.below_i32(US_CITIES.len() as i32) as usize];
        let state = US_STATES[rng.below_i32(US_STATES.len() as i32) as usize];
        let size = 8 + name.len() + email.len() + credit_card.len() + city.len() + state.len();
        let extra = extra(rng, size as i64, self.config.avg_person_byte_size as i64);
        Person {
            id: pid,
            name,
            email_address: email,
            credit_card,
            city: city.to_string(),
            state: state.to_string(),
            date_time: ts,
            extra,
        }
    }

    fn auction(&self, number: i64, id: i64, ts: i64, rng: &mut JavaRandom) -> Auction {
        let c = &self.config;
        let aid = self.last_auction(id) + FIRST_AUCTION_ID;
        let seller = if rng.below_i32(c.hot_sellers_ratio as i32) > 0 {
            (self.last_person(id) / HOT_SELLER_RATIO) * HOT_SELLER_RATIO
        } else {
            self.random_person(id, rng)
        } + FIRST_PERSON_ID;
        let category = FIRST_CATEGORY_ID + i64::from(rng.below_i32(NUM_CATEGORIES));
        let initial_bid = price(rng);
        // The auction lasts about as long as it takes to create `num_in_flight_auctions`
        // more auctions.
        let ahead = (c.num_in_flight_auctions * c.total_proportion() / c.auction_proportion) as i64;
        let horizon = self.timestamp_of_number(number + ahead) - ts;
        let expires = ts + 1 + rng.below_i64((horizon * 2).max(1));
        let item_name = rand_string(rng, 20, b' ');
        let description = rand_string(rng, 100, b' ');
        let reserve = initial_bid + price(rng);
        let size = 8 + item_name.len() + description.len() + 40;
        let extra = extra(rng, size as i64, c.avg_auction_byte_size as i64);
        Auction {
            id: aid,
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

    fn bid(&self, id: i64, ts: i64, rng: &mut JavaRandom) -> Bid {
        let c = &self.config;
        let auction = if rng.below_i32(c.hot_auction_ratio as i32) > 0 {
            (self.last_auction(id) / HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO
        } else {
            self.random_auction(id, rng)
        } + FIRST_AUCTION_ID;
        let bidder = if rng.below_i32(c.hot_bidders_ratio as i32) > 0 {
            (self.last_person(id) / HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1
        } else {
            self.random_person(id, rng)
        } + FIRST_PERSON_ID;
        let price = price(rng);
        let extra = extra(rng, 32, c.avg_bid_byte_size as i64);
        let channels = channels();
        let (channel, url) = if rng.below_i32(2) > 0 {
            let i = rng.below_i32(HOT_CHANNELS.len() as i32) as usize;
            &channels.hot[i]
        } else {
            &channels.table[rng.below_i32(CHANNELS_NUMBER as i32) as usize]
        };
        Bid {
            auction,
            bidder,
            price,
            channel: Arc::clone(channel),
            url: Arc::clone(url),
            date_time: ts,
            extra,
        }
    }
}

/// A price in cents, log-uniform from $1 to $1M.
#[inline]
fn price(rng: &mut JavaRandom) -> i64 {
    (10f64.powf(rng.next_f64() * 6.0) * 100.0 + 0.5).floor() as i64
}

/// 3 to `max - 1` characters, each `pad` with probability 1/13 and otherwise a random
/// lower-case letter, with leading and trailing spaces removed.
fn rand_string(rng: &mut JavaRandom, max: i32, pad: u8) -> String {
    let len = MIN_STRING_LENGTH + rng.below_i32(max - MIN_STRING_LENGTH);
    let mut s = String::with_capacity(len as usize);
    for _ in 0..len {
        if rng.below_i32(13) == 0 {
            s.push(pad as char);
        } else {
            s.push((b'a' + rng.below_i32(26) as u8) as char);
        }
    }
    let trimmed = s.trim_matches(' ');
    if trimmed.len() == s.len() {
        s
    } else {
        trimmed.to_string()
    }
}

/// Exactly `len` characters, six per random `i32` (codes 72..=122).
#[inline]
fn exact_string(rng: &mut JavaRandom, len: i64) -> String {
    let mut s = String::with_capacity(len.max(0) as usize);
    let (mut v, mut left) = (0i32, 0);
    for _ in 0..len {
        if left == 0 {
            v = rng.next_i32();
            left = 6;
        }
        s.push((97 + v % 26) as u8 as char);
        v /= 26;
        left -= 1;
    }
    s
}

/// Padding that brings a record of `current` bytes to `avg` bytes on average.
#[inline]
fn extra(rng: &mut JavaRandom, current: i64, avg: i64) -> String {
    if current > avg {
        return String::new();
    }
    let d = avg - current;
    let delta = (d as f64 * 0.2 + 0.5).floor() as i64;
    let size = d - delta
        + if delta == 0 {
            0
        } else {
            i64::from(rng.below_i32((2 * delta) as i32))
        };
    exact_string(rng, size)
}

/// The fixed (channel, url) pairs bids draw from, shared by reference.
struct Channels {
    hot: Vec<(Arc<str>, Arc<str>)>,
    table: Vec<(Arc<str>, Arc<str>)>,
}

fn base_url(rng: &mut JavaRandom) -> String {
    let mut url = String::from("https://www.nexmark.com/");
    for _ in 0..3 {
        url.push_str(&rand_string(rng, 5, b'_'));
        url.push('/');
    }
    url.push_str("item.htm?query=1");
    url
}

fn channels() -> &'static Channels {
    static CHANNELS: OnceLock<Channels> = OnceLock::new();
    CHANNELS.get_or_init(|| {
        let hot = HOT_CHANNELS
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let url = base_url(&mut JavaRandom::new(CHANNELS_NUMBER as i64 + i as i64));
                (Arc::from(*name), Arc::from(url))
            })
            .collect();
        let table = (0..CHANNELS_NUMBER)
            .map(|j| {
                let mut rng = JavaRandom::new(j as i64);
                let mut url = base_url(&mut rng);
                if rng.below_i32(10) > 0 {
                    let id = (j as i32).reverse_bits().wrapping_abs();
                    url.push_str(&format!("&channel_id={id}"));
                }
                (Arc::from(format!("channel-{j}")), Arc::from(url))
            })
            .collect();
        Channels { hot, table }
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

    fn g0(n: u64) -> NexmarkConfig {
        NexmarkConfig {
            num_events: n,
            ..Default::default()
        }
    }

    #[test]
    fn golden_events_of_g0() {
        let ev: Vec<Event> = events(&g0(100_000)).collect();
        let Event::Person(p) = &ev[0] else {
            panic!("event 0 is a person")
        };
        assert_eq!(
            (p.id, p.name.as_str(), p.email_address.as_str()),
            (1000, "Peter Jones", "nhd@xcat.com")
        );
        assert_eq!(
            (p.credit_card.as_str(), p.city.as_str(), p.state.as_str()),
            ("7241 7320 9143 4888", "Portland", "WY")
        );
        assert_eq!((p.date_time, p.extra.len()), (1_436_918_400_000, 156));
        assert!(p.extra.starts_with("WN_HS_bnpk"));
        let Event::Auction(a) = &ev[1] else {
            panic!("event 1 is an auction")
        };
        assert_eq!(
            (a.id, a.item_name.as_str(), a.description.as_str()),
            (1000, "wkx mgee", "eszpqxtdxrvwmmywkmogoahf")
        );
        assert_eq!(
            (a.initial_bid, a.reserve, a.expires, a.seller, a.category),
            (28873, 29448, 1_436_918_400_011, 1000, 13)
        );
        assert_eq!(a.extra.len(), 346);
        assert!(a.extra.starts_with("zcurskufss"));
        let Event::Auction(a) = &ev[2] else {
            panic!("event 2 is an auction")
        };
        assert_eq!(
            (
                a.id,
                a.initial_bid,
                a.reserve,
                a.expires,
                a.seller,
                a.category
            ),
            (1001, 25626290, 28805847, 1_436_918_400_202, 1000, 12)
        );
        let Event::Auction(a) = &ev[3] else {
            panic!("event 3 is an auction")
        };
        assert_eq!(
            (a.id, a.item_name.as_str(), a.initial_bid, a.reserve),
            (1002, "gxycmhtobprpd", 267, 422398)
        );
        assert_eq!(
            (a.expires, a.seller, a.category),
            (1_436_918_400_001, 1000, 10)
        );
        let Event::Bid(b) = &ev[4] else {
            panic!("event 4 is a bid")
        };
        assert_eq!((b.auction, b.bidder, b.price), (1000, 1001, 32530001));
        assert_eq!(&*b.channel, "Facebook");
        assert_eq!(
            &*b.url,
            "https://www.nexmark.com/nlmv/gcg/yzf/item.htm?query=1"
        );
        assert_eq!((b.date_time, b.extra.len()), (1_436_918_400_000, 77));
        assert!(b.extra.starts_with("fdiysaV^]N"));
        let Event::Bid(b) = &ev[5] else {
            panic!("event 5 is a bid")
        };
        assert_eq!((b.auction, b.bidder, b.price), (1000, 1009, 468715));
        assert_eq!(&*b.channel, "Apple");
        assert!(b.url.contains("/rppg/h__/afrw/"));
        let Event::Bid(b) = &ev[7] else {
            panic!("event 7 is a bid")
        };
        assert_eq!((b.auction, b.bidder, b.price), (1000, 1001, 3126206));
        assert_eq!(&*b.channel, "channel-738");
        assert_eq!(
            &*b.url,
            "https://www.nexmark.com/hqes/tok_/__n/item.htm?query=1&channel_id=1195376640"
        );
        let Event::Person(p) = &ev[50] else {
            panic!("event 50 is a person")
        };
        assert_eq!(
            (p.id, p.name.as_str(), p.email_address.as_str()),
            (1001, "Sarah Smith", "f  y@yumv.com")
        );
        assert_eq!(
            (p.credit_card.as_str(), p.city.as_str(), p.state.as_str()),
            ("0892 2755 1923 0591", "Los Angeles", "ID")
        );
        assert_eq!(p.date_time, 1_436_918_400_005);
        let Event::Auction(a) = &ev[51] else {
            panic!("event 51 is an auction")
        };
        assert_eq!(
            (
                a.id,
                a.initial_bid,
                a.reserve,
                a.date_time,
                a.expires,
                a.seller,
                a.category
            ),
            (
                1003,
                5037490,
                5980861,
                1_436_918_400_005,
                1_436_918_400_008,
                1000,
                11
            )
        );
        let Event::Bid(b) = &ev[99_999] else {
            panic!("event 99999 is a bid")
        };
        assert_eq!((b.auction, b.bidder, b.price), (6900, 2901, 76433));
        assert_eq!(&*b.channel, "Baidu");
        assert!(b.url.contains("/hscm/hxm/wpph/"));
        assert_eq!(b.date_time, 1_436_918_409_999);
    }

    #[test]
    fn golden_channel_tables() {
        let c = channels();
        let dirs: Vec<&str> = c.hot.iter().map(|(_, u)| &u[24..u.len() - 17]).collect();
        assert_eq!(
            dirs,
            [
                "cozb/_r_/r_cg",
                "nlmv/gcg/yzf",
                "hscm/hxm/wpph",
                "rppg/h__/afrw"
            ]
        );
        assert_eq!(
            &*c.table[0].1,
            "https://www.nexmark.com/xnhd/xcat/bwmn/item.htm?query=1&channel_id=0"
        );
        assert!(c.table[1].1.contains("/_jyw/rnmg/bo_e/"));
        assert!(c.table[1].1.ends_with("&channel_id=-2147483648"));
        assert!(c.table[2].1.contains("/arin/yawv/wlac/"));
        assert!(c.table[2].1.ends_with("&channel_id=1073741824"));
        let with_id = c
            .table
            .iter()
            .filter(|(_, u)| u.contains("channel_id"))
            .count();
        assert_eq!(with_id, 9_015);
    }

    /// Sums over the events of a stream, as in the specification's checksum table.
    #[derive(Debug, Default, PartialEq)]
    struct Checksums {
        kinds: (u64, u64, u64),
        person_id: i64,
        person_extra: u64,
        seller: i64,
        category: i64,
        initial_bid: i64,
        reserve: i64,
        auction_length: i64,
        auction_extra: u64,
        bid_auction: i64,
        bidder: i64,
        price: i64,
        bid_time: i128,
        bid_extra: u64,
        url: u64,
        hot_channels: u64,
    }

    fn checksums(ev: impl Iterator<Item = Event>) -> Checksums {
        let mut c = Checksums::default();
        for e in ev {
            match e {
                Event::Person(p) => {
                    c.kinds.0 += 1;
                    c.person_id += p.id;
                    c.person_extra += p.extra.len() as u64;
                }
                Event::Auction(a) => {
                    c.kinds.1 += 1;
                    c.seller += a.seller;
                    c.category += a.category;
                    c.initial_bid += a.initial_bid;
                    c.reserve += a.reserve;
                    c.auction_length += a.expires - a.date_time;
                    c.auction_extra += a.extra.len() as u64;
                }
                Event::Bid(b) => {
                    c.kinds.2 += 1;
                    c.bid_auction += b.auction;
                    c.bidder += b.bidder;
                    c.price += b.price;
                    c.bid_time += i128::from(b.date_time);
                    c.bid_extra += b.extra.len() as u64;
                    c.url += b.url.len() as u64;
                    c.hot_channels += u64::from(HOT_CHANNELS.contains(&&*b.channel));
                }
            }
        }
        c
    }

    #[test]
    fn golden_checksums_of_the_first_100k_events_of_g0() {
        assert_eq!(
            checksums(events(&g0(100_000))),
            Checksums {
                kinds: (2_000, 6_000, 92_000),
                person_id: 3_999_000,
                person_extra: 278_557,
                seller: 11_266_569,
                category: 71_909,
                initial_bid: 42_818_320_499,
                reserve: 84_210_428_628,
                auction_length: 1_006_849,
                auction_extra: 2_341_727,
                bid_auction: 363_648_112,
                bidder: 172_130_989,
                price: 667_953_890_778,
                bid_time: 132_196_493_259_970_000,
                bid_extra: 6_211_297,
                url: 5_828_516,
                hot_channels: 45_980,
            }
        );
    }

    #[test]
    fn golden_checksums_of_1m_events_in_one_and_four_timelines() {
        let expected = Checksums {
            kinds: (20_000, 60_000, 920_000),
            person_id: 219_990_000,
            person_extra: 2_784_290,
            seller: 650_505_402,
            category: 720_077,
            initial_bid: 430_393_391_801,
            reserve: 857_978_436_688,
            auction_length: 10_022_075,
            auction_extra: 23_392_922,
            bid_auction: 28_477_004_074,
            bidder: 9_975_213_650,
            price: 6_659_865_839_701,
            bid_time: 1_321_964_973_999_700_000,
            bid_extra: 62_095_010,
            url: 58_282_450,
            hot_channels: 460_063,
        };
        assert_eq!(checksums(events(&g0(1_000_000))), expected);
        // Four timelines: the same ids and fields; only times and expiries move.
        let p4 = NexmarkConfig {
            num_event_generators: 4,
            ..g0(1_000_000)
        };
        assert_eq!(
            checksums(events(&p4)),
            Checksums {
                auction_length: 40_204_643,
                bid_time: 1_321_964_974_000_180_000,
                ..expected
            }
        );
    }

    /// Without times, an event is the same whatever the split.
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
    fn splitting_moves_only_times() {
        let one: Vec<Event> = events(&g0(10_000)).map(timeless).collect();
        for n in [2, 3, 7] {
            let split = NexmarkConfig {
                num_event_generators: n,
                ..g0(10_000)
            };
            let many: Vec<Event> = events(&split).map(timeless).collect();
            assert_eq!(many, one, "{n} timelines");
        }
    }

    #[test]
    fn out_of_order_groups_permute_the_same_events() {
        let mut in_order: Vec<Event> = events(&g0(100_000)).collect();
        let permuted_config = NexmarkConfig {
            out_of_order_group_size: 1000,
            ..g0(100_000)
        };
        let mut permuted: Vec<Event> = events(&permuted_config).collect();
        assert_ne!(permuted, in_order, "the order differs");
        in_order.sort();
        permuted.sort();
        assert_eq!(permuted, in_order, "the events are the same");
    }
}
