//! Bytes through channels: the encoded size (weir's codec) of the records a subtask puts
//! on channels to other tasks, or takes off them. Records cross channels in one process
//! as Rust values, without being encoded; their size is what a cluster link would carry
//! for them (less framing), measured only when the REST API is on.

use crate::data::Data;
use crate::error::Result;
use crate::output::{Control, Output};
use crate::time::Timestamp;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The encoded size of one record with its timestamp, as a channel batch holds it.
///
/// ```
/// use weir_core::exchange::record_size;
/// use weir_core::time::NO_TIMESTAMP;
/// // A small integer takes one byte, a timestamp of 1000 ms three (integers are
/// // variable-length), no timestamp nine.
/// assert_eq!(record_size(&7u64, 1000), 4);
/// assert_eq!(record_size(&7u64, NO_TIMESTAMP), 10);
/// let v = ("k1".to_string(), 5i64);
/// assert_eq!(record_size(&v, 0), weir_core::codec::encode(&(&v, 0i64)).unwrap().len());
/// ```
pub fn record_size<T: Data>(value: &T, ts: Timestamp) -> usize {
    // A value that cannot be encoded fails the channel in a cluster; here it weighs 0.
    crate::codec::encoded_size(&(value, ts)).unwrap_or(0)
}

/// An output in front of a channel writer that adds the encoded size of each record (see
/// [`record_size`]) to a counter, `copies` times (a broadcast writes a record to every
/// channel).
pub struct Metered<T> {
    inner: Box<dyn Output<T>>,
    bytes: Arc<AtomicU64>,
    copies: u64,
}

impl<T> Metered<T> {
    /// Measures what goes through `inner` into `bytes`.
    pub fn new(inner: Box<dyn Output<T>>, bytes: Arc<AtomicU64>, copies: u64) -> Self {
        Metered {
            inner,
            bytes,
            copies,
        }
    }
}

impl<T: Data> Output<T> for Metered<T> {
    #[inline]
    fn record(&mut self, value: T, ts: Timestamp) -> Result<()> {
        let size = record_size(&value, ts) as u64 * self.copies;
        self.bytes.fetch_add(size, Ordering::Relaxed);
        self.inner.record(value, ts)
    }

    fn prefetch(&mut self, batch: &[(T, Timestamp)]) -> Result<()> {
        self.inner.prefetch(batch)
    }

    fn control(&mut self, event: Control) -> Result<()> {
        self.inner.control(event)
    }
}
