//! Time windows and window assigners (sans-IO).

use crate::time::Timestamp;
use serde::{Deserialize, Serialize};

/// A half-open interval of event time `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TimeWindow {
    /// First timestamp in the window.
    pub start: Timestamp,
    /// First timestamp after the window.
    pub end: Timestamp,
}

impl TimeWindow {
    /// A window `[start, end)`.
    pub fn new(start: Timestamp, end: Timestamp) -> Self {
        TimeWindow { start, end }
    }
    /// The largest timestamp in the window; the window fires when the watermark reaches it.
    pub fn max_timestamp(&self) -> Timestamp {
        self.end - 1
    }
    /// True when the windows overlap or touch (sessions merge then).
    pub fn intersects(&self, other: &TimeWindow) -> bool {
        self.start <= other.end && self.end >= other.start
    }
    /// The smallest window that covers both.
    pub fn cover(&self, other: &TimeWindow) -> TimeWindow {
        TimeWindow {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

/// Assigns records to windows by their timestamp.
///
/// ```
/// use weir_core::window::{TimeWindow, WindowAssigner};
/// let t = WindowAssigner::tumbling(10);
/// assert_eq!(t.assign(13), vec![TimeWindow::new(10, 20)]);
/// let s = WindowAssigner::sliding(10, 5);
/// assert_eq!(s.assign(13), vec![TimeWindow::new(5, 15), TimeWindow::new(10, 20)]);
/// let g = WindowAssigner::session(4);
/// assert_eq!(g.assign(13), vec![TimeWindow::new(13, 17)]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowAssigner {
    /// Fixed-size, non-overlapping windows aligned to `offset`.
    Tumbling {
        /// Window length.
        size: Timestamp,
        /// Alignment offset.
        offset: Timestamp,
    },
    /// Fixed-size windows starting every `slide`.
    Sliding {
        /// Window length.
        size: Timestamp,
        /// Distance between window starts.
        slide: Timestamp,
        /// Alignment offset.
        offset: Timestamp,
    },
    /// Windows of activity separated by at least `gap` without records; merged per key.
    Session {
        /// Inactivity gap that closes a session.
        gap: Timestamp,
    },
}

fn window_start(ts: Timestamp, offset: Timestamp, size: Timestamp) -> Timestamp {
    ts - (ts - offset).rem_euclid(size)
}

impl WindowAssigner {
    /// Tumbling windows of `size`.
    ///
    /// # Panics
    /// When `size <= 0`.
    pub fn tumbling(size: Timestamp) -> Self {
        assert!(
            size > 0,
            "tumbling window size must be positive, got {size}"
        );
        WindowAssigner::Tumbling { size, offset: 0 }
    }
    /// Sliding windows of `size` every `slide`.
    ///
    /// # Panics
    /// When `size <= 0` or `slide <= 0`.
    pub fn sliding(size: Timestamp, slide: Timestamp) -> Self {
        assert!(
            size > 0 && slide > 0,
            "sliding window size and slide must be positive, got {size} and {slide}"
        );
        WindowAssigner::Sliding {
            size,
            slide,
            offset: 0,
        }
    }
    /// Session windows closed by `gap` of inactivity.
    ///
    /// # Panics
    /// When `gap <= 0`.
    pub fn session(gap: Timestamp) -> Self {
        assert!(gap > 0, "session gap must be positive, got {gap}");
        WindowAssigner::Session { gap }
    }
    /// Shifts window alignment by `offset` (tumbling and sliding only).
    pub fn with_offset(self, new_offset: Timestamp) -> Self {
        match self {
            WindowAssigner::Tumbling { size, .. } => WindowAssigner::Tumbling {
                size,
                offset: new_offset,
            },
            WindowAssigner::Sliding { size, slide, .. } => WindowAssigner::Sliding {
                size,
                slide,
                offset: new_offset,
            },
            s => s,
        }
    }
    /// True for session windows, whose windows merge.
    pub fn is_merging(&self) -> bool {
        matches!(self, WindowAssigner::Session { .. })
    }
    /// The windows a record with timestamp `ts` belongs to, earliest first.
    pub fn assign(&self, ts: Timestamp) -> Vec<TimeWindow> {
        let mut v = Vec::with_capacity(1);
        self.assign_into(ts, &mut v);
        v
    }
    /// Like [`WindowAssigner::assign`], into a reused buffer (cleared first).
    pub fn assign_into(&self, ts: Timestamp, out: &mut Vec<TimeWindow>) {
        out.clear();
        match *self {
            WindowAssigner::Tumbling { size, offset } => {
                let start = window_start(ts, offset, size);
                out.push(TimeWindow::new(start, start + size));
            }
            WindowAssigner::Sliding {
                size,
                slide,
                offset,
            } => {
                let last = window_start(ts, offset, slide);
                let mut start = last;
                while start > ts - size {
                    start -= slide;
                }
                start += slide;
                while start <= last {
                    out.push(TimeWindow::new(start, start + size));
                    start += slide;
                }
            }
            WindowAssigner::Session { gap } => out.push(TimeWindow::new(ts, ts + gap)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tumbling_handles_negative_timestamps() {
        assert_eq!(
            WindowAssigner::tumbling(10).assign(-1),
            vec![TimeWindow::new(-10, 0)]
        );
        assert_eq!(
            WindowAssigner::tumbling(10).assign(0),
            vec![TimeWindow::new(0, 10)]
        );
        assert_eq!(
            WindowAssigner::tumbling(10).with_offset(3).assign(2),
            vec![TimeWindow::new(-7, 3)]
        );
    }

    #[test]
    fn sliding_covers_every_window_containing_ts() {
        let s = WindowAssigner::sliding(10, 3);
        for ts in -20..20 {
            let ws = s.assign(ts);
            for w in &ws {
                assert!(w.start <= ts && ts < w.end, "{w:?} does not contain {ts}");
            }
            // exactly the windows whose start is a multiple of 3 in (ts-10, ts]
            let expected = ((ts - 9)..=ts).filter(|st| st.rem_euclid(3) == 0).count();
            assert_eq!(ws.len(), expected, "ts {ts}");
        }
    }

    #[test]
    fn session_windows_touching_intersect() {
        let a = TimeWindow::new(0, 5);
        assert!(a.intersects(&TimeWindow::new(5, 9)));
        assert!(!a.intersects(&TimeWindow::new(6, 9)));
        assert_eq!(a.cover(&TimeWindow::new(3, 9)), TimeWindow::new(0, 9));
    }
}
