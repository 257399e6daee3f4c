//! The sink's start-up checks: settings against each other and against the broker.

use super::{DeliveryGuarantee, KafkaSinkFunction};
use crate::admin;
use crate::{KafkaError, Result};
use weir_core::prelude::SinkContext;

impl<T: 'static> KafkaSinkFunction<T> {
    /// Checks the settings against each other and against the broker; `transactions`: the
    /// sink will use transactions (exactly-once, or finishing an exactly-once checkpoint).
    pub(super) fn validate(&self, ctx: &SinkContext, transactions: bool) -> Result<()> {
        for (k, v) in &self.cfg.props {
            let bad = match k.as_str() {
                "acks" | "request.required.acks" => !matches!(v.as_str(), "all" | "-1"),
                "enable.idempotence" => v != "true",
                "transactional.id" => true,
                _ => false,
            };
            if bad {
                return Err(KafkaError::Config(format!(
                    "the Kafka sink needs acks=all and enable.idempotence=true and sets \
                     transactional.id itself; remove the setting {k}={v}"
                )));
            }
        }
        if self.cfg.serializer.is_none() {
            return Err(KafkaError::Config(format!(
                "the Kafka sink for topic '{}' has no serializer; call .serializer(...)",
                self.cfg.topic
            )));
        }
        let txn = self.cfg.effective_transaction_timeout()?;
        admin::partitions(&self.cfg.brokers, &self.cfg.topic)?;
        if !transactions {
            return Ok(());
        }
        if self.cfg.guarantee == DeliveryGuarantee::ExactlyOnce
            && !ctx.checkpointing
            && ctx.parallelism > 1
        {
            return Err(KafkaError::Config(format!(
                "the exactly-once Kafka sink '{}' runs at parallelism {} in a job without \
                 checkpoints: each subtask would commit its transaction at the end of input on \
                 its own, and a failure between two commits would write the committed part again \
                 on restart. Enable checkpointing, run the sink at parallelism 1 \
                 (.parallelism(1) on the sink), or choose DeliveryGuarantee::AtLeastOnce",
                ctx.name, ctx.parallelism
            )));
        }
        if let Some((interval, timeout)) = ctx.checkpoint_timing {
            let needed = interval + timeout;
            if txn < needed {
                return Err(KafkaError::Config(format!(
                    "transaction.timeout.ms ({} ms) is shorter than the checkpoint interval plus \
                     the checkpoint timeout ({} ms + {} ms): a transaction must outlive the \
                     checkpoint that commits it; raise the sink's transaction_timeout or shorten \
                     the checkpoint interval/timeout",
                    txn.as_millis(),
                    interval.as_millis(),
                    timeout.as_millis()
                )));
            }
        }
        if let Some(max) = admin::broker_setting(&self.cfg.brokers, "transaction.max.timeout.ms")?
            && let Ok(max) = max.parse::<u128>()
            && txn.as_millis() > max
        {
            return Err(KafkaError::Config(format!(
                "transaction.timeout.ms ({} ms) exceeds the broker's transaction.max.timeout.ms \
                 ({max} ms); lower the sink's transaction_timeout or raise the broker setting",
                txn.as_millis()
            )));
        }
        Ok(())
    }
}
