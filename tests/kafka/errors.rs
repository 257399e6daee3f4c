//! Bad input, bad configuration and an unreachable broker: clear errors, nothing lost.

#[allow(unused_imports)]
use crate::support::*;
