//! The exactly-once Parquet file sink: the text sink's two-phase commit, with part files
//! that are complete Parquet files and may roll over between checkpoints.

use crate::{ParquetEncoder, ParquetOptions, RowSchema};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::Instant;
use weir_core::codec;
use weir_core::error::{Error, Result};
use weir_core::ids::CheckpointId;
use weir_core::ops::file_sink::{commit_no_replace, commit_pending, fsync_dir, new_token};
use weir_core::ops::sink::{SinkContext, SinkFunction};
use weir_core::time::Timestamp;

/// What a subtask's snapshot records: its index, the token of its uncommitted files, and
/// its pre-committed files as (checkpoint, number of files).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct SinkState {
    writer: u32,
    token: String,
    pending: Pending,
}

/// Pre-committed files by checkpoint: (checkpoint, number of files).
type Pending = Vec<(u64, u32)>;

/// A committed file's name: `part-<writer>-<checkpoint as 20 digits>-<n as 6 digits>.parquet`,
/// `n` counting the files of that writer and checkpoint from 0.
///
/// ```
/// assert_eq!(weir_parquet::committed_name(1, 42, 3), "part-1-00000000000000000042-000003.parquet");
/// ```
pub fn committed_name(writer: usize, checkpoint: u64, n: u32) -> String {
    format!("part-{writer}-{checkpoint:020}-{n:06}.parquet")
}

fn pending_name(writer: usize, checkpoint: u64, n: u32, token: &str) -> String {
    format!(".part-{writer}-{checkpoint}-{n}-{token}.parquet.pending")
}

fn in_progress_name(writer: usize, token: &str, seq: u64) -> String {
    format!(".part-{writer}-{token}-{seq}.parquet.inprogress")
}

/// A file of the sink directory, parsed from its name.
#[derive(Debug, PartialEq, Eq)]
enum Part {
    InProgress { writer: usize },
    Pending { writer: usize },
    Committed { writer: usize, checkpoint: u64 },
}

fn parse(name: &str) -> Option<Part> {
    if let Some(rest) = name.strip_prefix(".part-") {
        if let Some(rest) = rest.strip_suffix(".parquet.inprogress") {
            let w = rest.split('-').next()?;
            return Some(Part::InProgress {
                writer: w.parse().ok()?,
            });
        }
        let rest = rest.strip_suffix(".parquet.pending")?;
        let w = rest.split('-').next()?;
        return Some(Part::Pending {
            writer: w.parse().ok()?,
        });
    }
    let rest = name.strip_prefix("part-")?.strip_suffix(".parquet")?;
    let mut fields = rest.split('-');
    let (w, c, n) = (fields.next()?, fields.next()?, fields.next()?);
    if fields.next().is_some() || n.parse::<u32>().is_err() {
        return None;
    }
    Some(Part::Committed {
        writer: w.parse().ok()?,
        checkpoint: c.parse().ok()?,
    })
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::io(path.display(), e)
}

/// The part file being written.
struct OpenPart<T> {
    seq: u64,
    encoder: ParquetEncoder<T, BufWriter<File>>,
    opened: Instant,
}

/// The exactly-once Parquet file sink.
///
/// Each subtask writes rows into an in-progress Parquet file, which a checkpoint barrier,
/// or a rolling limit of [`ParquetOptions`], finishes (footer written, file fsynced). At the
/// barrier of checkpoint `c` the subtask's finished files are renamed to pending names
/// (pre-commit) and recorded in its snapshot; when `c` completes they are renamed to
/// [`committed_name`]s, never replacing an existing file, and the directory is fsynced.
///
/// On restore from checkpoint `c`, the pending files recorded in `c` are committed (a crash
/// may have hit between the checkpoint completing and the renames), and every uncommitted
/// file left by a writer this subtask now stands for (writer index `% parallelism`) is
/// removed: its rows are replayed from `c`. Committed files newer than `c` would be
/// duplicated by the replay, so the restore refuses with an error naming them; a job that
/// starts from scratch likewise refuses a directory holding committed files of its
/// subtasks. Without checkpoints, the files are committed at end of input as checkpoint 0.
///
/// The file names carry a token new for every run of a subtask, so a cut-off run (a zombie
/// of an old attempt) never touches the files of the run that replaced it. The fail points
/// `sink.after_precommit`, `sink.before_commit` and `sink.after_commit` fire as in the
/// text sink.
///
/// ```
/// use weir_core::ids::CheckpointId;
/// use weir_core::ops::sink::{SinkContext, SinkFunction};
/// use weir_parquet::{ParquetFileSink, ParquetOptions};
///
/// let dir = tempfile::tempdir().unwrap();
/// let mut sink = ParquetFileSink::<(u64, String)>::new(dir.path(), ParquetOptions::default()).unwrap();
/// let ctx = SinkContext { subtask: 0, parallelism: 1, checkpointing: true, checkpoint_timing: None,
///     name: "parquet".into(), operator_id: "sink".into() };
/// sink.open(&ctx).unwrap();
/// sink.invoke((1, "one".into()), 0).unwrap();
/// sink.snapshot(CheckpointId(1)).unwrap();      // pre-commit: a hidden, complete file
/// assert!(!dir.path().join("part-0-00000000000000000001-000000.parquet").exists());
/// sink.notify_complete(CheckpointId(1)).unwrap(); // commit
/// assert!(dir.path().join("part-0-00000000000000000001-000000.parquet").exists());
/// ```
pub struct ParquetFileSink<T> {
    dir: PathBuf,
    schema: std::result::Result<RowSchema<T>, String>,
    options: ParquetOptions,
    writer: usize,
    checkpointing: bool,
    token: String,
    part: Option<OpenPart<T>>,
    /// Finished in-progress files (by sequence number) waiting for the next barrier.
    closed: Vec<u64>,
    next_seq: u64,
    /// Pre-committed files not yet committed.
    pending: Pending,
    restored: bool,
}

impl<T: Serialize + DeserializeOwned> ParquetFileSink<T> {
    /// A sink writing into `dir`, with the schema derived from `T` (fails naming the field
    /// when `T` has no Parquet mapping).
    pub fn new(dir: impl Into<PathBuf>, options: ParquetOptions) -> Result<Self> {
        let schema = RowSchema::derive()?;
        Ok(Self::with_schema(dir.into(), Ok(schema), options))
    }
}

impl<T> ParquetFileSink<T> {
    /// A sink with a schema derived before, or the message of why it could not be (each
    /// subtask then fails when it opens).
    pub(crate) fn with_schema(
        dir: PathBuf,
        schema: std::result::Result<RowSchema<T>, String>,
        options: ParquetOptions,
    ) -> Self {
        ParquetFileSink {
            dir,
            schema,
            options,
            writer: 0,
            checkpointing: false,
            token: new_token(),
            part: None,
            closed: Vec::new(),
            next_seq: 0,
            pending: Vec::new(),
            restored: false,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn commit(&self, writer: usize, checkpoint: u64, n: u32, token: &str) -> Result<()> {
        let from = self.path(&pending_name(writer, checkpoint, n, token));
        let to = self.path(&committed_name(writer, checkpoint, n));
        commit_pending(&from, &to, writer, checkpoint, "rows")
    }

    /// Removes uncommitted files of the writers this subtask stands for; refuses committed
    /// files newer than the restored checkpoint (or any, when starting from scratch).
    fn clean(&self, ctx: &SinkContext, restored: Option<u64>) -> Result<()> {
        let entries = std::fs::read_dir(&self.dir).map_err(io(&self.dir))?;
        let mut newer = Vec::new();
        for e in entries {
            let e = e.map_err(io(&self.dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(part) = parse(&name) else { continue };
            let mine = |w: usize| w % ctx.parallelism == ctx.subtask;
            match part {
                // The pending files the restored state recorded were committed just before:
                // whatever is still pending belongs to no checkpoint being kept.
                Part::InProgress { writer } | Part::Pending { writer } if mine(writer) => {
                    std::fs::remove_file(e.path()).map_err(io(&e.path()))?;
                }
                Part::Committed { writer, checkpoint }
                    if mine(writer) && restored.is_none_or(|c| checkpoint > c) =>
                {
                    newer.push(name);
                }
                _ => {}
            }
        }
        newer.sort();
        match restored {
            _ if newer.is_empty() => fsync_dir(&self.dir),
            None => Err(Error::Config(format!(
                "{} already holds committed output of an earlier run ({}); a job starting from scratch \
                 would write it again. Resume that run from its checkpoint directory, or write into an \
                 empty directory",
                self.dir.display(),
                newer.join(", ")
            ))),
            Some(c) => Err(Error::Config(format!(
                "{} holds committed output newer than the checkpoint being restored ({c}): {}; replaying \
                 from the older checkpoint would duplicate it. Restore from the newer checkpoint, or move \
                 those files away to accept the replay",
                self.dir.display(),
                newer.join(", ")
            ))),
        }
    }

    /// Finishes the open part, if any: footer written, file flushed and fsynced.
    fn close_part(&mut self) -> Result<()>
    where
        T: Serialize,
    {
        let Some(part) = self.part.take() else {
            return Ok(());
        };
        let p = self.path(&in_progress_name(self.writer, &self.token, part.seq));
        let file = part
            .encoder
            .finish()?
            .into_inner()
            .map_err(|e| Error::io(p.display(), e.into_error()))?;
        file.sync_all().map_err(io(&p))?;
        self.closed.push(part.seq);
        Ok(())
    }

    fn open_part(&mut self) -> Result<()>
    where
        T: Serialize,
    {
        let schema = self.schema.as_ref().map_err(|m| Error::Config(m.clone()))?;
        let seq = self.next_seq;
        let p = self.path(&in_progress_name(self.writer, &self.token, seq));
        // create_new: never take over a file of another run.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
            .map_err(io(&p))?;
        let encoder = ParquetEncoder::with_writer(schema, BufWriter::new(f), &self.options)?;
        self.next_seq += 1;
        self.part = Some(OpenPart {
            seq,
            encoder,
            opened: Instant::now(),
        });
        Ok(())
    }

    /// True when the open part reached a rolling limit.
    fn full(&self) -> bool
    where
        T: Serialize,
    {
        let Some(part) = &self.part else {
            return false;
        };
        let o = &self.options;
        o.max_rows.is_some_and(|m| part.encoder.rows() >= m)
            || o.max_bytes
                .is_some_and(|m| part.encoder.estimated_bytes() >= m)
            || o.max_age.is_some_and(|m| part.opened.elapsed() >= m)
    }
}

impl<T: Serialize + 'static> SinkFunction<T> for ParquetFileSink<T> {
    fn restore(
        &mut self,
        checkpoint: CheckpointId,
        states: &[Vec<u8>],
        ctx: &SinkContext,
    ) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        for s in states {
            let st: SinkState = codec::decode(s)?;
            if st.writer as usize % ctx.parallelism == ctx.subtask {
                for (c, files) in st.pending {
                    for n in 0..files {
                        self.commit(st.writer as usize, c, n, &st.token)?;
                    }
                }
            }
        }
        self.clean(ctx, Some(checkpoint.0))?;
        self.restored = true;
        Ok(())
    }

    fn open(&mut self, ctx: &SinkContext) -> Result<()> {
        if let Err(m) = &self.schema {
            return Err(Error::Config(m.clone()));
        }
        self.writer = ctx.subtask;
        self.token = new_token();
        self.checkpointing = ctx.checkpointing;
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        if !self.restored {
            self.clean(ctx, None)?;
        }
        Ok(())
    }

    fn invoke(&mut self, value: T, _ts: Timestamp) -> Result<()> {
        if self.part.is_none() {
            self.open_part()?;
        }
        let part = self.part.as_mut().expect("just opened");
        part.encoder.push(&value)?;
        if self.full() {
            self.close_part()?;
        }
        Ok(())
    }

    fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<Option<(Vec<u8>, String)>> {
        self.close_part()?;
        if !self.closed.is_empty() {
            let closed = std::mem::take(&mut self.closed);
            for (n, seq) in closed.iter().enumerate() {
                let from = self.path(&in_progress_name(self.writer, &self.token, *seq));
                let to = self.path(&pending_name(
                    self.writer,
                    checkpoint.0,
                    n as u32,
                    &self.token,
                ));
                std::fs::rename(&from, &to).map_err(io(&from))?;
            }
            fsync_dir(&self.dir)?;
            self.pending.push((checkpoint.0, closed.len() as u32));
            weir_core::failpoint::hit("sink.after_precommit");
        }
        let st = SinkState {
            writer: self.writer as u32,
            token: self.token.clone(),
            pending: self.pending.clone(),
        };
        let desc = format!(
            "writer {}: pending (checkpoint, files) {:?}",
            self.writer, self.pending
        );
        Ok(Some((codec::encode(&st)?, desc)))
    }

    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<()> {
        let (done, keep): (Pending, Pending) =
            self.pending.iter().partition(|(c, _)| *c <= checkpoint.0);
        if done.is_empty() {
            return Ok(());
        }
        weir_core::failpoint::hit("sink.before_commit");
        for (c, files) in &done {
            for n in 0..*files {
                self.commit(self.writer, *c, n, &self.token)?;
            }
        }
        weir_core::failpoint::hit("sink.after_commit");
        self.pending = keep;
        fsync_dir(&self.dir)
    }

    fn finish(&mut self) -> Result<()> {
        if self.checkpointing {
            // Everything was committed by the final checkpoint; nothing may be left.
            if self.part.is_some() || !self.closed.is_empty() {
                return Err(Error::Config(
                    "rows arrived after the final checkpoint barrier; they would not be committed"
                        .into(),
                ));
            }
            return Ok(());
        }
        self.close_part()?;
        let closed = std::mem::take(&mut self.closed);
        for (n, seq) in closed.iter().enumerate() {
            let from = self.path(&in_progress_name(self.writer, &self.token, *seq));
            let to = self.path(&committed_name(self.writer, 0, n as u32));
            commit_no_replace(&from, &to).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    Error::Config(format!(
                        "refusing to commit {}: {} already exists (output of an earlier run); \
                         nothing was overwritten. Write into an empty directory",
                        from.display(),
                        to.display()
                    ))
                } else {
                    Error::io(from.display(), e)
                }
            })?;
        }
        if !closed.is_empty() {
            fsync_dir(&self.dir)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    type Row = (u64, String);

    fn row(i: u64) -> Row {
        (i, format!("r{i}"))
    }

    fn ctx(checkpointing: bool) -> SinkContext {
        SinkContext {
            subtask: 0,
            parallelism: 1,
            checkpointing,
            checkpoint_timing: None,
            name: "parquet".into(),
            operator_id: "sink".into(),
        }
    }

    fn sink(dir: &Path, options: ParquetOptions) -> ParquetFileSink<Row> {
        ParquetFileSink::new(dir, options).unwrap()
    }

    fn read(path: &Path) -> Vec<Row> {
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
            .unwrap()
            .build()
            .unwrap();
        reader
            .flat_map(|b| serde_arrow::from_record_batch::<Vec<Row>>(&b.unwrap()).unwrap())
            .collect()
    }

    /// The directory's files: committed ones with their rows, and the names of the others.
    fn listing(dir: &Path) -> (Vec<(String, Vec<Row>)>, Vec<String>) {
        let mut committed = Vec::new();
        let mut hidden = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            if name.starts_with('.') {
                hidden.push(name);
            } else {
                let rows = read(&dir.join(&name));
                committed.push((name, rows));
            }
        }
        committed.sort();
        hidden.sort();
        (committed, hidden)
    }

    #[test]
    fn names_round_trip() {
        assert_eq!(
            parse(&in_progress_name(3, "abc", 7)),
            Some(Part::InProgress { writer: 3 })
        );
        assert_eq!(
            parse(&pending_name(1, 42, 2, "abc")),
            Some(Part::Pending { writer: 1 })
        );
        assert_eq!(
            parse(&committed_name(0, 7, 1)),
            Some(Part::Committed {
                writer: 0,
                checkpoint: 7
            })
        );
        // The text sink's files and foreign files are not this sink's.
        assert_eq!(parse("part-0-00000000000000000007"), None);
        assert_eq!(parse(".part-0-7-abc.pending"), None);
        assert_eq!(parse("part-0-7.parquet"), None);
        assert_eq!(parse("notes.parquet"), None);
    }

    /// A part rolls after 3 rows: checkpoint 1 pre-commits four complete files, all hidden,
    /// and its completion commits them with numbers 0 to 3, in row order.
    #[test]
    fn rolling_by_rows_commits_several_numbered_files_per_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = sink(dir.path(), ParquetOptions::default().max_rows(3));
        s.open(&ctx(true)).unwrap();
        for i in 0..10 {
            s.invoke(row(i), 0).unwrap();
        }
        let (committed, hidden) = listing(dir.path());
        assert!(committed.is_empty());
        assert_eq!(
            hidden.len(),
            4,
            "three rolled parts and the open one: {hidden:?}"
        );
        s.snapshot(CheckpointId(1)).unwrap();
        let (committed, hidden) = listing(dir.path());
        assert!(committed.is_empty(), "pre-committed files stay hidden");
        assert!(hidden.iter().all(|n| n.ends_with(".parquet.pending")));
        s.notify_complete(CheckpointId(1)).unwrap();
        let (committed, hidden) = listing(dir.path());
        assert!(hidden.is_empty(), "{hidden:?}");
        let expected: Vec<(String, Vec<Row>)> = (0..4u64)
            .map(|n| {
                let rows = (n * 3..(n * 3 + 3).min(10)).map(row).collect();
                (committed_name(0, 1, n as u32), rows)
            })
            .collect();
        assert_eq!(committed, expected);

        // The next checkpoint numbers its files from 0 again.
        s.invoke(row(10), 0).unwrap();
        s.snapshot(CheckpointId(2)).unwrap();
        s.notify_complete(CheckpointId(2)).unwrap();
        let (committed, _) = listing(dir.path());
        assert_eq!(
            committed.last().unwrap(),
            &(committed_name(0, 2, 0), vec![row(10)])
        );
        // A checkpoint without rows writes no file.
        s.snapshot(CheckpointId(3)).unwrap();
        s.notify_complete(CheckpointId(3)).unwrap();
        assert_eq!(listing(dir.path()).0.len(), 5);
    }

    /// Rolling by bytes: every batch of 10 rows is encoded at once, and a limit of 5 bytes
    /// (one more than the 4-byte header of an empty file) closes the part after each batch.
    #[test]
    fn rolling_by_bytes_closes_a_part_once_it_is_that_large() {
        let dir = tempfile::tempdir().unwrap();
        let options = ParquetOptions::default().max_bytes(5).batch_rows(10);
        let mut s = sink(dir.path(), options);
        s.open(&ctx(false)).unwrap();
        for i in 0..25 {
            s.invoke(row(i), 0).unwrap();
        }
        s.finish().unwrap();
        let (committed, hidden) = listing(dir.path());
        assert!(hidden.is_empty());
        let sizes: Vec<usize> = committed.iter().map(|(_, r)| r.len()).collect();
        assert_eq!(sizes, [10, 10, 5]);
        assert_eq!(committed[0].0, committed_name(0, 0, 0));
    }

    /// Rolling by age: with a zero age every row is the last of its part (the age is
    /// checked when a row arrives), so each row gets its own committed file.
    #[test]
    fn rolling_by_age_closes_a_part_when_a_row_arrives_late_enough() {
        let dir = tempfile::tempdir().unwrap();
        let options = ParquetOptions::default().max_age(std::time::Duration::ZERO);
        let mut s = sink(dir.path(), options);
        s.open(&ctx(true)).unwrap();
        for i in 0..3 {
            s.invoke(row(i), 0).unwrap();
        }
        s.snapshot(CheckpointId(4)).unwrap();
        s.notify_complete(CheckpointId(4)).unwrap();
        let expected: Vec<(String, Vec<Row>)> = (0..3u64)
            .map(|i| (committed_name(0, 4, i as u32), vec![row(i)]))
            .collect();
        assert_eq!(listing(dir.path()), (expected, vec![]));
    }

    /// A crash after checkpoint 1 completed but before its files were committed, with
    /// checkpoint 2 pre-committed and more rows in progress: the restore from 1 commits
    /// checkpoint 1's files and removes everything else (its rows are replayed).
    #[test]
    fn a_restore_commits_what_the_checkpoint_recorded_and_removes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let mut old = sink(dir.path(), ParquetOptions::default().max_rows(2));
        old.open(&ctx(true)).unwrap();
        for i in 0..3 {
            old.invoke(row(i), 0).unwrap();
        }
        let (state, _) = old.snapshot(CheckpointId(1)).unwrap().unwrap();
        old.invoke(row(3), 0).unwrap();
        old.snapshot(CheckpointId(2)).unwrap();
        old.invoke(row(4), 0).unwrap();
        drop(old);
        assert_eq!(listing(dir.path()).1.len(), 4);

        let mut new = sink(dir.path(), ParquetOptions::default().max_rows(2));
        new.restore(CheckpointId(1), &[state], &ctx(true)).unwrap();
        new.open(&ctx(true)).unwrap();
        let (committed, hidden) = listing(dir.path());
        assert!(hidden.is_empty(), "{hidden:?}");
        assert_eq!(
            committed,
            vec![
                (committed_name(0, 1, 0), vec![row(0), row(1)]),
                (committed_name(0, 1, 1), vec![row(2)]),
            ]
        );
        // Restoring again (a second crash before any new checkpoint) changes nothing.
        let (state, _) = new.snapshot(CheckpointId(1)).unwrap().unwrap();
        let mut again = sink(dir.path(), ParquetOptions::default());
        let st: SinkState = codec::decode(&state).unwrap();
        assert!(st.pending.is_empty());
        again
            .restore(CheckpointId(1), &[state], &ctx(true))
            .unwrap();
        assert_eq!(listing(dir.path()).0, committed);
    }

    /// Committed files newer than the restored checkpoint would be duplicated by the
    /// replay; a start from scratch would duplicate any. Both refuse, naming the files.
    #[test]
    fn committed_output_that_a_replay_would_duplicate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = sink(dir.path(), ParquetOptions::default());
        s.open(&ctx(true)).unwrap();
        s.invoke(row(0), 0).unwrap();
        let (state, _) = s.snapshot(CheckpointId(1)).unwrap().unwrap();
        s.notify_complete(CheckpointId(1)).unwrap();
        s.invoke(row(1), 0).unwrap();
        s.snapshot(CheckpointId(2)).unwrap();
        s.notify_complete(CheckpointId(2)).unwrap();

        let e = sink(dir.path(), ParquetOptions::default())
            .restore(CheckpointId(1), &[state], &ctx(true))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("newer than the checkpoint") && e.contains(&committed_name(0, 2, 0)),
            "{e}"
        );
        let e = sink(dir.path(), ParquetOptions::default())
            .open(&ctx(true))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("earlier run") && e.contains(&committed_name(0, 1, 0)),
            "{e}"
        );
    }

    /// Two runs that number their checkpoints alike write into one directory: the second
    /// commit of checkpoint 3 fails loudly and the first run's file keeps its rows.
    #[test]
    fn a_commit_never_replaces_committed_output() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = sink(dir.path(), ParquetOptions::default());
        first.open(&ctx(true)).unwrap();
        first.invoke(row(1), 0).unwrap();
        first.snapshot(CheckpointId(3)).unwrap();
        first.notify_complete(CheckpointId(3)).unwrap();

        let mut second = sink(dir.path(), ParquetOptions::default());
        second.restored = true; // as if restored from checkpoint 2 elsewhere
        second.open(&ctx(true)).unwrap();
        second.invoke(row(2), 0).unwrap();
        second.snapshot(CheckpointId(3)).unwrap();
        let e = second
            .notify_complete(CheckpointId(3))
            .unwrap_err()
            .to_string();
        assert!(e.contains("refusing to commit"), "{e}");
        let (committed, hidden) = listing(dir.path());
        assert_eq!(committed, vec![(committed_name(0, 3, 0), vec![row(1)])]);
        assert_eq!(hidden.len(), 1, "the refused rows stay pending");
    }

    /// With checkpoints, rows after the final barrier are an error, not silently lost.
    #[test]
    fn rows_after_the_final_barrier_fail_the_finish() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = sink(dir.path(), ParquetOptions::default());
        s.open(&ctx(true)).unwrap();
        s.invoke(row(1), 0).unwrap();
        assert!(s.finish().is_err());
    }
}
