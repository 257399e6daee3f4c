//! The Kafka source: assignment, offsets across restarts and rescaling, bounded mode.

#[allow(unused_imports)]
use crate::support::*;
