//! The Kafka sink: exactly-once through transactions tied to checkpoints, or at-least-once.
//!
//! Exactly-once, per subtask (see `docs/kafka.md` and `docs/decisions/0012-kafka-sink-recovery.md`):
//! - records of an epoch go out in one transaction of a small pool of transactional
//!   producers (`{prefix}-{subtask}-{slot}`), each with a header naming the subtask, the
//!   transaction's token and the record's sequence number;
//! - at the barrier of checkpoint `n` (pre-commit): a commit marker (key `{prefix}/{subtask}`,
//!   value `n`) joins the transaction, every delivery is confirmed, and the checkpoint keeps
//!   `{n, slot, token, record count, first offset per partition, marker offset}`;
//! - when checkpoint `n` completes: the pending transactions up to `n` commit, oldest first;
//! - on restore: every transactional id of the pool is fenced, the marker topic tells which
//!   pending epochs committed, and each that did not is read back from the log
//!   (`read_uncommitted`: aborted records stay in the log) and re-produced, in order, in a new
//!   transaction with its marker — before the job processes anything.

use crate::admin;
use crate::txn::{
    self, EpochCollector, PendingEpoch, Registered, SinkSnapshot, TXN_HEADER, TxnBook, decide,
    marker_key, plan_recovery_with, transactional_id,
};
use crate::{KafkaError, Result};
use rdkafka::ClientConfig;
use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError as RdError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weir_core::failpoint;
use weir_core::ids::CheckpointId;
use weir_core::prelude::{SinkContext, SinkFunction};
use weir_core::time::{NO_TIMESTAMP, Timestamp};

/// What the sink promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryGuarantee {
    /// Transactions committed when checkpoints complete; `read_committed` readers see every
    /// record exactly once.
    ExactlyOnce,
    /// An idempotent producer flushed at every barrier: nothing lost, duplicates possible
    /// after a failure.
    AtLeastOnce,
}

type Serializer<T> = Arc<dyn Fn(&T) -> (Option<Vec<u8>>, Vec<u8>) + Send + Sync>;

/// A Kafka sink's configuration; [`KafkaSink::factory`] makes its subtasks.
///
/// ```
/// use weir_kafka::{DeliveryGuarantee, KafkaSink};
/// use std::time::Duration;
/// let sink = KafkaSink::new("127.0.0.1:9092", "sums", "sums-job")
///     .serializer(|(k, v): &(String, i64)| (Some(k.as_bytes().to_vec()), v.to_string().into_bytes()))
///     .transaction_timeout(Duration::from_secs(60))
///     .pool_size(3);
/// assert_eq!(sink.guarantee(), DeliveryGuarantee::ExactlyOnce);
/// ```
pub struct KafkaSink<T> {
    brokers: String,
    topic: String,
    prefix: String,
    marker_topic: Option<String>,
    guarantee: DeliveryGuarantee,
    pool: u32,
    transaction_timeout: Duration,
    props: Vec<(String, String)>,
    accept_newer: bool,
    serializer: Option<Serializer<T>>,
}

impl<T> Clone for KafkaSink<T> {
    fn clone(&self) -> Self {
        KafkaSink {
            brokers: self.brokers.clone(),
            topic: self.topic.clone(),
            prefix: self.prefix.clone(),
            marker_topic: self.marker_topic.clone(),
            guarantee: self.guarantee,
            pool: self.pool,
            transaction_timeout: self.transaction_timeout,
            props: self.props.clone(),
            accept_newer: self.accept_newer,
            serializer: self.serializer.clone(),
        }
    }
}

/// How long a commit, a flush or fencing may take before the sink gives up.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(60);

impl<T: 'static> KafkaSink<T> {
    /// A sink writing `topic` on `brokers`, exactly once. `transactional_id_prefix` names
    /// this sink's transactions: keep it stable across restarts of the job and unique among
    /// the jobs writing to the cluster.
    pub fn new(brokers: &str, topic: &str, transactional_id_prefix: &str) -> Self {
        KafkaSink {
            brokers: brokers.to_string(),
            topic: topic.to_string(),
            prefix: transactional_id_prefix.to_string(),
            marker_topic: None,
            guarantee: DeliveryGuarantee::ExactlyOnce,
            pool: 3,
            transaction_timeout: Duration::from_secs(900),
            props: Vec::new(),
            accept_newer: false,
            serializer: None,
        }
    }

    /// Turns a record into its Kafka key (optional) and value.
    pub fn serializer(
        mut self,
        f: impl Fn(&T) -> (Option<Vec<u8>>, Vec<u8>) + Send + Sync + 'static,
    ) -> Self {
        self.serializer = Some(Arc::new(f));
        self
    }

    /// Chooses exactly-once (the default) or at-least-once.
    pub fn with_guarantee(mut self, g: DeliveryGuarantee) -> Self {
        self.guarantee = g;
        self
    }

    /// The configured guarantee.
    pub fn guarantee(&self) -> DeliveryGuarantee {
        self.guarantee
    }

    /// Transactional producers per subtask (default 3, at least 1): how many epochs may
    /// wait for their checkpoints while the next one writes.
    pub fn pool_size(mut self, n: u32) -> Self {
        self.pool = n.max(1);
        self
    }

    /// `transaction.timeout.ms` (default 15 minutes, the broker's default maximum). Must not
    /// exceed the broker's `transaction.max.timeout.ms` and must cover the checkpoint
    /// interval plus the checkpoint timeout; both are checked at start-up.
    pub fn transaction_timeout(mut self, d: Duration) -> Self {
        self.transaction_timeout = d;
        self
    }

    /// The topic of commit markers (default `weir-markers.{prefix}`, created with one
    /// partition if missing).
    pub fn marker_topic(mut self, topic: &str) -> Self {
        self.marker_topic = Some(topic.to_string());
        self
    }

    /// Sets a librdkafka producer property (for example `linger.ms`). `acks` must stay
    /// `all` and `enable.idempotence` `true`; start-up refuses other values.
    pub fn set(mut self, key: &str, value: &str) -> Self {
        self.props.push((key.to_string(), value.to_string()));
        self
    }

    /// Accepts, on restore, that the markers show output of a checkpoint newer than the one
    /// restored as already committed (the newest checkpoint was lost or an older savepoint
    /// is restored): that output is then written again — an at-least-once restore, said so
    /// in the log. Off by default: such a restore fails with an explanation.
    pub fn accept_newer_commits_on_restore(mut self) -> Self {
        self.accept_newer = true;
        self
    }

    fn marker_topic_name(&self) -> String {
        self.marker_topic
            .clone()
            .unwrap_or_else(|| format!("weir-markers.{}", self.prefix))
    }

    /// The factory to pass to `Stream::sink`.
    pub fn factory(&self) -> impl Fn() -> KafkaSinkFunction<T> + Send + Sync + 'static {
        let cfg = self.clone();
        move || KafkaSinkFunction::new(cfg.clone())
    }
}

#[derive(Default)]
pub(crate) struct Deliveries {
    first: BTreeMap<i32, i64>,
    marker: Option<(i32, i64)>,
    error: Option<String>,
}

pub(crate) struct DeliveryContext {
    d: Mutex<Deliveries>,
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

/// One subtask of a [`KafkaSink`].
pub struct KafkaSinkFunction<T> {
    cfg: KafkaSink<T>,
    lineage: u32,
    parallelism: u32,
    checkpointing: bool,
    producers: Vec<Prod>,
    book: TxnBook,
    restored: Option<(u64, Vec<SinkSnapshot>)>,
    marker_topic: String,
    marker_partitions: i32,
    since_poll: u32,
}

impl<T: 'static> KafkaSinkFunction<T> {
    fn new(cfg: KafkaSink<T>) -> Self {
        let marker_topic = cfg.marker_topic_name();
        KafkaSinkFunction {
            book: TxnBook::new(0, cfg.pool),
            cfg,
            lineage: 0,
            parallelism: 1,
            checkpointing: false,
            producers: Vec::new(),
            restored: None,
            marker_topic,
            marker_partitions: 1,
            since_poll: 0,
        }
    }

    fn base_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        let txn_ms = self.cfg.transaction_timeout.as_millis().max(1000) as u64;
        c.set("bootstrap.servers", &self.cfg.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            // Output becomes visible at checkpoint completion anyway: fewer, larger
            // batches cost the broker (which shares the machine) far less CPU.
            .set("linger.ms", "50")
            .set("batch.num.messages", "100000")
            .set("batch.size", "4000000")
            .set("message.timeout.ms", txn_ms.min(300_000).to_string())
            .set("transaction.timeout.ms", txn_ms.to_string())
            .set("partitioner", "murmur2_random");
        for (k, v) in &self.cfg.props {
            c.set(k, v);
        }
        c
    }

    fn producer(&self, transactional_id: Option<&str>) -> Result<Prod> {
        let mut c = self.base_config();
        if let Some(id) = transactional_id {
            c.set("transactional.id", id);
        }
        c.create_with_context(DeliveryContext {
            d: Mutex::new(Deliveries::default()),
        })
        .map_err(|e| KafkaError::Config(format!("cannot create a Kafka producer: {e}")))
    }

    /// Checks the settings against each other and against the broker.
    fn validate(&self, ctx: &SinkContext) -> Result<()> {
        for (k, v) in &self.cfg.props {
            let bad = match k.as_str() {
                "acks" | "request.required.acks" => !matches!(v.as_str(), "all" | "-1"),
                "enable.idempotence" => v != "true",
                "transactional.id" => true,
                _ => false,
            };
            if bad {
                return Err(KafkaError::Config(format!(
                    "the Kafka sink needs acks=all and enable.idempotence=true and sets \
                     transactional.id itself; remove the setting {k}={v}"
                )));
            }
        }
        if self.cfg.serializer.is_none() {
            return Err(KafkaError::Config(format!(
                "the Kafka sink for topic '{}' has no serializer; call .serializer(...)",
                self.cfg.topic
            )));
        }
        admin::partitions(&self.cfg.brokers, &self.cfg.topic)?;
        if self.cfg.guarantee != DeliveryGuarantee::ExactlyOnce {
            return Ok(());
        }
        let txn = self.cfg.transaction_timeout;
        if let Some((interval, timeout)) = ctx.checkpoint_timing {
            let needed = interval + timeout;
            if txn < needed {
                return Err(KafkaError::Config(format!(
                    "transaction.timeout.ms ({} ms) is shorter than the checkpoint interval plus \
                     the checkpoint timeout ({} ms + {} ms): a transaction must outlive the \
                     checkpoint that commits it; raise the sink's transaction_timeout or shorten \
                     the checkpoint interval/timeout",
                    txn.as_millis(),
                    interval.as_millis(),
                    timeout.as_millis()
                )));
            }
        }
        if let Some(max) = admin::broker_setting(&self.cfg.brokers, "transaction.max.timeout.ms")?
            && let Ok(max) = max.parse::<u128>()
            && txn.as_millis() > max
        {
            return Err(KafkaError::Config(format!(
                "transaction.timeout.ms ({} ms) exceeds the broker's transaction.max.timeout.ms \
                 ({max} ms); lower the sink's transaction_timeout or raise the broker setting",
                txn.as_millis()
            )));
        }
        Ok(())
    }

    /// Creates the producer of a transactional id and initialises it, which fences every
    /// earlier producer of that id and aborts its open transaction.
    fn init_producer(&self, id: &str, what: &str) -> Result<Prod> {
        let p = self.producer(Some(id))?;
        p.init_transactions(KAFKA_TIMEOUT)
            .map_err(|e| KafkaError::Broker(format!("{what} transactional id '{id}': {e}")))?;
        Ok(p)
    }

    fn open_exactly_once(&mut self, ctx: &SinkContext) -> Result<()> {
        let restored = self.restored.take();
        let own: Vec<String> = (0..self.cfg.pool)
            .map(|s| transactional_id(&self.cfg.prefix, self.lineage, s))
            .collect();
        // Validation first: an unreachable broker or a wrong setting fails here within the
        // metadata timeout, before anything waits on the longer transaction timeouts.
        self.validate(ctx)?;
        // Initialising a transactional id takes the broker a few hundred milliseconds
        // (coordinator look-up, then InitProducerId). This subtask's own ids do not depend
        // on anything below, so they are initialised meanwhile, and the ids to fence all at
        // once; nothing is written before every one of them is done.
        let this = &*self;
        let (prepared, inited) = std::thread::scope(|s| {
            let inited: Vec<_> = own
                .iter()
                .map(|id| s.spawn(move || this.init_producer(id, "initialising")))
                .collect();
            let prepared = (|| {
                admin::ensure_topic(&this.cfg.brokers, &this.marker_topic, 1, &[])?;
                let marker_partitions =
                    admin::partitions(&this.cfg.brokers, &this.marker_topic)?.len() as i32;
                // Runs announce their parallelism before they write (below), so lineages of
                // a run that crashed before its first checkpoint are fenced too.
                let registered = this.registered()?;
                let plan = plan_recovery_with(
                    &this.cfg.prefix,
                    restored.as_ref().map(|r| r.1.as_slice()).unwrap_or(&[]),
                    this.lineage,
                    this.parallelism,
                    this.cfg.pool,
                    registered,
                );
                // Fencing: ids of lineages this subtask takes over from a previous run. Their
                // producers are dropped once initialised: the bumped epoch is the fence.
                let fenced: Vec<_> = plan
                    .fence
                    .iter()
                    .filter(|id| !own.contains(id))
                    .map(|id| {
                        let id = id.clone();
                        s.spawn(move || this.init_producer(&id, "fencing"))
                    })
                    .collect();
                join_all(fenced)?;
                // Subtask 0 announces this run before any transaction of it begins: sources
                // emit nothing until every task has opened, and transactions begin with the
                // first record.
                let this_run = Registered {
                    parallelism: this.parallelism,
                    pool: this.cfg.pool,
                };
                if this.lineage == 0 && registered.max(this_run) != registered {
                    this.register(registered.max(this_run))?;
                }
                Ok::<_, KafkaError>((marker_partitions, plan))
            })();
            (prepared, join_all(inited))
        });
        // An error of the marker topic or the registry explains more than the
        // initialisation error it may cause.
        let (marker_partitions, plan) = prepared?;
        self.producers = inited?;
        self.marker_partitions = marker_partitions;
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
            ^ (u64::from(std::process::id()) << 32);
        self.book = TxnBook::new(self.lineage, self.cfg.pool).with_run_id(seed);
        let Some((checkpoint, _)) = restored else {
            return Ok(());
        };
        for l in &plan.lineages {
            // A lineage that never committed before the checkpoint has no marker offset to
            // start from: scan its markers from the start of the marker topic, so output a
            // newer run already committed is still noticed.
            let scan_from: Vec<(i32, i64)> = if l.scan_from.is_empty() {
                (0..self.marker_partitions).map(|p| (p, -1)).collect()
            } else {
                l.scan_from.clone()
            };
            let (newest, newest_at) = self.scan_markers(l.lineage, &scan_from)?;
            let d = decide(
                l.lineage,
                &l.pending,
                newest,
                checkpoint,
                self.cfg.accept_newer,
            )
            .map_err(|e| KafkaError::Recovery(e.to_string()))?;
            if newest.is_some_and(|n| n > checkpoint) {
                eprintln!(
                    "[weir] kafka sink '{}': subtask {} already committed output of checkpoint {} \
                     (newer than restored checkpoint {checkpoint}); accepted by configuration: \
                     that output will be written again (at-least-once restore)",
                    self.cfg.prefix,
                    l.lineage,
                    newest.unwrap_or_default()
                );
            }
            let mut last_marker = newest_at;
            for e in &d.replay {
                last_marker = Some(self.replay(l.lineage, e)?);
            }
            if !d.committed.is_empty() || !d.replay.is_empty() {
                eprintln!(
                    "[weir] kafka sink '{}': subtask {} restored; committed before the crash: \
                     {:?}; re-produced: {:?}",
                    self.cfg.prefix,
                    l.lineage,
                    d.committed,
                    d.replay.iter().map(|e| e.epoch).collect::<Vec<_>>()
                );
            }
            if l.lineage == self.lineage {
                self.book.set_last_committed_marker(last_marker);
            }
        }
        Ok(())
    }

    /// The registry: the offset metadata of the marker topic's partition 0 in the consumer
    /// group `{prefix}.weir-sink` (durable, tiny, and readable without scanning a topic).
    fn registry_client(&self) -> Result<BaseConsumer> {
        ClientConfig::new()
            .set("bootstrap.servers", &self.cfg.brokers)
            .set("group.id", format!("{}.weir-sink", self.cfg.prefix))
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| KafkaError::Config(format!("cannot create a Kafka consumer: {e}")))
    }

    /// The largest parallelism and pool any run of this sink announced.
    fn registered(&self) -> Result<Registered> {
        let c = self.registry_client()?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.marker_topic, 0);
        let got = c
            .committed_offsets(tpl, admin::REQUEST_TIMEOUT)
            .map_err(|e| {
                KafkaError::Broker(format!(
                    "reading the sink's registry (group {}.weir-sink): {e}",
                    self.cfg.prefix
                ))
            })?;
        Ok(got
            .find_partition(&self.marker_topic, 0)
            .map(|e| Registered::parse(e.metadata()))
            .unwrap_or_default())
    }

    fn register(&self, r: Registered) -> Result<()> {
        let c = self.registry_client()?;
        let mut tpl = TopicPartitionList::new();
        let mut e = tpl.add_partition(&self.marker_topic, 0);
        e.set_offset(Offset::Offset(0))
            .map_err(|er| KafkaError::Broker(er.to_string()))?;
        e.set_metadata(r.to_text());
        c.commit(&tpl, CommitMode::Sync).map_err(|er| {
            KafkaError::Broker(format!(
                "writing the sink's registry (group {}.weir-sink): {er}",
                self.cfg.prefix
            ))
        })
    }

    /// Reads a lineage's committed markers from `scan_from` to the end of the marker topic;
    /// returns the newest committed epoch and where its marker is.
    fn scan_markers(&self, lineage: u32, scan_from: &[(i32, i64)]) -> Result<NewestMarker> {
        if scan_from.is_empty() {
            return Ok((None, None));
        }
        let key = marker_key(&self.cfg.prefix, lineage);
        let c = read_consumer(&self.cfg.brokers, "read_committed")?;
        let mut tpl = TopicPartitionList::new();
        let mut ends = BTreeMap::new();
        for &(p, from) in scan_from {
            let (low, high) = admin::watermarks(&self.cfg.brokers, &self.marker_topic, p)?;
            // -1: from wherever the partition starts now.
            let from = if from < 0 { low } else { from };
            if low > from {
                return Err(KafkaError::Recovery(format!(
                    "the commit markers of subtask {lineage} at {}/{p} from offset {from} were \
                     removed by retention (the partition now starts at {low}); cannot tell which \
                     transactions committed. Raise the marker topic's retention",
                    self.marker_topic
                )));
            }
            if from < high {
                tpl.add_partition_offset(&self.marker_topic, p, Offset::Offset(from))
                    .map_err(|e| KafkaError::Broker(e.to_string()))?;
                ends.insert(p, high);
            }
        }
        if ends.is_empty() {
            return Ok((None, None));
        }
        c.assign(&tpl)
            .map_err(|e| KafkaError::Broker(format!("assigning {}: {e}", self.marker_topic)))?;
        let mut newest: Option<(u64, (i32, i64))> = None;
        let end = read_to_end(&c, &self.marker_topic, ends, KAFKA_TIMEOUT, |m| {
            if m.key() == Some(key.as_bytes())
                && let Some(v) = m.payload().and_then(|v| std::str::from_utf8(v).ok())
                && let Ok(epoch) = v.parse::<u64>()
                && newest.is_none_or(|(n, _)| epoch >= n)
            {
                newest = Some((epoch, (m.partition(), m.offset())));
            }
            true
        })
        .map_err(|e| {
            KafkaError::Broker(format!(
                "reading commit markers from {}: {e}",
                self.marker_topic
            ))
        })?;
        if let ReadEnd::TimedOut(left) = end {
            return Err(KafkaError::Recovery(format!(
                "reading commit markers from {} did not reach the end of partitions {left:?} in \
                 {}s: is another transaction open on that topic?",
                self.marker_topic,
                KAFKA_TIMEOUT.as_secs()
            )));
        }
        Ok((newest.map(|n| n.0), newest.map(|n| n.1)))
    }

    /// Reads an epoch that did not commit back from the log and writes it again, with its
    /// marker, in one transaction. Returns where the new marker went.
    fn replay(&mut self, lineage: u32, e: &PendingEpoch) -> Result<(i32, i64)> {
        let topic = self.cfg.topic.clone();
        let c = read_consumer(&self.cfg.brokers, "read_uncommitted")?;
        let mut tpl = TopicPartitionList::new();
        let mut ends = BTreeMap::new();
        for &(p, from) in &e.first_offsets {
            let (low, high) = admin::watermarks(&self.cfg.brokers, &topic, p)?;
            if low > from {
                return Err(KafkaError::Recovery(format!(
                    "records of checkpoint {} (subtask {lineage}) in {topic}/{p} from offset \
                     {from} were removed by retention (the partition now starts at {low}); they \
                     were never committed and cannot be re-produced. Output of that checkpoint \
                     is lost unless restored from elsewhere; raise the topic's retention.ms",
                    e.epoch
                )));
            }
            tpl.add_partition_offset(&topic, p, Offset::Offset(from))
                .map_err(|er| KafkaError::Broker(er.to_string()))?;
            ends.insert(p, high);
        }
        type Rec = (i32, Option<Vec<u8>>, Option<Vec<u8>>, Option<i64>);
        let mut col: EpochCollector<Rec> = EpochCollector::new(lineage, e.token, e.records);
        if !ends.is_empty() {
            c.assign(&tpl)
                .map_err(|er| KafkaError::Broker(format!("assigning {topic}: {er}")))?;
        }
        if !col.is_complete() {
            // A timeout leaves records missing, which `finish` reports below.
            read_to_end(&c, &topic, ends, KAFKA_TIMEOUT * 5, |m| {
                if let Some(h) = m.headers()
                    && let Some(v) = h.iter().find(|h| h.key == TXN_HEADER).and_then(|h| h.value)
                {
                    col.offer(v, || {
                        (
                            m.partition(),
                            m.key().map(<[u8]>::to_vec),
                            m.payload().map(<[u8]>::to_vec),
                            m.timestamp().to_millis(),
                        )
                    });
                }
                !col.is_complete()
            })
            .map_err(|er| KafkaError::Broker(format!("reading back {topic}: {er}")))?;
        }
        let records = col.finish().map_err(|missing| {
            KafkaError::Recovery(format!(
                "checkpoint {} of subtask {lineage} pre-committed {} records to {topic}, but \
                 records {missing:?} are no longer in the log (retention or a deleted topic?); \
                 refusing to resume with a gap in the output",
                e.epoch, e.records
            ))
        })?;
        let producer = &self.producers[0];
        producer
            .begin_transaction()
            .map_err(|er| KafkaError::Broker(format!("begin transaction: {er}")))?;
        reset(producer);
        for (seq, (p, k, v, ts)) in records.iter().enumerate() {
            let h = txn::encode_header(lineage, e.token, seq as u64);
            let headers = OwnedHeaders::new_with_capacity(1).insert(Header {
                key: TXN_HEADER,
                value: Some(&h[..]),
            });
            let mut r: BaseRecord<'_, [u8], [u8], usize> = BaseRecord::with_opaque_to(&topic, 0)
                .partition(*p)
                .headers(headers);
            if let Some(k) = k {
                r = r.key(&k[..]);
            }
            if let Some(v) = v {
                r = r.payload(&v[..]);
            }
            if let Some(ts) = ts {
                r = r.timestamp(*ts);
            }
            send(producer, r)?;
            if seq == records.len() / 2 {
                failpoint::hit("kafka.during_replay");
            }
        }
        let key = marker_key(&self.cfg.prefix, lineage);
        let value = e.epoch.to_string();
        send(
            producer,
            BaseRecord::with_opaque_to(&self.marker_topic, 1)
                .partition(e.marker.0.min(self.marker_partitions - 1))
                .key(key.as_bytes())
                .payload(value.as_bytes()),
        )?;
        flush(producer)?;
        let marker = take_deliveries(producer)?.1.ok_or_else(|| {
            KafkaError::Broker("the commit marker's delivery was not reported".into())
        })?;
        producer
            .commit_transaction(KAFKA_TIMEOUT)
            .map_err(|er| KafkaError::Broker(format!("committing the re-produced epoch: {er}")))?;
        eprintln!(
            "[weir] kafka sink '{}': re-produced {} records of checkpoint {} (subtask {lineage}), \
             which was pre-committed but not committed before the failure",
            self.cfg.prefix, e.records, e.epoch
        );
        Ok(marker)
    }

    fn poll_some(&mut self) {
        self.since_poll += 1;
        if self.since_poll >= 512 {
            self.since_poll = 0;
            for p in &self.producers {
                p.poll(Duration::ZERO);
            }
        }
    }

    fn precommit(&mut self, epoch: u64) -> Result<()> {
        let Some(slot) = self.book.open_slot() else {
            return Ok(());
        };
        if self.book.open_records() == 0 {
            return Ok(());
        }
        let producer = &self.producers[slot as usize];
        let key = marker_key(&self.cfg.prefix, self.lineage);
        let value = epoch.to_string();
        send(
            producer,
            BaseRecord::with_opaque_to(&self.marker_topic, 1)
                .partition(self.lineage as i32 % self.marker_partitions)
                .key(key.as_bytes())
                .payload(value.as_bytes()),
        )?;
        flush(producer)?;
        let (first, marker) = take_deliveries(producer)?;
        let marker = marker.ok_or_else(|| {
            KafkaError::Broker("the commit marker's delivery was not reported".into())
        })?;
        for (p, o) in first {
            self.book.delivered(p, o);
        }
        self.book
            .precommit(epoch, marker)
            .map_err(|e| KafkaError::Transaction(e.to_string()))?;
        Ok(())
    }

    fn commit_through(&mut self, checkpoint: u64) -> Result<()> {
        for (slot, epoch) in self.book.complete(checkpoint) {
            failpoint::hit("kafka.before_commit");
            if failpoint::armed("kafka.during_commit") {
                std::thread::spawn(|| failpoint::hit("kafka.during_commit"));
            }
            self.producers[slot as usize]
                .commit_transaction(KAFKA_TIMEOUT)
                .map_err(|e| {
                    KafkaError::Broker(format!(
                        "committing the transaction of checkpoint {epoch}: {e}; the job restarts \
                         and the restore re-produces it"
                    ))
                })?;
            self.book
                .committed(epoch)
                .map_err(|e| KafkaError::Transaction(e.to_string()))?;
            failpoint::hit("kafka.after_commit");
        }
        Ok(())
    }
}

fn read_consumer(brokers: &str, isolation: &str) -> Result<BaseConsumer> {
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
enum ReadEnd {
    /// Every partition reached its end offset, or the caller had what it needed.
    Done,
    /// The time ran out; these partitions had not reached their end.
    TimedOut(Vec<i32>),
}

/// Reads the partitions of `topic` that `c` is assigned until each reached its end offset
/// in `ends` (a record just before it, or the end of the partition at a position at or past
/// it: control records and aborted records never arrive as records), `on_record` returns
/// false, or `limit` passes.
fn read_to_end(
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

fn position(c: &BaseConsumer, topic: &str, partition: i32) -> Option<i64> {
    let tpl = c.position().ok()?;
    match tpl.find_partition(topic, partition)?.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// Joins scoped threads that each made a producer, in order; the first error wins.
fn join_all(handles: Vec<std::thread::ScopedJoinHandle<'_, Result<Prod>>>) -> Result<Vec<Prod>> {
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

fn reset(producer: &Prod) {
    let mut d = producer
        .context()
        .d
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    *d = Deliveries::default();
}

/// The newest committed epoch of a lineage and where its marker is.
type NewestMarker = (Option<u64>, Option<(i32, i64)>);

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

impl<T: 'static> SinkFunction<T> for KafkaSinkFunction<T> {
    fn restore(
        &mut self,
        checkpoint: CheckpointId,
        states: &[Vec<u8>],
        _ctx: &SinkContext,
    ) -> weir_core::Result<()> {
        let mut snaps = Vec::new();
        for s in states.iter().filter(|s| !s.is_empty()) {
            let (snap, _): (SinkSnapshot, usize) =
                bincode::serde::decode_from_slice(s, bincode::config::standard()).map_err(|e| {
                    KafkaError::Recovery(format!("the sink's checkpoint state is unreadable: {e}"))
                })?;
            if snap.version != txn::SNAPSHOT_VERSION {
                return Err(KafkaError::Recovery(format!(
                    "the sink's checkpoint state has version {}, this weir reads version {}",
                    snap.version,
                    txn::SNAPSHOT_VERSION
                ))
                .into());
            }
            snaps.push(snap);
        }
        self.restored = Some((checkpoint.0, snaps));
        Ok(())
    }

    fn open(&mut self, ctx: &SinkContext) -> weir_core::Result<()> {
        self.lineage = ctx.subtask as u32;
        self.parallelism = ctx.parallelism as u32;
        self.checkpointing = ctx.checkpointing;
        match self.cfg.guarantee {
            DeliveryGuarantee::ExactlyOnce => self.open_exactly_once(ctx)?,
            DeliveryGuarantee::AtLeastOnce => {
                self.validate(ctx)?;
                self.producers = vec![self.producer(None)?];
            }
        }
        Ok(())
    }

    fn invoke(&mut self, value: T, ts: Timestamp) -> weir_core::Result<()> {
        let ser = self.cfg.serializer.as_ref().expect("validated in open");
        let (key, payload) = ser(&value);
        let topic = &self.cfg.topic;
        let mut r: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(topic, 0).payload(&payload[..]);
        if let Some(k) = &key {
            r = r.key(&k[..]);
        }
        if ts != NO_TIMESTAMP {
            r = r.timestamp(ts);
        }
        let slot = match self.cfg.guarantee {
            DeliveryGuarantee::AtLeastOnce => 0,
            DeliveryGuarantee::ExactlyOnce => {
                let slot = match self.book.open_slot() {
                    Some(s) => s,
                    None => {
                        let s = self
                            .book
                            .begin()
                            .map_err(|e| KafkaError::Transaction(e.to_string()))?;
                        let p = &self.producers[s as usize];
                        p.begin_transaction()
                            .map_err(|e| KafkaError::Broker(format!("begin transaction: {e}")))?;
                        reset(p);
                        s
                    }
                };
                let token = self.book.open_token().expect("a transaction is open");
                let seq = self
                    .book
                    .next_seq()
                    .map_err(|e| KafkaError::Transaction(e.to_string()))?;
                let h = txn::encode_header(self.lineage, token, seq);
                r = r.headers(OwnedHeaders::new_with_capacity(1).insert(Header {
                    key: TXN_HEADER,
                    value: Some(&h[..]),
                }));
                slot
            }
        };
        send(&self.producers[slot as usize], r)?;
        self.poll_some();
        Ok(())
    }

    fn snapshot(
        &mut self,
        checkpoint: CheckpointId,
    ) -> weir_core::Result<Option<(Vec<u8>, String)>> {
        match self.cfg.guarantee {
            DeliveryGuarantee::AtLeastOnce => {
                let p = &self.producers[0];
                flush(p)?;
                take_deliveries(p)?;
                Ok(None)
            }
            DeliveryGuarantee::ExactlyOnce => {
                self.precommit(checkpoint.0)?;
                failpoint::hit("kafka.after_precommit");
                let snap = self.book.snapshot(self.parallelism);
                let summary = format!(
                    "pending transactions {:?}",
                    snap.pending
                        .iter()
                        .map(|p| (p.epoch, p.records))
                        .collect::<Vec<_>>()
                );
                let bytes = bincode::serde::encode_to_vec(&snap, bincode::config::standard())
                    .map_err(|e| weir_core::Error::Codec(e.to_string()))?;
                Ok(Some((bytes, summary)))
            }
        }
    }

    fn notify_complete(&mut self, checkpoint: CheckpointId) -> weir_core::Result<()> {
        if self.cfg.guarantee == DeliveryGuarantee::ExactlyOnce {
            self.commit_through(checkpoint.0)?;
        }
        Ok(())
    }

    fn finish(&mut self) -> weir_core::Result<()> {
        match self.cfg.guarantee {
            DeliveryGuarantee::AtLeastOnce => {
                let p = &self.producers[0];
                flush(p)?;
                take_deliveries(p)?;
            }
            DeliveryGuarantee::ExactlyOnce if !self.checkpointing => {
                // Without checkpoints the whole run is one epoch, committed at end of input.
                if let Some(slot) = self.book.open_slot() {
                    let p = &self.producers[slot as usize];
                    flush(p)?;
                    take_deliveries(p)?;
                    p.commit_transaction(KAFKA_TIMEOUT).map_err(|e| {
                        KafkaError::Broker(format!("committing at end of input: {e}"))
                    })?;
                }
            }
            DeliveryGuarantee::ExactlyOnce => {}
        }
        Ok(())
    }
}

/// Creates a producer whose delivery reports [`take_deliveries`] collects.
pub(crate) fn reporting_producer(c: &ClientConfig) -> Result<Prod> {
    c.create_with_context(DeliveryContext {
        d: Mutex::new(Deliveries::default()),
    })
    .map_err(|e| KafkaError::Config(format!("cannot create a Kafka producer: {e}")))
}
