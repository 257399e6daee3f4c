//! The Kafka source's event time: the subtask's watermark from its partitions'
//! (`emit_watermark`), and split-level watermark alignment: a partition whose watermark is
//! beyond what the source's alignment group allows is paused on the consumer while the
//! subtask reads its other partitions, and resumed, from the offset after the last record
//! emitted, once the group catches up (Flink's `KafkaSourceReader` pauses splits the same
//! way). Only with per-partition watermarks (`KafkaSource::watermarks`) and a group
//! (`Stream::watermark_alignment`); the decision itself is `weir_core`'s `SplitAlignment`.

use super::KafkaSourceFunction;
use crate::{KafkaError, Result};
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use std::time::Duration;
use std::time::Instant;
use weir_core::dsl::SourceOutput;
use weir_core::time::{MIN_WATERMARK, Timestamp};

impl<T: 'static> KafkaSourceFunction<T> {
    /// Emits the subtask's watermark: the minimum over its partitions that are open and
    /// active (had a record within the idleness timeout); marks the subtask idle when
    /// every open partition is idle.
    pub(super) fn emit_watermark(
        &mut self,
        out: &mut SourceOutput<'_, T>,
    ) -> weir_core::Result<()> {
        let Some(ooo) = self.cfg.out_of_orderness else {
            return Ok(());
        };
        let now = Instant::now();
        let mut wm: Option<Timestamp> = None;
        let mut any_open = false;
        for p in self.parts.iter().filter(|p| !p.done) {
            any_open = true;
            let active = self
                .cfg
                .idleness
                .is_none_or(|d| now.duration_since(p.last_record) < d);
            if active {
                let w = if p.max_ts == MIN_WATERMARK {
                    MIN_WATERMARK
                } else {
                    p.max_ts.saturating_sub(ooo).saturating_sub(1)
                };
                wm = Some(wm.map_or(w, |m: Timestamp| m.min(w)));
            }
        }
        match wm {
            Some(w) => {
                if self.idle {
                    self.idle = false;
                    out.mark_idle(false)?;
                }
                if w > self.watermark {
                    self.watermark = w;
                    out.emit_watermark(w)?;
                }
            }
            None if (any_open || self.parts.is_empty()) && !self.idle => {
                self.idle = true;
                out.mark_idle(true)?;
            }
            None => {}
        }
        Ok(())
    }

    /// The watermark of partition `i`: its largest timestamp less the out-of-orderness.
    fn partition_watermark(&self, i: usize, out_of_orderness: Timestamp) -> Timestamp {
        match self.parts[i].max_ts {
            MIN_WATERMARK => MIN_WATERMARK,
            t => t.saturating_sub(out_of_orderness).saturating_sub(1),
        }
    }

    /// True while partition `i` is paused: its records still in the consumer's queue are
    /// not emitted (the partition is read again from its position when it resumes).
    pub(super) fn partition_paused(&mut self, i: usize) -> bool {
        if self.aligned_parts.is_paused(&i) {
            self.parts[i].rewind = true;
            return true;
        }
        false
    }

    /// Pauses the partitions the group does not allow and resumes those it allows again.
    pub(super) fn align_partitions(&mut self) -> Result<()> {
        let (Some(handle), Some(ooo)) = (self.alignment.as_ref(), self.cfg.out_of_orderness) else {
            return Ok(());
        };
        let open: Vec<(usize, Timestamp)> = (0..self.parts.len())
            .filter(|&i| !self.parts[i].done)
            .map(|i| (i, self.partition_watermark(i, ooo)))
            .collect();
        let changes = self.aligned_parts.align(Some(handle), open);
        if changes.pause.is_empty() && changes.resume.is_empty() {
            return Ok(());
        }
        let Some(consumer) = self.consumer.clone() else {
            return Ok(());
        };
        if !changes.pause.is_empty() {
            let mut tpl = TopicPartitionList::new();
            for &i in &changes.pause {
                let s = &self.parts[i].state;
                tpl.add_partition(&s.topic, s.partition);
                tracing::debug!(
                    topic = %s.topic,
                    partition = s.partition,
                    "partition paused by watermark alignment"
                );
            }
            consumer
                .pause(&tpl)
                .map_err(|e| KafkaError::Broker(format!("pausing partitions: {e}")))?;
        }
        if !changes.resume.is_empty() {
            let mut tpl = TopicPartitionList::new();
            for &i in &changes.resume {
                let part = &mut self.parts[i];
                if std::mem::take(&mut part.rewind) {
                    // Records fetched while it was paused were dropped: read on from the
                    // offset after the last record emitted.
                    consumer
                        .seek(
                            &part.state.topic,
                            part.state.partition,
                            Offset::Offset(part.state.next),
                            Duration::from_secs(10),
                        )
                        .map_err(|e| {
                            KafkaError::Broker(format!(
                                "seeking {}/{} to {} to resume it: {e}",
                                part.state.topic, part.state.partition, part.state.next
                            ))
                        })?;
                }
                tpl.add_partition(&part.state.topic, part.state.partition);
            }
            consumer
                .resume(&tpl)
                .map_err(|e| KafkaError::Broker(format!("resuming partitions: {e}")))?;
        }
        Ok(())
    }
}
