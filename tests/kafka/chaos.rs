//! kafka_sum killed with SIGKILL at random moments and at every named fail point.

#[allow(unused_imports)]
use crate::support::*;
