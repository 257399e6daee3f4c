//! What both sinks share: the connection (re-made after it breaks), the retry loop with its
//! budget and `retry_ratio` gauge, and the dead-letter queue.

use crate::{connect, describe, redact};
use postgres::Client;
use std::time::Duration;
use weir_core::dlq::{DeadLetter, DeadLetterFactory, DeadLetterSink};
use weir_core::ops::sink::SinkContext;
use weir_core::retry::{Failed, GiveUp, Outcome, Retrier, RetryPolicy, retry_ratio_gauge};
use weir_core::{Error, Result};

/// The settings both sinks take.
#[derive(Clone)]
pub(crate) struct Common {
    pub url: String,
    pub retry: RetryPolicy,
    pub dead_letters: Option<DeadLetterFactory>,
    pub statement_timeout: Duration,
    pub connect_timeout: Duration,
}

impl Common {
    pub fn new(url: &str) -> Self {
        Common {
            url: url.to_string(),
            retry: RetryPolicy::default(),
            dead_letters: None,
            statement_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// A record the retry loop gave up on and the sink did not set aside.
pub(crate) enum Undelivered<E> {
    /// Given up because of a stale fencing token: counted by the caller, nothing else.
    Fenced,
    /// Gone to the dead-letter queue.
    DeadLettered,
    /// Kept: the caller fails the job with this.
    Failed(Failed<E>),
}

pub(crate) struct Delivery {
    common: Common,
    client: Option<Client>,
    retrier: Retrier,
    dead_letters: Option<Box<dyn DeadLetterSink>>,
    pub handler: String,
}

impl Delivery {
    /// Checks the settings and connects; an unreachable server or a bad URL fails here with
    /// the URL (password redacted) and the cause.
    pub fn open(common: &Common, handler: &str, ctx: &SinkContext) -> Result<Self> {
        let subtask = ctx.subtask.to_string();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let seed = nanos ^ (ctx.subtask as u64).rotate_left(32);
        let retrier = Retrier::try_new(common.retry.clone(), seed)
            .map_err(|e| Error::Config(format!("sink '{}': {e}", ctx.name)))?
            .with_metric(retry_ratio_gauge(&[
                ("operator", &ctx.name),
                ("subtask", &subtask),
            ]));
        let client = connect(
            &common.url,
            common.statement_timeout,
            common.connect_timeout,
        )
        .map_err(|e| {
            Error::Config(format!(
                "sink '{}': cannot connect to PostgreSQL at {}: {} (is the server running? \
                     scripts/postgres.sh start runs a local one)",
                ctx.name,
                redact(&common.url),
                describe(&e)
            ))
        })?;
        let dead_letters = match &common.dead_letters {
            Some(make) => Some(make(handler, ctx)?),
            None => None,
        };
        Ok(Delivery {
            common: common.clone(),
            client: Some(client),
            retrier,
            dead_letters,
            handler: handler.to_string(),
        })
    }

    /// A connection, made again if the last one broke.
    pub fn client(&mut self) -> std::result::Result<&mut Client, postgres::Error> {
        reconnect(&mut self.client, &self.common)
    }

    /// Runs `op` under the retry policy (one request of the retry budget; the retrier keeps
    /// the `retry_ratio` gauge current). `op` gets a live connection and the attempt number;
    /// a connection that breaks is dropped and made again for the next attempt.
    pub fn run<R, E>(
        &mut self,
        op: &mut dyn FnMut(&mut Client, u32) -> std::result::Result<R, E>,
        from_pg: fn(postgres::Error) -> E,
        classify: fn(&E) -> Outcome,
    ) -> std::result::Result<R, Failed<E>> {
        let Delivery {
            common,
            client,
            retrier,
            ..
        } = self;
        retrier.run(
            |attempt| {
                let c = reconnect(client, common).map_err(from_pg)?;
                let r = op(c, attempt);
                if client.as_ref().is_some_and(|c| c.is_closed()) {
                    *client = None;
                }
                r
            },
            classify,
            std::thread::sleep,
        )
    }

    /// What happens to a record the retry loop gave up on: a stale token is only reported,
    /// anything else goes to the dead-letter queue when there is one.
    pub fn give_up<E: std::fmt::Display>(
        &mut self,
        failed: Failed<E>,
        key: &str,
        payload: impl FnOnce() -> serde_json::Value,
    ) -> Result<Undelivered<E>> {
        if failed.reason == GiveUp::Fenced {
            return Ok(Undelivered::Fenced);
        }
        let Some(q) = self.dead_letters.as_mut() else {
            return Ok(Undelivered::Failed(failed));
        };
        let error = format!("{} ({})", failed.error, failed.reason);
        tracing::warn!(
            handler = %self.handler, key, attempts = failed.attempts, %error,
            "record set aside in the dead-letter queue"
        );
        q.send(&DeadLetter::new(
            &self.handler,
            key,
            error,
            failed.attempts,
            payload(),
        ))?;
        Ok(Undelivered::DeadLettered)
    }

    /// Makes the dead letters durable (at barriers and at the end of input).
    pub fn flush(&mut self) -> Result<()> {
        match self.dead_letters.as_mut() {
            Some(q) => q.flush(),
            None => Ok(()),
        }
    }
}

fn reconnect<'a>(
    client: &'a mut Option<Client>,
    common: &Common,
) -> std::result::Result<&'a mut Client, postgres::Error> {
    if client.as_ref().is_none_or(|c| c.is_closed()) {
        *client = None;
        *client = Some(connect(
            &common.url,
            common.statement_timeout,
            common.connect_timeout,
        )?);
    }
    Ok(client.as_mut().expect("connected above"))
}

/// The error a sink fails the job with when a record is given up and there is no
/// dead-letter queue.
pub(crate) fn undelivered_error<E: std::fmt::Display>(
    sink: &str,
    key: &str,
    failed: &Failed<E>,
) -> Error {
    Error::User(format!(
        "sink '{sink}': the record with idempotency key '{key}' could not be applied after {} \
         attempt(s) ({}): {}; give the sink a dead-letter queue (.dead_letters(...)) to set \
         such records aside and keep the job running",
        failed.attempts, failed.reason, failed.error
    ))
}
