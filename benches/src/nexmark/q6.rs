//! q6, average selling price by seller: per seller, the average price of their last 10
//! sold items.
//!
//! The Flink SQL text (a top-1 per auction under an `OVER` window) does not run in Flink,
//! which publishes no figure for it. weir follows Beam's definition, as the Nexmark
//! specification advises: an auction is *sold* when it closed with a bid at or above its
//! reserve, placed from its start up to (not including) its expiry; the sale price is the
//! highest such bid (the earliest among equal prices). Per seller, the result is the
//! average (truncated) of the prices of the 10 latest sales, by the winning bid's time.
//!
//! Sales come from [`winning_bids`] with Beam's rules; a keyed process function keeps each
//! seller's 10 latest sales and emits the new average whenever they change: an updating
//! result, one row per seller.

use super::Change;
use super::winning::{BEAM, winning_bids};
use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::Event;

/// Sales averaged per seller.
pub const LAST_SALES: usize = 10;

/// A q6 result row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub seller: i64,
    pub avg_price: i64,
}

/// The query over the event stream: a changelog of [`Row`]s.
pub fn query(events: &Stream<Event>) -> Stream<Change<Row>> {
    winning_bids(events, BEAM, |a| a.seller, |_| ())
        .map(|w| (w.auction, w.date_time, w.price))
        .key_by(|(seller, _, _)| *seller)
        .process(AverageOfLastSales::default)
        .name("q6-average-selling-price")
}

/// Per seller: the (time, price) of the latest sales, oldest first.
#[derive(Default)]
struct AverageOfLastSales {
    sales: Option<ValueState<Vec<(i64, i64)>>>,
}

fn average(sales: &[(i64, i64)]) -> i64 {
    sales.iter().map(|s| s.1).sum::<i64>() / sales.len() as i64
}

impl KeyedProcessFunction<i64, (i64, i64, i64), Change<Row>> for AverageOfLastSales {
    fn open(&mut self, state: &mut StateContext<i64>) -> weir::Result<()> {
        self.sales = Some(state.value_state("last-sales")?);
        Ok(())
    }

    fn process(
        &mut self,
        (seller, time, price): (i64, i64, i64),
        ctx: &mut KeyedContext<'_, i64, Change<Row>>,
    ) -> weir::Result<()> {
        let state = self.sales.as_mut().expect("opened");
        let mut sales = state.get()?.unwrap_or_default();
        if sales.len() == LAST_SALES && (time, price) < sales[0] {
            return Ok(()); // older than every kept sale: the average stands
        }
        if !sales.is_empty() {
            ctx.emit(Change::Delete(Row {
                seller,
                avg_price: average(&sales),
            }));
        }
        let at = sales.partition_point(|s| *s <= (time, price));
        sales.insert(at, (time, price));
        if sales.len() > LAST_SALES {
            sales.remove(0);
        }
        ctx.emit(Change::Insert(Row {
            seller,
            avg_price: average(&sales),
        }));
        state.set(sales)
    }
}
