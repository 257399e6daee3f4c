use super::*;
use crate::exchange::{ChannelEnd, Exchange, Msg, Partitioning, TypedExchange};
use crate::output::{Control, Output};

fn policy(target_ms: Option<u64>, batch: usize, capacity: usize) -> BudgetPolicy {
    BudgetPolicy::new(&ExchangeConfig {
        batch_size: batch,
        channel_capacity: capacity,
        flush_interval_ms: 10,
        max_parallelism: 128,
        in_flight_target: target_ms.map(Duration::from_millis),
    })
}

#[test]
fn the_limit_is_rate_times_target_between_a_batch_and_the_capacity() {
    let p = policy(Some(1_000), 1_024, 16);
    assert_eq!((p.floor, p.ceiling), (1_024, 16_384));
    assert_eq!(p.initial_limit(), 1_024);
    assert_eq!(p.limit_for(2_000.0), 2_000);
    assert_eq!(p.limit_for(10_000.4), 10_000);
    assert_eq!(p.limit_for(0.0), 1_024);
    assert_eq!(p.limit_for(-5.0), 1_024);
    assert_eq!(p.limit_for(1e12), 16_384);
    assert_eq!(p.limit_for(f64::INFINITY), 16_384);
    let half = policy(Some(500), 1_024, 16);
    assert_eq!(half.limit_for(4_000.0), 2_000);
    // Small batches: the floor is the minimum, not one batch.
    let small = policy(Some(1_000), 8, 16);
    assert_eq!(small.floor, MIN_IN_FLIGHT_RECORDS);
    assert_eq!(small.limit_for(1.0), MIN_IN_FLIGHT_RECORDS);
    // A capacity smaller than the minimum wins over it.
    let tiny = policy(Some(1_000), 1, 4);
    assert_eq!((tiny.floor, tiny.ceiling), (4, 4));
}

#[test]
fn without_a_target_only_the_capacity_bounds_a_channel() {
    let p = policy(None, 1_024, 16);
    assert_eq!(p.initial_limit(), u64::MAX);
    assert_eq!(p.limit_for(2_000.0), u64::MAX);
    assert_eq!(p.link_limit(u64::MAX), 16_384);
    assert_eq!(p.link_limit(3_000), 3_000);
}

#[test]
fn the_rate_is_sampled_per_window_and_smoothed() {
    let t0 = Instant::now();
    let ms = |m: u64| t0 + Duration::from_millis(m);
    let mut m = RateMeter::default();
    assert_eq!(m.observe(500, ms(0)), None);
    assert_eq!(m.rate(), None);
    // 400 records in 200 ms: the first sample is taken as it is.
    assert_eq!(m.observe(400, ms(200)), Some(2_000.0));
    // Nothing for a second, then 100: the sample is 100/s, smoothed by 0.2.
    let r = m.observe(100, ms(1_200)).unwrap();
    assert!(
        (r - (2_000.0 + 0.2 * (100.0 - 2_000.0))).abs() < 1e-9,
        "{r}"
    );
    // Windows shorter than the interval only add up.
    assert_eq!(m.observe(1_000, ms(1_300)), None);
    let r2 = m.observe(1_000, ms(1_400)).unwrap();
    assert!((r2 - (r + 0.2 * (10_000.0 - r))).abs() < 1e-9, "{r2}");
}

#[test]
fn a_writer_waits_at_the_limit_until_the_consumer_takes_records() {
    let budget = ChannelBudget::new(policy(Some(1_000), 100, 16));
    let consumer = BudgetConsumer::new(budget.clone());
    assert_eq!(budget.limit(), 100);
    assert_eq!(budget.acquire(60), Ok(None));
    // Under the limit a batch goes, even one that takes it over.
    assert_eq!(budget.acquire(60), Ok(None));
    assert_eq!((budget.queued(), budget.peak()), (120, 120));
    let writer = {
        let budget = budget.clone();
        std::thread::spawn(move || budget.acquire(10))
    };
    // The writer cannot pass while 120 ≥ 100 are queued.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !budget.waiting.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the writer never waited");
        std::thread::yield_now();
    }
    assert_eq!(budget.queued(), 120);
    consumer.consumed(60);
    let waited = writer.join().unwrap().unwrap();
    assert!(waited.is_some());
    assert_eq!(budget.queued(), 70);
    assert_eq!(budget.peak(), 120);
}

#[test]
fn a_waiting_writer_gives_up_when_the_consumers_are_gone() {
    let budget = ChannelBudget::new(policy(Some(1_000), 100, 16));
    let gate = BudgetConsumer::new(budget.clone());
    let link = BudgetConsumer::new(budget.clone());
    budget.acquire(100).unwrap();
    let writer = {
        let budget = budget.clone();
        std::thread::spawn(move || budget.acquire(1))
    };
    drop(link);
    // One consumer is left: the writer still waits for it.
    assert!(!budget.closed.load(Ordering::SeqCst));
    drop(gate);
    assert_eq!(writer.join().unwrap(), Err(BudgetClosed));
}

/// Runs a fast producer into one channel whose consumer takes `rate` records per second,
/// until `total` records went through. Returns the most records the channel held and
/// the sum of what the consumer received.
pub(crate) fn slow_consumer(cfg: ExchangeConfig, rate: u64, total: u64) -> (u64, u64) {
    let exchange = TypedExchange::<u64> {
        partitioning: Partitioning::Forward,
    };
    let mut set = exchange.channels(1, 1, cfg);
    let writer = set.writers.remove(0);
    let readers = *set
        .readers
        .remove(0)
        .downcast::<Vec<ChannelEnd<u64>>>()
        .expect("readers of u64");
    let end = readers.into_iter().next().expect("one channel");
    let (rx, consumer) = (end.data, end.budget);
    let budget = consumer.budget().clone();
    let producer = std::thread::spawn(move || {
        let mut w = *writer
            .downcast::<Box<dyn Output<u64> + Send>>()
            .expect("a writer of u64");
        for v in 0..total {
            w.record(v, 0)?;
        }
        w.control(Control::End)
    });
    let (mut taken, mut sum) = (0u64, 0u64);
    loop {
        match rx.recv().expect("the producer ends the channel") {
            Msg::Batch(b) => {
                consumer.consumed(b.len());
                taken += b.len() as u64;
                sum += b.iter().map(|(v, _)| v).sum::<u64>();
                // The consumer's work: it takes `rate` records per second at most.
                std::thread::sleep(Duration::from_secs_f64(b.len() as f64 / rate as f64));
            }
            Msg::End => break,
            _ => {}
        }
    }
    producer.join().unwrap().unwrap();
    assert_eq!(taken, total);
    (budget.peak(), sum)
}

#[test]
fn a_slow_consumer_holds_about_the_target_time_of_records_not_the_capacity() {
    let cfg = |target: Option<Duration>| ExchangeConfig {
        batch_size: 100,
        channel_capacity: 32,
        flush_interval_ms: 10,
        max_parallelism: 128,
        in_flight_target: target,
    };
    let (rate, total) = (2_000u64, 5_000u64);
    let want_sum = total * (total - 1) / 2;
    // Fixed capacity: the producer fills all 32 batches of 100 records.
    let (fixed_peak, sum) = slow_consumer(cfg(None), rate, total);
    assert_eq!(sum, want_sum);
    assert!(
        fixed_peak >= 3_200,
        "fixed capacity held at most {fixed_peak}"
    );
    // 500 ms of 2,000 records/s is 1,000 records. The consumer never takes more than
    // 2,000/s (a busy machine only slows it, lowering the limit), so the channel holds at
    // most the limit plus the batch that went in just under it.
    let target = Duration::from_millis(500);
    let (peak, sum) = slow_consumer(cfg(Some(target)), rate, total);
    assert_eq!(sum, want_sum);
    let bound = (rate as f64 * target.as_secs_f64()) as u64 + 100;
    assert!(
        peak <= bound,
        "with a 500 ms target the channel held {peak} records, more than {bound}"
    );
    assert!(peak < fixed_peak / 2, "{peak} vs {fixed_peak}");
}
