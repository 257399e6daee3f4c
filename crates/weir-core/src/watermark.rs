//! Watermarks: the strategy users configure ([`WatermarkStrategy`]), the generators that
//! derive watermarks from the records ([`WatermarkGenerator`], with the built-in
//! [`BoundedOutOfOrderness`]), the operator that applies them, and the tracker that
//! combines the watermarks of many input channels ([`WatermarkTracker`], sans-IO).
//!
//! An operator's watermark is the minimum over its active inputs; idle inputs are left
//! out of the minimum; an input that ended counts as the maximum watermark.
//!
//! Watermarks are part of checkpoints: the watermark operator stores the watermark it
//! emitted and emits it again, before any record, when the job resumes (the minimum over
//! the old subtasks after a rescale), so records after a restore are judged against the
//! same event time as before the crash.

use crate::checkpoint::{Checkpointed, OperatorSnapshot};
use crate::codec;
use crate::data::Data;
use crate::error::Result;
use crate::ids::CheckpointId;
use crate::output::{Control, Output};
use crate::time::{MAX_WATERMARK, MIN_WATERMARK, NO_TIMESTAMP, Timestamp};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

mod alignment;
pub use alignment::{
    AlignmentHandle, AlignmentMember, AlignmentObserved, MemberStatus, SplitAlignment,
    SplitChanges, WatermarkAlignment, group_minimum, max_allowed,
};

type TimestampFn<T> = Arc<dyn Fn(&T) -> Timestamp + Send + Sync>;
type GeneratorFactory<T> = Arc<dyn Fn() -> Box<dyn WatermarkGenerator<T>> + Send + Sync>;

/// Derives watermarks from the records of one subtask (Flink's `WatermarkGenerator`).
///
/// `on_event` sees every record with its timestamp and may emit a watermark at once (a
/// punctuated generator: the watermark follows the records, whatever the processing
/// speed); `on_periodic` is called every emit interval of the strategy (processing time)
/// and may emit one too. Emitted watermarks that do not advance event time are dropped.
///
/// The watermark the operator emitted is checkpointed and emitted again on restore, but the
/// generator itself starts afresh: a generator whose watermark is a running maximum over
/// the records (as bounded out-of-orderness is) continues exactly as without the restore.
///
/// ```
/// use weir_core::prelude::*;
/// use weir_core::watermark::{WatermarkGenerator, WatermarkOutput};
///
/// /// Advances event time only on marker records (value < 0) — a punctuated generator.
/// struct OnMarkers;
/// impl WatermarkGenerator<(String, i64)> for OnMarkers {
///     fn on_event(&mut self, e: &(String, i64), ts: Timestamp, out: &mut WatermarkOutput) {
///         if e.1 < 0 {
///             out.emit_watermark(ts);
///         }
///     }
/// }
/// let strategy = WatermarkStrategy::for_generator(|| OnMarkers);
/// let mut out = WatermarkOutput::new();
/// OnMarkers.on_event(&("tick".to_string(), -1), 40, &mut out);
/// assert_eq!(out.watermark(), Some(40));
/// # let _ = strategy;
/// ```
pub trait WatermarkGenerator<T>: 'static {
    /// Called for every record, after its timestamp is assigned.
    fn on_event(&mut self, event: &T, timestamp: Timestamp, output: &mut WatermarkOutput);
    /// Called every emit interval of the strategy; by default emits nothing.
    fn on_periodic(&mut self, output: &mut WatermarkOutput) {
        let _ = output;
    }
}

/// Where a [`WatermarkGenerator`] emits: the highest watermark emitted since the operator
/// last looked, or that the input became idle.
///
/// ```
/// use weir_core::watermark::WatermarkOutput;
/// let mut out = WatermarkOutput::new();
/// out.emit_watermark(10);
/// out.emit_watermark(7); // lower: ignored
/// assert_eq!(out.watermark(), Some(10));
/// out.mark_idle();
/// assert!(out.is_idle());
/// ```
#[derive(Debug, Default, Clone)]
pub struct WatermarkOutput {
    watermark: Option<Timestamp>,
    idle: bool,
}

impl WatermarkOutput {
    /// An output with nothing emitted (to test generators).
    pub fn new() -> Self {
        Self::default()
    }
    /// Emits a watermark: no record with a timestamp at or below it follows. Also marks
    /// the input active again.
    pub fn emit_watermark(&mut self, watermark: Timestamp) {
        self.watermark = Some(self.watermark.map_or(watermark, |w| w.max(watermark)));
        self.idle = false;
    }
    /// Marks the input idle: downstream watermarks stop waiting for it until it emits a
    /// record or a watermark again.
    pub fn mark_idle(&mut self) {
        self.idle = true;
    }
    /// The highest watermark emitted, if any.
    pub fn watermark(&self) -> Option<Timestamp> {
        self.watermark
    }
    /// True when the generator marked the input idle (and emitted nothing since).
    pub fn is_idle(&self) -> bool {
        self.idle
    }
    fn take(&mut self) -> (Option<Timestamp>, bool) {
        let r = (self.watermark.take(), self.idle);
        self.idle = false;
        r
    }
}

/// The built-in generator: watermark = largest timestamp seen - max delay - 1, emitted
/// periodically, or after every record that advances it when built
/// [`per record`](BoundedOutOfOrderness::per_record).
///
/// ```
/// use weir_core::watermark::{BoundedOutOfOrderness, WatermarkGenerator, WatermarkOutput};
/// let mut g = BoundedOutOfOrderness::new(5).per_record();
/// let mut out = WatermarkOutput::new();
/// WatermarkGenerator::<u32>::on_event(&mut g, &0, 20, &mut out);
/// assert_eq!(out.watermark(), Some(14));
/// ```
#[derive(Debug, Clone)]
pub struct BoundedOutOfOrderness {
    max_delay: Timestamp,
    max_ts: Timestamp,
    per_record: bool,
}

impl BoundedOutOfOrderness {
    /// Records may arrive up to `max_delay` out of order; watermarks are emitted periodically.
    pub fn new(max_delay: Timestamp) -> Self {
        BoundedOutOfOrderness {
            max_delay: max_delay.max(0),
            max_ts: MIN_WATERMARK,
            per_record: false,
        }
    }
    /// Emits the watermark after every record instead of periodically.
    pub fn per_record(mut self) -> Self {
        self.per_record = true;
        self
    }
    fn current(&self, out: &mut WatermarkOutput) {
        if self.max_ts != MIN_WATERMARK {
            out.emit_watermark(self.max_ts.saturating_sub(self.max_delay).saturating_sub(1));
        }
    }
}

impl<T> WatermarkGenerator<T> for BoundedOutOfOrderness {
    fn on_event(&mut self, _event: &T, timestamp: Timestamp, output: &mut WatermarkOutput) {
        if timestamp != NO_TIMESTAMP && timestamp > self.max_ts {
            self.max_ts = timestamp;
            if self.per_record {
                self.current(output);
            }
        }
    }
    fn on_periodic(&mut self, output: &mut WatermarkOutput) {
        self.current(output);
    }
}

/// How a stream's event time and watermarks are derived.
///
/// ```
/// use weir_core::watermark::WatermarkStrategy;
/// use std::time::Duration;
/// let s = WatermarkStrategy::<(String, i64)>::bounded_out_of_orderness(100)
///     .with_timestamps(|e| e.1)
///     .with_idleness(Duration::from_secs(5));
/// assert_eq!(s.max_out_of_orderness(), 100);
/// // The same, with a watermark after every record rather than every 200 ms:
/// let per_record = WatermarkStrategy::<(String, i64)>::bounded_out_of_orderness(100)
///     .with_timestamps(|e| e.1)
///     .with_per_record_watermarks();
/// # let _ = per_record;
/// ```
pub struct WatermarkStrategy<T> {
    out_of_orderness: Timestamp,
    per_record: bool,
    generator: Option<GeneratorFactory<T>>,
    idleness: Option<Duration>,
    interval: Duration,
    timestamps: Option<TimestampFn<T>>,
    alignment: Option<WatermarkAlignment>,
}

impl<T> Clone for WatermarkStrategy<T> {
    fn clone(&self) -> Self {
        WatermarkStrategy {
            out_of_orderness: self.out_of_orderness,
            per_record: self.per_record,
            generator: self.generator.clone(),
            idleness: self.idleness,
            interval: self.interval,
            timestamps: self.timestamps.clone(),
            alignment: self.alignment.clone(),
        }
    }
}

impl<T: Data> WatermarkStrategy<T> {
    /// Watermarks trail the largest timestamp seen by `max_delay` (records may arrive up to
    /// that much out of order): watermark = max timestamp - max_delay - 1.
    pub fn bounded_out_of_orderness(max_delay: Timestamp) -> Self {
        WatermarkStrategy {
            out_of_orderness: max_delay.max(0),
            per_record: false,
            generator: None,
            idleness: None,
            interval: Duration::from_millis(200),
            timestamps: None,
            alignment: None,
        }
    }

    /// Watermarks equal to the largest timestamp seen (records arrive in order).
    pub fn monotonous() -> Self {
        Self::bounded_out_of_orderness(0)
    }

    /// Watermarks from a custom [`WatermarkGenerator`]; `make` creates one per subtask.
    /// Its `on_periodic` is called every emit interval (default 200 ms).
    ///
    /// ```
    /// use weir_core::prelude::*;
    /// use weir_core::watermark::BoundedOutOfOrderness;
    /// // Equivalent to bounded_out_of_orderness(10).with_per_record_watermarks():
    /// let s = WatermarkStrategy::<(String, i64)>::for_generator(|| {
    ///     BoundedOutOfOrderness::new(10).per_record()
    /// })
    /// .with_timestamps(|e| e.1);
    /// # let _ = s;
    /// ```
    pub fn for_generator<G: WatermarkGenerator<T>>(
        make: impl Fn() -> G + Send + Sync + 'static,
    ) -> Self {
        let mut s = Self::bounded_out_of_orderness(0);
        s.generator = Some(Arc::new(move || Box::new(make())));
        s
    }

    /// Emits the bounded out-of-orderness watermark after every record that advances it,
    /// instead of every emit interval: watermarks follow the records whatever the speed
    /// of the job, so event-time results do not depend on processing time. (No effect on
    /// a strategy built with [`WatermarkStrategy::for_generator`].)
    pub fn with_per_record_watermarks(mut self) -> Self {
        self.per_record = true;
        self
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

    /// Puts the source in front of this strategy into the watermark alignment group
    /// `group` (Flink's `withWatermarkAlignment`): while the source's watermark is more
    /// than `max_drift` ahead of the lowest watermark of the group's sources, it stops
    /// reading (it still takes part in checkpoints) until the others catch up. The group's
    /// lowest watermark is recomputed every `update_interval`; idle and finished sources do
    /// not hold it back. Sources of different streams share a group by its name: align the
    /// two inputs of a join so that the fast one does not fill the join's state.
    ///
    /// The strategy must be applied right after the source, at the source's parallelism
    /// (in the source's task); the job refuses to start otherwise, and refuses an empty
    /// group name, a drift under 1 ms or a zero interval. How far a source can overshoot
    /// depends on how often its watermark moves: with watermarks every emit interval it can
    /// read that interval's worth of records beyond the drift; with
    /// [`with_per_record_watermarks`](Self::with_per_record_watermarks), about one batch.
    ///
    /// ```
    /// use std::time::Duration;
    /// use weir_core::prelude::*;
    /// let p = Pipeline::new();
    /// let aligned = || {
    ///     WatermarkStrategy::<(u32, i64)>::monotonous()
    ///         .with_timestamps(|e| e.1)
    ///         .with_per_record_watermarks()
    ///         .watermark_alignment("orders", Duration::from_secs(10), Duration::from_millis(100))
    /// };
    /// let orders = p.from_collection(vec![(1, 1_000), (2, 2_000)]).with_watermarks(aligned());
    /// let payments = p.from_collection(vec![(1, 1_500)]).with_watermarks(aligned());
    /// # let _ = (orders, payments);
    /// ```
    pub fn watermark_alignment(
        mut self,
        group: &str,
        max_drift: Duration,
        update_interval: Duration,
    ) -> Self {
        self.alignment = Some(WatermarkAlignment::new(group, max_drift, update_interval));
        self
    }

    /// The watermark alignment the strategy asks for, if any.
    pub fn alignment(&self) -> Option<&WatermarkAlignment> {
        self.alignment.as_ref()
    }

    /// The configured bound on out-of-orderness.
    pub fn max_out_of_orderness(&self) -> Timestamp {
        self.out_of_orderness
    }

    fn generator(&self) -> Box<dyn WatermarkGenerator<T>> {
        match &self.generator {
            Some(make) => make(),
            None => {
                let g = BoundedOutOfOrderness::new(self.out_of_orderness);
                Box::new(if self.per_record { g.per_record() } else { g })
            }
        }
    }

    /// The operator that applies this strategy in front of `out`.
    pub fn operator(&self, out: Box<dyn Output<T>>) -> WatermarkOperator<T> {
        WatermarkOperator {
            strategy: self.clone(),
            generator: self.generator(),
            wm_out: WatermarkOutput::new(),
            out,
            emitted: Rc::new(Cell::new(MIN_WATERMARK)),
            restored: None,
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
    generator: Box<dyn WatermarkGenerator<T>>,
    wm_out: WatermarkOutput,
    out: Box<dyn Output<T>>,
    /// The last watermark emitted (shared with the checkpoint hooks).
    emitted: Rc<Cell<Timestamp>>,
    /// A restored watermark still to emit before the first record.
    restored: Option<Timestamp>,
    last_emit_ms: i64,
    last_record_ms: Option<i64>,
    idle: bool,
    dirty: bool,
}

/// Checkpoints the watermark a [`WatermarkOperator`] emitted.
pub struct WatermarkHooks {
    emitted: Rc<Cell<Timestamp>>,
}

impl Checkpointed for WatermarkHooks {
    fn snapshot(&mut self, _id: CheckpointId) -> Result<OperatorSnapshot> {
        let wm = self.emitted.get();
        Ok(OperatorSnapshot {
            operator: Some(codec::encode(&wm)?),
            description: Some(format!("watermark {}", describe(wm))),
            ..OperatorSnapshot::default()
        })
    }
}

/// True when `snap` is what [`WatermarkHooks`] writes and nothing else: a watermark, no
/// state. A new version of a job may drop such an operator (a `with_watermarks` it no
/// longer has) and still restore the checkpoint: nothing is lost.
pub fn is_watermark_only(snap: &OperatorSnapshot) -> bool {
    let Some(bytes) = &snap.operator else {
        return false;
    };
    let Ok(wm) = codec::decode::<Timestamp>(bytes) else {
        return false;
    };
    snap.keyed.is_empty()
        && snap.files.is_empty()
        && snap.deferred.is_empty()
        && codec::encode(&wm).is_ok_and(|b| &b == bytes)
        && snap.description.as_deref() == Some(format!("watermark {}", describe(wm)).as_str())
}

fn describe(wm: Timestamp) -> String {
    match wm {
        MIN_WATERMARK => "none yet".into(),
        MAX_WATERMARK => "end of input".into(),
        w => w.to_string(),
    }
}

/// The watermark to resume from given the snapshots of every old subtask: the minimum
/// (each old subtask's input is past its own watermark, so all are past the minimum).
pub(crate) fn restored_watermark(states: &[Vec<u8>]) -> Result<Option<Timestamp>> {
    let mut min = None::<Timestamp>;
    for s in states {
        let w: Timestamp = codec::decode(s)?;
        min = Some(min.map_or(w, |m| m.min(w)));
    }
    Ok(min.filter(|w| *w != MIN_WATERMARK))
}

impl<T: 'static> WatermarkOperator<T> {
    /// The hooks that checkpoint this operator's watermark.
    pub fn hooks(&self) -> WatermarkHooks {
        WatermarkHooks {
            emitted: self.emitted.clone(),
        }
    }

    /// Resumes from a checkpoint whose watermark (the minimum over the old subtasks) was
    /// `watermark`: it is emitted before anything else, and the operator never emits a
    /// lower one.
    pub fn restore(&mut self, watermark: Timestamp) {
        if watermark > self.emitted.get() {
            self.restored = Some(watermark);
        }
    }

    /// Emits the restored watermark, once, before anything else.
    fn resume(&mut self) -> Result<()> {
        if let Some(w) = self.restored.take()
            && w > self.emitted.get()
        {
            self.emitted.set(w);
            self.out.control(Control::Watermark(w))?;
        }
        Ok(())
    }

    /// Forwards what the generator emitted: a watermark that advances event time, idleness.
    fn flush(&mut self) -> Result<()> {
        let (wm, idle) = self.wm_out.take();
        if let Some(w) = wm
            && w > self.emitted.get()
        {
            if self.idle {
                self.idle = false;
                self.out.control(Control::Idle(false))?;
            }
            self.emitted.set(w);
            self.out.control(Control::Watermark(w))?;
        }
        if idle && !self.idle {
            self.idle = true;
            self.out.control(Control::Idle(true))?;
        }
        Ok(())
    }

    fn periodic(&mut self) -> Result<()> {
        self.generator.on_periodic(&mut self.wm_out);
        self.flush()
    }
}

impl<T: 'static> Output<T> for WatermarkOperator<T> {
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        self.resume()?;
        let ts = match &self.strategy.timestamps {
            Some(f) => f(&value),
            None => ts,
        };
        if self.idle {
            self.idle = false;
            self.out.control(Control::Idle(false))?;
        }
        self.generator.on_event(&value, ts, &mut self.wm_out);
        self.dirty = true;
        self.out.record(value, ts)?;
        // As in Flink, a watermark the record caused follows the record.
        self.flush()
    }

    fn control(&mut self, event: Control) -> Result<()> {
        self.resume()?;
        match event {
            Control::Tick(now) => {
                if self.dirty {
                    self.dirty = false;
                    self.last_record_ms = Some(now);
                }
                if now - self.last_emit_ms >= self.strategy.interval.as_millis() as i64 {
                    self.last_emit_ms = now;
                    self.periodic()?;
                }
                if let (Some(idle), Some(last)) = (self.strategy.idleness, self.last_record_ms)
                    && !self.idle
                    && now - last >= idle.as_millis() as i64
                {
                    self.periodic()?;
                    self.idle = true;
                    self.out.control(Control::Idle(true))?;
                }
                self.out.control(event)
            }
            // Upstream watermarks are replaced by ours, except the final one.
            Control::Watermark(w) if w == MAX_WATERMARK => {
                self.emitted.set(MAX_WATERMARK);
                self.out.control(event)
            }
            Control::Watermark(_) | Control::Idle(_) => Ok(()),
            Control::Barrier(_) | Control::LatencyMarker(_) | Control::Flush => {
                self.out.control(event)
            }
            Control::End => {
                self.periodic()?;
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

    /// Starts from a restored watermark (a job resuming from a checkpoint): the combined
    /// watermark never goes below it, so the operator behind the tracker does not see event
    /// time go back while its inputs catch up.
    ///
    /// ```
    /// use weir_core::watermark::WatermarkTracker;
    /// let mut t = WatermarkTracker::new(1);
    /// t.resume_at(50);
    /// assert_eq!(t.on_watermark(0, 40), None);
    /// assert_eq!(t.on_watermark(0, 60), Some(60));
    /// ```
    pub fn resume_at(&mut self, watermark: Timestamp) {
        self.current = self.current.max(watermark);
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
mod tests;
