//! The Kafka sink: exactly-once through transactions tied to checkpoints, or at-least-once.
//!
//! Exactly-once, per subtask (see `docs/kafka.md` and `docs/decisions/0012-kafka-sink-recovery.md`,
//! `0018-kafka-sink-identity.md`):
//! - records of an epoch go out in one transaction of a small pool of transactional
//!   producers (`{prefix}-{subtask}-{slot}`), each with a header naming the subtask, the
//!   transaction's token and the record's sequence number;
//! - at the barrier of checkpoint `n` (pre-commit): a commit marker (key `{prefix}/{subtask}`,
//!   value naming the sink's lineage, the subtask, `n` and the token) joins the transaction,
//!   every delivery is confirmed, and the checkpoint keeps the sink's identity and
//!   `{n, slot, token, record count, first offset per partition, marker offset}`;
//! - when a checkpoint completes: the pending transactions up to it commit, oldest first
//!   (those of intermediate savepoints included, which are never notified);
//! - on restore: every transactional id that may hold an open transaction is fenced, each
//!   pending epoch counts as committed if a committed marker closes its token (or, when the
//!   markers are gone, its records are visible to `read_committed`), and each that did not is
//!   read back from the log (`read_uncommitted`: aborted records stay in the log) and
//!   re-produced, in order, in a new transaction with its marker — before the job processes
//!   anything.

mod claims;
mod config;
mod io;
mod recovery;
mod validate;

pub use config::{DeliveryGuarantee, EXTRA_PRODUCERS, KafkaSink};
pub(crate) use io::{Prod, flush, reporting_producer, send, take_deliveries};

use crate::admin;
use crate::txn::{
    self, MarkerValue, Registered, Restore, SinkSnapshot, TXN_HEADER, TxnBook, transactional_id,
};
use crate::{KafkaError, Result};
use io::{DeliveryContext, KAFKA_TIMEOUT, join_all, reset};
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer};
use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;
use std::time::Duration;
use weir_core::failpoint;
use weir_core::ids::CheckpointId;
use weir_core::prelude::{SinkContext, SinkFunction};
use weir_core::time::{NO_TIMESTAMP, Timestamp};

/// One subtask of a [`KafkaSink`].
pub struct KafkaSinkFunction<T> {
    cfg: KafkaSink<T>,
    subtask: u32,
    parallelism: u32,
    checkpointing: bool,
    producers: Vec<Prod>,
    book: TxnBook,
    restored: Option<(u64, Vec<SinkSnapshot>)>,
    marker_topic: String,
    marker_partitions: i32,
    since_poll: u32,
    claim: Option<claims::Claim>,
    /// `kafka_sink_pending_epochs` of this subtask (exactly-once only).
    pending_epochs: Option<weir_core::metrics::Gauge>,
}

impl<T: 'static> KafkaSinkFunction<T> {
    pub(crate) fn new(cfg: KafkaSink<T>) -> Self {
        let marker_topic = cfg.marker_topic_name();
        KafkaSinkFunction {
            book: TxnBook::new(0, cfg.pool),
            cfg,
            subtask: 0,
            parallelism: 1,
            checkpointing: false,
            producers: Vec::new(),
            restored: None,
            marker_topic,
            marker_partitions: 1,
            since_poll: 0,
            claim: None,
            pending_epochs: None,
        }
    }

    /// Publishes how many epochs wait for their checkpoint (exactly-once only).
    fn show_pending(&self) {
        if let Some(g) = &self.pending_epochs {
            g.set(self.book.pending().count() as i64);
        }
    }

    fn base_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        let txn = self
            .cfg
            .effective_transaction_timeout()
            .unwrap_or(self.cfg.transaction_timeout);
        let txn_ms = txn.as_millis().max(1000) as u64;
        c.set("bootstrap.servers", &self.cfg.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            // Output becomes visible at checkpoint completion anyway: fewer, larger
            // batches cost the broker (which shares the machine) far less CPU.
            .set("linger.ms", "50")
            .set("batch.num.messages", "100000")
            .set("batch.size", "4000000")
            .set("message.timeout.ms", txn_ms.min(300_000).to_string())
            .set("transaction.timeout.ms", txn_ms.to_string())
            .set("partitioner", "murmur2_random");
        for (k, v) in &self.cfg.props {
            c.set(k, v);
        }
        c
    }

    fn producer(&self, transactional_id: Option<&str>) -> Result<Prod> {
        let mut c = self.base_config();
        if let Some(id) = transactional_id {
            c.set("transactional.id", id);
        }
        c.create_with_context(DeliveryContext {
            d: Mutex::new(Default::default()),
        })
        .map_err(|e| KafkaError::Config(format!("cannot create a Kafka producer: {e}")))
    }

    /// Creates the producer of a transactional id and initialises it, which fences every
    /// earlier producer of that id and aborts its open transaction.
    fn init_producer(&self, id: &str, what: &str) -> Result<Prod> {
        let p = self.producer(Some(id))?;
        p.init_transactions(KAFKA_TIMEOUT)
            .map_err(|e| KafkaError::Broker(format!("{what} transactional id '{id}': {e}")))?;
        Ok(p)
    }

    /// Opens the exactly-once sink (or, with `keep` 1, finishes a restored exactly-once
    /// checkpoint for an at-least-once run): fences, creates `keep` producers of this
    /// subtask, and finishes the restored pending epochs before anything is written.
    fn open_transactional(&mut self, ctx: &SinkContext, keep: u32) -> Result<()> {
        let (checkpoint, snaps) = self.restored.take().unwrap_or_default();
        let identity = self.cfg.identity();
        let restore = Restore::new(
            identity.clone(),
            &snaps,
            self.subtask,
            self.parallelism,
            checkpoint,
        );
        let max_pool = self.cfg.pool + EXTRA_PRODUCERS;
        let own: Vec<String> = (0..keep)
            .map(|s| transactional_id(&self.cfg.prefix, self.subtask, s))
            .collect();
        // Validation first: an unreachable broker or a wrong setting fails here within the
        // metadata timeout, before anything waits on the longer transaction timeouts.
        self.validate(ctx, true)?;
        // Initialising a transactional id takes the broker a few hundred milliseconds
        // (coordinator look-up, then InitProducerId). This subtask's own ids do not depend
        // on anything below, so they are initialised meanwhile, and the ids to fence all at
        // once; nothing is written before every one of them is done.
        let this = &*self;
        let (prepared, inited) = std::thread::scope(|s| {
            let inited: Vec<_> = own
                .iter()
                .map(|id| s.spawn(move || this.init_producer(id, "initialising")))
                .collect();
            let prepared = (|| {
                admin::ensure_topic(&this.cfg.brokers, &this.marker_topic, 1, &[])?;
                let marker_partitions =
                    admin::partitions(&this.cfg.brokers, &this.marker_topic)?.len() as i32;
                // Runs announce their parallelism before they write (below), so subtasks of
                // a run that crashed before its first checkpoint are fenced too — under
                // every prefix the restored snapshots name.
                let mut registered = std::collections::BTreeMap::new();
                for (prefix, marker_topic) in restore.registries(&snaps) {
                    let current = prefix == this.cfg.prefix && marker_topic == this.marker_topic;
                    let r = this.registered(&prefix, &marker_topic, current)?;
                    let e: &mut Registered = registered.entry(prefix).or_default();
                    *e = e.max(r);
                }
                let fence: Vec<String> = restore
                    .fence(max_pool, &registered)
                    .into_iter()
                    .filter(|id| !own.contains(id))
                    .collect();
                // Fencing: the producers are dropped once initialised: the bumped epoch
                // is the fence.
                let fenced: Vec<_> = fence
                    .into_iter()
                    .map(|id| s.spawn(move || this.init_producer(&id, "fencing")))
                    .collect();
                join_all(fenced)?;
                // Subtask 0 announces this run before any transaction of it begins: sources
                // emit nothing until every task has opened, and transactions begin with the
                // first record.
                let before = registered
                    .get(&this.cfg.prefix)
                    .copied()
                    .unwrap_or_default();
                let this_run = Registered {
                    parallelism: this.parallelism,
                    pool: max_pool,
                };
                if this.subtask == 0 && before.max(this_run) != before {
                    this.register(before.max(this_run))?;
                }
                Ok::<_, KafkaError>(marker_partitions)
            })();
            (prepared, join_all(inited))
        });
        // An error of the marker topic or the registry explains more than the
        // initialisation error it may cause.
        self.marker_partitions = prepared?;
        self.producers = inited?;
        let seed = random_u64() ^ (u64::from(std::process::id()) << 32);
        let lineage_token = restore.lineage_token(random_u64());
        let mut book = TxnBook::new(self.subtask, self.cfg.pool)
            .with_run_id(seed)
            .with_max_pool(max_pool)
            .with_identity(identity, lineage_token, &restore.lineage_tokens);
        if !snaps.is_empty() {
            book = book.carry(self.finish_restored(&restore, lineage_token)?);
        }
        self.book = book;
        Ok(())
    }

    fn poll_some(&mut self) {
        self.since_poll += 1;
        if self.since_poll >= 512 {
            self.since_poll = 0;
            for p in &self.producers {
                p.poll(Duration::ZERO);
            }
        }
    }

    /// Opens a transaction for the next epoch, adding a producer to the pool when every
    /// one holds an epoch waiting for its checkpoint.
    fn begin(&mut self) -> Result<u32> {
        let s = self
            .book
            .begin()
            .map_err(|e| KafkaError::Transaction(e.to_string()))?;
        while self.producers.len() <= s as usize {
            let slot = self.producers.len() as u32;
            let id = transactional_id(&self.cfg.prefix, self.subtask, slot);
            tracing::info!(
                sink = %self.cfg.prefix,
                subtask = self.subtask,
                producer = %id,
                "kafka sink '{}': subtask {} adds producer {id}: {} epochs wait for a \
                 checkpoint to complete (savepoints or failed checkpoints)",
                self.cfg.prefix,
                self.subtask,
                self.book.pending().count()
            );
            let p = self.init_producer(&id, "initialising")?;
            self.producers.push(p);
        }
        let p = &self.producers[s as usize];
        p.begin_transaction()
            .map_err(|e| KafkaError::Broker(format!("begin transaction: {e}")))?;
        reset(p);
        Ok(s)
    }

    fn precommit(&mut self, epoch: u64) -> Result<()> {
        let (Some(slot), Some(token)) = (self.book.open_slot(), self.book.open_token()) else {
            return Ok(());
        };
        if self.book.open_records() == 0 {
            return Ok(());
        }
        let producer = &self.producers[slot as usize];
        let key = txn::marker_key(&self.cfg.prefix, self.subtask);
        let value = MarkerValue::Closes {
            lineage: self.book.lineage_token(),
            subtask: self.subtask,
            epoch,
            token,
            copy: 0,
        }
        .encode();
        send(
            producer,
            BaseRecord::with_opaque_to(&self.marker_topic, 1)
                .partition(self.subtask as i32 % self.marker_partitions)
                .key(key.as_bytes())
                .payload(value.as_bytes()),
        )?;
        flush(producer)?;
        let (first, marker) = take_deliveries(producer)?;
        let marker = marker.ok_or_else(|| {
            KafkaError::Broker("the commit marker's delivery was not reported".into())
        })?;
        for (p, o) in first {
            self.book.delivered(p, o);
        }
        self.book
            .precommit(epoch, marker)
            .map_err(|e| KafkaError::Transaction(e.to_string()))?;
        Ok(())
    }

    fn commit_through(&mut self, checkpoint: u64) -> Result<()> {
        for (slot, epoch) in self.book.complete(checkpoint) {
            failpoint::hit("kafka.before_commit");
            if failpoint::armed("kafka.during_commit") {
                std::thread::spawn(|| failpoint::hit("kafka.during_commit"));
            }
            self.producers[slot as usize]
                .commit_transaction(KAFKA_TIMEOUT)
                .map_err(|e| {
                    KafkaError::Broker(format!(
                        "committing the transaction of checkpoint {epoch}: {e}; the job restarts \
                         and the restore re-produces it{}",
                        fenced_hint(&e.to_string(), &self.cfg.prefix)
                    ))
                })?;
            self.book
                .committed(epoch)
                .map_err(|e| KafkaError::Transaction(e.to_string()))?;
            failpoint::hit("kafka.after_commit");
        }
        Ok(())
    }
}

/// A word on who fenced the sink, when an error says it was fenced.
fn fenced_hint(error: &str, prefix: &str) -> String {
    if error.to_lowercase().contains("fenced") {
        format!(
            " (another producer initialised this transactional id: a newer process of this \
             job, or another sink or job using the prefix '{prefix}')"
        )
    } else {
        String::new()
    }
}

/// A random number (tokens of transactions and lineages).
fn random_u64() -> u64 {
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

impl<T: 'static> SinkFunction<T> for KafkaSinkFunction<T> {
    fn restore(
        &mut self,
        checkpoint: CheckpointId,
        states: &[Vec<u8>],
        _ctx: &SinkContext,
    ) -> weir_core::Result<()> {
        let identity = self.cfg.identity();
        let mut snaps = Vec::new();
        for s in states.iter().filter(|s| !s.is_empty()) {
            snaps.push(txn::decode_snapshot(s, &identity).map_err(KafkaError::Recovery)?);
        }
        self.restored = Some((checkpoint.0, snaps));
        Ok(())
    }

    fn open(&mut self, ctx: &SinkContext) -> weir_core::Result<()> {
        self.subtask = ctx.subtask as u32;
        self.parallelism = ctx.parallelism as u32;
        self.checkpointing = ctx.checkpointing;
        match self.cfg.guarantee {
            DeliveryGuarantee::ExactlyOnce => {
                self.claim = Some(claims::claim(
                    &self.cfg.brokers,
                    &self.cfg.prefix,
                    &ctx.operator_id,
                    &ctx.name,
                )?);
                self.open_transactional(ctx, self.cfg.pool)?;
                let subtask = ctx.subtask.to_string();
                self.pending_epochs = Some(weir_core::metrics::gauge(
                    "kafka_sink_pending_epochs",
                    "Transactions of an exactly-once Kafka sink subtask pre-committed at a \
                     checkpoint and not committed yet: waiting for it to complete (after a \
                     savepoint, for the next checkpoint).",
                    &[("operator", &ctx.name), ("subtask", &subtask)],
                ));
                self.show_pending();
            }
            DeliveryGuarantee::AtLeastOnce => {
                // Switched from exactly-once: finish the restored checkpoint's transactions
                // (commit or re-produce its pending epochs, fence what it left open) first.
                if self.restored.as_ref().is_some_and(|(_, s)| !s.is_empty()) {
                    self.open_transactional(ctx, 1)?;
                    self.producers.clear();
                } else {
                    self.validate(ctx, false)?;
                }
                self.producers = vec![self.producer(None)?];
            }
        }
        Ok(())
    }

    fn invoke(&mut self, value: T, ts: Timestamp) -> weir_core::Result<()> {
        let (slot, header) = match self.cfg.guarantee {
            DeliveryGuarantee::AtLeastOnce => (0, None),
            DeliveryGuarantee::ExactlyOnce => {
                let slot = match self.book.open_slot() {
                    Some(s) => s,
                    None => self.begin()?,
                };
                let token = self.book.open_token().expect("a transaction is open");
                let seq = self
                    .book
                    .next_seq()
                    .map_err(|e| KafkaError::Transaction(e.to_string()))?;
                (slot, Some(txn::encode_header(self.subtask, token, seq)))
            }
        };
        let ser = self.cfg.serializer.as_ref().expect("validated in open");
        let (key, payload) = ser(&value);
        let mut r: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(&self.cfg.topic, 0);
        if let Some(p) = &payload {
            r = r.payload(&p[..]);
        }
        if let Some(k) = &key {
            r = r.key(&k[..]);
        }
        if ts != NO_TIMESTAMP {
            r = r.timestamp(ts);
        }
        if let Some(h) = &header {
            r = r.headers(OwnedHeaders::new_with_capacity(1).insert(Header {
                key: TXN_HEADER,
                value: Some(&h[..]),
            }));
        }
        send(&self.producers[slot as usize], r)?;
        self.poll_some();
        Ok(())
    }

    fn snapshot(
        &mut self,
        checkpoint: CheckpointId,
    ) -> weir_core::Result<Option<(Vec<u8>, String)>> {
        match self.cfg.guarantee {
            DeliveryGuarantee::AtLeastOnce => {
                let p = &self.producers[0];
                flush(p)?;
                take_deliveries(p)?;
                Ok(None)
            }
            DeliveryGuarantee::ExactlyOnce => {
                self.precommit(checkpoint.0)?;
                self.show_pending();
                failpoint::hit("kafka.after_precommit");
                let snap = self.book.snapshot(self.parallelism);
                let summary = format!(
                    "pending transactions {:?}",
                    snap.pending
                        .iter()
                        .map(|p| (p.epoch, p.records))
                        .collect::<Vec<_>>()
                );
                let bytes = txn::encode_snapshot(&snap).map_err(weir_core::Error::Codec)?;
                Ok(Some((bytes, summary)))
            }
        }
    }

    fn notify_complete(&mut self, checkpoint: CheckpointId) -> weir_core::Result<()> {
        if self.cfg.guarantee == DeliveryGuarantee::ExactlyOnce {
            self.commit_through(checkpoint.0)?;
            self.show_pending();
        }
        Ok(())
    }

    fn finish(&mut self) -> weir_core::Result<()> {
        match self.cfg.guarantee {
            DeliveryGuarantee::AtLeastOnce => {
                let p = &self.producers[0];
                flush(p)?;
                take_deliveries(p)?;
            }
            DeliveryGuarantee::ExactlyOnce if !self.checkpointing => {
                // Without checkpoints the whole run is one epoch, committed at end of input
                // (a single subtask: parallelism > 1 is refused at start-up).
                if let Some(slot) = self.book.open_slot() {
                    let p = &self.producers[slot as usize];
                    flush(p)?;
                    take_deliveries(p)?;
                    p.commit_transaction(KAFKA_TIMEOUT).map_err(|e| {
                        KafkaError::Broker(format!("committing at end of input: {e}"))
                    })?;
                }
            }
            DeliveryGuarantee::ExactlyOnce => {}
        }
        Ok(())
    }
}
