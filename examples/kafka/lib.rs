//! Shared code of the Kafka examples (`kafka_sum`, `kafka_load`). The package exists so that
//! `cargo run --example quickstart` never builds librdkafka (see Cargo.toml).

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::time::Duration;

/// The `i`-th pseudo-random draw of the input sequence for `seed` (xorshift64*).
fn draws(seed: u64) -> impl Iterator<Item = u64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    std::iter::repeat_with(move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

/// The records kafka_load writes: `(key, value)` with values in 1..=1000.
///
/// ```
/// let r: Vec<_> = weir_kafka_examples::sums_input(3, 10, 1).collect();
/// assert_eq!(r.len(), 3);
/// assert!(r.iter().all(|(k, v)| k.starts_with("key-") && (1..=1000).contains(v)));
/// ```
pub fn sums_input(records: u64, keys: u64, seed: u64) -> impl Iterator<Item = (String, i64)> {
    let mut d = draws(seed);
    (0..records).map(move |_| {
        let k = d.next().unwrap_or_default() % keys.max(1);
        let v = 1 + (d.next().unwrap_or_default() % 1000) as i64;
        (format!("key-{k}"), v)
    })
}

/// Produces [`sums_input`] to `topic` and waits for every acknowledgement; returns the
/// number of records.
pub fn produce_sums_input(
    brokers: &str,
    topic: &str,
    records: u64,
    keys: u64,
    seed: u64,
) -> anyhow::Result<u64> {
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "20")
        .set("batch.num.messages", "20000")
        .set("partitioner", "murmur2_random")
        .create()?;
    let mut n = 0;
    for (k, v) in sums_input(records, keys, seed) {
        let value = v.to_string();
        let mut r = BaseRecord::to(topic)
            .key(k.as_bytes())
            .payload(value.as_bytes());
        loop {
            match p.send(r) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    r = back;
                    p.poll(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
        n += 1;
        if n % 10_000 == 0 {
            p.poll(Duration::ZERO);
        }
    }
    p.flush(Duration::from_secs(120))?;
    Ok(n)
}
