//! The exactly-once sink on object storage (`s3://`, `gs://`, `az://`, `memory://`):
//! two-phase commit by multipart upload, tied to checkpoints, for any format of objects
//! ([`ObjectFormat`]): text lines ([`TextLines`]) here, Parquet in weir-parquet.
//!
//! An object cannot be renamed, and the name of a multipart upload's object is fixed when
//! the upload starts; so where the local sink ([`super::file_sink`]) names a committed file
//! after its checkpoint, this sink names each object after a per-writer counter that the
//! checkpoint records, as Flink's S3 sink does:
//!
//! - `part-<writer>-<counter as 20 digits><suffix>`: a committed object, complete (the
//!   suffix is the format's: none for text, `.parquet` for Parquet). Nothing else ever
//!   appears under such a name: readers list `part-` and read what they find.
//! - `_uploads/<writer>-<counter as 20 digits>-<token>`: a marker holding the upload id of
//!   an upload in progress, written right after the upload starts and deleted when it is
//!   completed or aborted. The token is new for every run of a subtask (as in the local
//!   sink), so two runs of one writer never share a marker.
//!
//! Protocol, per subtask (writer `w`):
//!
//! 1. Records go into the format's encoder of the current object, which starts with the
//!    first record after the previous object closed. Whenever the encoder holds at least
//!    the part size of final bytes (8 MiB by default, above S3's 5 MiB minimum for every
//!    part but the last), they are uploaded as the next part of the object's upload, which
//!    starts (with its marker) on the first part: object `part-w-<counter>`, and the
//!    counter goes up.
//! 2. The object closes when it reaches a limit of its [`Rolling`] (rows, bytes, age), or at
//!    a checkpoint barrier: the encoder is finished and what it still holds goes up as the
//!    last part. An object closed by a limit waits, uploaded and invisible, for the next
//!    barrier; a checkpoint may so cover several objects of a writer.
//! 3. At the barrier of checkpoint `n` (pre-commit), the current object is closed, and the
//!    uploads of every object closed since the previous barrier (object name, upload id,
//!    part ids, size) go into the snapshot with the writer's next counter. The objects are
//!    still invisible.
//! 4. When checkpoint `n` completes (commit), every upload recorded up to `n` is completed,
//!    in counter order: each object appears whole, and its marker is deleted.
//!
//! On restore from checkpoint `c`, the subtask stands for every writer `w` with
//! `w % parallelism == subtask` (as the local sink, so the parallelism may change):
//!
//! - the uploads `c` recorded for those writers are completed (a crash may have hit between
//!   the checkpoint completing and the completion). This is idempotent: an object that
//!   already exists with the recorded size was completed before the crash.
//! - every marker of those writers left is aborted and deleted: those uploads belong to no
//!   kept checkpoint (started after `c`, by a run that failed or was cut off), and their
//!   records are replayed from `c`.
//! - committed objects of those writers newer than `c` (a counter at or above the writer's
//!   next counter in `c`) would be duplicated by the replay: the restore refuses with an
//!   error naming them, before it aborts anything.
//! - the counter of every writer goes on from the largest next counter of all restored
//!   snapshots, so a writer that did not exist in `c` (the parallelism grew) never reuses
//!   a name an earlier writer of that index used.
//!
//! Without checkpoints, the objects are completed at end of input.
//!
//! Memory per subtask: what the encoder keeps to finish its object (for text, nothing but
//! the lines not yet uploaded; for Parquet, the row group being encoded, see weir-parquet)
//! plus less than one part of final bytes not yet uploaded (a Parquet row group is handed
//! over whole, so a part may be as large as one). It does not grow with the object: an
//! object of any size streams out part by part, and only its last part waits for the
//! object to close.
//!
//! What a crash can leave: uploads that were started and never completed, each with its
//! marker (cleaned up by the next restore of its writer). The one exception is a crash in
//! the moment between the server starting an upload and the marker being written: that
//! upload is invisible and costs storage until the bucket's lifecycle rule for incomplete
//! multipart uploads removes it (S3 cannot list them through the API weir uses); set one,
//! e.g. `AbortIncompleteMultipartUpload` after a day.
//!
//! A committed object is never replaced: before completing an upload the sink looks the
//! object up and refuses when another one is there with a different size. Two runs that
//! might write the same names at once (a run cut off from its cluster while its subtask
//! runs again elsewhere) are kept apart by the run's lease, checked before every checkpoint
//! completion is announced; the restore's aborting of the other run's markers makes any
//! upload it had in flight fail.
//!
//! Requests per object: start an upload, write its marker, one part per 8 MiB (at least
//! one), look the object up, complete the upload, delete the marker — six for up to 8 MiB.
//! A checkpoint without new records costs none. A restore or a fresh start lists the output
//! prefix once per subtask.

use super::file_sink::{committed_name, new_token};
use super::sink::{SinkContext, SinkFunction};
use crate::codec;
use crate::error::{Error, Result};
use crate::ids::CheckpointId;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use weir_objstore::Store;

/// The default part size: a multiple of S3's 5 MiB minimum part size.
pub const DEFAULT_PART_SIZE: usize = 8 << 20;

/// Where the markers of uploads in progress live.
const MARKERS: &str = "_uploads/";

/// An upload of one object: in progress, or pre-committed at a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Upload {
    /// The checkpoint whose barrier closed it (0 while in progress).
    checkpoint: u64,
    /// The counter in the object's name.
    counter: u64,
    /// The upload id.
    id: String,
    /// The ids of its parts, in order.
    parts: Vec<String>,
    /// Its size in bytes.
    size: u64,
    /// The name of its marker.
    marker: String,
}

/// What a subtask's snapshot records.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct SinkState {
    writer: u32,
    /// The counter of the writer's next object.
    next: u64,
    /// Uploads pre-committed and not yet completed.
    pending: Vec<Upload>,
    /// The token of this run's markers.
    token: String,
}

fn marker_name(writer: usize, counter: u64, token: &str) -> String {
    format!("{MARKERS}{writer}-{counter:020}-{token}")
}

/// The writer and counter of a marker, from its name.
fn parse_marker(name: &str) -> Option<(usize, u64)> {
    let mut fields = name.strip_prefix(MARKERS)?.split('-');
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

/// The writer and counter of a committed object with names ending in `suffix`.
fn parse_committed(name: &str, suffix: &str) -> Option<(usize, u64)> {
    let rest = name.strip_prefix("part-")?.strip_suffix(suffix)?;
    let (w, c) = rest.split_once('-')?;
    Some((w.parse().ok()?, c.parse().ok()?))
}

/// A failed request: the message names the operation and the object's URL, never
/// credentials. Not deterministic: a restart may get past a passing outage.
fn failed(e: weir_objstore::Error) -> Error {
    Error::User(e.to_string())
}

/// The object being written: its encoder, and its upload once the first part went up.
struct Current<E> {
    encoder: E,
    upload: Option<Upload>,
    opened: Instant,
}

/// The exactly-once sink on object storage (see the module docs), writing objects of the
/// format `F`: text lines by default.
///
/// ```
/// use weir_core::ops::object_sink::ExactlyOnceObjectSink;
/// use weir_core::ops::sink::SinkFunction;
/// use weir_core::ids::CheckpointId;
/// # use weir_core::ops::sink::SinkContext;
/// # let ctx = SinkContext { subtask: 0, parallelism: 1, checkpointing: true,
/// #     checkpoint_timing: None, name: "sink".into(), operator_id: "sink".into() };
/// let mut sink = ExactlyOnceObjectSink::new(
///     "memory://doc-sink/out".into(),
///     std::sync::Arc::new(|n: &i64| n.to_string()),
/// );
/// sink.open(&ctx)?;
/// sink.invoke(1, 0)?;
/// sink.invoke(2, 0)?;
/// sink.snapshot(CheckpointId(1))?; // pre-commit: uploaded, not visible
/// let out = weir_objstore::Store::open("memory://doc-sink/out").unwrap();
/// assert!(out.list("part-").unwrap().is_empty());
/// sink.notify_complete(CheckpointId(1))?; // commit: the object appears whole
/// assert_eq!(out.get("part-0-00000000000000000000").unwrap().unwrap(), b"1\n2\n");
/// # Ok::<(), weir_core::Error>(())
/// ```
pub struct ExactlyOnceObjectSink<T, F: ObjectFormat<T> = TextLines<T>> {
    url: String,
    format: F,
    part_size: usize,
    rolling: Rolling,
    store: Option<Store>,
    writer: usize,
    checkpointing: bool,
    token: String,
    next: u64,
    current: Option<Current<F::Encoder>>,
    /// Objects closed by a rolling limit since the last barrier, uploaded, not recorded.
    closed: Vec<Upload>,
    pending: Vec<Upload>,
    restored: bool,
    _t: std::marker::PhantomData<fn(&T)>,
}

impl<T> ExactlyOnceObjectSink<T, TextLines<T>> {
    /// A sink writing below `url` (`s3://bucket/prefix`), one line per record formatted by
    /// `format`, in parts of [`DEFAULT_PART_SIZE`].
    pub fn new(url: String, format: Arc<dyn Fn(&T) -> String + Send + Sync>) -> Self {
        Self::with_format(url, TextLines::new(format))
    }
}

impl<T, F: ObjectFormat<T>> ExactlyOnceObjectSink<T, F> {
    /// A sink writing objects of `format` below `url`, in parts of [`DEFAULT_PART_SIZE`],
    /// closing objects only at checkpoint barriers.
    ///
    /// ```
    /// use weir_core::ops::object_sink::{ExactlyOnceObjectSink, Rolling, TextLines};
    /// use weir_core::ops::sink::{SinkContext, SinkFunction};
    /// use weir_core::ids::CheckpointId;
    /// # let ctx = SinkContext { subtask: 0, parallelism: 1, checkpointing: true,
    /// #     checkpoint_timing: None, name: "sink".into(), operator_id: "sink".into() };
    /// let lines = TextLines::new(std::sync::Arc::new(|n: &u32| n.to_string()));
    /// let mut sink = ExactlyOnceObjectSink::with_format("memory://doc-rolling/out".into(), lines)
    ///     .with_rolling(Rolling::default().max_rows(2));
    /// sink.open(&ctx)?;
    /// for n in 0..5 {
    ///     sink.invoke(n, 0)?;
    /// }
    /// sink.snapshot(CheckpointId(1))?;
    /// sink.notify_complete(CheckpointId(1))?;
    /// let out = weir_objstore::Store::open("memory://doc-rolling/out").unwrap();
    /// let names: Vec<String> = out.list("part-").unwrap().into_iter().map(|o| o.name).collect();
    /// assert_eq!(names, ["part-0-00000000000000000000", "part-0-00000000000000000001",
    ///     "part-0-00000000000000000002"]);
    /// assert_eq!(out.get(&names[2]).unwrap().unwrap(), b"4\n");
    /// # Ok::<(), weir_core::Error>(())
    /// ```
    pub fn with_format(url: String, format: F) -> Self {
        ExactlyOnceObjectSink {
            url,
            format,
            part_size: DEFAULT_PART_SIZE,
            rolling: Rolling::default(),
            store: None,
            writer: 0,
            checkpointing: false,
            token: new_token(),
            next: 0,
            current: None,
            closed: Vec::new(),
            pending: Vec::new(),
            restored: false,
            _t: std::marker::PhantomData,
        }
    }

    /// Uploads a part whenever `bytes` of final bytes are buffered (on S3 at least 5 MiB).
    ///
    /// ```
    /// # use weir_core::ops::object_sink::ExactlyOnceObjectSink;
    /// let sink = ExactlyOnceObjectSink::new("memory://doc/out".into(),
    ///     std::sync::Arc::new(|s: &String| s.clone())).with_part_size(16 << 20);
    /// # let _ = sink;
    /// ```
    pub fn with_part_size(mut self, bytes: usize) -> Self {
        self.part_size = bytes.max(1);
        self
    }

    /// Closes objects between barriers when they reach a limit of `rolling`.
    pub fn with_rolling(mut self, rolling: Rolling) -> Self {
        self.rolling = rolling;
        self
    }

    fn store(&mut self) -> Result<Store> {
        if self.store.is_none() {
            let s = Store::open(&self.url).map_err(|e| Error::Config(e.to_string()))?;
            self.store = Some(s);
        }
        Ok(self.store.clone().expect("just opened"))
    }

    /// The committed name of `writer`'s object `counter`.
    fn name(&self, writer: usize, counter: u64) -> String {
        format!(
            "{}{}",
            committed_name(writer, counter),
            self.format.suffix()
        )
    }

    /// Uploads `bytes` as the next part of the upload in `slot`, starting one (object
    /// `part-<writer>-<next counter>`, with its marker) when there is none yet.
    fn put_part(&mut self, slot: &mut Option<Upload>, bytes: Vec<u8>) -> Result<()> {
        let store = self.store()?;
        if slot.is_none() {
            let counter = self.next;
            let id = store
                .create_upload(&self.name(self.writer, counter))
                .map_err(failed)?;
            let marker = marker_name(self.writer, counter, &self.token);
            store
                .put(&marker, id.clone().into_bytes())
                .map_err(failed)?;
            self.next += 1;
            *slot = Some(Upload {
                checkpoint: 0,
                counter,
                id,
                parts: Vec::new(),
                size: 0,
                marker,
            });
        }
        let up = slot.as_mut().expect("just started");
        let name = self.name(self.writer, up.counter);
        let n = bytes.len() as u64;
        let part = store
            .put_part(&name, &up.id, up.parts.len(), bytes)
            .map_err(failed)?;
        up.parts.push(part);
        up.size += n;
        Ok(())
    }

    /// Uploads the current object's final bytes as its next part once there are at least
    /// a part's worth.
    fn upload_ready(&mut self) -> Result<()> {
        let Some(cur) = self.current.as_mut() else {
            return Ok(());
        };
        if cur.encoder.ready() < self.part_size {
            return Ok(());
        }
        let bytes = cur.encoder.take();
        let mut upload = cur.upload.take();
        let r = self.put_part(&mut upload, bytes);
        self.current.as_mut().expect("open").upload = upload;
        r
    }

    /// Closes the current object, if any: the encoder is finished, what it still holds goes
    /// up as the last part, and the upload joins the closed ones.
    fn close(&mut self) -> Result<()> {
        let Some(cur) = self.current.take() else {
            return Ok(());
        };
        let mut upload = cur.upload;
        if cur.encoder.rows() == 0 && upload.is_none() {
            return Ok(());
        }
        let rest = cur.encoder.finish()?;
        // Parts cannot be empty; the last may be small.
        if !rest.is_empty() || upload.is_none() {
            self.put_part(&mut upload, rest)?;
        }
        self.closed.push(upload.expect("uploaded"));
        Ok(())
    }

    /// True when the current object reached a rolling limit.
    fn full(&self) -> bool {
        let Some(cur) = &self.current else {
            return false;
        };
        let r = &self.rolling;
        r.max_rows.is_some_and(|m| cur.encoder.rows() >= m)
            || r.max_bytes.is_some_and(|m| cur.encoder.bytes() >= m)
            || r.max_age.is_some_and(|m| cur.opened.elapsed() >= m)
    }

    /// Completes `up` (object `name`), never replacing another object; idempotent.
    fn commit(store: &Store, name: &str, up: &Upload) -> Result<()> {
        let refuse = |size: u64| {
            Error::Config(format!(
                "refusing to complete the upload of {}: another object of {size} bytes is there \
                 (this upload has {} bytes), written by another run (two runs writing below one \
                 prefix, or a run restored from an older checkpoint or savepoint than the one that \
                 committed it). Nothing was overwritten. Give each run its own output prefix, or \
                 resume the run that wrote it",
                store.url_of(name),
                up.size
            ))
        };
        match store.head(name).map_err(failed)? {
            Some(o) if o.size == up.size => {} // completed before a crash
            Some(o) => return Err(refuse(o.size)),
            None => {
                if let Err(e) = store.complete_upload(name, &up.id, up.parts.clone()) {
                    match store.head(name).map_err(failed)? {
                        Some(o) if o.size == up.size => {}
                        Some(o) => return Err(refuse(o.size)),
                        None => {
                            return Err(Error::User(format!(
                                "{e}; the upload was pre-committed at checkpoint {}. If it is gone \
                                 (aborted, or removed by a lifecycle rule), that checkpoint's output \
                                 is lost: restore from an earlier checkpoint",
                                up.checkpoint
                            )));
                        }
                    }
                }
            }
        }
        store.delete(&up.marker).map_err(failed)
    }

    /// Aborts the uploads left by the writers this subtask stands for, after checking that
    /// no committed object of theirs is newer than the restored checkpoint: `next` gives
    /// each restored writer's next counter and the one of writers not restored; `None` on a
    /// fresh start, when any committed object is too new.
    fn clean(
        &mut self,
        ctx: &SinkContext,
        restored: Option<(u64, &BTreeMap<usize, u64>, u64)>,
    ) -> Result<()> {
        let store = self.store()?;
        let objects = store.list("").map_err(|e| {
            if e.is_not_found() || e.to_string().contains("NoSuchBucket") {
                Error::Config(format!(
                    "{e} (does the bucket exist, and may these credentials list it?)"
                ))
            } else {
                failed(e)
            }
        })?;
        let mine = |w: usize| w % ctx.parallelism == ctx.subtask;
        let mut newer = Vec::new();
        let mut markers = Vec::new();
        for o in objects {
            if let Some((w, c)) = parse_marker(&o.name) {
                if mine(w) {
                    markers.push((o.name, self.name(w, c)));
                }
            } else if let Some((w, c)) = parse_committed(&o.name, self.format.suffix())
                && mine(w)
                && restored.is_none_or(|(_, next, rest)| c >= *next.get(&w).unwrap_or(&rest))
            {
                newer.push(o.name);
            }
        }
        if !newer.is_empty() {
            return Err(Error::Config(match restored {
                None => format!(
                    "{} already holds committed output of an earlier run ({}); a job starting from \
                     scratch would write it again. Resume that run from its checkpoint directory, \
                     or write below an empty prefix",
                    self.url,
                    newer.join(", ")
                ),
                Some((c, _, _)) => format!(
                    "{} holds committed output newer than the checkpoint being restored ({c}): {}; \
                     replaying from the older checkpoint would duplicate it. Restore from the newer \
                     checkpoint, or move those objects away to accept the replay",
                    self.url,
                    newer.join(", ")
                ),
            }));
        }
        for (marker, object) in markers {
            if let Some(id) = store.get(&marker).map_err(failed)? {
                let id = String::from_utf8_lossy(&id).into_owned();
                store.abort_upload(&object, id.trim()).map_err(failed)?;
            }
            store.delete(&marker).map_err(failed)?;
        }
        Ok(())
    }
}

impl<T: 'static, F: ObjectFormat<T> + 'static> SinkFunction<T> for ExactlyOnceObjectSink<T, F> {
    fn restore(
        &mut self,
        checkpoint: CheckpointId,
        states: &[Vec<u8>],
        ctx: &SinkContext,
    ) -> Result<()> {
        let store = self.store()?;
        let states: Vec<SinkState> = states
            .iter()
            .map(|s| codec::decode(s))
            .collect::<Result<_>>()?;
        let mut next = BTreeMap::new();
        for st in &states {
            let w = st.writer as usize;
            if w % ctx.parallelism == ctx.subtask {
                for up in &st.pending {
                    Self::commit(&store, &self.name(w, up.counter), up)?;
                }
                next.insert(w, st.next);
            }
        }
        let all = states.iter().map(|s| s.next).max().unwrap_or(0);
        self.clean(ctx, Some((checkpoint.0, &next, all)))?;
        self.next = all;
        self.restored = true;
        Ok(())
    }

    fn open(&mut self, ctx: &SinkContext) -> Result<()> {
        self.format.check()?;
        self.writer = ctx.subtask;
        self.token = new_token();
        self.checkpointing = ctx.checkpointing;
        if !self.restored {
            self.clean(ctx, None)?;
        }
        Ok(())
    }

    fn invoke(&mut self, value: T, _ts: Timestamp) -> Result<()> {
        if self.current.is_none() {
            self.current = Some(Current {
                encoder: self.format.start()?,
                upload: None,
                opened: Instant::now(),
            });
        }
        let cur = self.current.as_mut().expect("just opened");
        cur.encoder.push(&value)?;
        self.upload_ready()?;
        if self.full() {
            self.close()?;
        }
        Ok(())
    }

    fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<Option<(Vec<u8>, String)>> {
        self.close()?;
        if !self.closed.is_empty() {
            for mut up in std::mem::take(&mut self.closed) {
                up.checkpoint = checkpoint.0;
                self.pending.push(up);
            }
            crate::failpoint::hit("sink.after_precommit");
        }
        let st = SinkState {
            writer: self.writer as u32,
            next: self.next,
            pending: self.pending.clone(),
            token: self.token.clone(),
        };
        let desc = format!(
            "writer {}: next object {}, pending objects {:?}",
            self.writer,
            self.next,
            self.pending.iter().map(|u| u.counter).collect::<Vec<_>>()
        );
        Ok(Some((codec::encode(&st)?, desc)))
    }

    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<()> {
        let due = self
            .pending
            .iter()
            .take_while(|u| u.checkpoint <= checkpoint.0)
            .count();
        if due == 0 {
            return Ok(());
        }
        crate::failpoint::hit("sink.before_commit");
        let store = self.store()?;
        while self
            .pending
            .first()
            .is_some_and(|u| u.checkpoint <= checkpoint.0)
        {
            let up = &self.pending[0];
            Self::commit(&store, &self.name(self.writer, up.counter), up)?;
            self.pending.remove(0);
        }
        crate::failpoint::hit("sink.after_commit");
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        if self.checkpointing {
            // Everything was committed by the final checkpoint; nothing may be left.
            if self.current.is_some() || !self.closed.is_empty() {
                return Err(Error::Config(
                    "records arrived after the final checkpoint barrier; they would not be committed".into(),
                ));
            }
            return Ok(());
        }
        self.close()?;
        let store = self.store()?;
        for up in std::mem::take(&mut self.closed) {
            Self::commit(&store, &self.name(self.writer, up.counter), &up)?;
        }
        Ok(())
    }
}

mod format;
pub use format::{ObjectEncoder, ObjectFormat, Rolling, TextEncoder, TextLines};

#[cfg(test)]
#[path = "object_sink_tests.rs"]
mod tests;
