//! Bounded in-flight data seen from outside: a job whose sink is much slower than its
//! source keeps about `in_flight_target` of the sink's throughput queued in front of it,
//! not the channel's capacity, and the REST API and `/metrics` show how many records wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;
use weir::prelude::*;
use weir_tests::rest::{self, operator};
use weir_tests::{JOB_DEADLINE, join_within, wait_for};

/// Emits 1..=count as fast as it can, then idles until `release` is set.
struct Numbers {
    next: i64,
    count: i64,
    release: Arc<AtomicBool>,
}

impl SourceFunction<i64> for Numbers {
    fn poll(&mut self, out: &mut SourceOutput<'_, i64>) -> Result<SourceStatus> {
        if self.next < self.count {
            self.next += 1;
            out.emit(self.next)?;
            return Ok(SourceStatus::More);
        }
        if self.release.load(Ordering::SeqCst) {
            Ok(SourceStatus::Finished)
        } else {
            Ok(SourceStatus::Idle(5))
        }
    }
}

/// Takes at most 2,000 records per second (1 ms of sleep every second record) and adds
/// them up.
struct Slow {
    seen: i64,
    sum: Arc<AtomicI64>,
    count: Arc<AtomicI64>,
}

impl SinkFunction<i64> for Slow {
    fn invoke(&mut self, v: i64, _: Timestamp) -> Result<()> {
        self.seen += 1;
        if self.seen % 2 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.sum.fetch_add(v, Ordering::SeqCst);
        self.count.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

struct Observed {
    /// The most records seen queued in front of the sink.
    peak_queued: u64,
    /// The sink's in-flight limit when the last record arrived.
    limit: u64,
    metrics: String,
}

fn run(target: Option<Duration>, total: i64) -> Observed {
    let release = Arc::new(AtomicBool::new(false));
    let (sum, count) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0)));
    let env = Env::new()
        .parallelism(1)
        .exchange(100, 64)
        .in_flight_target(target)
        .web_address("127.0.0.1:0");
    let r = release.clone();
    let (s, c) = (sum.clone(), count.clone());
    env.source("numbers", move |_| Numbers {
        next: 0,
        count: total,
        release: r.clone(),
    })
    .rebalance()
    .sink("slow", move || Slow {
        seen: 0,
        sum: s.clone(),
        count: c.clone(),
    });
    let handle = env.execute_async("in-flight").unwrap();
    let addr = handle.web_address().unwrap();
    let (mut peak, mut limit) = (0u64, 0u64);
    // At 2,000 records/s at most: several seconds; a busy machine takes longer.
    wait_for(
        "the sink to take every record",
        Duration::from_secs(120),
        || {
            let ops = rest::get(addr, "/v1/operators");
            let sink = &operator(&ops, "slow")["subtasks"][0];
            if let Some(q) = sink["records_queued_in"].as_u64() {
                peak = peak.max(q);
                limit = sink["in_flight_limit_records"].as_u64().unwrap();
            }
            // A source has no input channels.
            assert!(
                operator(&ops, "numbers")["records_queued_in"].is_null(),
                "{ops:#}"
            );
            count.load(Ordering::SeqCst) == total
        },
    );
    let (status, metrics) = rest::call(addr, "GET", "/metrics", "");
    assert_eq!(status, 200);
    release.store(true, Ordering::SeqCst);
    join_within(handle, JOB_DEADLINE).unwrap();
    assert_eq!(sum.load(Ordering::SeqCst), total * (total + 1) / 2);
    Observed {
        peak_queued: peak,
        limit,
        metrics,
    }
}

#[test]
fn a_slow_sink_has_about_the_target_time_of_records_queued_in_front_of_it() {
    let total = 12_000;
    // 500 ms of at most 2,000 records/s: at most 1,000 records, plus the batch of 100 that
    // went in under the limit.
    let target = Duration::from_millis(500);
    let bounded = run(Some(target), total);
    assert!(
        bounded.peak_queued <= 1_100,
        "{} records queued in front of the sink",
        bounded.peak_queued
    );
    assert!(
        (100..=1_000).contains(&bounded.limit),
        "the limit was {}",
        bounded.limit
    );
    // The source is far faster: the channel was never found empty for the whole run.
    assert!(bounded.peak_queued >= 100, "{}", bounded.peak_queued);
    assert!(
        bounded.metrics.contains(
            "weir_task_input_queued_records{job=\"in-flight\",task=\"slow\",subtask=\"0\"} "
        ),
        "{}",
        bounded.metrics
    );
    assert!(
        bounded
            .metrics
            .contains("# TYPE weir_task_input_in_flight_limit_records gauge"),
        "{}",
        bounded.metrics
    );
    // Without a target the channel fills its 64 batches of 100 records.
    let fixed = run(None, total);
    assert!(
        fixed.peak_queued >= 6_000,
        "only {} records queued with a fixed capacity of 6,400",
        fixed.peak_queued
    );
    assert_eq!(fixed.limit, 6_400);
}
