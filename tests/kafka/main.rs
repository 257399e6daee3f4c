//! weir's Kafka connectors against a real Apache Kafka broker, tried as a user would:
//! jobs reading and writing real topics, `kafka_sum` run as a child process and killed with
//! SIGKILL, changelogs written into compacted topics (also by `kafka_upsert_totals` killed
//! with SIGKILL), and the output checked by an independent `read_committed` consumer.
//!
//! The broker is `WEIR_KAFKA_BROKERS` if set (CI starts one with `scripts/kafka.sh start`),
//! otherwise the tests start one themselves with that script.

mod alignment;
mod basics;
mod chaos;
mod dead_letters;
mod errors;
mod identity;
mod lag;
mod lifecycle;
mod rest;
mod source;
mod support;
mod unaligned;
mod upserts;
