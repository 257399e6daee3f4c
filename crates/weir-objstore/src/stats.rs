//! Bytes moved to and from object storage by this process, and the time it took: the
//! figures behind upload and download throughput.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

static WRITTEN: AtomicU64 = AtomicU64::new(0);
static WRITE_NANOS: AtomicU64 = AtomicU64::new(0);
static READ: AtomicU64 = AtomicU64::new(0);
static READ_NANOS: AtomicU64 = AtomicU64::new(0);

/// Totals since the process started (see [`stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Bytes written by PUTs and uploaded parts.
    pub bytes_written: u64,
    /// Time spent in those writes (summed over concurrent ones).
    pub write_time: Duration,
    /// Bytes read.
    pub bytes_read: u64,
    /// Time spent in those reads.
    pub read_time: Duration,
}

impl Stats {
    /// Written bytes per second of write time (0 before any write).
    pub fn write_throughput(&self) -> f64 {
        per_second(self.bytes_written, self.write_time)
    }

    /// Read bytes per second of read time (0 before any read).
    pub fn read_throughput(&self) -> f64 {
        per_second(self.bytes_read, self.read_time)
    }
}

fn per_second(bytes: u64, time: Duration) -> f64 {
    if time.is_zero() {
        0.0
    } else {
        bytes as f64 / time.as_secs_f64()
    }
}

/// What this process has written to and read from object storage so far.
///
/// ```
/// let before = weir_objstore::stats();
/// let store = weir_objstore::Store::open("memory://stats-doc")?;
/// store.put("x", vec![0; 100])?;
/// assert!(weir_objstore::stats().bytes_written >= before.bytes_written + 100);
/// # Ok::<(), weir_objstore::Error>(())
/// ```
pub fn stats() -> Stats {
    Stats {
        bytes_written: WRITTEN.load(Ordering::Relaxed),
        write_time: Duration::from_nanos(WRITE_NANOS.load(Ordering::Relaxed)),
        bytes_read: READ.load(Ordering::Relaxed),
        read_time: Duration::from_nanos(READ_NANOS.load(Ordering::Relaxed)),
    }
}

pub(crate) fn wrote(bytes: u64, took: Duration) {
    WRITTEN.fetch_add(bytes, Ordering::Relaxed);
    WRITE_NANOS.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
}

pub(crate) fn read(bytes: u64, took: Duration) {
    READ.fetch_add(bytes, Ordering::Relaxed);
    READ_NANOS.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
}
