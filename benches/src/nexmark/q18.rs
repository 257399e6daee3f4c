//! q18, find last bid: per bidder and auction, the bid with the latest time.
//!
//! ```sql
//! SELECT auction, bidder, price, channel, url, dateTime, extra
//! FROM (
//!     SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY dateTime DESC) AS rank_number
//!     FROM bid
//! )
//! WHERE rank_number <= 1;
//! ```
//!
//! Deduplication keeping the last row: one bid per (bidder, auction) in keyed state. A bid
//! at the same or a later time replaces the stored one (as Flink's keep-last on event time
//! does, so among bids in the same millisecond the later arrival wins). The result is
//! updating: a replacement deletes the old row and inserts the new one.

use super::{Change, bids};
use weir::prelude::*;
use weir_nexmark::{Bid, Event};

/// The query over the event stream: a changelog of the kept bids.
pub fn query(events: &Stream<Event>) -> Stream<Change<Bid>> {
    bids(events)
        .key_by(|b| (b.bidder, b.auction))
        .process(LastBid::default)
        .name("q18-last-bid")
}

/// Per (bidder, auction): the latest bid so far.
#[derive(Default)]
struct LastBid {
    last: Option<ValueState<Bid>>,
}

impl KeyedProcessFunction<(i64, i64), Bid, Change<Bid>> for LastBid {
    fn open(&mut self, state: &mut StateContext<(i64, i64)>) -> weir::Result<()> {
        self.last = Some(state.value_state("last-bid")?);
        Ok(())
    }

    fn process(
        &mut self,
        bid: Bid,
        ctx: &mut KeyedContext<'_, (i64, i64), Change<Bid>>,
    ) -> weir::Result<()> {
        let last = self.last.as_mut().expect("opened");
        match last.get()? {
            Some(old) if bid.date_time < old.date_time => return Ok(()),
            Some(old) => ctx.emit(Change::Delete(old)),
            None => {}
        }
        ctx.emit(Change::Insert(bid.clone()));
        last.set(bid)
    }
}
