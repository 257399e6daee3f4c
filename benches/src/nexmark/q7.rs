//! q7, highest bid: the bids with the highest price in each 10-second window.
//!
//! ```sql
//! SELECT B.auction, B.price, B.bidder, B.dateTime, B.extra
//! FROM bid B
//! JOIN (
//!     SELECT MAX(price) AS maxprice, window_end AS dateTime
//!     FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
//!     GROUP BY window_start, window_end
//! ) B1
//! ON B.price = B1.maxprice
//! WHERE B.dateTime BETWEEN B1.dateTime - INTERVAL '10' SECOND AND B1.dateTime;
//! ```
//!
//! Flink runs this as a regular join keyed by price that keeps every bid. The plan here
//! keeps, per window, only the running maximum and the bids that equal it. `BETWEEN` is
//! inclusive, so a bid at exactly `window_end` (which belongs to the next window) also
//! matches when its price equals this window's maximum: such bids are routed to both
//! windows, in the earlier one only as candidates. A window's result is emitted when the
//! watermark reaches its end.
//!
//! The columns keep the query's order (auction, price, bidder, ...). Flink inserts them
//! by position into a sink declared `(auction, bidder, price, ...)`, so its "bidder"
//! column holds the price; here the fields are named for what they hold.

use super::bids;
use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::Event;

/// Window length.
pub const SIZE_MS: i64 = 10_000;

/// A q7 result row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub auction: i64,
    pub price: i64,
    pub bidder: i64,
    pub date_time: i64,
    pub extra: String,
}

/// A bid routed to a window: `member` is false for a bid at the window's end, which only
/// competes for the match, not for the maximum.
type Routed = (i64, bool, Row);

/// The query over the event stream.
pub fn query(events: &Stream<Event>) -> Stream<Row> {
    bids(events)
        .flat_map(|b| {
            let window = b.date_time.div_euclid(SIZE_MS);
            let on_boundary = b.date_time.rem_euclid(SIZE_MS) == 0;
            let row = Row {
                auction: b.auction,
                price: b.price,
                bidder: b.bidder,
                date_time: b.date_time,
                extra: b.extra,
            };
            let boundary = on_boundary.then(|| (window - 1, false, row.clone()));
            std::iter::once((window, true, row)).chain(boundary)
        })
        .key_by(|(window, _, _)| *window)
        .process(HighestBids::default)
        .name("q7-highest-bids")
}

/// Per window: the highest price of its bids, the bids at that price, and the bids at the
/// window's end (candidates only).
#[derive(Default)]
struct HighestBids {
    max: Option<ValueState<i64>>,
    at_max: Option<ListState<Row>>,
    at_end: Option<ListState<Row>>,
}

impl KeyedProcessFunction<i64, Routed, Row> for HighestBids {
    fn open(&mut self, state: &mut StateContext<i64>) -> weir::Result<()> {
        self.max = Some(state.value_state("max-price")?);
        self.at_max = Some(state.list_state("bids-at-max")?);
        self.at_end = Some(state.list_state("bids-at-end")?);
        Ok(())
    }

    fn process(
        &mut self,
        (window, member, row): Routed,
        ctx: &mut KeyedContext<'_, i64, Row>,
    ) -> weir::Result<()> {
        // Fire when the watermark reaches the window's end (registering twice is a no-op).
        let end = (window + 1) * SIZE_MS;
        if !member {
            ctx.register_event_time_timer(end);
            return self.at_end.as_mut().expect("opened").add(row);
        }
        let max = self.max.as_mut().expect("opened");
        let at_max = self.at_max.as_mut().expect("opened");
        match max.get()? {
            None => {
                ctx.register_event_time_timer(end);
                max.set(row.price)?;
                at_max.add(row)?;
            }
            Some(m) if row.price > m => {
                max.set(row.price)?;
                at_max.clear()?;
                at_max.add(row)?;
            }
            Some(m) if row.price == m => at_max.add(row)?,
            Some(_) => {}
        }
        Ok(())
    }

    fn on_timer(
        &mut self,
        _time: Timestamp,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<'_, i64, Row>,
    ) -> weir::Result<()> {
        let max = self.max.as_mut().expect("opened");
        let at_max = self.at_max.as_mut().expect("opened");
        let at_end = self.at_end.as_mut().expect("opened");
        if let Some(m) = max.get()? {
            for r in at_max.get()? {
                ctx.emit(r);
            }
            for r in at_end.get()? {
                if r.price == m {
                    ctx.emit(r);
                }
            }
        }
        max.clear()?;
        at_max.clear()?;
        at_end.clear()
    }
}
