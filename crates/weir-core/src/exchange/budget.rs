//! Bounded in-flight data (Flink's buffer debloating): each channel holds about a
//! configured time of data instead of a fixed number of batches.
//!
//! Owns the per-channel [`ChannelBudget`] (records queued and the limit, shared by the
//! two ends of a channel), the consumer's [`BudgetConsumer`] (which measures the rate at
//! which it takes records off the channel and sets the limit to rate × target), and the
//! arithmetic ([`BudgetPolicy`], [`RateMeter`]), which is plain and synchronous. It does not
//! own the channel itself: the crossbeam channel's capacity stays the hard ceiling, the
//! budget only makes the writer wait earlier.
//!
//! Only record batches count; control messages (watermarks, barriers, end) never wait
//! on the budget. Whatever takes a batch off a budgeted channel must report it to the
//! channel's [`BudgetConsumer`], or the writer will wait for records that were consumed.

use super::ExchangeConfig;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How often the consumer recomputes a channel's limit from its measured rate.
pub const RECOMPUTE_INTERVAL: Duration = Duration::from_millis(200);

/// A channel's limit never goes below this many records (nor below one batch).
pub const MIN_IN_FLIGHT_RECORDS: u64 = 64;

/// Weight of the newest rate sample in the smoothed rate (an exponential moving average
/// over about the last two seconds of 200 ms samples, Flink's 20 samples being ~4 s).
const SMOOTHING: f64 = 0.2;

/// The limits of one channel's budget.
///
/// ```
/// use weir_core::exchange::{BudgetPolicy, ExchangeConfig};
/// use std::time::Duration;
/// let cfg = ExchangeConfig {
///     batch_size: 100,
///     channel_capacity: 32,
///     flush_interval_ms: 10,
///     max_parallelism: 128,
///     in_flight_target: Some(Duration::from_secs(1)),
/// };
/// let p = BudgetPolicy::new(&cfg);
/// // 2,000 records/s for 1 s: 2,000 records; never below a batch, never above 32 batches.
/// assert_eq!(p.limit_for(2_000.0), 2_000);
/// assert_eq!(p.limit_for(5.0), 100);
/// assert_eq!(p.limit_for(1e9), 3_200);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetPolicy {
    /// The time of data a channel holds (`None`: fixed capacity, no budget).
    pub target: Option<Duration>,
    /// The smallest limit, in records.
    pub floor: u64,
    /// The largest limit, in records: the channel's capacity in full batches.
    pub ceiling: u64,
}

impl BudgetPolicy {
    /// The policy of channels of an exchange configured as `cfg`.
    pub fn new(cfg: &ExchangeConfig) -> Self {
        let ceiling = (cfg.batch_size as u64)
            .saturating_mul(cfg.channel_capacity as u64)
            .max(1);
        let floor = (cfg.batch_size as u64)
            .max(MIN_IN_FLIGHT_RECORDS)
            .min(ceiling);
        BudgetPolicy {
            target: cfg.in_flight_target,
            floor,
            ceiling,
        }
    }

    /// The limit before anything was measured: the floor with a target (a channel grows
    /// to its rate within [`RECOMPUTE_INTERVAL`]); unlimited without one.
    pub fn initial_limit(&self) -> u64 {
        match self.target {
            Some(_) => self.floor,
            None => u64::MAX,
        }
    }

    /// The limit for a consumer that takes `rate` records per second: rate × target,
    /// between the floor and the ceiling.
    pub fn limit_for(&self, rate: f64) -> u64 {
        let Some(target) = self.target else {
            return u64::MAX;
        };
        let want = (rate.max(0.0) * target.as_secs_f64()).round();
        let want = if want >= u64::MAX as f64 {
            u64::MAX
        } else {
            want as u64
        };
        want.clamp(self.floor, self.ceiling)
    }

    /// What a network link may carry in records on top of the receiving channel: the
    /// same limit, and with a fixed capacity the channel's capacity in full batches.
    pub fn link_limit(&self, limit: u64) -> u64 {
        limit.min(self.ceiling)
    }
}

/// The smoothed rate at which a consumer takes records, sampled every
/// [`RECOMPUTE_INTERVAL`]. Time is passed in, so it is tested without a clock.
///
/// ```
/// use weir_core::exchange::RateMeter;
/// use std::time::{Duration, Instant};
/// let t0 = Instant::now();
/// let mut m = RateMeter::default();
/// assert_eq!(m.observe(100, t0), None); // starts the first window
/// assert_eq!(m.observe(100, t0 + Duration::from_millis(100)), None);
/// let rate = m.observe(100, t0 + Duration::from_millis(200)).unwrap();
/// assert_eq!(rate, 1_000.0); // 200 records in 200 ms
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct RateMeter {
    window_start: Option<Instant>,
    records: u64,
    smoothed: Option<f64>,
}

impl RateMeter {
    /// Records that `n` records were taken at `now`. Returns the new smoothed rate
    /// (records/s) when a window of at least [`RECOMPUTE_INTERVAL`] closed.
    pub fn observe(&mut self, n: u64, now: Instant) -> Option<f64> {
        let Some(start) = self.window_start else {
            // The records of the first observation arrived before the window began.
            self.window_start = Some(now);
            return None;
        };
        self.records += n;
        let elapsed = now.saturating_duration_since(start);
        if elapsed < RECOMPUTE_INTERVAL {
            return None;
        }
        let sample = self.records as f64 / elapsed.as_secs_f64();
        let rate = match self.smoothed {
            None => sample,
            Some(old) => old + SMOOTHING * (sample - old),
        };
        self.smoothed = Some(rate);
        self.window_start = Some(now);
        self.records = 0;
        Some(rate)
    }

    /// The smoothed rate, once a window closed.
    pub fn rate(&self) -> Option<f64> {
        self.smoothed
    }
}

/// The budget of one channel, shared by its writer and its consumer: the records queued
/// (written, not yet taken) and the limit at which the writer waits.
pub struct ChannelBudget {
    policy: BudgetPolicy,
    queued: AtomicU64,
    limit: AtomicU64,
    /// The most records ever queued (the writer raises it).
    peak: AtomicU64,
    /// The writer is waiting for room (a consumer then wakes it).
    waiting: AtomicBool,
    /// Every consumer is gone: a waiting writer gives up.
    closed: AtomicBool,
    consumers: AtomicUsize,
    lock: Mutex<()>,
    room: Condvar,
}

/// The consumers of a channel are gone; its writer cannot put records on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetClosed;

impl std::fmt::Debug for ChannelBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelBudget")
            .field("queued", &self.queued())
            .field("limit", &self.limit())
            .finish()
    }
}

impl ChannelBudget {
    /// A budget under `policy`, with no consumer yet (see [`BudgetConsumer::new`]).
    pub fn new(policy: BudgetPolicy) -> Arc<Self> {
        Arc::new(ChannelBudget {
            policy,
            queued: AtomicU64::new(0),
            limit: AtomicU64::new(policy.initial_limit()),
            peak: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            consumers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            room: Condvar::new(),
        })
    }

    /// Records on the channel now (written, not yet taken off).
    pub fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }

    /// The most records that were ever on the channel at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// The writer waits while this many records or more are queued (`u64::MAX`: only the
    /// channel's capacity bounds it).
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Every consumer of the channel is gone.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// The policy the limit follows.
    pub fn policy(&self) -> BudgetPolicy {
        self.policy
    }

    /// What a network link into this channel may have in flight beyond the records
    /// queued here (see [`BudgetPolicy::link_limit`]).
    pub fn link_room(&self) -> u64 {
        self.policy
            .link_limit(self.limit())
            .saturating_sub(self.queued())
    }

    /// The writer puts `n` records on the channel, first waiting while the channel holds
    /// its limit or more. Returns how long it waited (`None`: not at all).
    pub fn acquire(&self, n: usize) -> Result<Option<Duration>, BudgetClosed> {
        let waited = if self.queued.load(Ordering::Relaxed) < self.limit.load(Ordering::Relaxed) {
            None
        } else {
            Some(self.wait_for_room()?)
        };
        let now = self.queued.fetch_add(n as u64, Ordering::SeqCst) + n as u64;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Ok(waited)
    }

    /// The writer puts `n` records on the channel without waiting, even at or over its
    /// limit: an overdraft, for the records held at an unaligned barrier, which the
    /// consumer needs before its channel state is complete.
    pub fn acquire_overdraft(&self, n: usize) {
        let now = self.queued.fetch_add(n as u64, Ordering::SeqCst) + n as u64;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn wait_for_room(&self) -> Result<Duration, BudgetClosed> {
        let started = Instant::now();
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let result = loop {
            self.waiting.store(true, Ordering::SeqCst);
            if self.closed.load(Ordering::SeqCst) {
                break Err(BudgetClosed);
            }
            if self.queued.load(Ordering::SeqCst) < self.limit.load(Ordering::SeqCst) {
                break Ok(started.elapsed());
            }
            // The timeout is a safety net only: a consumer that frees room wakes us.
            guard = self
                .room
                .wait_timeout(guard, Duration::from_millis(50))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        self.waiting.store(false, Ordering::SeqCst);
        result
    }

    /// Waits up to `timeout` until [`ChannelBudget::link_room`] is at least `needed` (or
    /// every consumer is gone): a link's receiver waiting to grant credit. Takes the
    /// writer's place, so only the channel's writer may call it.
    pub fn wait_for_link_room(&self, needed: u64, timeout: Duration) {
        if self.link_room() >= needed {
            return;
        }
        let deadline = Instant::now() + timeout;
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            self.waiting.store(true, Ordering::SeqCst);
            let now = Instant::now();
            if self.link_room() >= needed || self.closed.load(Ordering::SeqCst) || now >= deadline {
                break;
            }
            guard = self
                .room
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        self.waiting.store(false, Ordering::SeqCst);
    }

    fn wake(&self) {
        if self.waiting.load(Ordering::SeqCst) {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.room.notify_all();
        }
    }

    fn release(&self, n: u64) {
        let _ = self
            .queued
            .fetch_update(Ordering::SeqCst, Ordering::Relaxed, |q| {
                Some(q.saturating_sub(n))
            });
        self.wake();
    }

    fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::SeqCst);
        self.wake();
    }
}

/// The consumer end of a channel's budget: reports records taken off the channel and
/// measures their rate. When the last consumer of a channel is dropped, a writer
/// waiting on the budget gives up, as it would on a closed channel.
///
/// ```
/// use weir_core::exchange::{BudgetConsumer, BudgetPolicy, ChannelBudget};
/// use std::time::Duration;
/// let policy = BudgetPolicy { target: Some(Duration::from_secs(1)), floor: 10, ceiling: 1_000 };
/// let budget = ChannelBudget::new(policy);
/// let consumer = BudgetConsumer::new(budget.clone());
/// assert_eq!(budget.acquire(10), Ok(None)); // under the initial limit (the floor)
/// assert_eq!(budget.queued(), 10);
/// consumer.consumed(10);
/// assert_eq!(budget.queued(), 0);
/// drop(consumer);
/// budget.acquire(10).unwrap(); // no consumer: room is never checked below the limit
/// assert!(budget.acquire(1).is_err()); // at the limit and nobody will take records
/// ```
pub struct BudgetConsumer {
    budget: Arc<ChannelBudget>,
    meter: Cell<RateMeter>,
}

impl BudgetConsumer {
    /// A consumer of `budget`'s channel.
    pub fn new(budget: Arc<ChannelBudget>) -> Self {
        budget.consumers.fetch_add(1, Ordering::SeqCst);
        BudgetConsumer {
            budget,
            meter: Cell::new(RateMeter::default()),
        }
    }

    /// `n` records were taken off the channel: frees their room, and every
    /// [`RECOMPUTE_INTERVAL`] sets the limit to the measured rate × the target.
    pub fn consumed(&self, n: usize) {
        self.budget.release(n as u64);
        if self.budget.policy.target.is_some() {
            let mut meter = self.meter.get();
            if let Some(rate) = meter.observe(n as u64, Instant::now()) {
                self.budget.set_limit(self.budget.policy.limit_for(rate));
            }
            self.meter.set(meter);
        }
    }

    /// The budget this consumer reports to.
    pub fn budget(&self) -> &Arc<ChannelBudget> {
        &self.budget
    }
}

impl Drop for BudgetConsumer {
    fn drop(&mut self) {
        if self.budget.consumers.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.budget.closed.store(true, Ordering::SeqCst);
            let _guard = self.budget.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.budget.room.notify_all();
        }
    }
}

#[cfg(test)]
#[path = "budget_tests.rs"]
mod tests;
