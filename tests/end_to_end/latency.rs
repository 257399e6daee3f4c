//! Source-to-sink latency at a low rate: a record is not held back in a partly filled
//! batch when its producer has nothing else to do, and a busy producer sends it within
//! the flush interval.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use weir::prelude::*;
use weir_tests::join_within;

const PARALLELISM: u64 = 2;

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Emits its values (`subtask`, `subtask + 2`, … below `n`), each stamped with the time it
/// left, and the next only once the sink has received the previous one: a record held
/// back until the flush interval holds the source back too. `busy` sources poll without
/// pause (the runtime never sees them idle); the others report themselves idle between
/// records. A record that has not arrived within `patience` fails the job.
struct OneAtATime {
    next: u64,
    n: u64,
    sent: u64,
    arrived: Arc<[AtomicU64; PARALLELISM as usize]>,
    subtask: usize,
    busy: bool,
    waiting_since: Instant,
    patience: Duration,
}

impl SourceFunction<(u64, i64)> for OneAtATime {
    fn poll(&mut self, out: &mut SourceOutput<'_, (u64, i64)>) -> weir::Result<SourceStatus> {
        let waiting = if self.busy {
            SourceStatus::More
        } else {
            SourceStatus::Idle(1)
        };
        if self.arrived[self.subtask].load(Ordering::SeqCst) < self.sent {
            if self.waiting_since.elapsed() > self.patience {
                return Err(weir::Error::User(format!(
                    "record {} has not reached the sink within {:?}",
                    self.next - PARALLELISM,
                    self.patience
                )));
            }
            return Ok(waiting);
        }
        if self.next >= self.n {
            return Ok(SourceStatus::Finished);
        }
        out.emit((self.next, now_us()))?;
        self.next += PARALLELISM;
        self.sent += 1;
        self.waiting_since = Instant::now();
        Ok(waiting)
    }
}

/// Keeps each record's value and age in microseconds, and counts arrivals per source
/// subtask.
struct Ages {
    ages: Arc<Mutex<Vec<(u64, i64)>>>,
    arrived: Arc<[AtomicU64; PARALLELISM as usize]>,
}

impl SinkFunction<(u64, i64)> for Ages {
    fn invoke(&mut self, (value, stamp): (u64, i64), _ts: Timestamp) -> weir::Result<()> {
        let age = now_us() - stamp;
        self.ages.lock().expect("ages").push((value, age));
        self.arrived[(value % PARALLELISM) as usize].fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// source (2 subtasks) → key_by → reduce (2 subtasks) → rebalance → sink: two channels,
/// one written by a source task and one by an operator task. Returns (value, age µs).
fn run(n: u64, busy: bool, flush_interval: Duration, patience: Duration) -> Vec<(u64, i64)> {
    let env = Env::with_config(JobConfig {
        parallelism: PARALLELISM as usize,
        flush_interval,
        ..JobConfig::default()
    });
    let ages = Arc::new(Mutex::new(Vec::new()));
    let arrived: Arc<[AtomicU64; PARALLELISM as usize]> = Arc::new(Default::default());
    let a = arrived.clone();
    env.source("one-at-a-time", move |ctx| OneAtATime {
        next: ctx.subtask as u64,
        n,
        sent: 0,
        arrived: a.clone(),
        subtask: ctx.subtask,
        busy,
        waiting_since: Instant::now(),
        patience,
    })
    .key_by(|(v, _)| v % 7)
    .reduce(|_, latest| latest)
    .rebalance()
    .sink("ages", {
        let (ages, arrived) = (ages.clone(), arrived.clone());
        move || Ages {
            ages: ages.clone(),
            arrived: arrived.clone(),
        }
    });
    join_within(
        env.execute_async("latency").expect("starts"),
        patience * 2 + Duration::from_secs(30),
    )
    .expect("the job succeeds");
    let mut ages = ages.lock().expect("ages").clone();
    ages.sort();
    ages
}

#[test]
fn an_idle_producer_sends_a_record_at_once_not_after_the_flush_interval() {
    // A minute's flush interval: only the flush of an idle source or operator task
    // gets a record through in time.
    let ages = run(30, false, Duration::from_secs(60), Duration::from_secs(20));
    assert_eq!(
        ages.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        (0..30).collect::<Vec<u64>>()
    );
    // Generous for two busy cores, and far below the interval.
    let worst = ages.iter().map(|(_, a)| *a).max().unwrap_or(0);
    assert!(worst < 5_000_000, "a record took {worst} µs: {ages:?}");
}

#[test]
fn a_busy_producer_sends_a_record_within_the_flush_interval() {
    // The source polls without pause, so it is never idle: the flush interval sends.
    let ages = run(20, true, Duration::from_millis(20), Duration::from_secs(20));
    assert_eq!(
        ages.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        (0..20).collect::<Vec<u64>>()
    );
    let worst = ages.iter().map(|(_, a)| *a).max().unwrap_or(0);
    assert!(worst < 5_000_000, "a record took {worst} µs: {ages:?}");
}

#[test]
fn a_flush_interval_below_a_millisecond_is_refused_with_what_to_use() {
    let env = Env::new().flush_interval(Duration::from_micros(500));
    env.from_collection(vec![1i64]).discard();
    let e = env.execute("sub-ms").unwrap_err();
    assert!(matches!(e, weir::Error::Config(_)), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("flush interval 500µs is not a whole number of milliseconds")
            && msg.contains("use 0 (every tick) or whole milliseconds"),
        "{msg}"
    );
}
