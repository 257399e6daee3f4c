//! The exactly-once text file sink: two-phase commit tied to checkpoints.
//!
//! Each subtask `s` writes lines into `.part-<s>-<token>.inprogress`, where the token is
//! new for every run of the subtask. At a checkpoint barrier (pre-commit) the file is
//! flushed, fsynced and renamed to `.part-<s>-<n>-<token>.pending`; when checkpoint `n`
//! completes (commit) every pending file up to `n` is renamed to `part-<s>-<n as 20 digits>`,
//! and the directory is fsynced. Files starting with a dot are uncommitted: readers must
//! skip them. The token keeps two runs of one subtask apart: in a cluster, a worker cut off
//! from the coordinator (a zombie of an old attempt) may still be writing while the
//! subtask runs again elsewhere, and its files must never be taken for the new run's.
//!
//! On restore from checkpoint `c`, the pending files recorded in `c` are committed (a crash
//! may have hit between the checkpoint completing and the rename), and every uncommitted
//! file left by a writer this subtask now stands for (writer index `% parallelism`) is
//! removed: its records are replayed from `c`. Committed files newer than `c` would be
//! duplicated by the replay, so the restore refuses with an error naming them.
//! Without checkpoints, the in-progress file is committed at end of input.

use super::sink::{SinkContext, SinkFunction};
use crate::codec;
use crate::error::{Error, Result};
use crate::ids::CheckpointId;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a subtask's snapshot records: its index and its pre-committed files.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct SinkState {
    writer: u32,
    pending: Vec<u64>,
    /// The token in the names of this run's uncommitted files.
    token: String,
}

/// A committed file's name.
pub fn committed_name(writer: usize, checkpoint: u64) -> String {
    format!("part-{writer}-{checkpoint:020}")
}

fn pending_name(writer: usize, checkpoint: u64, token: &str) -> String {
    format!(".part-{writer}-{checkpoint}-{token}.pending")
}

fn in_progress_name(writer: usize, token: &str) -> String {
    format!(".part-{writer}-{token}.inprogress")
}

/// A token unique to one run of one sink subtask (16 hex digits), for the names of its
/// uncommitted files.
pub fn new_token() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut x = nanos ^ ((std::process::id() as u64) << 40) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // One xorshift round spreads the bits, so tokens of close moments look unrelated.
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    format!("{x:016x}")
}

/// A file of the sink directory, parsed from its name.
#[derive(Debug, PartialEq, Eq)]
enum Part {
    InProgress { writer: usize },
    Pending { writer: usize, checkpoint: u64 },
    Committed { writer: usize, checkpoint: u64 },
}

fn parse(name: &str) -> Option<Part> {
    if let Some(rest) = name.strip_prefix(".part-") {
        if let Some(w) = rest.strip_suffix(".inprogress") {
            let w = w.split('-').next()?;
            return Some(Part::InProgress {
                writer: w.parse().ok()?,
            });
        }
        let rest = rest.strip_suffix(".pending")?;
        let mut fields = rest.split('-');
        let (w, c) = (fields.next()?, fields.next()?);
        return Some(Part::Pending {
            writer: w.parse().ok()?,
            checkpoint: c.parse().ok()?,
        });
    }
    let rest = name.strip_prefix("part-")?;
    let (w, c) = rest.split_once('-')?;
    Some(Part::Committed {
        writer: w.parse().ok()?,
        checkpoint: c.parse().ok()?,
    })
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::io(path.display(), e)
}

/// Moves pending file `from` to its committed name `to`, never replacing a file already at
/// `to`: a hard link (which fails if `to` exists), then the pending name is removed. A crash
/// between the two leaves both names on one file, which a later commit finishes. Fails
/// with `AlreadyExists` when `to` is another file, and `NotFound` when `from` is gone.
pub fn commit_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    match std::fs::hard_link(from, to) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && same_file(from, to)? => {}
        Err(e) => return Err(e),
    }
    std::fs::remove_file(from)
}

/// Commits the pending file `from` of `writer`'s checkpoint `checkpoint` as `to`, never
/// replacing a file: `to` existing already is an error naming both (another run's output),
/// and `from` missing is fine only when `to` exists (committed before a crash). `unit` names
/// what the file holds in messages ("records", "rows").
pub fn commit_pending(
    from: &Path,
    to: &Path,
    writer: usize,
    checkpoint: u64,
    unit: &str,
) -> Result<()> {
    match commit_no_replace(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(Error::Config(format!(
            "refusing to commit {}: {} already holds committed output of checkpoint {checkpoint} \
             of writer {writer}, written by another run (two runs writing into one output \
             directory, or a run restored from an older checkpoint or savepoint than the one \
             that committed it). Nothing was overwritten; the {unit} stay in {}. Give each \
             run its own output directory, or resume the run that wrote it",
            from.display(),
            to.display(),
            from.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && to.exists() => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::Config(format!(
            "the pre-committed output file {} of checkpoint {checkpoint} is missing and was never \
             committed: that checkpoint's output is lost; restore from an earlier checkpoint",
            from.display()
        ))),
        Err(e) => Err(Error::io(from.display(), e)),
    }
}

/// True when both paths name one file (same device and inode).
fn same_file(a: &Path, b: &Path) -> std::io::Result<bool> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let (a, b) = (std::fs::metadata(a)?, std::fs::metadata(b)?);
        Ok(a.dev() == b.dev() && a.ino() == b.ino())
    }
    #[cfg(not(unix))]
    {
        let _ = (a, b);
        Ok(false)
    }
}

/// Makes the renames and removals in `dir` durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

/// The exactly-once text file sink (see the module docs).
pub struct ExactlyOnceFileSink<T> {
    pub(crate) dir: PathBuf,
    pub(crate) format: Arc<dyn Fn(&T) -> String + Send + Sync>,
    writer: usize,
    checkpointing: bool,
    file: Option<std::io::BufWriter<std::fs::File>>,
    pending: Vec<u64>,
    restored: bool,
    token: String,
}

impl<T> ExactlyOnceFileSink<T> {
    /// A sink writing into `dir`, one line per record formatted by `format`.
    pub fn new(dir: PathBuf, format: Arc<dyn Fn(&T) -> String + Send + Sync>) -> Self {
        ExactlyOnceFileSink {
            dir,
            format,
            writer: 0,
            checkpointing: false,
            file: None,
            pending: Vec::new(),
            restored: false,
            token: new_token(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn commit(&self, writer: usize, checkpoint: u64, token: &str) -> Result<()> {
        let from = self.path(&pending_name(writer, checkpoint, token));
        let to = self.path(&committed_name(writer, checkpoint));
        commit_pending(&from, &to, writer, checkpoint, "records")
    }

    /// Removes uncommitted files of the writers this subtask stands for.
    fn clean(&self, ctx: &SinkContext, restored: Option<u64>) -> Result<()> {
        let entries = std::fs::read_dir(&self.dir).map_err(io(&self.dir))?;
        let mut newer = Vec::new();
        for e in entries {
            let e = e.map_err(io(&self.dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(part) = parse(&name) else { continue };
            let mine = |w: usize| w % ctx.parallelism == ctx.subtask;
            match part {
                Part::InProgress { writer } if mine(writer) => {
                    std::fs::remove_file(e.path()).map_err(io(&e.path()))?;
                }
                // The pending files the restored state recorded were committed just
                // before: whatever is still pending belongs to no checkpoint being kept
                // (a newer one, or a run of this subtask that was cut off).
                Part::Pending { writer, .. } if mine(writer) => {
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
        if !newer.is_empty() && restored.is_none() {
            newer.sort();
            return Err(Error::Config(format!(
                "{} already holds committed output of an earlier run ({}); a job starting from scratch would \
                 write it again. Resume that run from its checkpoint directory, or write into an empty directory",
                self.dir.display(),
                newer.join(", ")
            )));
        }
        if !newer.is_empty() {
            newer.sort();
            return Err(Error::Config(format!(
                "{} holds committed output newer than the checkpoint being restored ({}): {}; replaying \
                 from the older checkpoint would duplicate it. Restore from the newer checkpoint, or move \
                 those files away to accept the replay",
                self.dir.display(),
                restored.unwrap_or(0),
                newer.join(", ")
            )));
        }
        fsync_dir(&self.dir)
    }

    fn roll(&mut self) -> Result<bool> {
        let Some(mut f) = self.file.take() else {
            return Ok(false);
        };
        let p = self.path(&in_progress_name(self.writer, &self.token));
        f.flush().map_err(io(&p))?;
        f.get_ref().sync_all().map_err(io(&p))?;
        Ok(true)
    }
}

impl<T: 'static> SinkFunction<T> for ExactlyOnceFileSink<T> {
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
                for c in st.pending {
                    self.commit(st.writer as usize, c, &st.token)?;
                }
            }
        }
        self.clean(ctx, Some(checkpoint.0))?;
        self.restored = true;
        Ok(())
    }

    fn open(&mut self, ctx: &SinkContext) -> Result<()> {
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
        if self.file.is_none() {
            let p = self.path(&in_progress_name(self.writer, &self.token));
            // create_new: never take over a file of another run.
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&p)
                .map_err(io(&p))?;
            self.file = Some(std::io::BufWriter::new(f));
        }
        let line = (self.format)(&value);
        let f = self.file.as_mut().expect("just opened");
        writeln!(f, "{line}").map_err(|e| {
            Error::io(
                self.dir
                    .join(in_progress_name(self.writer, &self.token))
                    .display(),
                e,
            )
        })
    }

    fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<Option<(Vec<u8>, String)>> {
        if self.roll()? {
            let from = self.path(&in_progress_name(self.writer, &self.token));
            let to = self.path(&pending_name(self.writer, checkpoint.0, &self.token));
            std::fs::rename(&from, &to).map_err(io(&from))?;
            fsync_dir(&self.dir)?;
            self.pending.push(checkpoint.0);
            crate::failpoint::hit("sink.after_precommit");
        }
        let st = SinkState {
            writer: self.writer as u32,
            pending: self.pending.clone(),
            token: self.token.clone(),
        };
        let desc = format!(
            "writer {}: pending checkpoints {:?}",
            self.writer, self.pending
        );
        Ok(Some((codec::encode(&st)?, desc)))
    }

    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<()> {
        let (done, keep): (Vec<u64>, Vec<u64>) =
            self.pending.iter().partition(|c| **c <= checkpoint.0);
        if !done.is_empty() {
            crate::failpoint::hit("sink.before_commit");
        }
        for c in &done {
            self.commit(self.writer, *c, &self.token)?;
        }
        if !done.is_empty() {
            crate::failpoint::hit("sink.after_commit");
        }
        self.pending = keep;
        if !done.is_empty() {
            fsync_dir(&self.dir)?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        if self.checkpointing {
            // Everything was committed by the final checkpoint; nothing may be left.
            if self.file.is_some() {
                return Err(Error::Config(
                    "records arrived after the final checkpoint barrier; they would not be committed".into(),
                ));
            }
            return Ok(());
        }
        if self.roll()? {
            let from = self.path(&in_progress_name(self.writer, &self.token));
            let to = self.path(&committed_name(self.writer, 0));
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
            fsync_dir(&self.dir)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let token = new_token();
        assert_ne!(token, new_token(), "every run gets its own token");
        assert_eq!(
            parse(&in_progress_name(3, &token)),
            Some(Part::InProgress { writer: 3 })
        );
        assert_eq!(
            parse(&pending_name(1, 42, &token)),
            Some(Part::Pending {
                writer: 1,
                checkpoint: 42
            })
        );
        assert_eq!(
            parse(&committed_name(0, 7)),
            Some(Part::Committed {
                writer: 0,
                checkpoint: 7
            })
        );
        assert_eq!(parse("notes.txt"), None);
    }

    fn ctx() -> SinkContext {
        SinkContext::single("sink")
    }

    fn committed(dir: &Path) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .map(|n| (n.clone(), std::fs::read_to_string(dir.join(&n)).unwrap()))
            .collect();
        out.sort();
        out
    }

    /// Two runs that number their checkpoints alike write into one directory (say a
    /// savepoint resumed twice): the second commit of checkpoint 3 fails loudly and the
    /// first run's committed file keeps its records.
    #[test]
    fn a_commit_never_replaces_committed_output() {
        let dir = tempfile::tempdir().unwrap();
        let format: Arc<dyn Fn(&String) -> String + Send + Sync> = Arc::new(|s: &String| s.clone());
        let mut first = ExactlyOnceFileSink::new(dir.path().to_path_buf(), format.clone());
        first.open(&ctx()).unwrap();
        first.invoke("first".into(), 0).unwrap();
        first.snapshot(CheckpointId(3)).unwrap();
        first.notify_complete(CheckpointId(3)).unwrap();

        let mut second = ExactlyOnceFileSink::new(dir.path().to_path_buf(), format);
        second.restored = true; // as if restored from checkpoint 2 elsewhere
        second.open(&ctx()).unwrap();
        second.invoke("second".into(), 0).unwrap();
        second.snapshot(CheckpointId(3)).unwrap();
        let e = second
            .notify_complete(CheckpointId(3))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("refusing to commit") && e.contains("part-0-00000000000000000003"),
            "{e}"
        );
        assert_eq!(
            committed(dir.path()),
            vec![(
                "part-0-00000000000000000003".to_string(),
                "first\n".to_string()
            )]
        );
        // The refused records are still there, pending, for whoever sorts it out.
        let pending = pending_name(0, 3, &second.token);
        assert_eq!(
            std::fs::read_to_string(dir.path().join(pending)).unwrap(),
            "second\n"
        );
    }

    /// A crash between the link and the removal of the pending name leaves both names on
    /// one file: committing again finishes the move instead of reporting a collision.
    #[test]
    fn a_commit_interrupted_after_the_link_is_finished_on_retry() {
        let dir = tempfile::tempdir().unwrap();
        let from = dir.path().join(".part-0-1-t.pending");
        let to = dir.path().join(committed_name(0, 1));
        std::fs::write(&from, "x\n").unwrap();
        std::fs::hard_link(&from, &to).unwrap();
        commit_no_replace(&from, &to).unwrap();
        assert!(!from.exists());
        assert_eq!(std::fs::read_to_string(&to).unwrap(), "x\n");
    }

    /// A run of a subtask cut off from its cluster (a zombie) keeps writing while the
    /// subtask runs again elsewhere from the last checkpoint; the new run's committed
    /// output holds only its own records.
    #[test]
    fn a_cut_off_run_cannot_touch_the_files_of_the_run_that_replaced_it() {
        let dir = tempfile::tempdir().unwrap();
        let format: Arc<dyn Fn(&String) -> String + Send + Sync> = Arc::new(|s: &String| s.clone());
        let mut old = ExactlyOnceFileSink::new(dir.path().to_path_buf(), format.clone());
        old.open(&ctx()).unwrap();
        old.invoke("a".into(), 0).unwrap();
        let (state, _) = old.snapshot(CheckpointId(1)).unwrap().unwrap();
        old.notify_complete(CheckpointId(1)).unwrap();
        old.invoke("b".into(), 0).unwrap();

        // The subtask restarts from checkpoint 1 elsewhere, and writes while the old run,
        // thawed, goes on writing and pre-commits the same checkpoint number. What the old
        // run's calls return does not matter (it may fail); the new run must not notice.
        let mut new = ExactlyOnceFileSink::new(dir.path().to_path_buf(), format);
        new.restore(CheckpointId(1), &[state], &ctx()).unwrap();
        new.open(&ctx()).unwrap();
        new.invoke("b".into(), 0).unwrap();
        new.roll().unwrap();
        new.file = Some(std::io::BufWriter::new(
            std::fs::OpenOptions::new()
                .append(true)
                .open(dir.path().join(in_progress_name(0, &new.token)))
                .unwrap(),
        ));
        let _ = old.snapshot(CheckpointId(2));
        let _ = old.invoke("zombie-1".into(), 0);
        let _ = old.roll();
        new.invoke("c".into(), 0).unwrap();
        let _ = old.snapshot(CheckpointId(3));
        new.snapshot(CheckpointId(2)).unwrap();
        new.notify_complete(CheckpointId(2)).unwrap();
        let _ = old.notify_complete(CheckpointId(3));

        assert_eq!(
            committed(dir.path()),
            vec![
                ("part-0-00000000000000000001".to_string(), "a\n".to_string()),
                (
                    "part-0-00000000000000000002".to_string(),
                    "b\nc\n".to_string()
                ),
            ]
        );
    }
}
