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

/// Per auction, once the watermark has passed its last valid bid time: the auction and
/// its winning bid (the highest price, the earliest bid among equal prices). Auctions
/// without a qualifying bid produce nothing.
///
/// Keyed by auction id. An auction is kept until it closes; a bid that arrives before its
/// auction (bid ids may lead the auctions) waits until the watermark passes its own time,
/// after which no auction it could qualify for can arrive.
pub fn winning_bids(events: &Stream<Event>, rules: Rules) -> Stream<(Auction, Bid)> {
    auctions(events)
        .key_by(|a| a.id)
        .connect(&bids(events).key_by(|b| b.auction))
        .process(move || WinningBids {
            rules,
            ..Default::default()
        })
        .name("winning-bids")
}

/// The numbers of an open auction that each bid is checked against.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Open {
    start: i64,
    /// Last time a bid counts.
    last: i64,
    /// Lowest price that counts.
    floor: i64,
}

#[derive(Default)]
struct WinningBids {
    rules: Rules,
    open: Option<ValueState<Open>>,
    auction: Option<ValueState<Auction>>,
    /// (price, time) of the best bid so far, compared on every bid.
    best_key: Option<ValueState<(i64, i64)>>,
    best: Option<ValueState<Bid>>,
    early: Option<ListState<Bid>>,
}

impl Default for Rules {
    fn default() -> Self {
        FLINK
    }
}

impl WinningBids {
    /// Offers a bid to the open auction; true if it is the new best.
    fn offer(&mut self, open: Open, bid: &Bid) -> weir::Result<bool> {
        if bid.date_time < open.start || bid.date_time > open.last || bid.price < open.floor {
            return Ok(false);
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
            self.best.as_mut().expect("opened").set(bid.clone())?;
        }
        Ok(better)
    }
}

impl CoProcessFunction<i64, Auction, Bid, (Auction, Bid)> for WinningBids {
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
        auction: Auction,
        ctx: &mut CoContext<'_, i64, (Auction, Bid)>,
    ) -> weir::Result<()> {
        let open = Open {
            start: auction.date_time,
            last: if self.rules.at_expiry {
                auction.expires
            } else {
                auction.expires - 1
            },
            floor: if self.rules.reserve {
                auction.reserve
            } else {
                i64::MIN
            },
        };
        let early = self.early.as_mut().expect("opened");
        let waiting = early.get()?;
        if !waiting.is_empty() {
            early.clear()?;
            for bid in &waiting {
                self.offer(open, bid)?;
            }
        }
        ctx.register_event_time_timer(open.last);
        self.open.as_mut().expect("opened").set(open)?;
        self.auction.as_mut().expect("opened").set(auction)
    }

    fn process2(
        &mut self,
        bid: Bid,
        ctx: &mut CoContext<'_, i64, (Auction, Bid)>,
    ) -> weir::Result<()> {
        match self.open.as_ref().expect("opened").get()? {
            Some(open) => {
                self.offer(open, &bid)?;
            }
            None => {
                // The auction has not arrived (or never will, or closed before this bid).
                ctx.register_event_time_timer(bid.date_time);
                self.early.as_mut().expect("opened").add(bid)?;
            }
        }
        Ok(())
    }

    fn on_timer(
        &mut self,
        time: Timestamp,
        _domain: TimeDomain,
        ctx: &mut CoContext<'_, i64, (Auction, Bid)>,
    ) -> weir::Result<()> {
        let open = self.open.as_mut().expect("opened");
        if open.get()?.is_some_and(|o| o.last <= time) {
            open.clear()?;
            let auction = self.auction.as_mut().expect("opened");
            let best = self.best.as_mut().expect("opened");
            if let (Some(a), Some(b)) = (auction.get()?, best.get()?) {
                ctx.emit((a, b));
            }
            auction.clear()?;
            best.clear()?;
            self.best_key.as_mut().expect("opened").clear()?;
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
