//! The Kafka I/O the sink shares with the source and the dead-letter queue: producers that
//! report their deliveries, sending and flushing, and reading partitions to their end.

use crate::{KafkaError, Result};
use rdkafka::ClientConfig;
use rdkafka::ClientContext;
use rdkafka::Offset;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError as RdError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a commit, a flush or fencing may take before the sink gives up.
pub(crate) const KAFKA_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(crate) struct Deliveries {
    first: BTreeMap<i32, i64>,
    marker: Option<(i32, i64)>,
    error: Option<String>,
}

pub(crate) struct DeliveryContext {
    pub(crate) d: Mutex<Deliveries>,
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", "{fac}: {log_message}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", "{fac}: {log_message}")
            }
            _ => tracing::debug!(target: "librdkafka", "{fac}: {log_message}"),
        }
    }
}

/// Delivery opaque: 0 for a data record, 1 for a commit marker.
impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = usize;
    fn delivery(&self, r: &DeliveryResult<'_>, kind: usize) {
        let mut d = self.d.lock().unwrap_or_else(|p| p.into_inner());
        match r {
            Ok(m) if kind == 1 => d.marker = Some((m.partition(), m.offset())),
            Ok(m) => {
                let e = d.first.entry(m.partition()).or_insert(m.offset());
                *e = (*e).min(m.offset());
            }
            Err((e, m)) => {
                if d.error.is_none() {
                    d.error = Some(format!(
                        "delivery to {}/{} failed: {e}",
                        m.topic(),
                        m.partition()
                    ));
                }
            }
        }
    }
}

pub(crate) type Prod = BaseProducer<DeliveryContext>;

pub(crate) fn read_consumer(brokers: &str, isolation: &str) -> Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "weir-sink-recovery")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("fetch.queue.backoff.ms", "10")
        .set("auto.offset.reset", "error")
        .set("isolation.level", isolation)
        .create()
        .map_err(|e| KafkaError::Config(format!("cannot create a Kafka consumer: {e}")))
}

/// How [`read_to_end`] stopped.
pub(crate) enum ReadEnd {
    /// Every partition reached its end offset, or the caller had what it needed.
    Done,
    /// The time ran out; these partitions had not reached their end.
    TimedOut(Vec<i32>),
}

/// Reads the partitions of `topic` that `c` is assigned until each reached its end offset
/// in `ends` (a record just before it, or the end of the partition at a position at or past
/// it: control records and aborted records never arrive as records), `on_record` returns
/// false, or `limit` passes.
pub(crate) fn read_to_end(
    c: &BaseConsumer,
    topic: &str,
    mut ends: BTreeMap<i32, i64>,
    limit: Duration,
    mut on_record: impl FnMut(&BorrowedMessage<'_>) -> bool,
) -> std::result::Result<ReadEnd, RdError> {
    let deadline = Instant::now() + limit;
    while !ends.is_empty() {
        if Instant::now() > deadline {
            return Ok(ReadEnd::TimedOut(ends.keys().copied().collect()));
        }
        match c.poll(Duration::from_millis(100)) {
            None => {}
            Some(Ok(m)) => {
                let more = on_record(&m);
                if ends
                    .get(&m.partition())
                    .is_some_and(|end| m.offset() + 1 >= *end)
                {
                    ends.remove(&m.partition());
                }
                if !more {
                    return Ok(ReadEnd::Done);
                }
            }
            Some(Err(RdError::PartitionEOF(p))) => {
                let pos = position(c, topic, p);
                if ends
                    .get(&p)
                    .is_some_and(|end| pos.is_some_and(|o| o >= *end))
                {
                    ends.remove(&p);
                }
            }
            Some(Err(e)) => return Err(e),
        }
    }
    Ok(ReadEnd::Done)
}

pub(crate) fn position(c: &BaseConsumer, topic: &str, partition: i32) -> Option<i64> {
    let tpl = c.position().ok()?;
    match tpl.find_partition(topic, partition)?.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// Joins scoped threads that each made a producer, in order; the first error wins.
pub(crate) fn join_all(
    handles: Vec<std::thread::ScopedJoinHandle<'_, Result<Prod>>>,
) -> Result<Vec<Prod>> {
    handles
        .into_iter()
        .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        .collect()
}

pub(crate) fn send(producer: &Prod, mut r: BaseRecord<'_, [u8], [u8], usize>) -> Result<()> {
    loop {
        match producer.send(r) {
            Ok(()) => return Ok(()),
            Err((RdError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                r = back;
                producer.poll(Duration::from_millis(5));
            }
            Err((e, back)) => {
                return Err(KafkaError::Broker(format!(
                    "producing to {}: {e}",
                    back.topic
                )));
            }
        }
    }
}

pub(crate) fn flush(producer: &Prod) -> Result<()> {
    producer
        .flush(KAFKA_TIMEOUT)
        .map_err(|e| KafkaError::Broker(format!("flushing the producer: {e}")))
}

pub(crate) fn reset(producer: &Prod) {
    let mut d = producer
        .context()
        .d
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    *d = Deliveries::default();
}

pub(crate) type DeliveredOffsets = (BTreeMap<i32, i64>, Option<(i32, i64)>);

pub(crate) fn take_deliveries(producer: &Prod) -> Result<DeliveredOffsets> {
    let mut d = producer
        .context()
        .d
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let d = std::mem::take(&mut *d);
    if let Some(e) = d.error {
        return Err(KafkaError::Broker(e));
    }
    Ok((d.first, d.marker))
}

/// Creates a producer whose delivery reports [`take_deliveries`] collects.
pub(crate) fn reporting_producer(c: &ClientConfig) -> Result<Prod> {
    c.create_with_context(DeliveryContext {
        d: Mutex::new(Deliveries::default()),
    })
    .map_err(|e| KafkaError::Config(format!("cannot create a Kafka producer: {e}")))
}
