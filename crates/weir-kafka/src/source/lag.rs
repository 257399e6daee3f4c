//! How far behind a Kafka source subtask is, per partition: its position (the next offset
//! it reads, published by the subtask after each batch it polls) and the partition's high
//! watermark (for `read_committed`, the last stable offset: the end of what the source can
//! read now), read from the broker once a second by a thread of its own, off the hot path.
//! Lag = high watermark − position.
//!
//! The high watermark is asked of the broker (a `ListOffsets` request per partition) rather
//! than taken from librdkafka's statistics or fetch responses: those stop changing while
//! the local queue is full, which is exactly when a job falls behind.

use crate::admin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use weir_core::dsl::PartitionGauges;
use weir_core::metrics::{self, Gauge};

/// How often the high watermarks are read.
const PERIOD: Duration = Duration::from_secs(1);

/// One partition's gauges, registered on `/metrics` with the labels operator, subtask,
/// topic and partition.
#[derive(Clone)]
pub(super) struct Gauges {
    topic: String,
    partition: i32,
    position: Gauge,
    high_watermark: Gauge,
    lag: Gauge,
}

impl Gauges {
    pub(super) fn register(operator: &str, subtask: usize, topic: &str, partition: i32) -> Self {
        let subtask = subtask.to_string();
        let p = partition.to_string();
        let labels = [
            ("operator", operator),
            ("subtask", subtask.as_str()),
            ("topic", topic),
            ("partition", p.as_str()),
        ];
        let g = Gauges {
            topic: topic.to_string(),
            partition,
            position: metrics::gauge(
                "weir_kafka_source_partition_position",
                "The next offset the Kafka source subtask reads from the partition.",
                &labels,
            ),
            high_watermark: metrics::gauge(
                "weir_kafka_source_partition_high_watermark",
                "The partition's high watermark (the last stable offset for read_committed), \
                 read from the broker once a second; -1 until known.",
                &labels,
            ),
            lag: metrics::gauge(
                "weir_kafka_source_partition_lag",
                "Records of the partition the Kafka source subtask has still to read: high \
                 watermark minus position.",
                &labels,
            ),
        };
        g.high_watermark.set(-1);
        g.lag.set(0);
        g
    }

    /// The subtask has read up to `position` (the next offset to read).
    pub(super) fn publish(&self, position: i64) {
        self.position.set(position);
        self.update_lag();
    }

    fn update_lag(&self) {
        let high = self.high_watermark.get();
        if high >= 0 {
            self.lag.set((high - self.position.get()).max(0));
        }
    }

    /// The gauges the runtime reads for the REST API.
    pub(super) fn figures(&self) -> PartitionGauges {
        PartitionGauges {
            topic: self.topic.clone(),
            partition: self.partition,
            position: self.position.clone(),
            high_watermark: self.high_watermark.clone(),
        }
    }
}

/// The thread reading the high watermarks; dropping it stops the thread (after the
/// request it may be waiting for).
pub(super) struct Probe {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::Thread>,
}

impl Probe {
    /// Starts reading the high watermarks of `parts` from `brokers` now and once a second.
    pub(super) fn start(brokers: &str, read_committed: bool, parts: Vec<Gauges>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        if parts.is_empty() {
            return Probe { stop, thread: None };
        }
        let (brokers, stopped) = (brokers.to_string(), stop.clone());
        let spawned = std::thread::Builder::new()
            .name("weir-kafka-lag".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    for p in &parts {
                        if stopped.load(Ordering::Relaxed) {
                            return;
                        }
                        let ends = if read_committed {
                            admin::stable_watermarks(&brokers, &p.topic, p.partition)
                        } else {
                            admin::watermarks(&brokers, &p.topic, p.partition)
                        };
                        match ends {
                            Ok((_, high)) => {
                                p.high_watermark.set(high);
                                p.update_lag();
                            }
                            Err(e) => tracing::debug!("reading the Kafka source's lag: {e}"),
                        }
                    }
                    std::thread::park_timeout(PERIOD);
                }
            });
        match spawned {
            Ok(t) => Probe {
                stop,
                thread: Some(t.thread().clone()),
            },
            Err(e) => {
                // The job runs on; only its lag figures stay unknown.
                tracing::warn!("cannot start the Kafka source's lag thread: {e}");
                Probe { stop, thread: None }
            }
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = &self.thread {
            t.unpark();
        }
    }
}
