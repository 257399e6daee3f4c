//! rules_alerts: alert rules that change over time, broadcast to every parallel instance of
//! a keyed operator that applies them to sensor readings (the broadcast state pattern),
//! into an exactly-once file sink — checkpointed, and resumable at any parallelism.
//!
//! ```text
//! cargo run --release --example rules_alerts -- --readings READINGS --rules RULES \
//!     --output OUTDIR --checkpoint-dir CKDIR [--checkpoint-interval-ms MS] [--parallelism P] \
//!     [--readings-rate RECORDS_PER_S] [--rules-rate RECORDS_PER_S] [--max-delay T] \
//!     [--state rocksdb|memory]
//! ```
//!
//! - READINGS holds lines `ts,sensor,value` (ts: the event time, an i64; sensor: text
//!   without commas; value: an i64), in event-time order give or take `--max-delay`
//!   (default 5).
//! - RULES holds lines `ts,sensor,threshold` in event-time order: from event time `ts` on,
//!   a reading of `sensor` above `threshold` (an i64) is an alert; the threshold `off`
//!   ends the sensor's alerts. A later line for the same sensor and time wins.
//! - Each file is read by one reader. The rules are broadcast: every parallel instance of
//!   the keyed alert operator keeps every sensor's rule history as broadcast state. The
//!   readings are keyed by sensor and wait in keyed state until the watermark of both
//!   inputs passes their time, so each is judged by the rule in force at its event time,
//!   whichever input the job happened to read faster.
//! - Every alert is written as `ts,sensor,value,threshold` into the exactly-once file sink
//!   in OUTDIR (committed files `part-<subtask>-<checkpoint>`; files starting with a dot are
//!   not committed yet).
//! - `--parallelism` sets the parallelism of the alert operator and the sink; it may change
//!   between runs. Checkpoints go to CKDIR every MS milliseconds (default 1000); started
//!   again with the same CKDIR, the job resumes from the latest complete checkpoint: the
//!   broadcast state (stored once per checkpoint) goes to every instance, the pending
//!   readings and timers to the instance owning their key. Killed at any moment (even with
//!   `kill -9`) and resumed, at any parallelism, the committed files hold exactly what one
//!   uninterrupted run writes.
//! - `--readings-rate` and `--rules-rate` throttle the readers, so a kill can land mid-run.
//! - `--state rocksdb|memory` picks the keyed state backend (default rocksdb when built with
//!   `--features rocksdb`, memory otherwise).
//! - Exits 0 once both files are consumed and the final checkpoint committed everything; a
//!   malformed line fails the job naming it.

use anyhow::Context;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;
use weir::prelude::*;

#[derive(Parser)]
#[command(about = "Alert rules broadcast to a keyed operator over sensor readings")]
struct Args {
    /// Readings, lines `ts,sensor,value`.
    #[arg(long)]
    readings: PathBuf,
    /// Rules, lines `ts,sensor,threshold` (threshold `off` ends the sensor's alerts).
    #[arg(long)]
    rules: PathBuf,
    /// Directory of the exactly-once output.
    #[arg(long)]
    output: PathBuf,
    /// Checkpoint directory; the job resumes from its latest complete checkpoint.
    #[arg(long)]
    checkpoint_dir: PathBuf,
    /// Milliseconds between checkpoints.
    #[arg(long, default_value_t = 1000)]
    checkpoint_interval_ms: u64,
    /// Parallelism of the alert operator and the sink.
    #[arg(long, default_value_t = 1)]
    parallelism: usize,
    /// Reads at most this many readings per second.
    #[arg(long)]
    readings_rate: Option<u64>,
    /// Reads at most this many rules per second.
    #[arg(long)]
    rules_rate: Option<u64>,
    /// How far readings may come out of event-time order.
    #[arg(long, default_value_t = 5)]
    max_delay: Timestamp,
    /// Keyed state backend: rocksdb or memory.
    #[arg(long, default_value = if cfg!(feature = "rocksdb") { "rocksdb" } else { "memory" })]
    state: String,
}

/// A reading: (event time, sensor, value).
type Reading = (Timestamp, String, i64);
/// A rule: (from event time, sensor, threshold; `None` ends the alerts).
type Rule = (Timestamp, String, Option<i64>);
/// A sensor's rule history: (from event time, threshold), in time order.
type History = Vec<(Timestamp, Option<i64>)>;

fn fields(line: &str, what: &str) -> weir::Result<(Timestamp, String, String)> {
    let bad = || Error::Malformed(format!("expected `{what}`, got {line:?}"));
    let mut parts = line.splitn(3, ',');
    let ts = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let sensor = parts.next().filter(|s| !s.is_empty()).ok_or_else(bad)?;
    let last = parts.next().ok_or_else(bad)?;
    Ok((ts, sensor.to_string(), last.to_string()))
}

fn parse_reading(line: &str) -> weir::Result<Reading> {
    let (ts, sensor, value) = fields(line, "ts,sensor,value")?;
    let value = value
        .parse()
        .map_err(|_| Error::Malformed(format!("expected `ts,sensor,value`, got {line:?}")))?;
    Ok((ts, sensor, value))
}

fn parse_rule(line: &str) -> weir::Result<Rule> {
    let (ts, sensor, threshold) = fields(line, "ts,sensor,threshold")?;
    let threshold = match threshold.as_str() {
        "off" => None,
        t => Some(t.parse().map_err(|_| {
            Error::Malformed(format!(
                "expected `ts,sensor,threshold` (an integer or `off`), got {line:?}"
            ))
        })?),
    };
    Ok((ts, sensor, threshold))
}

/// The threshold in force at `ts`: the last rule from `ts` or before.
fn in_force(history: &History, ts: Timestamp) -> Option<i64> {
    history
        .iter()
        .take_while(|(from, _)| *from <= ts)
        .last()
        .and_then(|(_, t)| *t)
}

/// Readings wait per sensor (keyed state, a timer at their time) until the watermark of
/// both inputs passes them; the rules (broadcast state) are then complete up to their time.
struct Alerts {
    rules: BroadcastStateDescriptor<String, History>,
    pending: MapState<Timestamp, Vec<i64>>,
}

impl BroadcastProcessFunction<String, Reading, Rule, String> for Alerts {
    fn process_element(
        &mut self,
        (ts, _sensor, value): Reading,
        ctx: &mut ReadOnlyContext<'_, String, String>,
    ) -> weir::Result<()> {
        let mut waiting = self.pending.get(&ts)?.unwrap_or_default();
        waiting.push(value);
        self.pending.put(ts, waiting)?;
        ctx.register_event_time_timer(ts);
        Ok(())
    }

    fn process_broadcast_element(
        &mut self,
        (from, sensor, threshold): Rule,
        ctx: &mut BroadcastContext<'_, String, String>,
    ) -> weir::Result<()> {
        let mut rules = ctx.broadcast_state(&self.rules)?;
        let mut history = rules.get(&sensor).cloned().unwrap_or_default();
        // After every rule of the same time: a later line wins.
        let at = history.partition_point(|(t, _)| *t <= from);
        history.insert(at, (from, threshold));
        rules.put(sensor, history);
        Ok(())
    }

    fn on_timer(
        &mut self,
        ts: Timestamp,
        _domain: TimeDomain,
        ctx: &mut ReadOnlyContext<'_, String, String>,
    ) -> weir::Result<()> {
        let values = self.pending.remove(&ts)?.unwrap_or_default();
        let sensor = ctx.key().clone();
        let threshold = ctx
            .broadcast_state(&self.rules)?
            .get(&sensor)
            .and_then(|h| in_force(h, ts));
        if let Some(limit) = threshold {
            for v in values.into_iter().filter(|v| *v > limit) {
                ctx.emit(format!("{ts},{sensor},{v},{limit}"));
            }
        }
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let checkpoints = CheckpointConfig::new(&args.checkpoint_dir)
        .interval(Duration::from_millis(args.checkpoint_interval_ms));
    let env = Env::new()
        .parallelism(args.parallelism)
        .state_backend(BackendKind::parse(&args.state)?)
        .checkpoints(checkpoints);
    let read = |path: &PathBuf, rate: Option<u64>| match rate {
        Some(r) => env.read_text_file_at_rate(path, r),
        None => env.read_text_file(path),
    };
    let readings = read(&args.readings, args.readings_rate)
        .parallelism(1)
        .uid("readings-source")
        .try_map(|line| parse_reading(&line))
        .name("parse-readings")
        .parallelism(1)
        .with_watermarks(
            WatermarkStrategy::bounded_out_of_orderness(args.max_delay)
                .with_timestamps(|r: &Reading| r.0)
                .with_per_record_watermarks(),
        )
        .parallelism(1)
        .uid("readings-watermarks");
    let descriptor = BroadcastStateDescriptor::<String, History>::new("rules");
    let rules = read(&args.rules, args.rules_rate)
        .parallelism(1)
        .uid("rules-source")
        .try_map(|line| parse_rule(&line))
        .name("parse-rules")
        .parallelism(1)
        .with_watermarks(
            WatermarkStrategy::bounded_out_of_orderness(0)
                .with_timestamps(|r: &Rule| r.0)
                .with_per_record_watermarks(),
        )
        .parallelism(1)
        .uid("rules-watermarks")
        .broadcast_state(&descriptor);
    readings
        .key_by(|r| r.1.clone())
        .connect(&rules)
        .process_with_state(move |state| {
            Ok(Alerts {
                rules: descriptor.clone(),
                pending: state.map_state("pending")?,
            })
        })
        .uid("alerts")
        .write_text_exactly_once(&args.output, |line| line.clone())
        .uid("alerts-sink");
    let result = env.execute("rules_alerts").context("rules_alerts failed")?;
    tracing::info!(
        lines = result.records_read(),
        "done, {} lines read in {:.2}s",
        result.records_read(),
        result.elapsed.as_secs_f64()
    );
    Ok(())
}
