//! Event-time windows: time windows and their assigners (tumbling, sliding, session),
//! and the window operator that keeps per-(key, window) accumulators, fires on the
//! watermark, honours allowed lateness and routes late records to a side output.

mod assigner;
mod operator;
mod stored;

pub use assigner::{TimeWindow, WindowAssigner};
pub(crate) use operator::{WindowFn, WindowOperator};
