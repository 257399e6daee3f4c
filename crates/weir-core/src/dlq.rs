//! Dead-letter queues: where a sink puts a record it gave up on, so the job can go on.
//!
//! A sink that writes to an external system (weir-postgres' apply-once sink, for one)
//! retries a failing record under its [`RetryPolicy`](crate::retry::RetryPolicy); when the
//! failure is not retryable, or the attempts or the retry budget run out, the record goes
//! to the dead-letter queue as a [`DeadLetter`]: the handler, the record's **idempotency
//! key** (the same one every attempt used), the last error, the number of attempts and the
//! record itself as JSON. Replaying the queue through the same apply-once sink later applies
//! each key at most once, because the key travels with the letter.
//!
//! Destinations are made per sink subtask by a [`DeadLetterFactory`]: [`to_dir`] writes JSON
//! lines to `DIR/dead-letters-<handler>-<subtask>.jsonl` (weir-kafka adds a Kafka topic).
//! Letters are flushed to disk at every checkpoint barrier and at the end of input, so a
//! checkpoint never covers a record whose letter could still be lost; after a crash, a
//! record replayed from the checkpoint may be dead-lettered again, which replay tolerates
//! (the key is applied at most once).
//!
//! ```
//! use weir_core::dlq::{self, DeadLetter};
//! let dir = tempfile::tempdir().unwrap();
//! let ctx = weir_core::ops::sink::SinkContext {
//!     subtask: 0, parallelism: 1, checkpointing: false,
//!     checkpoint_timing: None, name: "pay".into(), operator_id: "pay".into(),
//! };
//! let mut q = (dlq::to_dir(dir.path()))("payments", &ctx).unwrap();
//! q.send(&DeadLetter::new("payments", "order-7", "amount must be positive", 1,
//!     serde_json::json!({"order": 7, "amount": -5}))).unwrap();
//! q.flush().unwrap();
//! let letters = dlq::read_dir(dir.path()).unwrap();
//! assert_eq!(letters.len(), 1);
//! assert_eq!(letters[0].idempotency_key, "order-7");
//! assert_eq!(letters[0].attempts, 1);
//! ```

use crate::error::{Error, Result};
use crate::metrics::{self, Counter};
use crate::ops::sink::SinkContext;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A record a sink gave up on, with what is needed to understand and replay it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The handler (sink) that failed to apply the record.
    pub handler: String,
    /// The record's idempotency key, unchanged: replay must use it again.
    pub idempotency_key: String,
    /// The last error, as text.
    pub error: String,
    /// How many attempts were made.
    pub attempts: u32,
    /// The record, as JSON.
    pub payload: serde_json::Value,
    /// When the sink gave up, in milliseconds since the Unix epoch.
    pub failed_at_ms: i64,
}

impl DeadLetter {
    /// A letter stamped with the current time.
    pub fn new(
        handler: &str,
        idempotency_key: &str,
        error: impl std::fmt::Display,
        attempts: u32,
        payload: serde_json::Value,
    ) -> Self {
        DeadLetter {
            handler: handler.to_string(),
            idempotency_key: idempotency_key.to_string(),
            error: error.to_string(),
            attempts,
            payload,
            failed_at_ms: crate::state::now_ms(),
        }
    }

    /// The record back in its own type, for replay.
    ///
    /// ```
    /// let l = weir_core::dlq::DeadLetter::new("h", "k", "e", 1, serde_json::json!([1, 2]));
    /// assert_eq!(l.payload_as::<(i32, i32)>().unwrap(), (1, 2));
    /// ```
    pub fn payload_as<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_value(self.payload.clone()).map_err(|e| {
            Error::Malformed(format!(
                "dead letter with key '{}' of handler '{}': the payload does not match the \
                 record type: {e}",
                self.idempotency_key, self.handler
            ))
        })
    }
}

/// A dead-letter destination of one sink subtask.
pub trait DeadLetterSink: Send {
    /// Queues one letter (it may be buffered until [`flush`](Self::flush)).
    fn send(&mut self, letter: &DeadLetter) -> Result<()>;
    /// Makes every letter sent so far durable. Called at checkpoint barriers and at the
    /// end of input.
    fn flush(&mut self) -> Result<()>;
}

/// Makes a subtask's [`DeadLetterSink`] from the handler name and the sink context.
pub type DeadLetterFactory =
    Arc<dyn Fn(&str, &SinkContext) -> Result<Box<dyn DeadLetterSink>> + Send + Sync>;

/// Dead letters as JSON lines in `dir`, one file per handler and subtask.
pub fn to_dir(dir: impl Into<PathBuf>) -> DeadLetterFactory {
    let dir = dir.into();
    Arc::new(move |handler, ctx| {
        Ok(Box::new(FileDeadLetters::open(&dir, handler, ctx.subtask)?) as Box<dyn DeadLetterSink>)
    })
}

/// The file destination made by [`to_dir`].
pub struct FileDeadLetters {
    path: PathBuf,
    out: BufWriter<File>,
    sent: Counter,
}

impl FileDeadLetters {
    /// Opens (or creates) `dir/dead-letters-<handler>-<subtask>.jsonl` for appending. A
    /// torn last line left by a crash is cut off: the record it held is replayed from the
    /// checkpoint and dead-lettered again.
    pub fn open(dir: &Path, handler: &str, subtask: usize) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
        let safe: String = handler
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = dir.join(format!("dead-letters-{safe}-{subtask}.jsonl"));
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| Error::io(path.display(), e))?;
        cut_torn_tail(&mut file).map_err(|e| Error::io(path.display(), e))?;
        let sent = metrics::counter(
            "dead_letters_total",
            "Records a sink gave up on and wrote to its dead-letter queue.",
            &[("handler", handler)],
        );
        Ok(FileDeadLetters {
            path,
            out: BufWriter::new(file),
            sent,
        })
    }
}

fn cut_torn_tail(file: &mut File) -> std::io::Result<()> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    file.seek(SeekFrom::Start(len - 1))?;
    let mut last = [0u8; 1];
    file.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok(());
    }
    // Find the end of the last complete line.
    let mut keep = 0u64;
    let mut pos = 0u64;
    file.seek(SeekFrom::Start(0))?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        for (i, b) in buf[..n].iter().enumerate() {
            if *b == b'\n' {
                keep = pos + i as u64 + 1;
            }
        }
        pos += n as u64;
    }
    tracing::warn!(
        kept = keep,
        length = len,
        "cutting a torn last line off a dead-letter file"
    );
    file.set_len(keep)
}

impl DeadLetterSink for FileDeadLetters {
    fn send(&mut self, letter: &DeadLetter) -> Result<()> {
        let mut line = serde_json::to_vec(letter)
            .map_err(|e| Error::Codec(format!("dead letter to JSON: {e}")))?;
        line.push(b'\n');
        self.out
            .write_all(&line)
            .map_err(|e| Error::io(self.path.display(), e))?;
        self.sent.inc();
        Ok(())
    }
    fn flush(&mut self) -> Result<()> {
        self.out
            .flush()
            .map_err(|e| Error::io(self.path.display(), e))?;
        self.out
            .get_ref()
            .sync_data()
            .map_err(|e| Error::io(self.path.display(), e))
    }
}

/// Reads every dead letter in `dir` (all `dead-letters-*.jsonl` files, by file name, each
/// in order). A line that is not a dead letter is an error naming the file and line.
pub fn read_dir(dir: impl AsRef<Path>) -> Result<Vec<DeadLetter>> {
    let dir = dir.as_ref();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir.display(), e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("dead-letters-") && n.ends_with(".jsonl"))
        })
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        out.extend(read_file(&f)?);
    }
    Ok(out)
}

/// Reads the dead letters of one file written by [`to_dir`].
pub fn read_file(path: impl AsRef<Path>) -> Result<Vec<DeadLetter>> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path.display(), e))?;
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    complete
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| {
                Error::Malformed(format!(
                    "{} line {}: not a dead letter: {e}",
                    path.display(),
                    i + 1
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(subtask: usize) -> SinkContext {
        SinkContext {
            subtask,
            parallelism: 2,
            checkpointing: true,
            checkpoint_timing: None,
            name: "s".into(),
            operator_id: "s".into(),
        }
    }

    #[test]
    fn letters_round_trip_per_subtask_files() {
        let dir = tempfile::tempdir().unwrap();
        let make = to_dir(dir.path());
        let mut a = make("pay ments", &ctx(0)).unwrap();
        let mut b = make("pay ments", &ctx(1)).unwrap();
        let l1 = DeadLetter::new("pay ments", "k1", "boom", 5, serde_json::json!({"x": 1}));
        let l2 = DeadLetter::new("pay ments", "k2", "bad", 1, serde_json::json!("s"));
        a.send(&l1).unwrap();
        b.send(&l2).unwrap();
        a.flush().unwrap();
        b.flush().unwrap();
        assert!(dir.path().join("dead-letters-pay_ments-0.jsonl").exists());
        assert_eq!(read_dir(dir.path()).unwrap(), vec![l1.clone(), l2]);
        // Reopening appends.
        drop(a);
        let mut a = make("pay ments", &ctx(0)).unwrap();
        a.send(&l1).unwrap();
        a.flush().unwrap();
        assert_eq!(
            read_file(dir.path().join("dead-letters-pay_ments-0.jsonl")).unwrap(),
            vec![l1.clone(), l1]
        );
    }

    #[test]
    fn a_torn_last_line_is_cut_on_open_and_ignored_on_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dead-letters-h-0.jsonl");
        let l = DeadLetter::new("h", "k", "e", 2, serde_json::json!(1));
        let mut text = serde_json::to_string(&l).unwrap();
        text.push('\n');
        text.push_str("{\"handler\":\"h\",\"idem");
        std::fs::write(&path, &text).unwrap();
        assert_eq!(read_file(&path).unwrap(), vec![l.clone()]);
        let mut q = FileDeadLetters::open(dir.path(), "h", 0).unwrap();
        q.send(&l).unwrap();
        q.flush().unwrap();
        assert_eq!(read_file(&path).unwrap(), vec![l.clone(), l]);
    }

    #[test]
    fn a_line_that_is_not_a_letter_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dead-letters-h-0.jsonl");
        std::fs::write(&path, "{\"handler\":1}\n").unwrap();
        let e = read_dir(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("dead-letters-h-0.jsonl line 1: not a dead letter"),
            "{e}"
        );
    }

    #[test]
    fn payload_of_the_wrong_type_is_a_clear_error() {
        let l = DeadLetter::new("h", "k9", "e", 1, serde_json::json!("text"));
        let e = l.payload_as::<u32>().unwrap_err().to_string();
        assert!(
            e.contains("key 'k9'") && e.contains("does not match"),
            "{e}"
        );
    }
}
