//! In-flight data of a task: the records queued in its input channels (written by the
//! upstream tasks, not yet taken) and the limit of their in-flight budgets, read from the
//! channels' budgets when a view is built. The task threads' path is unchanged.

use std::sync::{Arc, Mutex};
use weir_core::exchange::ChannelBudget;

/// The input channels of one node that reads from other tasks.
#[derive(Default)]
pub(crate) struct QueuedIn {
    budgets: Mutex<Vec<Arc<ChannelBudget>>>,
    /// A cluster coordinator: (queued, limit) as the worker last reported them.
    reported: Mutex<Option<(u64, u64)>>,
}

/// What a node's input channels hold now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InFlight {
    /// Records queued in the channels.
    pub queued: u64,
    /// The sum of the channels' limits, in records (with a fixed capacity: the capacity
    /// in full batches).
    pub limit: u64,
}

impl QueuedIn {
    /// The task bound its input gates: these are their channels' budgets.
    pub(crate) fn add(&self, budgets: Vec<Arc<ChannelBudget>>) {
        self.budgets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(budgets);
    }

    /// A worker reported its figures.
    pub(crate) fn report(&self, figures: Option<InFlight>) {
        *self.reported.lock().unwrap_or_else(|p| p.into_inner()) =
            figures.map(|f| (f.queued, f.limit));
    }

    /// The channels' figures (`None`: not bound yet, nor reported).
    pub(crate) fn figures(&self) -> Option<InFlight> {
        let budgets = self.budgets.lock().unwrap_or_else(|p| p.into_inner());
        if budgets.is_empty() {
            let reported = *self.reported.lock().unwrap_or_else(|p| p.into_inner());
            return reported.map(|(queued, limit)| InFlight { queued, limit });
        }
        let mut f = InFlight {
            queued: 0,
            limit: 0,
        };
        for b in budgets.iter() {
            f.queued += b.queued();
            f.limit = f.limit.saturating_add(b.policy().link_limit(b.limit()));
        }
        Some(f)
    }
}

impl From<InFlight> for (u64, u64) {
    fn from(f: InFlight) -> Self {
        (f.queued, f.limit)
    }
}

impl From<(u64, u64)> for InFlight {
    fn from((queued, limit): (u64, u64)) -> Self {
        InFlight { queued, limit }
    }
}
