//! The Kafka source: deterministic partition assignment, offsets in checkpoints,
//! `read_committed`, per-partition watermarks, bounded mode, dead-letter topic.

use crate::admin;
use crate::sink::{Prod, flush, reporting_producer, send, take_deliveries};
use crate::{KafkaError, Result};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError as RdError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::BaseRecord;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_core::dsl::{SOURCE_BATCH, SourceContext, SourceFunction, SourceOutput};
use weir_core::graph::SourceStatus;
use weir_core::ids::CheckpointId;
use weir_core::time::{MIN_WATERMARK, NO_TIMESTAMP, Timestamp};

/// Where a partition is read from when the job first starts (a resumed job always
/// continues from its checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// The oldest offset still in the log.
    Earliest,
    /// The end of the log when the job first starts.
    Latest,
}

/// A record as the deserializer sees it.
#[derive(Debug, Clone, Copy)]
pub struct KafkaRecord<'a> {
    /// The topic.
    pub topic: &'a str,
    /// The partition.
    pub partition: i32,
    /// The record's offset.
    pub offset: i64,
    /// The key, if any.
    pub key: Option<&'a [u8]>,
    /// The value, if any.
    pub value: Option<&'a [u8]>,
    /// The record's timestamp in milliseconds since the Unix epoch, if any.
    pub timestamp: Option<i64>,
}

type Deserializer<T> =
    Arc<dyn Fn(&KafkaRecord<'_>) -> std::result::Result<T, String> + Send + Sync>;

/// A Kafka source's configuration; [`KafkaSource::factory`] makes its subtasks.
///
/// Partitions of all topics are sorted by (topic, partition) and subtask `i` of `P` reads
/// those at positions `n` with `n % P == i`: no consumer group, no rebalancing. Offsets
/// live in weir's checkpoints and are committed to Kafka (group id
/// [`KafkaSource::group_id`]) after each checkpoint completes, for monitoring only.
///
/// ```
/// use weir_kafka::{KafkaSource, StartFrom};
/// use std::time::Duration;
/// let source = KafkaSource::new("127.0.0.1:9092", ["clicks"])
///     .start_from(StartFrom::Earliest)
///     .watermarks(500, Some(Duration::from_secs(10)))
///     .dead_letter_topic("clicks-dlq")
///     .deserializer(|r| std::str::from_utf8(r.value.unwrap_or_default())
///         .map(str::to_string)
///         .map_err(|e| e.to_string()));
/// # let _ = source;
/// ```
pub struct KafkaSource<T> {
    brokers: String,
    topics: Vec<String>,
    group_id: Option<String>,
    start: StartFrom,
    bounded: bool,
    read_committed: bool,
    dead_letter: Option<String>,
    out_of_orderness: Option<Timestamp>,
    idleness: Option<Duration>,
    props: Vec<(String, String)>,
    deserializer: Option<Deserializer<T>>,
}

impl<T> Clone for KafkaSource<T> {
    fn clone(&self) -> Self {
        KafkaSource {
            brokers: self.brokers.clone(),
            topics: self.topics.clone(),
            group_id: self.group_id.clone(),
            start: self.start,
            bounded: self.bounded,
            read_committed: self.read_committed,
            dead_letter: self.dead_letter.clone(),
            out_of_orderness: self.out_of_orderness,
            idleness: self.idleness,
            props: self.props.clone(),
            deserializer: self.deserializer.clone(),
        }
    }
}

impl<T: 'static> KafkaSource<T> {
    /// A source reading `topics` from `brokers`, `read_committed`, from the earliest offset.
    pub fn new<S: Into<String>>(brokers: &str, topics: impl IntoIterator<Item = S>) -> Self {
        KafkaSource {
            brokers: brokers.to_string(),
            topics: topics.into_iter().map(Into::into).collect(),
            group_id: None,
            start: StartFrom::Earliest,
            bounded: false,
            read_committed: true,
            dead_letter: None,
            out_of_orderness: None,
            idleness: None,
            props: Vec::new(),
            deserializer: None,
        }
    }

    /// Turns a record into a value; an `Err` names what is wrong with the record.
    pub fn deserializer(
        mut self,
        f: impl Fn(&KafkaRecord<'_>) -> std::result::Result<T, String> + Send + Sync + 'static,
    ) -> Self {
        self.deserializer = Some(Arc::new(f));
        self
    }

    /// Stops at the end offsets observed when the job first starts (kept in checkpoints, so
    /// a resumed job stops at the same place).
    pub fn bounded(mut self) -> Self {
        self.bounded = true;
        self
    }

    /// Where to start on the job's first start (default [`StartFrom::Earliest`]).
    pub fn start_from(mut self, s: StartFrom) -> Self {
        self.start = s;
        self
    }

    /// The consumer group offsets are committed under after each checkpoint (monitoring
    /// only; default `weir-{topics}`).
    pub fn group_id(mut self, id: &str) -> Self {
        self.group_id = Some(id.to_string());
        self
    }

    /// Reads `read_uncommitted` instead of the default `read_committed` (records of aborted
    /// transactions then reach the job).
    pub fn read_uncommitted(mut self) -> Self {
        self.read_committed = false;
        self
    }

    /// Records that fail to deserialize go to `topic` (original key and value, with headers
    /// `weir.error`, `weir.topic`, `weir.partition`, `weir.offset`) instead of failing the
    /// job. Dead letters are flushed at every checkpoint barrier (at-least-once).
    pub fn dead_letter_topic(mut self, topic: &str) -> Self {
        self.dead_letter = Some(topic.to_string());
        self
    }

    /// Per-partition watermarks from record timestamps: each partition's watermark trails
    /// its largest timestamp by `max_out_of_orderness` ms; the source's watermark is the
    /// minimum over partitions that had a record within `idleness` (all partitions when
    /// `None`); when every partition is idle, the subtask is marked idle.
    pub fn watermarks(
        mut self,
        max_out_of_orderness: Timestamp,
        idleness: Option<Duration>,
    ) -> Self {
        self.out_of_orderness = Some(max_out_of_orderness.max(0));
        self.idleness = idleness;
        self
    }

    /// Sets a librdkafka consumer property (for example `fetch.max.bytes`).
    pub fn set(mut self, key: &str, value: &str) -> Self {
        self.props.push((key.to_string(), value.to_string()));
        self
    }

    /// The factory to pass to `Pipeline::source`.
    pub fn factory(
        &self,
    ) -> impl Fn(SourceContext) -> KafkaSourceFunction<T> + Send + Sync + 'static {
        let cfg = self.clone();
        move |ctx| KafkaSourceFunction::new(cfg.clone(), ctx)
    }

    fn group(&self) -> String {
        self.group_id
            .clone()
            .unwrap_or_else(|| format!("weir-{}", self.topics.join(",")))
    }
}

/// A partition's position, as kept in checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PartState {
    topic: String,
    partition: i32,
    /// The next offset to read.
    next: i64,
    /// Bounded mode: stop before this offset.
    end: Option<i64>,
}

mod align;
mod lag;
mod snapshot;
use snapshot::{PartEventTime, decode_snapshot, encode_snapshot};

struct Part {
    state: PartState,
    done: bool,
    max_ts: Timestamp,
    last_record: Instant,
    /// The partition's figures, also on `/metrics` (see `lag`).
    gauges: lag::Gauges,
    /// Paused by watermark alignment after the consumer fetched records past `next`: seek
    /// back to `next` when it resumes (see `align`).
    rewind: bool,
}

/// One subtask of a [`KafkaSource`].
pub struct KafkaSourceFunction<T> {
    cfg: KafkaSource<T>,
    subtask: usize,
    parallelism: usize,
    parts: Vec<Part>,
    restored: Option<Vec<PartState>>,
    /// Restored per-partition event time (largest timestamp read), by topic and partition.
    restored_event_time: Vec<PartEventTime>,
    consumer: Option<Arc<BaseConsumer>>,
    dead_letters: Option<Prod>,
    snapshots: VecDeque<TopicPartitionList>,
    watermark: Timestamp,
    idle: bool,
    /// The operator name and the figures of this subtask's partitions.
    operator: String,
    figures: weir_core::dsl::SourceFigures,
    /// Reads the partitions' high watermarks once a second while the subtask lives.
    probe: Option<lag::Probe>,
    /// In a watermark alignment group: the limit the group publishes.
    alignment: Option<weir_core::watermark::AlignmentHandle>,
    /// The partitions (indexes into `parts`) paused by watermark alignment.
    aligned_parts: weir_core::watermark::SplitAlignment<usize>,
}

impl<T: 'static> KafkaSourceFunction<T> {
    fn new(cfg: KafkaSource<T>, ctx: SourceContext) -> Self {
        KafkaSourceFunction {
            cfg,
            subtask: ctx.subtask,
            parallelism: ctx.parallelism.max(1),
            operator: ctx.operator,
            figures: ctx.figures,
            alignment: ctx.alignment,
            aligned_parts: weir_core::watermark::SplitAlignment::new(),
            probe: None,
            parts: Vec::new(),
            restored: None,
            restored_event_time: Vec::new(),
            consumer: None,
            dead_letters: None,
            snapshots: VecDeque::new(),
            watermark: MIN_WATERMARK,
            idle: false,
        }
    }

    /// All partitions of the configured topics, sorted, with this run's start offsets.
    fn discover(&self) -> Result<Vec<PartState>> {
        let mut all = Vec::new();
        for t in &self.cfg.topics {
            for p in admin::partitions(&self.cfg.brokers, t)? {
                all.push((t.clone(), p));
            }
        }
        all.sort();
        Ok(all
            .into_iter()
            .map(|(topic, partition)| PartState {
                topic,
                partition,
                next: -1,
                end: None,
            })
            .collect())
    }

    fn assign(&mut self) -> Result<()> {
        let restored = self.restored.take();
        let mut all: Vec<PartState> = match &restored {
            Some(r) => {
                let mut r = r.clone();
                // Partitions added since the checkpoint (unbounded mode) start at their
                // beginning.
                if !self.cfg.bounded {
                    for p in self.discover()? {
                        if !r
                            .iter()
                            .any(|q| q.topic == p.topic && q.partition == p.partition)
                        {
                            r.push(PartState { next: -2, ..p });
                        }
                    }
                }
                r
            }
            None => self.discover()?,
        };
        all.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        all.dedup_by(|a, b| a.topic == b.topic && a.partition == b.partition);
        let mine: Vec<PartState> = all
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i % self.parallelism == self.subtask)
            .map(|(_, p)| p)
            .collect();
        let first_start = restored.is_none();
        let mut tpl = TopicPartitionList::new();
        for mut s in mine {
            if s.next < 0 || (first_start && self.cfg.bounded) {
                // Bounded mode stops at the last stable offset of the first start: records of
                // transactions still open then are not part of the bounded input.
                let (low, high) = if self.cfg.read_committed {
                    admin::stable_watermarks(&self.cfg.brokers, &s.topic, s.partition)?
                } else {
                    admin::watermarks(&self.cfg.brokers, &s.topic, s.partition)?
                };
                if s.next < 0 {
                    s.next = match (self.cfg.start, s.next) {
                        (_, -2) | (StartFrom::Earliest, _) => low,
                        (StartFrom::Latest, _) => high,
                    };
                }
                if first_start && self.cfg.bounded {
                    s.end = Some(high);
                }
            }
            let done = s.end.is_some_and(|e| s.next >= e);
            // Event time continues where the checkpoint left it, whichever subtask read
            // the partition before.
            let max_ts = self
                .restored_event_time
                .iter()
                .find(|e| e.topic == s.topic && e.partition == s.partition)
                .map_or(MIN_WATERMARK, |e| e.max_ts);
            if !done {
                tpl.add_partition_offset(&s.topic, s.partition, Offset::Offset(s.next))
                    .map_err(|e| KafkaError::Broker(e.to_string()))?;
            }
            let gauges = lag::Gauges::register(&self.operator, self.subtask, &s.topic, s.partition);
            gauges.publish(s.next);
            self.figures.add_partition(gauges.figures());
            self.parts.push(Part {
                state: s,
                done,
                max_ts,
                last_record: Instant::now(),
                gauges,
                rewind: false,
            });
        }
        let consumer = self.consumer.as_ref().expect("created in open");
        consumer
            .assign(&tpl)
            .map_err(|e| KafkaError::Broker(format!("assigning partitions: {e}")))?;
        Ok(())
    }

    fn consumer_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.cfg.brokers)
            .set("group.id", self.cfg.group())
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            // librdkafka pauses fetching for this long once its local queue holds
            // queued.min.messages (default 1 s): a job that drains the queue faster than
            // that would wait most of the time.
            .set("fetch.queue.backoff.ms", "10")
            // Fewer, fuller fetches (at most 20 ms late): less broker CPU per record.
            .set("fetch.min.bytes", "1000000")
            .set("fetch.wait.max.ms", "20")
            // A checkpointed offset that retention removed must fail loudly, never skip.
            .set("auto.offset.reset", "error")
            .set(
                "isolation.level",
                if self.cfg.read_committed {
                    "read_committed"
                } else {
                    "read_uncommitted"
                },
            );
        for (k, v) in &self.cfg.props {
            c.set(k, v);
        }
        c
    }

    fn part_index(&self, topic: &str, partition: i32) -> Option<usize> {
        self.parts
            .iter()
            .position(|p| p.state.partition == partition && p.state.topic == topic)
    }

    fn dead_letter(&mut self, rec: &KafkaRecord<'_>, error: &str) -> Result<()> {
        let Some(topic) = self.cfg.dead_letter.clone() else {
            return Err(KafkaError::Deserialize(format!(
                "record {}/{} at offset {} could not be deserialized: {error}; fix the record or \
                 the deserializer, or configure a dead-letter topic to set such records aside",
                rec.topic, rec.partition, rec.offset
            )));
        };
        if self.dead_letters.is_none() {
            let mut c = ClientConfig::new();
            c.set("bootstrap.servers", &self.cfg.brokers)
                .set("enable.idempotence", "true")
                .set("acks", "all");
            self.dead_letters = Some(reporting_producer(&c)?);
        }
        let p = self.dead_letters.as_ref().expect("created above");
        let partition = rec.partition.to_string();
        let offset = rec.offset.to_string();
        let headers = OwnedHeaders::new_with_capacity(4)
            .insert(Header {
                key: "weir.error",
                value: Some(error.as_bytes()),
            })
            .insert(Header {
                key: "weir.topic",
                value: Some(rec.topic.as_bytes()),
            })
            .insert(Header {
                key: "weir.partition",
                value: Some(partition.as_bytes()),
            })
            .insert(Header {
                key: "weir.offset",
                value: Some(offset.as_bytes()),
            });
        let mut r: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(&topic, 0).headers(headers);
        if let Some(k) = rec.key {
            r = r.key(k);
        }
        if let Some(v) = rec.value {
            r = r.payload(v);
        }
        send(p, r)?;
        p.poll(Duration::ZERO);
        Ok(())
    }

    fn check_eof(&mut self, partition: i32) {
        let Some(c) = &self.consumer else { return };
        let Ok(pos) = c.position() else { return };
        for p in self
            .parts
            .iter_mut()
            .filter(|p| p.state.partition == partition)
        {
            if let Some(e) = pos.find_partition(&p.state.topic, partition)
                && let Offset::Offset(o) = e.offset()
            {
                p.state.next = p.state.next.max(o);
            }
            if p.state.end.is_some_and(|end| p.state.next >= end) {
                p.done = true;
            }
            p.gauges.publish(p.state.next);
        }
    }

    /// Publishes every partition's position (once per batch: a relaxed store each).
    fn publish_positions(&self) {
        for p in &self.parts {
            p.gauges.publish(p.state.next);
        }
    }
}

impl<T: 'static> SourceFunction<T> for KafkaSourceFunction<T> {
    fn restore(&mut self, states: &[Vec<u8>], _ctx: &SourceContext) -> weir_core::Result<()> {
        let mut all = Vec::new();
        for s in states.iter().filter(|s| !s.is_empty()) {
            let (partitions, event_time) = decode_snapshot(s)?;
            all.extend(partitions);
            self.restored_event_time.extend(event_time);
        }
        self.restored = Some(all);
        Ok(())
    }

    fn open(&mut self, _ctx: &SourceContext) -> weir_core::Result<()> {
        if self.cfg.deserializer.is_none() {
            return Err(KafkaError::Config(format!(
                "the Kafka source for {:?} has no deserializer; call .deserializer(...)",
                self.cfg.topics
            ))
            .into());
        }
        if self.cfg.topics.is_empty() {
            return Err(KafkaError::Config("the Kafka source names no topics".into()).into());
        }
        if let Some(dlq) = &self.cfg.dead_letter {
            admin::partitions(&self.cfg.brokers, dlq)?;
        }
        let c: BaseConsumer = self
            .consumer_config()
            .create()
            .map_err(|e| KafkaError::Config(format!("cannot create a Kafka consumer: {e}")))?;
        self.consumer = Some(Arc::new(c));
        self.assign()?;
        self.probe = Some(lag::Probe::start(
            &self.cfg.brokers,
            self.cfg.read_committed,
            self.parts.iter().map(|p| p.gauges.clone()).collect(),
        ));
        Ok(())
    }

    fn poll(&mut self, out: &mut SourceOutput<'_, T>) -> weir_core::Result<SourceStatus> {
        if self.parts.iter().all(|p| p.done) && (self.cfg.bounded || self.parts.is_empty()) {
            if self.cfg.bounded {
                return Ok(SourceStatus::Finished);
            }
            self.emit_watermark(out)?;
            return Ok(SourceStatus::Idle(100));
        }
        let deser = self.cfg.deserializer.clone().expect("checked in open");
        let mut n = 0;
        let consumer = self.consumer.clone().expect("opened");
        // One clock read per batch, not per record: idleness is measured in seconds.
        let now = Instant::now();
        while n < SOURCE_BATCH {
            let Some(msg) = consumer.poll(Duration::ZERO) else {
                break;
            };
            match msg {
                Ok(m) => {
                    let Some(i) = self.part_index(m.topic(), m.partition()) else {
                        continue;
                    };
                    // Paused by alignment (fetched before the pause took effect), or read
                    // again after a resume: not emitted now.
                    if self.partition_paused(i) || m.offset() < self.parts[i].state.next {
                        continue;
                    }
                    let part = &mut self.parts[i];
                    if part.done || part.state.end.is_some_and(|e| m.offset() >= e) {
                        part.done = true;
                        continue;
                    }
                    part.state.next = m.offset() + 1;
                    let ts = m.timestamp().to_millis();
                    let rec = KafkaRecord {
                        topic: m.topic(),
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m.key(),
                        value: m.payload(),
                        timestamp: ts,
                    };
                    match deser(&rec) {
                        Ok(v) => {
                            let part = &mut self.parts[i];
                            part.last_record = now;
                            if let Some(ts) = ts {
                                part.max_ts = part.max_ts.max(ts);
                            }
                            if part.state.end.is_some_and(|e| part.state.next >= e) {
                                part.done = true;
                            }
                            out.emit_at(v, ts.unwrap_or(NO_TIMESTAMP))?;
                        }
                        Err(e) => {
                            self.dead_letter(&rec, &e)?;
                            let part = &mut self.parts[i];
                            if part.state.end.is_some_and(|e| part.state.next >= e) {
                                part.done = true;
                            }
                        }
                    }
                    n += 1;
                }
                Err(RdError::PartitionEOF(p)) => self.check_eof(p),
                Err(RdError::MessageConsumption(
                    code @ (RDKafkaErrorCode::OffsetOutOfRange
                    | RDKafkaErrorCode::AutoOffsetReset
                    | RDKafkaErrorCode::UnknownTopicOrPartition
                    | RDKafkaErrorCode::TopicAuthorizationFailed),
                )) => {
                    let positions: Vec<String> = self
                        .parts
                        .iter()
                        .filter(|p| !p.done)
                        .map(|p| {
                            format!("{}/{}@{}", p.state.topic, p.state.partition, p.state.next)
                        })
                        .collect();
                    return Err(KafkaError::Broker(format!(
                        "reading {positions:?} from {}: {code}. If the offset is out of range, \
                         retention removed records this job has not read yet: they cannot be \
                         recovered from Kafka",
                        self.cfg.brokers
                    ))
                    .into());
                }
                Err(e) => {
                    // Transport errors are retried by librdkafka; report and go on.
                    tracing::warn!("Kafka source: {e}");
                }
            }
        }
        self.publish_positions();
        self.emit_watermark(out)?;
        self.align_partitions()?;
        if n == 0 {
            if self.cfg.bounded && self.parts.iter().all(|p| p.done) {
                return Ok(SourceStatus::Finished);
            }
            return Ok(SourceStatus::Idle(1));
        }
        Ok(SourceStatus::More)
    }

    fn snapshot(&mut self) -> weir_core::Result<Option<(Vec<u8>, String)>> {
        if let Some(p) = &self.dead_letters {
            flush(p)?;
            take_deliveries(p)?;
        }
        let partitions: Vec<PartState> = self.parts.iter().map(|p| p.state.clone()).collect();
        let mut tpl = TopicPartitionList::new();
        for p in &partitions {
            let _ = tpl.add_partition_offset(&p.topic, p.partition, Offset::Offset(p.next));
        }
        self.snapshots.push_back(tpl);
        while self.snapshots.len() > 16 {
            self.snapshots.pop_front();
        }
        let summary = partitions
            .iter()
            .map(|p| match p.end {
                Some(e) => format!("{}/{}@{} (end {e})", p.topic, p.partition, p.next),
                None => format!("{}/{}@{}", p.topic, p.partition, p.next),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let event_time: Vec<PartEventTime> = self
            .parts
            .iter()
            .filter(|p| p.max_ts != MIN_WATERMARK)
            .map(|p| PartEventTime {
                topic: p.state.topic.clone(),
                partition: p.state.partition,
                max_ts: p.max_ts,
            })
            .collect();
        Ok(Some((encode_snapshot(partitions, &event_time)?, summary)))
    }

    fn notify_complete(&mut self, _id: CheckpointId) -> weir_core::Result<()> {
        // Monitoring only: the checkpoint holds the offsets that count.
        if let (Some(tpl), Some(c)) = (self.snapshots.pop_front(), &self.consumer)
            && tpl.count() > 0
            && let Err(e) = c.commit(&tpl, CommitMode::Sync)
        {
            tracing::debug!("committing offsets for monitoring: {e}");
        }
        Ok(())
    }
}
