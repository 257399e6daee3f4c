//! kafka_sum: running sums per key, from one Kafka topic to another, exactly once.
//!
//! ```text
//! cargo run --release --example kafka_sum -- --brokers HOST:PORT --input-topic IN \
//!     --output-topic OUT --checkpoint-dir CKDIR [--checkpoint-interval-ms MS] \
//!     [--parallelism P] [--bounded] [--web HOST:PORT] [--secret-file PATH] [--tls-dir DIR] [--measure-bytes]
//!     [--checkpoint-mode MODE] [--sink-rate RECORDS_PER_S] [--max-rate RECORDS_PER_S]
//! ```
//!
//! - Input records: Kafka key = the key (UTF-8), value = an i64 as decimal UTF-8. The input
//!   is read `read_committed`.
//! - For every input record it produces one output record: key = the key, value = the
//!   running sum for that key after this record, as decimal UTF-8, written exactly once
//!   through the transactional sink (visible to `read_committed` readers when the checkpoint
//!   that covers it completes).
//! - `--bounded`: stop after the end offsets observed at the first start (kept across
//!   restarts), commit everything, exit 0.
//! - Started again with the same CKDIR it resumes automatically from the newest complete
//!   checkpoint, after finishing or re-producing the output transactions the previous run
//!   left pending.
//! - `weir savepoint stop CKDIR` stops it with a savepoint: it commits the output up to the
//!   savepoint, prints `stopped with savepoint PATH` and exits 0.
//! - `--checkpoint-mode aligned|unaligned|aligned-timeout|aligned-timeout:MS` sets how
//!   checkpoint barriers pass the records queued in the job's channels (docs/checkpoints.md):
//!   `aligned` (the default) waits until every record ahead of a barrier is processed;
//!   `unaligned` lets barriers overtake them and stores those records with the checkpoint
//!   (they are processed again on restore, so the output stays exactly-once);
//!   `aligned-timeout:MS` aligns and goes unaligned once a checkpoint's alignment has taken
//!   MS milliseconds (`aligned-timeout` alone: 200 ms). Under a slow sink, unaligned
//!   checkpoints keep their interval, so the output's transactions commit at that pace
//!   instead of approaching `--transaction-timeout-ms`.
//! - `--sink-rate RECORDS_PER_S` lets each sink subtask produce at most that many records
//!   per second (a throttle right before the sink): a slow sink. Records back up into the
//!   keyed exchange and the source slows down to the sink's pace (backpressure). At least 1.
//! - `--max-rate RECORDS_PER_S` lets each source subtask read at most that many records per
//!   second, so a bounded run lasts a while (a kill lands mid-run) instead of reading its
//!   whole topic into the channels at once. At least 1.
//! - A record that is not `key`/i64 fails the job with the topic, partition and offset, unless
//!   `--dead-letter-topic DLQ` is given, which sets such records aside there.
//!
//! More options: `--checkpoint-timeout-ms MS` (default 30000), `--transaction-timeout-ms MS`
//! (default 60000; must cover interval + checkpoint timeout and stay within the broker's
//! `transaction.max.timeout.ms`), `--transactional-id-prefix NAME` (default `kafka_sum`),
//! `--at-least-once`, `--state memory|rocksdb` (rocksdb needs the `rocksdb` feature),
//! `--from-savepoint PATH` (start from a savepoint, e.g. one taken with
//! `weir savepoint stop CKDIR`, instead of the newest checkpoint in CKDIR),
//! `--start-fresh-if-unusable` (start from scratch when CKDIR holds checkpoints but none can
//! be restored; by default the job fails naming each),
//! `--max-restarts N` (give up after N restarts in a row, that is with less than 10 minutes
//! of running between them; by default a failure that a restart may get past is retried
//! forever, at most a minute apart).
//!
//! A broker for trying it: `scripts/kafka.sh start` (see README).

use anyhow::{Context, bail};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use weir::prelude::*;
use weir_kafka::{DeliveryGuarantee, KafkaRecord, KafkaSink, KafkaSource};

struct Args {
    brokers: String,
    input: String,
    output: String,
    checkpoint_dir: PathBuf,
    interval_ms: u64,
    checkpoint_timeout_ms: u64,
    txn_timeout_ms: u64,
    parallelism: usize,
    bounded: bool,
    prefix: String,
    dead_letter: Option<String>,
    at_least_once: bool,
    state: BackendKind,
    from_savepoint: Option<PathBuf>,
    start_fresh_if_unusable: bool,
    max_restarts: Option<u32>,
    web: Option<String>,
    /// The secret the REST API's actions need (`--secret-file`, or `WEIR_SECRET_FILE`).
    secret: Option<weir::Secret>,
    /// TLS settings (`--tls-dir`, or `WEIR_TLS_DIR`).
    tls: Option<weir::Tls>,
    /// Measure the bytes records take on channels (`--measure-bytes`, with `--web`).
    measure_bytes: bool,
    /// How barriers pass records in flight (`--checkpoint-mode`).
    mode: CheckpointMode,
    /// Records per second each sink subtask produces at most (`--sink-rate`).
    sink_rate: Option<u64>,
    /// Records per second each source subtask reads at most (`--max-rate`).
    max_rate: Option<u64>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut brokers = None;
    let mut input = None;
    let mut output = None;
    let mut checkpoint_dir = None;
    let mut interval_ms = 1000;
    let mut checkpoint_timeout_ms = 30_000;
    let mut txn_timeout_ms = 60_000;
    let mut parallelism = 1;
    let mut bounded = false;
    let mut prefix = "kafka_sum".to_string();
    let mut dead_letter = None;
    let mut at_least_once = false;
    let mut state = BackendKind::parse("memory")?;
    let mut from_savepoint = None;
    let mut start_fresh_if_unusable = false;
    let mut max_restarts = None;
    let mut web = None;
    let mut secret_file = None;
    let mut tls_dir = None;
    let mut measure_bytes = false;
    let mut mode = CheckpointMode::default();
    let mut sink_rate = None;
    let mut max_rate = None;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--brokers" => brokers = Some(value()?),
            "--input-topic" => input = Some(value()?),
            "--output-topic" => output = Some(value()?),
            "--checkpoint-dir" => checkpoint_dir = Some(PathBuf::from(value()?)),
            "--checkpoint-interval-ms" => {
                interval_ms = value()?.parse().context("--checkpoint-interval-ms")?
            }
            "--checkpoint-timeout-ms" => {
                checkpoint_timeout_ms = value()?.parse().context("--checkpoint-timeout-ms")?
            }
            "--transaction-timeout-ms" => {
                txn_timeout_ms = value()?.parse().context("--transaction-timeout-ms")?
            }
            "--parallelism" => parallelism = value()?.parse().context("--parallelism")?,
            "--bounded" => bounded = true,
            "--transactional-id-prefix" => prefix = value()?,
            "--dead-letter-topic" => dead_letter = Some(value()?),
            "--at-least-once" => at_least_once = true,
            "--state" => state = BackendKind::parse(&value()?)?,
            "--from-savepoint" => from_savepoint = Some(PathBuf::from(value()?)),
            "--start-fresh-if-unusable" => start_fresh_if_unusable = true,
            "--max-restarts" => max_restarts = Some(value()?.parse().context("--max-restarts")?),
            "--web" => web = Some(value()?),
            "--measure-bytes" => measure_bytes = true,
            "--secret-file" => secret_file = Some(PathBuf::from(value()?)),
            "--tls-dir" => tls_dir = Some(PathBuf::from(value()?)),
            "--checkpoint-mode" => {
                mode = value()?
                    .parse::<CheckpointMode>()
                    .map_err(|e| anyhow::anyhow!("--checkpoint-mode: {e}"))?
            }
            "--sink-rate" => sink_rate = Some(rate(&flag, &value()?)?),
            "--max-rate" => max_rate = Some(rate(&flag, &value()?)?),
            "-h" | "--help" => {
                println!(
                    "usage: kafka_sum --brokers HOST:PORT --input-topic IN --output-topic OUT \
                     --checkpoint-dir CKDIR [--checkpoint-interval-ms MS] [--parallelism P] \
                     [--bounded] [--checkpoint-timeout-ms MS] [--transaction-timeout-ms MS] \
                     [--transactional-id-prefix NAME] [--dead-letter-topic DLQ] \
                     [--at-least-once] [--state memory|rocksdb] [--from-savepoint PATH] \
                     [--start-fresh-if-unusable] [--max-restarts N] [--web HOST:PORT] [--secret-file PATH] [--tls-dir DIR] [--measure-bytes] \
                     [--checkpoint-mode aligned|unaligned|aligned-timeout[:MS]] [--sink-rate RECORDS_PER_S] \
                     [--max-rate RECORDS_PER_S]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown flag {other}; see --help"),
        }
    }
    Ok(Args {
        brokers: brokers.context("--brokers HOST:PORT is required")?,
        input: input.context("--input-topic IN is required")?,
        output: output.context("--output-topic OUT is required")?,
        checkpoint_dir: checkpoint_dir.context("--checkpoint-dir CKDIR is required")?,
        interval_ms,
        checkpoint_timeout_ms,
        txn_timeout_ms,
        parallelism,
        bounded,
        prefix,
        dead_letter,
        at_least_once,
        state,
        from_savepoint,
        start_fresh_if_unusable,
        max_restarts,
        web,
        secret: weir::Secret::from_file_or_env(secret_file.as_deref())?,
        tls: weir::Tls::from_dir_or_env(tls_dir.as_deref())?,
        measure_bytes,
        mode,
        sink_rate,
        max_rate,
    })
}

/// A records-per-second flag's value: a whole number, at least 1.
fn rate(flag: &str, text: &str) -> anyhow::Result<u64> {
    match text.parse::<u64>() {
        Ok(0) => bail!("{flag} must be at least 1 record per second"),
        Ok(r) => Ok(r),
        Err(e) => bail!("{flag} {text:?} is not a number of records per second: {e}"),
    }
}

/// Key = UTF-8 text, value = an i64 in decimal.
fn parse_record(r: &KafkaRecord<'_>) -> Result<(String, i64), String> {
    let key = r.key.ok_or("the record has no key")?;
    let key = std::str::from_utf8(key).map_err(|e| format!("the key is not UTF-8: {e}"))?;
    let value = r.value.ok_or("the record has no value")?;
    let text = std::str::from_utf8(value).map_err(|e| format!("the value is not UTF-8: {e}"))?;
    let v = text
        .trim()
        .parse::<i64>()
        .map_err(|e| format!("the value {text:?} is not an i64: {e}"))?;
    Ok((key.to_string(), v))
}

#[derive(Default)]
struct RunningSum {
    sum: Option<ValueState<i64>>,
}

impl KeyedProcessFunction<String, (String, i64), (String, i64)> for RunningSum {
    fn open(&mut self, state: &mut StateContext<String>) -> weir::Result<()> {
        self.sum = Some(state.value_state("sum")?);
        Ok(())
    }
    fn process(
        &mut self,
        (key, value): (String, i64),
        ctx: &mut KeyedContext<'_, String, (String, i64)>,
    ) -> weir::Result<()> {
        let sum = self.sum.as_mut().expect("opened");
        let next = sum
            .get()?
            .unwrap_or(0)
            .checked_add(value)
            .ok_or_else(|| Error::user(format!("sum of key '{key}' overflows i64")))?;
        sum.set(next)?;
        ctx.emit((key, next));
        Ok(())
    }
}

/// Lets at most `per_sec` records a second through one subtask (`--sink-rate`): sleeps
/// whenever it is ahead of that pace, so the sink after it is slow and records back up
/// upstream. A throttle that fell behind (the input was slower) starts over instead of
/// letting a burst through.
struct Throttle {
    per_sec: u64,
    start: Option<Instant>,
    passed: u64,
}

impl ProcessFunction<(String, i64), (String, i64)> for Throttle {
    fn process(
        &mut self,
        record: (String, i64),
        ctx: &mut ProcessContext<'_, (String, i64)>,
    ) -> weir::Result<()> {
        let now = Instant::now();
        let start = *self.start.get_or_insert(now);
        let due = start + Duration::from_secs_f64(self.passed as f64 / self.per_sec as f64);
        if due > now + Duration::from_millis(1) {
            std::thread::sleep(due - now);
        } else if now > due + Duration::from_millis(100) {
            self.start = Some(now);
            self.passed = 0;
        }
        self.passed += 1;
        ctx.emit(record);
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let mut checkpoints = CheckpointConfig::new(&args.checkpoint_dir)
        .interval(Duration::from_millis(args.interval_ms));
    checkpoints.timeout = Duration::from_millis(args.checkpoint_timeout_ms);
    checkpoints.restore_from = args.from_savepoint.clone();
    checkpoints.start_fresh_if_unusable = args.start_fresh_if_unusable;
    checkpoints.mode = args.mode;
    if let Some(n) = args.max_restarts {
        checkpoints.restart = weir::RestartStrategy::ExponentialDelay(weir::ExponentialDelay {
            max_attempts: Some(n),
            ..weir::ExponentialDelay::default()
        });
    }
    let mut env = Env::new()
        .parallelism(args.parallelism)
        .state_backend(args.state.clone())
        .checkpoints(checkpoints);
    if let Some(a) = &args.web {
        env = env.web_address(a);
    }
    if let Some(s) = &args.secret {
        env = env.secret(s.clone());
    }
    if let Some(t) = &args.tls {
        env = env.tls(t.clone());
    }
    env = env.measure_bytes(args.measure_bytes);

    let mut source = KafkaSource::new(&args.brokers, [args.input.as_str()])
        .group_id(&format!("{}-source", args.prefix))
        .deserializer(parse_record);
    if args.bounded {
        source = source.bounded();
    }
    if let Some(dlq) = &args.dead_letter {
        source = source.dead_letter_topic(dlq);
    }
    let sink = KafkaSink::new(&args.brokers, &args.output, &args.prefix)
        .transaction_timeout(Duration::from_millis(args.txn_timeout_ms))
        .with_guarantee(if args.at_least_once {
            DeliveryGuarantee::AtLeastOnce
        } else {
            DeliveryGuarantee::ExactlyOnce
        })
        .serializer(|(k, s): &(String, i64)| {
            (Some(k.as_bytes().to_vec()), s.to_string().into_bytes())
        });

    let mut input = env
        .source("kafka-source", source.factory())
        .uid("kafka-source");
    if let Some(per_sec) = args.max_rate {
        input = input
            .process(move || Throttle {
                per_sec,
                start: None,
                passed: 0,
            })
            .name("source-throttle")
            .uid("source-throttle");
    }
    let mut sums = input
        .key_by(|(k, _)| k.clone())
        .process(RunningSum::default)
        .name("running-sum")
        .uid("running-sum");
    if let Some(per_sec) = args.sink_rate {
        sums = sums
            .process(move || Throttle {
                per_sec,
                start: None,
                passed: 0,
            })
            .name("sink-throttle")
            .uid("sink-throttle");
    }
    sums.sink("kafka-sink", sink.factory()).uid("kafka-sink");
    let handle = env.execute_async("kafka_sum").context("kafka_sum failed")?;
    if let Some(a) = handle.web_address() {
        let scheme = if args.tls.is_some() { "https" } else { "http" };
        tracing::info!(address = %a, "REST API at {scheme}://{a}/v1/job");
        tracing::info!(address = %a, "dashboard at {scheme}://{a}/");
    }
    let result = handle.join().context("kafka_sum failed")?;
    if result.stopped_with_savepoint {
        let path = result
            .savepoints
            .last()
            .context("stopped without a savepoint path")?;
        println!("stopped with savepoint {}", path.display());
        return Ok(());
    }
    tracing::info!(
        records = result.records_read(),
        "done, {} records read in {:.2}s",
        result.records_read(),
        result.elapsed.as_secs_f64()
    );
    Ok(())
}
