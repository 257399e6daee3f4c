//! [`NexmarkSource`]: the generator as a parallel, checkpointed weir source.

use crate::config::NexmarkConfig;
use crate::generator::{GeneratorConfig, splits};
use crate::model::Event;
use std::time::Instant;
use weir_core::dsl::{SOURCE_BATCH, SourceContext, SourceFunction, SourceOutput, SplitPositions};
use weir_core::graph::SourceStatus;
use weir_core::{Error, Result};

/// The Nexmark generator as a source of [`Event`]s, each emitted with its `date_time` as
/// event timestamp.
///
/// The stream is cut into `num_event_generators` splits (Nexmark's parallel timelines,
/// each a contiguous range of event ids starting at the base time); subtask `r` of `P`
/// generates the splits `s` with `s % P == r`, merged in event-time order. Positions are
/// checkpointed per split, so a job resumes exactly where it stopped, at any parallelism.
/// The data depends only on the configuration, never on the parallelism that runs it.
///
/// By default events are emitted as fast as possible (their timestamps are spaced by
/// `first_event_rate` regardless); [`NexmarkSource::paced`] emits each event when its
/// event time is due on the wall clock instead.
///
/// ```
/// use weir_core::prelude::*;
/// use weir_nexmark::{NexmarkConfig, NexmarkSource};
/// let p = Pipeline::new();
/// let config = NexmarkConfig { num_events: 1_000, num_event_generators: 2, ..Default::default() };
/// let events = p.source("nexmark", move |ctx| NexmarkSource::new(config.clone(), ctx));
/// # let _ = events;
/// ```
pub struct NexmarkSource {
    generators: Vec<GeneratorConfig>,
    /// The splits (generators) this subtask owns and the events each has emitted.
    splits: SplitPositions,
    paced: bool,
    started: Option<Instant>,
}

impl NexmarkSource {
    /// The source of subtask `ctx.subtask`, from the beginning of its splits.
    ///
    /// # Panics
    /// If the configuration has `num_event_generators == 0` or `first_event_rate == 0`.
    pub fn new(config: NexmarkConfig, ctx: SourceContext) -> Self {
        assert!(
            config.num_event_generators > 0 && config.first_event_rate > 0,
            "Nexmark needs at least one generator and a positive event rate"
        );
        let generators = splits(&config);
        NexmarkSource {
            splits: SplitPositions::new(generators.len() as u32, &ctx),
            generators,
            paced: false,
            started: None,
        }
    }

    /// Emits every event when its event time is due on the wall clock (measured from the
    /// first poll), so the stream flows at `first_event_rate` events per second.
    pub fn paced(mut self, paced: bool) -> Self {
        self.paced = paced;
        self
    }

    /// The next (split, timestamp) to emit: the owned split whose next event is earliest.
    fn next_split(&self) -> Option<(u32, i64)> {
        self.splits
            .positions()
            .iter()
            .filter(|(s, c)| **c < self.generators[**s as usize].max_events)
            .map(|(s, c)| (*s, self.generators[*s as usize].timestamp(*c)))
            .min_by_key(|(s, ts)| (*ts, *s))
    }
}

impl SourceFunction<Event> for NexmarkSource {
    fn restore(&mut self, states: &[Vec<u8>], ctx: &SourceContext) -> Result<()> {
        self.splits.restore(states, ctx)?;
        let total = self.splits.total() as usize;
        if total != self.generators.len() {
            return Err(Error::Config(format!(
                "the checkpoint's Nexmark source has {total} generators but this job configures \
                 {}: resume with the same num_event_generators",
                self.generators.len()
            )));
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut SourceOutput<'_, Event>) -> Result<SourceStatus> {
        let due = if self.paced {
            let started = *self.started.get_or_insert_with(Instant::now);
            let base = self.generators[0].base_time;
            Some(base.saturating_add(started.elapsed().as_millis() as i64))
        } else {
            None
        };
        let positions = self.splits.positions_mut();
        if positions.len() == 1 {
            // One split per subtask (the common case): a tight loop.
            let (&s, count) = positions.iter_mut().next().expect("one split");
            let g = &self.generators[s as usize];
            let end = g.max_events.min(*count + SOURCE_BATCH as u64);
            while *count < end {
                let ts = g.timestamp(*count);
                if let Some(d) = due
                    && ts > d
                {
                    return Ok(SourceStatus::Idle((ts - d).clamp(1, 50) as u64));
                }
                out.emit_at(g.event(*count), ts)?;
                *count += 1;
            }
            return Ok(if *count >= g.max_events {
                SourceStatus::Finished
            } else {
                SourceStatus::More
            });
        }
        while out.emitted() < SOURCE_BATCH {
            let Some((s, ts)) = self.next_split() else {
                return Ok(SourceStatus::Finished);
            };
            if let Some(d) = due
                && ts > d
            {
                return Ok(SourceStatus::Idle((ts - d).clamp(1, 50) as u64));
            }
            let count = self
                .splits
                .positions_mut()
                .get_mut(&s)
                .expect("owned split");
            out.emit_at(self.generators[s as usize].event(*count), ts)?;
            *count += 1;
        }
        Ok(SourceStatus::More)
    }

    fn snapshot(&mut self) -> Result<Option<(Vec<u8>, String)>> {
        let (bytes, desc) = self.splits.snapshot()?;
        Ok(Some((
            bytes,
            format!("Nexmark events emitted per generator: {desc}"),
        )))
    }
}
