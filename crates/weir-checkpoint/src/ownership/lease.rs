//! The lease protocol's core: a sans-IO state machine for one process and one directory.
//!
//! The driver ([`super`]) reads the directory's current record, probes its process, creates
//! records and keeps time; this module only decides. No clocks, files or threads here, so
//! every rule has a unit test and a property test runs many processes against a model
//! directory.
//!
//! # Vocabulary
//!
//! - **record `n`**: the file `.weir-owner-<n>`; created exclusively, never replaced. The
//!   highest `n` is the **current** record; its token names the **owner**.
//! - **lease**: the owner's promise to write a new record at least every lease/3. Another
//!   process may take over once it has itself watched the current record stay unchanged for
//!   a whole lease (by its own monotonic clock, so clock skew between hosts does not matter),
//!   at once when the record says `released`, or at once when the record's process is
//!   provably gone (same machine, pid not running).
//! - **fresh**: by the wall clock, the current record is younger than its lease. A fresh
//!   record of a live (or unknown) process makes a newcomer give up at once with the owner's
//!   name — the common case of a second copy started by mistake. A record that is not fresh
//!   is watched before it is taken over (its owner may only look stale through clock skew).
//! - **holding**: from the start of writing record `n` until `lease` later, this process is
//!   sure nobody else took over: a taker must first watch `n` (or an older record) unchanged
//!   for a whole lease. Before a durable act the owner checks that the current record is
//!   still its own ([`Lease::verify`]), renewing first when half the lease has passed.

use super::record::{Liveness, OwnerRecord, Seen};
use std::time::{Duration, Instant};

/// What the driver must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Create record `seq` exclusively (a release record when `released`), then report with
    /// [`Lease::wrote`].
    Write { seq: u64, released: bool },
    /// The current record must be watched before it can be taken over: read it again at
    /// `at` and report with [`Lease::observe`]. `until` is when the watch ends if nothing
    /// changes; `started` is true on the observation that began the watch.
    Look {
        at: Instant,
        until: Instant,
        started: bool,
    },
    /// The lease is held.
    Held,
    /// Another process owns the directory.
    Refused(Refusal),
    /// This process no longer owns the directory; the current record, if it could be read.
    Lost(Option<Box<OwnerRecord>>),
    /// The lease was given up.
    Released,
}

/// Why a newcomer gave up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The current record (`None`: it could not be read).
    pub record: Option<Box<OwnerRecord>>,
    /// True when the owner wrote a new record while this process watched: it is alive.
    pub renewed_while_watched: bool,
}

/// How creating a record ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Created; `current` is the highest record number seen right after.
    Created { current: u64 },
    /// A record with that number exists already: another process wrote it first.
    Exists,
    /// Creating it failed (an I/O error); no record of this process has that number.
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Take,
    Renew,
    Release,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Watch {
    seq: u64,
    readable: bool,
    until: Instant,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Acquiring(Option<Watch>),
    Writing {
        seq: u64,
        started: Instant,
        purpose: Purpose,
        /// The renewal time of the record held before (renewals).
        before: Option<Instant>,
    },
    Held {
        seq: u64,
        renewed: Instant,
    },
    Lost,
    Released,
}

/// One process's lease on one directory.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    token: String,
    lease: Duration,
    poll: Duration,
    state: State,
}

impl Lease {
    /// A lease to acquire, for the owner `token`, renewed within `lease`.
    pub(crate) fn new(token: &str, lease: Duration) -> Lease {
        Lease {
            token: token.to_string(),
            lease,
            poll: (lease / 20).clamp(Duration::from_millis(10), Duration::from_millis(250)),
            state: State::Acquiring(None),
        }
    }

    /// The number of the record this process holds the lease with.
    #[cfg(test)]
    pub(crate) fn held(&self) -> Option<u64> {
        match self.state {
            State::Held { seq, .. } => Some(seq),
            _ => None,
        }
    }

    /// Acquiring: the directory's current record is `seen` (at wall-clock `wall_ms`), and its
    /// process is `live`.
    pub(crate) fn observe(
        &mut self,
        now: Instant,
        wall_ms: u64,
        seen: &Seen,
        live: Liveness,
    ) -> Next {
        let State::Acquiring(watch) = &self.state else {
            return self.settled();
        };
        let seq = seen.seq();
        let record = seen.record();
        let free = match seen {
            Seen::Nothing => true,
            Seen::Record { record, .. } => {
                record.released || record.token == self.token || live == Liveness::Gone
            }
            Seen::Unreadable { .. } => false,
        };
        if free {
            return self.write(now, seq + 1, Purpose::Take);
        }
        let readable = record.is_some();
        if let Some(w) = watch {
            if w.seq != seq {
                // A new record appeared while watching: its owner is alive.
                return Next::Refused(Refusal {
                    record: record.cloned().map(Box::new),
                    renewed_while_watched: true,
                });
            }
            if w.readable == readable {
                if now >= w.until {
                    return self.write(now, seq + 1, Purpose::Take);
                }
                return Next::Look {
                    at: w.until.min(now + self.poll),
                    until: w.until,
                    started: false,
                };
            }
            // The record was being written when first read: judge it afresh.
        }
        if let Some(r) = record
            && wall_ms < r.renewed_ms.saturating_add(r.lease_ms)
        {
            return Next::Refused(Refusal {
                record: Some(Box::new(r.clone())),
                renewed_while_watched: false,
            });
        }
        let lease = record.map_or(self.lease, |r| Duration::from_millis(r.lease_ms));
        let until = now + lease;
        self.state = State::Acquiring(Some(Watch {
            seq,
            readable,
            until,
        }));
        Next::Look {
            at: until.min(now + self.poll),
            until,
            started: true,
        }
    }

    /// Creating the record asked for by the last [`Next::Write`] ended with `outcome`.
    pub(crate) fn wrote(&mut self, now: Instant, outcome: Outcome) -> Next {
        let State::Writing {
            seq,
            started,
            purpose,
            before,
        } = self.state
        else {
            return self.settled();
        };
        let won = outcome == Outcome::Created { current: seq };
        match (purpose, won) {
            (Purpose::Renew, false) if outcome == Outcome::Failed => {
                // Still held on the previous record, until its term ends.
                self.state = State::Held {
                    seq: seq - 1,
                    renewed: before.unwrap_or(started),
                };
                Next::Held
            }
            (Purpose::Release, _) => {
                self.state = State::Released;
                Next::Released
            }
            (_, true) => {
                self.state = State::Held {
                    seq,
                    renewed: started,
                };
                Next::Held
            }
            (Purpose::Take, false) => {
                // Another process wrote first: look at its record.
                self.state = State::Acquiring(None);
                Next::Look {
                    at: now,
                    until: now,
                    started: false,
                }
            }
            (Purpose::Renew, false) => {
                self.state = State::Lost;
                Next::Lost(None)
            }
        }
    }

    /// True when the holder should write its next record (a third of the lease passed).
    pub(crate) fn renew_due(&self, now: Instant) -> bool {
        matches!(self.state, State::Held { renewed, .. } if now >= renewed + self.lease / 3)
    }

    /// Holding: write the next record.
    pub(crate) fn renew(&mut self, now: Instant) -> Next {
        match self.state {
            State::Held { seq, .. } => self.write(now, seq + 1, Purpose::Renew),
            _ => self.settled(),
        }
    }

    /// Before a durable act: the current record is `seen`. [`Next::Held`] allows the act;
    /// [`Next::Write`] asks to renew first (half the lease has passed; then report with
    /// [`Lease::wrote`]); [`Next::Lost`] forbids it for good.
    pub(crate) fn verify(&mut self, now: Instant, seen: &Seen) -> Next {
        let State::Held { seq, renewed } = self.state else {
            return self.settled();
        };
        let mine = seen.seq() == seq && seen.record().is_some_and(|r| r.token == self.token);
        if !mine {
            self.state = State::Lost;
            return Next::Lost(seen.record().cloned().map(Box::new));
        }
        if now >= renewed + self.lease / 2 {
            return self.renew(now);
        }
        Next::Held
    }

    /// Before a durable act when the current record cannot be read (storage unreachable for
    /// now): true while this run holds the lease and less than half a lease has passed since
    /// it last wrote its record. Nobody takes a directory over before watching its record
    /// unchanged for a whole lease, so until then no other run can own it; after that the
    /// caller must fail (it cannot tell).
    pub(crate) fn held_without_reading(&self, now: Instant) -> bool {
        matches!(self.state, State::Held { renewed, .. } if now < renewed + self.lease / 2)
    }

    /// Gives the lease up: a release record when it is held.
    pub(crate) fn release(&mut self, now: Instant) -> Next {
        match self.state {
            State::Held { seq, .. } => self.write(now, seq + 1, Purpose::Release),
            State::Lost => Next::Lost(None),
            _ => {
                self.state = State::Released;
                Next::Released
            }
        }
    }

    fn write(&mut self, now: Instant, seq: u64, purpose: Purpose) -> Next {
        let before = match self.state {
            State::Held { renewed, .. } => Some(renewed),
            _ => None,
        };
        self.state = State::Writing {
            seq,
            started: now,
            purpose,
            before,
        };
        Next::Write {
            seq,
            released: purpose == Purpose::Release,
        }
    }

    /// What a call that does not apply to the current state answers.
    fn settled(&self) -> Next {
        match &self.state {
            State::Held { .. } => Next::Held,
            State::Released => Next::Released,
            State::Lost | State::Writing { .. } | State::Acquiring(_) => Next::Lost(None),
        }
    }
}

#[cfg(test)]
mod tests;
