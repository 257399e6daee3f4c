//! The sink's restore against the broker: the registry of runs, reading the commit markers
//! (and, when they are gone, the output) to decide which pending epochs committed, and
//! writing the others again. The decisions themselves are `txn::Restore`'s.

use super::io::{KAFKA_TIMEOUT, ReadEnd, read_consumer, read_to_end, reset};
use super::{KafkaSinkFunction, flush, send, take_deliveries};
use crate::admin;
use crate::txn::{
    self, EpochCollector, Incarnation, KnownMarker, MarkerPartition, MarkerValue, PendingEpoch,
    Registered, Restore, Scanned, ScannedMarker, TXN_HEADER, WriterRecovery,
};
use crate::{KafkaError, Result};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError as RdError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use weir_core::failpoint;

impl<T: 'static> KafkaSinkFunction<T> {
    /// The registry of a sink: the offset metadata of its marker topic's partition 0 in the
    /// consumer group `{prefix}.weir-sink` (durable, tiny, and readable without scanning a
    /// topic).
    fn registry_client(&self, prefix: &str) -> Result<BaseConsumer> {
        ClientConfig::new()
            .set("bootstrap.servers", &self.cfg.brokers)
            .set("group.id", format!("{prefix}.weir-sink"))
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| KafkaError::Config(format!("cannot create a Kafka consumer: {e}")))
    }

    /// The largest parallelism and pool any run of the sink `prefix` announced. For another
    /// sink than this run's (a restored snapshot's old prefix) a registry that cannot be
    /// read counts as empty: the snapshots bound that sink's runs.
    pub(super) fn registered(
        &self,
        prefix: &str,
        marker_topic: &str,
        current: bool,
    ) -> Result<Registered> {
        let read = || -> Result<Registered> {
            let c = self.registry_client(prefix)?;
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(marker_topic, 0);
            let got = c
                .committed_offsets(tpl, admin::REQUEST_TIMEOUT)
                .map_err(|e| {
                    KafkaError::Broker(format!(
                        "reading the sink's registry (group {prefix}.weir-sink): {e}"
                    ))
                })?;
            Ok(got
                .find_partition(marker_topic, 0)
                .map(|e| Registered::parse(e.metadata()))
                .unwrap_or_default())
        };
        match read() {
            Err(e) if !current => {
                tracing::warn!(prefix, error = %e, "the registry of an earlier prefix is unreadable");
                Ok(Registered::default())
            }
            other => other,
        }
    }

    pub(super) fn register(&self, r: Registered) -> Result<()> {
        let c = self.registry_client(&self.cfg.prefix)?;
        let mut tpl = TopicPartitionList::new();
        let mut e = tpl.add_partition(&self.marker_topic, 0);
        e.set_offset(Offset::Offset(0))
            .map_err(|er| KafkaError::Broker(er.to_string()))?;
        e.set_metadata(r.to_text());
        c.commit(&tpl, CommitMode::Sync).map_err(|er| {
            KafkaError::Broker(format!(
                "writing the sink's registry (group {}.weir-sink): {er}",
                self.cfg.prefix
            ))
        })
    }

    /// Finishes the restored checkpoint's pending epochs of the writers that map to this
    /// subtask, and returns the markers the new run's snapshots keep knowing.
    pub(super) fn finish_restored(
        &mut self,
        restore: &Restore,
        lineage_token: u64,
    ) -> Result<Vec<KnownMarker>> {
        let mut partitions = BTreeMap::new();
        for topic in restore.marker_topics() {
            match admin::partitions(&self.cfg.brokers, &topic) {
                Ok(ps) => {
                    partitions.insert(topic, ps);
                }
                Err(KafkaError::MissingTopic { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let mut scanned: BTreeMap<MarkerPartition, Scanned> = BTreeMap::new();
        for ((topic, p), newest) in restore.marker_partitions(&partitions) {
            let exists = partitions.get(&topic).is_some_and(|ps| ps.contains(&p));
            let (low, high) = if exists {
                admin::watermarks(&self.cfg.brokers, &topic, p)?
            } else {
                (0, 0)
            };
            let at = match &newest {
                Some(n) if exists && low <= n.offset && n.offset < high => {
                    self.read_at(&topic, p, n.offset)?
                }
                _ => None,
            };
            let inc = Restore::incarnation(
                newest.as_ref(),
                exists,
                low,
                high,
                at.as_ref().map(|(k, v)| (&k[..], &v[..])),
            );
            let markers = match restore.scan_start(&(topic.clone(), p), inc, low) {
                Some(from) if from < high => self.scan_committed(&topic, p, from, high)?,
                _ => Vec::new(),
            };
            if !matches!(inc, Incarnation::Intact | Incarnation::Unrecorded) {
                tracing::warn!(
                    sink = %self.cfg.prefix,
                    subtask = self.subtask,
                    topic = %topic,
                    partition = p,
                    "kafka sink '{}': subtask {}: the commit markers the checkpoint \
                     recorded in {topic}/{p} are {} (the partition spans offsets {low}..{high})",
                    self.cfg.prefix,
                    self.subtask,
                    match inc {
                        Incarnation::Trimmed => "removed by retention",
                        Incarnation::Missing => "gone: the partition does not exist",
                        _ => "not there: the topic was deleted and created again?",
                    }
                );
            }
            scanned.insert(
                (topic.clone(), p),
                Scanned {
                    incarnation: inc,
                    low,
                    markers,
                },
            );
        }
        let decision = restore
            .decide(&scanned, self.cfg.accept_newer)
            .map_err(|e| KafkaError::RecoveryRefused(e.to_string()))?;
        for n in &decision.accepted_newer {
            tracing::warn!(
                sink = %self.cfg.prefix,
                subtask = n.subtask,
                epoch = n.epoch,
                checkpoint = n.checkpoint,
                "kafka sink '{}': subtask {} already committed output of checkpoint {} \
                 that restored checkpoint {} does not cover; accepted by configuration: that \
                 output will be written again (at-least-once restore)",
                self.cfg.prefix, n.subtask, n.epoch, n.checkpoint
            );
        }
        let mut replayed = Vec::new();
        for (w, d) in restore.writers.iter().zip(&decision.writers) {
            let mut committed = d.committed.clone();
            let mut replay: Vec<(PendingEpoch, Option<&str>)> =
                d.replay.iter().map(|e| (e.clone(), None)).collect();
            for (e, why) in &d.ask_output {
                if self.output_committed(w, e)? {
                    committed.push(e.epoch);
                } else {
                    replay.push((e.clone(), Some(why.as_str())));
                }
            }
            replay.sort_by_key(|(e, _)| e.epoch);
            committed.sort_unstable();
            for (e, why) in &replay {
                replayed.push(self.replay(w, e, lineage_token, *why)?);
            }
            if !committed.is_empty() || !replay.is_empty() {
                tracing::info!(
                    sink = %self.cfg.prefix,
                    subtask = self.subtask,
                    checkpoint = restore.checkpoint,
                    writer = w.subtask,
                    "kafka sink '{}': subtask {} restored from checkpoint {}; epochs of \
                     subtask {} committed before: {committed:?}; re-produced: {:?}{}",
                    self.cfg.prefix,
                    self.subtask,
                    restore.checkpoint,
                    w.subtask,
                    replay.iter().map(|(e, _)| e.epoch).collect::<Vec<_>>(),
                    if d.ask_output.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " ({} decided from the output records: {})",
                            d.ask_output.len(),
                            d.ask_output[0].1
                        )
                    }
                );
            }
        }
        Ok(restore.carry(&scanned, &decision, replayed))
    }

    /// The key and value of the record at `offset` of `topic`/`partition` (aborted or not),
    /// or `None` when no record is at that offset.
    fn read_at(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let c = read_consumer(&self.cfg.brokers, "read_uncommitted")?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
            .map_err(|e| KafkaError::Broker(e.to_string()))?;
        c.assign(&tpl)
            .map_err(|e| KafkaError::Broker(format!("assigning {topic}: {e}")))?;
        let deadline = Instant::now() + KAFKA_TIMEOUT;
        while Instant::now() < deadline {
            match c.poll(Duration::from_millis(100)) {
                None => {}
                Some(Ok(m)) => {
                    return Ok((m.offset() == offset).then(|| {
                        (
                            m.key().unwrap_or_default().to_vec(),
                            m.payload().unwrap_or_default().to_vec(),
                        )
                    }));
                }
                Some(Err(RdError::PartitionEOF(_))) => return Ok(None),
                Some(Err(e)) => {
                    return Err(KafkaError::Broker(format!(
                        "reading {topic}/{partition} at offset {offset}: {e}"
                    )));
                }
            }
        }
        Err(KafkaError::Recovery(format!(
            "reading {topic}/{partition} at offset {offset} took longer than {}s",
            KAFKA_TIMEOUT.as_secs()
        )))
    }

    /// The committed markers of `topic`/`partition` from `from` to `end`.
    fn scan_committed(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        end: i64,
    ) -> Result<Vec<ScannedMarker>> {
        let c = read_consumer(&self.cfg.brokers, "read_committed")?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(from))
            .map_err(|e| KafkaError::Broker(e.to_string()))?;
        c.assign(&tpl)
            .map_err(|e| KafkaError::Broker(format!("assigning {topic}: {e}")))?;
        let mut out = Vec::new();
        let read = read_to_end(&c, topic, [(partition, end)].into(), KAFKA_TIMEOUT, |m| {
            if let (Some(key), Some(value)) = (
                m.key().and_then(|k| std::str::from_utf8(k).ok()),
                m.payload().and_then(MarkerValue::parse),
            ) {
                out.push(ScannedMarker {
                    offset: m.offset(),
                    key: key.to_string(),
                    value,
                });
            }
            true
        })
        .map_err(|e| KafkaError::Broker(format!("reading commit markers from {topic}: {e}")))?;
        if let ReadEnd::TimedOut(_) = read {
            return Err(KafkaError::Recovery(format!(
                "reading commit markers from {topic}/{partition} did not reach offset {end} in \
                 {}s: is another transaction open on that topic?",
                KAFKA_TIMEOUT.as_secs()
            )));
        }
        Ok(out)
    }

    /// Whether a `read_committed` reader sees a record of epoch `e` of writer `w` (a
    /// transaction commits all its records or none, and a restore that wrote the epoch
    /// again kept its token): the answer when the commit markers cannot tell.
    fn output_committed(&self, w: &WriterRecovery, e: &PendingEpoch) -> Result<bool> {
        let topic = &w.identity.topic;
        let c = read_consumer(&self.cfg.brokers, "read_committed")?;
        let mut tpl = TopicPartitionList::new();
        let mut ends = BTreeMap::new();
        for &(p, first) in &e.first_offsets {
            let (low, high) = admin::watermarks(&self.cfg.brokers, topic, p)?;
            let from = first.max(low);
            if from < high {
                tpl.add_partition_offset(topic, p, Offset::Offset(from))
                    .map_err(|er| KafkaError::Broker(er.to_string()))?;
                ends.insert(p, high);
            }
        }
        if ends.is_empty() {
            return Ok(false);
        }
        c.assign(&tpl)
            .map_err(|er| KafkaError::Broker(format!("assigning {topic}: {er}")))?;
        let mut found = false;
        let read = read_to_end(&c, topic, ends, KAFKA_TIMEOUT * 5, |m| {
            found = m
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == TXN_HEADER).and_then(|h| h.value))
                .and_then(txn::decode_header)
                .is_some_and(|(l, t, _)| l == w.subtask && t == e.token);
            !found
        })
        .map_err(|er| KafkaError::Broker(format!("reading {topic}: {er}")))?;
        if let (ReadEnd::TimedOut(left), false) = (read, found) {
            return Err(KafkaError::Recovery(format!(
                "reading {topic} (partitions {left:?}) to tell whether checkpoint {} of subtask \
                 {} committed did not finish in {}s: is another transaction open on that topic?",
                e.epoch,
                w.subtask,
                (KAFKA_TIMEOUT * 5).as_secs()
            )));
        }
        Ok(found)
    }

    /// Reads an epoch that did not commit back from the log and writes it again, with a
    /// marker closing its original token in its original marker partition, in one
    /// transaction. `why`: the markers could not tell, and why. Returns the new marker.
    fn replay(
        &mut self,
        w: &WriterRecovery,
        e: &PendingEpoch,
        lineage_token: u64,
        why: Option<&str>,
    ) -> Result<KnownMarker> {
        let topic = w.identity.topic.clone();
        let writer = w.subtask;
        let c = read_consumer(&self.cfg.brokers, "read_uncommitted")?;
        let mut tpl = TopicPartitionList::new();
        let mut ends = BTreeMap::new();
        let gone = |detail: String| {
            let markers = why.map_or(String::new(), |w| {
                format!("the commit markers cannot tell ({w}), and ")
            });
            KafkaError::RecoveryRefused(format!(
                "checkpoint {} of subtask {writer} pre-committed {} records to {topic} that were \
                 not committed; {markers}{detail}. Refusing to resume with a gap in the output; \
                 raise the topic's retention.ms",
                e.epoch, e.records
            ))
        };
        for &(p, from) in &e.first_offsets {
            let (low, high) = admin::watermarks(&self.cfg.brokers, &topic, p)?;
            if low > from {
                return Err(gone(format!(
                    "its records in {topic}/{p} from offset {from} were removed by retention (the \
                     partition now starts at {low})"
                )));
            }
            tpl.add_partition_offset(&topic, p, Offset::Offset(from))
                .map_err(|er| KafkaError::Broker(er.to_string()))?;
            ends.insert(p, high);
        }
        type Rec = (i32, Option<Vec<u8>>, Option<Vec<u8>>, Option<i64>);
        let mut col: EpochCollector<Rec> = EpochCollector::new(writer, e.token, e.records);
        if !ends.is_empty() {
            c.assign(&tpl)
                .map_err(|er| KafkaError::Broker(format!("assigning {topic}: {er}")))?;
        }
        if !col.is_complete() {
            // A timeout leaves records missing, which `finish` reports below.
            read_to_end(&c, &topic, ends, KAFKA_TIMEOUT * 5, |m| {
                if let Some(h) = m.headers()
                    && let Some(v) = h.iter().find(|h| h.key == TXN_HEADER).and_then(|h| h.value)
                {
                    col.offer(v, || {
                        (
                            m.partition(),
                            m.key().map(<[u8]>::to_vec),
                            m.payload().map(<[u8]>::to_vec),
                            m.timestamp().to_millis(),
                        )
                    });
                }
                !col.is_complete()
            })
            .map_err(|er| KafkaError::Broker(format!("reading back {topic}: {er}")))?;
        }
        let records = col.finish().map_err(|missing| {
            gone(format!(
                "records {missing:?} of its transaction are no longer in the log (retention or a \
                 deleted topic?)"
            ))
        })?;
        // The marker goes where the epoch's own marker went (its topic, even after a
        // rename, and partition), so everything that may close the epoch is after that
        // marker in log order.
        let marker_topic = &w.identity.marker_topic;
        admin::ensure_topic(&self.cfg.brokers, marker_topic, 1, &[])?;
        let partitions = admin::partitions(&self.cfg.brokers, marker_topic)?.len() as i32;
        let producer = &self.producers[0];
        producer
            .begin_transaction()
            .map_err(|er| KafkaError::Broker(format!("begin transaction: {er}")))?;
        reset(producer);
        for (seq, (p, k, v, ts)) in records.iter().enumerate() {
            let h = txn::encode_header(writer, e.token, seq as u64);
            let headers = OwnedHeaders::new_with_capacity(1).insert(Header {
                key: TXN_HEADER,
                value: Some(&h[..]),
            });
            let mut r: BaseRecord<'_, [u8], [u8], usize> = BaseRecord::with_opaque_to(&topic, 0)
                .partition(*p)
                .headers(headers);
            if let Some(k) = k {
                r = r.key(&k[..]);
            }
            if let Some(v) = v {
                r = r.payload(&v[..]);
            }
            if let Some(ts) = ts {
                r = r.timestamp(*ts);
            }
            send(producer, r)?;
            if seq == records.len() / 2 {
                failpoint::hit("kafka.during_replay");
            }
        }
        let key = w.identity.marker_key(writer);
        let copy = super::random_u64().max(1);
        let value = MarkerValue::Closes {
            lineage: if w.legacy {
                lineage_token
            } else {
                w.lineage_token
            },
            subtask: writer,
            epoch: e.epoch,
            token: e.token,
            copy,
        }
        .encode();
        let partition = e.marker.0.min(partitions - 1);
        send(
            producer,
            BaseRecord::with_opaque_to(marker_topic, 1)
                .partition(partition)
                .key(key.as_bytes())
                .payload(value.as_bytes()),
        )?;
        flush(producer)?;
        let (p, o) = take_deliveries(producer)?.1.ok_or_else(|| {
            KafkaError::Broker("the commit marker's delivery was not reported".into())
        })?;
        producer
            .commit_transaction(KAFKA_TIMEOUT)
            .map_err(|er| KafkaError::Broker(format!("committing the re-produced epoch: {er}")))?;
        tracing::info!(
            sink = %w.identity.prefix,
            writer,
            epoch = e.epoch,
            records = e.records,
            "kafka sink '{}': re-produced {} records of checkpoint {} (subtask {writer}), \
             which was pre-committed but not committed before the failure",
            w.identity.prefix, e.records, e.epoch
        );
        Ok(KnownMarker {
            topic: marker_topic.clone(),
            partition: p,
            key,
            subtask: writer,
            offset: o,
            token: Some(e.token),
            copy,
        })
    }
}
