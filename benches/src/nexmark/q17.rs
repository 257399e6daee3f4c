//! q17, auction statistics report: per auction and day, bid counts by price rank and price
//! statistics.
//!
//! ```sql
//! SELECT auction, DATE_FORMAT(dateTime, 'yyyy-MM-dd') AS `day`,
//!     count(*) AS total_bids,
//!     count(*) FILTER (WHERE price < 10000) AS rank1_bids,
//!     count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
//!     count(*) FILTER (WHERE price >= 1000000) AS rank3_bids,
//!     min(price) AS min_price, max(price) AS max_price,
//!     avg(price) AS avg_price, sum(price) AS sum_price
//! FROM bid
//! GROUP BY auction, DATE_FORMAT(dateTime, 'yyyy-MM-dd');
//! ```
//!
//! A keyed running aggregate over an append-only input: each bid updates its group's row
//! (a delete of the old row, an insert of the new). Days are UTC; `avg` truncates, as SQL
//! `AVG` over BIGINT.

use super::{Change, bids};
use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::Event;

/// A q17 result row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub auction: i64,
    /// `yyyy-MM-dd`, UTC.
    pub day: String,
    pub total_bids: u64,
    pub rank1_bids: u64,
    pub rank2_bids: u64,
    pub rank3_bids: u64,
    pub min_price: i64,
    pub max_price: i64,
    pub avg_price: i64,
    pub sum_price: i64,
}

/// The UTC calendar date of an epoch-millisecond time, as `yyyy-MM-dd`.
///
/// ```
/// assert_eq!(weir_bench::nexmark::q17::date(1_436_918_400_000), "2015-07-15");
/// assert_eq!(weir_bench::nexmark::q17::date(-1), "1969-12-31");
/// ```
pub fn date(millis: i64) -> String {
    // Howard Hinnant's days-to-civil algorithm.
    let z = millis.div_euclid(86_400_000) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The query over the event stream: a changelog of [`Row`]s.
pub fn query(events: &Stream<Event>) -> Stream<Change<Row>> {
    bids(events)
        .map(|b| {
            (
                b.auction,
                b.date_time.div_euclid(86_400_000),
                b.price,
                b.date_time,
            )
        })
        .key_by(|(auction, day, _, _)| (*auction, *day))
        .process(AuctionStatistics::default)
        .name("q17-auction-statistics")
}

/// The running numbers of one (auction, day).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Stats {
    total: u64,
    rank: [u64; 3],
    min: i64,
    max: i64,
    sum: i64,
}

impl Stats {
    fn row(&self, auction: i64, day: &str) -> Row {
        Row {
            auction,
            day: day.to_string(),
            total_bids: self.total,
            rank1_bids: self.rank[0],
            rank2_bids: self.rank[1],
            rank3_bids: self.rank[2],
            min_price: self.min,
            max_price: self.max,
            avg_price: self.sum / self.total as i64,
            sum_price: self.sum,
        }
    }
}

#[derive(Default)]
struct AuctionStatistics {
    stats: Option<ValueState<Stats>>,
}

impl KeyedProcessFunction<(i64, i64), (i64, i64, i64, i64), Change<Row>> for AuctionStatistics {
    fn open(&mut self, state: &mut StateContext<(i64, i64)>) -> weir::Result<()> {
        self.stats = Some(state.value_state("stats")?);
        Ok(())
    }

    fn process(
        &mut self,
        (auction, _, price, time): (i64, i64, i64, i64),
        ctx: &mut KeyedContext<'_, (i64, i64), Change<Row>>,
    ) -> weir::Result<()> {
        let state = self.stats.as_mut().expect("opened");
        let day = date(time);
        let mut s = match state.get()? {
            Some(old) => {
                ctx.emit(Change::Delete(old.row(auction, &day)));
                old
            }
            None => Stats {
                min: i64::MAX,
                max: i64::MIN,
                ..Default::default()
            },
        };
        s.total += 1;
        s.rank[match price {
            ..10_000 => 0,
            10_000..1_000_000 => 1,
            _ => 2,
        }] += 1;
        s.min = s.min.min(price);
        s.max = s.max.max(price);
        s.sum += price;
        ctx.emit(Change::Insert(s.row(auction, &day)));
        state.set(s)
    }
}
