//! What an object of the [`ExactlyOnceObjectSink`](super::ExactlyOnceObjectSink) holds and when it closes: the format
//! traits ([`ObjectFormat`], [`ObjectEncoder`]), text lines ([`TextLines`]) and the rolling
//! policy ([`Rolling`]).

use crate::error::Result;
use std::sync::Arc;
use std::time::Duration;

/// Encodes records into the bytes of one object of the [`ExactlyOnceObjectSink`](super::ExactlyOnceObjectSink).
///
/// The sink pushes records, takes the bytes that are final so far to upload them as parts
/// (whenever [`ready`](Self::ready) reaches the part size), and finishes the encoder when
/// the object closes; what [`finish`](Self::finish) returns is the object's last part.
/// The bytes taken and then finished, in order, are the whole object.
pub trait ObjectEncoder<T> {
    /// Adds a record. An error fails the sink (and the job's attempt).
    fn push(&mut self, record: &T) -> Result<()>;
    /// Records pushed so far.
    fn rows(&self) -> u64;
    /// About how many bytes the object holds so far, taken or not: for rolling by size.
    fn bytes(&self) -> u64;
    /// How many final bytes [`take`](Self::take) would return now.
    fn ready(&self) -> usize;
    /// Takes the bytes that are final so far (they will not change whatever comes next).
    fn take(&mut self) -> Vec<u8>;
    /// Finishes the object (a footer, say) and returns the bytes not taken yet.
    fn finish(self) -> Result<Vec<u8>>;
}

/// A format of the [`ExactlyOnceObjectSink`](super::ExactlyOnceObjectSink)'s objects: starts one encoder per object.
pub trait ObjectFormat<T> {
    /// The encoder of one object.
    type Encoder: ObjectEncoder<T>;
    /// Starts an object. An error (a type the format cannot write) fails the sink.
    fn start(&self) -> Result<Self::Encoder>;
    /// Checks, when the sink opens, that objects can be started (a type the format cannot
    /// write fails the job before any record); by default nothing to check.
    fn check(&self) -> Result<()> {
        Ok(())
    }
    /// The end of committed names, such as `.parquet` (none by default).
    fn suffix(&self) -> &str {
        ""
    }
}

/// The text format: one line per record, formatted by a function.
pub struct TextLines<T> {
    format: Arc<dyn Fn(&T) -> String + Send + Sync>,
}

impl<T> TextLines<T> {
    /// Lines formatted by `format` (a newline is added to each).
    pub fn new(format: Arc<dyn Fn(&T) -> String + Send + Sync>) -> Self {
        TextLines { format }
    }
}

impl<T> Clone for TextLines<T> {
    fn clone(&self) -> Self {
        TextLines {
            format: self.format.clone(),
        }
    }
}

/// The encoder of [`TextLines`]: every line is final once formatted.
pub struct TextEncoder<T> {
    format: Arc<dyn Fn(&T) -> String + Send + Sync>,
    buf: Vec<u8>,
    taken: u64,
    rows: u64,
}

impl<T> ObjectEncoder<T> for TextEncoder<T> {
    fn push(&mut self, record: &T) -> Result<()> {
        self.buf.extend_from_slice((self.format)(record).as_bytes());
        self.buf.push(b'\n');
        self.rows += 1;
        Ok(())
    }
    fn rows(&self) -> u64 {
        self.rows
    }
    fn bytes(&self) -> u64 {
        self.taken + self.buf.len() as u64
    }
    fn ready(&self) -> usize {
        self.buf.len()
    }
    fn take(&mut self) -> Vec<u8> {
        self.taken += self.buf.len() as u64;
        std::mem::take(&mut self.buf)
    }
    fn finish(self) -> Result<Vec<u8>> {
        Ok(self.buf)
    }
}

impl<T> ObjectFormat<T> for TextLines<T> {
    type Encoder = TextEncoder<T>;
    fn start(&self) -> Result<TextEncoder<T>> {
        Ok(TextEncoder {
            format: self.format.clone(),
            buf: Vec::new(),
            taken: 0,
            rows: 0,
        })
    }
}

/// When an object closes before the next checkpoint barrier: once it holds
/// [`max_rows`](Self::max_rows) records, about [`max_bytes`](Self::max_bytes) bytes, or a
/// record arrives [`max_age`](Self::max_age) after its first one, whichever comes first.
/// The limits are checked after each record: the record that reaches one is the last of
/// its object. By default an object closes only at barriers (or at end of input).
///
/// ```
/// use std::time::Duration;
/// use weir_core::ops::object_sink::Rolling;
/// let r = Rolling::default().max_rows(100_000).max_age(Duration::from_secs(60));
/// assert_eq!((r.max_rows, r.max_bytes), (Some(100_000), None));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rolling {
    /// Close an object once it holds this many records.
    pub max_rows: Option<u64>,
    /// Close an object once it holds about this many bytes ([`ObjectEncoder::bytes`]).
    pub max_bytes: Option<u64>,
    /// Close an object once a record arrives this long after its first record.
    pub max_age: Option<Duration>,
}

impl Rolling {
    /// Closes an object once it holds `rows` records (at least 1).
    pub fn max_rows(mut self, rows: u64) -> Self {
        self.max_rows = Some(rows.max(1));
        self
    }
    /// Closes an object once it holds about `bytes` bytes.
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }
    /// Closes an object once a record arrives `age` after its first one.
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = Some(age);
        self
    }
}
