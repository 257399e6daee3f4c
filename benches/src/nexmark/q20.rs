//! q20, expand bid with auction: every bid on a category-10 auction, with the auction's
//! columns.
//!
//! ```sql
//! SELECT auction, bidder, price, channel, url, B.dateTime, B.extra,
//!     itemName, description, initialBid, reserve, A.dateTime, expires, seller, category, A.extra
//! FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id
//! WHERE A.category = 10;
//! ```
//!
//! A regular inner join keyed by auction id, without a time bound. Auction ids are unique,
//! so a bid only waits until its auction arrives: then it is joined (category 10) or
//! dropped (any other category), and later bids are handled on arrival. Bids for auctions
//! that never arrive wait forever, as in Flink, which also keeps every bid.

use super::{auctions, bids};
use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::{Auction, Bid, Event};

/// A q20 result row: the bid and its auction (whose `id` equals `bid.auction`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Row {
    pub bid: Bid,
    pub auction: Auction,
}

/// The query over the event stream.
pub fn query(events: &Stream<Event>) -> Stream<Row> {
    auctions(events)
        .key_by(|a| a.id)
        .connect(&bids(events).key_by(|b| b.auction))
        .process(ExpandBids::default)
        .name("q20-join")
}

/// Per auction id: whether the auction arrived and is in category 10, the auction if so,
/// and the bids that came before it.
#[derive(Default)]
struct ExpandBids {
    category_10: Option<ValueState<bool>>,
    auction: Option<ValueState<Auction>>,
    waiting: Option<ListState<Bid>>,
}

impl CoProcessFunction<i64, Auction, Bid, Row> for ExpandBids {
    fn open(&mut self, state: &mut StateContext<i64>) -> weir::Result<()> {
        self.category_10 = Some(state.value_state("arrived-category-10")?);
        self.auction = Some(state.value_state("auction")?);
        self.waiting = Some(state.list_state("waiting-bids")?);
        Ok(())
    }

    fn process1(
        &mut self,
        auction: Auction,
        ctx: &mut CoContext<'_, i64, Row>,
    ) -> weir::Result<()> {
        let wanted = auction.category == 10;
        let waiting = self.waiting.as_mut().expect("opened");
        let bids = waiting.get()?;
        if !bids.is_empty() {
            waiting.clear()?;
        }
        if wanted {
            for bid in bids {
                ctx.emit(Row {
                    bid,
                    auction: auction.clone(),
                });
            }
            self.auction.as_mut().expect("opened").set(auction)?;
        }
        self.category_10.as_mut().expect("opened").set(wanted)
    }

    fn process2(&mut self, bid: Bid, ctx: &mut CoContext<'_, i64, Row>) -> weir::Result<()> {
        match self.category_10.as_ref().expect("opened").get()? {
            Some(true) => {
                if let Some(auction) = self.auction.as_ref().expect("opened").get()? {
                    ctx.emit(Row { bid, auction });
                }
            }
            Some(false) => {}
            None => self.waiting.as_mut().expect("opened").add(bid)?,
        }
        Ok(())
    }
}
