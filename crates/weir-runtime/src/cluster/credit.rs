//! Credit-based flow control of one channel that crosses workers, in records, under the
//! receiving channel's in-flight budget.
//!
//! The receiver grants the sender credit for as many records as its channel has room for
//! under its budget, less what it already granted and has not received yet: records on
//! the wire plus records queued in the receiving channel stay within the budget (as
//! Flink's receiver grants credits only for free buffers, whose size the debloater sets).
//! A batch costs its records, any other message one credit. The sender may spend credit
//! down below zero with one message (a batch is never split), and then waits for more.
//!
//! Owns [`Credit`] (the sender's balance) and [`Grants`] (the receiver's arithmetic, plain
//! and synchronous); the data plane (`data.rs`) moves the frames.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;
use weir_core::exchange::{BudgetPolicy, ExchangeConfig};

/// What a message costs in credit: its records, and 1 for a message without records.
pub(crate) fn cost(records: usize) -> i64 {
    records.max(1) as i64
}

/// The credit both ends of a link start with: the receiving channel's initial limit.
pub(crate) fn initial(cfg: &ExchangeConfig) -> u32 {
    let p = BudgetPolicy::new(cfg);
    p.link_limit(p.initial_limit()).min(u32::MAX as u64) as u32
}

/// The sender's credit on one link, in records.
pub(crate) struct Credit {
    n: Mutex<i64>,
    more: Condvar,
}

impl Credit {
    pub(crate) fn new(n: u32) -> Self {
        Credit {
            n: Mutex::new(i64::from(n)),
            more: Condvar::new(),
        }
    }

    /// Spends `cost` credit, first waiting while there is none; false when the attempt
    /// is cancelled first. `meanwhile` runs every 10 ms of waiting (unaligned barriers,
    /// which take no credit, go out then).
    pub(crate) fn take(&self, cost: i64, cancel: &AtomicBool, mut meanwhile: impl FnMut()) -> bool {
        let mut n = self.n.lock().unwrap_or_else(|p| p.into_inner());
        while *n <= 0 {
            if cancel.load(Ordering::Relaxed) {
                return false;
            }
            n = self
                .more
                .wait_timeout(n, Duration::from_millis(10))
                .unwrap_or_else(|p| p.into_inner())
                .0;
            if *n <= 0 {
                drop(n);
                meanwhile();
                n = self.n.lock().unwrap_or_else(|p| p.into_inner());
            }
        }
        *n -= cost;
        true
    }

    /// The receiver granted `k` more.
    pub(crate) fn add(&self, k: u32) {
        *self.n.lock().unwrap_or_else(|p| p.into_inner()) += i64::from(k);
        self.more.notify_one();
    }
}

/// The receiver's side of one link: credit granted and not yet received.
#[derive(Debug)]
pub(crate) struct Grants {
    outstanding: i64,
    batch: u64,
}

impl Grants {
    /// The sender starts with `initial` credit; a grant is sent once at least
    /// `batch` records (or half the room) can be granted, not for every message.
    pub(crate) fn new(initial: u32, batch: usize) -> Self {
        Grants {
            outstanding: i64::from(initial),
            batch: batch.max(1) as u64,
        }
    }

    /// A message of `records` records arrived.
    pub(crate) fn received(&mut self, records: usize) {
        self.outstanding -= cost(records);
    }

    /// The credit to grant now, given the room (`limit - queued`) of the receiving
    /// channel; 0 for none. Afterwards the sender holds exactly the room (a debt from a
    /// batch over its credit is already in the channel, so it is part of `queued`).
    pub(crate) fn grant(&mut self, room: u64, limit: u64) -> u32 {
        let free = (room as i64 - self.outstanding).min(u32::MAX as i64);
        if free < Self::threshold(self.batch, limit) {
            return 0;
        }
        self.outstanding += free;
        free as u32
    }

    /// A grant waits until it is worth a message: a batch, or half the limit.
    fn threshold(batch: u64, limit: u64) -> i64 {
        batch.min(limit / 2).max(1) as i64
    }

    /// The sender holds no credit as far as the receiver knows, so nothing more can
    /// arrive until a grant: the room the channel needs for one, in records.
    pub(crate) fn starved(&self, limit: u64) -> Option<u64> {
        (self.outstanding <= 0)
            .then(|| (Self::threshold(self.batch, limit) + self.outstanding).max(1) as u64)
    }

    /// Credit the sender holds as far as the receiver knows (negative: it overspent).
    #[cfg(test)]
    pub(crate) fn outstanding(&self) -> i64 {
        self.outstanding
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_plus_queued_stays_within_the_limit() {
        // The sender starts with the initial limit of 100 records.
        let mut g = Grants::new(100, 50);
        assert_eq!(g.grant(100, 100), 0); // all of it is out already
        g.received(50);
        // 50 records in the channel, 50 still granted: no room.
        assert_eq!(g.grant(50, 100), 0);
        g.received(50);
        assert_eq!(g.outstanding(), 0);
        // The consumer took 60 of the 100 and the limit grew to 1,000.
        assert_eq!(g.grant(1_000 - 40, 1_000), 960);
        assert_eq!(g.outstanding(), 960);
        // An overspent sender (a batch over its credit) is starved; the batch is in the
        // channel, so a grant gives it the room the channel has.
        g.received(1_000);
        assert_eq!(g.outstanding(), -40);
        assert_eq!(g.starved(1_000), Some(10));
        assert_eq!(g.grant(0, 1_000), 0); // 40 is less than a batch
        assert_eq!(g.grant(30, 1_000), 70);
        assert_eq!(g.outstanding(), 30);
        assert_eq!(g.starved(1_000), None);
        // A control message costs one.
        g.received(0);
        assert_eq!(g.outstanding(), 29);
        // A grant never goes past the room: 30 outstanding and room 60 give 30 more only
        // when that is worth a message (a small limit lowers the threshold).
        assert_eq!(g.grant(60, 1_000), 0);
        assert_eq!(g.grant(60, 40), 31);
    }

    #[test]
    fn the_sender_spends_one_batch_past_its_credit_then_waits() {
        let c = Credit::new(10);
        let cancel = AtomicBool::new(false);
        assert!(c.take(cost(25), &cancel, || {}));
        cancel.store(true, Ordering::Relaxed);
        assert!(
            !c.take(cost(1), &cancel, || {}),
            "no credit left: it must wait"
        );
        c.add(20);
        assert!(c.take(cost(0), &cancel, || {}));
        assert_eq!(*c.n.lock().unwrap(), 4);
    }

    #[test]
    fn both_ends_start_from_the_channels_initial_limit() {
        let cfg = |target| ExchangeConfig {
            batch_size: 1_024,
            channel_capacity: 16,
            flush_interval_ms: 10,
            max_parallelism: 128,
            in_flight_target: target,
        };
        assert_eq!(initial(&cfg(Some(Duration::from_secs(1)))), 1_024);
        assert_eq!(initial(&cfg(None)), 16_384);
    }
}
