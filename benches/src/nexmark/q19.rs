//! q19, auction top-10 price: per auction, the 10 highest bids, ranked.
//!
//! ```sql
//! SELECT * FROM (
//!     SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number
//!     FROM bid
//! )
//! WHERE rank_number <= 10;
//! ```
//!
//! A keyed top-N over an append-only input: per auction, the 10 best bids in keyed state
//! (nothing below rank 10 can ever come back). A bid that enters at rank k shifts ranks
//! k..10: their old rows are deleted and the new ones inserted, so the result is updating.
//! Among equal prices the earlier arrival keeps the better rank (SQL leaves it open).

use super::{Change, bids};
use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::{Bid, Event};

/// How many bids each auction keeps.
pub const TOP: usize = 10;

/// A q19 result row: a bid and its rank (1 = highest price) within its auction.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub bid: Bid,
    pub rank_number: u32,
}

/// The query over the event stream: a changelog of [`Row`]s.
pub fn query(events: &Stream<Event>) -> Stream<Change<Row>> {
    bids(events)
        .key_by(|b| b.auction)
        .process(TopBids::default)
        .name("q19-top-bids")
}

/// Per auction: the best bids, highest price first, and the price a bid must beat once
/// the list is full (checked first, so most bids cost one small read).
#[derive(Default)]
struct TopBids {
    top: Option<ValueState<Vec<Bid>>>,
    floor: Option<ValueState<i64>>,
}

impl KeyedProcessFunction<i64, Bid, Change<Row>> for TopBids {
    fn open(&mut self, state: &mut StateContext<i64>) -> weir::Result<()> {
        self.top = Some(state.value_state("top-bids")?);
        self.floor = Some(state.value_state("price-to-beat")?);
        Ok(())
    }

    fn process(
        &mut self,
        bid: Bid,
        ctx: &mut KeyedContext<'_, i64, Change<Row>>,
    ) -> weir::Result<()> {
        let floor = self.floor.as_mut().expect("opened");
        if floor.get()?.is_some_and(|f| bid.price <= f) {
            return Ok(());
        }
        let state = self.top.as_mut().expect("opened");
        let mut top = state.get()?.unwrap_or_default();
        let at = top.partition_point(|b| b.price >= bid.price);
        if at >= TOP {
            return Ok(());
        }
        for (i, old) in top.iter().enumerate().skip(at) {
            ctx.emit(Change::Delete(Row {
                bid: old.clone(),
                rank_number: i as u32 + 1,
            }));
        }
        top.insert(at, bid);
        top.truncate(TOP);
        for (i, new) in top.iter().enumerate().skip(at) {
            ctx.emit(Change::Insert(Row {
                bid: new.clone(),
                rank_number: i as u32 + 1,
            }));
        }
        if top.len() == TOP {
            floor.set(top[TOP - 1].price)?;
        }
        state.set(top)
    }
}
