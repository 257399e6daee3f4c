//! A Kafka topic as the dead-letter queue of an external sink (see `weir_core::dlq`).

use crate::admin;
use crate::error::KafkaError;
use crate::sink::{Prod, flush, reporting_producer, send, take_deliveries};
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::BaseRecord;
use std::time::Duration;
use weir_core::dlq::{DeadLetter, DeadLetterFactory, DeadLetterSink};
use weir_core::metrics::{self, Counter};

/// Dead letters to `topic` on `brokers`: one Kafka record per letter, keyed by the
/// idempotency key, the value the letter as JSON (the same form as the file queue, so
/// `serde_json::from_slice::<DeadLetter>` reads it back), with headers `weir.handler`,
/// `weir.attempts` and `weir.error` for tools that do not parse the value.
///
/// The producer is idempotent with `acks=all`; letters are flushed and their delivery
/// checked at every checkpoint barrier and at the end of input, so a checkpoint never
/// covers a letter the broker did not take. The topic must exist: a missing topic or an
/// unreachable broker refuses to start the sink, naming both.
///
/// ```no_run
/// let dlq = weir_kafka::dead_letters("127.0.0.1:9092", "payments-dlq");
/// // ApplyOnce::new(..).dead_letters(dlq)
/// # let _ = dlq;
/// ```
pub fn dead_letters(brokers: &str, topic: &str) -> DeadLetterFactory {
    let (brokers, topic) = (brokers.to_string(), topic.to_string());
    std::sync::Arc::new(move |handler, _ctx| {
        admin::partitions(&brokers, &topic)?;
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all");
        let producer = reporting_producer(&c)?;
        Ok(Box::new(KafkaDeadLetters {
            producer,
            topic: topic.clone(),
            sent: metrics::counter(
                "dead_letters_total",
                "Records a sink gave up on and wrote to its dead-letter queue.",
                &[("handler", handler)],
            ),
        }) as Box<dyn DeadLetterSink>)
    })
}

struct KafkaDeadLetters {
    producer: Prod,
    topic: String,
    sent: Counter,
}

impl DeadLetterSink for KafkaDeadLetters {
    fn send(&mut self, letter: &DeadLetter) -> weir_core::Result<()> {
        let value = serde_json::to_vec(letter)
            .map_err(|e| weir_core::Error::Codec(format!("dead letter to JSON: {e}")))?;
        let attempts = letter.attempts.to_string();
        let headers = OwnedHeaders::new_with_capacity(3)
            .insert(Header {
                key: "weir.handler",
                value: Some(letter.handler.as_bytes()),
            })
            .insert(Header {
                key: "weir.attempts",
                value: Some(attempts.as_bytes()),
            })
            .insert(Header {
                key: "weir.error",
                value: Some(letter.error.as_bytes()),
            });
        let r: BaseRecord<'_, [u8], [u8], usize> = BaseRecord::with_opaque_to(&self.topic, 0)
            .key(letter.idempotency_key.as_bytes())
            .payload(value.as_slice())
            .headers(headers);
        send(&self.producer, r)?;
        self.producer.poll(Duration::ZERO);
        self.sent.inc();
        Ok(())
    }

    fn flush(&mut self) -> weir_core::Result<()> {
        flush(&self.producer)?;
        take_deliveries(&self.producer).map_err(|e| match e {
            KafkaError::Broker(m) => KafkaError::Broker(format!(
                "a dead letter to topic '{}' was not delivered: {m}",
                self.topic
            )),
            e => e,
        })?;
        Ok(())
    }
}
