//! Errors of the Kafka connectors, each with what to check or change.

use std::fmt;

/// What went wrong talking to Kafka; the message names the broker, topic and partition
/// involved and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KafkaError {
    /// A setting is invalid or contradicts another.
    Config(String),
    /// The brokers did not answer.
    Unreachable {
        /// The bootstrap servers tried.
        brokers: String,
        /// librdkafka's error.
        detail: String,
    },
    /// A topic does not exist.
    MissingTopic {
        /// The bootstrap servers asked.
        brokers: String,
        /// The topic.
        topic: String,
    },
    /// The broker refused or failed a request.
    Broker(String),
    /// A record could not be deserialized and no dead-letter topic is configured.
    Deserialize(String),
    /// Restoring the sink's transactions failed; nothing was written.
    Recovery(String),
    /// A restore was refused because resuming would lose or duplicate output (or its state
    /// is unreadable); a restart would refuse the same way, so the job is not restarted.
    RecoveryRefused(String),
    /// The sink's transaction bookkeeping refused a step (for example, every producer of
    /// the pool holds an epoch waiting for its checkpoint).
    Transaction(String),
}

impl fmt::Display for KafkaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KafkaError::Config(m) => write!(f, "Kafka configuration: {m}"),
            KafkaError::Unreachable { brokers, detail } => write!(
                f,
                "Kafka brokers {brokers} did not answer ({detail}); check the address and that \
                 the broker is running (scripts/kafka.sh status)"
            ),
            KafkaError::MissingTopic { brokers, topic } => write!(
                f,
                "topic '{topic}' does not exist on {brokers}; create it first (for example \
                 scripts/kafka.sh topic create {topic} 3)"
            ),
            KafkaError::Broker(m) => write!(f, "Kafka: {m}"),
            KafkaError::Deserialize(m) => write!(f, "{m}"),
            KafkaError::Recovery(m) | KafkaError::RecoveryRefused(m) => {
                write!(f, "Kafka sink recovery: {m}")
            }
            KafkaError::Transaction(m) => write!(f, "Kafka sink transactions: {m}"),
        }
    }
}

impl std::error::Error for KafkaError {}

impl From<KafkaError> for weir_core::Error {
    fn from(e: KafkaError) -> Self {
        match e {
            KafkaError::Config(_)
            | KafkaError::MissingTopic { .. }
            | KafkaError::RecoveryRefused(_) => weir_core::Error::Config(e.to_string()),
            KafkaError::Deserialize(_) => weir_core::Error::Malformed(e.to_string()),
            other => weir_core::Error::User(other.to_string()),
        }
    }
}

/// The connectors' result type.
pub type Result<T> = std::result::Result<T, KafkaError>;
