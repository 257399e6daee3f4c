//! The `interval-join` and `temporal-join` jobs: Nexmark-shaped joins of bids with
//! auctions by event time.
//!
//! - `interval-join` (Nexmark q4/q9's join shape): auctions keyed by id joined with bids
//!   keyed by auction, pairing each auction with the bids of the first `--upper-ms`
//!   milliseconds after it opened; emits (auction, price).
//! - `temporal-join`: each bid joined with the version of its auction's row valid at the
//!   bid's time (the auctions as a changelog of inserts carrying the reserve price); emits
//!   (auction, price, reserve met) for bids whose auction existed.
//!
//! The generator runs unpaced with event times spaced as at 10 M events/s (1 ms of event
//! time = 10,000 events); its watermark trails by `--watermark-delay-ms` (Nexmark's 4 s
//! would hold every record until the end of a run this short).

use crate::jobs::{Run, Setup, env};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use weir::prelude::*;
use weir_bench::Counting;
use weir_bench::nexmark::run::UNPACED_EVENT_RATE;
use weir_nexmark::{Auction, Bid, Event, NexmarkConfig, NexmarkSource};

/// What both jobs are given besides the [`Setup`].
pub struct JoinJob {
    pub events: u64,
    pub upper_ms: i64,
    pub watermark_delay_ms: i64,
}

fn streams(env: &Env, job: &JoinJob, parallelism: usize) -> (Stream<Auction>, Stream<Bid>) {
    let config = NexmarkConfig {
        num_events: job.events,
        num_event_generators: parallelism as u64,
        first_event_rate: UNPACED_EVENT_RATE,
        ..Default::default()
    };
    let events = env
        .source("nexmark", move |ctx| {
            NexmarkSource::new(config.clone(), ctx)
        })
        .with_watermarks(
            WatermarkStrategy::bounded_out_of_orderness(job.watermark_delay_ms)
                .with_timestamps(Event::date_time),
        );
    (
        events.flat_map(Event::auction).name("auctions"),
        events.flat_map(Event::bid).name("bids"),
    )
}

fn finish(env: &Env, name: &str, total: &AtomicU64) -> weir::Result<Run> {
    let r = env.execute(name)?;
    Ok(Run {
        elapsed_s: r.elapsed.as_secs_f64(),
        results: total.load(Ordering::SeqCst),
        checkpoints: r.checkpoints_completed,
    })
}

/// auctions ⋈ bids within `[0, upper_ms]` after the auction opened → count.
pub fn interval_join(job: &JoinJob, setup: &Setup) -> weir::Result<Run> {
    let env = env(setup);
    let (auctions, bids) = streams(&env, job, setup.parallelism);
    let total = Arc::new(AtomicU64::new(0));
    let counter = total.clone();
    auctions
        .key_by(|a| a.id)
        .interval_join(&bids.key_by(|b| b.auction))
        .between(0, job.upper_ms)
        .apply(|a, b| (a.id, b.price))
        .sink("count", move || {
            Counting::new(counter.clone(), |_: &(i64, i64)| 1)
        });
    finish(&env, "interval-join", &total)
}

/// bids ⋈ auctions FOR SYSTEM_TIME AS OF the bid's time → count.
pub fn temporal_join(job: &JoinJob, setup: &Setup) -> weir::Result<Run> {
    let env = env(setup);
    let (auctions, bids) = streams(&env, job, setup.parallelism);
    let rows = auctions.map(|a| Change::Insert {
        key: a.id,
        value: a.reserve,
    });
    let total = Arc::new(AtomicU64::new(0));
    let counter = total.clone();
    bids.key_by(|b| b.auction)
        .temporal_join(&rows.key_by(|c| *c.key()))
        .inner(|b, reserve| (b.auction, b.price, b.price >= *reserve))
        .sink("count", move || {
            Counting::new(counter.clone(), |_: &(i64, i64, bool)| 1)
        });
    finish(&env, "temporal-join", &total)
}
