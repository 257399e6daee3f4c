//! A changelog into a compacted Kafka topic: [`KafkaUpserts`] encodes each change as a record
//! keyed by the encoded key, with the new value or — for a delete — a null value (a
//! tombstone), and writes it through the [`KafkaSink`]'s transactions. It owns the topic
//! check (`cleanup.policy=compact`); the transactions are the sink's.

use crate::admin;
use crate::sink::{KafkaSink, KafkaSinkFunction};
use crate::{KafkaError, Result};
use std::sync::Arc;
use weir_core::changelog::Change;
use weir_core::ids::CheckpointId;
use weir_core::prelude::{SinkContext, SinkFunction};
use weir_core::time::Timestamp;

type Encoder<T> = Arc<dyn Fn(&T) -> Vec<u8> + Send + Sync>;

/// A Kafka sink for a changelog (`Stream<Change<K, V>>`) that keeps the latest value per key
/// in a compacted topic: an insert or update becomes a record with key = the encoded key
/// and value = the encoded new value; a delete becomes a **tombstone** (the key with a null
/// value), after which compaction drops the key. Write it with
/// [`Stream::sink_changes`](weir_core::dsl::Stream::sink_changes), which sends every change
/// of a key to one sink subtask; the producer's partitioner then sends every record of a
/// key to one partition, so a reader sees each key's changes in order.
///
/// It writes through the [`KafkaSink`]: exactly once with `read_committed` readers (Kafka
/// transactions committed when checkpoints complete), or at-least-once — tune it with
/// [`configure`](Self::configure). Every change is written (nothing is collapsed): the topic
/// is the table's changelog, and compaction keeps the latest record per key.
///
/// At start-up the topic is checked: a missing topic is created with
/// `cleanup.policy=compact` ([`partitions`](Self::partitions), default 1); an existing topic
/// whose `cleanup.policy` does not include `compact` fails the job with the command that
/// fixes it — unless [`allow_uncompacted`](Self::allow_uncompacted) turns that into a
/// warning (the topic then keeps every change until its retention deletes them, older
/// values and tombstones alike).
///
/// Keys and values are JSON by default; set [`key_encoder`](Self::key_encoder) and
/// [`value_encoder`](Self::value_encoder) for other formats.
///
/// ```no_run
/// use weir::prelude::*;
/// use weir_kafka::KafkaUpserts;
///
/// let prices = KafkaUpserts::<String, i64>::new("127.0.0.1:9092", "prices", "prices-job")
///     .key_encoder(|sku| sku.as_bytes().to_vec())
///     .value_encoder(|cents| cents.to_string().into_bytes())
///     .partitions(3);
///
/// let env = Env::new();
/// env.from_iter(vec![
///     Change::Insert { key: "apple".to_string(), value: 120 },
///     Change::Update { key: "apple".to_string(), old: 120, new: 99 },
///     Change::Delete { key: "apple".to_string(), old: 99 },
/// ])
/// .sink_changes("prices", prices.factory());
/// env.execute("prices").unwrap();
/// // "prices" holds apple=120, apple=99, apple=<null>; compacted: only the tombstone.
/// ```
pub struct KafkaUpserts<K, V> {
    sink: KafkaSink<Change<K, V>>,
    brokers: String,
    topic: String,
    partitions: i32,
    allow_uncompacted: bool,
    key: Encoder<K>,
    value: Encoder<V>,
}

impl<K, V> Clone for KafkaUpserts<K, V> {
    fn clone(&self) -> Self {
        KafkaUpserts {
            sink: self.sink.clone(),
            brokers: self.brokers.clone(),
            topic: self.topic.clone(),
            partitions: self.partitions,
            allow_uncompacted: self.allow_uncompacted,
            key: self.key.clone(),
            value: self.value.clone(),
        }
    }
}

impl<K, V> KafkaUpserts<K, V>
where
    K: serde::Serialize + 'static,
    V: serde::Serialize + 'static,
{
    /// Writes the changelog to `topic` on `brokers`, exactly once, with transactions named
    /// by `transactional_id_prefix` (see [`KafkaSink::new`]). Keys and values are JSON.
    ///
    /// ```
    /// let s = weir_kafka::KafkaUpserts::<String, (i64, i64)>::new("127.0.0.1:9092", "totals", "totals-job")
    ///     .configure(|sink| sink.transaction_timeout(std::time::Duration::from_secs(120)));
    /// assert_eq!(s.topic(), "totals");
    /// ```
    pub fn new(brokers: &str, topic: &str, transactional_id_prefix: &str) -> Self {
        KafkaUpserts {
            sink: KafkaSink::new(brokers, topic, transactional_id_prefix),
            brokers: brokers.to_string(),
            topic: topic.to_string(),
            partitions: 1,
            allow_uncompacted: false,
            key: Arc::new(|k: &K| serde_json::to_vec(k).unwrap_or_default()),
            value: Arc::new(|v: &V| serde_json::to_vec(v).unwrap_or_default()),
        }
    }
}

impl<K: 'static, V: 'static> KafkaUpserts<K, V> {
    /// How a key becomes the record's key (default: JSON).
    pub fn key_encoder(mut self, f: impl Fn(&K) -> Vec<u8> + Send + Sync + 'static) -> Self {
        self.key = Arc::new(f);
        self
    }

    /// How a value becomes the record's value (default: JSON).
    pub fn value_encoder(mut self, f: impl Fn(&V) -> Vec<u8> + Send + Sync + 'static) -> Self {
        self.value = Arc::new(f);
        self
    }

    /// Partitions of the topic when the sink creates it (default 1).
    pub fn partitions(mut self, n: i32) -> Self {
        self.partitions = n.max(1);
        self
    }

    /// Writes into an existing topic that is not compacted, with a warning, instead of
    /// failing the job.
    pub fn allow_uncompacted(mut self) -> Self {
        self.allow_uncompacted = true;
        self
    }

    /// Adjusts the underlying [`KafkaSink`]: the guarantee, the transaction timeout, the
    /// pool, producer settings. (Its serializer is the upsert encoding; do not replace it.)
    pub fn configure(
        mut self,
        f: impl FnOnce(KafkaSink<Change<K, V>>) -> KafkaSink<Change<K, V>>,
    ) -> Self {
        self.sink = f(self.sink);
        self
    }

    /// The topic written.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The factory to pass to
    /// [`Stream::sink_changes`](weir_core::dsl::Stream::sink_changes).
    pub fn factory(&self) -> impl Fn() -> KafkaUpsertSink<K, V> + Send + Sync + 'static {
        let (key, value) = (self.key.clone(), self.value.clone());
        let sink = self
            .sink
            .clone()
            .record_serializer(move |c: &Change<K, V>| {
                (Some(key(c.key())), c.new_value().map(|v| value(v)))
            });
        let cfg = self.clone();
        move || KafkaUpsertSink {
            inner: KafkaSinkFunction::new(sink.clone()),
            brokers: cfg.brokers.clone(),
            topic: cfg.topic.clone(),
            partitions: cfg.partitions,
            allow_uncompacted: cfg.allow_uncompacted,
        }
    }
}

/// Checks that `topic` is compacted, creating it compacted with `partitions` partitions when
/// it does not exist. `Ok(false)`: it exists and is not compacted.
pub fn ensure_compacted(brokers: &str, topic: &str, partitions: i32) -> Result<bool> {
    if !admin::topic_exists(brokers, topic)? {
        admin::ensure_topic(brokers, topic, partitions, &[("cleanup.policy", "compact")])?;
        tracing::info!(
            topic,
            partitions,
            "created the compacted topic of an upsert sink"
        );
    }
    let policy = admin::topic_setting(brokers, topic, "cleanup.policy")?.unwrap_or_default();
    Ok(policy.split(',').any(|p| p.trim() == "compact"))
}

/// One subtask of a [`KafkaUpserts`] sink: the topic check, then the [`KafkaSink`]'s.
pub struct KafkaUpsertSink<K, V> {
    inner: KafkaSinkFunction<Change<K, V>>,
    brokers: String,
    topic: String,
    partitions: i32,
    allow_uncompacted: bool,
}

impl<K: 'static, V: 'static> KafkaUpsertSink<K, V> {
    fn check_topic(&self, ctx: &SinkContext) -> Result<()> {
        if ensure_compacted(&self.brokers, &self.topic, self.partitions)? {
            return Ok(());
        }
        let fix = format!(
            "kafka-configs.sh --bootstrap-server {} --alter --entity-type topics --entity-name {} \
             --add-config cleanup.policy=compact",
            self.brokers, self.topic
        );
        if self.allow_uncompacted {
            if ctx.subtask == 0 {
                tracing::warn!(sink = %ctx.name, topic = %self.topic,
                    "topic is not compacted (cleanup.policy is not compact): it keeps every \
                     change and tombstone until retention deletes them, so a reader may not \
                     find the latest value of an old key; make it compact with: {fix}");
            }
            return Ok(());
        }
        Err(KafkaError::Config(format!(
            "upsert sink '{}': topic '{}' is not compacted (cleanup.policy is not 'compact'), so \
             Kafka would delete the latest value of a key with old records instead of keeping \
             it; make the topic compacted with `{fix}`, write to a new topic (created \
             compacted), or call .allow_uncompacted() to write anyway",
            ctx.name, self.topic
        )))
    }
}

impl<K: 'static, V: 'static> SinkFunction<Change<K, V>> for KafkaUpsertSink<K, V> {
    fn restore(
        &mut self,
        checkpoint: CheckpointId,
        states: &[Vec<u8>],
        ctx: &SinkContext,
    ) -> weir_core::Result<()> {
        self.inner.restore(checkpoint, states, ctx)
    }

    fn open(&mut self, ctx: &SinkContext) -> weir_core::Result<()> {
        self.check_topic(ctx)?;
        self.inner.open(ctx)
    }

    fn invoke(&mut self, change: Change<K, V>, ts: Timestamp) -> weir_core::Result<()> {
        self.inner.invoke(change, ts)
    }

    fn snapshot(
        &mut self,
        checkpoint: CheckpointId,
    ) -> weir_core::Result<Option<(Vec<u8>, String)>> {
        self.inner.snapshot(checkpoint)
    }

    fn notify_complete(&mut self, checkpoint: CheckpointId) -> weir_core::Result<()> {
        self.inner.notify_complete(checkpoint)
    }

    fn finish(&mut self) -> weir_core::Result<()> {
        self.inner.finish()
    }
}
