//! The winning bid of every auction: the auction ⋈ bid join bounded by the auction's
//! lifetime, closed in event time. Shared by q4, q6 and q9.

use super::{auctions, bids};
use serde::{Deserialize, Serialize};
use weir::prelude::*;
use weir_nexmark::{Auction, Bid, Event};

/// Which bids compete for an auction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Whether a bid at exactly `expires` counts (Flink SQL's `BETWEEN A.dateTime AND
    /// A.expires`: yes; Beam's winning bids: no).
    pub at_expiry: bool,
    /// Whether a bid must reach the auction's reserve price (Beam's winning bids).
    pub reserve: bool,
}

/// Flink's q4 and q9: bids from the auction's start to its expiry, both included.
pub const FLINK: Rules = Rules {
    at_expiry: true,
    reserve: false,
};

/// Beam's winning bids (its q6): bids from the start up to, not including, the expiry, at
/// or above the reserve.
pub const BEAM: Rules = Rules {
    at_expiry: false,
    reserve: true,
};

/// An auction's winning bid, with the columns the query kept of each side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Winner<A, B> {
    /// What the query kept of the auction.
    pub auction: A,
    /// The winning price.
    pub price: i64,
    /// The winning bid's time.
    pub date_time: i64,
    /// What the query kept of the bid.
    pub bid: B,
}

/// Per auction, once the watermark has passed its last valid bid time: its winning bid
/// (the highest price, the earliest bid among equal prices). Auctions without a
/// qualifying bid produce nothing.
///
/// Only the columns a query needs are kept in state: `auction_part` and `bid_part` project
/// each side before the join (as Flink's planner prunes columns), so q4 keeps a few
/// numbers per auction where q9 keeps whole rows.
///
/// Keyed by auction id. An auction is kept until it closes; a bid that arrives before its
/// auction (bid ids may lead the auctions) waits until the watermark passes its own time,
/// after which no auction it could qualify for can arrive.
pub fn winning_bids<A: Data, B: Data>(
    events: &Stream<Event>,
    rules: Rules,
    auction_part: impl Fn(Auction) -> A + Send + Sync + 'static,
    bid_part: impl Fn(Bid) -> B + Send + Sync + 'static,
) -> Stream<Winner<A, B>> {
    let auctions = auctions(events).map(move |a| {
        let open = Open {
            id: a.id,
            start: a.date_time,
            last: if rules.at_expiry {
                a.expires
            } else {
                a.expires - 1
            },
            floor: if rules.reserve { a.reserve } else { i64::MIN },
        };
        (open, auction_part(a))
    });
    let bids = bids(events).map(move |b| Offer {
        auction: b.auction,
        price: b.price,
        date_time: b.date_time,
        bid: bid_part(b),
    });
    auctions
        .key_by(|(open, _)| open.id)
        .connect(&bids.key_by(|b| b.auction))
        .process(WinningBids::default)
        .name("winning-bids")
}

/// The numbers of an open auction that each bid is checked against.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Open {
    id: i64,
    start: i64,
    /// Last time a bid counts.
    last: i64,
    /// Lowest price that counts.
    floor: i64,
}

/// A bid, as the join sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Offer<B> {
    auction: i64,
    price: i64,
    date_time: i64,
    bid: B,
}

/// Per auction id: the open auction, its best bid so far, and bids that came before it.
struct WinningBids<A, B> {
    open: Option<ValueState<Open>>,
    auction: Option<ValueState<A>>,
    /// (price, time) of the best bid so far, compared on every bid.
    best_key: Option<ValueState<(i64, i64)>>,
    best: Option<ValueState<B>>,
    early: Option<ListState<Offer<B>>>,
}

impl<A, B> Default for WinningBids<A, B> {
    fn default() -> Self {
        WinningBids {
            open: None,
            auction: None,
            best_key: None,
            best: None,
            early: None,
        }
    }
}

impl<A: Data, B: Data> WinningBids<A, B> {
    /// Offers a bid to the open auction.
    fn offer(&mut self, open: Open, bid: Offer<B>) -> weir::Result<()> {
        if bid.date_time < open.start || bid.date_time > open.last || bid.price < open.floor {
            return Ok(());
        }
        let best_key = self.best_key.as_mut().expect("opened");
        let better = match best_key.get()? {
            None => true,
            Some((price, time)) => {
                bid.price > price || (bid.price == price && bid.date_time < time)
            }
        };
        if better {
            best_key.set((bid.price, bid.date_time))?;
            self.best.as_mut().expect("opened").set(bid.bid)?;
        }
        Ok(())
    }
}

impl<A: Data, B: Data> CoProcessFunction<i64, (Open, A), Offer<B>, Winner<A, B>>
    for WinningBids<A, B>
{
    fn open(&mut self, state: &mut StateContext<i64>) -> weir::Result<()> {
        self.open = Some(state.value_state("open")?);
        self.auction = Some(state.value_state("auction")?);
        self.best_key = Some(state.value_state("best-price-time")?);
        self.best = Some(state.value_state("best-bid")?);
        self.early = Some(state.list_state("early-bids")?);
        Ok(())
    }

    fn process1(
        &mut self,
        (open, auction): (Open, A),
        ctx: &mut CoContext<'_, i64, Winner<A, B>>,
    ) -> weir::Result<()> {
        let early = self.early.as_mut().expect("opened");
        let waiting = early.get()?;
        if !waiting.is_empty() {
            early.clear()?;
            for bid in waiting {
                self.offer(open, bid)?;
            }
        }
        ctx.register_event_time_timer(open.last);
        self.open.as_mut().expect("opened").set(open)?;
        self.auction.as_mut().expect("opened").set(auction)
    }

    fn process2(
        &mut self,
        bid: Offer<B>,
        ctx: &mut CoContext<'_, i64, Winner<A, B>>,
    ) -> weir::Result<()> {
        match self.open.as_ref().expect("opened").get()? {
            Some(open) => self.offer(open, bid),
            None => {
                // The auction has not arrived (or never will, or closed before this bid).
                ctx.register_event_time_timer(bid.date_time);
                self.early.as_mut().expect("opened").add(bid)
            }
        }
    }

    fn on_timer(
        &mut self,
        time: Timestamp,
        _domain: TimeDomain,
        ctx: &mut CoContext<'_, i64, Winner<A, B>>,
    ) -> weir::Result<()> {
        let open = self.open.as_mut().expect("opened");
        if open.get()?.is_some_and(|o| o.last <= time) {
            open.clear()?;
            let auction = self.auction.as_mut().expect("opened");
            let best = self.best.as_mut().expect("opened");
            let best_key = self.best_key.as_mut().expect("opened");
            if let (Some(a), Some(b), Some((price, date_time))) =
                (auction.get()?, best.get()?, best_key.get()?)
            {
                ctx.emit(Winner {
                    auction: a,
                    price,
                    date_time,
                    bid: b,
                });
            }
            auction.clear()?;
            best.clear()?;
            best_key.clear()?;
        }
        // Bids at or before the watermark can no longer meet an auction.
        let early = self.early.as_mut().expect("opened");
        let waiting = early.get()?;
        if !waiting.is_empty() {
            early.clear()?;
            for bid in waiting.into_iter().filter(|b| b.date_time > time) {
                early.add(bid)?;
            }
        }
        Ok(())
    }
}
