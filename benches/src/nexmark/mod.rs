//! The Nexmark queries as weir pipelines, one file per query.
//!
//! Every query takes the stream of [`Event`]s (see [`events`]) and returns its result
//! stream. Append-only queries return their rows; updating queries (a running aggregate, a
//! dedup) return a changelog of [`Change`]s whose [`materialize`]d multiset is the query's
//! result. The query text each one implements is in its file's header and in
//! `docs/nexmark.md`.
//!
//! ```
//! use weir::prelude::*;
//! use weir_bench::nexmark::{events, q2};
//! use weir_nexmark::NexmarkConfig;
//!
//! let env = Env::new().parallelism(2);
//! let config = NexmarkConfig { num_events: 10_000, num_event_generators: 2, ..Default::default() };
//! let rows = q2::query(&events(&env, config)).collect();
//! env.execute("nexmark-q2").unwrap();
//! assert!(rows.values().iter().all(|r| r.auction % 123 == 0));
//! ```

pub mod q0;
pub mod q1;
pub mod q11;
pub mod q14;
pub mod q17;
pub mod q18;
pub mod q19;
pub mod q2;
pub mod q20;
pub mod q21;
pub mod q22;
pub mod q3;
pub mod q4;
pub mod q5;
pub mod q6;
pub mod q7;
pub mod q8;
pub mod q9;
pub mod run;
pub mod winning;

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::hash::Hash;
use weir::prelude::*;
use weir_nexmark::{Auction, Bid, Event, NexmarkConfig, NexmarkSource, Person};

/// Nexmark's watermark: the largest event time seen minus 4 seconds.
pub const WATERMARK_DELAY_MS: i64 = 4_000;

/// The Nexmark event stream: the generator as a parallel source (one timeline per
/// `config.num_event_generators`), timestamped by `date_time`, with watermarks 4 s behind
/// the largest timestamp.
pub fn events(p: &Pipeline, config: NexmarkConfig) -> Stream<Event> {
    events_paced(p, config, false)
}

/// [`events`], optionally paced to `config.first_event_rate` events per second of wall
/// clock (otherwise as fast as possible).
pub fn events_paced(p: &Pipeline, config: NexmarkConfig, paced: bool) -> Stream<Event> {
    p.source("nexmark", move |ctx| {
        NexmarkSource::new(config.clone(), ctx).paced(paced)
    })
    .with_watermarks(WatermarkStrategy::bounded_out_of_orderness(
        WATERMARK_DELAY_MS,
    ))
}

/// The `person` view: persons only.
pub fn persons(events: &Stream<Event>) -> Stream<Person> {
    events.flat_map(Event::person).name("persons")
}

/// The `auction` view: auctions only.
pub fn auctions(events: &Stream<Event>) -> Stream<Auction> {
    events.flat_map(Event::auction).name("auctions")
}

/// The `bid` view: bids only.
pub fn bids(events: &Stream<Event>) -> Stream<Bid> {
    events.flat_map(Event::bid).name("bids")
}

/// One entry of an updating query's changelog.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Change<T> {
    /// The row joins the result.
    Insert(T),
    /// A row inserted earlier leaves the result (an update is a delete then an insert).
    Delete(T),
}

/// Applies a changelog: the resulting multiset, sorted.
///
/// # Panics
/// When a row is deleted that is not in the result (a broken changelog).
///
/// ```
/// use weir_bench::nexmark::{Change, materialize};
/// let log = vec![Change::Insert(1), Change::Insert(2), Change::Delete(1), Change::Insert(3)];
/// assert_eq!(materialize(log), vec![2, 3]);
/// ```
pub fn materialize<T: Eq + Hash + Ord + Clone + std::fmt::Debug>(
    log: impl IntoIterator<Item = Change<T>>,
) -> Vec<T> {
    let mut rows: HashMap<T, i64> = HashMap::new();
    for c in log {
        match c {
            Change::Insert(r) => *rows.entry(r).or_default() += 1,
            Change::Delete(r) => {
                let n = rows
                    .get_mut(&r)
                    .unwrap_or_else(|| panic!("delete of absent row {r:?}"));
                *n -= 1;
                if *n == 0 {
                    rows.remove(&r);
                }
            }
        }
    }
    let mut out: Vec<T> = rows
        .into_iter()
        .flat_map(|(r, n)| std::iter::repeat_n(r, n as usize))
        .collect();
    out.sort();
    out
}
