//! The exactly-once text sink on object storage (`s3://`, `gs://`, `az://`, `memory://`):
//! two-phase commit by multipart upload, tied to checkpoints.
//!
//! An object cannot be renamed, and the name of a multipart upload's object is fixed when
//! the upload starts; so where the local sink ([`super::file_sink`]) names a committed file
//! after its checkpoint, this sink names each object after a per-writer counter that the
//! checkpoint records, as Flink's S3 sink does:
//!
//! - `part-<writer>-<counter as 20 digits>`: a committed object, complete. Nothing else
//!   ever appears under such a name: readers list `part-` and read what they find.
//! - `_uploads/<writer>-<counter as 20 digits>-<token>`: a marker holding the upload id of
//!   an upload in progress, written right after the upload starts and deleted when it is
//!   completed or aborted. The token is new for every run of a subtask (as in the local
//!   sink), so two runs of one writer never share a marker.
//!
//! Protocol, per subtask (writer `w`):
//!
//! 1. Records are formatted into lines and buffered in memory. When the buffer reaches the
//!    part size (8 MiB by default, above S3's 5 MiB minimum for every part but the last),
//!    it is uploaded as the next part of the writer's current upload, which starts (with
//!    its marker) on the first part: object `part-w-<counter>`, and the counter goes up.
//! 2. At a checkpoint barrier (pre-commit), what is buffered is uploaded as the last part
//!    and the upload (object name, upload id, part ids, size) goes into the snapshot with
//!    the writer's next counter. The object is still invisible.
//! 3. When checkpoint `n` completes (commit), every upload recorded up to `n` is completed:
//!    its object appears whole, and its marker is deleted.
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
//! Without checkpoints, the current upload is completed at end of input.
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
//! Requests per writer and checkpoint with new records: start an upload, write its marker,
//! one part per 8 MiB (at least one), look the object up, complete the upload, delete the
//! marker — six for up to 8 MiB. A checkpoint without new records costs none. A restore or
//! a fresh start lists the output prefix once per subtask.

use super::file_sink::{committed_name, new_token};
use super::sink::{SinkContext, SinkFunction};
use crate::codec;
use crate::error::{Error, Result};
use crate::ids::CheckpointId;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
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

/// The writer and counter of a committed object, from its name.
fn parse_committed(name: &str) -> Option<(usize, u64)> {
    let (w, c) = name.strip_prefix("part-")?.split_once('-')?;
    Some((w.parse().ok()?, c.parse().ok()?))
}

/// A failed request: the message names the operation and the object's URL, never
/// credentials. Not deterministic: a restart may get past a passing outage.
fn failed(e: weir_objstore::Error) -> Error {
    Error::User(e.to_string())
}

/// The exactly-once text sink on object storage (see the module docs).
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
pub struct ExactlyOnceObjectSink<T> {
    url: String,
    format: Arc<dyn Fn(&T) -> String + Send + Sync>,
    part_size: usize,
    store: Option<Store>,
    writer: usize,
    checkpointing: bool,
    token: String,
    next: u64,
    buf: Vec<u8>,
    current: Option<Upload>,
    pending: Vec<Upload>,
    restored: bool,
}

impl<T> ExactlyOnceObjectSink<T> {
    /// A sink writing below `url` (`s3://bucket/prefix`), one line per record formatted by
    /// `format`, in parts of [`DEFAULT_PART_SIZE`].
    pub fn new(url: String, format: Arc<dyn Fn(&T) -> String + Send + Sync>) -> Self {
        ExactlyOnceObjectSink {
            url,
            format,
            part_size: DEFAULT_PART_SIZE,
            store: None,
            writer: 0,
            checkpointing: false,
            token: new_token(),
            next: 0,
            buf: Vec::new(),
            current: None,
            pending: Vec::new(),
            restored: false,
        }
    }

    /// Uploads a part whenever `bytes` are buffered (on S3 at least 5 MiB).
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

    fn store(&mut self) -> Result<Store> {
        if self.store.is_none() {
            let s = Store::open(&self.url).map_err(|e| Error::Config(e.to_string()))?;
            self.store = Some(s);
        }
        Ok(self.store.clone().expect("just opened"))
    }

    /// Uploads the buffer as the next part of the current upload, starting one if needed.
    fn upload_part(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let store = self.store()?;
        if self.current.is_none() {
            let counter = self.next;
            let name = committed_name(self.writer, counter);
            let id = store.create_upload(&name).map_err(failed)?;
            let marker = marker_name(self.writer, counter, &self.token);
            store
                .put(&marker, id.clone().into_bytes())
                .map_err(failed)?;
            self.next += 1;
            self.current = Some(Upload {
                checkpoint: 0,
                counter,
                id,
                parts: Vec::new(),
                size: 0,
                marker,
            });
        }
        let up = self.current.as_mut().expect("just started");
        let name = committed_name(self.writer, up.counter);
        let bytes = std::mem::take(&mut self.buf);
        let n = bytes.len() as u64;
        let part = store
            .put_part(&name, &up.id, up.parts.len(), bytes)
            .map_err(failed)?;
        up.parts.push(part);
        up.size += n;
        Ok(())
    }

    /// Completes `up` of `writer`, never replacing another object; idempotent.
    fn commit(store: &Store, writer: usize, up: &Upload) -> Result<()> {
        let name = committed_name(writer, up.counter);
        let refuse = |size: u64| {
            Error::Config(format!(
                "refusing to complete the upload of {}: another object of {size} bytes is there \
                 (this upload has {} bytes), written by another run (two runs writing below one \
                 prefix, or a run restored from an older checkpoint or savepoint than the one that \
                 committed it). Nothing was overwritten. Give each run its own output prefix, or \
                 resume the run that wrote it",
                store.url_of(&name),
                up.size
            ))
        };
        match store.head(&name).map_err(failed)? {
            Some(o) if o.size == up.size => {} // completed before a crash
            Some(o) => return Err(refuse(o.size)),
            None => {
                if let Err(e) = store.complete_upload(&name, &up.id, up.parts.clone()) {
                    match store.head(&name).map_err(failed)? {
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
                    markers.push((o.name, committed_name(w, c)));
                }
            } else if let Some((w, c)) = parse_committed(&o.name)
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

impl<T: 'static> SinkFunction<T> for ExactlyOnceObjectSink<T> {
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
                    Self::commit(&store, w, up)?;
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
        self.writer = ctx.subtask;
        self.token = new_token();
        self.checkpointing = ctx.checkpointing;
        if !self.restored {
            self.clean(ctx, None)?;
        }
        Ok(())
    }

    fn invoke(&mut self, value: T, _ts: Timestamp) -> Result<()> {
        let line = (self.format)(&value);
        self.buf.extend_from_slice(line.as_bytes());
        self.buf.push(b'\n');
        if self.buf.len() >= self.part_size {
            self.upload_part()?;
        }
        Ok(())
    }

    fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<Option<(Vec<u8>, String)>> {
        self.upload_part()?;
        if let Some(mut up) = self.current.take() {
            up.checkpoint = checkpoint.0;
            self.pending.push(up);
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
            Self::commit(&store, self.writer, &self.pending[0])?;
            self.pending.remove(0);
        }
        crate::failpoint::hit("sink.after_commit");
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        if self.checkpointing {
            // Everything was committed by the final checkpoint; nothing may be left.
            if !self.buf.is_empty() || self.current.is_some() {
                return Err(Error::Config(
                    "records arrived after the final checkpoint barrier; they would not be committed".into(),
                ));
            }
            return Ok(());
        }
        self.upload_part()?;
        if let Some(up) = self.current.take() {
            let store = self.store()?;
            Self::commit(&store, self.writer, &up)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "object_sink_tests.rs"]
mod tests;
