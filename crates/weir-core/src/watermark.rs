//! Watermarks: the strategy users configure ([`WatermarkStrategy`]), the operator that
//! applies it, and the tracker that combines the watermarks of many input channels
//! ([`WatermarkTracker`], sans-IO).
//!
//! An operator's watermark is the minimum over its active inputs; idle inputs are left
//! out of the minimum; an input that ended counts as the maximum watermark.

use crate::data::Data;
use crate::error::Result;
use crate::output::{Control, Output};
use crate::time::{MAX_WATERMARK, MIN_WATERMARK, NO_TIMESTAMP, Timestamp};
use std::sync::Arc;
use std::time::Duration;

type TimestampFn<T> = Arc<dyn Fn(&T) -> Timestamp + Send + Sync>;

/// How a stream's event time and watermarks are derived.
///
/// ```
/// use weir_core::watermark::WatermarkStrategy;
/// use std::time::Duration;
/// let s = WatermarkStrategy::<(String, i64)>::bounded_out_of_orderness(100)
///     .with_timestamps(|e| e.1)
///     .with_idleness(Duration::from_secs(5));
/// assert_eq!(s.max_out_of_orderness(), 100);
/// ```
pub struct WatermarkStrategy<T> {
    out_of_orderness: Timestamp,
    idleness: Option<Duration>,
    interval: Duration,
    timestamps: Option<TimestampFn<T>>,
}

impl<T> Clone for WatermarkStrategy<T> {
    fn clone(&self) -> Self {
        WatermarkStrategy {
            out_of_orderness: self.out_of_orderness,
            idleness: self.idleness,
            interval: self.interval,
            timestamps: self.timestamps.clone(),
        }
    }
}

impl<T: Data> WatermarkStrategy<T> {
    /// Watermarks trail the largest timestamp seen by `max_delay` (records may arrive up to
    /// that much out of order): watermark = max timestamp - max_delay - 1.
    pub fn bounded_out_of_orderness(max_delay: Timestamp) -> Self {
        WatermarkStrategy {
            out_of_orderness: max_delay.max(0),
            idleness: None,
            interval: Duration::from_millis(200),
            timestamps: None,
        }
    }

    /// Watermarks equal to the largest timestamp seen (records arrive in order).
    pub fn monotonous() -> Self {
        Self::bounded_out_of_orderness(0)
    }

    /// Takes each record's timestamp from the record (otherwise the source's timestamp).
    pub fn with_timestamps(mut self, f: impl Fn(&T) -> Timestamp + Send + Sync + 'static) -> Self {
        self.timestamps = Some(Arc::new(f));
        self
    }

    /// Marks the stream idle after this long without records, so it does not hold back
    /// the watermark of downstream operators.
    pub fn with_idleness(mut self, timeout: Duration) -> Self {
        self.idleness = Some(timeout);
        self
    }

    /// How often watermarks are emitted (processing time); default 200 ms.
    pub fn with_emit_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The configured bound on out-of-orderness.
    pub fn max_out_of_orderness(&self) -> Timestamp {
        self.out_of_orderness
    }

    /// The operator that applies this strategy in front of `out`.
    pub fn operator(&self, out: Box<dyn Output<T>>) -> WatermarkOperator<T> {
        WatermarkOperator {
            strategy: self.clone(),
            out,
            max_ts: MIN_WATERMARK,
            emitted: MIN_WATERMARK,
            last_emit_ms: 0,
            last_record_ms: None,
            idle: false,
            dirty: false,
        }
    }
}

/// Assigns timestamps and emits watermarks per [`WatermarkStrategy`].
pub struct WatermarkOperator<T> {
    strategy: WatermarkStrategy<T>,
    out: Box<dyn Output<T>>,
    max_ts: Timestamp,
    emitted: Timestamp,
    last_emit_ms: i64,
    last_record_ms: Option<i64>,
    idle: bool,
    dirty: bool,
}

impl<T> WatermarkOperator<T> {
    fn emit(&mut self) -> Result<()> {
        if self.max_ts == MIN_WATERMARK {
            return Ok(());
        }
        let wm = self
            .max_ts
            .saturating_sub(self.strategy.out_of_orderness)
            .saturating_sub(1);
        if wm > self.emitted {
            self.emitted = wm;
            self.out.control(Control::Watermark(wm))?;
        }
        Ok(())
    }
}

impl<T> Output<T> for WatermarkOperator<T> {
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        let ts = match &self.strategy.timestamps {
            Some(f) => f(&value),
            None => ts,
        };
        if self.idle {
            self.idle = false;
            self.out.control(Control::Idle(false))?;
        }
        if ts != NO_TIMESTAMP && ts > self.max_ts {
            self.max_ts = ts;
        }
        self.dirty = true;
        self.out.record(value, ts)
    }

    fn control(&mut self, event: Control) -> Result<()> {
        match event {
            Control::Tick(now) => {
                if self.dirty {
                    self.dirty = false;
                    self.last_record_ms = Some(now);
                }
                if now - self.last_emit_ms >= self.strategy.interval.as_millis() as i64 {
                    self.last_emit_ms = now;
                    self.emit()?;
                }
                if let (Some(idle), Some(last)) = (self.strategy.idleness, self.last_record_ms)
                    && !self.idle
                    && now - last >= idle.as_millis() as i64
                {
                    self.emit()?;
                    self.idle = true;
                    self.out.control(Control::Idle(true))?;
                }
                self.out.control(event)
            }
            // Upstream watermarks are replaced by ours, except the final one.
            Control::Watermark(w) if w == MAX_WATERMARK => {
                self.emitted = MAX_WATERMARK;
                self.out.control(event)
            }
            Control::Watermark(_) | Control::Idle(_) => Ok(()),
            Control::Barrier(_) => self.out.control(event),
            Control::End => {
                self.emit()?;
                self.out.control(event)
            }
        }
    }
}

/// Combines the watermarks of many input channels into one (sans-IO).
///
/// ```
/// use weir_core::watermark::WatermarkTracker;
/// let mut t = WatermarkTracker::new(2);
/// assert_eq!(t.on_watermark(0, 10), None);     // channel 1 still at the minimum
/// assert_eq!(t.on_watermark(1, 7), Some(7));
/// assert_eq!(t.on_idle(1, true), Some(10));   // idle channel 1 no longer holds it back
/// assert_eq!(t.on_end(0), None);              // channel 1 is idle: no active input left
/// ```
pub struct WatermarkTracker {
    channels: Vec<ChannelState>,
    current: Timestamp,
}

#[derive(Clone, Copy)]
struct ChannelState {
    watermark: Timestamp,
    idle: bool,
    ended: bool,
}

impl WatermarkTracker {
    /// A tracker over `channels` inputs, all at the minimum watermark.
    pub fn new(channels: usize) -> Self {
        WatermarkTracker {
            channels: vec![
                ChannelState {
                    watermark: MIN_WATERMARK,
                    idle: false,
                    ended: false
                };
                channels
            ],
            current: MIN_WATERMARK,
        }
    }

    /// The combined watermark.
    pub fn current(&self) -> Timestamp {
        self.current
    }

    /// True when every input that has not ended is idle (and at least one is).
    pub fn all_idle(&self) -> bool {
        let mut any = false;
        for c in &self.channels {
            if c.ended {
                continue;
            }
            if !c.idle {
                return false;
            }
            any = true;
        }
        any
    }

    fn recompute(&mut self) -> Option<Timestamp> {
        // Active channels decide; ended ones no longer constrain. With no active channel
        // the watermark stays put unless every channel has ended.
        let active = self
            .channels
            .iter()
            .filter(|c| !c.idle && !c.ended)
            .map(|c| c.watermark)
            .min();
        let min = match active {
            Some(m) => Some(m),
            None if self.channels.iter().all(|c| c.ended) => Some(MAX_WATERMARK),
            None => None,
        };
        match min {
            Some(m) if m > self.current => {
                self.current = m;
                Some(m)
            }
            _ => None,
        }
    }

    /// A watermark arrived on `channel`; returns the new combined watermark if it advanced.
    pub fn on_watermark(&mut self, channel: usize, wm: Timestamp) -> Option<Timestamp> {
        let c = &mut self.channels[channel];
        if wm > c.watermark {
            c.watermark = wm;
        }
        c.idle = false;
        self.recompute()
    }

    /// `channel` became idle or active; returns the new combined watermark if it advanced.
    pub fn on_idle(&mut self, channel: usize, idle: bool) -> Option<Timestamp> {
        self.channels[channel].idle = idle;
        self.recompute()
    }

    /// `channel` ended; returns the new combined watermark if it advanced.
    pub fn on_end(&mut self, channel: usize) -> Option<Timestamp> {
        self.channels[channel].ended = true;
        self.recompute()
    }

    /// Marks `channel` active because a record arrived on it.
    pub fn on_record(&mut self, channel: usize) {
        self.channels[channel].idle = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_over_channels() {
        let mut t = WatermarkTracker::new(3);
        assert_eq!(t.on_watermark(0, 5), None);
        assert_eq!(t.on_watermark(1, 3), None);
        assert_eq!(t.on_watermark(2, 4), Some(3));
        assert_eq!(t.on_watermark(1, 9), Some(4));
        assert_eq!(t.on_watermark(1, 2), None, "watermarks never go back");
        assert_eq!(t.on_end(2), Some(5));
        assert_eq!(t.on_end(0), Some(9));
        assert_eq!(t.on_end(1), Some(MAX_WATERMARK));
    }

    #[test]
    fn idle_channels_do_not_hold_back() {
        let mut t = WatermarkTracker::new(2);
        t.on_watermark(0, 100);
        assert!(!t.all_idle());
        assert_eq!(t.on_idle(1, true), Some(100));
        assert_eq!(t.on_idle(0, true), None);
        assert!(t.all_idle());
        // a watermark from a previously idle channel makes it active again; channel 0 is
        // still idle, so channel 1 alone decides
        assert_eq!(t.on_watermark(1, 150), Some(150));
        assert!(!t.all_idle());
    }
}
