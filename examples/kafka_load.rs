//! kafka_load: fills a topic with `key,value` records for kafka_sum and its benchmark.
//!
//! ```text
//! cargo run --release --example kafka_load -- --brokers HOST:PORT --topic IN \
//!     --records N [--keys K] [--seed S]
//! ```
//!
//! Record `i` has key `key-{x % K}` and value `1 + x % 1000` (decimal UTF-8), where `x` is a
//! deterministic pseudo-random sequence from the seed: every key's running sums are then
//! strictly increasing, so a duplicate or a loss in kafka_sum's output is visible. Produced
//! by an idempotent producer with acks=all, partitioned by key as the Java client would.

use anyhow::{Context, bail};
use std::time::Instant;
use weir_kafka::admin;

fn main() -> anyhow::Result<()> {
    let mut brokers = None;
    let mut topic = None;
    let mut records: u64 = 0;
    let mut keys: u64 = 1000;
    let mut seed: u64 = 1;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--brokers" => brokers = Some(value()?),
            "--topic" => topic = Some(value()?),
            "--records" => records = value()?.parse().context("--records")?,
            "--keys" => keys = value()?.parse().context("--keys")?,
            "--seed" => seed = value()?.parse().context("--seed")?,
            other => bail!("unknown flag {other}"),
        }
    }
    let brokers = brokers.context("--brokers HOST:PORT is required")?;
    let topic = topic.context("--topic is required")?;
    admin::partitions(&brokers, &topic)?;
    let started = Instant::now();
    let n = weir_kafka_examples::produce_sums_input(&brokers, &topic, records, keys.max(1), seed)?;
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "kafka_load: {n} records to {topic} in {secs:.2}s ({:.0} records/s)",
        n as f64 / secs.max(1e-9)
    );
    Ok(())
}
