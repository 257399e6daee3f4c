//! The Kafka sink's configuration: [`KafkaSink`], what it promises, and the builder a
//! pipeline sets it up with.

use super::KafkaSinkFunction;
use crate::txn::SinkIdentity;
use crate::{KafkaError, Result};
use std::sync::Arc;
use std::time::Duration;

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

/// A record's Kafka key and value; a `None` value is a tombstone.
pub(super) type Serializer<T> = Arc<dyn Fn(&T) -> (Option<Vec<u8>>, Option<Vec<u8>>) + Send + Sync>;

/// How many producers a subtask may add to its pool while savepoints (which commit
/// nothing) or failed checkpoints keep more epochs waiting than the pool holds.
pub const EXTRA_PRODUCERS: u32 = 2;

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
    pub(super) brokers: String,
    pub(super) topic: String,
    pub(super) prefix: String,
    pub(super) marker_topic: Option<String>,
    pub(super) guarantee: DeliveryGuarantee,
    pub(super) pool: u32,
    pub(super) transaction_timeout: Duration,
    pub(super) props: Vec<(String, String)>,
    pub(super) accept_newer: bool,
    pub(super) serializer: Option<Serializer<T>>,
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

impl<T: 'static> KafkaSink<T> {
    /// A sink writing `topic` on `brokers`, exactly once. `transactional_id_prefix` names
    /// this sink's transactions: unique among the sinks and jobs writing to the cluster
    /// (two sinks of one job with one prefix are refused). It may change between runs: a
    /// restore finishes the restored transactions under the prefix that wrote them.
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
        self.serializer = Some(Arc::new(move |t| {
            let (k, v) = f(t);
            (k, Some(v))
        }));
        self
    }

    /// Turns a record into its Kafka key and value, both optional: a `None` value writes a
    /// tombstone (a record with a null value), which deletes the key from a compacted topic.
    /// [`KafkaUpserts`](crate::KafkaUpserts) builds on it.
    ///
    /// ```
    /// let sink = weir_kafka::KafkaSink::new("127.0.0.1:9092", "latest", "latest-job")
    ///     .record_serializer(|(k, v): &(String, Option<i64>)| {
    ///         (Some(k.as_bytes().to_vec()), v.map(|v| v.to_string().into_bytes()))
    ///     });
    /// # let _ = sink;
    /// ```
    pub fn record_serializer(
        mut self,
        f: impl Fn(&T) -> (Option<Vec<u8>>, Option<Vec<u8>>) + Send + Sync + 'static,
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

    /// Transactional producers per subtask created at start (default 3, at least 1): how
    /// many epochs may wait for a checkpoint to complete while the next one writes. A
    /// subtask adds up to [`EXTRA_PRODUCERS`] more while savepoints keep epochs waiting.
    pub fn pool_size(mut self, n: u32) -> Self {
        self.pool = n.max(1);
        self
    }

    /// `transaction.timeout.ms` (default 15 minutes, the broker's default maximum). Must not
    /// exceed the broker's `transaction.max.timeout.ms` and must cover the checkpoint
    /// interval plus the checkpoint timeout; both are checked at start-up, as is a value
    /// given with [`KafkaSink::set`].
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
    /// `transaction.timeout.ms` set here is checked like [`KafkaSink::transaction_timeout`].
    pub fn set(mut self, key: &str, value: &str) -> Self {
        self.props.push((key.to_string(), value.to_string()));
        self
    }

    /// Accepts, on restore, that the markers show output of the sink's lineage committed
    /// after the restored checkpoint (the newest checkpoint was lost, or an older savepoint
    /// is restored): that output is then written again — an at-least-once restore, said so
    /// in the log. Off by default: such a restore fails with an explanation.
    pub fn accept_newer_commits_on_restore(mut self) -> Self {
        self.accept_newer = true;
        self
    }

    pub(super) fn marker_topic_name(&self) -> String {
        self.marker_topic
            .clone()
            .unwrap_or_else(|| format!("weir-markers.{}", self.prefix))
    }

    /// The sink as its snapshots record it.
    pub(super) fn identity(&self) -> SinkIdentity {
        SinkIdentity {
            prefix: self.prefix.clone(),
            marker_topic: self.marker_topic_name(),
            topic: self.topic.clone(),
        }
    }

    /// `transaction.timeout.ms` as the producers get it: the last value given with
    /// [`KafkaSink::set`], else [`KafkaSink::transaction_timeout`].
    pub(super) fn effective_transaction_timeout(&self) -> Result<Duration> {
        match self
            .props
            .iter()
            .rev()
            .find(|(k, _)| k == "transaction.timeout.ms")
        {
            None => Ok(self.transaction_timeout),
            Some((_, v)) => v
                .trim()
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| {
                    KafkaError::Config(format!(
                        "transaction.timeout.ms must be a whole number of milliseconds, not {v:?}"
                    ))
                }),
        }
    }

    /// The factory to pass to `Stream::sink`.
    pub fn factory(&self) -> impl Fn() -> KafkaSinkFunction<T> + Send + Sync + 'static {
        let cfg = self.clone();
        move || KafkaSinkFunction::new(cfg.clone())
    }
}
