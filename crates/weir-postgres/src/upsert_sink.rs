//! One subtask of an [`Upserts`] sink: collapses the changes per key, and writes them —
//! exactly-once as one APPLY-protocol transaction per checkpoint and subtask when the
//! checkpoint completes, or at-least-once in batches as they come.
//!
//! Exactly-once, per subtask:
//! - records: the buffer keeps the latest value (or the deletion) per key;
//! - at the barrier of checkpoint `n`: the buffer becomes the batch of `n` (its rows
//!   encoded once, with an idempotency key `{operator}/{subtask}/{n}/{run}`) and joins the
//!   pending batches, which the checkpoint keeps;
//! - when checkpoint `n` completes: the pending batches up to `n` are applied, oldest first,
//!   each in one transaction that also marks its key DONE ([`Store::apply`]);
//! - on restore: the restored pending batches are applied before anything else, each by the
//!   new subtask `old subtask % parallelism` (so the batches of one old subtask stay in
//!   order); a batch applied before the failure finds its key DONE and changes nothing.

use crate::apply::{Applied, ApplyError, Store};
use crate::delivery::{Delivery, Undelivered};
use crate::sink::SqlParams;
use crate::upsert::{UpsertGuarantee, Upserts};
use crate::upsert_table::WriteError;
use crate::{classify_apply, classify_pg, describe};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use weir_core::changelog::Change;
use weir_core::codec;
use weir_core::data::{Data, Key};
use weir_core::ids::CheckpointId;
use weir_core::metrics::{self, Counter};
use weir_core::ops::sink::{SinkContext, SinkFunction};
use weir_core::retry::{Failed, Outcome};
use weir_core::time::Timestamp;
use weir_core::{Error, Result};

/// How often subtask 0 deletes batch keys older than the retention.
const CLEANUP_EVERY: Duration = Duration::from_secs(3600);

/// The collapsed changes of one subtask between two checkpoint barriers.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Batch {
    /// The checkpoint whose barrier closed it.
    checkpoint: u64,
    /// The subtask that wrote it.
    subtask: u32,
    /// Its idempotency key in the APPLY protocol.
    key: String,
    /// The rows, `Vec<(K, Option<V>)>` sorted by key, encoded once: what the payload hash
    /// covers, identical in every replay.
    rows: Vec<u8>,
}

/// One subtask of an [`Upserts`] sink, made by [`Upserts::make`].
pub struct UpsertSink<K, V> {
    cfg: Upserts<K, V>,
    buffer: BTreeMap<K, Option<V>>,
    pending: Vec<Batch>,
    restored: Vec<Batch>,
    open: Option<Open>,
}

struct Open {
    delivery: Delivery,
    /// The APPLY protocol's table (exactly-once, and restored exactly-once batches).
    store: Store,
    name: String,
    handler: String,
    operator: String,
    subtask: u32,
    checkpointing: bool,
    /// Distinguishes this run's batch keys from those of earlier runs that reached the
    /// same checkpoint numbers (a restore from an older checkpoint or savepoint).
    run: u64,
    last_flush: Instant,
    last_cleanup: Option<Instant>,
    rows: Counter,
    batches: Counter,
    replayed: Counter,
}

impl<K, V> UpsertSink<K, V> {
    pub(crate) fn new(cfg: Upserts<K, V>) -> Self {
        UpsertSink {
            cfg,
            buffer: BTreeMap::new(),
            pending: Vec::new(),
            restored: Vec::new(),
            open: None,
        }
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

fn classify_write(e: &WriteError) -> Outcome {
    match e {
        WriteError::Db(e) => classify_pg(e),
        WriteError::Mapping(_) => Outcome::Permanent,
    }
}

impl<K: Key, V: Data> UpsertSink<K, V> {
    fn open_ref(&mut self) -> Result<&mut Open> {
        self.open
            .as_mut()
            .ok_or_else(|| Error::User("upsert sink used before open".into()))
    }

    /// The statement parameters of collapsed rows: upserts and deletes.
    fn params(&self, rows: &[(K, Option<V>)]) -> (Vec<(SqlParams, SqlParams)>, Vec<SqlParams>) {
        let key = self.cfg.key.as_ref().expect("checked in open");
        let (mut ups, mut dels) = (Vec::new(), Vec::new());
        for (k, v) in rows {
            match v {
                Some(v) => {
                    let vp = match &self.cfg.value {
                        Some(f) => f(v),
                        None => Vec::new(),
                    };
                    ups.push((key(k), vp));
                }
                None => dels.push(key(k)),
            }
        }
        (ups, dels)
    }

    fn failed<E: std::fmt::Display>(&self, name: &str, what: &str, f: &Failed<E>) -> Error {
        Error::User(format!(
            "upsert sink '{name}': {what} of table '{}' could not be written after {} \
             attempt(s) ({}): {}",
            self.cfg.spec.table, f.attempts, f.reason, f.error
        ))
    }

    /// Writes one batch through the APPLY protocol: its rows and its key, one transaction.
    fn apply(&mut self, batch: &Batch) -> Result<()> {
        let rows: Vec<(K, Option<V>)> = codec::decode(&batch.rows)?;
        let (ups, dels) = self.params(&rows);
        let hash = sha256_hex(&batch.rows);
        let spec = self.cfg.spec.clone();
        let open = self.open.as_mut().expect("open");
        let store = open.store.clone();
        let handler = open.handler.clone();
        let span = tracing::info_span!("upsert_batch", sink = %open.name, checkpoint = batch.checkpoint,
            key = %batch.key, upserts = ups.len(), deletes = dels.len());
        let _g = span.enter();
        let result = open.delivery.run(
            &mut |client, _| {
                store.apply(client, &handler, &batch.key, &hash, &mut |tx| {
                    spec.write(tx, &ups, &dels).map_err(|e| match e {
                        WriteError::Db(e) => Box::new(e) as crate::EffectError,
                        WriteError::Mapping(m) => m.into(),
                    })?;
                    Ok(serde_json::json!({ "upserts": ups.len(), "deletes": dels.len() }))
                })
            },
            ApplyError::Db,
            classify_apply,
        );
        match result {
            Ok(Applied::Fresh(_)) | Ok(Applied::TakenOver(_)) => {
                open.rows.add((ups.len() + dels.len()) as u64);
                open.batches.inc();
                tracing::debug!("batch applied");
                Ok(())
            }
            Ok(Applied::Duplicate(_)) => {
                open.replayed.inc();
                tracing::info!("batch was applied before the restore; skipped");
                Ok(())
            }
            Err(f) => {
                let name = open.name.clone();
                let what = if batch.checkpoint == u64::MAX {
                    "the changes at the end of input".to_string()
                } else {
                    format!("the changes of checkpoint {}", batch.checkpoint)
                };
                match open
                    .delivery
                    .give_up(f, &batch.key, || serde_json::Value::Null)?
                {
                    Undelivered::Failed(f) => Err(self.failed(&name, &what, &f)),
                    _ => Ok(()),
                }
            }
        }
    }

    /// Closes the buffer into a pending batch of `checkpoint`.
    fn close_batch(&mut self, checkpoint: u64, tag: &str) -> Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let rows: Vec<(K, Option<V>)> = std::mem::take(&mut self.buffer).into_iter().collect();
        let open = self.open_ref()?;
        let key = format!("{}/{}/{tag}/{:016x}", open.operator, open.subtask, open.run);
        let subtask = open.subtask;
        self.pending.push(Batch {
            checkpoint,
            subtask,
            key,
            rows: codec::encode(&rows)?,
        });
        Ok(())
    }

    /// At-least-once: writes the buffer in one transaction.
    fn flush(&mut self) -> Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let rows: Vec<(K, Option<V>)> = std::mem::take(&mut self.buffer).into_iter().collect();
        let (ups, dels) = self.params(&rows);
        let spec = self.cfg.spec.clone();
        let open = self.open.as_mut().expect("open");
        let result = open.delivery.run(
            &mut |client, _| {
                let mut tx = client.transaction().map_err(WriteError::Db)?;
                spec.write(&mut tx, &ups, &dels)?;
                tx.commit().map_err(WriteError::Db)
            },
            WriteError::Db,
            classify_write,
        );
        open.last_flush = Instant::now();
        match result {
            Ok(()) => {
                open.rows.add((ups.len() + dels.len()) as u64);
                open.batches.inc();
                Ok(())
            }
            Err(f) => {
                let name = open.name.clone();
                let n = ups.len() + dels.len();
                match open.delivery.give_up(f, "", || serde_json::Value::Null)? {
                    Undelivered::Failed(f) => {
                        Err(self.failed(&name, &format!("a batch of {n} changed row(s)"), &f))
                    }
                    _ => Ok(()),
                }
            }
        }
    }

    /// Subtask 0 deletes batch keys older than the retention, now and then.
    fn cleanup(&mut self) {
        let retention = self.cfg.retention;
        let Some(open) = self.open.as_mut() else {
            return;
        };
        if open.subtask != 0
            || open
                .last_cleanup
                .is_some_and(|t| t.elapsed() < CLEANUP_EVERY)
        {
            return;
        }
        open.last_cleanup = Some(Instant::now());
        if self.cfg.guarantee != UpsertGuarantee::ExactlyOnce {
            return;
        }
        let store = open.store.clone();
        let handler = open.handler.clone();
        let r = open
            .delivery
            .client()
            .and_then(|c| store.cleanup(c, &handler, retention, 10_000));
        if let Err(e) = r {
            tracing::warn!(handler = %handler, error = %describe(&e),
                "upsert sink: deleting old batch keys failed; trying again later");
        }
    }
}

impl<K: Key, V: Data> SinkFunction<Change<K, V>> for UpsertSink<K, V> {
    fn restore(
        &mut self,
        _checkpoint: CheckpointId,
        states: &[Vec<u8>],
        ctx: &SinkContext,
    ) -> Result<()> {
        let mut mine = Vec::new();
        for s in states {
            let batches: Vec<Batch> = codec::decode(s).map_err(|e| {
                Error::Config(format!(
                    "upsert sink '{}': the checkpoint's pending batches are unreadable ({e}); \
                     was the sink's uid given to another sink?",
                    ctx.name
                ))
            })?;
            mine.extend(
                batches
                    .into_iter()
                    .filter(|b| b.subtask as usize % ctx.parallelism == ctx.subtask),
            );
        }
        mine.sort_by_key(|b| (b.subtask, b.checkpoint));
        self.restored = mine;
        Ok(())
    }

    fn open(&mut self, ctx: &SinkContext) -> Result<()> {
        let c = &self.cfg;
        let bad = |m: String| Error::Config(format!("upsert sink '{}': {m}", ctx.name));
        c.spec.validate().map_err(bad)?;
        if c.key.is_none() {
            return Err(bad(format!(
                "no key columns for table '{}': name them with .key_columns(&[\"id\"], |k| ...)",
                c.spec.table
            )));
        }
        if c.value.is_none() && !c.spec.value_columns.is_empty() {
            return Err(bad("value columns without a mapping".into()));
        }
        let handler = format!("upsert {}", c.spec.table);
        let mut delivery = Delivery::open(&c.common, &handler, ctx)?;
        let client = delivery
            .client()
            .map_err(|e| bad(format!("connection lost: {}", describe(&e))))?;
        c.spec.check(client).map_err(bad)?;
        let store = Store::new(&c.keys_table, Duration::from_secs(60)).map_err(bad)?;
        // An at-least-once sink restored from an exactly-once checkpoint still writes the
        // checkpoint's pending batches once, through the protocol.
        if c.guarantee == UpsertGuarantee::ExactlyOnce || !self.restored.is_empty() {
            store.ensure_schema(client).map_err(|e| {
                bad(format!(
                    "cannot create the keys table '{}': {}",
                    c.keys_table,
                    describe(&e)
                ))
            })?;
        }
        let subtask = ctx.subtask.to_string();
        let l = [
            ("operator", ctx.name.as_str()),
            ("subtask", subtask.as_str()),
        ];
        self.open = Some(Open {
            delivery,
            store,
            name: ctx.name.clone(),
            handler,
            operator: ctx.operator_id.clone(),
            subtask: ctx.subtask as u32,
            checkpointing: ctx.checkpointing,
            run: random_u64(),
            last_flush: Instant::now(),
            last_cleanup: None,
            rows: metrics::counter(
                "upsert_rows_written_total",
                "Rows an upsert sink inserted, updated or deleted.",
                &l,
            ),
            batches: metrics::counter(
                "upsert_batches_written_total",
                "Transactions an upsert sink committed.",
                &l,
            ),
            replayed: metrics::counter(
                "upsert_batches_skipped_total",
                "Restored batches an exactly-once upsert sink found applied already.",
                &l,
            ),
        });
        for batch in std::mem::take(&mut self.restored) {
            self.apply(&batch)?;
        }
        self.cleanup();
        Ok(())
    }

    fn invoke(&mut self, change: Change<K, V>, _ts: Timestamp) -> Result<()> {
        let (key, value) = match change {
            Change::Insert { key, value } => (key, Some(value)),
            Change::Update { key, new, .. } => (key, Some(new)),
            Change::Delete { key, .. } => (key, None),
        };
        self.buffer.insert(key, value);
        if self.cfg.guarantee == UpsertGuarantee::AtLeastOnce {
            let due = self.open_ref()?.last_flush.elapsed() >= self.cfg.flush_interval;
            if due || self.buffer.len() >= self.cfg.batch_size {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn snapshot(&mut self, checkpoint: CheckpointId) -> Result<Option<(Vec<u8>, String)>> {
        match self.cfg.guarantee {
            UpsertGuarantee::AtLeastOnce => {
                self.flush()?;
                Ok(None)
            }
            UpsertGuarantee::ExactlyOnce => {
                self.close_batch(checkpoint.0, &checkpoint.0.to_string())?;
                let desc = format!(
                    "pending upsert batches (checkpoint, bytes): {:?}",
                    self.pending
                        .iter()
                        .map(|b| (b.checkpoint, b.rows.len()))
                        .collect::<Vec<_>>()
                );
                Ok(Some((codec::encode(&self.pending)?, desc)))
            }
        }
    }

    fn notify_complete(&mut self, checkpoint: CheckpointId) -> Result<()> {
        let (due, keep): (Vec<Batch>, Vec<Batch>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|b| b.checkpoint <= checkpoint.0);
        self.pending = keep;
        for (i, b) in due.iter().enumerate() {
            if let Err(e) = self.apply(b) {
                // Keep what is not written for the next completed checkpoint (a restore
                // writes it anyway).
                let mut rest = due[i..].to_vec();
                rest.append(&mut self.pending);
                self.pending = rest;
                return Err(e);
            }
        }
        self.cleanup();
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        match self.cfg.guarantee {
            UpsertGuarantee::AtLeastOnce => self.flush(),
            UpsertGuarantee::ExactlyOnce => {
                if self.open_ref()?.checkpointing {
                    // The final checkpoint wrote everything; nothing may be left.
                    if !self.buffer.is_empty() {
                        return Err(Error::Config(
                            "changes arrived after the final checkpoint barrier; they would not be written".into(),
                        ));
                    }
                    return Ok(());
                }
                self.close_batch(u64::MAX, "end")?;
                for b in std::mem::take(&mut self.pending) {
                    self.apply(&b)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(subtask: u32, checkpoint: u64) -> Batch {
        Batch {
            checkpoint,
            subtask,
            key: format!("op/{subtask}/{checkpoint}/0"),
            rows: codec::encode(&vec![(subtask as i64, Some(checkpoint as i64))]).unwrap(),
        }
    }

    fn ctx(subtask: usize, parallelism: usize) -> SinkContext {
        SinkContext {
            subtask,
            parallelism,
            checkpointing: true,
            checkpoint_timing: None,
            name: "totals".into(),
            operator_id: "op".into(),
        }
    }

    #[test]
    fn a_restore_gives_each_old_subtasks_batches_to_one_new_subtask_in_checkpoint_order() {
        // Three old subtasks; old subtask 0 left two batches (checkpoint 4 not yet written
        // when 5 was taken), listed out of order.
        let states = vec![
            codec::encode(&vec![batch(0, 5), batch(0, 4)]).unwrap(),
            codec::encode(&vec![batch(1, 5)]).unwrap(),
            codec::encode(&vec![batch(2, 5)]).unwrap(),
        ];
        let mut got = Vec::new();
        for new in 0..2 {
            let mut s = UpsertSink::<i64, i64>::new(Upserts::new("postgres://x", "t"));
            s.restore(CheckpointId(5), &states, &ctx(new, 2)).unwrap();
            got.push(
                s.restored
                    .iter()
                    .map(|b| (b.subtask, b.checkpoint))
                    .collect::<Vec<_>>(),
            );
        }
        assert_eq!(got, vec![vec![(0, 4), (0, 5), (2, 5)], vec![(1, 5)]]);
    }

    #[test]
    fn an_unreadable_snapshot_names_the_sink() {
        let mut s = UpsertSink::<i64, i64>::new(Upserts::new("postgres://x", "t"));
        let e = s
            .restore(CheckpointId(1), &[vec![0xff; 3]], &ctx(0, 1))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("upsert sink 'totals'") && e.contains("unreadable"),
            "{e}"
        );
    }

    #[test]
    fn the_payload_hash_is_sha256_of_the_encoded_rows() {
        // `printf abc | sha256sum`
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
