//! Broker look-ups shared by the source and the sink: topic metadata, broker settings,
//! creating the sink's marker topic. Every failure says which broker and topic it was
//! about, and what to check.

use crate::{KafkaError, Result};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How long a metadata or admin request may take before the broker counts as unreachable.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The isolation level of the clients used only for metadata (it does not matter there).
const METADATA: &str = "read_committed";

type Clients = Mutex<HashMap<(String, &'static str), Arc<BaseConsumer>>>;

/// The metadata clients of this process, by brokers and isolation level.
static CLIENTS: OnceLock<Clients> = OnceLock::new();

fn clients() -> std::sync::MutexGuard<'static, HashMap<(String, &'static str), Arc<BaseConsumer>>> {
    CLIENTS
        .get_or_init(Clients::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// A metadata client for `brokers` reading with `isolation`, shared by every look-up in
/// this process.
///
/// A job opens its sources and sinks with a dozen look-ups (partitions, end offsets, broker
/// settings); a client per look-up cost a connection and a thread start and stop each —
/// most of a second before the first record. The shared client stays connected (librdkafka
/// reconnects it as needed); one that failed to reach its brokers is dropped (see
/// [`forget`]), so the next look-up starts afresh.
pub(crate) fn metadata_client(brokers: &str, isolation: &'static str) -> Result<Arc<BaseConsumer>> {
    let mut clients = clients();
    if let Some(c) = clients.get(&(brokers.to_string(), isolation)) {
        return Ok(c.clone());
    }
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("socket.timeout.ms", "10000")
        // The end offset a ListOffsets request returns depends on it: librdkafka's default,
        // read_committed, gives the last stable offset.
        .set("isolation.level", isolation)
        .create()
        .map_err(|e| {
            KafkaError::Config(format!("cannot create a Kafka client for {brokers}: {e}"))
        })?;
    let c = Arc::new(c);
    clients.insert((brokers.to_string(), isolation), c.clone());
    Ok(c)
}

/// Drops the shared clients of `brokers` after a look-up failed to reach them: a later
/// look-up (a restart, a retry) connects afresh instead of inheriting the failed client's
/// back-off, and nothing keeps reconnecting to brokers the process gave up on.
fn forget(brokers: &str) {
    clients().retain(|(b, _), _| b != brokers);
}

/// The partitions of `topic`, sorted; a clear error when the broker cannot be reached or
/// the topic does not exist.
pub fn partitions(brokers: &str, topic: &str) -> Result<Vec<i32>> {
    let c = metadata_client(brokers, METADATA)?;
    let md = c
        .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
        .map_err(|e| unreachable(brokers, &e))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| missing_topic(brokers, topic))?;
    if let Some(err) = t.error() {
        let code: RDKafkaErrorCode = err.into();
        if code == RDKafkaErrorCode::UnknownTopicOrPartition {
            return Err(missing_topic(brokers, topic));
        }
        return Err(KafkaError::Broker(format!(
            "metadata of topic '{topic}' from {brokers}: {code}"
        )));
    }
    let mut ps: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
    if ps.is_empty() {
        return Err(missing_topic(brokers, topic));
    }
    ps.sort_unstable();
    Ok(ps)
}

/// True when `topic` exists.
pub fn topic_exists(brokers: &str, topic: &str) -> Result<bool> {
    match partitions(brokers, topic) {
        Ok(_) => Ok(true),
        Err(KafkaError::MissingTopic { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The low watermark and the end of the log of a partition: the offset after its last
/// record, committed or not (what a `read_uncommitted` reader can reach).
pub fn watermarks(brokers: &str, topic: &str, partition: i32) -> Result<(i64, i64)> {
    offsets(brokers, topic, partition, "read_uncommitted")
}

/// The low watermark and the last stable offset of a partition: the end of what a
/// `read_committed` reader can reach now (before the first open transaction).
pub fn stable_watermarks(brokers: &str, topic: &str, partition: i32) -> Result<(i64, i64)> {
    offsets(brokers, topic, partition, "read_committed")
}

fn offsets(
    brokers: &str,
    topic: &str,
    partition: i32,
    isolation: &'static str,
) -> Result<(i64, i64)> {
    metadata_client(brokers, isolation)?
        .fetch_watermarks(topic, partition, REQUEST_TIMEOUT)
        .map_err(|e| {
            forget(brokers);
            KafkaError::Broker(format!(
                "cannot read the offsets of {topic}/{partition} from {brokers}: {e}"
            ))
        })
}

/// A broker setting (of the first broker in the metadata), as the broker reports it.
pub fn broker_setting(brokers: &str, name: &str) -> Result<Option<String>> {
    let c = metadata_client(brokers, METADATA)?;
    let md = c
        .fetch_metadata(None, REQUEST_TIMEOUT)
        .map_err(|e| unreachable(brokers, &e))?;
    let Some(b) = md.brokers().first() else {
        return Err(KafkaError::Broker(format!("{brokers} listed no brokers")));
    };
    let admin = admin_client(brokers)?;
    let opts = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
    let res = futures_executor::block_on(
        admin.describe_configs(&[ResourceSpecifier::Broker(b.id())], &opts),
    )
    .map_err(|e| KafkaError::Broker(format!("cannot read broker settings from {brokers}: {e}")))?;
    for r in res {
        let r = r.map_err(|e| {
            KafkaError::Broker(format!("cannot read broker settings from {brokers}: {e}"))
        })?;
        if let Some(e) = r.get(name) {
            return Ok(e.value.clone());
        }
    }
    Ok(None)
}

/// A topic's setting (for example `cleanup.policy`), as the broker reports it; `None` when
/// the broker does not report it.
pub fn topic_setting(brokers: &str, topic: &str, name: &str) -> Result<Option<String>> {
    let admin = admin_client(brokers)?;
    let opts = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
    let res = futures_executor::block_on(
        admin.describe_configs(&[ResourceSpecifier::Topic(topic)], &opts),
    )
    .map_err(|e| {
        KafkaError::Broker(format!(
            "cannot read the settings of topic '{topic}' from {brokers}: {e}"
        ))
    })?;
    for r in res {
        let r = r.map_err(|e| {
            KafkaError::Broker(format!(
                "cannot read the settings of topic '{topic}' from {brokers}: {e}"
            ))
        })?;
        if let Some(e) = r.get(name) {
            return Ok(e.value.clone());
        }
    }
    Ok(None)
}

/// Creates `topic` if it does not exist (an existing topic is left as it is).
pub fn ensure_topic(
    brokers: &str,
    topic: &str,
    partitions: i32,
    config: &[(&str, &str)],
) -> Result<()> {
    if topic_exists(brokers, topic)? {
        return Ok(());
    }
    let admin = admin_client(brokers)?;
    let replication = {
        let c = metadata_client(brokers, METADATA)?;
        let md = c
            .fetch_metadata(None, REQUEST_TIMEOUT)
            .map_err(|e| unreachable(brokers, &e))?;
        (md.brokers().len() as i32).clamp(1, 3)
    };
    let mut nt = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
    for (k, v) in config {
        nt = nt.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
    let res = futures_executor::block_on(admin.create_topics([&nt], &opts)).map_err(|e| {
        KafkaError::Broker(format!("cannot create topic '{topic}' on {brokers}: {e}"))
    })?;
    for r in res {
        match r {
            Ok(_) => {}
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, code)) => {
                return Err(KafkaError::Broker(format!(
                    "cannot create topic '{t}' on {brokers}: {code}"
                )));
            }
        }
    }
    // Creation is asynchronous on the broker: wait until the metadata shows the topic.
    let deadline = std::time::Instant::now() + REQUEST_TIMEOUT;
    while !topic_exists(brokers, topic)? {
        if std::time::Instant::now() > deadline {
            return Err(KafkaError::Broker(format!(
                "topic '{topic}' was created on {brokers} but did not appear in its metadata"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn admin_client(brokers: &str) -> Result<AdminClient<DefaultClientContext>> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|e| {
            KafkaError::Config(format!(
                "cannot create a Kafka admin client for {brokers}: {e}"
            ))
        })
}

fn unreachable(brokers: &str, e: &rdkafka::error::KafkaError) -> KafkaError {
    forget(brokers);
    KafkaError::Unreachable {
        brokers: brokers.to_string(),
        detail: e.to_string(),
    }
}

fn missing_topic(brokers: &str, topic: &str) -> KafkaError {
    KafkaError::MissingTopic {
        brokers: brokers.to_string(),
        topic: topic.to_string(),
    }
}
