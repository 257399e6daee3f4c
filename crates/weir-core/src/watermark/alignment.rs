//! Watermark alignment (Flink's `WatermarkStrategy.withWatermarkAlignment`): the sources of
//! one alignment group stop reading while their watermark is more than a maximum drift
//! ahead of the group's minimum, so a fast source does not fill the state of the operators
//! that wait for the slow ones (a join of two sources read at very different speeds).
//!
//! This module owns the vocabulary: the configuration ([`WatermarkAlignment`]), what one
//! source subtask reports to its group ([`AlignmentMember`]), the rule that combines the
//! reports ([`group_minimum`], [`max_allowed`]), the handle a source reads to pause some of
//! its splits ([`AlignmentHandle`]) and the output wrapper that observes the watermarks a
//! source subtask sends downstream ([`AlignmentObserved`]). It owns no thread and no timer:
//! the runtime publishes the group's minimum every update interval and pauses the sources.

use crate::error::{Error, Result};
use crate::output::{Control, Output};
use crate::time::{MAX_WATERMARK, MIN_WATERMARK, Timestamp};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};
use std::time::Duration;

/// A source's place in an alignment group: the group's name, how far its watermark may run
/// ahead of the group's minimum, and how often the minimum is published.
///
/// Set it with
/// [`WatermarkStrategy::watermark_alignment`](crate::watermark::WatermarkStrategy::watermark_alignment)
/// (or [`Stream::watermark_alignment`](crate::dsl::Stream::watermark_alignment) for a source
/// that emits its own watermarks). [`validate`](Self::validate) says what is wrong with it.
///
/// ```
/// use std::time::Duration;
/// use weir_core::watermark::WatermarkAlignment;
/// let a = WatermarkAlignment::new("clicks-and-views", Duration::from_secs(20), Duration::from_secs(1));
/// assert!(a.validate().is_ok());
/// assert_eq!(a.max_drift_ms(), 20_000);
/// let bad = WatermarkAlignment::new("", Duration::from_secs(20), Duration::from_secs(1));
/// assert!(bad.validate().unwrap_err().to_string().contains("group name"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatermarkAlignment {
    group: String,
    max_drift: Duration,
    update_interval: Duration,
}

impl WatermarkAlignment {
    /// Sources of group `group` stop reading while their watermark is more than
    /// `max_drift` ahead of the lowest watermark in the group, which is recomputed every
    /// `update_interval`.
    pub fn new(group: impl Into<String>, max_drift: Duration, update_interval: Duration) -> Self {
        WatermarkAlignment {
            group: group.into(),
            max_drift,
            update_interval,
        }
    }

    /// The group's name.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// How far ahead of the group's minimum a source may run.
    pub fn max_drift(&self) -> Duration {
        self.max_drift
    }

    /// The maximum drift in event-time milliseconds.
    pub fn max_drift_ms(&self) -> Timestamp {
        i64::try_from(self.max_drift.as_millis()).unwrap_or(i64::MAX)
    }

    /// How often the group's minimum is published.
    pub fn update_interval(&self) -> Duration {
        self.update_interval
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// [`Error::Config`] for an empty group name, a maximum drift under one millisecond
    /// (every source would wait for every other at each step) or a zero update interval.
    pub fn validate(&self) -> Result<()> {
        if self.group.trim().is_empty() {
            return Err(Error::Config(
                "watermark alignment needs a group name: sources with the same name are aligned \
                 with each other, e.g. .watermark_alignment(\"orders-and-payments\", drift, interval)"
                    .into(),
            ));
        }
        if self.max_drift < Duration::from_millis(1) {
            return Err(Error::Config(format!(
                "watermark alignment group '{}': the maximum drift is {:?}; it must be at least \
                 1 ms (event time is in milliseconds), and in practice larger than the watermark \
                 steps of the sources, e.g. Duration::from_secs(10)",
                self.group, self.max_drift
            )));
        }
        if self.update_interval.is_zero() {
            return Err(Error::Config(format!(
                "watermark alignment group '{}': the update interval is zero; give how often the \
                 group's minimum watermark is published, e.g. Duration::from_millis(100) \
                 (Flink's default is 1 s)",
                self.group
            )));
        }
        Ok(())
    }
}

/// Whether a group member holds the group back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberStatus {
    /// Reading: its watermark counts in the group's minimum.
    Active,
    /// Marked idle: left out of the minimum until it is active again.
    Idle,
    /// Read all of its input: left out of the minimum for good.
    Finished,
}

const ACTIVE: u8 = 0;
const IDLE: u8 = 1;
const FINISHED: u8 = 2;

#[derive(Debug)]
struct MemberCells {
    watermark: AtomicI64,
    status: AtomicU8,
}

/// What one source subtask reports to its alignment group: the last watermark it sent
/// downstream and whether it is active, idle or finished. Updated by the subtask's own
/// thread with relaxed stores, read by the members of the group.
///
/// ```
/// use weir_core::watermark::{AlignmentMember, MemberStatus};
/// let m = AlignmentMember::new();
/// m.report_watermark(40);
/// m.report_watermark(30); // lower: ignored
/// m.set_idle(true);
/// assert_eq!(m.report(), (40, MemberStatus::Idle));
/// ```
#[derive(Debug, Clone)]
pub struct AlignmentMember(Arc<MemberCells>);

impl Default for AlignmentMember {
    fn default() -> Self {
        Self::new()
    }
}

impl AlignmentMember {
    /// An active member without a watermark yet (it holds the group at the minimum).
    pub fn new() -> Self {
        AlignmentMember(Arc::new(MemberCells {
            watermark: AtomicI64::new(MIN_WATERMARK),
            status: AtomicU8::new(ACTIVE),
        }))
    }

    /// Starts over (a new attempt of the job): no watermark, active.
    pub fn reset(&self) {
        self.0.watermark.store(MIN_WATERMARK, Ordering::Relaxed);
        self.0.status.store(ACTIVE, Ordering::Relaxed);
    }

    /// The subtask sent `watermark` downstream (a lower one than before is ignored). The
    /// maximum watermark (end of input) finishes the member.
    pub fn report_watermark(&self, watermark: Timestamp) {
        self.0.watermark.fetch_max(watermark, Ordering::Relaxed);
        if watermark == MAX_WATERMARK {
            self.finish();
        }
    }

    /// The subtask was marked idle, or active again.
    pub fn set_idle(&self, idle: bool) {
        let (from, to) = if idle { (ACTIVE, IDLE) } else { (IDLE, ACTIVE) };
        let _ = self
            .0
            .status
            .compare_exchange(from, to, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The subtask read all of its input.
    pub fn finish(&self) {
        self.0.status.store(FINISHED, Ordering::Relaxed);
    }

    /// Sets what a member running in another process last reported (its watermark may
    /// go back: the other process may have restarted).
    pub fn set_report(&self, watermark: Timestamp, status: MemberStatus) {
        self.0.watermark.store(watermark, Ordering::Relaxed);
        let s = match status {
            MemberStatus::Active => ACTIVE,
            MemberStatus::Idle => IDLE,
            MemberStatus::Finished => FINISHED,
        };
        self.0.status.store(s, Ordering::Relaxed);
    }

    /// The last watermark reported ([`MIN_WATERMARK`] when none yet).
    pub fn watermark(&self) -> Timestamp {
        self.0.watermark.load(Ordering::Relaxed)
    }

    /// The last watermark and status reported.
    pub fn report(&self) -> (Timestamp, MemberStatus) {
        let status = match self.0.status.load(Ordering::Relaxed) {
            ACTIVE => MemberStatus::Active,
            IDLE => MemberStatus::Idle,
            _ => MemberStatus::Finished,
        };
        (self.watermark(), status)
    }
}

/// The group's minimum watermark over its active members (idle and finished members do not
/// hold the group back); `None` when no member is active.
///
/// ```
/// use weir_core::watermark::{MemberStatus::*, group_minimum};
/// assert_eq!(group_minimum([(50, Active), (10, Idle), (30, Active)]), Some(30));
/// assert_eq!(group_minimum([(10, Idle), (99, Finished)]), None);
/// ```
pub fn group_minimum(
    reports: impl IntoIterator<Item = (Timestamp, MemberStatus)>,
) -> Option<Timestamp> {
    reports
        .into_iter()
        .filter(|(_, s)| *s == MemberStatus::Active)
        .map(|(w, _)| w)
        .min()
}

/// The highest watermark a member may have and still read: the group's minimum plus the
/// maximum drift, or [`MAX_WATERMARK`] (no limit) when no member is active.
///
/// ```
/// use weir_core::time::MAX_WATERMARK;
/// use weir_core::watermark::max_allowed;
/// assert_eq!(max_allowed(Some(1_000), 200), 1_200);
/// assert_eq!(max_allowed(None, 200), MAX_WATERMARK);
/// ```
pub fn max_allowed(minimum: Option<Timestamp>, max_drift_ms: Timestamp) -> Timestamp {
    match minimum {
        Some(m) => m.saturating_add(max_drift_ms).min(MAX_WATERMARK - 1),
        None => MAX_WATERMARK,
    }
}

/// What a source subtask of an alignment group sees of it: the highest watermark it may
/// read up to, published by the runtime every update interval. A source that reads several
/// splits (Kafka partitions, files) and tracks a watermark per split pauses the splits that
/// [`allows`](Self::allows) refuses and reads the others (Flink's split-level alignment);
/// the runtime pauses the whole subtask when the subtask's own watermark is too far ahead.
/// A source finds it in [`SourceContext::alignment`](crate::dsl::SourceContext::alignment).
///
/// ```
/// use weir_core::watermark::AlignmentHandle;
/// let h = AlignmentHandle::new("g");
/// assert!(h.allows(i64::MAX - 1)); // nothing published yet: no limit
/// h.publish(1_200);
/// assert!(h.allows(1_200));
/// assert!(!h.allows(1_201));
/// ```
#[derive(Debug, Clone)]
pub struct AlignmentHandle {
    group: Arc<str>,
    allowed: Arc<AtomicI64>,
}

impl AlignmentHandle {
    /// A handle for group `group` with no limit yet.
    pub fn new(group: &str) -> Self {
        AlignmentHandle {
            group: group.into(),
            allowed: Arc::new(AtomicI64::new(MAX_WATERMARK)),
        }
    }

    /// The group's name.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The highest watermark the source may read up to now.
    pub fn max_allowed_watermark(&self) -> Timestamp {
        self.allowed.load(Ordering::Relaxed)
    }

    /// True when a split at `watermark` may be read.
    pub fn allows(&self, watermark: Timestamp) -> bool {
        watermark <= self.max_allowed_watermark()
    }

    /// Publishes a new limit (the runtime does, every update interval).
    pub fn publish(&self, max_allowed: Timestamp) {
        self.allowed.store(max_allowed, Ordering::Relaxed);
    }
}

/// Split-level alignment for a source that reads several splits (partitions, files) and
/// tracks a watermark per split: which splits to pause because their watermark is beyond
/// what the group allows, and which to resume. Sans-IO: the source applies the changes
/// (the Kafka source pauses and resumes the consumer's partitions) and reads the others.
///
/// ```
/// use weir_core::watermark::{AlignmentHandle, SplitAlignment};
/// let h = AlignmentHandle::new("g");
/// h.publish(1_000);
/// let mut s = SplitAlignment::new();
/// let c = s.align(Some(&h), [(0, 900), (1, 5_000)]);
/// assert_eq!((c.pause, c.resume), (vec![1], vec![]));
/// assert!(s.is_paused(&1));
/// h.publish(6_000);
/// let c = s.align(Some(&h), [(0, 1_900), (1, 5_000)]);
/// assert_eq!((c.pause, c.resume), (vec![], vec![1]));
/// ```
#[derive(Debug, Clone)]
pub struct SplitAlignment<S> {
    paused: std::collections::BTreeSet<S>,
}

impl<S: Ord + Clone> Default for SplitAlignment<S> {
    fn default() -> Self {
        Self::new()
    }
}

/// What [`SplitAlignment::align`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitChanges<S> {
    /// Splits to stop reading.
    pub pause: Vec<S>,
    /// Splits to read again.
    pub resume: Vec<S>,
}

impl<S: Ord + Clone> SplitAlignment<S> {
    /// No split paused.
    pub fn new() -> Self {
        SplitAlignment {
            paused: std::collections::BTreeSet::new(),
        }
    }

    /// Decides from each open split's watermark ([`MIN_WATERMARK`] for a split without one
    /// yet, which is never paused) and the group's limit; splits not listed (finished) are
    /// resumed. Without a handle (the source is in no group) nothing is paused.
    pub fn align(
        &mut self,
        handle: Option<&AlignmentHandle>,
        splits: impl IntoIterator<Item = (S, Timestamp)>,
    ) -> SplitChanges<S> {
        let mut paused = std::collections::BTreeSet::new();
        if let Some(h) = handle {
            for (s, w) in splits {
                if w != MIN_WATERMARK && !h.allows(w) {
                    paused.insert(s);
                }
            }
        }
        let changes = SplitChanges {
            pause: paused.difference(&self.paused).cloned().collect(),
            resume: self.paused.difference(&paused).cloned().collect(),
        };
        self.paused = paused;
        changes
    }

    /// True while `split` is paused.
    pub fn is_paused(&self, split: &S) -> bool {
        self.paused.contains(split)
    }

    /// The splits paused now.
    pub fn paused(&self) -> impl Iterator<Item = &S> {
        self.paused.iter()
    }
}

/// Reports the watermarks and idleness a source subtask sends downstream to its
/// [`AlignmentMember`], and forwards everything unchanged. The runtime puts it on the output
/// of the node that asked for alignment (the source itself, or the `with_watermarks` chained
/// to it), so the member sees the source's watermarks as downstream does.
///
/// ```
/// use weir_core::output::{Control, Discard, Output};
/// use weir_core::watermark::{AlignmentMember, AlignmentObserved, MemberStatus};
/// let m = AlignmentMember::new();
/// let mut out = AlignmentObserved::new(Box::new(Discard), m.clone());
/// Output::<u32>::control(&mut out, Control::Watermark(70)).unwrap();
/// Output::<u32>::control(&mut out, Control::Idle(true)).unwrap();
/// assert_eq!(m.report(), (70, MemberStatus::Idle));
/// ```
pub struct AlignmentObserved<T> {
    inner: Box<dyn Output<T>>,
    member: AlignmentMember,
}

impl<T> AlignmentObserved<T> {
    /// Wraps `inner`, reporting to `member`.
    pub fn new(inner: Box<dyn Output<T>>, member: AlignmentMember) -> Self {
        AlignmentObserved { inner, member }
    }
}

impl<T> Output<T> for AlignmentObserved<T> {
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        self.inner.record(value, ts)
    }

    fn control(&mut self, event: Control) -> Result<()> {
        match event {
            Control::Watermark(w) => {
                self.member.report_watermark(w);
                // A watermark makes a stream active again (see WatermarkTracker).
                self.member.set_idle(false);
            }
            Control::Idle(i) => self.member.set_idle(i),
            Control::End => self.member.finish(),
            _ => {}
        }
        self.inner.control(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_what_is_wrong() {
        let ok = WatermarkAlignment::new("g", Duration::from_millis(1), Duration::from_millis(1));
        assert!(ok.validate().is_ok());
        let e = WatermarkAlignment::new("  ", Duration::from_secs(1), Duration::from_secs(1))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a group name"), "{e}");
        let e = WatermarkAlignment::new("g", Duration::ZERO, Duration::from_secs(1))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("group 'g': the maximum drift is 0ns"), "{e}");
        let e = WatermarkAlignment::new("g", Duration::from_micros(900), Duration::from_secs(1))
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 1 ms"), "{e}");
        let e = WatermarkAlignment::new("g", Duration::from_secs(1), Duration::ZERO)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("update interval is zero"), "{e}");
    }

    #[test]
    fn a_member_without_a_watermark_holds_the_group_at_the_minimum() {
        let (a, b) = (AlignmentMember::new(), AlignmentMember::new());
        a.report_watermark(5_000);
        let min = group_minimum([a.report(), b.report()]);
        assert_eq!(min, Some(MIN_WATERMARK));
        assert!(max_allowed(min, 100) < 5_000);
        b.report_watermark(4_950);
        assert_eq!(
            max_allowed(group_minimum([a.report(), b.report()]), 100),
            5_050
        );
    }

    #[test]
    fn idle_and_finished_members_do_not_hold_the_group_back() {
        let (a, b) = (AlignmentMember::new(), AlignmentMember::new());
        a.report_watermark(10);
        b.report_watermark(1_000);
        assert_eq!(group_minimum([a.report(), b.report()]), Some(10));
        a.set_idle(true);
        assert_eq!(group_minimum([a.report(), b.report()]), Some(1_000));
        a.set_idle(false);
        assert_eq!(group_minimum([a.report(), b.report()]), Some(10));
        a.report_watermark(MAX_WATERMARK);
        assert_eq!(a.report().1, MemberStatus::Finished);
        // A finished member stays finished, idle or not.
        a.set_idle(false);
        assert_eq!(group_minimum([a.report(), b.report()]), Some(1_000));
        b.finish();
        assert_eq!(group_minimum([a.report(), b.report()]), None);
        assert_eq!(max_allowed(None, 5), MAX_WATERMARK);
        b.reset();
        assert_eq!(b.report(), (MIN_WATERMARK, MemberStatus::Active));
    }

    #[test]
    fn the_limit_never_reaches_the_end_of_input_watermark() {
        assert_eq!(max_allowed(Some(MAX_WATERMARK - 3), 10), MAX_WATERMARK - 1);
        assert_eq!(max_allowed(Some(MIN_WATERMARK), 10), MIN_WATERMARK + 10);
    }
}
