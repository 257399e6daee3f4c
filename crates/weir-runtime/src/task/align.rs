//! Barrier alignment of one operator task (sans-IO): exactly-once, a channel that
//! delivered barrier `n` is not read again until every channel has.

use std::time::{Duration, Instant};
use weir_core::ids::CheckpointId;

/// Barrier alignment of one operator task (sans-IO).
pub(super) struct Aligner {
    exactly_once: bool,
    pending: Option<(CheckpointId, Instant)>,
    arrived: Vec<bool>,
    /// The newest checkpoint aligned (or gone on unaligned) at this task.
    pub(super) last: Option<CheckpointId>,
}

pub(super) enum Aligned {
    /// Nothing to do yet.
    Wait,
    /// Barrier `id` arrived on every open channel.
    Complete(CheckpointId, Duration),
}

impl Aligner {
    pub(super) fn new(channels: usize, exactly_once: bool) -> Self {
        Aligner {
            exactly_once,
            pending: None,
            arrived: vec![false; channels],
            last: None,
        }
    }

    /// True when `flat` must not be read (it is blocked by alignment).
    pub(super) fn blocked(&self, flat: usize) -> bool {
        self.exactly_once && self.arrived[flat]
    }

    pub(super) fn check(&mut self, ended: &[bool]) -> Aligned {
        let Some((id, started)) = self.pending else {
            return Aligned::Wait;
        };
        if self.arrived.iter().zip(ended).all(|(a, e)| *a || *e) {
            self.pending = None;
            self.last = Some(id);
            self.arrived.iter_mut().for_each(|a| *a = false);
            return Aligned::Complete(id, started.elapsed());
        }
        Aligned::Wait
    }

    pub(super) fn on_barrier(&mut self, flat: usize, id: CheckpointId, ended: &[bool]) -> Aligned {
        if self.last.is_some_and(|l| id <= l) {
            return Aligned::Wait;
        }
        match self.pending {
            Some((p, _)) if id < p => return Aligned::Wait,
            Some((p, _)) if id > p => {
                // A newer barrier subsumes the one being aligned.
                self.arrived.iter_mut().for_each(|a| *a = false);
                self.pending = Some((id, Instant::now()));
            }
            Some(_) => {}
            None => self.pending = Some((id, Instant::now())),
        }
        self.arrived[flat] = true;
        self.check(ended)
    }

    /// Checkpoint `id` goes on unaligned (its alignment timed out, or an unaligned barrier
    /// of it or a newer one came): alignment ends, every channel is read again. Returns the
    /// channels whose barrier `id` had already arrived in band.
    pub(super) fn switch(&mut self, id: CheckpointId) -> Vec<bool> {
        let same = self.pending.is_some_and(|(p, _)| p == id);
        let arrived = if same {
            self.arrived.clone()
        } else {
            vec![false; self.arrived.len()]
        };
        self.pending = None;
        self.arrived.iter_mut().for_each(|a| *a = false);
        self.last = Some(self.last.map_or(id, |l| l.max(id)));
        arrived
    }

    /// Per channel: barrier of the checkpoint being aligned came.
    pub(super) fn arrived(&self) -> &[bool] {
        &self.arrived
    }

    /// The checkpoint being aligned and when its first barrier came.
    pub(super) fn pending(&self) -> Option<(CheckpointId, Instant)> {
        self.pending
    }

    pub(super) fn on_abort(&mut self, id: CheckpointId) {
        if self.pending.is_some_and(|(p, _)| p == id) {
            self.pending = None;
            self.arrived.iter_mut().for_each(|a| *a = false);
        }
    }
}
