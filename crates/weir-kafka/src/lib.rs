//! Apache Kafka connectors for weir.
//!
//! - [`KafkaSource`]: reads topics with `isolation.level=read_committed`, partitions
//!   assigned deterministically (no consumer-group rebalancing), offsets kept in weir's
//!   checkpoints and redistributed on rescale, per-partition watermarks with idleness, an
//!   optional bounded mode, and a dead-letter topic for records that fail to deserialize.
//! - [`KafkaSink`]: writes a topic exactly once through Kafka transactions tied to weir's
//!   checkpoints (two-phase commit), and recovers pre-committed transactions after any
//!   crash by re-producing them from the log — no loss even if the job was down longer
//!   than `transaction.timeout.ms`. An at-least-once mode is available.
//! - [`KafkaUpserts`]: a changelog (`Stream<Change<K, V>>`) into a compacted topic — the
//!   encoded key, the new value or a tombstone — through the sink's transactions.
//! - [`dead_letters`]: a Kafka topic as the dead-letter queue of an external sink (the
//!   apply-once PostgreSQL sink, for one), letters keyed by their idempotency key.
//!
//! The guarantee, failure modes and settings are described in `docs/kafka.md`.
//!
//! ```no_run
//! use weir::prelude::*;
//! use weir_kafka::{KafkaSink, KafkaSource};
//!
//! let source = KafkaSource::new("127.0.0.1:9092", ["input"])
//!     .bounded()
//!     .deserializer(|r| {
//!         let key = String::from_utf8(r.key.unwrap_or_default().to_vec()).map_err(|e| e.to_string())?;
//!         let v: i64 = std::str::from_utf8(r.value.unwrap_or_default())
//!             .map_err(|e| e.to_string())?
//!             .trim()
//!             .parse()
//!             .map_err(|e| format!("{e}"))?;
//!         Ok((key, v))
//!     });
//! let sink = KafkaSink::new("127.0.0.1:9092", "output", "my-job")
//!     .serializer(|(k, v): &(String, i64)| (Some(k.clone().into_bytes()), v.to_string().into_bytes()));
//! let env = Env::new();
//! env.source("kafka-in", source.factory())
//!     .key_by(|(k, _): &(String, i64)| k.clone())
//!     .reduce(|a, b| (a.0, a.1 + b.1))
//!     .sink("kafka-out", sink.factory());
//! env.execute("sums").unwrap();
//! ```

#![warn(missing_docs)]

pub mod admin;
mod dlq;
mod error;
mod sink;
mod source;
pub mod txn;
mod upsert;

pub use dlq::dead_letters;
pub use error::{KafkaError, Result};
pub use sink::{DeliveryGuarantee, EXTRA_PRODUCERS, KafkaSink, KafkaSinkFunction};
pub use source::{KafkaRecord, KafkaSource, KafkaSourceFunction, StartFrom};
pub use upsert::{KafkaUpsertSink, KafkaUpserts, ensure_compacted};
