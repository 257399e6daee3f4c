//! Every implemented Nexmark query, run by weir on a small generated stream at parallelism
//! 1 and 2, against a plain single-threaded reference model of its result over the same
//! events. The models below are naive on purpose (vectors, hash maps, sorting; no
//! streaming, no watermarks) and share nothing with the queries but the generator.
//!
//! The models are themselves checked against the published G0 golden values of the
//! Nexmark specification (first 100,000 events).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use weir::prelude::*;
use weir_bench::nexmark::{
    Change, events, materialize, q0, q1, q2, q3, q4, q5, q6, q7, q8, q9, q11, q14, q17, q18, q19,
    q20, q21, q22,
};
use weir_nexmark::{Auction, Bid, Event, NexmarkConfig, Person};

/// A stream long enough in event time for many windows, sessions and auction expiries:
/// 20,000 events at 200 events/s of event time is 100 s.
const EVENTS: u64 = 20_000;
const RATE: u64 = 200;

fn config(generators: u64) -> NexmarkConfig {
    NexmarkConfig {
        num_events: EVENTS,
        num_event_generators: generators,
        first_event_rate: RATE,
        ..Default::default()
    }
}

/// The events of the configuration, split by split.
fn all(config: &NexmarkConfig) -> Vec<Event> {
    weir_nexmark::events(config).collect()
}

fn people(ev: &[Event]) -> Vec<Person> {
    ev.iter().cloned().filter_map(Event::person).collect()
}
fn auctions_of(ev: &[Event]) -> Vec<Auction> {
    ev.iter().cloned().filter_map(Event::auction).collect()
}
fn bids_of(ev: &[Event]) -> Vec<Bid> {
    ev.iter().cloned().filter_map(Event::bid).collect()
}

/// Runs a query in weir at `parallelism` (with as many generator timelines) and returns
/// its output (each subtask's in the order it emitted them).
fn run<T: Data>(parallelism: usize, query: fn(&Stream<Event>) -> Stream<T>) -> Vec<T> {
    run_with(parallelism, config(parallelism as u64), Env::new(), query)
}

fn run_with<T: Data>(
    parallelism: usize,
    config: NexmarkConfig,
    env: Env,
    query: fn(&Stream<Event>) -> Stream<T>,
) -> Vec<T> {
    let env = env.parallelism(parallelism);
    let out = query(&events(&env, config)).collect();
    env.execute("nexmark-test").expect("the query runs");
    out.values()
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

/// Checks a query at parallelism 1 and 2 against its model.
fn check<T: Data + Ord + std::fmt::Debug>(
    query: fn(&Stream<Event>) -> Stream<T>,
    model: fn(&[Event]) -> Vec<T>,
) {
    for p in [1, 2] {
        let expected = sorted(model(&all(&config(p as u64))));
        assert!(
            !expected.is_empty(),
            "the model yields rows at parallelism {p}"
        );
        let got = sorted(run(p, query));
        assert_eq!(got.len(), expected.len(), "row count at parallelism {p}");
        assert_eq!(got, expected, "rows at parallelism {p}");
    }
}

/// Checks an updating query: its materialized changelog against the model.
fn check_changes<T: Data + Ord + std::hash::Hash + std::fmt::Debug>(
    query: fn(&Stream<Event>) -> Stream<Change<T>>,
    model: fn(&[Event]) -> Vec<T>,
) {
    for p in [1, 2] {
        let expected = sorted(model(&all(&config(p as u64))));
        assert!(
            !expected.is_empty(),
            "the model yields rows at parallelism {p}"
        );
        let got = materialize(run(p, query));
        assert_eq!(got, expected, "materialized rows at parallelism {p}");
    }
}

// ---------------------------------------------------------------------------------------
// Reference models

fn model_q0(ev: &[Event]) -> Vec<q0::Row> {
    bids_of(ev)
        .into_iter()
        .map(|b| q0::Row {
            auction: b.auction,
            bidder: b.bidder,
            price: b.price,
            date_time: b.date_time,
            extra: b.extra,
        })
        .collect()
}

fn model_q1(ev: &[Event]) -> Vec<q1::Row> {
    bids_of(ev)
        .into_iter()
        .map(|b| q1::Row {
            auction: b.auction,
            bidder: b.bidder,
            price_milli: b.price * 908,
            date_time: b.date_time,
            extra: b.extra,
        })
        .collect()
}

fn model_q2(ev: &[Event]) -> Vec<q2::Row> {
    bids_of(ev)
        .into_iter()
        .filter(|b| b.auction % 123 == 0)
        .map(|b| q2::Row {
            auction: b.auction,
            price: b.price,
        })
        .collect()
}

fn model_q3(ev: &[Event]) -> Vec<q3::Row> {
    let persons = people(ev);
    let mut rows = Vec::new();
    for a in auctions_of(ev).iter().filter(|a| a.category == 10) {
        for p in persons.iter().filter(|p| p.id == a.seller) {
            if ["OR", "ID", "CA"].contains(&p.state.as_str()) {
                rows.push(q3::Row {
                    name: p.name.clone(),
                    city: p.city.clone(),
                    state: p.state.clone(),
                    id: a.id,
                });
            }
        }
    }
    rows
}

fn model_q4(ev: &[Event]) -> Vec<q4::Row> {
    let mut bids: HashMap<i64, Vec<Bid>> = HashMap::new();
    for b in bids_of(ev) {
        bids.entry(b.auction).or_default().push(b);
    }
    let mut per_category: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for a in auctions_of(ev) {
        let best = bids
            .get(&a.id)
            .into_iter()
            .flatten()
            .filter(|b| a.date_time <= b.date_time && b.date_time <= a.expires)
            .map(|b| b.price)
            .max();
        if let Some(price) = best {
            per_category.entry(a.category).or_default().push(price);
        }
    }
    per_category
        .into_iter()
        .map(|(category, finals)| q4::Row {
            category,
            avg_final: finals.iter().sum::<i64>() / finals.len() as i64,
        })
        .collect()
}

/// Per auction, the best bid (highest price, then earliest) among those `valid` for it.
fn best_bids(ev: &[Event], valid: impl Fn(&Auction, &Bid) -> bool) -> Vec<(Auction, Bid)> {
    let mut bids: HashMap<i64, Vec<Bid>> = HashMap::new();
    for b in bids_of(ev) {
        bids.entry(b.auction).or_default().push(b);
    }
    let mut out = Vec::new();
    for a in auctions_of(ev) {
        let mut best: Option<&Bid> = None;
        for b in bids.get(&a.id).into_iter().flatten() {
            if valid(&a, b)
                && best.is_none_or(|x| {
                    b.price > x.price || (b.price == x.price && b.date_time < x.date_time)
                })
            {
                best = Some(b);
            }
        }
        if let Some(b) = best {
            out.push((a.clone(), b.clone()));
        }
    }
    out
}

fn model_q6(ev: &[Event]) -> Vec<q6::Row> {
    let sold = best_bids(ev, |a, b| {
        a.date_time <= b.date_time && b.date_time < a.expires && b.price >= a.reserve
    });
    let mut per_seller: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
    for (a, b) in sold {
        per_seller
            .entry(a.seller)
            .or_default()
            .push((b.date_time, b.price));
    }
    per_seller
        .into_iter()
        .map(|(seller, mut sales)| {
            sales.sort();
            let last = &sales[sales.len().saturating_sub(10)..];
            q6::Row {
                seller,
                avg_price: last.iter().map(|s| s.1).sum::<i64>() / last.len() as i64,
            }
        })
        .collect()
}

fn model_q9(ev: &[Event]) -> Vec<q9::Row> {
    best_bids(ev, |a, b| {
        a.date_time <= b.date_time && b.date_time <= a.expires
    })
    .into_iter()
    .map(|(a, b)| q9::Row {
        auction: a,
        bid_auction: b.auction,
        bidder: b.bidder,
        price: b.price,
        bid_date_time: b.date_time,
        bid_extra: b.extra,
    })
    .collect()
}

/// The starts of the 10 s windows every 2 s that hold time `t`.
fn hop_starts(t: i64) -> Vec<i64> {
    let last = t - t.rem_euclid(2_000);
    (0..5).map(|k| last - k * 2_000).collect()
}

fn model_q5(ev: &[Event]) -> Vec<q5::Row> {
    let mut counts: BTreeMap<(i64, i64), u64> = BTreeMap::new();
    for b in bids_of(ev) {
        for s in hop_starts(b.date_time) {
            *counts.entry((s, b.auction)).or_default() += 1;
        }
    }
    let mut max: HashMap<i64, u64> = HashMap::new();
    for (&(s, _), &n) in &counts {
        let m = max.entry(s).or_default();
        *m = (*m).max(n);
    }
    counts
        .into_iter()
        .filter(|((s, _), n)| *n == max[s])
        .map(|((_, auction), num)| q5::Row { auction, num })
        .collect()
}

fn model_q7(ev: &[Event]) -> Vec<q7::Row> {
    let bids = bids_of(ev);
    let mut max: BTreeMap<i64, i64> = BTreeMap::new();
    for b in &bids {
        let m = max
            .entry(b.date_time.div_euclid(10_000))
            .or_insert(i64::MIN);
        *m = (*m).max(b.price);
    }
    let mut rows = Vec::new();
    for (&w, &maxprice) in &max {
        let end = (w + 1) * 10_000;
        for b in &bids {
            if b.price == maxprice && end - 10_000 <= b.date_time && b.date_time <= end {
                rows.push(q7::Row {
                    auction: b.auction,
                    price: b.price,
                    bidder: b.bidder,
                    date_time: b.date_time,
                    extra: b.extra.clone(),
                });
            }
        }
    }
    rows
}

fn model_q8(ev: &[Event]) -> Vec<q8::Row> {
    let window = |t: i64| t.div_euclid(10_000) * 10_000;
    let sellers: HashSet<(i64, i64)> = auctions_of(ev)
        .iter()
        .map(|a| (a.seller, window(a.date_time)))
        .collect();
    people(ev)
        .into_iter()
        .filter(|p| sellers.contains(&(p.id, window(p.date_time))))
        .map(|p| q8::Row {
            id: p.id,
            name: p.name,
            start_time: window(p.date_time),
        })
        .collect()
}

fn model_q11(ev: &[Event]) -> Vec<q11::Row> {
    let mut times: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for b in bids_of(ev) {
        times.entry(b.bidder).or_default().push(b.date_time);
    }
    let mut rows = Vec::new();
    for (bidder, mut ts) in times {
        ts.sort();
        let mut session: Vec<i64> = Vec::new();
        for t in ts {
            // Flink merges session windows that touch: [a, a+10 s) and [a+10 s, ...) are one
            // session, so only a gap longer than 10 s starts a new one.
            if let Some(&last) = session.last()
                && t - last > 10_000
            {
                rows.push(session_row(bidder, &session));
                session.clear();
            }
            session.push(t);
        }
        rows.push(session_row(bidder, &session));
    }
    rows
}

fn session_row(bidder: i64, times: &[i64]) -> q11::Row {
    q11::Row {
        bidder,
        bid_count: times.len() as u64,
        start_time: times[0],
        end_time: times[times.len() - 1] + 10_000,
    }
}

fn model_q14(ev: &[Event]) -> Vec<q14::Row> {
    bids_of(ev)
        .into_iter()
        .filter(|b| (1_101_322..=55_066_079).contains(&b.price))
        .map(|b| {
            let hour = (b.date_time / 1000 / 3600) % 24;
            let kind = if (8..=18).contains(&hour) {
                q14::BidTimeType::DayTime
            } else if hour <= 6 || hour >= 20 {
                q14::BidTimeType::NightTime
            } else {
                q14::BidTimeType::OtherTime
            };
            q14::Row {
                auction: b.auction,
                bidder: b.bidder,
                price_milli: b.price * 908,
                bid_time_type: kind,
                date_time: b.date_time,
                c_counts: b.extra.matches('c').count() as u64,
                extra: b.extra,
            }
        })
        .collect()
}

fn model_q17(ev: &[Event]) -> Vec<q17::Row> {
    let mut groups: BTreeMap<(i64, i64), Vec<i64>> = BTreeMap::new();
    for b in bids_of(ev) {
        groups
            .entry((b.auction, b.date_time / 86_400_000))
            .or_default()
            .push(b.price);
    }
    groups
        .into_iter()
        .map(|((auction, day), prices)| {
            let n = prices.len() as i64;
            let sum: i64 = prices.iter().sum();
            let rank =
                |lo: i64, hi: i64| prices.iter().filter(|p| lo <= **p && **p < hi).count() as u64;
            q17::Row {
                auction,
                day: civil_date(day),
                total_bids: n as u64,
                rank1_bids: rank(i64::MIN, 10_000),
                rank2_bids: rank(10_000, 1_000_000),
                rank3_bids: rank(1_000_000, i64::MAX),
                min_price: *prices.iter().min().expect("a bid"),
                max_price: *prices.iter().max().expect("a bid"),
                avg_price: sum / n,
                sum_price: sum,
            }
        })
        .collect()
}

/// `yyyy-MM-dd` of a day number since 1970-01-01, by walking the calendar (slow and plain).
fn civil_date(day: i64) -> String {
    let (mut y, mut d) = (1970, day);
    let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    while d >= if leap(y) { 366 } else { 365 } {
        d -= if leap(y) { 366 } else { 365 };
        y += 1;
    }
    let months = [
        31,
        if leap(y) { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let mut m = 0;
    while d >= months[m] {
        d -= months[m];
        m += 1;
    }
    format!("{y:04}-{:02}-{:02}", m + 1, d + 1)
}

/// q19 per auction: the prices of its 10 highest bids, highest first (which of several
/// equal prices make the cut is left open by SQL, so only prices are compared).
fn model_q19(ev: &[Event]) -> BTreeMap<i64, Vec<i64>> {
    let mut per_auction: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for b in bids_of(ev) {
        per_auction.entry(b.auction).or_default().push(b.price);
    }
    for prices in per_auction.values_mut() {
        prices.sort_by(|a, b| b.cmp(a));
        prices.truncate(10);
    }
    per_auction
}

fn model_q20(ev: &[Event]) -> Vec<q20::Row> {
    let wanted: HashMap<i64, Auction> = auctions_of(ev)
        .into_iter()
        .filter(|a| a.category == 10)
        .map(|a| (a.id, a))
        .collect();
    bids_of(ev)
        .into_iter()
        .filter_map(|b| {
            let auction = wanted.get(&b.auction)?.clone();
            Some(q20::Row { bid: b, auction })
        })
        .collect()
}

/// q18 keyed by (bidder, auction): the latest bid, the later one in stream order on ties.
fn model_q18(ev: &[Event]) -> Vec<Bid> {
    let mut last: HashMap<(i64, i64), Bid> = HashMap::new();
    for b in bids_of(ev) {
        let key = (b.bidder, b.auction);
        if last
            .get(&key)
            .is_none_or(|old| b.date_time >= old.date_time)
        {
            last.insert(key, b);
        }
    }
    last.into_values().collect()
}

fn model_q21(ev: &[Event]) -> Vec<q21::Row> {
    let mut rows = Vec::new();
    for b in bids_of(ev) {
        let from_url = b
            .url
            .split('&')
            .find_map(|kv| kv.strip_prefix("channel_id="))
            .map(str::to_string);
        let id = match b.channel.to_lowercase().as_str() {
            "apple" => Some("0".to_string()),
            "google" => Some("1".to_string()),
            "facebook" => Some("2".to_string()),
            "baidu" => Some("3".to_string()),
            _ => from_url,
        };
        if let Some(channel_id) = id {
            rows.push(q21::Row {
                auction: b.auction,
                bidder: b.bidder,
                price: b.price,
                channel: b.channel.clone(),
                channel_id,
            });
        }
    }
    rows
}

fn model_q22(ev: &[Event]) -> Vec<q22::Row> {
    bids_of(ev)
        .into_iter()
        .map(|b| {
            let parts: Vec<&str> = b.url.split('/').collect();
            let dir = |i: usize| parts.get(i).map(|s| s.to_string());
            q22::Row {
                auction: b.auction,
                bidder: b.bidder,
                price: b.price,
                channel: Arc::clone(&b.channel),
                dir1: dir(3),
                dir2: dir(4),
                dir3: dir(5),
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// The engine against the models

#[test]
fn q0_pass_through() {
    check(q0::query, model_q0);
}

#[test]
fn q1_currency_conversion() {
    check(q1::query, model_q1);
}

#[test]
fn q2_selection() {
    check(q2::query, model_q2);
}

#[test]
fn q3_local_item_suggestion() {
    check(q3::query, model_q3);
}

#[test]
fn q4_average_winning_price_per_category() {
    check_changes(q4::query, model_q4);
}

#[test]
fn q5_hot_items() {
    check(q5::query, model_q5);
}

#[test]
fn q6_average_selling_price_by_seller() {
    check_changes(q6::query, model_q6);
}

#[test]
fn q7_highest_bid() {
    check(q7::query, model_q7);
}

#[test]
fn q8_monitor_new_users() {
    check(q8::query, model_q8);
}

#[test]
fn q9_winning_bids() {
    check(q9::query, model_q9);
}

#[test]
fn q11_user_sessions() {
    check(q11::query, model_q11);
}

#[test]
fn q14_calculation() {
    check(q14::query, model_q14);
}

#[test]
fn q17_auction_statistics_per_day() {
    check_changes(q17::query, model_q17);
}

#[test]
fn q19_top_10_bids_per_auction() {
    for p in [1, 2] {
        let expected = model_q19(&all(&config(p as u64)));
        let rows = materialize(run(p, q19::query));
        let mut got: BTreeMap<i64, Vec<(u32, i64)>> = BTreeMap::new();
        for r in rows {
            got.entry(r.bid.auction)
                .or_default()
                .push((r.rank_number, r.bid.price));
        }
        let got: BTreeMap<i64, Vec<i64>> = got
            .into_iter()
            .map(|(auction, mut ranked)| {
                ranked.sort();
                let ranks: Vec<u32> = ranked.iter().map(|r| r.0).collect();
                let expected_ranks: Vec<u32> = (1..=ranked.len() as u32).collect();
                assert_eq!(ranks, expected_ranks, "ranks 1..n of auction {auction}");
                (auction, ranked.into_iter().map(|r| r.1).collect())
            })
            .collect();
        assert_eq!(got, expected, "top prices per auction at parallelism {p}");
    }
}

#[test]
fn q20_bids_of_category_10_auctions() {
    check(q20::query, model_q20);
}

#[test]
fn q18_last_bid_per_bidder_and_auction() {
    // One timeline in order: arrival order is stream order, so ties resolve as the model's.
    let expected = sorted(model_q18(&all(&config(1))));
    assert_eq!(materialize(run(1, q18::query)), expected);
    // Two subtasks interleave a key's bids from both timelines: among bids in the same
    // millisecond the winner depends on arrival, so compare keys and times.
    let key = |b: &Bid| (b.bidder, b.auction, b.date_time);
    let expected: Vec<_> = sorted(model_q18(&all(&config(2))).iter().map(key).collect());
    let got: Vec<_> = sorted(materialize(run(2, q18::query)).iter().map(key).collect());
    assert_eq!(got, expected);
}

#[test]
fn q21_add_channel_id() {
    check(q21::query, model_q21);
}

#[test]
fn q22_url_directories() {
    check(q22::query, model_q22);
}

/// The stateful queries keep their results with RocksDB state and checkpoints running.
#[test]
fn stateful_queries_on_rocksdb_with_checkpoints() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (i, p) in [1usize, 2].into_iter().enumerate() {
        let env = |name: &str| {
            Env::new()
                .state_backend(weir::BackendKind::RocksDb(Default::default()))
                .checkpoints(
                    CheckpointConfig::new(dir.path().join(format!("{name}-{i}")))
                        .interval(std::time::Duration::from_millis(20)),
                )
        };
        let c = config(p as u64);
        let ev = all(&c);
        let q4 = materialize(run_with(p, c.clone(), env("q4"), q4::query));
        assert_eq!(
            q4,
            sorted(model_q4(&ev)),
            "q4 on RocksDB at parallelism {p}"
        );
        let q7 = sorted(run_with(p, c.clone(), env("q7"), q7::query));
        assert_eq!(
            q7,
            sorted(model_q7(&ev)),
            "q7 on RocksDB at parallelism {p}"
        );
        let q3 = sorted(run_with(p, c, env("q3"), q3::query));
        assert_eq!(
            q3,
            sorted(model_q3(&ev)),
            "q3 on RocksDB at parallelism {p}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The models against the specification's golden values (G0, first 100,000 events)

#[test]
fn models_match_the_golden_values() {
    let g0 = all(&NexmarkConfig {
        num_events: 100_000,
        ..Default::default()
    });
    assert_eq!(model_q0(&g0).len(), 92_000);
    let q1_sum: i64 = model_q1(&g0).iter().map(|r| r.price_milli).sum();
    assert_eq!(q1_sum, 606_502_132_826_424);
    let q2 = model_q2(&g0);
    assert_eq!(q2.len(), 351);
    assert_eq!(q2.iter().map(|r| r.price).sum::<i64>(), 2_502_808_698);
    let q3 = model_q3(&g0);
    assert_eq!(q3.len(), 580);
    assert_eq!(q3.iter().map(|r| r.id).sum::<i64>(), 2_586_338);
    let q4: Vec<(i64, i64)> = model_q4(&g0)
        .iter()
        .map(|r| (r.category, r.avg_final))
        .collect();
    assert_eq!(
        q4,
        vec![
            (10, 33_984_800),
            (11, 33_110_270),
            (12, 32_828_496),
            (13, 32_635_248),
            (14, 34_803_745)
        ]
    );
    let q5 = model_q5(&g0);
    assert_eq!(q5.len(), 15);
    assert_eq!(q5.iter().map(|r| r.num).sum::<u64>(), 23_373);
    let q7 = model_q7(&g0);
    assert_eq!(q7.len(), 1);
    assert_eq!(q7[0].price, 99_958_591);
    let q8 = model_q8(&g0);
    assert_eq!(q8.len(), 902);
    assert_eq!(q8.iter().map(|r| r.id).sum::<i64>(), 1_543_328);
    let q11 = model_q11(&g0);
    assert_eq!(q11.len(), 1_919);
    assert_eq!(q11.iter().map(|r| r.bid_count).sum::<u64>(), 92_000);
    assert_eq!(q11.iter().map(|r| r.bid_count).max(), Some(3_499));
    let q14 = model_q14(&g0);
    assert_eq!(q14.len(), 26_069);
    assert_eq!(q14.iter().map(|r| r.c_counts).sum::<u64>(), 34_066);
    assert!(
        q14.iter()
            .all(|r| r.bid_time_type == q14::BidTimeType::NightTime)
    );
    let q17 = model_q17(&g0);
    assert_eq!(q17.len(), 4_657);
    assert_eq!(q17.iter().map(|r| r.avg_price).sum::<i64>(), 34_591_716_111);
    assert_eq!(
        q17.iter().map(|r| r.max_price).sum::<i64>(),
        178_924_282_668
    );
    assert!(q17.iter().all(|r| r.day == "2015-07-15"));
    let q19: Vec<i64> = model_q19(&g0).into_values().flatten().collect();
    assert_eq!(q19.len(), 35_135);
    assert_eq!(q19.iter().sum::<i64>(), 362_704_345_766);
    let q20 = model_q20(&g0);
    assert_eq!(q20.len(), 14_419);
    assert_eq!(
        q20.iter().map(|r| r.bid.price).sum::<i64>(),
        107_731_793_617
    );
    let q18 = model_q18(&g0);
    assert_eq!(q18.len(), 25_248);
    let dt: i128 = q18.iter().map(|b| b.date_time as i128).sum();
    assert_eq!(dt, 36_279_315_892_341_873);
    assert_eq!(q18.iter().map(|b| b.price).sum::<i64>(), 184_659_027_327);
    let q21 = model_q21(&g0);
    assert_eq!(q21.len(), 87_427);
    let hot = ["Apple", "Google", "Facebook", "Baidu"];
    assert_eq!(
        q21.iter()
            .filter(|r| hot.contains(&r.channel.as_ref()))
            .count(),
        45_980
    );
    let ids: i128 = q21
        .iter()
        .map(|r| r.channel_id.parse::<i128>().expect("numeric id"))
        .sum();
    assert_eq!(ids, 44_602_157_239_832);
    let q22 = model_q22(&g0);
    assert_eq!(q22.len(), 92_000);
    let first = &q22[0];
    assert_eq!(
        (
            first.dir1.as_deref(),
            first.dir2.as_deref(),
            first.dir3.as_deref()
        ),
        (Some("nlmv"), Some("gcg"), Some("yzf"))
    );
}

/// A query that fails once mid-stream restarts from its last checkpoint (sources rewound
/// to their checkpointed positions, state and timers restored) and still produces exactly
/// the model's result.
fn run_failing_once<T: Data>(
    parallelism: usize,
    query: fn(&Stream<Event>) -> Stream<T>,
    dir: &std::path::Path,
) -> Vec<T> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let failed = Arc::new(AtomicBool::new(false));
    let env = Env::new()
        .parallelism(parallelism)
        .state_backend(weir::BackendKind::RocksDb(Default::default()))
        .checkpoints(CheckpointConfig::new(dir).interval(std::time::Duration::from_millis(10)));
    // Fails at the first event 60 s into the 100 s stream, once.
    let fail_at = weir_nexmark::BASE_TIME + 60_000;
    let events = events(&env, config(parallelism as u64)).try_map(move |e: Event| {
        if e.date_time() >= fail_at && !failed.swap(true, Ordering::SeqCst) {
            return Err(weir::Error::User(
                "injected failure 60 s into the stream".into(),
            ));
        }
        Ok(e)
    });
    let out = query(&events).collect();
    let result = env.execute("nexmark-restart").expect("the job recovers");
    assert_eq!(result.restarts, 1, "one restart");
    out.values()
}

#[test]
fn queries_recover_exactly_from_a_failure() {
    let dir = tempfile::tempdir().expect("temp dir");
    for p in [1usize, 2] {
        let ev = all(&config(p as u64));
        let q4 = materialize(run_failing_once(
            p,
            q4::query,
            &dir.path().join(format!("q4-{p}")),
        ));
        assert_eq!(q4, sorted(model_q4(&ev)), "q4 at parallelism {p}");
        let q5 = sorted(run_failing_once(
            p,
            q5::query,
            &dir.path().join(format!("q5-{p}")),
        ));
        assert_eq!(q5, sorted(model_q5(&ev)), "q5 at parallelism {p}");
        let q20 = sorted(run_failing_once(
            p,
            q20::query,
            &dir.path().join(format!("q20-{p}")),
        ));
        assert_eq!(q20, sorted(model_q20(&ev)), "q20 at parallelism {p}");
    }
}
