//! Split-based built-in sources: a text file and the benchmark generator.
//!
//! A source is cut into a fixed number of splits at the job's first start (its
//! parallelism then); each subtask reads the splits `s % parallelism == subtask` and
//! checkpoints a position per split, so a job resumes exactly where it left off even at a
//! different parallelism.

use super::sources::{SOURCE_BATCH, SourceContext, SourceFunction, SourceOutput};
use crate::codec;
use crate::error::{Error, Result};
use crate::graph::SourceStatus;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::PathBuf;

/// The checkpointed state of one subtask: the split count and its splits' positions.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SplitState {
    total: u32,
    positions: Vec<(u32, u64)>,
}

/// A split-based source's positions: the split count, fixed when the job first starts,
/// and a position for each split this subtask owns (subtask `r` of `P` owns the splits
/// `s` with `s % P == r`). Restoring merges the positions of every old subtask and takes
/// this subtask's share, so a source resumes exactly at any parallelism.
///
/// ```
/// use weir_core::dsl::{SourceContext, SplitPositions};
/// let ctx = SourceContext::new(1, 2);
/// let mut p = SplitPositions::new(5, &ctx);
/// assert_eq!(p.positions().keys().copied().collect::<Vec<_>>(), vec![1, 3]);
/// *p.positions_mut().get_mut(&3).unwrap() = 7;
/// let (bytes, desc) = p.snapshot().unwrap();
/// assert_eq!(desc, "split 1/5: 0, split 3/5: 7");
/// // Restored into one subtask: it owns every split, with the saved positions.
/// let mut one = SplitPositions::new(1, &SourceContext::new(0, 1));
/// one.restore(&[bytes], &SourceContext::new(0, 1)).unwrap();
/// assert_eq!(one.total(), 5);
/// assert_eq!(one.positions().get(&3), Some(&7));
/// ```
#[derive(Debug, Clone)]
pub struct SplitPositions {
    total: u32,
    mine: BTreeMap<u32, u64>,
}

impl SplitPositions {
    /// `total` splits, this subtask's share of them at position 0.
    pub fn new(total: u32, ctx: &SourceContext) -> Self {
        let mine = (0..total)
            .filter(|s| *s as usize % ctx.parallelism == ctx.subtask)
            .map(|s| (s, 0))
            .collect();
        SplitPositions { total, mine }
    }

    /// As many splits as the source's parallelism: one per subtask.
    fn fresh(ctx: &SourceContext) -> Self {
        Self::new(ctx.parallelism as u32, ctx)
    }

    /// Replaces the positions with this subtask's share of the checkpointed ones (the
    /// snapshots of every old subtask). Without snapshots, nothing changes.
    ///
    /// # Errors
    /// When the snapshots do not decode or disagree on the split count.
    pub fn restore(&mut self, states: &[Vec<u8>], ctx: &SourceContext) -> Result<()> {
        let mut total = None;
        let mut all = BTreeMap::new();
        for s in states {
            let st: SplitState = codec::decode(s)?;
            if *total.get_or_insert(st.total) != st.total {
                return Err(Error::Config(
                    "the checkpoint holds source splits of different split counts".into(),
                ));
            }
            all.extend(st.positions);
        }
        if let Some(total) = total {
            let mut restored = Self::new(total, ctx);
            for (s, p) in restored.mine.iter_mut() {
                *p = all.get(s).copied().unwrap_or(0);
            }
            *self = restored;
        }
        Ok(())
    }

    /// The number of splits.
    pub fn total(&self) -> u32 {
        self.total
    }

    /// This subtask's splits and their positions.
    pub fn positions(&self) -> &BTreeMap<u32, u64> {
        &self.mine
    }

    /// This subtask's splits and their positions, to advance.
    pub fn positions_mut(&mut self) -> &mut BTreeMap<u32, u64> {
        &mut self.mine
    }

    /// The checkpointed form, with a summary (`split 1/4: 120, split 3/4: 118`).
    ///
    /// # Errors
    /// When encoding fails.
    pub fn snapshot(&self) -> Result<(Vec<u8>, String)> {
        let st = SplitState {
            total: self.total,
            positions: self.mine.iter().map(|(s, p)| (*s, *p)).collect(),
        };
        let desc = self
            .mine
            .iter()
            .map(|(s, p)| format!("split {s}/{}: {p}", self.total))
            .collect::<Vec<_>>()
            .join(", ");
        Ok((codec::encode(&st)?, desc))
    }
}

/// Reads a UTF-8 text file line by line, split by line number.
pub(crate) struct TextFileSource {
    path: PathBuf,
    reader: Option<std::io::BufReader<Box<dyn std::io::Read + Send>>>,
    line_no: u64,
    splits: SplitPositions,
    rate: Option<RateLimit>,
}

/// At most `per_sec` records per second, measured from the first poll.
struct RateLimit {
    per_sec: u64,
    started: Option<std::time::Instant>,
    emitted: u64,
}

impl RateLimit {
    /// Records that may be emitted now, or the milliseconds to wait.
    fn budget(&mut self) -> std::result::Result<usize, u64> {
        let started = *self.started.get_or_insert_with(std::time::Instant::now);
        let allowed = (started.elapsed().as_secs_f64() * self.per_sec as f64) as u64 + 1;
        if allowed > self.emitted {
            Ok((allowed - self.emitted).min(SOURCE_BATCH as u64) as usize)
        } else {
            Err((1000 / self.per_sec.max(1)).clamp(1, 50))
        }
    }
}

impl TextFileSource {
    pub(crate) fn new(path: PathBuf, ctx: SourceContext, max_rate: Option<u64>) -> Self {
        let rate = max_rate.map(|per_sec| RateLimit {
            per_sec: per_sec.max(1),
            started: None,
            emitted: 0,
        });
        TextFileSource {
            path,
            reader: None,
            line_no: 0,
            splits: SplitPositions::fresh(&ctx),
            rate,
        }
    }
}

impl SourceFunction<String> for TextFileSource {
    fn restore(&mut self, states: &[Vec<u8>], ctx: &SourceContext) -> Result<()> {
        self.splits.restore(states, ctx)
    }

    fn open(&mut self, _ctx: &SourceContext) -> Result<()> {
        let input: Box<dyn std::io::Read + Send> = match self.path.to_str() {
            // An object on object storage, streamed from its start.
            Some(url) if weir_objstore::is_url(url) => {
                let (parent, name) = url.rsplit_once('/').unwrap_or((url, ""));
                let store =
                    weir_objstore::Store::open(parent).map_err(|e| Error::Config(e.to_string()))?;
                match store
                    .reader(name)
                    .map_err(|e| Error::Config(e.to_string()))?
                {
                    Some(r) => Box::new(r),
                    None => {
                        return Err(Error::Config(format!(
                            "input {url} does not exist (no such object)"
                        )));
                    }
                }
            }
            _ => Box::new(
                std::fs::File::open(&self.path).map_err(|e| Error::io(self.path.display(), e))?,
            ),
        };
        self.reader = Some(std::io::BufReader::new(input));
        Ok(())
    }

    fn poll(&mut self, out: &mut SourceOutput<'_, String>) -> Result<SourceStatus> {
        if self.splits.mine.is_empty() {
            return Ok(SourceStatus::Finished);
        }
        let budget = match self.rate.as_mut().map(|r| r.budget()) {
            None => SOURCE_BATCH,
            Some(Ok(n)) => n,
            Some(Err(wait_ms)) => return Ok(SourceStatus::Idle(wait_ms)),
        };
        if let Some(r) = self.rate.as_mut() {
            r.emitted += budget as u64;
        }
        let reader = self.reader.as_mut().expect("opened");
        let total = self.splits.total as u64;
        let mut buf = Vec::new();
        while out.emitted() < budget {
            buf.clear();
            let n = reader
                .read_until(b'\n', &mut buf)
                .map_err(|e| Error::io(self.path.display(), e))?;
            if n == 0 {
                return Ok(SourceStatus::Finished);
            }
            let line_no = self.line_no;
            self.line_no += 1;
            let split = (line_no % total) as u32;
            let index = line_no / total;
            let Some(pos) = self.splits.mine.get_mut(&split) else {
                continue;
            };
            if index < *pos {
                continue;
            }
            while matches!(buf.last(), Some(b'\n' | b'\r')) {
                buf.pop();
            }
            let line = String::from_utf8(std::mem::take(&mut buf)).map_err(|_| {
                Error::Malformed(format!(
                    "{} line {}: not valid UTF-8",
                    self.path.display(),
                    line_no + 1
                ))
            })?;
            *pos = index + 1;
            out.emit(line)?;
        }
        Ok(SourceStatus::More)
    }

    fn snapshot(&mut self) -> Result<Option<(Vec<u8>, String)>> {
        let (bytes, desc) = self.splits.snapshot()?;
        Ok(Some((
            bytes,
            format!("{}: lines read per split: {desc}", self.path.display()),
        )))
    }
}

/// The benchmark generator: event `i` for `i in 0..events` is `(i % keys, i)` with event
/// timestamp `i`. Split `s` of `S` holds `i = s, s+S, s+2S, ...`; a subtask emits its
/// splits merged in event-time order, so all subtasks advance through event time together.
///
/// ```
/// use weir_core::dsl::{GeneratorSource, SourceContext};
/// let g = GeneratorSource::new(10, 3, SourceContext::new(1, 2));
/// assert_eq!(g.indices().collect::<Vec<_>>(), vec![1, 3, 5, 7, 9]);
/// ```
pub struct GeneratorSource {
    events: u64,
    keys: u64,
    splits: SplitPositions,
}

impl GeneratorSource {
    /// The generator of subtask `ctx.subtask`, starting from the beginning.
    pub fn new(events: u64, keys: u64, ctx: SourceContext) -> Self {
        GeneratorSource {
            events,
            keys: keys.max(1),
            splits: SplitPositions::fresh(&ctx),
        }
    }

    /// The event indices this subtask still has to emit, in order.
    pub fn indices(&self) -> impl Iterator<Item = u64> + use<> {
        let total = self.splits.total as u64;
        let mut v: Vec<u64> = self
            .splits
            .mine
            .iter()
            .flat_map(|(&s, &p)| (s as u64 + p * total..self.events).step_by(total as usize))
            .collect();
        v.sort_unstable();
        v.into_iter()
    }
}

impl SourceFunction<(u64, i64)> for GeneratorSource {
    fn restore(&mut self, states: &[Vec<u8>], ctx: &SourceContext) -> Result<()> {
        self.splits.restore(states, ctx)
    }

    fn poll(&mut self, out: &mut SourceOutput<'_, (u64, i64)>) -> Result<SourceStatus> {
        let total = self.splits.total as u64;
        let (events, keys) = (self.events, self.keys);
        if self.splits.mine.len() == 1
            && let Some((&s, pos)) = self.splits.mine.iter_mut().next()
        {
            // One split (the common case): a tight loop.
            let mut i = s as u64 + *pos * total;
            let end = events.min(i.saturating_add(total * SOURCE_BATCH as u64));
            while i < end {
                out.emit_at((i % keys, i as i64), i as i64)?;
                i += total;
            }
            *pos = (i - s as u64) / total;
            return Ok(if i >= events {
                SourceStatus::Finished
            } else {
                SourceStatus::More
            });
        }
        for _ in 0..SOURCE_BATCH {
            // Several splits: emit the smallest next index first.
            let next = self
                .splits
                .mine
                .iter_mut()
                .map(|(&s, p)| (s as u64 + *p * total, p))
                .filter(|(i, _)| *i < events)
                .min_by_key(|(i, _)| *i);
            let Some((i, pos)) = next else {
                return Ok(SourceStatus::Finished);
            };
            *pos += 1;
            out.emit_at((i % keys, i as i64), i as i64)?;
        }
        Ok(SourceStatus::More)
    }

    fn snapshot(&mut self) -> Result<Option<(Vec<u8>, String)>> {
        let (bytes, desc) = self.splits.snapshot()?;
        Ok(Some((bytes, format!("events emitted per split: {desc}"))))
    }
}
